// indexer_scores_mma_sm90: block = (key tile, group of 16 queries), 8 warps;
// the tile is 128 keys, or 32 when the chunk is one query group (decode).
// The key tile is converted to bf16 (hi + lo in kBf16x3) once; per query the
// 64 heads x tile dot products run on tensor cores (warp = 16 heads x half
// the tile), then ReLU, the head weights and the sum over heads are applied to the
// accumulators in registers (shuffles over the 8 rows a lane group holds,
// then the 4 head tiles summed in a fixed order). The same kernel serves
// decode (one query; the grid spans the key capacity, capped at a few
// blocks per SM that loop over their tiles) and prefill.
// The top-k over these scores: indexer_topk.cu.
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
#include "backend/cuda/runtime/smem_limit.h"

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
  const int64_t n_max = visible_entries(step.pos0 + t_end - 1, a.ratio, a.capacity);  // the last query sees most
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  // Key tiles blockIdx.x, + gridDim.x, ... up to the visible ones: the grid is
  // sized from the capacity (a captured step replays at every position), but
  // capped, so a large --kv-size does not launch thousands of blocks that
  // only find their tile empty.
  // A block of one query (a decode step) stages its query rows once, on its
  // first tile: at long contexts each block loops over several tiles, and the
  // rows (64 x 128 floats) are twice a tile's keys.
  const bool q_once = t_end - t0 == 1;
  bool q_staged = false;
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
      wv = 0.0f;
      if (int(threadIdx.x) < a.nh) {
        if (a.w_parts != nullptr) {  // the mHC site's partial sums (HcSiteFeeds), in order
          const float* wp = a.w_parts + t * a.w_nparts * a.nh + threadIdx.x;
#pragma unroll 8
          for (int p = 0; p < a.w_nparts; ++p) wv += __ldcg(wp + p * a.nh);
        } else {
          wv = a.w[t * a.nh + threadIdx.x];
        }
        wv *= a.w_scale;
      }
    };
    __shared__ __align__(16) float2 rope_tab[kMaxHd / 2];  // (cos, sin) per rope pair of the current token
    const int rope_off = a.hd - a.rope_dim;
    if (!q_staged) load_q(t0);
    if (!q_staged && a.rope_freq != nullptr)
      rope_table_fill(rope_tab, step.pos0 + t0, a.rope_freq, a.rope_dim / 2, threadIdx.x, kThreads);
#pragma unroll
    for (int i = 0; i < kKIters; ++i) {
      const int idx = threadIdx.x + i * kThreads, r = idx / (kMaxHd / 4), d = 4 * (idx % (kMaxHd / 4));
      store4_bf16<kSplit>(k_s + r * kLd + d, k_s + kKeyTile * kLd + r * kLd + d, kv[i]);
    }
    const int k_steps = (a.hd + 15) / 16;
    const int mi = warp & 3, kh = warp >> 2;  // warp: heads [16 mi, +16) x keys [kKeyTile / 2 kh, + kKeyTile / 2)

    for (int64_t t = t0; t < t_end; ++t) {
      const int64_t n_vis = visible_entries(step.pos0 + t, a.ratio, a.capacity);
      if (key0 >= n_vis) continue;  // uniform over the block
      if (t != t0) {
        // (the previous token's table and q_s were last read before this loop's later barriers)
        load_q(t);
        if (a.rope_freq != nullptr)
          rope_table_fill(rope_tab, step.pos0 + t, a.rope_freq, a.rope_dim / 2, threadIdx.x, kThreads);
      }
      if (!q_staged && a.rope_freq != nullptr) {  // the queries' RoPE, as qkv_finish applies it
        __syncthreads();
#pragma unroll
        for (int i = 0; i < kQIters; ++i) {
          const int idx = threadIdx.x + i * kThreads, d = 4 * (idx % (kMaxHd / 4));
          if (d < rope_off || d >= a.hd) continue;
          qv[i] = rope_rotate4(qv[i], reinterpret_cast<const float4*>(rope_tab)[(d - rope_off) / 4]);
        }
      }
      if (!q_staged) {
#pragma unroll
        for (int i = 0; i < kQIters; ++i) {
          const int idx = threadIdx.x + i * kThreads, r = idx / (kMaxHd / 4), d = 4 * (idx % (kMaxHd / 4));
          store4_bf16<kSplit>(q_s + r * kLd + d, q_s + kHeads * kLd + r * kLd + d, qv[i]);
        }
        if (threadIdx.x < kHeads) w_s[threadIdx.x] = wv;
      }
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
    q_staged = q_once;
    __syncthreads();  // the next tile rewrites k_s and red (and, with several queries, q_s, w_s and the RoPE table)
  }
}

// Every kernel's shared-memory limit is raised on the first call (an eager
// prefill), never inside a captured decode step.
Status smem_ready() {
  auto k = [](auto f) { return reinterpret_cast<const void*>(f); };
  static const Status s = raise_smem_limits({
      {k(indexer_scores_mma_sm90<true, kKeyTileLong>), int(ScoreLayout<true, kKeyTileLong>::bytes)},
      {k(indexer_scores_mma_sm90<false, kKeyTileLong>), int(ScoreLayout<false, kKeyTileLong>::bytes)},
      {k(indexer_scores_mma_sm90<true, kKeyTileShort>), int(ScoreLayout<true, kKeyTileShort>::bytes)},
      {k(indexer_scores_mma_sm90<false, kKeyTileShort>), int(ScoreLayout<false, kKeyTileShort>::bytes)},
  });
  return s;
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

}  // namespace aff::cuda
