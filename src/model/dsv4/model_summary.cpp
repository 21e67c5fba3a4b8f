#include "model/dsv4/model_summary.h"

#include <algorithm>
#include <charconv>
#include <filesystem>

#include <fmt/format.h>

#include "format/gguf_dsv4_names.h"
#include "format/gguf_reader.h"
#include "format/tensor_index.h"
#include "model/dsv4/config_gguf.h"
#include "model/dsv4/config_json.h"
#include "model/dsv4/load_gguf.h"
#include "model/dsv4/loaded_model.h"
#include "model/dsv4/tokenizer_gguf.h"

namespace aff::dsv4 {

namespace {

namespace fs = std::filesystem;

// Parses "<prefix><digits>." at the start of name; -1 if it does not match.
int index_after(std::string_view name, std::string_view prefix) {
  if (name.substr(0, prefix.size()) != prefix) return -1;
  name.remove_prefix(prefix.size());
  int v = -1;
  const auto [p, ec] = std::from_chars(name.data(), name.data() + name.size(), v);
  if (ec != std::errc() || p == name.data() + name.size() || *p != '.') return -1;
  return v;
}

void add_gguf_tensors(const format::GgufFile& f, ModelSummary& s) {
  for (const format::GgufTensorInfo& t : f.tensors()) {
    StoredTensor st;
    st.name = t.name;
    st.type = std::string(quant::ggml_type_name(t.type));
    st.shape = t.ne;
    st.elements = t.n_elements();
    st.bytes = t.nbytes;
    st.layer = index_after(t.name, "blk.");
    const bool stacked = t.name.find("_exps.") != std::string::npos;
    st.routed_expert = stacked && st.layer >= 0;
    st.experts_in = stacked && t.ne.size() == 3 ? int(t.ne[2]) : 0;
    const bool known = format::dsv4_hf_name(t.name, stacked ? 0 : -1).has_value();
    if (!known) s.problems.push_back(fmt::format("tensor '{}' is not a deepseek4 tensor affinity knows", t.name));
    s.tensors.push_back(std::move(st));
  }
}

void add_checkpoint_tensors(const format::TensorIndex& index, ModelSummary& s) {
  for (const auto& [name, v] : index.tensors()) {
    StoredTensor st;
    st.name = name;
    st.type = std::string(dtype_name(v.dtype));
    st.shape = v.shape;
    st.bytes = v.nbytes;
    // Packed FP4 holds two weights per byte; E8M0 scales are overhead, not weights.
    st.elements = v.dtype == DType::kI8 ? 2 * v.numel() : v.dtype == DType::kF8E8M0 ? 0 : v.numel();
    st.layer = index_after(name, "layers.");
    st.routed_expert = st.layer >= 0 && name.find(".ffn.experts.") != std::string::npos;
    st.experts_in = st.routed_expert ? 1 : 0;
    s.tensors.push_back(std::move(st));
  }
}

// Per-(layer, expert) bytes from the stored tensors.
void tally(ModelSummary& s) {
  const int E = s.config ? s.config->n_routed_experts : 0;
  const int L = s.config ? s.config->num_layers : 0;
  if (E > 0 && L > 0) s.expert_unit_bytes.assign(size_t(L), std::vector<uint64_t>(size_t(E), 0));
  for (const StoredTensor& t : s.tensors) {
    TypeTotal& ty = s.by_type[t.type];
    ty.tensors += 1;
    ty.elements += t.elements;
    ty.bytes += t.bytes;
    TypeTotal& part = t.routed_expert ? s.experts : s.dense;
    part.tensors += 1;
    part.elements += t.elements;
    part.bytes += t.bytes;
    if (!t.routed_expert || s.expert_unit_bytes.empty() || t.layer >= L) continue;
    auto& row = s.expert_unit_bytes[size_t(t.layer)];
    if (t.experts_in == E) {  // stacked: equal slices
      for (auto& b : row) b += t.bytes / uint64_t(E);
    } else {
      const size_t at = t.name.find(".ffn.experts.");
      int e = -1;
      if (at != std::string::npos) e = index_after(std::string_view(t.name).substr(at + 1), "ffn.experts.");
      if (e >= 0 && e < E) row[size_t(e)] += t.bytes;
    }
  }
}

double bpw(const TypeTotal& t) { return t.elements > 0 ? double(t.bytes) * 8.0 / double(t.elements) : 0.0; }
double mib(uint64_t b) { return double(b) / double(1 << 20); }

}  // namespace

Result<ModelSummary> summarize_model(const std::string& path) {
  ModelSummary s;
  s.source = path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    s.container = "checkpoint directory";
    auto cfg = load_config_json((fs::path(path) / "config.json").string());
    if (cfg.is_ok()) s.config = *cfg;
    else s.problems.push_back(cfg.status().message());
    auto index = format::TensorIndex::open_dir(path);
    if (!index.is_ok()) {
      s.problems.push_back(index.status().message());
    } else {
      add_checkpoint_tensors(*index, s);
    }
    if (!fs::exists(fs::path(path) / "tokenizer.json", ec)) {
      s.problems.push_back(fmt::format("{}: no tokenizer.json (running needs --tokenizer FILE)", path));
    }
    if (cfg.is_ok() && index.is_ok()) {
      auto m = load_checkpoint_dir(path);
      if (!m.is_ok()) s.problems.push_back(m.status().message());
    }
  } else if (fs::is_regular_file(path, ec) && is_gguf_file(path)) {
    auto f = format::GgufFile::open(path);
    if (!f.is_ok()) return f.status();
    s.container = fmt::format("GGUF v{}", f->version());
    auto cfg = config_from_gguf(*f);
    if (cfg.is_ok()) s.config = *cfg;
    else s.problems.push_back(cfg.status().message());
    add_gguf_tensors(*f, s);
    if (!gguf_has_tokenizer(*f)) {
      s.problems.push_back(fmt::format("{}: carries no tokenizer (running needs --tokenizer FILE)", path));
    }
    if (cfg.is_ok()) {
      auto m = load_gguf(std::make_shared<const format::GgufFile>(std::move(f).value()));
      if (!m.is_ok()) s.problems.push_back(m.status().message());
      else s.config = (*m)->config;  // num_mtp_layers as loaded
    }
  } else if (fs::exists(path, ec)) {
    return unsupported(fmt::format("{}: neither a checkpoint directory nor a GGUF file", path));
  } else {
    return not_found(fmt::format("{}: does not exist", path));
  }
  tally(s);
  return s;
}

uint64_t kv_state_bytes(const ModelConfig& c, int64_t ctx) {
  uint64_t values = 0;
  for (int l = 0; l < c.num_layers; ++l) {
    const int r = c.compress_ratio(l);
    values += uint64_t(std::min<int64_t>(ctx, c.sliding_window)) * uint64_t(c.head_dim);
    if (r > 0) values += uint64_t(ctx / r) * uint64_t(c.head_dim);
    if (r == 4) values += uint64_t(ctx / 4) * uint64_t(c.index_head_dim);
  }
  return values * 4;
}

Placement plan_placement(const ModelSummary& s, uint64_t gpu_bytes, int64_t ctx) {
  Placement p;
  p.budget = gpu_bytes;
  p.dense = s.dense.bytes;
  p.kv = s.config ? kv_state_bytes(*s.config, ctx) : 0;
  p.dense_fits = p.dense + p.kv <= gpu_bytes;
  uint64_t left = p.dense_fits ? gpu_bytes - p.dense - p.kv : 0;
  bool full = !p.dense_fits;
  const size_t E = s.expert_unit_bytes.empty() ? 0 : s.expert_unit_bytes[0].size();
  for (size_t e = 0; e < E; ++e) {
    for (const auto& row : s.expert_unit_bytes) {
      const uint64_t b = row[e];
      if (!full && b <= left) {
        left -= b;
        p.experts_vram += 1;
        p.expert_bytes_vram += b;
      } else {
        full = true;  // keep the round-robin order: no later, smaller expert jumps the queue
        p.experts_ram += 1;
        p.expert_bytes_ram += b;
      }
    }
  }
  return p;
}

std::string format_summary(const ModelSummary& s, std::optional<uint64_t> gpu_bytes, int64_t ctx) {
  std::string o;
  auto line = [&](const std::string& l) { o += l + "\n"; };
  line(fmt::format("model: {} ({})", s.source, s.container));
  if (s.config) {
    const ModelConfig& c = *s.config;
    const char* variant = c.variant == Variant::kV4Flash0731 ? "V4-Flash-0731 (DSpark)" : "V4-Flash";
    line(fmt::format("architecture: DeepSeek {}; {} layers{}, hidden {}, vocab {}, context {}", variant,
                     c.num_layers, c.num_mtp_layers > 0 ? fmt::format(" + {} MTP", c.num_mtp_layers) : "",
                     c.hidden_size, c.vocab_size, c.max_position_embeddings));
    line(fmt::format("  attention: {} heads x {} (rope {}), q_lora {}, output {} groups x {}, window {}",
                     c.num_heads, c.head_dim, c.rope_dim, c.q_lora_rank, c.o_groups, c.o_lora_rank,
                     c.sliding_window));
    std::string ratios;
    for (size_t i = 0; i < c.compress_ratios.size(); ++i) {
      ratios += fmt::format("{}{}", i == 0 ? "" : (int(i) == c.num_layers ? " | " : " "), c.compress_ratios[i]);
    }
    line("  compress ratios: " + ratios);
    line(fmt::format("  indexer: {} heads x {}, top-k {}", c.index_n_heads, c.index_head_dim, c.index_topk));
    line(fmt::format("  MoE: {} routed experts ({} per token, inter {}) + {} shared; {} hash-routed layers",
                     c.n_routed_experts, c.n_experts_per_tok, c.moe_inter, c.n_shared_experts, c.num_hash_layers));
    line(fmt::format("  mHC: {} streams, {} Sinkhorn iterations", c.hc_mult, c.hc_sinkhorn_iters));
  }
  TypeTotal all;
  for (const auto& [t, v] : s.by_type) {
    all.tensors += v.tensors;
    all.elements += v.elements;
    all.bytes += v.bytes;
  }
  line(fmt::format("tensors: {}, {:.2f} MiB, {:.3f} bits per weight overall", all.tensors, mib(all.bytes), bpw(all)));
  line(fmt::format("  {:<10} {:>8} {:>16} {:>12} {:>8}", "type", "tensors", "weights", "MiB", "bpw"));
  for (const auto& [t, v] : s.by_type) {
    line(fmt::format("  {:<10} {:>8} {:>16} {:>12.2f} {:>8.3f}", t, v.tensors, v.elements, mib(v.bytes), bpw(v)));
  }
  int units = 0;
  for (const auto& row : s.expert_unit_bytes) units += int(row.size());
  line(fmt::format("routed experts: {} ({} layers x {}), {:.2f} MiB = {:.1f}% of the model, {:.3f} bpw, "
                   "{:.1f} KiB per expert on average",
                   units, s.expert_unit_bytes.size(), s.expert_unit_bytes.empty() ? 0 : s.expert_unit_bytes[0].size(),
                   mib(s.experts.bytes), all.bytes ? 100.0 * double(s.experts.bytes) / double(all.bytes) : 0.0,
                   bpw(s.experts), units ? double(s.experts.bytes) / units / 1024.0 : 0.0));
  line(fmt::format("dense (everything else): {:.2f} MiB, {:.3f} bpw", mib(s.dense.bytes), bpw(s.dense)));
  std::vector<std::string> problems = s.problems;
  if (gpu_bytes) {
    const Placement p = plan_placement(s, *gpu_bytes, ctx);
    line(fmt::format("placement for {:.0f} MiB of VRAM, {} positions:", mib(p.budget), ctx));
    line("  rule: VRAM = dense + KV state, then whole routed experts round-robin over layers until one does "
         "not fit; the rest in RAM");
    line(fmt::format("  VRAM: dense {:.2f} MiB + KV {:.2f} MiB + {} experts {:.2f} MiB", mib(p.dense), mib(p.kv),
                     p.experts_vram, mib(p.expert_bytes_vram)));
    line(fmt::format("  RAM:  {} experts {:.2f} MiB", p.experts_ram, mib(p.expert_bytes_ram)));
    if (!p.dense_fits) {
      problems.push_back(fmt::format("--gpu-mib {:.0f}: dense weights + KV state ({:.2f} MiB) do not fit",
                                     mib(p.budget), mib(p.dense + p.kv)));
    }
  }
  if (problems.empty()) {
    line("problems: none");
  } else {
    line(fmt::format("problems: {}", problems.size()));
    for (const std::string& p : problems) line("  - " + p);
  }
  return o;
}

}  // namespace aff::dsv4
