#include "server/generation_queue.h"

#include <algorithm>
#include <exception>

#include "tokenizer/tokenizer.h"

namespace aff::server {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "error";
}

std::vector<GenEvent> Job::wait_events(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !events_.empty(); });
  std::vector<GenEvent> out(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
  events_.clear();
  return out;
}

void Job::push(GenEvent e) {
  {
    std::lock_guard lock(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

GenerationQueue::GenerationQueue(Engine& engine, int sessions, int max_queued, bool serialize_engine)
    : engine_(engine), max_queued_(std::max(0, max_queued)), serialize_engine_(serialize_engine) {
  const int n = std::clamp(sessions, 1, 4);
  for (int i = 0; i < n; ++i) sessions_.push_back(engine_.new_session());
  totals_.sessions = n;
  for (int i = 0; i < n; ++i) workers_.emplace_back([this, i] { worker_main(i); });
}

GenerationQueue::~GenerationQueue() { shutdown(); }

std::shared_ptr<Job> GenerationQueue::submit(JobSpec spec) {
  auto job = std::make_shared<Job>(std::move(spec));
  {
    std::lock_guard lock(mu_);
    if (stopping_) return nullptr;
    // Room for one waiting request per idle session plus max_queued.
    const int64_t idle = static_cast<int64_t>(sessions_.size()) - static_cast<int64_t>(running_.size());
    if (static_cast<int64_t>(pending_.size()) >= max_queued_ + std::max<int64_t>(0, idle)) return nullptr;
    pending_.push_back(job);
  }
  cv_.notify_one();
  return job;
}

void GenerationQueue::shutdown() {
  {
    std::lock_guard lock(mu_);
    if (stopping_ && workers_.empty()) return;
    stopping_ = true;
    for (auto& j : pending_) {
      j->cancel();
      j->push({GenEvent::Kind::kDone, "", FinishReason::kCancelled, "server shutting down"});
    }
    pending_.clear();
    for (auto& j : running_) j->cancel();
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
}

QueueStats GenerationQueue::stats() const {
  std::lock_guard lock(mu_);
  QueueStats s = totals_;
  s.queued = static_cast<int64_t>(pending_.size());
  s.active = static_cast<int64_t>(running_.size());
  return s;
}

Status GenerationQueue::eval_locked(Session& session, std::span<const int32_t> tokens) {
  if (!serialize_engine_) return session.eval(tokens);
  std::lock_guard lock(engine_mu_);
  return session.eval(tokens);
}

void GenerationQueue::worker_main(int index) {
  Session& session = *sessions_[index];
  std::vector<int32_t> history;  // tokens the session holds, for prefix reuse
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
      if (stopping_) return;
      job = pending_.front();
      pending_.pop_front();
      running_.push_back(job);
    }
    try {
      run_job(session, history, *job);
    } catch (const std::exception& e) {
      // A bug or an allocation failure in one generation must not take the
      // server down; the session state is unknown, so start it afresh.
      session.reset();
      history.clear();
      job->push({GenEvent::Kind::kDone, "", FinishReason::kError, std::string("generation failed: ") + e.what()});
    }
    std::lock_guard lock(mu_);
    std::erase(running_, job);
  }
}

namespace {

// Bytes of `s` that form complete UTF-8 characters; the rest waits for the
// next token (a token may end inside a multi-byte character).
size_t complete_utf8_prefix(const std::string& s) {
  size_t i = s.size();
  size_t back = 0;
  while (i > 0 && back < 4) {
    const auto c = static_cast<unsigned char>(s[i - 1]);
    if ((c & 0xC0) != 0x80) {  // a lead byte or ASCII
      size_t need = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
      return back + 1 >= need ? s.size() : i - 1;
    }
    --i;
    ++back;
  }
  return s.size();  // not valid UTF-8 anyway: let it through
}

}  // namespace

void GenerationQueue::run_job(Session& session, std::vector<int32_t>& history, Job& job) {
  using clock = std::chrono::steady_clock;
  const JobSpec& spec = job.spec();
  auto finish = [&](FinishReason r, std::string error = "") {
    std::lock_guard lock(mu_);
    if (r == FinishReason::kCancelled) ++totals_.cancelled;
    if (r == FinishReason::kError) ++totals_.failed;
    job.push({GenEvent::Kind::kDone, "", r, std::move(error)});
  };
  if (job.cancelled()) return finish(FinishReason::kCancelled);

  // Reuse the session's KV state when the new prompt extends what it holds
  // (the next turn of the same conversation, rendered identically).
  size_t reuse = 0;
  if (!history.empty() && history.size() < spec.prompt.size() &&
      std::equal(history.begin(), history.end(), spec.prompt.begin()) &&
      session.n_past() == static_cast<int64_t>(history.size())) {
    reuse = history.size();
  } else {
    session.reset();
  }
  history.clear();
  const auto t0 = clock::now();
  Status st = eval_locked(session, std::span<const int32_t>(spec.prompt).subspan(reuse));
  if (!st.is_ok()) {
    session.reset();
    return finish(FinishReason::kError, "prompt evaluation failed: " + st.message());
  }
  history = spec.prompt;
  job.cached_tokens = static_cast<int64_t>(reuse);
  const auto t1 = clock::now();
  {
    std::lock_guard lock(mu_);
    totals_.prompt_tokens += static_cast<int64_t>(spec.prompt.size() - reuse);
    totals_.cached_prompt_tokens += static_cast<int64_t>(reuse);
    totals_.prefill_seconds += std::chrono::duration<double>(t1 - t0).count();
  }
  job.push({GenEvent::Kind::kPrefilled, "", FinishReason::kStop, ""});

  const Tokenizer& tok = engine_.tokenizer();
  const int32_t eos = engine_.info().eos_id;
  Sampler sampler(spec.sampling);
  std::string pending;  // bytes of an incomplete UTF-8 character
  FinishReason reason = FinishReason::kLength;
  int64_t produced = 0;
  auto flush_text = [&](bool all) {
    const size_t n = all ? pending.size() : complete_utf8_prefix(pending);
    if (n == 0) return;
    job.push({GenEvent::Kind::kText, pending.substr(0, n), FinishReason::kStop, ""});
    pending.erase(0, n);
  };
  while (produced < spec.max_tokens) {
    if (job.cancelled()) {
      reason = FinishReason::kCancelled;
      break;
    }
    const int32_t id = sampler.sample(session.last_logits());
    if (id == eos && !spec.ignore_eos) {
      reason = FinishReason::kStop;
      break;
    }
    ++produced;
    job.generated_tokens.store(produced);
    pending += tok.token_bytes(id);
    flush_text(false);
    if (produced >= spec.max_tokens || session.n_past() >= session.max_positions()) break;
    st = eval_locked(session, std::span<const int32_t>(&id, 1));
    if (!st.is_ok()) {
      flush_text(true);
      session.reset();
      history.clear();
      return finish(FinishReason::kError, "decode failed: " + st.message());
    }
    history.push_back(id);
  }
  flush_text(true);
  {
    std::lock_guard lock(mu_);
    totals_.generated_tokens += produced;
    totals_.decode_seconds += std::chrono::duration<double>(clock::now() - t1).count();
  }
  finish(reason);
}

}  // namespace aff::server
