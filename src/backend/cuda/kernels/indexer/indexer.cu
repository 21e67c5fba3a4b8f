// indexer_scores_mma_sm90: block = (key tile, group of 16 queries), 8 warps;
// the tile is 128 keys, or 32 when the chunk is one query group (decode).
// The key tile is converted to bf16 (hi + lo in kBf16x3) once; per query the
// 64 heads x tile dot products run on tensor cores (warp = 16 heads x half
// the tile), then ReLU, the head weights and the sum over heads are applied to the
// accumulators in registers (shuffles over the 8 rows a lane group holds,
// then the 4 head tiles summed in a fixed order). The same kernel serves
// decode (one query; the grid spans the key capacity, capped at a few
// blocks per SM that loop over their tiles) and prefill.
// indexer_topk_f32_sm90: one block per query: four 8-bit radix passes find
// the k-th largest key (bin search by one warp), then ids are compacted in id
// order. 1024 threads for short chunks (decode), 256 for long ones.
#include <algorithm>
#include <cfloat>

#include "backend/cuda/kernels/common/decode.cuh"
#include "backend/cuda/kernels/gemm/mma_bf16.cuh"
#include "backend/cuda/kernels/indexer/indexer.h"
#include "backend/cuda/kernels/rope/rope_pairs.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/device_info.h"
#include "backend/cuda/runtime/env_switch.h"
#include "backend/cuda/runtime/pdl.h"

namespace aff::cuda {
namespace {

constexpr int kThreads = 256;
// Keys per block: 128 amortise each query's staging over many keys (prefill);
// a decode step (one query group) takes 32, so 4x the blocks share its keys
// and each block's serial MMA chain is a quarter as long.
constexpr int kKeyTileLong = 128;
constexpr int kKeyTileShort = 32;
// Blocks per SM along the keys (the grid's cap): 4 keeps V4's 4K..64K
// positions at one tile per block with --kv-size 65536 (512 tiles).
constexpr int64_t kScoreBlocksPerSm = 4;
constexpr int kQueries = 16;  // queries per block: each key tile is converted once for them
constexpr int kHeads = 64;    // head rows (MMA M), zero-padded
constexpr int kMaxHd = 128;
constexpr int kLd = kMaxHd + 8;  // bf16 row stride: rows start 4 banks apart
constexpr size_t kMaxStagedBytes = 200 * 1024;  // top-k rows staged in shared memory up to this size

__device__ __forceinline__ int64_t n_visible(int64_t pos, int ratio, int64_t capacity) {
  const int64_t v = visible_entries(pos, ratio);
  return v < capacity ? v : capacity;
}

template <bool kSplit>
__device__ __forceinline__ void store4(uint16_t* hi, uint16_t* lo, float4 v) {
  uint16_t h[4], l[4];
  split_bf16(v.x, h[0], l[0]);
  split_bf16(v.y, h[1], l[1]);
  split_bf16(v.z, h[2], l[2]);
  split_bf16(v.w, h[3], l[3]);
  *reinterpret_cast<uint2*>(hi) = make_uint2(uint32_t(h[0]) | uint32_t(h[1]) << 16, uint32_t(h[2]) | uint32_t(h[3]) << 16);
  if (kSplit)
    *reinterpret_cast<uint2*>(lo) =
        make_uint2(uint32_t(l[0]) | uint32_t(l[1]) << 16, uint32_t(l[2]) | uint32_t(l[3]) << 16);
}

template <bool kSplit, int kKeyTile>
struct ScoreLayout {
  static constexpr int kParts = kSplit ? 2 : 1;
  static constexpr size_t k = 0;                                      // u16 [parts][kKeyTile][kLd]
  static constexpr size_t q = k + size_t(kParts) * kKeyTile * kLd * 2;  // u16 [parts][kHeads][kLd]
  static constexpr size_t w = q + size_t(kParts) * kHeads * kLd * 2;    // f32 [kHeads]
  static constexpr size_t red = w + kHeads * 4;                         // f32 [4][kKeyTile]
  static constexpr size_t bytes = red + 4 * kKeyTile * 4;
};

template <bool kSplit, int kKeyTile>
__global__ void __launch_bounds__(kThreads) indexer_scores_mma_sm90(IndexerScoreArgs a) {
  pdl_start();  // runtime/pdl.h: nothing in this kernel runs before the wait
  using L = ScoreLayout<kSplit, kKeyTile>;
  constexpr int kNj = kKeyTile / 16;  // 8-key n-tiles of a warp (its half of the tile)
  static_assert(kKeyTile % 16 == 0 && kKeyTile * kMaxHd / 4 % kThreads == 0 && kKeyTile <= kThreads,
                "a tile: whole 8-key n-tiles per warp half, whole float4 loads per thread, a thread per key");
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* k_s = reinterpret_cast<uint16_t*>(smem + L::k);
  uint16_t* q_s = reinterpret_cast<uint16_t*>(smem + L::q);
  float* w_s = reinterpret_cast<float*>(smem + L::w);
  float* red = reinterpret_cast<float*>(smem + L::red);

  const StepInfo step = *a.step;
  const int64_t t0 = int64_t(blockIdx.y) * kQueries;
  if (t0 >= step.T) return;
  const int64_t t_end = t0 + kQueries < step.T ? t0 + kQueries : step.T;
  const int64_t n_max = n_visible(step.pos0 + t_end - 1, a.ratio, a.capacity);  // the last query sees most
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  // Key tiles blockIdx.x, + gridDim.x, ... up to the visible ones: the grid is
  // sized from the capacity (a captured step replays at every position), but
  // capped, so a large --kv-size does not launch thousands of blocks that
  // only find their tile empty.
  for (int64_t key0 = int64_t(blockIdx.x) * kKeyTile; key0 < n_max; key0 += int64_t(gridDim.x) * kKeyTile) {

    // Every global load of the block goes out at once (the key tile, the first
    // query's rows and head weights), and the first RoPE table is computed while
    // they are in flight: each dependent round trip is ~1 us of a decode step's
    // critical path.
    constexpr int kKIters = kKeyTile * kMaxHd / 4 / kThreads;
    constexpr int kQIters = kHeads * kMaxHd / 4 / kThreads;
    float4 kv[kKIters];
#pragma unroll
    for (int i = 0; i < kKIters; ++i) {
      const int idx = threadIdx.x + i * kThreads, r = idx / (kMaxHd / 4), d = 4 * (idx % (kMaxHd / 4));
      kv[i] = key0 + r < n_max && d < a.hd ? __ldg(reinterpret_cast<const float4*>(a.keys + (key0 + r) * a.hd + d))
                                           : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    float4 qv[kQIters];
    float wv = 0.0f;
    auto load_q = [&](int64_t t) {
#pragma unroll
      for (int i = 0; i < kQIters; ++i) {
        const int idx = threadIdx.x + i * kThreads, r = idx / (kMaxHd / 4), d = 4 * (idx % (kMaxHd / 4));
        qv[i] = r < a.nh && d < a.hd ? __ldg(reinterpret_cast<const float4*>(a.q + ((t * a.nh + r) * a.hd + d)))
                                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
      wv = int(threadIdx.x) < a.nh ? a.w[t * a.nh + threadIdx.x] * a.w_scale : 0.0f;
    };
    load_q(t0);
    __shared__ __align__(16) float2 rope_tab[kMaxHd / 2];  // (cos, sin) per rope pair of the current token
    const int rope_off = a.hd - a.rope_dim;
    if (a.rope_freq != nullptr)
      rope_table_fill(rope_tab, step.pos0 + t0, a.rope_freq, a.rope_dim / 2, threadIdx.x, kThreads);
#pragma unroll
    for (int i = 0; i < kKIters; ++i) {
      const int idx = threadIdx.x + i * kThreads, r = idx / (kMaxHd / 4), d = 4 * (idx % (kMaxHd / 4));
      store4<kSplit>(k_s + r * kLd + d, k_s + kKeyTile * kLd + r * kLd + d, kv[i]);
    }
    const int k_steps = (a.hd + 15) / 16;
    const int mi = warp & 3, kh = warp >> 2;  // warp: heads [16 mi, +16) x keys [kKeyTile / 2 kh, + kKeyTile / 2)

    for (int64_t t = t0; t < t_end; ++t) {
      const int64_t n_vis = n_visible(step.pos0 + t, a.ratio, a.capacity);
      if (key0 >= n_vis) continue;  // uniform over the block
      if (t != t0) {
        // (the previous token's table and q_s were last read before this loop's later barriers)
        load_q(t);
        if (a.rope_freq != nullptr)
          rope_table_fill(rope_tab, step.pos0 + t, a.rope_freq, a.rope_dim / 2, threadIdx.x, kThreads);
      }
      if (a.rope_freq != nullptr) {  // the queries' RoPE, as qkv_finish applies it
        __syncthreads();
#pragma unroll
        for (int i = 0; i < kQIters; ++i) {
          const int idx = threadIdx.x + i * kThreads, d = 4 * (idx % (kMaxHd / 4));
          if (d < rope_off || d >= a.hd) continue;
          qv[i] = rope_rotate4(qv[i], reinterpret_cast<const float4*>(rope_tab)[(d - rope_off) / 4]);
        }
      }
#pragma unroll
      for (int i = 0; i < kQIters; ++i) {
        const int idx = threadIdx.x + i * kThreads, r = idx / (kMaxHd / 4), d = 4 * (idx % (kMaxHd / 4));
        store4<kSplit>(q_s + r * kLd + d, q_s + kHeads * kLd + r * kLd + d, qv[i]);
      }
      if (threadIdx.x < kHeads) w_s[threadIdx.x] = wv;
      __syncthreads();

      float acc[kNj][4];
#pragma unroll
      for (int j = 0; j < kNj; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
      for (int ks = 0; ks < k_steps; ++ks) {
        uint32_t ah[4], al[4];
        load_a_frag(ah, q_s, kLd, 16 * mi, 16 * ks, lane);
        if (kSplit) load_a_frag(al, q_s + kHeads * kLd, kLd, 16 * mi, 16 * ks, lane);
#pragma unroll
        for (int j = 0; j < kNj; ++j) {
          uint32_t b0, b1;
          load_b_frag_nk(b0, b1, k_s, kLd, kKeyTile / 2 * kh + 8 * j, 16 * ks, lane);
          mma_bf16_16816(acc[j], ah, b0, b1);
          if (kSplit) {
            mma_bf16_16816(acc[j], al, b0, b1);
            load_b_frag_nk(b0, b1, k_s + kKeyTile * kLd, kLd, kKeyTile / 2 * kh + 8 * j, 16 * ks, lane);
            mma_bf16_16816(acc[j], ah, b0, b1);
          }
        }
      }
      const float w_lo = w_s[16 * mi + g], w_hi = w_s[16 * mi + g + 8];
#pragma unroll
      for (int j = 0; j < kNj; ++j) {
        float s0 = fmaxf(acc[j][0], 0.0f) * w_lo + fmaxf(acc[j][2], 0.0f) * w_hi;
        float s1 = fmaxf(acc[j][1], 0.0f) * w_lo + fmaxf(acc[j][3], 0.0f) * w_hi;
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) {
          s0 += __shfl_xor_sync(0xffffffffu, s0, o);
          s1 += __shfl_xor_sync(0xffffffffu, s1, o);
        }
        if (g == 0) {
          red[mi * kKeyTile + kKeyTile / 2 * kh + 8 * j + 2 * c] = s0;
          red[mi * kKeyTile + kKeyTile / 2 * kh + 8 * j + 2 * c + 1] = s1;
        }
      }
      __syncthreads();
      if (threadIdx.x < kKeyTile) {
        const int64_t j = key0 + threadIdx.x;
        const int i = threadIdx.x;
        if (j < a.capacity)
          a.scores[t * a.capacity + j] =
              j < n_vis ? ((red[i] + red[kKeyTile + i]) + red[2 * kKeyTile + i]) + red[3 * kKeyTile + i] : -INFINITY;
      }
    }
    __syncthreads();  // the next tile rewrites k_s, q_s, w_s, red and the RoPE table
  }
}

// Order-preserving map of floats onto unsigned integers.
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f + 0.0f);  // -0 -> +0: equal scores must get equal keys
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exclusive prefix sum of v over the block (NT threads) and the total: warp
// scans, then one warp scans the warp totals (not every thread).
template <int NT>
__device__ __forceinline__ uint32_t block_exclusive_scan(uint32_t v, uint32_t* warp_tot, uint32_t& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint32_t x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) warp_tot[warp] = x;
  __syncthreads();
  if (warp == 0) {
    const uint32_t own = lane < NT / 32 ? warp_tot[lane] : 0u;
    uint32_t incl = own;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const uint32_t y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    if (lane < NT / 32) warp_tot[lane] = incl - own;  // exclusive
    if (lane == 31) warp_tot[32] = incl;
  }
  __syncthreads();
  const uint32_t before = warp_tot[warp];
  total = warp_tot[32];
  __syncthreads();  // warp_tot is reused by the next call
  return before + x - v;
}

// The row's ordered keys are staged once in shared memory (kStaged), so the
// four radix passes and the compaction do not go back to global memory.
template <int NT, bool kStaged>
__global__ void __launch_bounds__(NT) indexer_topk_f32_sm90(TopkArgs a) {
  pdl_start();  // runtime/pdl.h: nothing in this kernel runs before the wait
  extern __shared__ uint32_t staged[];  // [ld] when kStaged
  __shared__ uint32_t hist[256];
  __shared__ uint32_t s_prefix, s_remaining;
  __shared__ uint32_t warp_tot[33];
  const StepInfo step = *a.step;
  const int64_t t = blockIdx.x;
  if (t >= step.T) return;
  const int64_t n = n_visible(step.pos0 + t, a.ratio, a.ld);
  const float* sc = a.scores + t * a.ld;
  int32_t* out = a.sel + t * a.k;
  if (n <= a.k) {
    for (int64_t j = threadIdx.x; j < n; j += NT) out[j] = int32_t(j);
    if (threadIdx.x == 0) a.count[t] = int32_t(n);
    return;
  }
  if (kStaged) {
    constexpr int kBatch = 8;
    for (int64_t j0 = 0; j0 < n; j0 += int64_t(NT) * kBatch) {
      float v[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int64_t j = j0 + threadIdx.x + int64_t(i) * NT;
        v[i] = j < n ? sc[j] : 0.0f;
      }
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int64_t j = j0 + threadIdx.x + int64_t(i) * NT;
        if (j < n) staged[j] = order_key(v[i]);
      }
    }
    __syncthreads();
  }
  auto key_at = [&](int64_t j) { return kStaged ? staged[j] : order_key(sc[j]); };
  const int lane = threadIdx.x & 31;
  uint32_t prefix = 0, mask = 0, remaining = uint32_t(a.k);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += NT) hist[i] = 0;
    __syncthreads();
    // Scores of similar size share their high bits, so the early passes hit
    // few bins: lanes with the same bin add once, by their count (a plain
    // atomic per key serialises thousands of updates on one address).
    for (int64_t j0 = 0; j0 < n; j0 += NT) {
      const int64_t j = j0 + threadIdx.x;
      const uint32_t u = j < n ? key_at(j) : 0u;
      const uint32_t bin = j < n && (u & mask) == prefix ? (u >> shift) & 255u : 256u;
      const uint32_t peers = __match_any_sync(0xffffffffu, bin);
      if (bin < 256u && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], uint32_t(__popc(peers)));
    }
    __syncthreads();
    if (threadIdx.x < 32) {  // warp 0: lane owns bins [8 lane, +8); find the bin holding the k-th largest
      uint32_t own = 0;
#pragma unroll
      for (int b = 0; b < 8; ++b) own += hist[8 * lane + b];
      uint32_t suffix = own;  // sum over lanes >= this one
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const uint32_t y = __shfl_down_sync(0xffffffffu, suffix, o);
        if (lane + o < 32) suffix += y;
      }
      uint32_t cum = suffix - own;  // keys in higher bins
      if (cum < remaining && suffix >= remaining) {
        for (int b = 8 * lane + 7; b >= 8 * lane; --b) {
          if (cum + hist[b] >= remaining) {
            s_prefix = prefix | (uint32_t(b) << shift);
            s_remaining = remaining - cum;
            break;
          }
          cum += hist[b];
        }
      }
    }
    __syncthreads();
    prefix = s_prefix;
    remaining = s_remaining;
    mask |= 255u << shift;
    __syncthreads();
  }
  // prefix is now the exact key of the k-th largest score: take every larger
  // key and the `remaining` lowest-id keys equal to it. One scan per round
  // counts both (larger in the high 16 bits, equal in the low 16).
  uint32_t out_base = 0, eq_seen = 0;
  for (int64_t j0 = 0; j0 < n; j0 += NT) {
    const int64_t j = j0 + threadIdx.x;
    const uint32_t u = j < n ? key_at(j) : 0u;
    const bool gt = j < n && u > prefix;
    const bool eq = j < n && u == prefix;
    uint32_t both_total = 0;
    const uint32_t both = block_exclusive_scan<NT>((gt ? 1u << 16 : 0u) | (eq ? 1u : 0u), warp_tot, both_total);
    const uint32_t gt_before = both >> 16, eq_before = eq_seen + (both & 0xffffu);
    const uint32_t taken_eq_before = min(eq_before, remaining) - min(eq_seen, remaining);
    const bool take = gt || (eq && eq_before < remaining);
    if (take) out[out_base + gt_before + taken_eq_before] = int32_t(j);
    const uint32_t eq_total = both_total & 0xffffu;
    out_base += (both_total >> 16) + (min(eq_seen + eq_total, remaining) - min(eq_seen, remaining));
    eq_seen += eq_total;
  }
  if (threadIdx.x == 0) a.count[t] = a.k;
}

// Every kernel's shared-memory limit is raised on the first call of either
// entry (an eager prefill), never inside a captured decode step.
cudaError_t allow_smem_all() {
  const cudaError_t errs[] = {
      cudaFuncSetAttribute(indexer_scores_mma_sm90<true, kKeyTileLong>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(ScoreLayout<true, kKeyTileLong>::bytes)),
      cudaFuncSetAttribute(indexer_scores_mma_sm90<false, kKeyTileLong>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(ScoreLayout<false, kKeyTileLong>::bytes)),
      cudaFuncSetAttribute(indexer_scores_mma_sm90<true, kKeyTileShort>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(ScoreLayout<true, kKeyTileShort>::bytes)),
      cudaFuncSetAttribute(indexer_scores_mma_sm90<false, kKeyTileShort>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(ScoreLayout<false, kKeyTileShort>::bytes)),
      cudaFuncSetAttribute(indexer_topk_f32_sm90<1024, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(kMaxStagedBytes)),
      cudaFuncSetAttribute(indexer_topk_f32_sm90<256, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(kMaxStagedBytes)),
  };
  for (cudaError_t e : errs)
    if (e != cudaSuccess) return e;
  return cudaSuccess;
}

Status smem_ready() {
  static const cudaError_t e = allow_smem_all();
  return cuda_status(e, "indexer: shared memory limits");
}

template <bool kSplit, int kKeyTile>
Status launch_scores_tiled(const IndexerScoreArgs& a, cudaStream_t stream) {
  using L = ScoreLayout<kSplit, kKeyTile>;
  AFF_RETURN_IF_ERROR(smem_ready());
  // At most kScoreBlocksPerSm blocks per SM along the keys; each loops over its tiles.
  const int64_t tiles = (a.capacity + kKeyTile - 1) / kKeyTile;
  const int64_t cap = int64_t(current_device_multiprocessors()) * kScoreBlocksPerSm;
  const dim3 grid(unsigned(std::min(tiles, cap)), unsigned((a.T + kQueries - 1) / kQueries));
  const cudaError_t e =
      launch_pdl(indexer_scores_mma_sm90<kSplit, kKeyTile>, dim3(grid), dim3(kThreads), L::bytes, stream, a);
  return cuda_status(e, "indexer_scores_mma_sm90");
}

template <bool kSplit>
Status launch_scores(const IndexerScoreArgs& a, cudaStream_t stream) {
  static const bool short_tiles = env_switch_on("AFF_CUDA_ISCORE_SHORT");
  return a.T <= kQueries && short_tiles ? launch_scores_tiled<kSplit, kKeyTileShort>(a, stream)
                                        : launch_scores_tiled<kSplit, kKeyTileLong>(a, stream);
}

}  // namespace

Status indexer_scores(const IndexerScoreArgs& a, cudaStream_t stream) {
  if (a.T == 0 || a.capacity == 0) return Status::ok();
  if (a.step == nullptr) return internal_error("indexer_scores: no step info");
  if (a.nh <= 0 || a.nh > kHeads) return unsupported("indexer_scores: more than 64 indexer heads on the GPU");
  if (a.hd <= 0 || a.hd > kMaxHd || a.hd % 8 != 0)
    return unsupported("indexer_scores: index_head_dim must be a multiple of 8 and at most 128 on the GPU");
  if ((a.T + kQueries - 1) / kQueries > 65535) return internal_error("indexer_scores: too many queries in one launch");
  if (a.rope_freq != nullptr && (a.rope_dim <= 0 || a.rope_dim % 4 != 0 || a.rope_dim > a.hd))
    return unsupported("indexer_scores: the RoPE tail must be a positive multiple of 4 dims, at most index_head_dim");
  return a.precision == MmaPrecision::kBf16x3 ? launch_scores<true>(a, stream) : launch_scores<false>(a, stream);
}

namespace {

template <int NT, bool kStaged>
Status launch_topk(const TopkArgs& a, cudaStream_t stream) {
  const size_t smem = kStaged ? size_t(a.ld) * 4 : 0;
  AFF_RETURN_IF_ERROR(smem_ready());
  const cudaError_t e = launch_pdl(indexer_topk_f32_sm90<NT, kStaged>, dim3(unsigned(a.T)), dim3(NT), smem, stream, a);
  return cuda_status(e, "indexer_topk_f32_sm90");
}

}  // namespace

Status indexer_topk(const TopkArgs& a, cudaStream_t stream) {
  if (a.T == 0) return Status::ok();
  if (a.step == nullptr) return internal_error("indexer_topk: no step info");
  // Few queries (decode) leave SMs idle: give each one more threads. Rows up
  // to kMaxStagedBytes are staged in shared memory (a 200K-token context).
  const bool staged = size_t(a.ld) * 4 <= kMaxStagedBytes;
  if (a.T <= 32) return staged ? launch_topk<1024, true>(a, stream) : launch_topk<1024, false>(a, stream);
  return staged ? launch_topk<256, true>(a, stream) : launch_topk<256, false>(a, stream);
}

}  // namespace aff::cuda
