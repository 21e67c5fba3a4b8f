// Engine and Session over the DeepSeek-V4 CPU reference forward pass.
#include "affinity/engine.h"

#include <omp.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "model/dsv4/forward.h"
#include "format/gguf_reader.h"
#include "model/dsv4/load_gguf.h"
#include "model/dsv4/loaded_model.h"
#include "model/dsv4/tokenizer_gguf.h"
#include "runtime/gpu_backend.h"
#include "runtime/model_path.h"
#include "tokenizer/tokenizer.h"

namespace aff {

namespace {

namespace fs = std::filesystem;

// Cap for ctx_size 0: the full 1M-position window of V4-Flash would make every
// session reserve state it almost never uses.
constexpr int64_t kDefaultContextCap = 65536;

class DsV4Session final : public Session {
 public:
  DsV4Session(const dsv4::LoadedModel& model, const EngineOptions& opts, int64_t max_positions)
      : model_(model), state_(dsv4::make_state(model, max_positions)), max_positions_(max_positions) {
    fwd_.max_layers = opts.max_layers;
    fwd_.no_routed_experts = opts.no_routed_experts;
    chunk_ = opts.prefill_chunk_size > 0 ? opts.prefill_chunk_size : 0;
  }

  Status eval(std::span<const int32_t> tokens, std::vector<float>* all_logits) override {
    const int64_t vocab = model_.config.vocab_size;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] < 0 || tokens[i] >= vocab) {
        return invalid_argument(fmt::format("token id {} at input position {} is outside the vocabulary [0, {})",
                                            tokens[i], i, vocab));
      }
    }
    const int64_t n_past = dsv4::state_n_past(*state_);
    if (n_past + int64_t(tokens.size()) > max_positions_) {
      return out_of_range(fmt::format("context full: {} positions used + {} new tokens exceed the session's {}",
                                      n_past, tokens.size(), max_positions_));
    }
    if (all_logits != nullptr) all_logits->assign(tokens.size() * size_t(vocab), 0.0f);
    if (tokens.empty()) return Status::ok();

    const size_t step = chunk_ > 0 ? size_t(chunk_) : tokens.size();
    for (size_t start = 0; start < tokens.size(); start += step) {
      const size_t n = std::min(step, tokens.size() - start);
      const bool all = all_logits != nullptr;
      AFF_RETURN_IF_ERROR(dsv4::forward(model_, *state_, tokens.subspan(start, n), all, scratch_, fwd_));
      if (all) {
        std::copy(scratch_.begin(), scratch_.end(), all_logits->begin() + ptrdiff_t(start * size_t(vocab)));
      }
    }
    // scratch_ holds either the last chunk's rows or just its last row.
    last_.assign(scratch_.end() - vocab, scratch_.end());
    return Status::ok();
  }

  std::span<const float> last_logits() const override { return last_; }
  int64_t n_past() const override { return dsv4::state_n_past(*state_); }
  int64_t max_positions() const override { return max_positions_; }
  void reset() override {
    dsv4::state_reset(*state_);
    last_.clear();
  }

 private:
  const dsv4::LoadedModel& model_;
  std::unique_ptr<dsv4::State> state_;
  int64_t max_positions_;
  dsv4::ForwardOptions fwd_;
  int chunk_ = 0;
  std::vector<float> scratch_;  // forward output: [T, vocab] or [vocab]
  std::vector<float> last_;     // [vocab]
};

// A session whose state and forward pass live on the GPU; same contract as
// DsV4Session (chunking is the GPU state's, which does not change logits).
class GpuSession final : public Session {
 public:
  GpuSession(std::unique_ptr<runtime::GpuTimeline> tl, int64_t vocab, int64_t max_positions)
      : tl_(std::move(tl)), vocab_(vocab), max_positions_(max_positions) {}

  Status eval(std::span<const int32_t> tokens, std::vector<float>* all_logits) override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] < 0 || tokens[i] >= vocab_) {
        return invalid_argument(fmt::format("token id {} at input position {} is outside the vocabulary [0, {})",
                                            tokens[i], i, vocab_));
      }
    }
    if (tl_->n_past() + int64_t(tokens.size()) > max_positions_) {
      return out_of_range(fmt::format("context full: {} positions used + {} new tokens exceed the session's {}",
                                      tl_->n_past(), tokens.size(), max_positions_));
    }
    if (all_logits != nullptr) all_logits->clear();
    if (tokens.empty()) return Status::ok();
    AFF_RETURN_IF_ERROR(tl_->eval(tokens, all_logits != nullptr, scratch_));
    if (all_logits != nullptr) *all_logits = scratch_;
    last_.assign(scratch_.end() - vocab_, scratch_.end());
    return Status::ok();
  }

  std::span<const float> last_logits() const override { return last_; }
  int64_t n_past() const override { return tl_->n_past(); }
  int64_t max_positions() const override { return max_positions_; }
  void reset() override {
    tl_->reset();
    last_.clear();
  }

 private:
  std::unique_ptr<runtime::GpuTimeline> tl_;
  int64_t vocab_, max_positions_;
  std::vector<float> scratch_, last_;
};

class DsV4Engine final : public Engine {
 public:
  DsV4Engine(EngineOptions opts, std::unique_ptr<dsv4::LoadedModel> model, std::unique_ptr<Tokenizer> tok,
             ModelInfo info)
      : opts_(std::move(opts)), model_(std::move(model)), tok_(std::move(tok)), info_(std::move(info)) {}

  const ModelInfo& info() const override { return info_; }
  const Tokenizer& tokenizer() const override { return *tok_; }
  std::unique_ptr<Session> new_session(int64_t max_positions) override {
    const int64_t n = max_positions > 0 ? std::min(max_positions, info_.max_context) : info_.max_context;
    if (gpu_) {
      dsv4::ForwardOptions fwd;
      fwd.max_layers = opts_.max_layers;
      fwd.no_routed_experts = opts_.no_routed_experts;
      auto tl = gpu_->new_timeline(n, fwd);
      // Out of GPU memory for one more session: that session runs on the CPU instead.
      if (tl.is_ok()) return std::make_unique<GpuSession>(std::move(tl).value(), model_->config.vocab_size, n);
    }
    return std::make_unique<DsV4Session>(*model_, opts_, n);
  }
  void set_gpu(std::unique_ptr<runtime::GpuModel> gpu) { gpu_ = std::move(gpu); }
  const dsv4::LoadedModel* reference_model() const override { return model_.get(); }

 private:
  EngineOptions opts_;
  std::unique_ptr<dsv4::LoadedModel> model_;
  std::unique_ptr<Tokenizer> tok_;
  ModelInfo info_;
  std::unique_ptr<runtime::GpuModel> gpu_;  // null: sessions run on the CPU
};

// The GPU model per --gpu, or null for the CPU; an error only for "on".
Result<std::unique_ptr<runtime::GpuModel>> choose_gpu(const EngineOptions& opts, const dsv4::LoadedModel& model,
                                                      std::string& note) {
  if (opts.gpu == "off") return std::unique_ptr<runtime::GpuModel>();
  if (opts.gpu != "on" && opts.gpu != "auto")
    return invalid_argument(fmt::format("--gpu: expected auto, on or off, got '{}'", opts.gpu));
  runtime::GpuBackendOptions go;
  go.kv_size = opts.kv_size;
  go.kv_commit = opts.kv_commit;
  go.max_chunk = opts.gpu_chunk;
  if (opts.gpu == "auto" && !runtime::gpu_backend_built()) return std::unique_ptr<runtime::GpuModel>();
  auto gpu = runtime::load_gpu_model(model, go);
  if (gpu.is_ok()) return std::move(gpu).value();
  if (opts.gpu == "on") return Status(gpu.status().code(), "--gpu on: " + gpu.status().message());
  note = "GPU not used: " + gpu.status().message();
  return std::unique_ptr<runtime::GpuModel>();
}

}  // namespace

Result<std::unique_ptr<Engine>> Engine::load(const EngineOptions& options) {
  EngineOptions opts = options;
  if (opts.model_path.empty()) {
    AFF_ASSIGN_OR_RETURN(opts.model_path, runtime::find_default_model(runtime::default_model_roots()));
  }
  std::error_code ec;
  const fs::file_status st = fs::status(opts.model_path, ec);
  if (!fs::exists(st)) return not_found(fmt::format("model '{}' does not exist", opts.model_path));
  // A checkpoint directory or a GGUF container (recognised by its magic).
  const bool gguf = !fs::is_directory(st) && dsv4::is_gguf_file(opts.model_path);
  if (!fs::is_directory(st) && !gguf) {
    return unsupported(fmt::format("model '{}' is neither a checkpoint directory nor a GGUF file", opts.model_path));
  }
  if (opts.threads > 0) omp_set_num_threads(opts.threads);

  std::shared_ptr<const format::GgufFile> gguf_file;
  Result<std::unique_ptr<dsv4::LoadedModel>> model = Status::ok();
  if (gguf) {
    auto f = format::GgufFile::open(opts.model_path);
    if (!f.is_ok()) return f.status();
    gguf_file = std::make_shared<const format::GgufFile>(std::move(f).value());
    model = dsv4::load_gguf(gguf_file);
  } else {
    model = dsv4::load_checkpoint_dir(opts.model_path);
  }
  if (!model.is_ok()) return model.status();

  // --tokenizer wins; else the directory's tokenizer.json or the GGUF's own.
  Result<std::unique_ptr<Tokenizer>> tok = Status::ok();
  if (gguf && opts.tokenizer_path.empty()) {
    tok = dsv4::tokenizer_from_gguf(*gguf_file);
    opts.tokenizer_path = opts.model_path;
  } else {
    if (opts.tokenizer_path.empty()) opts.tokenizer_path = (fs::path(opts.model_path) / "tokenizer.json").string();
    if (!fs::exists(opts.tokenizer_path, ec)) {
      return not_found(fmt::format("tokenizer '{}' does not exist (give one with --tokenizer FILE)", opts.tokenizer_path));
    }
    tok = Tokenizer::load(opts.tokenizer_path);
  }
  if (!tok.is_ok()) return tok.status();

  const dsv4::ModelConfig& cfg = model.value()->config;
  if (int64_t(tok.value()->vocab_size()) > cfg.vocab_size) {
    return invalid_argument(fmt::format("tokenizer '{}' has {} ids but the model's vocab_size is {}",
                                        opts.tokenizer_path, tok.value()->vocab_size(), cfg.vocab_size));
  }

  ModelInfo info;
  info.source = opts.model_path;
  info.name = fs::path(opts.model_path).lexically_normal().filename().string();
  if (info.name.empty()) info.name = fs::path(opts.model_path).lexically_normal().parent_path().filename().string();
  info.vocab_size = cfg.vocab_size;
  const int64_t model_max = cfg.max_position_embeddings > 0 ? cfg.max_position_embeddings : kDefaultContextCap;
  info.max_context = opts.ctx_size > 0 ? std::min(opts.ctx_size, model_max) : std::min(model_max, kDefaultContextCap);
  info.bos_id = cfg.bos_token_id;
  info.eos_id = cfg.eos_token_id;

  std::string note;
  auto gpu = choose_gpu(opts, *model.value(), note);
  if (!gpu.is_ok()) return gpu.status();
  if (gpu.value()) {
    info.backend = "cuda: " + gpu.value()->description();
    info.max_context = std::min(info.max_context, opts.kv_size);
  }
  info.backend_note = note;

  auto engine =
      std::make_unique<DsV4Engine>(std::move(opts), std::move(model).value(), std::move(tok).value(), std::move(info));
  engine->set_gpu(std::move(gpu).value());
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace aff
