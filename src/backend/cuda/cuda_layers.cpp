#include "backend/cuda/cuda_layers.h"

#include <cmath>
#include <cstdlib>
#include <optional>
#include <span>

#include "backend/cuda/kernels/attention/attention.h"
#include "backend/cuda/kernels/compressor/compressor.h"
#include "backend/cuda/kernels/gemm/gemm.h"
#include "backend/cuda/kernels/gemm/moe_grouped.h"
#include "backend/cuda/kernels/gemv/gemv.h"
#include "backend/cuda/kernels/indexer/indexer.h"
#include "backend/cuda/kernels/mhc/mhc.h"
#include "backend/cuda/kernels/misc/misc.h"
#include "backend/cuda/kernels/moe/moe.h"
#include "backend/cuda/kernels/moe/site_router.h"
#include "backend/cuda/kernels/norm/norm.h"
#include "backend/cuda/kernels/rope/rope.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/device_info.h"
#include "backend/cuda/runtime/env_switch.h"
#include "backend/cuda/runtime/profile.h"
#include "backend/cuda/runtime/step_info.h"

namespace aff::cuda {
namespace {

// The decode path's forms that can be turned off for comparisons, each by
// AFF_CUDA_<NAME>=0, and its tuning knobs, read once
// (docs/kernels/cuda-backend.md lists them).
struct Switches {
  bool side_stream = env_switch_on("AFF_CUDA_SIDE_STREAM");  // side-stream branches
  bool l2_ahead = env_switch_on("AFF_CUDA_L2_AHEAD");        // the query weights' L2 prefetch
  bool pool_store = env_switch_on("AFF_CUDA_POOL_STORE");    // a compressor's ring stores inside its pool launch
  bool stack_iq = env_switch_on("AFF_CUDA_STACK_IQ");        // the indexer's queries in wq_b's launch
  bool comb_job = env_switch_on("AFF_CUDA_COMB_JOB");        // an mHC site's Sinkhorn in the next launch
  bool comp_defer = env_switch_on("AFF_CUDA_COMP_DEFER");    // compressor projections once per 4 tokens
  bool site_xring = env_switch_on("AFF_CUDA_SITE_XRING");    // the mHC site writes those compressors' x
  bool attn_qfinish = env_switch_on("AFF_CUDA_ATTN_QFINISH");  // the attention finishes its queries (norm, RoPE)
  bool shared_beside = env_switch_on("AFF_CUDA_SHARED_BESIDE");  // the shared expert on the side stream
  bool topk_grid = env_switch_on("AFF_CUDA_TOPK_GRID");  // a decode step's indexer top-k over many blocks
  bool short_decode = env_switch_on("AFF_CUDA_SHORT_DECODE");  // a graph sized for short contexts
  bool attn_bound = env_switch_on("AFF_CUDA_ATTN_BOUND");      // in it, attention splits by the entries seen
  // Opt-in (=1): the decode MoE in one launch (moe_fused). Correct but slower
  // than the split form today (docs/BENCHMARKS.md); the base for a persistent MoE.
  bool moe_fused = env_opt_in("AFF_CUDA_MOE_FUSED");
  bool iw_own = env_switch_on("AFF_CUDA_IW_OWN");  // the indexer's head weights on a stream of their own
  // Opt-in: the MoE site with the router's gate beside it (site_router), 1
  // in one launch (correct, but measured slower than the site and router
  // launches, docs/BENCHMARKS.md), 2 as two launches on two streams (the
  // shared expert then forks after the site's alone; not yet measured).
  // 3: as 2, with the gate's four stream columns (site_router_streams) in a
  // launch of their own right after the first site, beside the attention.
  int site_router = env_int("AFF_CUDA_SITE_ROUTER", 0, 0, 3);
  // Opt-in (=1): a CSA layer's indexer queries in a launch of their own
  // before wq_b, so the scores and top-k run beside wq_b instead of after it.
  bool iq_first = env_opt_in("AFF_CUDA_IQ_FIRST");
  bool qfinish_csa = env_opt_in("AFF_CUDA_ATTN_QFINISH_CSA");
  // With iq_first: wq_b's grid cap (0: as planned) and whether it is a
  // programmatic dependent of the queries' launch (its blocks then hold SMs
  // the selection's launches wait for).
  int wqb_blocks = env_int("AFF_CUDA_WQB_BLOCKS", 0, 0, 4096);
  bool wqb_pdl = env_switch_on("AFF_CUDA_WQB_PDL");
  bool site_iw = env_switch_on("AFF_CUDA_SITE_IW");  // the mHC site computes the indexer's head weights
  // Tuning knobs, percent of the SMs: the side-stream shared expert's share
  // while the router runs beside it, and the routed up launch's in that
  // split. The routed jobs are dealt to blocks evenly and ahead, so a block
  // that waits for an SM the shared expert holds finishes late: at the
  // defaults the two halves run side by side (docs/BENCHMARKS.md: 6.29 vs
  // 6.39 ms/token with all SMs for the routed launch).
  int shared_sms = env_int("AFF_CUDA_SHARED_SMS", 50, 1, 100);
  int routed_sms = env_int("AFF_CUDA_ROUTED_SMS", 50, 1, 100);
  // Opt-in: the decode MoE's launch order. 0: the shared expert (up, then
  // down) on the side stream beside the router and the routed up, each half
  // the SMs. 1: only the shared up beside the router, joined before the
  // routed up, which then has every SM; the down launch reads the routed
  // pairs and the shared expert. 2: as 1, all on the main stream (shared up,
  // router, routed up, down). Both measured slower (docs/BENCHMARKS.md).
  int moe_order = env_int("AFF_CUDA_MOE_ORDER", 0, 0, 2);
  // The side stream's FP8 shared expert takes its down projection as a
  // tensor-core GEMV (gemv_mma_side) after the streaming up launch, instead
  // of the streaming down kernel's FP8 tiles, which ran ~3 us longer and made
  // the routed down wait for the join (docs/BENCHMARKS.md).
  bool shared_down_gemv = env_switch_on("AFF_CUDA_SHARED_DOWN_GEMV");
  // Opt-in (=1): an FP8 shared expert the streaming kernels read takes the
  // tensor-core GEMVs instead (gemv_mma_pair gate + up, gemv_mma_swiglu down),
  // as a split Q8_0 one does; with AFF_CUDA_MOE_ORDER=1 the up pair runs
  // beside the router and the down beside the routed up.
  bool shared_gemv = env_opt_in("AFF_CUDA_SHARED_GEMV");
  // Most blocks of a compressor's step-gated projection launch (0: as the
  // GEMV plans it, 128 for a CSA layer's): beside wq_a and wq_b in a step that
  // completes a unit, fewer, wider blocks leave them more SMs (docs/BENCHMARKS.md:
  // 5.601 vs 5.623 ms/token at 4K; 16 and 64 within 0.003 of 32).
  int comp_blocks = env_int("AFF_CUDA_COMP_BLOCKS", 32, 0, 1024);
};

const Switches& switches() {
  static const Switches s;
  return s;
}

// Whether a chain of decode-sized work may run on the side stream
// (GpuState::side): not for prefill (its GEMMs' scratch and shared input are
// per stream) nor while profiling (the stage marks are on the main stream).
bool beside(bool decode_sized) { return decode_sized && !profiling_enabled() && switches().side_stream; }

float eps_of(const DeviceModel& m) { return float(m.config.rms_norm_eps); }

// RoPE over the trailing rope_dim dims of rows of length `len`, for the
// chunk's tokens: row r at position step.pos0 + r / rows_per_pos.
RopeArgs rope_rows(float* x, int64_t rows, int64_t len, const GpuState& st, bool compressed, int rope_dim,
                   int rows_per_pos, bool inverse) {
  RopeArgs r;
  r.x = x;
  r.rows = rows;
  r.stride = len;
  r.offset = len - rope_dim;
  r.inv_freq = compressed ? st.rope_compress.as<float>() : st.rope_main.as<float>();
  r.half = rope_dim / 2;
  r.rows_per_pos = rows_per_pos;
  r.step = st.step.as<StepInfo>();
  r.inverse = inverse;
  return r;
}

// x: [T, D] (rows ldx apart) through a compressor's two projections into kv,
// gate: [T, width]. only_at: run only in a decode step whose position + 1 is
// a multiple of `every` (the tensor-core pair leaves at once otherwise; other
// paths compute rows nobody reads).
Status compressor_project(const DeviceCompressor& c, const float* x, int64_t ldx, int64_t T, float* kv, float* gate,
                          int64_t width, cudaStream_t s, const StepInfo* only_at = nullptr, int every = 0) {
  // Decode: both projections of x in one launch (each is a few microseconds
  // of latency, and the chain they start is on the step's critical path).
  if (!linear_uses_gemm(c.wkv, T) && !linear_uses_gemm(c.wgate, T) && gemv_mma_pair_supports(c.wkv, c.wgate)) {
    PairOptions o;
    if (only_at != nullptr) o.step = only_at, o.complete_ratio = every, o.max_blocks = switches().comp_blocks;
    return gemv_mma_pair(c.wkv, c.wgate, x, ldx, T, kv, width, gate, width, s, o);
  }
  AFF_RETURN_IF_ERROR(linear_rows(c.wkv, 0, c.wkv.out, x, ldx, T, kv, width, s));
  return linear_rows(c.wgate, 0, c.wgate.out, x, ldx, T, gate, width, s);
}

// Whether compressor c keeps its input x in cs.ring_x (the ring allocated for
// its deferral unit, deferral on), and whether a step of T tokens then leaves
// its projections to the step that completes a unit (decode steps, whose
// ring stores ride in the pool launch).
bool keeps_x_ring(const DeviceCompressor& c, const GpuCompressorState& cs) {
  return cs.ring_x.bytes() > 0 && compressor_defer_rows(c.ratio) > 0 && switches().comp_defer;
}
bool defers_projections(const DeviceCompressor& c, const GpuCompressorState& cs, int64_t T) {
  return keeps_x_ring(c, cs) && T == 1 && switches().pool_store;
}

// Feeds x: [T, D] (the chunk, at StepInfo's positions) to a compressor and
// finishes (norm, RoPE) every entry the chunk completes, on stream s. kv,
// gate: [max(T, ratio), width] scratch for its two projections. Nothing here
// depends on the position on the host for T == 1, so a captured decode step
// stays valid.
//
// A compressor defers a decode step's projections to the step that
// completes a unit of u = compressor_defer_rows(ratio) positions (they are
// read only when an entry is pooled): each step keeps its x in cs.ring_x,
// and the completing step projects the unit's rows in one launch (the same
// per-token sums) and stores them into the projection rings. A CSA layer
// then reads its compressors' BF16 weights (21 MB at V4 size) once per 4
// tokens instead of every token, an HCA layer its 8 MB likewise. A longer
// chunk that starts inside a unit first projects the unit's earlier rows from
// the x ring into the projection rings, as the steps before it may have left
// them there only.
// x_stored: this step's x is already in cs.ring_x (the mHC site wrote it).
Status compressor_run(const DeviceModel& m, const DeviceCompressor& c, GpuCompressorState& cs, GpuState& st,
                      const float* x, int64_t T, int64_t pos0, float* kv, float* gate, cudaStream_t s,
                      bool x_stored = false) {
  const int r = c.ratio, d = c.dim;
  const int64_t width = (c.overlap ? 2 : 1) * int64_t(d), D = c.wkv.in;
  if ((pos0 + T) / r > cs.capacity) return internal_error("compressor: entry capacity exceeded");
  const bool x_ring = keeps_x_ring(c, cs);
  const int u = compressor_defer_rows(r);  // the x ring's rows
  const StepInfo* step = st.step.as<StepInfo>();
  CompressorPoolArgs p;
  p.kv = kv, p.gate = gate, p.ape = c.ape;
  p.ring_kv = cs.ring_kv.as<float>(), p.ring_gate = cs.ring_gate.as<float>();
  p.step = step, p.T = T, p.ratio = r, p.dim = d, p.overlap = c.overlap;
  p.norm = c.norm, p.eps = eps_of(m);
  p.inv_freq = st.rope_compress.as<float>(), p.rope_dim = m.config.rope_dim;
  p.entries = cs.entries.as<float>();
  RingStoreArgs xs;  // x rows into the x ring
  xs.src = x, xs.ring = cs.ring_x.as<float>(), xs.capacity = u, xs.step = step, xs.T = T, xs.width = D;
  if (defers_projections(c, cs, T)) {
    if (!x_stored) AFF_RETURN_IF_ERROR(ring_store(xs, s));  // else the mHC site before wrote it
    AFF_RETURN_IF_ERROR(compressor_project(c, cs.ring_x.as<float>(), D, u, kv, gate, width, s, step, u));
    p.deferred = true, p.store_ring = true;
    return compressor_pool(p, s);
  }
  // kv and gate's first `rows` rows into the projection rings, row t at
  // position StepInfo's pos0 + pos_offset + t (the gate with its ape).
  auto store_projections = [&](int64_t rows, int64_t pos_offset) -> Status {
    RingStoreArgs e;
    e.ring = cs.ring_kv.as<float>(), e.capacity = 2 * r, e.step = step, e.width = width;
    e.T = rows, e.pos_offset = pos_offset, e.src = kv;
    AFF_RETURN_IF_ERROR(ring_store(e, s));
    e.ring = cs.ring_gate.as<float>(), e.src = gate, e.add = c.ape, e.period = r;
    return ring_store(e, s);
  };
  if (x_ring && pos0 % u != 0) {  // the unit's earlier rows, from the x ring into the projection rings
    const int64_t k = pos0 % u;
    AFF_RETURN_IF_ERROR(compressor_project(c, cs.ring_x.as<float>(), D, k, kv, gate, width, s));
    AFF_RETURN_IF_ERROR(store_projections(k, -k));
  }
  AFF_RETURN_IF_ERROR(compressor_project(c, x, D, T, kv, gate, width, s));
  p.store_ring = T == 1 && switches().pool_store;
  AFF_RETURN_IF_ERROR(compressor_pool(p, s));
  if (x_ring) AFF_RETURN_IF_ERROR(ring_store(xs, s));
  if (p.store_ring) return Status::ok();
  return store_projections(T, 0);
}

// Where the indexer's three independent parts run: its compressor and then
// the selection on `sel`, the head weights on `w`, the queries on `q` (which
// reads qr only after `qr_from`'s work so far). Any of them may be the same
// stream; the selection waits for the other two.
struct IndexerStreams {
  cudaStream_t sel, w, q, qr_from;
};

// The indexer's inputs: its compressor's entries (on ss.sel), unless the mHC
// site computed them (iw_given: HcSiteFeeds) the head weights into ws.iw (on
// ss.w, then joined to ss.sel) and, unless the query path computes them
// (iq_given: wq_b's launch), the queries into ws.iq with RoPE (on ss.q,
// joined to ss.sel). q_norm: null when qr is already normalised, else its
// rmsnorm weight (folded into wq_b). x_stored: the mHC site wrote x into the
// indexer compressor's x ring.
Status indexer_inputs(const DeviceModel& m, const DeviceIndexer& ix, GpuLayerState& ls, GpuState& st,
                      const float* x, const float* qr, const float* q_norm, int64_t T, int64_t pos0,
                      const IndexerStreams& ss, bool iq_given, bool iw_given, bool x_stored) {
  const dsv4::ModelConfig& c = m.config;
  const cudaStream_t s = ss.sel;
  if (!ablated("icomp"))
    AFF_RETURN_IF_ERROR(compressor_run(m, ix.compressor, ls.idx, st, x, T, pos0, st.ws.icomp_kv.as<float>(),
                                       st.ws.icomp_gate.as<float>(), s, x_stored));
  const int nh = c.index_n_heads, hd = c.index_head_dim;
  if (!iw_given) {
    if (!ablated("iw")) AFF_RETURN_IF_ERROR(linear(ix.weights_proj, x, T, st.ws.iw.as<float>(), ss.w));
    if (ss.w != s) AFF_RETURN_IF_ERROR(stream_after(s, ss.w, st.iw_ready));
  }
  if (iq_given) return Status::ok();
  if (ss.qr_from != ss.q) AFF_RETURN_IF_ERROR(stream_after(ss.q, ss.qr_from, st.qr_ready));
  if (!ablated("iq")) {
    if (q_norm != nullptr) {
      AFF_RETURN_IF_ERROR(gemv_mma_normed(ix.wq_b, qr, T, st.ws.iq.as<float>(), q_norm, eps_of(m), ss.q));
    } else {
      AFF_RETURN_IF_ERROR(linear(ix.wq_b, qr, T, st.ws.iq.as<float>(), ss.q));
    }
    AFF_RETURN_IF_ERROR(rope_f32(rope_rows(st.ws.iq.as<float>(), T * nh, hd, st, true, c.rope_dim, nh, false), ss.q));
  }
  if (ss.q != s) AFF_RETURN_IF_ERROR(stream_after(s, ss.q, st.iq_ready));
  return Status::ok();
}

// The most compressed entries (of a layer compressing by ratio, capacity
// rows) visible to any step a launch serves: a one-token step of the short
// decode shape (gpu_decode_shape) sees at most what its last position sees,
// anything else up to the capacity.
int64_t entry_bound(int64_t pos0, int64_t T, int ratio, int64_t capacity) {
  if (T != 1 || ratio <= 0 || gpu_decode_shape(pos0) != 0) return capacity;
  return visible_entries(kShortDecodePositions - 1, ratio, capacity);
}

// The indexer's choice on stream s, once its inputs are ready there: every
// visible entry's score, then the top-k into ws.sel / ws.sel_count.
// rope_q: ws.iq is still without its RoPE, which the scores launch applies.
// pos0: the chunk's first position (a one-token step's top-k form depends on
// it: entry_bound). feeds: where the mHC site left the head weights' partial
// sums (HcSiteFeeds::iw_parts), else they are in ws.iw.
Status indexer_choose(const DeviceModel& m, const DeviceIndexer& ix, GpuLayerState& ls, GpuState& st, int64_t T,
                      int64_t pos0, cudaStream_t s, const HcSiteFeeds& feeds, bool rope_q = false) {
  const dsv4::ModelConfig& c = m.config;
  const int nh = c.index_n_heads, hd = c.index_head_dim;
  IndexerScoreArgs a;
  a.step = st.step.as<StepInfo>();
  a.q = st.ws.iq.as<float>(), a.w = st.ws.iw.as<float>(), a.keys = ls.idx.entries.as<float>();
  if (feeds.iw_parts != nullptr)
    a.w = nullptr, a.w_parts = feeds.iw_parts, a.w_nparts = hc_decode_blocks(c.hidden_size);
  a.w_scale = 1.0f / std::sqrt(float(hd)) / std::sqrt(float(nh));
  a.T = T, a.capacity = ls.idx.capacity, a.nh = nh, a.hd = hd, a.ratio = ix.compressor.ratio;
  a.precision = mma_precision(), a.scores = st.ws.scores.as<float>();
  if (rope_q) a.rope_freq = st.rope_compress.as<float>(), a.rope_dim = c.rope_dim;
  if (ablated("isel")) return Status::ok();
  AFF_RETURN_IF_ERROR(indexer_scores(a, s));
  TopkArgs k;
  k.step = a.step, k.scores = a.scores, k.ld = ls.idx.capacity, k.T = T;
  k.ratio = ix.compressor.ratio, k.k = c.index_topk;
  k.sel = st.ws.sel.as<int32_t>(), k.count = st.ws.sel_count.as<int32_t>();
  if (switches().topk_grid) k.scratch = st.ws.topk_scratch.as<uint32_t>(), k.bound = entry_bound(pos0, T, k.ratio, k.ld);
  return indexer_topk(k, s);
}

// Experts of one table for a batch of pairs: prefill-sized batches go to the
// grouped tensor-core path (each expert read once per chunk) when every expert
// in the table has a bf16 decoder at the current precision; the rest to the
// per-pair GEMV. host_slots: the table's contents on the host (empty: fetch
// them, one small synchronous copy, prefill only).
Status run_experts(const ExpertFfnArgs& e, std::span<const ExpertSlot> host_slots, cudaStream_t s,
                   bool ids_all_zero = false) {
  const int64_t T = e.n_pairs / (e.pairs_per_token > 0 ? e.pairs_per_token : 1);
  if (T < kGroupedMoeMinTokens) return expert_ffn(e, s);
  ExpertSlot fetched;
  if (host_slots.empty()) {
    AFF_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(&fetched, e.slots, sizeof fetched, cudaMemcpyDeviceToHost, s),
                                    "moe: slot table to host"));
    AFF_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(s), "moe: slot table to host"));
    host_slots = std::span<const ExpertSlot>(&fetched, 1);
  }
  if (!moe_grouped_supports(host_slots, mma_precision())) return expert_ffn(e, s);
  GroupedMoeArgs g;
  g.slots = host_slots, g.ids = e.ids, g.n_pairs = e.n_pairs, g.pairs_per_token = e.pairs_per_token;
  g.x = e.x, g.D = e.D, g.inter = e.inter, g.swiglu_limit = e.swiglu_limit, g.y = e.y;
  g.ids_all_zero = ids_all_zero;
  return moe_grouped_ffn(g, mma_precision(), s);
}

}  // namespace

// The op checker's twins of model/dsv4/mhc run the forward pass's own fused
// kernel: without `a` it does not write h, so the const_casts are safe.
Status gpu_hc_pre(const DeviceModel& m, const DeviceHc& w, GpuState& st, const float* h, int64_t T, float* x) {
  return gpu_hc_site(m, w, st, const_cast<float*>(h), nullptr, 0, T, false, nullptr, x);
}

Status gpu_hc_post(const DeviceModel& m, GpuState& st, const float* a, int64_t T, float* h) {
  return hc_expand(h, a, st.ws.post.as<float>(), st.ws.comb.as<float>(), T, m.config.hc_mult,
                   m.config.hidden_size, st.stream.get());
}

Status gpu_hc_head(const DeviceModel& m, GpuState& st, const float* h, int64_t T, float* y) {
  return gpu_hc_site(m, m.hc_head, st, const_cast<float*>(h), nullptr, 0, T, true, nullptr, y);
}

int gpu_decode_shape(int64_t pos) { return switches().short_decode && pos < kShortDecodePositions ? 0 : 1; }

Status gpu_begin_chunk(GpuState& st, int64_t pos0, int64_t T) {
  AFF_RETURN_IF_ERROR(gpu_state_reserve(st, pos0 + T));
  // Pageable source: the copy is staged before the call returns, so a local is safe.
  const StepInfo step{pos0, T};
  AFF_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(st.step.data(), &step, sizeof step, cudaMemcpyHostToDevice, st.stream.get()));
  return Status::ok();
}

// Why only there: the mHC site before the query path is pure latency, and the
// query path's first three projections (38 MB at V4 size) then read L2.
// Prefetching wo_a / wo_b during attention, the shared expert during the
// second mHC site, or the next layer's query weights during the MoE measured
// no gain or a loss (docs/BENCHMARKS.md).
Status gpu_prefetch_query_weights(const DeviceModel& m, int l, GpuState& st, int64_t T) {
  const DeviceAttention& w = m.layers[size_t(l)].attn;
  if (!beside(!linear_uses_gemm(w.wq_a, T)) || !switches().l2_ahead) return Status::ok();
  L2Ranges r;
  for (const DeviceLinear* p : {&w.wq_a, &w.wkv, &w.wq_b}) r.add(p->weight, stored_bytes(*p));
  AFF_RETURN_IF_ERROR(stream_after(st.ahead.get(), st.stream.get(), st.ahead_fork));
  AFF_RETURN_IF_ERROR(l2_prefetch_ranges(r, st.ahead.get()));
  st.ahead_pending = true;
  return Status::ok();
}

Status gpu_prefetch_join(GpuState& st) {
  if (!st.ahead_pending) return Status::ok();
  st.ahead_pending = false;
  return stream_after(st.stream.get(), st.ahead.get(), st.ahead_join);
}

namespace {

// The fused site's arguments (gpu_hc_site), before any decode-only option.
Result<HcFusedArgs> hc_site_args(const DeviceModel& m, const DeviceHc& w, GpuState& st, float* h, const float* a,
                                 int64_t first, int64_t T, bool head, const float* norm_weight, float* x) {
  const dsv4::ModelConfig& c = m.config;
  const int hc = c.hc_mult;
  const int64_t D = c.hidden_size;
  if (T > st.max_chunk) return internal_error("mHC: chunk larger than the workspace");
  HcFusedArgs f;
  f.h = h + first * hc * D;
  f.a = a ? a + first * D : nullptr;
  f.fn = w.fn.weight;
  switch (w.fn.format) {
    case DevFormat::kF32: f.fn_dtype = 0; break;
    case DevFormat::kBF16: f.fn_dtype = 1; break;
    case DevFormat::kF16: f.fn_dtype = 2; break;
    default: return unsupported("mHC: the mixes matrix must be f32, bf16 or f16");
  }
  f.base = w.base, f.scale = w.scale, f.T = T, f.hc = hc, f.D = D, f.head = head;
  f.sinkhorn_iters = ablated("sinkhorn") ? 1 : c.hc_sinkhorn_iters, f.hc_eps = float(c.hc_eps), f.norm_eps = eps_of(m);
  f.post = st.ws.post.as<float>() + first * hc;
  f.comb = st.ws.comb.as<float>() + first * hc * hc;
  f.pre = st.ws.pre.as<float>() + first * hc;
  f.x_norm = norm_weight, f.x = x;
  f.partials = st.ws.hc_partials.as<float>();
  f.tickets = st.ws.hc_tickets.as<unsigned>();
  f.step = st.step.as<StepInfo>();
  return f;
}

// A decode site leaves its comb's Sinkhorn to a job (HcFusedArgs::defer_comb).
void defer_comb(HcFusedArgs& f, HcCombJob* defer, float* copy) {
  if (defer == nullptr || f.head || f.T > kHcSmallT || f.hc != 4 || !switches().comb_job) return;
  f.defer_comb = true;
  *defer = HcCombJob{f.comb, f.T, f.hc, f.sinkhorn_iters, f.hc_eps, copy};
}

}  // namespace

Status gpu_hc_site(const DeviceModel& m, const DeviceHc& w, GpuState& st, float* h, const float* a, int64_t first,
                   int64_t T, bool head, const float* norm_weight, float* x, HcCombJob* defer,
                   const HcSiteFeeds& feeds, const HcCopies& copies) {
  if (defer != nullptr) *defer = HcCombJob{};
  AFF_ASSIGN_OR_RETURN(HcFusedArgs f, hc_site_args(m, w, st, h, a, first, T, head, norm_weight, x));
  f.x_ring[0] = feeds.ring[0], f.x_ring[1] = feeds.ring[1], f.x_ring_rows = feeds.rows;
  if (feeds.iw_parts != nullptr) {
    if (first != 0 || head)
      return internal_error("mHC: the indexer's head weights need the decode site of the whole chunk");
    f.iw_weight = feeds.iw_weight, f.iw_heads = feeds.iw_heads, f.iw_parts = feeds.iw_parts;
  }
  if (copies.post != nullptr) {
    if (T > kSiteRouterMaxT || f.hc != 4 || head || first != 0)
      return internal_error("mHC: only a decode site keeps copies");
    f.h_copy = copies.h, f.post_copy = copies.post, f.comb_copy = copies.comb;
  }
  if (ablated("mhc")) return Status::ok();
  defer_comb(f, defer, copies.comb);
  return hc_fused(f, st.stream.get());
}

HcSiteFeeds gpu_attention_site_feeds(const DeviceModel& m, int l, GpuState& st, int64_t T) {
  HcSiteFeeds r;
  if (m.config.hc_mult != 4 || m.config.compress_ratio(l) == 0) return r;
  const DeviceAttention& w = m.layers[size_t(l)].attn;
  GpuLayerState& ls = st.layers[size_t(l)];
  if (switches().site_xring) {
    int n = 0;
    auto add = [&](const DeviceCompressor& c, GpuCompressorState& cs) {
      if (!c.present || !defers_projections(c, cs, T)) return;
      const int u = compressor_defer_rows(c.ratio);
      if (r.rows != 0 && r.rows != u) return;  // one row count per site
      r.rows = u, r.ring[n++] = cs.ring_x.as<float>();
    };
    add(w.compressor, ls.kv);
    if (w.indexer.present) add(w.indexer.compressor, ls.idx);
  }
  const DeviceLinear& wp = w.indexer.weights_proj;
  const int64_t D = m.config.hidden_size;
  if (switches().site_iw && w.indexer.present && T <= kHcSmallT && wp.format == DevFormat::kBF16 && wp.in == D &&
      hc_site_iw_supported(D, int(wp.out)) && st.ws.iw_parts.bytes() >= size_t(T * hc_decode_blocks(D) * wp.out) * 4)
    r.iw_weight = wp.weight, r.iw_heads = int(wp.out), r.iw_parts = st.ws.iw_parts.as<float>();
  return r;
}

Status gpu_attention(const DeviceModel& m, int l, GpuState& st, const float* x, int64_t T, int64_t pos0,
                     float* out, const HcCombJob& job, const HcSiteFeeds& feeds) {
  const dsv4::ModelConfig& c = m.config;
  const DeviceAttention& w = m.layers[size_t(l)].attn;
  GpuLayerState& ls = st.layers[size_t(l)];
  Workspace& ws = st.ws;
  cudaStream_t s = st.stream.get();
  const int H = c.num_heads, Dh = c.head_dim, rd = c.rope_dim;
  const float eps = eps_of(m);
  const bool compressed = c.compress_ratio(l) != 0;
  if (T > st.max_chunk) return internal_error("attention: chunk larger than the workspace");

  // Query path: q = per-head rmsnorm(wq_b(q_norm(wq_a x))), RoPE on the tail.
  float* qr = ws.qr.as<float>();
  float* q = ws.q.as<float>();
  float* kv = ws.kv.as<float>();
  // x feeds wq_a, wkv and the compressors' and indexer's projections: the
  // prefill GEMMs round it to bf16 once (never set up for decode sizes, whose
  // step is captured: the GEMM context is created outside capture).
  std::optional<GemmSharedInput> shared_x;
  if (linear_uses_gemm(w.wq_a, T)) shared_x.emplace(x, c.hidden_size, T, c.hidden_size, s);
  // wq_a and wkv both read x: at decode sizes one launch serves both (a
  // launch's fixed cost is most of a small projection's time).
  const bool paired = !linear_uses_gemm(w.wq_a, T) && !linear_uses_gemm(w.wkv, T) && gemv_mma_takes_all(w.wq_a) &&
                      gemv_mma_takes_all(w.wkv) && gemv_mma_pair_supports(w.wq_a, w.wkv);
  if (compressed && !w.compressor.present) return internal_error("attention: compressed layer without a compressor");
  // Decode sizes: short chains run on the side stream (the compressors and the
  // indexer beside the query path, the ring store beside the output projections).
  const bool side_ok = beside(!linear_uses_gemm(w.wq_a, T));
  const bool fork = compressed && side_ok;
  const bool fork_indexer = fork && w.indexer.present;
  cudaStream_t side = fork ? st.side.get() : s;
  // The indexer's head weights read only x: on side3 (which its queries use
  // only after them) they do not queue behind the KV compressor on `side`,
  // which in a step completing an entry projects 4 rows through 16 MB of
  // BF16 weights first (AFF_CUDA_IW_OWN=0: on `side`).
  const bool iw_own = fork_indexer && switches().iw_own && feeds.iw_parts == nullptr;
  const IndexerStreams iss{fork_indexer ? st.side2.get() : s, iw_own ? st.side3.get() : side,
                           fork_indexer ? st.side3.get() : s, s};
  if (fork) AFF_RETURN_IF_ERROR(stream_after(side, s, st.fork));
  if (fork_indexer) AFF_RETURN_IF_ERROR(stream_after(iss.sel, s, st.fork));
  if (iw_own) AFF_RETURN_IF_ERROR(stream_after(iss.w, s, st.fork));
  // The previous mHC site's deferred comb: beside wq_a + wkv, or first on its own.
  if (ablated("wq_a") || !paired) AFF_RETURN_IF_ERROR(hc_comb_run(job, s));
  if (ablated("wq_a")) {
    // what-if timing: no query projections
  } else if (paired) {
    PairOptions o;
    o.job = job;
    AFF_RETURN_IF_ERROR(gemv_mma_pair(w.wq_a, w.wkv, x, w.wq_a.in, T, qr, w.wq_a.out, kv, w.wkv.out, s, o));
    prof_mark(s, "attn.wq_a+wkv");
  } else {
    AFF_RETURN_IF_ERROR(linear(w.wq_a, x, T, qr, s));
    prof_mark(s, "attn.wq_a");
  }
  // Decode: q_norm is folded into the launches that read qr (wq_b and the
  // indexer's wq_b), one launch fewer on the query path.
  auto gemv_normable = [&](const DeviceLinear& p) {
    return !linear_uses_gemm(p, T) && gemv_mma_takes_all(p);
  };
  const bool fold_q_norm = w.q_norm != nullptr && gemv_normable(w.wq_b) &&
                           (!compressed || !w.indexer.present || gemv_normable(w.indexer.wq_b));
  if (!fold_q_norm) AFF_RETURN_IF_ERROR(rmsnorm_f32(qr, qr, T, c.q_lora_rank, w.q_norm, eps, s));
  // Decode: the indexer's queries come out of wq_b's launch (their weights
  // stacked under wq_b's: both read the normed qr), and the scores launch
  // applies their RoPE, so the selection starts right after wq_b, beside
  // qkv_finish. Launched on a stream of their own they waited for wq_b's
  // blocks, which fill the GPU as soon as wq_a ends, and cost a RoPE launch.
  const bool iq_stacked = fork_indexer && fold_q_norm && switches().stack_iq && !ablated("entries") &&
                          !ablated("iq") && !ablated("wq_b") &&
                          gemv_mma_pair_supports(w.wq_b, w.indexer.wq_b);
  // Or the indexer's queries first, alone: its selection then overlaps wq_b.
  const bool iq_first = iq_stacked && switches().iq_first;
  // Decode without an indexer: the attention normalises and rotates its
  // queries as it stages them, and the KV latent's norm and RoPE run beside
  // wq_b on side3: qkv_finish leaves the query path (~1 us per layer). With
  // an indexer the attention waits for its top-k instead, beside which
  // qkv_finish already runs: finishing there would add the staging's ~1.7 us
  // to the path (docs/BENCHMARKS.md).
  const float* freq = compressed ? st.rope_compress.as<float>() : st.rope_main.as<float>();
  AttentionArgs probe;
  probe.T = T, probe.Dh = Dh, probe.rope_dim = rd, probe.unrope_freq = freq;
  // With the indexer's queries first (iq_first) its selection runs beside
  // wq_b, and the query path is wq_b then qkv_finish again: the attention may
  // finish the queries there too (opt-in AFF_CUDA_ATTN_QFINISH_CSA=1), the KV
  // latent's part on side4 (with AFF_CUDA_SITE_IW=0 side3 carries the
  // indexer's head weights).
  const bool q_in_attn = side_ok && paired && switches().attn_qfinish &&
                         (!w.indexer.present || (iq_first && switches().qfinish_csa)) && !ablated("wq_a") &&
                         !ablated("qkv") && attention_finishes_q(probe);
  cudaStream_t kv_side = w.indexer.present ? st.side4.get() : st.side3.get();
  // The KV latent's norm (with its weight) and RoPE, after the per-head query
  // norm and RoPE unless the attention does those.
  auto qkv_finish_on = [&](bool with_q, cudaStream_t on) {
    QkvFinishArgs f;
    if (with_q) f.parts[f.n_parts++] = QkvPart{q, H, Dh, true, nullptr, freq};
    f.parts[f.n_parts++] = QkvPart{kv, 1, Dh, true, w.kv_norm, freq};
    f.step = st.step.as<StepInfo>(), f.T = T, f.rope_dim = rd, f.eps = eps;
    return qkv_finish(f, on);
  };
  if (q_in_attn) {
    AFF_RETURN_IF_ERROR(stream_after(kv_side, s, st.kv_ready));
    AFF_RETURN_IF_ERROR(qkv_finish_on(false, kv_side));
  }
  // The compressed entries and the indexer's selection (beside s: enqueued
  // here, after qr's launch, so the indexer's wait on s covers it).
  // Whether the mHC site before already wrote this step's x into cs's x ring.
  auto stored = [&](const GpuCompressorState& cs) {
    const float* ring = cs.ring_x.as<float>();
    return ring != nullptr && (feeds.ring[0] == ring || feeds.ring[1] == ring);
  };
  auto entries = [&]() -> Status {
    if (!ablated("comp"))
      AFF_RETURN_IF_ERROR(compressor_run(m, w.compressor, ls.kv, st, x, T, pos0, ws.comp_kv.as<float>(),
                                         ws.comp_gate.as<float>(), side, stored(ls.kv)));
    prof_mark(s, "attn.compressor");
    if (w.indexer.present) {
      AFF_RETURN_IF_ERROR(indexer_inputs(m, w.indexer, ls, st, x, qr, fold_q_norm ? w.q_norm : nullptr, T, pos0, iss,
                                         iq_stacked, feeds.iw_parts != nullptr, stored(ls.idx)));
      if (!iq_stacked) AFF_RETURN_IF_ERROR(indexer_choose(m, w.indexer, ls, st, T, pos0, iss.sel, feeds));
      prof_mark(s, "attn.indexer");
    }
    return Status::ok();
  };
  const bool entries_beside = fork && !ablated("entries");
  if (entries_beside) AFF_RETURN_IF_ERROR(entries());
  if (ablated("wq_b")) {
    // what-if timing: no wq_b
  } else if (iq_first) {
    AFF_RETURN_IF_ERROR(gemv_mma_normed(w.indexer.wq_b, qr, T, ws.iq.as<float>(), w.q_norm, eps, s));
    AFF_RETURN_IF_ERROR(stream_after(iss.sel, s, st.iq_ready));
    AFF_RETURN_IF_ERROR(indexer_choose(m, w.indexer, ls, st, T, pos0, iss.sel, feeds, /*rope_q=*/true));
    AFF_RETURN_IF_ERROR(
        gemv_mma_normed(w.wq_b, qr, T, q, w.q_norm, eps, s, switches().wqb_blocks, switches().wqb_pdl));
  } else if (iq_stacked) {
    PairOptions o;
    o.norm = w.q_norm, o.eps = eps;
    AFF_RETURN_IF_ERROR(gemv_mma_pair(w.wq_b, w.indexer.wq_b, qr, c.q_lora_rank, T, q, w.wq_b.out, ws.iq.as<float>(),
                                      w.indexer.wq_b.out, s, o));
  } else if (fold_q_norm) {
    AFF_RETURN_IF_ERROR(gemv_mma_normed(w.wq_b, qr, T, q, w.q_norm, eps, s));
  } else {
    AFF_RETURN_IF_ERROR(linear(w.wq_b, qr, T, q, s));
  }
  prof_mark(s, "attn.q_norm+wq_b");
  // The indexer's choice waits for its queries (here) and its other inputs (on its stream).
  if (iq_stacked && !iq_first) {
    AFF_RETURN_IF_ERROR(stream_after(iss.sel, s, st.iq_ready));
    AFF_RETURN_IF_ERROR(indexer_choose(m, w.indexer, ls, st, T, pos0, iss.sel, feeds, /*rope_q=*/true));
  }
  if (!paired) {
    AFF_RETURN_IF_ERROR(linear(w.wkv, x, T, kv, s));
    prof_mark(s, "attn.wkv");
  }
  if (q_in_attn) {
    AFF_RETURN_IF_ERROR(stream_after(s, kv_side, st.kv_done));
  } else {  // per-head query norm, KV norm, and RoPE on both, in one launch
    if (!ablated("qkv")) AFF_RETURN_IF_ERROR(qkv_finish_on(true, s));
    prof_mark(s, "attn.qkv_finish");
  }

  AttentionArgs a;
  if (compressed) {
    if (fork) {
      AFF_RETURN_IF_ERROR(stream_after(s, side, st.join));
      if (fork_indexer) AFF_RETURN_IF_ERROR(stream_after(s, iss.sel, st.join2));
      if (fork_indexer && entries_beside && !iq_stacked) AFF_RETURN_IF_ERROR(stream_after(s, iss.q, st.join3));
    } else {
      AFF_RETURN_IF_ERROR(entries());
    }
    a.entries = ls.kv.entries.as<float>();
    a.entry_capacity = ls.kv.capacity;
    a.ratio = w.compressor.ratio;
    if (switches().attn_bound) a.entry_bound = entry_bound(pos0, T, a.ratio, a.entry_capacity);
    a.mode = AttnEntries::kVisible;
    if (w.indexer.present) {
      a.mode = AttnEntries::kSelected;
      a.sel = ws.sel.as<int32_t>(), a.sel_count = ws.sel_count.as<int32_t>(), a.sel_ld = c.index_topk;
    }
  }
  a.q = q, a.kv = kv, a.ring = ls.window.as<float>(), a.sinks = w.attn_sink;
  a.step = st.step.as<StepInfo>(), a.T = T, a.H = H, a.Dh = Dh, a.W = c.sliding_window;
  a.scale = 1.0f / std::sqrt(float(Dh));
  a.precision = mma_precision(), a.out = ws.o.as<float>();
  // Key-split partials borrow the MoE pair outputs, which are dead until gpu_moe.
  a.scratch = ws.y_pairs.as<float>(), a.scratch_floats = int64_t(ws.y_pairs.bytes() / sizeof(float));
  // V carried RoPE on its tail: the output is rotated back by the query's
  // angle (in the key-split merge where there is one).
  a.unrope_freq = freq;
  a.rope_dim = rd;
  a.q_finish = q_in_attn, a.q_eps = eps;
  if (!ablated("attn")) AFF_RETURN_IF_ERROR(attention_sparse(a, s));
  prof_mark(s, "attn.core+unrope");

  // The ring keeps the newest W positions for later chunks (after attention read the old ones).
  RingStoreArgs rs;
  rs.src = kv, rs.ring = ls.window.as<float>(), rs.capacity = c.sliding_window, rs.step = st.step.as<StepInfo>();
  rs.T = T;
  rs.width = Dh;
  // Nothing after it in this layer reads the ring: at decode sizes it runs on
  // the side stream beside the output projections, joined at the end.
  if (side_ok) {
    AFF_RETURN_IF_ERROR(stream_after(st.side.get(), s, st.fork));
    if (!ablated("ring")) AFF_RETURN_IF_ERROR(ring_store(rs, st.side.get()));
  } else {
    AFF_RETURN_IF_ERROR(ring_store(rs, s));
  }

  const float* o = ws.o.as<float>();

  // Grouped low-rank output: group g's heads through rows [g*R, (g+1)*R) of wo_a.
  const int G = c.o_groups;
  const int64_t R = c.o_lora_rank, group_in = int64_t(H / G) * Dh;
  if (w.wo_a.in != group_in) return internal_error("attention: wo_a input width mismatch");
  float* u = ws.u.as<float>();
  if (ablated("wo_a")) {
    // what-if timing: no wo_a
  } else if (!linear_uses_gemm(w.wo_a, T) && gemv_mma_takes(w.wo_a, 0, R)) {
    // Decode: all groups in one launch (group g's rows read o's slice g).
    AFF_RETURN_IF_ERROR(gemv_mma(w.wo_a, 0, G * R, o, int64_t(H) * Dh, T, u, G * R, R, group_in, s));
  } else {
    AFF_RETURN_IF_ERROR(linear_grouped(w.wo_a, G, R, o, int64_t(H) * Dh, T, u, G * R, s));
  }
  prof_mark(s, "attn.wo_a");
  if (!ablated("wo_b")) AFF_RETURN_IF_ERROR(linear(w.wo_b, u, T, out, s));
  prof_mark(s, "attn.wo_b");
  if (side_ok) AFF_RETURN_IF_ERROR(stream_after(s, st.side.get(), st.join));
  return Status::ok();
}

namespace {

// The router's arguments for a layer (its outputs in the workspace).
RouterArgs router_args(const DeviceModel& m, const DeviceMoe& w, const int32_t* tokens, int64_t T, Workspace& ws) {
  const dsv4::ModelConfig& c = m.config;
  RouterArgs r;
  r.logits = ws.router_logits.as<float>();
  r.bias = w.tid2eid ? nullptr : w.gate_bias;
  r.tid2eid = w.tid2eid, r.tokens = tokens;
  r.T = T, r.E = c.n_routed_experts, r.k = c.n_experts_per_tok;
  r.func = c.scoring_func == "sigmoid"   ? ScoreFunc::kSigmoid
           : c.scoring_func == "softmax" ? ScoreFunc::kSoftmax
                                         : ScoreFunc::kSqrtSoftplus;
  r.scaling = float(c.routed_scaling_factor);
  r.ids = ws.route_ids.as<int32_t>(), r.weights = ws.route_w.as<float>();
  return r;
}

}  // namespace

bool gpu_site_router_takes(const DeviceModel& m, int l, int64_t T, bool no_routed) {
  const dsv4::ModelConfig& c = m.config;
  if (switches().site_router == 0 || no_routed || ablated("mhc") || ablated("router") || profiling_enabled())
    return false;
  const DeviceLayer& lw = m.layers[size_t(l)];
  if (linear_uses_gemm(lw.ffn.gate, T) || lw.ffn_norm == nullptr) return false;
  RouterArgs r;
  r.T = T, r.E = c.n_routed_experts, r.k = c.n_experts_per_tok;
  return site_router_shape_ok(T, c.hidden_size, c.hc_mult, r, lw.ffn.gate);
}

namespace {

// Whether the gate's stream columns run early (AFF_CUDA_SITE_ROUTER=3).
bool streams_early() { return switches().site_router == 3 && beside(true); }

}  // namespace

HcCopies gpu_site_copies(GpuState& st) {
  // With the stream columns computed early the streams are read in place.
  return HcCopies{streams_early() ? nullptr : st.ws.h_copy.as<float>(), st.ws.post_copy.as<float>(),
                  st.ws.comb_copy.as<float>()};
}

namespace {

// The launch's arguments; h: the streams, a: the attention's output (the
// site's input), x: the site's output.
Result<SiteRouterArgs> site_router_args(const DeviceModel& m, int l, GpuState& st, float* h, const float* a,
                                        int64_t T, float* x, const int32_t* tokens) {
  const DeviceLayer& lw = m.layers[size_t(l)];
  AFF_ASSIGN_OR_RETURN(HcFusedArgs f, hc_site_args(m, lw.hc_ffn, st, h, a, 0, T, false, lw.ffn_norm, x));
  f.x_inv = st.ws.x_inv.as<float>();
  SiteRouterArgs s;
  // The deferred Sinkhorn runs inside the launch (the finishing block's spare warps).
  defer_comb(f, &s.comb_job, nullptr);
  s.site = f;
  s.router = router_args(m, lw.ffn, tokens, T, st.ws);
  s.gate = lw.ffn.gate.weight, s.gate_bf16 = lw.ffn.gate.format == DevFormat::kBF16;
  const HcCopies cp = gpu_site_copies(st);
  s.h_prev = cp.h, s.post_prev = cp.post, s.comb_prev = cp.comb;
  s.parts = st.ws.gate_parts.as<float>(), s.ticket = st.ws.site_router_ticket.as<unsigned>();
  if (!site_router_supported(f, s.router, lw.ffn.gate)) return internal_error("site_router: unsupported shape");
  return s;
}

}  // namespace

Status gpu_site_router_streams(const DeviceModel& m, int l, GpuState& st, float* h, int64_t T, float* x,
                               const int32_t* tokens) {
  if (!streams_early()) return Status::ok();
  AFF_ASSIGN_OR_RETURN(SiteRouterArgs s, site_router_args(m, l, st, h, st.ws.y.as<float>(), T, x, tokens));
  s.h_prev = h;  // the first site's output, read before the MoE site overwrites it
  AFF_RETURN_IF_ERROR(stream_after(st.side_gate.get(), st.stream.get(), st.fork));
  AFF_RETURN_IF_ERROR(site_router_streams(s, st.side_gate.get()));
  st.streams_pending = true;
  return Status::ok();
}

Status gpu_hc_site_router(const DeviceModel& m, int l, GpuState& st, float* h, const float* a, int64_t T,
                          float* x, const int32_t* tokens) {
  AFF_ASSIGN_OR_RETURN(SiteRouterArgs s, site_router_args(m, l, st, h, a, T, x, tokens));
  if (streams_early()) {
    if (!st.streams_pending) return internal_error("site_router: the stream columns did not run");
    st.streams_pending = false;
    // The site overwrites the streams the early launch reads, and the finisher reads its columns.
    AFF_RETURN_IF_ERROR(stream_after(st.stream.get(), st.side_gate.get(), st.streams_done));
    AFF_RETURN_IF_ERROR(stream_after(st.side3.get(), st.stream.get(), st.fork));
    AFF_RETURN_IF_ERROR(site_router_split(s, st.stream.get(), st.side3.get(), /*streams_done=*/true));
    st.gate_pending = true;
  } else if (switches().site_router == 2 && beside(true)) {
    // The gate on side3 (free after the attention), joined before the routed launches (gpu_moe).
    AFF_RETURN_IF_ERROR(stream_after(st.side3.get(), st.stream.get(), st.fork));
    AFF_RETURN_IF_ERROR(site_router_split(s, st.stream.get(), st.side3.get()));
    st.gate_pending = true;
  } else {
    AFF_RETURN_IF_ERROR(site_router(s, st.stream.get()));
  }
  prof_mark(st.stream.get(), "mhc");
  return Status::ok();
}

Status gpu_moe(const DeviceModel& m, int l, GpuState& st, const int32_t* tokens, const float* x, int64_t T,
               bool no_routed, float* out, const HcCombJob& job, bool routes_ready) {
  const dsv4::ModelConfig& c = m.config;
  const DeviceMoe& w = m.layers[size_t(l)].ffn;
  Workspace& ws = st.ws;
  cudaStream_t s = st.stream.get();
  const int k = c.n_experts_per_tok;
  const float limit = float(c.swiglu_limit);
  // The router gate and the shared expert read x: one bf16 split for both (prefill).
  std::optional<GemmSharedInput> shared_x;
  if (linear_uses_gemm(w.gate, T)) shared_x.emplace(x, c.hidden_size, T, c.hidden_size, s);
  // Decode: the shared expert (which needs no routing) runs on the side stream
  // over part of the GPU while the router's short, latency-bound kernels run
  // on the main stream; the routed down launch adds its output.
  MoeDecodeArgs d;
  d.slots = w.slots, d.ids = ws.route_ids.as<int32_t>(), d.route_w = ws.route_w.as<float>();
  d.k = no_routed ? 0 : k, d.routed_format = w.expert_format, d.shared_format = w.shared_format;
  if (!w.host_slots.empty()) d.routed_ggml_up = w.host_slots[0].w1.ggml_type, d.routed_ggml_down = w.host_slots[0].w2.ggml_type;
  d.shared_ggml_up = w.shared_host.w1.ggml_type, d.shared_ggml_down = w.shared_host.w2.ggml_type;
  d.shared_fp8_block = w.shared_host.w1.block;
  d.shared_slot = w.has_shared ? w.shared_slot : nullptr;
  d.x = x, d.T = T, d.D = c.hidden_size, d.inter = c.moe_inter, d.swiglu_limit = limit;
  d.act = ws.act.as<float>(), d.out = out;
  // The up launch hands the down launch its pairs' w2 (what-if runs without the up launch do not).
  if (!ablated("moe_up")) d.pair_w2 = ws.pair_w2.as<const uint8_t*>();
  const bool decode = T <= kMoeDecodeMaxTokens && c.hidden_size % 32 == 0 && c.moe_inter % 32 == 0 &&
                      moe_decode_act_bytes(d) <= int64_t(ws.act.bytes());
  // Decode of one token: router, shared expert and routed experts in one launch.
  if (!routes_ready && !no_routed && T == 1 && decode && switches().moe_fused && !profiling_enabled() &&
      w.has_shared && !ablated("router") && !ablated("moe_up") && !ablated("moe_down") && !ablated("shared")) {
    RouterArgs r = router_args(m, w, tokens, T, ws);
    MoeDecodeArgs f = d;
    f.pair_w2 = nullptr;
    if (moe_decode_streams(f) && moe_fused_supported(f, r, w.gate)) {
      AFF_RETURN_IF_ERROR(moe_fused(f, r, w.gate, job, ws.moe_sync.as<unsigned>(), s));
      prof_mark(s, "moe.fused");
      return Status::ok();
    }
  }
  MoeDecodeArgs routed = d, shared_only = d;
  routed.shared_slot = nullptr;
  shared_only.k = 0, shared_only.act = d.act + T * d.k * d.inter, shared_only.out = ws.y_shared.as<float>();
  shared_only.max_sms = std::max(1, current_device_multiprocessors() * switches().shared_sms / 100);
  routed.add = shared_only.out;
  const bool beside_ok = beside(decode) && switches().shared_beside && d.k > 0 && d.shared_slot != nullptr &&
                         moe_decode_streams(routed);
  // A shared expert the streaming kernels do not read (split Q8_0 from a
  // container) runs as tensor-core GEMVs instead: gate and up in one launch
  // into y_pairs (unused by the decode MoE), then down with the SwiGLU folded
  // into its staging.
  const ExpertSlot& sh = w.shared_host;
  const bool shared_gemv = beside_ok && (!moe_decode_streams(shared_only) || switches().shared_gemv) &&
                           gemv_mma_pair_supports(sh.w1, sh.w3) &&
                           gemv_mma_takes_all(sh.w1) && gemv_mma_takes_all(sh.w2) &&
                           2 * T * c.moe_inter <= int64_t(ws.y_pairs.bytes() / 4);
  const bool split = beside_ok && (moe_decode_streams(shared_only) || shared_gemv);
  const int order = switches().moe_order;
  const bool split_order = split && order > 0 && (shared_gemv ? order == 1 : moe_decode_streams(d));
  const bool gemv_order = split_order && shared_gemv;
  // The shared expert as GEMVs: gate + up into y_pairs, then the down.
  float* sh_gate = ws.y_pairs.as<float>();
  float* sh_up = sh_gate + T * c.moe_inter;
  auto shared_gemv_up = [&](cudaStream_t side) -> Status {
    PairOptions po;
    po.max_blocks = shared_only.max_sms;
    return gemv_mma_pair(sh.w1, sh.w3, x, c.hidden_size, T, sh_gate, c.moe_inter, sh_up, c.moe_inter, side, po);
  };
  auto shared_gemv_down = [&](cudaStream_t side) -> Status {
    return gemv_mma_swiglu(sh.w2, sh_gate, sh_up, c.moe_inter, T, limit, shared_only.out, c.hidden_size,
                           shared_only.max_sms, side);
  };
  MoeDecodeArgs routed_up = routed;  // the routed up beside the shared expert: its share of the SMs
  routed_up.max_sms = std::max(2, current_device_multiprocessors() * switches().routed_sms / 100);
  if (split && !split_order) {
    cudaStream_t side = st.side.get();
    AFF_RETURN_IF_ERROR(stream_after(side, s, st.fork));
    if (!ablated("shared") && shared_gemv) {
      AFF_RETURN_IF_ERROR(shared_gemv_up(side));
      AFF_RETURN_IF_ERROR(shared_gemv_down(side));
    } else if (!ablated("shared")) {
      AFF_RETURN_IF_ERROR(moe_decode_up(shared_only, side));
      // The up launch leaves the shared expert's SwiGLU output as f32 rows [T, inter].
      if (switches().shared_down_gemv && gemv_mma_takes_all(sh.w2))
        AFF_RETURN_IF_ERROR(gemv_mma_side(sh.w2, shared_only.act, c.moe_inter, T, shared_only.out, c.hidden_size,
                                          shared_only.max_sms, side));
      else
        AFF_RETURN_IF_ERROR(moe_decode_down(shared_only, side));
    }
  }
  // A gate beside the site on side3 (gpu_hc_site_router): the routes exist once it has run.
  auto join_gate = [&]() -> Status {
    if (!st.gate_pending) return Status::ok();
    st.gate_pending = false;
    return stream_after(s, st.side3.get(), st.gate_join);
  };
  if (!split_order) AFF_RETURN_IF_ERROR(join_gate());
  bool job_done = false;  // the previous mHC site's deferred comb: beside the router, or on its own
  auto route = [&]() -> Status {
    if (!routes_ready && !no_routed && !ablated("router")) {
      RouterArgs r = router_args(m, w, tokens, T, ws);
      // Decode: gate and top-k in one launch.
      if (!linear_uses_gemm(w.gate, T) && router_gate_topk_supports(r, w.gate)) {
        AFF_RETURN_IF_ERROR(router_gate_topk(r, w.gate, x, ws.router_ticket.as<unsigned>(), s, job));
        job_done = true;
      } else {
        AFF_RETURN_IF_ERROR(linear(w.gate, x, T, ws.router_logits.as<float>(), s));
        AFF_RETURN_IF_ERROR(router_topk(r, s));
      }
      prof_mark(s, "moe.router");
    }
    return job_done ? Status::ok() : hc_comb_run(job, s);
  };
  if (gemv_order) {
    // The shared expert as GEMVs: gate + up beside the router, joined before
    // the routed up; the down beside the routed up, joined before the routed down.
    cudaStream_t side = st.side.get();
    AFF_RETURN_IF_ERROR(stream_after(side, s, st.fork));
    if (!ablated("shared")) AFF_RETURN_IF_ERROR(shared_gemv_up(side));
    AFF_RETURN_IF_ERROR(join_gate());
    AFF_RETURN_IF_ERROR(route());
    AFF_RETURN_IF_ERROR(stream_after(s, side, st.join));
    AFF_RETURN_IF_ERROR(stream_after(side, s, st.fork));
    if (!ablated("shared")) AFF_RETURN_IF_ERROR(shared_gemv_down(side));
    if (!ablated("moe_up")) AFF_RETURN_IF_ERROR(moe_decode_up(routed_up, s));
    AFF_RETURN_IF_ERROR(stream_after(s, side, st.join));
    return ablated("moe_down") ? Status::ok() : moe_decode_down(routed, s);
  }
  if (split_order) {
    // The shared up beside the router (order 1) or before it (order 2); the
    // routed up then has the GPU to itself, and one down launch reads both.
    const bool side_up = order == 1;
    if (side_up) AFF_RETURN_IF_ERROR(stream_after(st.side.get(), s, st.fork));
    MoeDecodeArgs shared_up = shared_only;
    if (!side_up) shared_up.max_sms = 0;
    if (!ablated("shared")) AFF_RETURN_IF_ERROR(moe_decode_up(shared_up, side_up ? st.side.get() : s));
    AFF_RETURN_IF_ERROR(join_gate());
    AFF_RETURN_IF_ERROR(route());
    if (side_up) AFF_RETURN_IF_ERROR(stream_after(s, st.side.get(), st.join));
    if (!ablated("moe_up")) AFF_RETURN_IF_ERROR(moe_decode_up(routed, s));
    return ablated("moe_down") ? Status::ok() : moe_decode_down(d, s);
  }
  AFF_RETURN_IF_ERROR(route());
  if (split) {
    if (!ablated("moe_up")) AFF_RETURN_IF_ERROR(moe_decode_up(routed_up, s));
    AFF_RETURN_IF_ERROR(stream_after(s, st.side.get(), st.join));
    return ablated("moe_down") ? Status::ok() : moe_decode_down(routed, s);
  }
  // Decode-sized batches otherwise: every routed pair and the shared expert in
  // one up and one down launch, the combine folded into the down launch.
  if (decode) {
    AFF_RETURN_IF_ERROR(moe_decode_up(d, s));
    prof_mark(s, "moe.up");
    AFF_RETURN_IF_ERROR(moe_decode_down(d, s));
    prof_mark(s, "moe.down");
    return Status::ok();
  }
  if (!no_routed) {
    ExpertFfnArgs e;
    e.slots = w.slots, e.format = w.expert_format, e.ids = ws.route_ids.as<int32_t>(), e.n_pairs = T * k, e.pairs_per_token = k;
    e.x = x, e.D = c.hidden_size, e.inter = c.moe_inter, e.swiglu_limit = limit;
    e.act = ws.act.as<float>(), e.y = ws.y_pairs.as<float>();
    AFF_RETURN_IF_ERROR(run_experts(e, w.host_slots, s));
  }
  const float* shared = nullptr;
  if (w.has_shared) {
    ExpertFfnArgs e;
    e.slots = w.shared_slot, e.format = w.shared_format, e.ids = ws.zero_ids.as<int32_t>(), e.n_pairs = T;
    e.pairs_per_token = 1, e.x = x, e.D = c.hidden_size, e.inter = c.moe_inter, e.swiglu_limit = limit;
    e.act = ws.act.as<float>(), e.y = ws.y_shared.as<float>();
    AFF_RETURN_IF_ERROR(run_experts(e, std::span<const ExpertSlot>(&w.shared_host, 1), s, /*ids_all_zero=*/true));
    shared = e.y;
  }
  return moe_combine(ws.route_w.as<float>(), ws.y_pairs.as<float>(), T, no_routed ? 0 : k, c.hidden_size,
                     shared, out, s);
}

}  // namespace aff::cuda
