// A scripted Engine for server tests: a byte-level tokenizer with the V4
// special tokens, and sessions whose logits spell out a reply chosen from the
// prompt text, so the HTTP layer is tested without a model.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "affinity/engine.h"
#include "tokenizer/tokenizer.h"

namespace aff::server::testing {

class FakeTokenizer : public Tokenizer {
 public:
  static constexpr int32_t kFirstByte = 16;
  FakeTokenizer()
      : specials_({"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>",
                   "</think>", "<｜latest_reminder｜>"}) {}

  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const override {
    std::vector<int32_t> ids;
    size_t i = 0;
    while (i < text.size()) {
      bool matched = false;
      if (parse_special) {
        for (size_t s = 0; s < specials_.size(); ++s) {
          if (text.compare(i, specials_[s].size(), specials_[s]) == 0) {
            ids.push_back(static_cast<int32_t>(s));
            i += specials_[s].size();
            matched = true;
            break;
          }
        }
      }
      if (!matched) ids.push_back(kFirstByte + static_cast<unsigned char>(text[i++]));
    }
    return ids;
  }
  std::string token_bytes(int32_t id) const override {
    if (id >= 0 && id < static_cast<int32_t>(specials_.size())) return specials_[id];
    if (id >= kFirstByte && id < kFirstByte + 256) return std::string(1, static_cast<char>(id - kFirstByte));
    return "";
  }
  std::string decode(const std::vector<int32_t>& ids, bool = false) const override {
    std::string s;
    for (int32_t id : ids) s += token_bytes(id);
    return s;
  }
  int32_t token_id(std::string_view token) const override {
    for (size_t s = 0; s < specials_.size(); ++s) if (specials_[s] == token) return static_cast<int32_t>(s);
    return -1;
  }
  bool is_special(int32_t id) const override { return id >= 0 && id < kFirstByte; }
  int32_t vocab_size() const override { return kFirstByte + 256; }

 private:
  std::vector<std::string> specials_;
};

class FakeEngine;

class FakeSession : public Session {
 public:
  explicit FakeSession(FakeEngine& engine);
  ~FakeSession() override;
  Status eval(std::span<const int32_t> tokens, std::vector<float>* all_logits = nullptr) override;
  std::span<const float> last_logits() const override { return logits_; }
  int64_t n_past() const override { return static_cast<int64_t>(tokens_.size()); }
  int64_t max_positions() const override;
  void reset() override {
    tokens_.clear();
    reply_.clear();
    pos_ = 0;
  }

 private:
  void set_logits();
  FakeEngine& engine_;
  std::vector<int32_t> tokens_;
  std::vector<int32_t> reply_;
  size_t pos_ = 0;
  std::vector<float> logits_;
};

class FakeEngine : public Engine {
 public:
  FakeEngine() {
    info_.name = "fake-v4";
    info_.vocab_size = tok_.vocab_size();
    info_.max_context = 4096;
    info_.bos_id = 0;
    info_.eos_id = 1;
  }
  const ModelInfo& info() const override { return info_; }
  const Tokenizer& tokenizer() const override { return tok_; }
  std::unique_ptr<Session> new_session(int64_t = 0) override { return std::make_unique<FakeSession>(*this); }

  // Reply text (EOS is appended) for a prompt; default echoes a fixed answer.
  void set_script(std::function<std::string(const std::string& prompt)> f) {
    std::lock_guard lock(mu_);
    script_ = std::move(f);
  }
  std::string reply_for(const std::string& prompt) {
    std::lock_guard lock(mu_);
    return script_ ? script_(prompt) : "ok</think>Hello!";
  }
  std::atomic<int> eval_delay_us{0};
  std::atomic<int64_t> evals{0};
  std::atomic<int64_t> decode_evals{0};
  std::atomic<int> live_sessions{0};
  std::string last_prompt() {
    std::lock_guard lock(mu_);
    return last_prompt_;
  }
  void note_prompt(std::string p) {
    std::lock_guard lock(mu_);
    last_prompt_ = std::move(p);
  }

 private:
  ModelInfo info_;
  FakeTokenizer tok_;
  std::mutex mu_;
  std::function<std::string(const std::string&)> script_;
  std::string last_prompt_;
};

inline FakeSession::FakeSession(FakeEngine& engine) : engine_(engine) { ++engine_.live_sessions; }
inline FakeSession::~FakeSession() { --engine_.live_sessions; }
inline int64_t FakeSession::max_positions() const { return engine_.info().max_context; }

inline Status FakeSession::eval(std::span<const int32_t> tokens, std::vector<float>*) {
  if (n_past() + static_cast<int64_t>(tokens.size()) > max_positions()) return out_of_range("context full");
  ++engine_.evals;
  if (int us = engine_.eval_delay_us.load()) std::this_thread::sleep_for(std::chrono::microseconds(us));
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  if (tokens.size() == 1 && pos_ < reply_.size() && tokens[0] == reply_[pos_]) {
    ++pos_;  // the server fed back the token we asked for
    ++engine_.decode_evals;
  } else {
    const std::string prompt = engine_.tokenizer().decode(tokens_);
    engine_.note_prompt(prompt);
    reply_ = engine_.tokenizer().encode(engine_.reply_for(prompt), /*parse_special=*/true);
    reply_.push_back(engine_.info().eos_id);
    pos_ = 0;
  }
  set_logits();
  return Status::ok();
}

inline void FakeSession::set_logits() {
  logits_.assign(engine_.info().vocab_size, 0.0f);
  const int32_t next = pos_ < reply_.size() ? reply_[pos_] : engine_.info().eos_id;
  logits_[next] = 60.0f;  // every other token has probability ~e^-60
}

}  // namespace aff::server::testing
