#include "quant/quantizer/quantize_model.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "format/gguf_writer.h"
#include "format/tensor_index.h"
#include "model/dsv4/config_gguf.h"
#include "model/dsv4/config_json.h"
#include "model/dsv4/weights_bind.h"
#include "quant/imatrix.h"
#include "quant/quantizer/tensor_job.h"
#include "quant/quantizer/tensor_plan.h"
#include "quant/quantizer/tokenizer_metadata.h"

namespace aff::quant {
namespace {

namespace fs = std::filesystem;
using format::GgufType;
using format::GgufValue;

// Share of routed slots per expert, layer-major, from GGUF imatrix counts.
std::optional<std::vector<float>> expert_popularity(const Imatrix& im, int n_layers, int n_experts) {
  std::vector<float> pop(size_t(n_layers) * size_t(n_experts), 0.0f);
  bool any = false;
  for (int L = 0; L < n_layers; ++L) {
    const auto counts = im.matrix_counts(fmt::format("blk.{}.ffn_gate_exps.weight", L), n_experts);
    if (!counts) continue;
    double total = 0.0;
    for (float c : *counts) total += c;
    if (!(total > 0.0)) continue;
    for (int e = 0; e < n_experts; ++e) pop[size_t(L * n_experts + e)] = float((*counts)[size_t(e)] / total);
    any = true;
  }
  if (!any) return std::nullopt;
  return pop;
}

Result<std::string> read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return io_error(fmt::format("{}: cannot read", p.string()));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs the jobs on `threads` workers and hands their outputs to `sink` in job order.
// A worker may run ahead of the writer by at most `window` jobs, which bounds memory.
Status run_ordered(const std::vector<PlannedTensor>& plan, const std::vector<TensorJob>& jobs, const Imatrix* im,
                   int threads, const std::function<Status(size_t, const std::vector<uint8_t>&)>& sink) {
  const size_t window = size_t(std::max(2, 2 * threads));
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::optional<std::vector<uint8_t>>> done(jobs.size());
  size_t next_job = 0, next_write = 0;
  Status failure;
  bool stop = false;

  auto worker = [&] {
    std::vector<uint8_t> buf;
    for (;;) {
      size_t j;
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return stop || next_job >= jobs.size() || next_job < next_write + window; });
        if (stop || next_job >= jobs.size()) return;
        j = next_job++;
      }
      const Status st = run_job(plan[jobs[j].tensor], jobs[j], im, &buf);
      std::lock_guard lock(mu);
      if (!st.is_ok()) {
        if (failure.is_ok()) failure = st;
        stop = true;
      } else {
        done[j] = std::move(buf);
        buf = {};
      }
      cv.notify_all();
    }
  };
  std::vector<std::thread> pool;
  for (int i = 0; i < std::max(1, threads); ++i) pool.emplace_back(worker);

  Status result;
  while (true) {
    std::vector<uint8_t> bytes;
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return stop || next_write >= jobs.size() || done[next_write].has_value(); });
      if (stop || next_write >= jobs.size()) break;
      bytes = std::move(*done[next_write]);
      done[next_write].reset();
    }
    result = sink(next_write, bytes);
    std::lock_guard lock(mu);
    if (!result.is_ok()) {
      stop = true;
      cv.notify_all();
      break;
    }
    ++next_write;
    cv.notify_all();
  }
  {
    std::lock_guard lock(mu);
    stop = true;
    cv.notify_all();
  }
  for (auto& t : pool) t.join();
  if (!failure.is_ok()) return failure;
  return result;
}

}  // namespace

Result<QuantizeSummary> quantize_checkpoint(const QuantizeOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  auto note = [&](const std::string& s) {
    if (o.on_note) o.on_note(s);
  };
  if (o.out_path.empty()) return invalid_argument("no output path (--out)");
  if (o.threads < 1) return invalid_argument(fmt::format("--threads {}: must be >= 1", o.threads));
  AFF_ASSIGN_OR_RETURN(Recipe recipe, recipe_by_name(o.recipe));

  std::error_code ec;
  if (!fs::is_directory(o.src_dir, ec)) {
    return not_found(fmt::format("{}: not a checkpoint directory (expected config.json and safetensors)", o.src_dir));
  }
  AFF_ASSIGN_OR_RETURN(dsv4::ModelConfig cfg, dsv4::load_config_json((fs::path(o.src_dir) / "config.json").string()));
  AFF_ASSIGN_OR_RETURN(format::TensorIndex index, format::TensorIndex::open_dir(o.src_dir));
  // Full validation of presence, dtype and shape before any output exists.
  AFF_RETURN_IF_ERROR(dsv4::bind_weights(cfg, index).status());

  std::optional<Imatrix> imatrix;
  if (!o.imatrix_path.empty()) {
    AFF_ASSIGN_OR_RETURN(Imatrix im, Imatrix::load(o.imatrix_path));
    imatrix = std::move(im);
  }

  AFF_ASSIGN_OR_RETURN(std::vector<PlannedTensor> plan,
                       plan_tensors(cfg, index, recipe, o.rules, PlanOptions{o.max_layers}));
  const dsv4::ModelConfig out_cfg = truncate_layers(cfg, o.max_layers);

  QuantizeSummary sum;
  format::GgufWriter writer(o.out_path);
  for (auto& [k, v] : dsv4::config_gguf_metadata(out_cfg)) AFF_RETURN_IF_ERROR(writer.set(k, v));
  AFF_RETURN_IF_ERROR(writer.set("general.name", GgufValue::string(fs::path(o.src_dir).filename().string())));
  AFF_RETURN_IF_ERROR(writer.set("general.quantization_version", GgufValue::u32(2)));
  AFF_RETURN_IF_ERROR(writer.set(std::string(kGgufKeyQuantizeRecipe), GgufValue::string(recipe.name)));
  if (imatrix) {
    AFF_RETURN_IF_ERROR(writer.set(std::string(kGgufKeyQuantizeImatrix),
                                   GgufValue::string(fs::path(o.imatrix_path).filename().string())));
    if (auto pop = expert_popularity(*imatrix, out_cfg.num_layers, out_cfg.n_routed_experts)) {
      AFF_RETURN_IF_ERROR(writer.set(std::string(kGgufKeyExpertPopularity), GgufValue::array(GgufType::kF32, *pop)));
      sum.popularity_written = true;
    } else {
      note("imatrix has no per-expert counts (legacy format or no ffn_gate_exps entries): no expert popularity");
    }
  }
  const fs::path tok = fs::path(o.src_dir) / "tokenizer.json";
  if (fs::exists(tok, ec)) {
    AFF_ASSIGN_OR_RETURN(std::string text, read_text(tok));
    AFF_ASSIGN_OR_RETURN(auto kv, tokenizer_gguf_metadata(text, tok.string(), out_cfg.vocab_size));
    for (auto& [k, v] : kv) AFF_RETURN_IF_ERROR(writer.set(k, std::move(v)));
  } else {
    note(fmt::format("{}: not found; the container has no tokenizer metadata", tok.string()));
  }

  uint64_t total = 0;
  for (const auto& t : plan) {
    AFF_RETURN_IF_ERROR(writer.add_tensor(t.name, t.type.type, t.ne));
    total += t.nbytes();
    const int64_t elems = t.n_mat() * t.rows * t.ne[0];
    auto& bt = sum.by_type[std::string(ggml_type_name(t.type.type))];
    bt.first += uint64_t(elems);
    bt.second += t.nbytes();
    if (t.role == TensorRole::kExpertGateUp || t.role == TensorRole::kExpertDown) {
      sum.expert_elements += uint64_t(elems);
      sum.expert_bytes += t.nbytes();
    }
    if (t.type.fell_back()) {
      ++sum.fallbacks;
      note(fmt::format("{}: row length {} is not a multiple of {}'s block, written as {}", t.name, t.ne[0],
                       ggml_type_name(t.type.wanted), ggml_type_name(t.type.type)));
    }
    if (imatrix && ggml_traits(t.type.type).quantized && imatrix->find(t.name) != nullptr) ++sum.imatrix_tensors;
  }
  if (imatrix && sum.imatrix_tensors == 0) {
    note(fmt::format("{}: no entry matches a quantised tensor name; rounding is unweighted", o.imatrix_path));
  }
  AFF_RETURN_IF_ERROR(writer.write_header());

  const std::vector<TensorJob> jobs = make_jobs(plan);
  QuantizeProgress prog;
  prog.bytes_total = total;
  prog.tensors_total = plan.size();
  auto sink = [&](size_t j, const std::vector<uint8_t>& bytes) -> Status {
    AFF_RETURN_IF_ERROR(writer.append(bytes));
    prog.bytes_done += bytes.size();
    const bool last_of_tensor = j + 1 == jobs.size() || jobs[j + 1].tensor != jobs[j].tensor;
    if (last_of_tensor) ++prog.tensors_done;
    prog.tensor = plan[jobs[j].tensor].name;
    prog.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (o.on_progress) o.on_progress(prog);
    return Status::ok();
  };
  AFF_RETURN_IF_ERROR(run_ordered(plan, jobs, imatrix ? &*imatrix : nullptr, o.threads, sink));
  AFF_RETURN_IF_ERROR(writer.finish());

  sum.n_tensors = plan.size();
  sum.data_bytes = total;
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return sum;
}

}  // namespace aff::quant
