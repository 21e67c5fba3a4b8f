// The indexer's top-k: radix select on the ordered bit pattern of the scores
// (four 8-bit passes find the exact key of the k-th largest), then an ordered
// compaction that writes ids in increasing order, ties to the lower id.
//
// indexer_topk_f32_sm90: one block per query (prefill, short rows). 1024
// threads for few queries, 256 for many; the row is staged in shared memory
// up to kMaxStagedBytes.
// indexer_topk_grid_sm90: one query (a decode step) over many blocks, each
// owning a chunk of the row: every pass adds the blocks' histograms in global
// memory behind a grid barrier and every block picks the same bin from the
// sum; a last barrier shares the blocks' counts of taken keys, so each block
// compacts its chunk at its own offset. A single block's top-k over a long
// row is a serial chain (~130 us over 65,536 entries at a 256K context); the
// grid's passes cost a barrier each instead. Rows that fit one chunk take the
// one-block path inside the same launch, and short-context decode graphs
// launch it as that one block (1024 threads): a second block, even one that
// leaves at once, added ~3 us to the step's chain at 4K.
#include <algorithm>

#include "backend/cuda/kernels/common/decode.cuh"
#include "backend/cuda/kernels/common/grid_sync.cuh"
#include "backend/cuda/kernels/indexer/indexer.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/device_info.h"
#include "backend/cuda/runtime/pdl.h"
#include "backend/cuda/runtime/smem_limit.h"

namespace aff::cuda {
namespace {

constexpr size_t kMaxStagedBytes = 200 * 1024;  // one-block rows staged in shared memory up to this size
constexpr int64_t kGridChunkMin = 1024;  // per taking-part block: shorter chunks add blocks to every barrier
constexpr int kGridMaxBlocks = 128;      // <= one block per SM: every block resident at once
// Threads of a block of the decode form: a one-block row gets the most (its
// passes are the step's critical path); the grid's blocks stay small, so
// they become resident beside other kernels' blocks.
constexpr int kOneBlockThreads = 1024;
constexpr int kGridThreads = 256;

// Scratch words (u32) of the grid kernel: barrier counters, one global
// histogram per pass, then (greater, equal) counts per block.
constexpr int kCtrPass = 0;   // [4] one per radix pass
constexpr int kCtrCount = 4;  // the counts' barrier
constexpr int kCtrLeave = 5;  // blocks done: the last resets the counters and histograms
constexpr int kHistAt = 8;    // [4][256]
constexpr int kCountAt = kHistAt + 4 * 256;  // [kGridMaxBlocks][2]
static_assert(kCountAt + 2 * kGridMaxBlocks <= kTopkScratchWords, "indexer.h: kTopkScratchWords too small");

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

// staged[0, n) = order keys of sc[0, n), loads batched so each thread has
// several in flight.
template <int NT>
__device__ __forceinline__ void stage_keys(const float* sc, int64_t n, uint32_t* staged) {
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
}

// The radix select's state: the bits of the k-th largest key found so far
// (prefix, under mask) and how many keys with that prefix are still to take.
// (No member initialisers: a copy lives in shared memory.)
struct Radix {
  uint32_t prefix, mask, remaining;
};

// hist[bin] += the keys in [0, n) under r's prefix whose bits at shift are
// bin. hist: [256] shared, zeroed by the caller. Scores of similar size share
// their high bits, so the early passes hit few bins: lanes with the same bin
// add once, by their count (a plain atomic per key serialises thousands of
// updates on one address).
template <int NT, typename KeyAt>
__device__ __forceinline__ void hist_add(KeyAt key_at, int64_t n, const Radix& r, int shift, uint32_t* hist) {
  const int lane = threadIdx.x & 31;
  for (int64_t j0 = 0; j0 < n; j0 += NT) {
    const int64_t j = j0 + threadIdx.x;
    const uint32_t u = j < n ? key_at(j) : 0u;
    const uint32_t bin = j < n && (u & r.mask) == r.prefix ? (u >> shift) & 255u : 256u;
    const uint32_t peers = __match_any_sync(0xffffffffu, bin);
    if (bin < 256u && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], uint32_t(__popc(peers)));
  }
}

// Warp 0: the bin of the histogram (bin_at(b), b in [0, 256)) holding the
// r.remaining-th largest key; writes the narrowed state to *out. Lane owns
// bins [8 lane, +8).
template <typename BinAt>
__device__ __forceinline__ void pick_bin(BinAt bin_at, const Radix& r, int shift, Radix* out) {
  const int lane = threadIdx.x & 31;
  uint32_t h[8], own = 0;
#pragma unroll
  for (int b = 0; b < 8; ++b) own += (h[b] = bin_at(8 * lane + b));
  uint32_t suffix = own;  // sum over lanes >= this one
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t y = __shfl_down_sync(0xffffffffu, suffix, o);
    if (lane + o < 32) suffix += y;
  }
  uint32_t cum = suffix - own;  // keys in higher bins
  if (cum < r.remaining && suffix >= r.remaining) {
#pragma unroll
    for (int b = 7; b >= 0; --b) {
      if (cum + h[b] >= r.remaining) {
        out->prefix = r.prefix | (uint32_t(8 * lane + b) << shift);
        out->remaining = r.remaining - cum;
        break;
      }
      cum += h[b];
    }
  }
}

// r.prefix is the exact key of the k-th largest: writes the ids in [0, n) of
// every larger key and of the r.remaining lowest-id keys equal to it, in id
// order, to out[0, k), NT keys a round (for rows of any length). One scan per
// round counts both (larger in the high 16 bits, equal in the low 16).
template <int NT, typename KeyAt>
__device__ __forceinline__ void compact(KeyAt key_at, int64_t n, const Radix& r, int32_t* out, uint32_t* warp_tot) {
  uint32_t out_base = 0, eq_seen = 0;
  for (int64_t j0 = 0; j0 < n; j0 += NT) {
    const int64_t j = j0 + threadIdx.x;
    const uint32_t u = j < n ? key_at(j) : 0u;
    const bool gt = j < n && u > r.prefix;
    const bool eq = j < n && u == r.prefix;
    uint32_t both_total = 0;
    const uint32_t both = block_exclusive_scan<NT>((gt ? 1u << 16 : 0u) | (eq ? 1u : 0u), warp_tot, both_total);
    const uint32_t gt_before = both >> 16, eq_before = eq_seen + (both & 0xffffu);
    const uint32_t taken_eq_before = min(eq_before, r.remaining) - min(eq_seen, r.remaining);
    const bool take = gt || (eq && eq_before < r.remaining);
    if (take) out[out_base + gt_before + taken_eq_before] = int32_t(j);
    const uint32_t eq_total = both_total & 0xffffu;
    out_base += (both_total >> 16) + (min(eq_seen + eq_total, r.remaining) - min(eq_seen, r.remaining));
    eq_seen += eq_total;
  }
}

// Shared memory of the select, beside the staged row.
struct SelectSmem {
  uint32_t hist[256];
  uint32_t warp_tot[33];
  Radix next;
};

// The four passes over a block's keys [0, n): the exact key of the k-th
// largest and how many keys equal to it are taken. merge(pass, hist) makes
// the pass's histogram the one bins are picked from and returns its reader:
// the block's own (one block per row), or the grid's sum.
template <int NT, typename KeyAt, typename Merge>
__device__ __forceinline__ Radix radix_select(KeyAt key_at, int64_t n, int k, SelectSmem& sm, Merge merge) {
  Radix r{0u, 0u, uint32_t(k)};
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    for (int i = threadIdx.x; i < 256; i += NT) sm.hist[i] = 0;
    __syncthreads();
    hist_add<NT>(key_at, n, r, shift, sm.hist);
    __syncthreads();
    const auto bin_at = merge(pass, sm.hist);
    if (threadIdx.x < 32) pick_bin(bin_at, r, shift, &sm.next);
    __syncthreads();
    r.prefix = sm.next.prefix, r.remaining = sm.next.remaining, r.mask |= 255u << shift;
    __syncthreads();  // sm.next and sm.hist are rewritten by the next pass
  }
  return r;
}

__device__ __forceinline__ auto own_histogram() {
  return [](int, const uint32_t* hist) { return [hist](int b) { return hist[b]; }; };
}

template <int NT, bool kStaged>
__global__ void __launch_bounds__(NT) indexer_topk_f32_sm90(TopkArgs a) {
  pdl_start();  // runtime/pdl.h: nothing in this kernel runs before the wait
  extern __shared__ uint32_t staged[];  // [ld] when kStaged
  __shared__ SelectSmem sm;
  const StepInfo step = *a.step;
  const int64_t t = blockIdx.x;
  if (t >= step.T) return;
  const int64_t n = visible_entries(step.pos0 + t, a.ratio, a.ld);
  const float* sc = a.scores + t * a.ld;
  int32_t* out = a.sel + t * a.k;
  if (n <= a.k) {  // every visible id, in order
    for (int64_t j = threadIdx.x; j < n; j += NT) out[j] = int32_t(j);
    if (threadIdx.x == 0) a.count[t] = int32_t(n);
    return;
  }
  if (kStaged) {
    stage_keys<NT>(sc, n, staged);
    __syncthreads();
  }
  auto key_at = [&](int64_t j) { return kStaged ? staged[j] : order_key(sc[j]); };
  const Radix r = radix_select<NT>(key_at, n, a.k, sm, own_histogram());
  compact<NT>(key_at, n, r, out, sm.warp_tot);
  if (threadIdx.x == 0) a.count[t] = a.k;
}

// The compaction of a block's chunk [0, m) in contiguous runs, one per
// thread, so that one block scan places every run (a round-by-round scan pays
// two barriers per NT keys). count_runs: each run's bounds and, packed as
// (above << 16 | equal) with m < 65536, the chunk's keys above / equal to the
// k-th before the run and in the whole chunk.
struct Runs {
  int64_t j0, j1;
  uint32_t before, total;
};

template <int NT>
__device__ __forceinline__ Runs count_runs(const uint32_t* staged, int64_t m, const Radix& r, uint32_t* warp_tot) {
  const int64_t per = (m + NT - 1) / NT;
  Runs runs;
  runs.j0 = int64_t(threadIdx.x) * per;
  runs.j1 = runs.j0 + per < m ? runs.j0 + per : m;
  uint32_t gt = 0, eq = 0;
  for (int64_t j = runs.j0; j < runs.j1; ++j) {
    const uint32_t u = staged[j];
    gt += u > r.prefix;
    eq += u == r.prefix;
  }
  runs.before = block_exclusive_scan<NT>(gt << 16 | eq, warp_tot, runs.total);
  return runs;
}

// Writes the taken ids (id0 + j) of this thread's run; gt0 / eq0: keys above
// / equal to the k-th in the chunks before this one.
__device__ __forceinline__ void write_run(const uint32_t* staged, const Runs& runs, int64_t id0, const Radix& r,
                                          uint32_t gt0, uint32_t eq0, int32_t* out) {
  uint32_t gt = gt0 + (runs.before >> 16), eq = eq0 + (runs.before & 0xffffu);  // keys of lower ids
  for (int64_t j = runs.j0; j < runs.j1; ++j) {
    const uint32_t u = staged[j];
    // A taken key's place: the larger keys of lower id, plus the equal ones
    // of lower id up to the number taken.
    if (u > r.prefix || (u == r.prefix && eq < r.remaining)) out[gt + min(eq, r.remaining)] = int32_t(id0 + j);
    gt += u > r.prefix;
    eq += u == r.prefix;
  }
}

// One query (a decode step) over the grid. The chunk is set per launch from
// the visible count (the grid is fixed at capture): as many blocks as chunks
// of at least kGridChunkMin entries take part, the rest leave at once, and a
// row of one chunk is block 0's alone.
template <int NT>
__global__ void __launch_bounds__(NT) indexer_topk_grid_sm90(TopkArgs a, int64_t stage_cap) {
  pdl_start();  // runtime/pdl.h: nothing in this kernel runs before the wait
  extern __shared__ uint32_t staged[];  // [stage_cap]
  __shared__ SelectSmem sm;
  __shared__ uint32_t s_sum[2];
  __shared__ bool s_last;
  const StepInfo step = *a.step;
  if (step.T < 1) return;
  // Every branch below depends only on n and the grid: grid-uniform.
  const int64_t n = visible_entries(step.pos0, a.ratio, a.ld);
  if (n <= a.k) {
    for (int64_t j = int64_t(blockIdx.x) * NT + threadIdx.x; j < n; j += int64_t(gridDim.x) * NT) a.sel[j] = int32_t(j);
    if (blockIdx.x == 0 && threadIdx.x == 0) a.count[0] = int32_t(n);
    return;
  }
  const int64_t per_block = (n + gridDim.x - 1) / gridDim.x;
  const int64_t chunk = per_block > kGridChunkMin ? per_block : kGridChunkMin;
  const unsigned nb = unsigned((n + chunk - 1) / chunk);  // blocks that take part
  if (blockIdx.x >= nb) return;
  const int64_t lo = int64_t(blockIdx.x) * chunk;
  const int64_t m = lo + chunk < n ? chunk : n - lo;  // this block's entries
  if (m > stage_cap) __trap();  // the host's bound was below a visible count: never stage past the buffer
  stage_keys<NT>(a.scores + lo, m, staged);
  __syncthreads();
  auto key_at = [&](int64_t j) { return staged[j]; };
  if (nb == 1) {  // the row is block 0's chunk
    const Radix r = radix_select<NT>(key_at, m, a.k, sm, own_histogram());
    write_run(staged, count_runs<NT>(staged, m, r, sm.warp_tot), 0, r, 0u, 0u, a.sel);
    if (threadIdx.x == 0) a.count[0] = a.k;
    return;
  }

  unsigned* ctr = a.scratch;
  uint32_t* g_hist = a.scratch + kHistAt;
  uint32_t* g_count = a.scratch + kCountAt;
  // Each pass: the block's histogram added into the pass's global one, then,
  // once every taking-part block has added, bins picked from the sum.
  const Radix r = radix_select<NT>(key_at, m, a.k, sm, [&](int pass, const uint32_t* hist) {
    uint32_t* gh = g_hist + 256 * pass;
    for (int i = threadIdx.x; i < 256; i += NT)
      if (hist[i] != 0u) atomicAdd(gh + i, hist[i]);
    grid_arrive(ctr + kCtrPass + pass);
    grid_wait(ctr + kCtrPass + pass, nb);
    return [gh](int b) { return __ldcg(gh + b); };
  });

  // This block's keys above and at the k-th, then its offset from the blocks
  // before it (ids increase with the block).
  const Runs runs = count_runs<NT>(staged, m, r, sm.warp_tot);
  if (threadIdx.x == 0) g_count[2 * blockIdx.x] = runs.total >> 16, g_count[2 * blockIdx.x + 1] = runs.total & 0xffffu;
  if (threadIdx.x < 2) s_sum[threadIdx.x] = 0;
  grid_arrive(ctr + kCtrCount);
  grid_wait(ctr + kCtrCount, nb);
  for (unsigned b = threadIdx.x; b < blockIdx.x; b += NT) {
    atomicAdd(&s_sum[0], __ldcg(g_count + 2 * b));
    atomicAdd(&s_sum[1], __ldcg(g_count + 2 * b + 1));
  }
  __syncthreads();
  write_run(staged, runs, lo, r, s_sum[0], s_sum[1], a.sel);
  if (blockIdx.x == 0 && threadIdx.x == 0) a.count[0] = a.k;

  // Every block is past its last wait and its last scratch read once all
  // have arrived here: the last resets the scratch for the next launch.
  if (threadIdx.x == 0) s_last = atomicAdd(ctr + kCtrLeave, 1u) == nb - 1;
  __syncthreads();
  if (s_last)
    for (int i = threadIdx.x; i < kTopkScratchWords; i += NT) a.scratch[i] = 0u;
}

// Every kernel's shared-memory limit is raised on the first call (an eager
// prefill, or a test), never inside a captured decode step.
Status smem_ready() {
  auto k = [](auto f) { return reinterpret_cast<const void*>(f); };
  static const Status s = raise_smem_limits({
      {k(indexer_topk_f32_sm90<1024, true>), int(kMaxStagedBytes)},
      {k(indexer_topk_f32_sm90<256, true>), int(kMaxStagedBytes)},
      {k(indexer_topk_grid_sm90<kGridThreads>), int(kMaxStagedBytes)},
      {k(indexer_topk_grid_sm90<kOneBlockThreads>), int(kMaxStagedBytes)},
  });
  return s;
}

template <int NT, bool kStaged>
Status launch_topk(const TopkArgs& a, cudaStream_t stream) {
  const size_t smem = kStaged ? size_t(a.ld) * 4 : 0;
  AFF_RETURN_IF_ERROR(smem_ready());
  const cudaError_t e = launch_pdl(indexer_topk_f32_sm90<NT, kStaged>, dim3(unsigned(a.T)), dim3(NT), smem, stream, a);
  return cuda_status(e, "indexer_topk_f32_sm90");
}

}  // namespace

TopkGrid topk_grid(int64_t bound, int64_t T, int multiprocessors) {
  TopkGrid g;
  if (T != 1 || bound <= 0) return g;
  if (bound <= kTopkOneBlockEntries) {
    g.blocks = 1, g.threads = kOneBlockThreads, g.chunk = bound;
    return g;
  }
  const int64_t max_blocks = std::max<int64_t>(1, std::min<int64_t>(kGridMaxBlocks, multiprocessors));
  const int64_t chunk = std::max(kGridChunkMin, (bound + max_blocks - 1) / max_blocks);
  if (size_t(chunk) * 4 > kMaxStagedBytes) return g;
  g.blocks = int((bound + chunk - 1) / chunk), g.threads = kGridThreads, g.chunk = chunk;
  return g;
}

Status indexer_topk(const TopkArgs& a, cudaStream_t stream) {
  if (a.T == 0) return Status::ok();
  if (a.step == nullptr) return internal_error("indexer_topk: no step info");
  if (a.bound < 0 || a.bound > a.ld) return internal_error("indexer_topk: bound outside [0, ld]");
  const TopkGrid g = a.scratch != nullptr ? topk_grid(a.bound > 0 ? a.bound : a.ld, a.T, current_device_multiprocessors())
                                          : TopkGrid{};
  if (g.blocks > 0) {
    AFF_RETURN_IF_ERROR(smem_ready());
    const size_t smem = size_t(g.chunk) * 4;
    const cudaError_t e =
        g.threads == kOneBlockThreads
            ? launch_pdl(indexer_topk_grid_sm90<kOneBlockThreads>, dim3(1), dim3(kOneBlockThreads), smem, stream, a,
                         g.chunk)
            : launch_pdl(indexer_topk_grid_sm90<kGridThreads>, dim3(unsigned(g.blocks)), dim3(kGridThreads), smem,
                         stream, a, g.chunk);
    return cuda_status(e, "indexer_topk_grid_sm90");
  }
  // Few queries (decode) leave SMs idle: give each one more threads. Rows up
  // to kMaxStagedBytes are staged in shared memory (a 200K-token context).
  const bool staged = size_t(a.ld) * 4 <= kMaxStagedBytes;
  if (a.T <= 32) return staged ? launch_topk<1024, true>(a, stream) : launch_topk<1024, false>(a, stream);
  return staged ? launch_topk<256, true>(a, stream) : launch_topk<256, false>(a, stream);
}

}  // namespace aff::cuda
