// Runs generations off the HTTP threads: a bounded queue of jobs served by
// 1..4 workers, each owning one Session. A job streams its output as events
// to whoever holds it; cancelling it (client gone, stop string hit) ends the
// generation at the next token.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "affinity/engine.h"

namespace aff::server {

enum class FinishReason { kStop, kLength, kCancelled, kError };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "error"

struct GenEvent {
  enum class Kind { kPrefilled, kText, kDone };
  Kind kind = Kind::kText;
  std::string text;          // kText: newly complete UTF-8 text (may be empty for a partial char)
  FinishReason finish = FinishReason::kStop;  // kDone
  std::string error;         // kDone with kError
};

struct JobSpec {
  std::vector<int32_t> prompt;  // full prompt, BOS included
  SamplingParams sampling;
  int64_t max_tokens = 0;       // already resolved (floor, context)
  bool ignore_eos = false;
};

// Shared by the HTTP handler (reads events) and a worker (writes them).
class Job {
 public:
  explicit Job(JobSpec spec) : spec_(std::move(spec)) {}
  const JobSpec& spec() const { return spec_; }

  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

  // Waits up to `timeout` for events; returns those available (maybe none).
  std::vector<GenEvent> wait_events(std::chrono::milliseconds timeout);
  void push(GenEvent e);

  // Counters, final once kDone was delivered.
  int64_t prompt_tokens() const { return static_cast<int64_t>(spec_.prompt.size()); }
  int64_t cached_tokens = 0;
  std::atomic<int64_t> generated_tokens{0};

 private:
  JobSpec spec_;
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GenEvent> events_;
};

struct QueueStats {
  int64_t queued = 0;
  int64_t active = 0;
  int64_t sessions = 0;
  int64_t prompt_tokens = 0;       // evaluated (not served from a session's cache)
  int64_t cached_prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t cancelled = 0;
  int64_t failed = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
};

class GenerationQueue {
 public:
  // Creates `sessions` sessions up front (clamped to 1..4).
  GenerationQueue(Engine& engine, int sessions, int max_queued, bool serialize_engine);
  ~GenerationQueue();
  GenerationQueue(const GenerationQueue&) = delete;
  GenerationQueue& operator=(const GenerationQueue&) = delete;

  // nullptr when the queue is full (the caller answers 503).
  std::shared_ptr<Job> submit(JobSpec spec);
  // Cancels everything and joins the workers.
  void shutdown();
  QueueStats stats() const;

 private:
  void worker_main(int index);
  void run_job(Session& session, std::vector<int32_t>& history, Job& job);
  Status eval_locked(Session& session, std::span<const int32_t> tokens);

  Engine& engine_;
  const int max_queued_;
  const bool serialize_engine_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> pending_;
  std::vector<std::shared_ptr<Job>> running_;
  bool stopping_ = false;
  std::vector<std::unique_ptr<Session>> sessions_;
  std::vector<std::thread> workers_;
  std::mutex engine_mu_;
  QueueStats totals_;
};

}  // namespace aff::server
