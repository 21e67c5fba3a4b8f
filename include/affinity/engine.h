// The narrow waist: callers (CLI, server, dashboard, bench) see an Engine
// (loaded weights, tokenizer), Sessions (one timeline each: KV state and
// logits) and a Sampler, and nothing else. Implementation in src/runtime/.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "affinity/status.h"

namespace aff {

class Tokenizer;
namespace dsv4 {
struct LoadedModel;
}

struct EngineOptions {
  std::string model_path;       // checkpoint directory; empty = the embedded default model
  std::string tokenizer_path;   // empty = <model dir>/tokenizer.json
  int threads = 0;              // OpenMP threads; 0 = leave the runtime's default (all cores)
  int64_t ctx_size = 0;         // positions a session may hold; 0 = model maximum, capped
  int prefill_chunk_size = 0;   // CPU: tokens per forward call in eval(); 0 = whole input at once
  int max_layers = -1;          // debug: run only the first N layers; -1 = all
  bool no_routed_experts = false;  // debug: shared expert only
  // Where the forward pass runs: "auto" (the GPU when this build has CUDA and
  // a GPU can hold the model, else the CPU), "on" (the GPU or fail), "off".
  std::string gpu = "auto";
  int64_t kv_size = 1048576;    // GPU: positions of KV address space per session
  int64_t kv_commit = 8192;     // GPU: positions backed when a session starts (grows on demand)
  int64_t gpu_chunk = 4096;     // GPU: most tokens per forward call (sizes each session's workspace)
};

struct ModelInfo {
  std::string name;             // last component of the model path
  std::string source;           // path it was loaded from
  int64_t vocab_size = 0;       // rows of the embedding / head
  int64_t max_context = 0;      // resolved ctx_size: the most positions one session holds
  int32_t bos_id = 0;
  int32_t eos_id = 1;
  std::string backend = "cpu";  // "cpu", or "cuda: <GPU>, <weights>" when sessions run on the GPU
  std::string backend_note;     // why --gpu auto stayed on the CPU, if it did
};

struct SamplingParams {
  float temperature = 0.0f;     // <= 0: greedy (argmax, lowest id on ties)
  int top_k = 0;                // 0 = off
  float top_p = 1.0f;           // 1 = off
  float min_p = 0.0f;           // 0 = off; keeps p >= min_p * p_max
  uint64_t seed = 0;
};

class Session {
 public:
  virtual ~Session() = default;
  // Appends tokens at positions [n_past, n_past + size) in chunks of the
  // engine's prefill_chunk_size. If all_logits is given it is resized to
  // [tokens.size(), vocab] row-major and receives the logits of every position.
  // Fails (state unchanged) on an out-of-vocab id or when the context is full.
  virtual Status eval(std::span<const int32_t> tokens, std::vector<float>* all_logits = nullptr) = 0;
  virtual std::span<const float> last_logits() const = 0;  // [vocab] after the last eval; empty before
  virtual int64_t n_past() const = 0;
  virtual int64_t max_positions() const = 0;
  virtual void reset() = 0;
};

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> load(const EngineOptions& options);
  virtual ~Engine() = default;
  virtual const ModelInfo& info() const = 0;
  virtual const Tokenizer& tokenizer() const = 0;
  // max_positions: 0 = info().max_context; larger values are clamped to it.
  virtual std::unique_ptr<Session> new_session(int64_t max_positions = 0) = 0;
  // The model as the CPU reference backend sees it, for model-level tools
  // (perplexity with the MTP head, routing statistics); null if there is none.
  virtual const dsv4::LoadedModel* reference_model() const { return nullptr; }
};

// Draws the next token from a logits row. Filters apply in the order
// temperature, top-k, top-p, min-p (as HF transformers and vLLM do); the RNG
// is our own xoshiro256** so a seed gives the same tokens on every platform.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  int32_t sample(std::span<const float> logits);  // logits: [vocab]
  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  uint64_t rng_[4];
};

}  // namespace aff
