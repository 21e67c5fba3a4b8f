// The official V4 checkpoint layout, derived from a ModelConfig, and binding it
// to tensor views. One walk over the layout (walk_checkpoint_layout) is shared
// by the binder and the synthetic checkpoint writer, so the two cannot drift.
//
// Accepted storage (anything else is an error naming the file and tensor):
//   plain Linear (embed-like heads, router, compressor, weights_proj, DSpark
//     heads): F32 | BF16 | F16 [out, in], no .scale
//   dense Linear (attention, indexer wq_b, shared expert, MTP/DSpark projections):
//     plain as above, or F8_E4M3 [out, in] + .scale F8_E8M0 [ceil(out/B), ceil(in/B)]
//   expert Linear: expert_dtype "fp4" -> I8 [out, in/2] + .scale F8_E8M0 [out, in/32];
//     "fp8" -> FP8 block as above; "" -> plain or FP8 block
//   norm weights and embeddings: BF16 | F32;  mHC params, sinks, ape, gate bias: F32
//   tid2eid: I64 | I32 [vocab, experts_per_tok], every id in [0, n_routed_experts)
#pragma once

#include <cstdint>
#include <string>
#include <optional>
#include <vector>

#include "affinity/status.h"
#include "format/tensor_index.h"
#include "model/dsv4/config.h"
#include "model/dsv4/weights.h"

namespace aff::dsv4 {

enum class LinearKind {
  kPlain,   // never quantised in the official release
  kDense,   // FP8 block-scaled in the release, plain allowed
  kExpert,  // routed expert: storage follows expert_dtype
};

enum class TensorKind {
  kNormWeight,  // BF16 | F32 (norm weights, embedding tables)
  kF32,         // F32 only (mHC fn/base/scale, attn_sink, ape, gate bias)
  kExpertIds,   // tid2eid: I64 | I32, values < n_routed_experts
};

// Receives every tensor of the layout in a fixed order. `name` is the full
// tensor name for tensor(); for linear() it is the stem ("layers.3.attn.wq_b"),
// the stored tensors being stem + ".weight" and (when quantised) stem + ".scale".
// dst points into the ModelWeights being walked. The first non-ok Status stops
// the walk and is returned.
class LayoutVisitor {
 public:
  virtual ~LayoutVisitor() = default;
  virtual Status linear(const std::string& stem, int64_t out, int64_t in, LinearKind kind, Linear* dst) = 0;
  virtual Status tensor(const std::string& name, TensorKind kind, const std::vector<int64_t>& shape,
                        TensorView* dst) = 0;
};

// Walks the layout of `cfg`, sizing `w` (layers, experts, MTP blocks, DSpark
// stages) and filling its non-view fields (compressor ratio/dim/overlap,
// present flags, Linear out/in) before each visit.
Status walk_checkpoint_layout(const ModelConfig& cfg, LayoutVisitor& v, ModelWeights* w);

// Binds every tensor of the layout from `index`, validating presence, dtype
// and shape (and tid2eid contents). The first problem is returned, e.g.
// "<shard>: tensor 'layers.3.attn.wq_b.weight': shape [64, 96] does not match
// the expected [512, 128]" or "<index>: tensor '...' is missing".
Result<ModelWeights> bind_weights(const ModelConfig& cfg, const format::TensorIndex& index);

// tid2eid rows index the expert table directly, so a loader must reject any id
// outside [0, n_experts) rather than let it become an out-of-range read in the
// forward pass. `t` is I64 or I32, [vocab, k] row-major. Returns the flat index
// of the first bad entry and its value, or nothing when every id is in range.
struct BadExpertId {
  int64_t index;
  int64_t id;
};
std::optional<BadExpertId> find_bad_expert_id(const TensorView& t, int64_t n_experts);

// Shape of the E8M0 scale of an FP8 block-quantised [out, in] weight.
inline std::vector<int64_t> fp8_scale_shape(int64_t out, int64_t in, int block) {
  return {(out + block - 1) / block, (in + block - 1) / block};
}

}  // namespace aff::dsv4
