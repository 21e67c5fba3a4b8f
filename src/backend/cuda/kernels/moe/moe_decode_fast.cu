// Streaming decode MoE: T <= 8 tokens, routed experts in Q2_K / Q3_K / IQ2_XXS
// (gate, up) and Q2_K / Q3_K (down), the shared expert in FP8 E4M3 with block
// scales. Two launches read every routed pair's weights and the shared
// expert's once:
//
// moe_up_fast_sm90 (one 16-warp block per SM). A block takes an even share of
// the shared expert's 8-row tiles and of the routed jobs (pair, 16 rows), so
// every SM gets the same mix whatever the relative speed of the two paths
// (when both do not fit in one block's shared memory, at larger T, blocks get
// one kind each, sized on the host by bytes weighted per format).
//  - shared tiles on tensor cores: one MMA tile holds 8 gate rows over the 8
//    up rows of the same index and every token is a column, so SwiGLU needs no
//    exchange. Each warp takes 1/16 of every tile's columns (split-K), summed
//    in shared memory in a fixed order. x is staged as f16 hi + lo pairs per 64
//    columns (the exact setting; hi only in the fast one). These run first,
//    while the routed rings fill.
//  - routed jobs: a warp streams its passes (gate rows and up rows, two rows
//    per lane where a row needs at most 16 lanes) through its own ring of
//    shared-memory stages filled by bulk copies, so bytes in flight cost no
//    registers. Lanes own 128 columns of a row (half a super-block) and keep
//    those columns' int8 activations in registers for every row. At the end,
//    each job's 16 SwiGLU outputs are quantised to int8 with one scale (q16)
//    and written over the pair's act row, the form the down launch reads.
// moe_down_fast_sm90 (blocks own 16-row multiples of the output, all pairs):
// every warp takes an even share of the routed passes (rings as above) and then
// of the shared expert's 16 x 64 tensor-core units; out[t, d] = sum_j
// route_w[t, j] y_j + shared, summed in a fixed order at the end of the block.
//
// moe_fused_sm90 (T = 1, opt-in): the router, the shared expert and both
// passes in one launch of one block per SM, the same work as the router
// launch and the two launches with the shared expert inside (up_body and
// down_body are shared with them), so the same bits; two grid barriers order
// the phases. Slower than the launches today (docs/BENCHMARKS.md has its
// phase timeline); kept as the base of a persistent MoE.
//
// Every reduction has a fixed order and no atomics: replays are bit-identical.
// Grids and shared memory are sized from T, k and the shapes only.
#include <algorithm>

#include "backend/cuda/kernels/common/decode.cuh"
#include "backend/cuda/kernels/common/grid_sync.cuh"
#include "backend/cuda/kernels/gemm/mma_precision.h"
#include "backend/cuda/kernels/moe/moe_decode_fast.h"
#include "backend/cuda/kernels/mhc/mhc_coeffs.cuh"
#include "backend/cuda/kernels/moe/moe_fast.cuh"
#include "backend/cuda/kernels/moe/route_select.cuh"
#include "backend/cuda/kernels/moe/swiglu.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/device_info.h"
#include "backend/cuda/runtime/smem_limit.h"
#include "quant/type_traits.h"

namespace aff::cuda {
namespace {

using moe_fast::Fmt;

constexpr int kWarps = 16;
constexpr int kThreads = kWarps * 32;
constexpr int kJobRows = 16;   // routed up job: rows sharing one q16 scale of the act
constexpr int kUpTile = 8;     // shared up MMA tile: 8 intermediate rows (their gate and up rows)
constexpr int kDownTile = 16;  // shared down MMA tile: 16 output rows
constexpr int kDepth = 4;      // FP8: 64-column steps of loads in flight per lane
constexpr int kMaxStages = 6;  // ring stages per warp
constexpr int64_t kSmemMax = 227 * 1024;
constexpr int kRedSlot = 4 * 32;  // floats of one warp's MMA accumulators

template <Fmt F>
constexpr int kBlockBytes = F == Fmt::kQ2_K ? 84 : F == Fmt::kQ3_K ? 110 : 66;

template <Fmt F>
__device__ __forceinline__ float unit_dot(const uint8_t* sb, int h, const moe_fast::XUnit& x, const uint8_t* grid,
                                          const uint8_t* sign) {
  if constexpr (F == Fmt::kQ2_K) return moe_fast::q2k_unit(sb, h, x);
  else if constexpr (F == Fmt::kQ3_K) return moe_fast::q3k_unit(sb, h, x);
  else return moe_fast::iq2xxs_unit(sb, h, x, grid, sign);
}

// ---- up ---------------------------------------------------------------------------------

struct UpPlan {
  MoeDecodeArgs m;
  // Block b takes shared tiles when b - shared_first is in [0, shared_blocks)
  // and routed jobs when b - routed_first is in [0, routed_blocks), each an even
  // share. Mixed plans give every block both (first = 0, blocks = grid), so
  // every SM gets the same mix whatever the relative speed of the two paths;
  // split plans (larger T, when both do not fit in shared memory) give each
  // block one kind.
  int shared_first, shared_blocks, routed_first, routed_blocks;
  int jobs;        // routed jobs (pair, 16 rows), pair-major
  int tiles;       // shared tiles of kUpTile intermediate rows
  int lanes_row;   // lanes per routed row (power of two >= D / 128)
  int rows_lane;   // routed rows a lane takes per pass (1 or 2): a pass is 32 / lanes_row * rows_lane rows
  int row_bytes;   // bytes of one routed w1 / w3 row
  int stages, stage_bytes;
  int s_srows;     // scale rows per weight in the shared scale table
  // Dynamic shared memory, byte offsets. Routed work:
  int r_x;     // x as q16, token t at r_x + t * q16_bytes(D)
  int r_tab;   // IQ2_XXS tables (moe_fast::kIq2TableBytes)
  int r_sw;    // SwiGLU outputs of the block's jobs [jobs_in_block, 16] f32
  int r_ptr;   // w1 / w3 row bases of the block's pairs
  int r_bar, r_ring;
  // Shared work:
  int s_xh, s_xl;  // x as f16 hi / lo [T, D + 8]
  int s_xi;        // 2^-e per (token, 64 columns) [T, D / 64]
  int s_scale;     // w1 then w3 block scales per 64-column step [2][s_srows, D / 64] f32
  int s_red;       // split-K partials [tiles_in_block * kWarps, 4, 32] f32
  // Fused launch only: the block's shared tiles (w1 rows, then w3 rows, each
  // kStageLd bytes apart) copied into shared memory at s_stage (in the routed
  // ring, unused until the picks are known), complete on the barrier at s_sbar.
  int s_stage = -1, s_sbar = -1;
};

// Row stride of the staged shared tiles: a row plus 16 bytes, so the 8 rows
// of an MMA fragment load fall in different banks.
constexpr int kStagePad = 16;

struct PairRows {
  const uint8_t* w1;
  const uint8_t* w3;
};

// Where a warp's routed step is: its local job, the job's pair and 16-row
// tile. Advanced incrementally (integer division costs ~20 instructions).
struct JobCursor {
  int jl, p, tile;
  __device__ void advance(int jstep, int tiles_pair) {
    jl += jstep, tile += jstep;
    while (tile >= tiles_pair) tile -= tiles_pair, ++p;
  }
};

// Block-cooperative: the block scales of w for scale rows [sr0, sr0 + nsr),
// decoded to f32 once and spread per 64-column step: out[r * nkb + kb] is the
// scale of columns [64 kb, 64 kb + 64) in scale row sr0 + r (block % 64 == 0).
__device__ __forceinline__ void scale_table(const DeviceLinear& w, int sr0, int nsr, int nkb, float* out) {
  const int srows = int((w.out + w.block - 1) / w.block);
  for (int e = threadIdx.x; e < nsr * nkb; e += blockDim.x) {
    const int r = e / nkb, kb = e % nkb;
    out[e] = sr0 + r < srows ? load_scale(w, int64_t(sr0 + r) * w.scale_cols + int64_t(kb) * 64 / w.block) : 0.0f;
  }
}

// The up launch's work for one block. Standalone (kFused false): the routed
// ring's first copies go out first, then the shared tiles run while they
// land. In the fused launch the picks are not known yet when the body starts:
// the shared tiles run first (their act written), then route() waits for the
// router's logits, picks the experts and returns the ids ([k] in shared
// memory), and only then do the routed copies start.
template <Fmt F, bool kExact, bool kFused, class Route, class Mark>
__device__ __forceinline__ void up_body(const UpPlan& a, uint8_t* smem, Route route, Mark mark) {
  const MoeDecodeArgs& m = a.m;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int D = int(m.D), inter = int(m.inter), T = int(m.T), k = m.k, nkb = D / 64, ld = D + 8;
  const int bsh = int(blockIdx.x) - a.shared_first, brt = int(blockIdx.x) - a.routed_first;
  const bool has_shared = bsh >= 0 && bsh < a.shared_blocks, has_routed = brt >= 0 && brt < a.routed_blocks;
  // Shared tiles [t0, t1): every warp takes a 1/kWarps slice of each tile's columns.
  const int t0 = has_shared ? int(int64_t(bsh) * a.tiles / a.shared_blocks) : 0;
  const int t1 = has_shared ? int(int64_t(bsh + 1) * a.tiles / a.shared_blocks) : 0;
  const int ks0 = warp * nkb / kWarps, ks1 = (warp + 1) * nkb / kWarps;
  const int n_fp8 = (t1 - t0) * (ks1 - ks0);
  // Routed jobs [j0, j1): rows per pass P, passes per job ppj (ppj divides
  // kWarps): warp w takes the block's passes w, w + kWarps, ..., i.e. rows
  // prow.. of every jstep-th job.
  const int j0 = has_routed ? int(int64_t(brt) * a.jobs / a.routed_blocks) : 0;
  const int j1 = has_routed ? int(int64_t(brt + 1) * a.jobs / a.routed_blocks) : 0;
  const int tiles_pair = inter / kJobRows;
  const int U2 = a.lanes_row, P0 = 32 / U2, RL = a.rows_lane, P = P0 * RL;
  const int ppj = kJobRows / P, jstep = kWarps / ppj, prow = (warp % ppj) * P;
  const int jl0 = warp / ppj, n_jobs = j1 - j0;
  const int n_steps = n_jobs > jl0 ? (n_jobs - jl0 + jstep - 1) / jstep : 0;
  const int p_lo = has_routed ? j0 / tiles_pair : 0, p_hi = has_routed ? (j1 - 1) / tiles_pair : -1;

  // This thread's first 16 elements of x to quantise, loaded before the bulk
  // copies below would queue the load behind the block's weights.
  const int x_groups = has_routed ? T * (D / 16) : 0;
  float4 x_first[4];
  if (int(threadIdx.x) < x_groups) {
    const int t = int(threadIdx.x) / (D / 16), g16 = int(threadIdx.x) % (D / 16);
    const float4* src = reinterpret_cast<const float4*>(m.x + int64_t(t) * D + g16 * 16);
#pragma unroll
    for (int i = 0; i < 4; ++i) x_first[i] = src[i];
  }

  PairRows* ptr = reinterpret_cast<PairRows*>(smem + a.r_ptr);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + a.r_bar) + warp * kMaxStages;
  // The pairs' row bases and the ring's barriers (the caller syncs after).
  auto routed_setup = [&](const int32_t* ids) {
    for (int p = p_lo + int(threadIdx.x); p <= p_hi; p += blockDim.x) {
      const ExpertSlot& s = m.slots[ids[p]];
      ptr[p - p_lo] = {s.w1.weight, s.w3.weight};
      if (m.pair_w2 != nullptr) m.pair_w2[p] = s.w2.weight;  // for the down launch (blocks agree on it)
    }
    if (has_routed && lane == 0) {
      for (int st = 0; st < a.stages; ++st) moe_fast::mbar_init(bars + st, 1);
      moe_fast::mbar_init_fence();
    }
  };
  auto build_tables = [&](const int32_t* ids) {
    if constexpr (F == Fmt::kIQ2_XXS) {
      if (has_routed) {
        const GgmlTables* tab = reinterpret_cast<const GgmlTables*>(m.slots[ids[p_lo]].w1.tables);
        moe_fast::iq2_tables_build(tab, smem + a.r_tab);
      }
    }
  };
  if constexpr (!kFused) {
    routed_setup(m.ids);
    __syncthreads();
  }

  // Routed: the first stages of this warp's ring.
  const int64_t rbytes = a.row_bytes, len = int64_t(P) * rbytes;
  const int ring0 = a.r_ring + warp * a.stages * a.stage_bytes;
  const JobCursor start{jl0, (j0 + jl0) / tiles_pair, (j0 + jl0) % tiles_pair};
  JobCursor prod = start;  // lane 0's cursor: the next step to issue
  auto issue = [&](int slot) {
    const PairRows pr = ptr[prod.p - p_lo];
    const int64_t row = int64_t(prod.tile) * kJobRows + prow;
    const moe_fast::Span16 sg = moe_fast::span16(pr.w1 + row * rbytes, len);
    const moe_fast::Span16 su = moe_fast::span16(pr.w3 + row * rbytes, len);
    uint8_t* st = smem + ring0 + slot * a.stage_bytes;
    moe_fast::mbar_expect_tx(bars + slot, sg.bytes + su.bytes);
    moe_fast::bulk_g2s(st, sg.base, sg.bytes, bars + slot);
    moe_fast::bulk_g2s(st + sg.bytes, su.base, su.bytes, bars + slot);
    prod.advance(jstep, tiles_pair);
  };
  if constexpr (!kFused) {
    if (lane == 0)
      for (int i = 0; i < min(n_steps, a.stages); ++i) issue(i);
  }

  // Shared: the first weight loads of this warp's FP8 steps. Steps run over the
  // block's tiles and, within a tile, this warp's columns ks0 .. ks1 (64 each).
  // A row g is gate row tile * 8 + g, A row g + 8 the up row of the same index.
  // Register copies of the weights: read through the slot in global memory,
  // the fields would be reloaded after every shared-memory store.
  DeviceLinear w1{}, w3{};
  if (has_shared) w1 = m.shared_slot->w1, w3 = m.shared_slot->w3;
  const int64_t tile_jump = int64_t(kUpTile) * D - int64_t(ks1 - ks0) * 64;
  const int64_t lane0 = (int64_t(t0) * kUpTile + g) * D + int64_t(ks0) * 64 + 16 * c;
  const uint8_t* p1 = w1.weight + lane0;
  const uint8_t* p3 = w3.weight + lane0;
  int pkb = ks0;
  // Fused: the same bytes from the staged copy (rows [t0 * 8, t1 * 8) of w1,
  // then of w3, D + kStagePad bytes apart).
  const int64_t sld = int64_t(D) + kStagePad, s_rows = int64_t(t1 - t0) * kUpTile;
  const int64_t s_lane0 = int64_t(g) * sld + int64_t(ks0) * 64 + 16 * c;
  const int64_t s_tile_jump = int64_t(kUpTile) * sld - int64_t(ks1 - ks0) * 64;
  const uint8_t* q1 = smem + (kFused ? a.s_stage : 0) + s_lane0;
  const uint8_t* q3 = q1 + s_rows * sld;
  auto load = [&](uint4 (&b)[2]) {
    if constexpr (kFused) {
      b[0] = *reinterpret_cast<const uint4*>(q1);
      b[1] = *reinterpret_cast<const uint4*>(q3);
      q1 += 64, q3 += 64;
      if (++pkb == ks1) pkb = ks0, q1 += s_tile_jump, q3 += s_tile_jump;
    } else {
      b[0] = ld_stream16(p1);
      b[1] = ld_stream16(p3);
      p1 += 64, p3 += 64;
      if (++pkb == ks1) pkb = ks0, p1 += tile_jump, p3 += tile_jump;
    }
  };
  uint4 buf[kDepth][2];
  if constexpr (!kFused) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d)
      if (d < n_fp8) load(buf[d]);
  }

  // Stage what the block's work reads, while the first weights are in flight.
  const int64_t xstride = moe_fast::q16_bytes(D);
  if (has_routed) {
    for (int gi = threadIdx.x; gi < x_groups; gi += blockDim.x) {
      const int t = gi / (D / 16), g16 = gi % (D / 16);
      const float4* src = reinterpret_cast<const float4*>(m.x + int64_t(t) * D + g16 * 16);
      float v[16];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float4 f = gi == int(threadIdx.x) ? x_first[i] : src[i];
        v[4 * i] = f.x, v[4 * i + 1] = f.y, v[4 * i + 2] = f.z, v[4 * i + 3] = f.w;
      }
      float sc, sum;
      const uint4 q = moe_fast::q16_quantise(v, sc, sum);
      uint8_t* xb = smem + a.r_x + t * xstride;
      *reinterpret_cast<uint4*>(xb + g16 * 16) = q;
      reinterpret_cast<float*>(xb + D)[g16] = sc;
      reinterpret_cast<float*>(xb + D + D / 4)[g16] = sum;
    }
  }
  if constexpr (!kFused) build_tables(m.ids);
  __half* xh = reinterpret_cast<__half*>(smem + a.s_xh);
  __half* xl = reinterpret_cast<__half*>(smem + a.s_xl);
  float* xi = reinterpret_cast<float*>(smem + a.s_xi);
  float* st1 = reinterpret_cast<float*>(smem + a.s_scale);
  float* st3 = st1 + a.s_srows * nkb;
  const int sr0 = has_shared ? t0 * kUpTile / w1.block : 0;  // w1 and w3 share the shape and block
  if (has_shared) {
    moe_fast::stage_f16_pairs<kExact>(m.x, D, T, D, xh, xl, ld, xi);
    scale_table(w1, sr0, a.s_srows, nkb, st1);
    scale_table(w3, sr0, a.s_srows, nkb, st3);
  }
  __syncthreads();
  if constexpr (kFused) {
    if (has_shared) moe_fast::mbar_wait(reinterpret_cast<uint64_t*>(smem + a.s_sbar), 0);
    mark(2);
#pragma unroll
    for (int d = 0; d < kDepth; ++d)
      if (d < n_fp8) load(buf[d]);
  }

  // Shared: FP8 tiles on tensor cores; each tile's partial sums parked per warp.
  // They run before the routed passes (whose first stages are in flight) so
  // that the FP8 prefetch registers are free again for the routed loop.
  float* red = reinterpret_cast<float*>(smem + a.s_red);
  const int tb = min(g, T - 1), tc0 = min(2 * c, T - 1), tc1 = min(2 * c + 1, T - 1);
  const __half* xh_l = xh + tb * ld + 16 * c;
  const __half* xl_l = xl + tb * ld + 16 * c;
  const float* xi0 = xi + tc0 * nkb;
  const float* xi1 = xi + tc1 * nkb;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  int tl = 0, kb = ks0;
  int srow = has_shared ? (t0 * kUpTile / w1.block - sr0) * nkb : 0;
  auto fp8_steps = [&](int begin, int end) {  // begin: a multiple of kDepth
    for (int i0 = begin; i0 < end; i0 += kDepth) {
#pragma unroll
      for (int d = 0; d < kDepth; ++d) {
        if (i0 + d < end) {
          float cb[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          moe_fast::fp8_step<kExact>(buf[d][0], buf[d][1], xh_l + kb * 64, xl_l + kb * 64, cb);
          if (i0 + d + kDepth < n_fp8) load(buf[d]);
          const float sg = st1[srow + kb], su = st3[srow + kb];
          const float x0 = xi0[kb], x1 = xi1[kb];
          acc[0] = fmaf(cb[0], sg * x0, acc[0]);
          acc[1] = fmaf(cb[1], sg * x1, acc[1]);
          acc[2] = fmaf(cb[2], su * x0, acc[2]);
          acc[3] = fmaf(cb[3], su * x1, acc[3]);
          if (++kb == ks1) {  // tile done: park its partial sums, move to the next tile
#pragma unroll
            for (int r = 0; r < 4; ++r) red[((tl * kWarps + warp) * 4 + r) * 32 + lane] = acc[r], acc[r] = 0.0f;
            kb = ks0, ++tl;
            srow = ((t0 + tl) * kUpTile / w1.block - sr0) * nkb;
          }
        }
      }
    }
  };
  // Shared epilogue: sum the warps' column slices in order. Lane (g, c) of a
  // tile holds gate (C rows g) and up (C rows g + 8) of intermediate row
  // tile * 8 + g for tokens 2c, 2c + 1.
  auto shared_epilogue = [&]() {
    float* act = m.act + int64_t(m.T) * m.k * m.inter;
    for (int e = threadIdx.x; e < (t1 - t0) * 32; e += blockDim.x) {
      const int tle = e >> 5, l = e & 31;
      float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int w = 0; w < kWarps; ++w) {
        if ((w + 1) * nkb / kWarps == w * nkb / kWarps) continue;  // an empty slice (D < 1024) wrote nothing
#pragma unroll
        for (int r = 0; r < 4; ++r) v[r] += red[((tle * kWarps + w) * 4 + r) * 32 + l];
      }
      const int64_t row = int64_t(t0 + tle) * kUpTile + (l >> 2);
      const int ta = 2 * (l & 3), tb2 = ta + 1;
      if (ta < T) act[ta * m.inter + row] = swiglu_clamp(v[0], v[2], m.swiglu_limit);
      if (tb2 < T) act[tb2 * m.inter + row] = swiglu_clamp(v[1], v[3], m.swiglu_limit);
    }
  };
  fp8_steps(0, n_fp8);
  if constexpr (kFused) {
    __syncthreads();
    shared_epilogue();
    mark(3);
    const int32_t* ids = route();  // syncs the block
    routed_setup(ids);
    build_tables(ids);
    __syncthreads();
    if (lane == 0)
      for (int i = 0; i < min(n_steps, a.stages); ++i) issue(i);
    mark(5);
  }

  // Routed: stream this warp's passes through its ring.
  const int q = lane / U2, u = lane % U2, sb = u >> 1, h = u & 1;
  const bool active = u < D / 128;
  const int64_t lane_off = int64_t(q) * rbytes + sb * kBlockBytes<F>;
  const uint8_t* grid = smem + a.r_tab + (lane & 15) * 8;
  const uint8_t* sign = smem + a.r_tab + moe_fast::kIq2GridBytes + (lane & 7) * 16;
  float* sw = reinterpret_cast<float*>(smem + a.r_sw);
  {
    moe_fast::XUnit x;
    int cur_p = -1, cur_t = -1, slot = 0;
    uint32_t parity = 0;
    JobCursor cons = start;
    for (int i = 0; i < n_steps; ++i) {
      if (cons.p != cur_p) {  // warp-uniform
        cur_p = cons.p;
        const int t = cur_p / k;
        if (t != cur_t) {
          cur_t = t;
          if (active) {
            const uint8_t* xb = smem + a.r_x + t * xstride;
            moe_fast::load_xunit<F>(xb, reinterpret_cast<const float*>(xb + D),
                                    reinterpret_cast<const float*>(xb + D + D / 4), u, x);
          }
        }
      }
      const PairRows pr = ptr[cons.p - p_lo];
      const int64_t row = int64_t(cons.tile) * kJobRows + prow;
      const uint8_t* ga = pr.w1 + row * rbytes;
      const uint8_t* ua = pr.w3 + row * rbytes;
      const uint32_t skew_g = uint32_t(reinterpret_cast<uintptr_t>(ga) & 15u);
      const uint32_t up_at = moe_fast::span16(ga, len).bytes + uint32_t(reinterpret_cast<uintptr_t>(ua) & 15u);
      const uint8_t* st = smem + ring0 + slot * a.stage_bytes;  // shared-space loads
      moe_fast::mbar_wait(bars + slot, parity);
      float gd[2] = {0.0f, 0.0f}, ud[2] = {0.0f, 0.0f};  // rows q and q + P0 of the pass
      if (active) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          if (r < RL) {
            gd[r] = unit_dot<F>(st + skew_g + lane_off + r * P0 * rbytes, h, x, grid, sign);
            ud[r] = unit_dot<F>(st + up_at + lane_off + r * P0 * rbytes, h, x, grid, sign);
          }
        }
      }
      // Every lane's reads of this buffer are done (their values are used above)
      // before lane 0 hands it back to the copy engine.
      __syncwarp();
      if (lane == 0 && i + a.stages < n_steps) issue(slot);
      for (int o = U2 / 2; o > 0; o >>= 1) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          gd[r] += __shfl_xor_sync(0xffffffffu, gd[r], o);
          ud[r] += __shfl_xor_sync(0xffffffffu, ud[r], o);
        }
      }
      if (u == 0) {
#pragma unroll
        for (int r = 0; r < 2; ++r)
          if (r < RL) sw[cons.jl * kJobRows + prow + r * P0 + q] = swiglu_clamp(gd[r], ud[r], m.swiglu_limit);
      }
      cons.advance(jstep, tiles_pair);
      if (++slot == a.stages) slot = 0, parity ^= 1u;
    }
  }
  __syncthreads();
  mark(6);
  if constexpr (!kFused) shared_epilogue();
  // Routed epilogue: each job's 16 outputs -> q16 over the pair's act row.
  for (int jj = threadIdx.x; jj < n_jobs; jj += blockDim.x) {
    const int job = j0 + jj, p = job / tiles_pair, r0 = (job % tiles_pair) * kJobRows;
    float v[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = sw[jj * kJobRows + i];
    float sc, sum;
    const uint4 cq = moe_fast::q16_quantise(v, sc, sum);
    uint8_t* base = reinterpret_cast<uint8_t*>(m.act) + int64_t(p) * inter * 4;
    *reinterpret_cast<uint4*>(base + r0) = cq;
    reinterpret_cast<float*>(base + inter)[r0 / 16] = sc;
    reinterpret_cast<float*>(base + inter + inter / 4)[r0 / 16] = sum;
  }
  if constexpr (kFused) {  // the fused launch reuses this memory for the down's ring
    if (has_routed && lane == 0)
      for (int st = 0; st < a.stages; ++st) moe_fast::mbar_inval(bars + st);
  }
}

template <Fmt F, bool kExact>
__global__ void __launch_bounds__(kThreads, 1) moe_up_fast_sm90(UpPlan a) {
  extern __shared__ __align__(128) uint8_t smem[];
  up_body<F, kExact, false>(a, smem, [] { return static_cast<const int32_t*>(nullptr); }, [](int) {});
}

// ---- down -------------------------------------------------------------------------------

struct DownPlan {
  MoeDecodeArgs m;
  int rows_block;     // RB: output rows per block (a multiple of kDownTile)
  int lanes_row;      // lanes per routed row (power of two >= inter / 128)
  int rows_lane;      // routed rows a lane takes per pass (1 or 2)
  int row_bytes;      // bytes of one routed w2 row
  int stages, stage_bytes;
  // Dynamic shared memory, byte offsets:
  int o_xh, o_xl;  // shared act as f16 hi / lo [T, inter + 8]
  int o_xi;        // [T, inter / 64]
  int o_red;       // shared partials [RB / 16 tiles, kWarps, 4, 32] f32
  int o_yr;        // routed outputs [T * k, RB] f32
  int o_ptr;       // w2 of each routed pair
  int o_scale;     // shared w2 block scales per 64-column step [scale rows of the block, inter / 64] f32
  int o_bar, o_ring;
};

// Every warp takes an even share of the block's shared-expert units (16 rows x
// 64 columns on tensor cores) and then of its routed passes (streamed through
// the warp's ring, whose first stages are in flight during the FP8 work), so
// warps finish together whatever the mix of formats.
// The down launch's work for one block (which must own rows: blockIdx.x *
// rows_block < D). ids / route_w: the picks and their weights (global, or the
// fused launch's shared-memory copies). In the fused launch the acts are not
// complete when the body starts: the weight copies and the shared expert's
// first loads go out, then wait() returns once every block's up work is
// visible, and only then are the acts read.
template <Fmt F, bool kExact, bool kFused, class Wait, class Mark>
__device__ __forceinline__ void down_body(const DownPlan& a, uint8_t* smem, const int32_t* ids, const float* route_w,
                                          Wait wait, Mark mark) {
  const MoeDecodeArgs& m = a.m;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int D = int(m.D), inter = int(m.inter), T = int(m.T), k = m.k, n_routed = T * k;
  const int d0 = int(blockIdx.x) * a.rows_block, RB = min(a.rows_block, D - d0), tiles = RB / kDownTile;
  const int nkb = inter / 64, ld = inter + 8;

  // Routed passes (pair p, rows d0 + q * P .. + P), pair-major; warp w takes a
  // contiguous range.
  const int U2 = a.lanes_row, P0 = 32 / U2, RL = a.rows_lane, P = P0 * RL, ppp = RB / P, n_rp = n_routed * ppp;
  const int s0 = int(int64_t(warp) * n_rp / kWarps);
  const int n_steps = int(int64_t(warp + 1) * n_rp / kWarps) - s0;
  const int q = lane / U2, u = lane % U2, sb = u >> 1, h = u & 1;
  const bool active = u < inter / 128;
  // Loads from global memory go out before the block's bulk copies, which
  // would queue them behind ~170 KB per SM of weights: the act of this warp's
  // first pair (q16, written by the up launch), an L1 prefetch of its last
  // pair's where that differs (at T = 1 a warp meets at most two pairs), and
  // the first added value of this thread's
  // epilogue (the route weights through L1).
  moe_fast::XUnit x;
  const int first_p = n_steps > 0 ? s0 / ppp : -1, last_p = n_steps > 0 ? (s0 + n_steps - 1) / ppp : -1;
  auto act_of = [&](int p) { return reinterpret_cast<const uint8_t*>(m.act) + int64_t(p) * inter * 4; };
  auto load_acts = [&]() {
    if (first_p >= 0 && active) {
      const uint8_t* base = act_of(first_p);
      moe_fast::load_xunit<F>(base, reinterpret_cast<const float*>(base + inter),
                              reinterpret_cast<const float*>(base + inter + inter / 4), u, x);
    }
    if (last_p != first_p && active) {
      const uint8_t* base = act_of(last_p);
      moe_fast::prefetch_l1(base + 128 * u);
      moe_fast::prefetch_l1(base + inter + 32 * u);
      moe_fast::prefetch_l1(base + inter + inter / 4 + 32 * u);
    }
  };
  if constexpr (!kFused) load_acts();
  const float add0 = m.add != nullptr && int(threadIdx.x) < T * RB
                         ? m.add[int64_t(int(threadIdx.x) / RB) * D + d0 + int(threadIdx.x) % RB]
                         : 0.0f;
  if (!kFused && threadIdx.x == 0 && n_routed > 0) moe_fast::prefetch_l1(route_w);

  const uint8_t** ptr = reinterpret_cast<const uint8_t**>(smem + a.o_ptr);
  for (int p = threadIdx.x; p < n_routed; p += blockDim.x)
    ptr[p] = m.pair_w2 != nullptr ? m.pair_w2[p] : m.slots[ids[p]].w2.weight;
  float* red = reinterpret_cast<float*>(smem + a.o_red);
  if (m.shared_slot)  // warps with no unit of a tile leave its slots at zero
    for (int e = threadIdx.x; e < tiles * kWarps * kRedSlot; e += blockDim.x) red[e] = 0.0f;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + a.o_bar) + warp * kMaxStages;
  if (n_routed > 0 && lane == 0) {
    for (int st = 0; st < a.stages; ++st) moe_fast::mbar_init(bars + st, 1);
    moe_fast::mbar_init_fence();
  }
  __syncthreads();
  mark(8);

  const int64_t rbytes = a.row_bytes, len = int64_t(P) * rbytes;
  const int ring0 = a.o_ring + warp * a.stages * a.stage_bytes;
  int pp = s0 / ppp, pq = s0 % ppp;  // lane 0's cursor: the next pass to issue
  auto issue = [&](int slot) {
    const moe_fast::Span16 sp = moe_fast::span16(ptr[pp] + (int64_t(d0) + pq * P) * rbytes, len);
    moe_fast::mbar_expect_tx(bars + slot, sp.bytes);
    moe_fast::bulk_g2s(smem + ring0 + slot * a.stage_bytes, sp.base, sp.bytes, bars + slot);
    if (++pq == ppp) pq = 0, ++pp;
  };
  auto issue_first = [&]() {
    if (lane == 0)
      for (int i = 0; i < min(n_steps, a.stages); ++i) issue(i);
  };
  // Fused: after the shared expert's first loads and scales (which would
  // otherwise queue behind these copies and the block's barrier wait).
  if constexpr (!kFused) issue_first();

  // Shared units (tile, kb), tile-major; warp w takes a contiguous range. A rows
  // g and g + 8 are output rows d0 + tile * 16 + g (+ 8).
  const int n_fu = m.shared_slot ? tiles * nkb : 0;
  const int f0 = int(int64_t(warp) * n_fu / kWarps);
  const int nf = int(int64_t(warp + 1) * n_fu / kWarps) - f0;
  DeviceLinear w2s{};
  if (m.shared_slot) w2s = m.shared_slot->w2;  // a register copy (see the up kernel)
  // The lane's pointer advances 64 bytes a unit; after the last column it
  // lands on the next tile's row (16 rows down, back to column 0).
  const uint8_t* pw = w2s.weight + (int64_t(d0) + (f0 / nkb) * kDownTile + g) * inter + int64_t(f0 % nkb) * 64 + 16 * c;
  int pkb = f0 % nkb;
  const int64_t tile_jump = int64_t(kDownTile) * inter - int64_t(nkb) * 64;
  auto load = [&](uint4 (&b)[2]) {
    b[0] = ld_stream16(pw);
    b[1] = ld_stream16(pw + 8 * int64_t(inter));
    pw += 64;
    if (++pkb == nkb) pkb = 0, pw += tile_jump;
  };
  uint4 buf[kDepth][2];
#pragma unroll
  for (int d = 0; d < kDepth; ++d)
    if (d < nf) load(buf[d]);

  __half* xh = reinterpret_cast<__half*>(smem + a.o_xh);
  __half* xl = reinterpret_cast<__half*>(smem + a.o_xl);
  float* xi = reinterpret_cast<float*>(smem + a.o_xi);
  float* stab = reinterpret_cast<float*>(smem + a.o_scale);
  const int sr0 = m.shared_slot ? d0 / w2s.block : 0;
  auto stage_shared_act = [&]() {
    if (m.shared_slot)
      moe_fast::stage_f16_pairs<kExact>(m.act + int64_t(n_routed) * inter, inter, T, inter, xh, xl, ld, xi);
  };
  auto stage_scales = [&]() {
    if (m.shared_slot) scale_table(w2s, sr0, (RB - 1) / w2s.block + 2, nkb, stab);
  };
  if constexpr (kFused) {
    stage_scales();
    issue_first();
    mark(9);
    wait();
    mark(10);
    load_acts();
    stage_shared_act();
  } else {
    stage_shared_act();
    stage_scales();
  }
  __syncthreads();
  mark(11);

  float* yr = reinterpret_cast<float*>(smem + a.o_yr);
  {
    const int64_t lane_off = int64_t(q) * rbytes + sb * kBlockBytes<F>;
    int cp = s0 / ppp, cq = s0 % ppp, cur_p = first_p, slot = 0;
    uint32_t parity = 0;
    for (int i = 0; i < n_steps; ++i) {
      if (cp != cur_p) {  // warp-uniform; the pair's act is q16 written by the up launch
        cur_p = cp;
        if (active) {
          const uint8_t* base = act_of(cp);
          moe_fast::load_xunit<F>(base, reinterpret_cast<const float*>(base + inter),
                                  reinterpret_cast<const float*>(base + inter + inter / 4), u, x);
        }
      }
      const uint32_t skew = uint32_t(reinterpret_cast<uintptr_t>(ptr[cp] + (int64_t(d0) + cq * P) * rbytes) & 15u);
      const uint8_t* st = smem + ring0 + slot * a.stage_bytes;  // shared-space loads
      moe_fast::mbar_wait(bars + slot, parity);
      float y[2] = {0.0f, 0.0f};  // rows q and q + P0 of the pass
      if (active) {
#pragma unroll
        for (int r = 0; r < 2; ++r)
          if (r < RL) y[r] = unit_dot<F>(st + skew + lane_off + r * P0 * rbytes, h, x, nullptr, nullptr);
      }
      __syncwarp();  // reads of the buffer are done (see the up kernel)
      if (lane == 0 && i + a.stages < n_steps) issue(slot);
      for (int o = U2 / 2; o > 0; o >>= 1) {
#pragma unroll
        for (int r = 0; r < 2; ++r) y[r] += __shfl_xor_sync(0xffffffffu, y[r], o);
      }
      if (u == 0) {
#pragma unroll
        for (int r = 0; r < 2; ++r)
          if (r < RL) yr[cp * a.rows_block + cq * P + r * P0 + q] = y[r];
      }
      if (++cq == ppp) cq = 0, ++cp;
      if (++slot == a.stages) slot = 0, parity ^= 1u;
    }
  }
  mark(12);
  // Shared expert last: its first loads were issued before staging and have landed.
  if (nf > 0) {
    const int tb = min(g, T - 1), tc0 = min(2 * c, T - 1), tc1 = min(2 * c + 1, T - 1);
    const __half* xh_l = xh + tb * ld + 16 * c;
    const __half* xl_l = xl + tb * ld + 16 * c;
    const float* xi0 = xi + tc0 * nkb;
    const float* xi1 = xi + tc1 * nkb;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int tile = f0 / nkb, kb = f0 % nkb;
    int srow = ((d0 + tile * kDownTile) / w2s.block - sr0) * nkb;
    for (int i0 = 0; i0 < nf; i0 += kDepth) {
#pragma unroll
      for (int d = 0; d < kDepth; ++d) {
        if (i0 + d < nf) {
          float cb[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          moe_fast::fp8_step<kExact>(buf[d][0], buf[d][1], xh_l + kb * 64, xl_l + kb * 64, cb);
          if (i0 + d + kDepth < nf) load(buf[d]);
          const float ws = stab[srow + kb];
          const float x0 = ws * xi0[kb], x1 = ws * xi1[kb];
          acc[0] = fmaf(cb[0], x0, acc[0]);
          acc[1] = fmaf(cb[1], x1, acc[1]);
          acc[2] = fmaf(cb[2], x0, acc[2]);
          acc[3] = fmaf(cb[3], x1, acc[3]);
          if (++kb == nkb || i0 + d + 1 == nf) {  // tile (or this warp's share of it) done
#pragma unroll
            for (int r = 0; r < 4; ++r) red[((tile * kWarps + warp) * 4 + r) * 32 + lane] = acc[r], acc[r] = 0.0f;
            if (kb == nkb) {
              kb = 0, ++tile;
              srow = ((d0 + tile * kDownTile) / w2s.block - sr0) * nkb;
            }
          }
        }
      }
    }
  }

  __syncthreads();
  mark(13);

  // out[t, d] = sum_j route_w[t, j] * y_j (j in order) + shared (warps' parts in order).
  for (int e = threadIdx.x; e < T * RB; e += blockDim.x) {
    const int t = e / RB, i = e % RB;
    float v = 0.0f;
    for (int j = 0; j < k; ++j) v = fmaf(route_w[t * k + j], yr[(t * k + j) * a.rows_block + i], v);
    if (m.shared_slot) {
      const int tile = i / kDownTile, ii = i % kDownTile;
      const int l = (ii & 7) * 4 + t / 2, r = (ii >> 3) * 2 + (t & 1);
      float sh = 0.0f;
      for (int w = 0; w < kWarps; ++w) sh += red[((tile * kWarps + w) * 4 + r) * 32 + l];
      v += sh;
    }
    if (m.add) v += e == int(threadIdx.x) ? add0 : m.add[int64_t(t) * D + d0 + i];
    m.out[int64_t(t) * D + d0 + i] = v;
  }
}

template <Fmt F, bool kExact>
__global__ void __launch_bounds__(kThreads, 1) moe_down_fast_sm90(DownPlan a) {
  extern __shared__ __align__(128) uint8_t smem[];
  down_body<F, kExact, false>(a, smem, a.m.ids, a.m.route_w, [] {}, [](int) {});
}

// ---- fused: router, shared expert, routed up and down in one launch ---------------------
//
// One block per SM, all resident (the grid is the SM count and each block
// takes most of an SM's shared memory). Two grid barriers order the phases,
// and each block does useful work between arriving and waiting:
//   1. the gate: each block its ~E / grid rows (kGateSplit warps a row, the
//      router launch's slices, so the logits are the same bits); arrive;
//   2. the shared expert's up tiles (no routing needed), their act written;
//   3. wait for every block's logits; every block picks the experts itself
//      (warp 0, route_token: the same picks everywhere) and block 0 writes
//      them out; the routed up jobs, their acts written; arrive;
//   4. the down's weight copies and the shared expert's first w2 loads go
//      out, then the wait for every block's acts; the down as the down launch.
// Against router + up + down launches (and the shared expert beside them on
// half the SMs), this pays one launch's ramp and drain instead of three, and
// the router's latency is spent streaming the shared expert.

struct FusedPlan {
  UpPlan up;
  DownPlan down;
  RouterArgs r;           // T = 1; r.logits, r.ids, r.weights written
  const uint8_t* gate;    // [E, D] BF16 (gate_bf16) or F32
  bool gate_bf16;
  HcCombJob job;          // a deferred mHC comb, finished by the last block, or none
  unsigned* sync;         // [3], zero between launches: gate arrivals, up arrivals, departures
  int f_base;             // byte offset of the fused region (after the up and down layouts)
  unsigned long long* stamps;  // [grid, kFusedStamps] phase times (ns) for tuning, or null
};

constexpr int kFusedStamps = 15;
__device__ __forceinline__ void fused_stamp(const FusedPlan& f, int i) {
  if (f.stamps != nullptr && threadIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    f.stamps[blockIdx.x * kFusedStamps + i] = t;
  }
}

constexpr int kFusedPart = 64;  // gate slice sums a block keeps: rows per block x kGateSplit

template <bool kBf16>
__device__ __forceinline__ void fused_gate(const FusedPlan& f, float* part) {
  const RouterArgs& r = f.r;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int nb = int(gridDim.x);
  const int e0 = int(int64_t(blockIdx.x) * r.E / nb), e1 = int(int64_t(blockIdx.x + 1) * r.E / nb);
  const int64_t D = f.up.m.D;
  for (int rr = warp / kGateSplit; e0 + rr < e1; rr += kWarps / kGateSplit) {  // warp-uniform
    GateSlice<kBf16> gs(f.gate, D, e0 + rr, true, warp % kGateSplit);
    gs.prefetch(lane);
    float acc[kGateMaxT];
    gs.dot(f.up.m.x, D, 1, lane, acc);
    if (lane == 0) part[rr * kGateSplit + warp % kGateSplit] = acc[0];
  }
  __syncthreads();
  if (int(threadIdx.x) < e1 - e0) {
    float v = 0.0f;
#pragma unroll
    for (int q = 0; q < kGateSplit; ++q) v += part[threadIdx.x * kGateSplit + q];
    r.logits[e0 + int(threadIdx.x)] = v;
  }
}

template <Fmt FU, Fmt FD, bool kExact>
__global__ void __launch_bounds__(kThreads, 1) moe_fused_sm90(FusedPlan f) {
  extern __shared__ __align__(128) uint8_t smem[];
  const RouterArgs& r = f.r;
  float* part = reinterpret_cast<float*>(smem + f.f_base);
  float* lg = part + kFusedPart;
  float* sc = lg + r.E;
  float* biased = sc + r.E;
  int32_t* sel = reinterpret_cast<int32_t*>(biased + r.E);
  int32_t* ids = sel + 32;
  float* w = reinterpret_cast<float*>(ids + 32);
  const unsigned nb = gridDim.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  fused_stamp(f, 0);
  // The shared expert's up tiles need no routing: their bytes start moving now
  // (one bulk copy per row), and land while the gate and its barrier run.
  {
    const UpPlan& u = f.up;
    const int bsh = int(blockIdx.x) - u.shared_first;
    if (threadIdx.x == 0 && bsh >= 0 && bsh < u.shared_blocks) {
      const int t0 = int(int64_t(bsh) * u.tiles / u.shared_blocks);
      const int t1 = int(int64_t(bsh + 1) * u.tiles / u.shared_blocks);
      const int64_t D = u.m.D, rows = int64_t(t1 - t0) * kUpTile, sld = D + kStagePad;
      uint64_t* bar = reinterpret_cast<uint64_t*>(smem + u.s_sbar);
      moe_fast::mbar_init(bar, 1);
      moe_fast::mbar_init_fence();
      moe_fast::mbar_expect_tx(bar, uint32_t(2 * rows * D));
      const uint8_t* w1 = u.m.shared_slot->w1.weight + int64_t(t0) * kUpTile * D;
      const uint8_t* w3 = u.m.shared_slot->w3.weight + int64_t(t0) * kUpTile * D;
      uint8_t* dst = smem + u.s_stage;
      for (int64_t r = 0; r < rows; ++r) {
        moe_fast::bulk_g2s(dst + r * sld, w1 + r * D, uint32_t(D), bar);
        moe_fast::bulk_g2s(dst + (rows + r) * sld, w3 + r * D, uint32_t(D), bar);
      }
    }
  }

  if (f.gate_bf16) fused_gate<true>(f, part);
  else fused_gate<false>(f, part);
  grid_arrive(f.sync);
  fused_stamp(f, 1);

  auto route = [&]() -> const int32_t* {
    grid_wait(f.sync, nb);
    if (warp == 0) {
      for (int i = lane; i < r.E; i += 32) lg[i] = __ldcg(r.logits + i);
      __syncwarp();
      route_token(r, 0, lg, sc, biased, sel, ids, w);
      __syncwarp();
      if (blockIdx.x == 0 && lane < r.k) r.ids[lane] = ids[lane], r.weights[lane] = w[lane];
    }
    __syncthreads();
    fused_stamp(f, 4);
    return ids;
  };
  auto mark = [&](int i) { fused_stamp(f, i); };
  up_body<FU, kExact, true>(f.up, smem, route, mark);
  fused_stamp(f, 7);
  grid_arrive(f.sync + 1);

  // The comb's Sinkhorn (only the next mHC site reads it) while the acts complete.
  if (f.job.comb != nullptr && blockIdx.x == nb - 1 && warp == 0) hc_comb_job_run(f.job);
  if (int64_t(blockIdx.x) * f.down.rows_block < f.down.m.D)
    down_body<FD, kExact, true>(f.down, smem, ids, w, [&] { grid_wait(f.sync + 1, nb); }, mark);

  // Every block is past both waits once all have left: the last resets the counters.
  __syncthreads();
  fused_stamp(f, 14);
  if (threadIdx.x == 0 && atomicAdd(f.sync + 2, 1u) == nb - 1) f.sync[0] = 0u, f.sync[1] = 0u, f.sync[2] = 0u;
}

// ---- host -------------------------------------------------------------------------------

bool fmt_of(int ggml_type, Fmt& f) {
  switch (quant::GgmlType(ggml_type)) {
    case quant::GgmlType::kQ2_K: f = Fmt::kQ2_K; return true;
    case quant::GgmlType::kQ3_K: f = Fmt::kQ3_K; return true;
    case quant::GgmlType::kIQ2_XXS: f = Fmt::kIQ2_XXS; return true;
    default: return false;
  }
}

int block_bytes(Fmt f) { return f == Fmt::kQ2_K ? 84 : f == Fmt::kQ3_K ? 110 : 66; }

// Relative time per weight byte: IQ2_XXS decodes (two table reads and a sign
// mask per 8 weights) take more instructions per byte than a ring delivers
// bytes, so its blocks get proportionally less work.
double fmt_weight(Fmt f) { return f == Fmt::kIQ2_XXS ? 1.6 : 1.0; }

int pow2_at_least(int v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

// Two rows per lane halve the per-row costs of a pass (ring wait, copy issue,
// reductions, SwiGLU) while a pass stays within a 16-row job / tile.
int rows_lane_for(int lanes_row) { return 32 / lanes_row <= 8 ? 2 : 1; }

// Each routed stage holds `copies` widened row ranges plus one word of
// over-read (the Q3_K / IQ2_XXS lanes read aligned words around their data).
int stage_bytes_for(int64_t rows_bytes, int copies) { return int(align_up(copies * (rows_bytes + 32) + 16, 128)); }

// Shared memory of the up kernel's two kinds of work for a block that does
// `tiles_pb` shared tiles and `jobs_pb` routed jobs; the ring gets what is left
// (at least 2 stages, or the plan is refused). Routed and shared regions sit
// side by side in mixed plans and overlap in split plans (a block does one kind).
bool up_layout(const MoeDecodeArgs& m, Fmt f, int64_t tiles_pb, int64_t jobs_pb, bool overlap, UpPlan& a,
               int64_t& smem, int64_t limit) {
  const int64_t T = m.T, D = m.D, inter = m.inter;
  int64_t o = 0, shared_end = 0;
  if (tiles_pb > 0) {
    a.s_xh = int(o), o += align_up(T * (D + 8) * 2, 128);
    a.s_xl = int(o), o += align_up(T * (D + 8) * 2, 128);
    a.s_xi = int(o), o += align_up(T * (D / 64) * 4, 128);
    a.s_srows = int(tiles_pb * kUpTile / m.shared_fp8_block + 2);
    a.s_scale = int(o), o += align_up(2 * int64_t(a.s_srows) * (D / 64) * 4, 128);
    a.s_red = int(o), o += align_up(tiles_pb * kWarps * kRedSlot * 4, 128);
    shared_end = o;
  }
  if (overlap) o = 0;
  smem = shared_end;
  if (jobs_pb > 0) {
    const int P = 32 / a.lanes_row * a.rows_lane;
    a.r_x = int(o), o += align_up(T * moe_fast::q16_bytes(D), 128);
    a.r_tab = int(o), o += f == Fmt::kIQ2_XXS ? moe_fast::kIq2TableBytes : 0;
    a.r_sw = int(o), o += align_up(jobs_pb * kJobRows * 4, 128);
    a.r_ptr = int(o), o += align_up((jobs_pb / (inter / kJobRows) + 2) * int64_t(sizeof(PairRows)), 128);
    a.r_bar = int(o), o += kWarps * kMaxStages * 8;
    a.r_ring = int(o);
    a.stage_bytes = stage_bytes_for(P * a.row_bytes, 2);
    a.stages = int(std::min<int64_t>(kMaxStages, (limit - o) / (int64_t(kWarps) * a.stage_bytes)));
    if (a.stages < 2) return false;
    smem = std::max(smem, o + int64_t(kWarps) * a.stages * a.stage_bytes);
  }
  return smem <= limit;
}

// limit: the shared memory the plan may use (the fused launch keeps some).
bool plan_up(const MoeDecodeArgs& m, int sms, UpPlan& a, int64_t& smem, int& blocks, int64_t limit = kSmemMax) {
  a = UpPlan{};
  a.m = m;
  if (sms < 2) return false;
  const int64_t T = m.T, D = m.D, inter = m.inter;
  const int64_t jobs = T * m.k * (inter / kJobRows), tiles = m.shared_slot ? inter / kUpTile : 0;
  Fmt f = Fmt::kQ2_K;
  if (m.k > 0 && !fmt_of(m.routed_ggml_up, f)) return false;
  const int64_t rb = D / 256 * block_bytes(f);
  a.jobs = int(jobs), a.tiles = int(tiles);
  a.lanes_row = pow2_at_least(int(D / 128));
  a.rows_lane = rows_lane_for(a.lanes_row);
  a.row_bytes = int(rb);
  auto ceil_div = [](int64_t x, int64_t y) { return (x + y - 1) / y; };
  // Mixed: every block a share of both (when both fit in one block's shared memory).
  {
    const int g = int(std::min<int64_t>(sms, std::max(jobs, tiles)));
    UpPlan t = a;
    t.shared_first = 0, t.shared_blocks = int(std::min<int64_t>(g, tiles));
    t.routed_first = 0, t.routed_blocks = int(std::min<int64_t>(g, jobs));
    const int64_t tpb = t.shared_blocks ? ceil_div(tiles, t.shared_blocks) : 0;
    const int64_t jpb = t.routed_blocks ? ceil_div(jobs, t.routed_blocks) : 0;
    if (up_layout(m, f, tpb, jpb, false, t, smem, limit)) {
      a = t, blocks = g;
      return true;
    }
  }
  // Split: blocks [0, bs) shared, the rest routed, sized so both finish together
  // (costs in bytes, weighted for the instruction-heavy formats).
  if (jobs == 0 || tiles == 0) return false;  // one kind of work always fits in the mixed plan
  const double cr = double(kJobRows) * 2.0 * double(rb) * fmt_weight(f), cs = double(kUpTile) * 2.0 * double(D);
  int bs = 0;
  double best = 0.0;
  for (int b = 1; b < sms; ++b) {
    UpPlan t = a;
    int64_t sm = 0;
    if (!up_layout(m, f, ceil_div(tiles, b), ceil_div(jobs, sms - b), true, t, sm, limit)) continue;
    const double c = std::max(double(ceil_div(tiles, b)) * cs, double(ceil_div(jobs, sms - b)) * cr);
    if (bs == 0 || c < best) best = c, bs = b;
  }
  if (bs == 0) return false;
  const int br = int(std::min<int64_t>(sms - bs, jobs));
  bs = int(std::min<int64_t>(bs, tiles));
  a.shared_first = 0, a.shared_blocks = bs, a.routed_first = bs, a.routed_blocks = br;
  blocks = bs + br;
  return up_layout(m, f, ceil_div(tiles, bs), ceil_div(jobs, br), true, a, smem, limit);
}

bool plan_down(const MoeDecodeArgs& m, int sms, DownPlan& a, int64_t& smem, int& blocks, int64_t limit = kSmemMax) {
  a = DownPlan{};
  a.m = m;
  const int64_t T = m.T, D = m.D, inter = m.inter, n_routed = T * m.k;
  Fmt f = Fmt::kQ2_K;
  if (m.k > 0 && (!fmt_of(m.routed_ggml_down, f) || f == Fmt::kIQ2_XXS)) return false;
  const int64_t tiles16 = D / kDownTile, tpb = (tiles16 + sms - 1) / sms;
  a.rows_block = int(tpb * kDownTile);
  blocks = int((tiles16 + tpb - 1) / tpb);
  const int64_t rb = inter / 256 * block_bytes(f);
  a.row_bytes = int(rb);
  a.lanes_row = pow2_at_least(int(inter / 128));
  a.rows_lane = rows_lane_for(a.lanes_row);
  const int P = 32 / a.lanes_row * a.rows_lane;
  int64_t o = 0;
  const int64_t xrows = m.shared_slot ? T : 0;
  a.o_xh = int(o), o += align_up(xrows * (inter + 8) * 2, 128);
  a.o_xl = int(o), o += align_up(xrows * (inter + 8) * 2, 128);
  a.o_xi = int(o), o += align_up(xrows * (inter / 64) * 4, 128);
  a.o_red = int(o), o += m.shared_slot ? align_up(tpb * kWarps * kRedSlot * 4, 128) : 0;
  a.o_yr = int(o), o += align_up(n_routed * a.rows_block * 4, 128);
  a.o_ptr = int(o), o += align_up(n_routed * 8, 128);
  a.o_scale = int(o), o += m.shared_slot ? align_up(((a.rows_block - 1) / m.shared_fp8_block + 2) * (inter / 64) * 4, 128) : 0;
  a.o_bar = int(o), o += kWarps * kMaxStages * 8;
  a.o_ring = int(o);
  a.stage_bytes = stage_bytes_for(P * rb, 1);
  a.stages = n_routed > 0 ? int(std::min<int64_t>(kMaxStages, (limit - o) / (int64_t(kWarps) * a.stage_bytes))) : 0;
  if (n_routed > 0 && a.stages < 2) return false;
  smem = o + int64_t(kWarps) * a.stages * a.stage_bytes;
  return smem <= limit;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Fused region bytes: slice sums, logits, scores, biased scores [E] each,
// then sel, ids, weights [32] each.
// The last 128 bytes hold the shared tiles' staging barrier.
int64_t fused_region_bytes(int E) { return align_up((kFusedPart + 3 * int64_t(E)) * 4 + 3 * 32 * 4, 128) + 128; }

bool plan_fused(const MoeDecodeArgs& m, const RouterArgs& r, const DeviceLinear& gate, int sms, FusedPlan& f,
                int64_t& smem) {
  f = FusedPlan{};
  if (m.T != 1 || r.T != 1 || m.k < 1 || m.k > 32 || r.k != m.k) return false;
  if (m.shared_slot == nullptr || m.add != nullptr) return false;
  const bool bf16 = gate.format == DevFormat::kBF16;
  if (!bf16 && gate.format != DevFormat::kF32) return false;
  if (gate.out != r.E || gate.in != m.D || gate.in % ((bf16 ? 8 : 4) * 32) != 0) return false;
  if (!aligned16(gate.weight)) return false;
  if (r.E < m.k || (int64_t(r.E) + sms - 1) / sms * kGateSplit > kFusedPart) return false;
  Fmt fu = Fmt::kQ2_K, fd = Fmt::kQ2_K;
  if (!fmt_of(m.routed_ggml_up, fu) || !fmt_of(m.routed_ggml_down, fd)) return false;
  if (!((fu == Fmt::kQ2_K && fd == Fmt::kQ3_K) || (fu == Fmt::kIQ2_XXS && fd == Fmt::kQ2_K))) return false;
  const int64_t fb = fused_region_bytes(r.E), limit = kSmemMax - fb;
  int64_t su = 0, sd = 0;
  int bu = 0, bd = 0;
  MoeDecodeArgs mm = m;
  mm.pair_w2 = nullptr, mm.max_sms = 0;
  if (!plan_up(mm, sms, f.up, su, bu, limit) || !plan_down(mm, sms, f.down, sd, bd, limit)) return false;
  if (bu > sms || bd > sms) return false;
  f.r = r, f.gate = gate.weight, f.gate_bf16 = bf16;
  f.f_base = int(align_up(std::max(su, sd), 128));
  smem = f.f_base + fb;
  // The shared tiles' staging: in the routed ring (free until the picks), or
  // after the routed regions when the block has no routed jobs.
  const UpPlan& u = f.up;
  if (u.shared_blocks > 0) {
    const int64_t tpb = (u.tiles + u.shared_blocks - 1) / u.shared_blocks;
    const int64_t stage = 2 * tpb * kUpTile * (m.D + kStagePad);
    const int64_t ring = u.routed_blocks > 0 ? int64_t(kWarps) * u.stages * u.stage_bytes : 0;
    if (u.routed_blocks == 0 || u.routed_first != u.shared_first || stage > ring) return false;
    f.up.s_stage = u.r_ring;
    f.up.s_sbar = f.f_base + int(fb) - 128;  // the fused region's last 128 bytes
  }
  return smem <= kSmemMax;
}

using UpKernel = void (*)(UpPlan);
using DownKernel = void (*)(DownPlan);

UpKernel up_kernel(Fmt f, bool exact) {
  switch (f) {
    case Fmt::kQ2_K: return exact ? moe_up_fast_sm90<Fmt::kQ2_K, true> : moe_up_fast_sm90<Fmt::kQ2_K, false>;
    case Fmt::kQ3_K: return exact ? moe_up_fast_sm90<Fmt::kQ3_K, true> : moe_up_fast_sm90<Fmt::kQ3_K, false>;
    case Fmt::kIQ2_XXS: return exact ? moe_up_fast_sm90<Fmt::kIQ2_XXS, true> : moe_up_fast_sm90<Fmt::kIQ2_XXS, false>;
  }
  return nullptr;
}

DownKernel down_kernel(Fmt f, bool exact) {
  if (f == Fmt::kQ3_K) return exact ? moe_down_fast_sm90<Fmt::kQ3_K, true> : moe_down_fast_sm90<Fmt::kQ3_K, false>;
  return exact ? moe_down_fast_sm90<Fmt::kQ2_K, true> : moe_down_fast_sm90<Fmt::kQ2_K, false>;
}

using FusedKernel = void (*)(FusedPlan);

FusedKernel fused_kernel(Fmt fu, bool exact) {  // (fu, fd): (Q2_K, Q3_K) or (IQ2_XXS, Q2_K), as plan_fused allows
  if (fu == Fmt::kIQ2_XXS)
    return exact ? moe_fused_sm90<Fmt::kIQ2_XXS, Fmt::kQ2_K, true> : moe_fused_sm90<Fmt::kIQ2_XXS, Fmt::kQ2_K, false>;
  return exact ? moe_fused_sm90<Fmt::kQ2_K, Fmt::kQ3_K, true> : moe_fused_sm90<Fmt::kQ2_K, Fmt::kQ3_K, false>;
}

Status allow_smem(const void* kernel) { return raise_smem_limit(kernel, int(kSmemMax)); }

// SMs a launch spreads over: all, or max_sms when set.
int sms_for(const MoeDecodeArgs& m) {
  const int sms = current_device_multiprocessors();
  return m.max_sms > 0 ? std::min(sms, m.max_sms) : sms;
}

}  // namespace

bool moe_fast_supported(const MoeDecodeArgs& m) {
  if (m.T < 1 || m.T > kMoeFastMaxTokens) return false;
  if (m.D % 256 != 0 || m.inter % 256 != 0 || m.D > 4096 || m.inter > 4096) return false;
  if (m.k == 0 && !m.shared_slot) return false;
  if (m.k > 0 && m.routed_format != DevFormat::kGgml) return false;
  if (m.shared_slot && (m.shared_format != DevFormat::kFP8Block || m.shared_fp8_block <= 0 ||
                        m.shared_fp8_block % 64 != 0))
    return false;
  if (!aligned16(m.x) || !aligned16(m.act)) return false;
  const int sms = sms_for(m);
  UpPlan u;
  DownPlan d;
  int64_t su = 0, sd = 0;
  int bu = 0, bd = 0;
  return plan_up(m, sms, u, su, bu) && plan_down(m, sms, d, sd, bd);
}

Status moe_fast_up(const MoeDecodeArgs& m, cudaStream_t stream) {
  UpPlan a;
  int64_t smem = 0;
  int blocks = 0;
  if (!plan_up(m, sms_for(m), a, smem, blocks)) return internal_error("moe_fast_up: unsupported");
  Fmt f = Fmt::kQ2_K;
  if (m.k > 0) fmt_of(m.routed_ggml_up, f);
  const UpKernel kernel = up_kernel(f, mma_precision() != MmaPrecision::kBf16);
  AFF_RETURN_IF_ERROR(allow_smem(reinterpret_cast<const void*>(kernel)));
  kernel<<<unsigned(blocks), kThreads, size_t(smem), stream>>>(a);
  return launch_status("moe_up_fast_sm90");
}

Status moe_fast_down(const MoeDecodeArgs& m, cudaStream_t stream) {
  DownPlan a;
  int64_t smem = 0;
  int blocks = 0;
  if (!plan_down(m, sms_for(m), a, smem, blocks))
    return internal_error("moe_fast_down: unsupported");
  Fmt f = Fmt::kQ2_K;
  if (m.k > 0) fmt_of(m.routed_ggml_down, f);
  const DownKernel kernel = down_kernel(f, mma_precision() != MmaPrecision::kBf16);
  AFF_RETURN_IF_ERROR(allow_smem(reinterpret_cast<const void*>(kernel)));
  kernel<<<unsigned(blocks), kThreads, size_t(smem), stream>>>(a);
  return launch_status("moe_down_fast_sm90");
}

namespace {
unsigned long long* g_fused_stamps = nullptr;
}  // namespace

void moe_fused_set_stamps(unsigned long long* stamps) { g_fused_stamps = stamps; }

bool moe_fused_supported(const MoeDecodeArgs& m, const RouterArgs& r, const DeviceLinear& gate) {
  if (!moe_fast_supported(m)) return false;
  FusedPlan f;
  int64_t smem = 0;
  return plan_fused(m, r, gate, current_device_multiprocessors(), f, smem);
}

Status moe_fused(const MoeDecodeArgs& m, const RouterArgs& r, const DeviceLinear& gate, const HcCombJob& job,
                 unsigned* sync, cudaStream_t stream) {
  FusedPlan f;
  int64_t smem = 0;
  const int sms = current_device_multiprocessors();
  if (!moe_fast_supported(m) || !plan_fused(m, r, gate, sms, f, smem)) return internal_error("moe_fused: unsupported");
  if (sync == nullptr) return internal_error("moe_fused: no barrier counters");
  f.job = job, f.sync = sync, f.stamps = g_fused_stamps;
  Fmt fu = Fmt::kQ2_K;
  fmt_of(m.routed_ggml_up, fu);
  const FusedKernel kernel = fused_kernel(fu, mma_precision() != MmaPrecision::kBf16);
  AFF_RETURN_IF_ERROR(allow_smem(reinterpret_cast<const void*>(kernel)));
  kernel<<<unsigned(sms), kThreads, size_t(smem), stream>>>(f);
  return launch_status("moe_fused_sm90");
}

Status moe_fast_prepare() {
  for (Fmt f : {Fmt::kQ2_K, Fmt::kQ3_K, Fmt::kIQ2_XXS})
    for (bool exact : {true, false}) AFF_RETURN_IF_ERROR(allow_smem(reinterpret_cast<const void*>(up_kernel(f, exact))));
  for (Fmt f : {Fmt::kQ2_K, Fmt::kQ3_K})
    for (bool exact : {true, false})
      AFF_RETURN_IF_ERROR(allow_smem(reinterpret_cast<const void*>(down_kernel(f, exact))));
  for (Fmt f : {Fmt::kQ2_K, Fmt::kIQ2_XXS})
    for (bool exact : {true, false})
      AFF_RETURN_IF_ERROR(allow_smem(reinterpret_cast<const void*>(fused_kernel(f, exact))));
  return Status::ok();
}

}  // namespace aff::cuda
