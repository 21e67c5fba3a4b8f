#include "quant/quantizer/tensor_plan.h"

#include <algorithm>
#include <cstdlib>
#include <map>

#include <fmt/format.h>

#include "format/gguf_dsv4_names.h"
#include "model/dsv4/weights_bind.h"

namespace aff::quant {
namespace {

using dsv4::Linear;
using dsv4::WeightFormat;

// Layer index of an HF name "layers.N....", or -1.
int hf_layer(const std::string& name) {
  if (name.rfind("layers.", 0) != 0) return -1;
  return std::atoi(name.c_str() + 7);
}

class Planner : public dsv4::LayoutVisitor {
 public:
  Planner(const dsv4::ModelConfig& cfg, const format::TensorIndex& index, const Recipe& recipe,
          const std::vector<TypeRule>& rules, const PlanOptions& options)
      : cfg_(cfg), index_(index), recipe_(recipe), rules_(rules), options_(options) {}

  Status linear(const std::string& stem, int64_t out, int64_t in, dsv4::LinearKind, Linear*) override {
    const std::string wname = stem + ".weight";
    if (skipped(wname)) return Status::ok();
    AFF_ASSIGN_OR_RETURN(TensorView w, index_.get(wname));
    Linear l;
    l.weight = w;
    l.out = out;
    l.in = in;
    l.block = cfg_.weight_block;
    switch (w.dtype) {
      case DType::kF32: l.format = WeightFormat::kF32; break;
      case DType::kBF16: l.format = WeightFormat::kBF16; break;
      case DType::kF16: l.format = WeightFormat::kF16; break;
      case DType::kF8E4M3: l.format = WeightFormat::kFP8Block; break;
      case DType::kI8: l.format = WeightFormat::kMXFP4; break;
      default:
        return unsupported(fmt::format("{}: tensor '{}': dtype {} is not a weight format", w.file, wname,
                                       dtype_name(w.dtype)));
    }
    if (l.format == WeightFormat::kFP8Block || l.format == WeightFormat::kMXFP4) {
      AFF_ASSIGN_OR_RETURN(l.scale, index_.get(stem + ".scale"));
    }
    return add(wname, {out, in}, l, {});
  }

  Status tensor(const std::string& name, dsv4::TensorKind kind, const std::vector<int64_t>& shape,
                TensorView*) override {
    if (skipped(name)) return Status::ok();
    AFF_ASSIGN_OR_RETURN(TensorView v, index_.get(name));
    if (kind == dsv4::TensorKind::kExpertIds) return add(name, shape, {}, v);
    Linear l;
    l.weight = v;
    l.format = v.dtype == DType::kBF16 ? WeightFormat::kBF16 : v.dtype == DType::kF16 ? WeightFormat::kF16
                                                                                     : WeightFormat::kF32;
    l.in = shape.empty() ? 1 : shape.back();
    l.out = l.in == 0 ? 0 : v.numel() / l.in;
    return add(name, shape, l, {});
  }

  std::vector<PlannedTensor> take() { return std::move(out_); }

 private:
  bool skipped(const std::string& hf) const {
    return options_.max_layers > 0 && hf_layer(hf) >= options_.max_layers;
  }

  Status add(const std::string& hf, const std::vector<int64_t>& shape, const Linear& l, const TensorView& ids) {
    const auto g = format::dsv4_gguf_name(hf);
    if (!g) {
      return unsupported(fmt::format("tensor '{}' has no deepseek4 GGUF name; this checkpoint cannot be written "
                                     "as a deepseek4 container",
                                     hf));
    }
    if (g->kind == format::Dsv4GgufName::Kind::kExpertSlice) {
      auto it = stacks_.find(g->gguf);
      if (it == stacks_.end()) {
        PlannedTensor t = make(g->gguf, hf, shape);
        t.ne.push_back(cfg_.n_routed_experts);
        t.mats.resize(size_t(cfg_.n_routed_experts));
        out_.push_back(std::move(t));
        it = stacks_.emplace(g->gguf, out_.size() - 1).first;
      }
      PlannedTensor& t = out_[it->second];
      if (g->expert < 0 || g->expert >= cfg_.n_routed_experts) {
        return internal_error(fmt::format("expert index {} of '{}' out of range", g->expert, hf));
      }
      t.mats[size_t(g->expert)] = l;
      return Status::ok();
    }
    PlannedTensor t = make(g->gguf, hf, shape);
    if (t.role == TensorRole::kExpertIds) {
      t.ids = ids;
    } else {
      t.mats = {l};
    }
    out_.push_back(std::move(t));
    return Status::ok();
  }

  PlannedTensor make(const std::string& gguf, const std::string& hf, const std::vector<int64_t>& shape) {
    PlannedTensor t;
    t.name = gguf;
    t.hf_name = hf;
    t.role = tensor_role(gguf);
    t.ne.assign(shape.rbegin(), shape.rend());
    if (t.ne.empty()) t.ne = {1};
    t.rows = 1;
    for (size_t i = 1; i < t.ne.size(); ++i) t.rows *= t.ne[i];
    t.type = choose_type(recipe_, rules_, gguf, t.ne[0]);
    t.row_bytes = *ggml_row_bytes(t.type.type, t.ne[0]);
    return t;
  }

  const dsv4::ModelConfig& cfg_;
  const format::TensorIndex& index_;
  const Recipe& recipe_;
  const std::vector<TypeRule>& rules_;
  const PlanOptions& options_;
  std::vector<PlannedTensor> out_;
  std::map<std::string, size_t> stacks_;
};

}  // namespace

Result<std::vector<PlannedTensor>> plan_tensors(const dsv4::ModelConfig& cfg, const format::TensorIndex& index,
                                                const Recipe& recipe, const std::vector<TypeRule>& rules,
                                                const PlanOptions& options) {
  if (options.max_layers < 0 || options.max_layers > cfg.num_layers) {
    return invalid_argument(fmt::format("--layers {}: the checkpoint has {} layers", options.max_layers,
                                        cfg.num_layers));
  }
  Planner planner(cfg, index, recipe, rules, options);
  dsv4::ModelWeights scratch;
  AFF_RETURN_IF_ERROR(dsv4::walk_checkpoint_layout(cfg, planner, &scratch));
  auto plan = planner.take();
  for (const auto& t : plan) {
    for (const auto& m : t.mats) {
      if (!m.valid()) return corrupt(fmt::format("{}: stacked tensor '{}' is missing an expert", index.source(), t.name));
    }
  }
  return plan;
}

dsv4::ModelConfig truncate_layers(const dsv4::ModelConfig& cfg, int max_layers) {
  if (max_layers <= 0 || max_layers >= cfg.num_layers) return cfg;
  dsv4::ModelConfig c = cfg;
  c.compress_ratios.erase(c.compress_ratios.begin() + max_layers, c.compress_ratios.begin() + cfg.num_layers);
  c.num_layers = max_layers;
  c.num_hash_layers = std::min(c.num_hash_layers, max_layers);
  return c;
}

}  // namespace aff::quant
