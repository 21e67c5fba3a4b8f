// The narrow waist: callers (CLI, server, dashboard, bench) see an Engine
// (loaded weights, tokenizer) and Sessions (one timeline each: KV state and
// logits) and nothing else. Contract sketch; implementation in src/runtime/.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "affinity/status.h"

namespace aff {

class Tokenizer;

struct EngineOptions {
  std::string model_path;       // checkpoint directory (or GGUF file, later); empty = embedded default
  std::string tokenizer_path;   // default: <model dir>/tokenizer.json
  int threads = 0;              // 0 = all cores
  int64_t ctx_size = 0;         // 0 = model maximum capped to a sane default
  int prefill_chunk_size = 0;   // 0 = whole prompt in one chunk
  int max_layers = -1;          // debug: run only the first N layers
  bool no_routed_experts = false;  // debug
};

struct ModelInfo {
  std::string name;             // from the directory / file name
  std::string source;           // path it was loaded from
  int64_t vocab_size = 0;
  int64_t max_context = 0;
  int32_t bos_id = 0;
  int32_t eos_id = 1;
};

struct SamplingParams {
  float temperature = 0.0f;     // 0 = greedy
  int top_k = 0;                // 0 = off
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
};

class Session {
 public:
  virtual ~Session() = default;
  // Appends tokens (prefill in chunks of prefill_chunk_size). If all_logits is
  // given it receives [tokens.size(), vocab] row-major logits.
  virtual Status eval(std::span<const int32_t> tokens, std::vector<float>* all_logits = nullptr) = 0;
  virtual std::span<const float> last_logits() const = 0;  // [vocab] after the last eval
  virtual int64_t n_past() const = 0;
  virtual void reset() = 0;
};

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> load(const EngineOptions& options);
  virtual ~Engine() = default;
  virtual const ModelInfo& info() const = 0;
  virtual const Tokenizer& tokenizer() const = 0;
  virtual std::unique_ptr<Session> new_session() = 0;
};

}  // namespace aff
