#include "backend/cuda/gpu_state.h"

#include "backend/cuda/runtime/step_info.h"

#include <algorithm>
#include <string>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/ref/rope.h"

namespace aff::cuda {
namespace {

Status alloc(DeviceBuffer& b, int64_t elems, size_t elem_size, const char* what) {
  AFF_ASSIGN_OR_RETURN(b, DeviceBuffer::allocate(size_t(std::max<int64_t>(elems, 1)) * elem_size, what));
  return Status::ok();
}

Status alloc_compressor(GpuCompressorState& s, int ratio, int dim, bool overlap, int64_t max_positions) {
  const int64_t width = (overlap ? 2 : 1) * int64_t(dim);
  s.capacity = max_positions / ratio + 1;
  AFF_RETURN_IF_ERROR(alloc(s.ring_kv, 2 * ratio * width, 4, "compressor ring"));
  AFF_RETURN_IF_ERROR(alloc(s.ring_gate, 2 * ratio * width, 4, "compressor ring"));
  AFF_RETURN_IF_ERROR(alloc(s.entries, s.capacity * dim, 4, "compressed entries"));
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<GpuState>> make_gpu_state(const DeviceModel& model, int64_t max_positions,
                                                 int64_t max_chunk) {
  const dsv4::ModelConfig& c = model.config;
  if (max_positions < 1 || max_chunk < 1) return invalid_argument("GPU state: positions and chunk must be >= 1");
  max_chunk = std::min(max_chunk, max_positions);
  auto st = std::make_unique<GpuState>();
  st->max_positions = max_positions;
  st->max_chunk = max_chunk;
  AFF_ASSIGN_OR_RETURN(st->stream, Stream::create());

  int64_t max_idx_entries = 1;
  st->layers.resize(model.layers.size());
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const DeviceAttention& a = model.layers[l].attn;
    GpuLayerState& ls = st->layers[l];
    AFF_RETURN_IF_ERROR(alloc(ls.window, int64_t(c.sliding_window) * c.head_dim, 4, "sliding-window ring"));
    if (a.compressor.present)
      AFF_RETURN_IF_ERROR(alloc_compressor(ls.kv, a.compressor.ratio, a.compressor.dim, a.compressor.overlap,
                                           max_positions));
    if (a.indexer.present) {
      const DeviceCompressor& ic = a.indexer.compressor;
      AFF_RETURN_IF_ERROR(alloc_compressor(ls.idx, ic.ratio, ic.dim, ic.overlap, max_positions));
      max_idx_entries = std::max(max_idx_entries, ls.idx.capacity);
    }
  }

  dsv4::ModelConfig cfg = c;
  const std::vector<float> main = ref::rope_inv_freq(cfg.rope_theta, cfg.rope_dim, nullptr);
  ref::YarnParams yarn;
  yarn.factor = cfg.rope_scaling.factor;
  yarn.original_max_position = cfg.rope_scaling.original_max_position;
  yarn.beta_fast = cfg.rope_scaling.beta_fast;
  yarn.beta_slow = cfg.rope_scaling.beta_slow;
  const std::vector<float> comp =
      ref::rope_inv_freq(cfg.compress_rope_theta, cfg.rope_dim, cfg.rope_scaling.yarn ? &yarn : nullptr);
  AFF_ASSIGN_OR_RETURN(st->rope_main, upload_vector(main, "rope frequencies"));
  AFF_ASSIGN_OR_RETURN(st->rope_compress, upload_vector(comp, "rope frequencies"));
  AFF_RETURN_IF_ERROR(alloc(st->step, 1, sizeof(StepInfo), "step info"));

  const int64_t T = max_chunk, D = c.hidden_size, hc = c.hc_mult, H = c.num_heads, Dh = c.head_dim;
  const int64_t k = std::max(c.n_experts_per_tok, 1);
  Workspace& w = st->ws;
  AFF_RETURN_IF_ERROR(alloc(w.tokens, T, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.h, T * hc * D, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.x, T * D, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.y, T * D, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.z, T * hc * D, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.mix, T * (2 + hc) * hc, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.pre, T * hc, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.post, T * hc, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.comb, T * hc * hc, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.qr, T * c.q_lora_rank, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.q, T * H * Dh, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.o, T * H * Dh, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.kv, T * Dh, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.u, T * int64_t(c.o_groups) * c.o_lora_rank, 4, "workspace"));
  const int64_t comp_width = 2 * std::max<int64_t>(Dh, c.index_head_dim);
  AFF_RETURN_IF_ERROR(alloc(w.comp_kv, T * comp_width, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.comp_gate, T * comp_width, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.iq, T * int64_t(c.index_n_heads) * c.index_head_dim, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.iw, T * int64_t(c.index_n_heads), 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.scores, T * max_idx_entries, 4, "indexer scores"));
  AFF_RETURN_IF_ERROR(alloc(w.sel, T * std::max(c.index_topk, 1), 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.sel_count, T, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.router_logits, T * int64_t(c.n_routed_experts), 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.route_ids, T * k, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.route_w, T * k, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.act, T * k * c.moe_inter, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.y_pairs, T * k * D, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.y_shared, T * D, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.zero_ids, T, 4, "workspace"));
  AFF_RETURN_IF_ERROR(cuda_status(cudaMemset(w.zero_ids.data(), 0, w.zero_ids.bytes()), "cudaMemset"));
  AFF_RETURN_IF_ERROR(alloc(w.logits, T * c.vocab_size, 4, "logits"));
  AFF_RETURN_IF_ERROR(alloc(w.argmax, T, 4, "workspace"));
  return st;
}

void gpu_state_reset(GpuState& state) { state.n_past = 0; }

}  // namespace aff::cuda
