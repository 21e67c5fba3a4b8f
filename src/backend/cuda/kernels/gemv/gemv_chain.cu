// gemv_chain_sm90: a chain of dependent normed FP8 GEMVs in one persistent
// launch (gemv_chain.h has the contract). Why: between two dependent launches
// the GPU drains the first and ramps up the second, a few microseconds each
// time however small the work; a persistent block streams its next weights
// regardless of where the dependency chain is.
//
// Work: step i's 4096 rows are 256 tiles of 16 rows; block b takes tiles b,
// b + G, ... (G = grid = SM count, at least 128) of every step. Warp 16 of the
// block is the producer: it walks the block's tiles of every step in order
// and copies each stage (4 whole rows, 16 KB contiguous in the row-major
// weight: one bulk copy; 16 copies of 1 KB per stage streamed at 59% of HBM
// against 95-98%) into the next free slot of a ring of shared-memory stages; an
// mbarrier per slot counts the bytes in, another the 16 compute warps out.
// Warps 0..15 compute on tensor cores as the decode GEMV does (gemv_mma.cu,
// moe_fast::fp8_step: E4M3 converted to f16 by the hardware, x staged per step
// as f16 hi + lo with a power of two per 64 columns, f32 accumulation; or
// rounded as ChainPrecision says): once a tile's 4 stages are in, warp w takes
// its 64-column steps w, w + 16, w + 32, w + 48, and a tile's rows are summed
// over the warps in a fixed shuffle tree (deterministic). Rows of a stage lie 4 KB apart, so lane (g, c) reads the
// 16-byte chunk (c + g) % 4 of its rows' 64 columns instead of chunk c, and x's
// matching chunk: an MMA's output column g then holds the dot products of rows
// g and g + 8, read from the lanes with c = g / 2 (the other columns mix
// chunks and are dropped); the shared loads spread over the banks.
// Dependencies: step i's outputs are written twice, as floats for the caller
// and as 64-bit words that carry the value and the tag i + 1; each warp of
// step i + 1 loads its share of x_{i+1} = y_i from those words, again until
// every tag is there (a writer needs no fence and no counter, a reader no
// flag load before its data: one memory round trip between the steps, where
// a counter took three: fence, count, poll, then the data). The dots take x
// unnormalised and each output is multiplied by 1 / rms(x) from the block's
// sum of squares, which so stays off the dots' path.
//
// All blocks must be resident at once (spin waits): one block per SM, checked
// on the host against the occupancy the kernel gets.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <string>

#include "backend/cuda/kernels/common/decode.cuh"
#include "backend/cuda/kernels/common/tagged_word.cuh"
#include "backend/cuda/kernels/gemv/gemv_chain.h"
#include "backend/cuda/kernels/moe/moe_fast.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/device_info.h"
#include "backend/cuda/runtime/smem_limit.h"

namespace aff::cuda {
namespace {

constexpr int kWidth = int(kChainWidth);
constexpr int kComputeWarps = 16;
constexpr int kThreads = (kComputeWarps + 1) * 32;
constexpr int kTileRows = 16;                                   // the MMA's M
constexpr int kStageRows = 4;                                   // whole rows per stage
constexpr int kStageBytes = kStageRows * kWidth;                // 16 KB
constexpr int kStagesPerTile = kTileRows / kStageRows;          // 4
constexpr int kTilesPerStep = kWidth / kTileRows;               // 256
constexpr int kMaxTilesPerBlock = 2;                            // 256 tiles over >= 128 SMs
constexpr int kRing = 12;                                       // stages: 195 KB
constexpr int kXLd = kWidth + 8;                                // staged x row (f16), as gemv_mma pads
constexpr int kGroups = kWidth / 64;                            // 64-column steps of a row
// Warp w takes the 64-column steps w, w + 16, ... of x (to stage it) and of
// every tile (to multiply it).
constexpr int kStepsPerWarp = kGroups / kComputeWarps;
static_assert(kGroups % kComputeWarps == 0, "every compute warp takes as many column steps");
static_assert(kRing >= kStagesPerTile, "a tile's stages resident at once");
// Shared memory: barriers and sums, staged x (hi, lo, 2^-e per 64 columns), the ring.
constexpr int kHeader = 2560;
constexpr int kXBytes = (2 * kXLd * 2 + kGroups * 4 + 127) / 128 * 128;
constexpr int kRingOff = kHeader + kXBytes;
constexpr int kSmem = kRingOff + kRing * kStageBytes;
static_assert(2 * kRing * 8 + (2 * kComputeWarps * kTileRows + 2 * kComputeWarps + 1) * 4 <= kHeader, "header overflow");
static_assert(kSmem <= 227 * 1024, "shared memory");

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// The compute warps' own barrier (the producer warp never joins it).
__device__ __forceinline__ void compute_sync() { asm volatile("bar.sync 1, %0;" ::"n"(kComputeWarps * 32) : "memory"); }

// The FP8 tensor-core product D = A B + D, A 16 x 32 e4m3 (row), B 32 x 8
// e4m3 (col), f32 accumulation (sm_89+).
__device__ __forceinline__ void mma_e4m3_16832(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One 64-column group of x as e4m3 scaled by a power of two (the group's max
// lands in [128, 256), below e4m3's 448), inv = the inverse scale: the
// activation rounding of the official FP8 linears, per 64 columns instead of
// 128. v: the lane's two columns 2 lane, 2 lane + 1; q: the group's 64 bytes.
__device__ __forceinline__ void stage_e4m3_group(float2 v, uint8_t* q, float* inv) {
  const int lane = threadIdx.x & 31;
  const int e = moe_fast::group_max_exponent(v);
  const float up = ldexpf(1.0f, 8 - e);
  const __nv_fp8x2_storage_t p = __nv_cvt_float2_to_fp8x2(make_float2(v.x * up, v.y * up), __NV_SATFINITE, __NV_E4M3);
  reinterpret_cast<uint16_t*>(q)[lane] = uint16_t(p);
  if (lane == 0) *inv = ldexpf(1.0f, e - 8);
}

template <ChainPrecision P>
__global__ void __launch_bounds__(kThreads) gemv_chain_sm90(ChainArgs a) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* empty = full + kRing;
  float* red = reinterpret_cast<float*>(empty + kRing);  // [2][kComputeWarps, kTileRows]
  float* sq = red + 2 * kComputeWarps * kTileRows;       // [2][kComputeWarps], by step parity
  // The last step whose x warp 0 has loaded (-1: none), for the producer's gate.
  volatile int* x_seen = reinterpret_cast<volatile int*>(sq + 2 * kComputeWarps);
  __half* xh = reinterpret_cast<__half*>(smem + kHeader);
  __half* xl = xh + kXLd;
  float* xinv = reinterpret_cast<float*>(xl + kXLd);  // [kGroups]
  uint8_t* ring = smem + kRingOff;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int G = int(gridDim.x), b = int(blockIdx.x);
  const int my_tiles = b < kTilesPerStep ? (kTilesPerStep - 1 - b) / G + 1 : 0;
  const int per_step = my_tiles * kStagesPerTile;
  const int slots = a.ring_stages >= 1 && a.ring_stages <= kRing ? a.ring_stages : kRing;  // in use
  if (threadIdx.x == 0) {
    *x_seen = -1;
    for (int s = 0; s < kRing; ++s) moe_fast::mbar_init(full + s, 1), moe_fast::mbar_init(empty + s, kComputeWarps);
    moe_fast::mbar_init_fence();
  }
  __syncthreads();

  if (warp == kComputeWarps) {  // the producer: every stage of every step, as soon as a slot frees
    if (lane == 0) {
      const int total = a.steps * per_step;
      for (int q = 0; q < total; ++q) {
        const int slot = q % slots, use = q / slots;
        if (use > 0) moe_fast::mbar_wait(empty + slot, uint32_t(use - 1) & 1u);
        const int step = q / per_step, r = q % per_step;
        // Gate: a step's copies go out once the previous step's x is in, not
        // before it, where that load would queue behind them.
        if (a.gate_copies && step > 0)
          while (*x_seen < step - 1) __nanosleep(32);
        const int tile = b + (r / kStagesPerTile) * G, st = r % kStagesPerTile;
        const uint8_t* src = a.w[step].weight + (int64_t(tile) * kTileRows + st * kStageRows) * kWidth;
        moe_fast::mbar_expect_tx(full + slot, kStageBytes);
        moe_fast::bulk_g2s(ring + slot * kStageBytes, src, kStageBytes, full + slot);
      }
    }
    return;
  }

  if (a.timing_mode == 2) {  // streaming only
    for (int q = 0; q < a.steps * per_step; ++q) {
      moe_fast::mbar_wait(full + q % slots, uint32_t(q / slots) & 1u);
      __syncwarp();
      if (lane == 0) moe_fast::mbar_arrive(empty + q % slots);
    }
    return;
  }
  const int g = lane >> 2, c = lane & 3;
  int q = 0;  // stages consumed
  unsigned long long* stamps = b == 0 && threadIdx.x == 0 ? a.stamps : nullptr;
  auto load_scales = [&](int step, float (&out)[kMaxTilesPerBlock][kStepsPerWarp]) {
    const DeviceLinear w = a.w[step];
#pragma unroll
    for (int t = 0; t < kMaxTilesPerBlock; ++t)
#pragma unroll
      for (int j = 0; j < kStepsPerWarp; ++j)
        out[t][j] = t < my_tiles ? load_scale(w, int64_t((b + t * G) * kTileRows / 128) * w.scale_cols +
                                                     (warp + kComputeWarps * j) / 2)
                                 : 0.0f;
  };
  float ws[kMaxTilesPerBlock][kStepsPerWarp];
  load_scales(0, ws);
  for (int step = 0; step < a.steps; ++step) {
    auto stamp = [&](int k) {
      if (stamps != nullptr) stamps[step * 8 + k] = global_ns();
    };
    stamp(0);
    if (stamps != nullptr && step == 0) stamps[a.steps * 8] = clock64();
    // The block scales are weights: the next step's are loaded here, a step
    // ahead of their use, so their latency is never on the chain's path.
    // This warp's column step j of a tile is kb = w + 16 j, in 128-column
    // block kb / 2.
    float ws_next[kMaxTilesPerBlock][kStepsPerWarp];
    load_scales(step + 1 < a.steps ? step + 1 : step, ws_next);
    // x in one round of loads (the groups of 64 columns of warp w are
    // w + 16 i; a loop of load-then-stage would pay the loads' latency once per
    // group): x0, or the previous step's tagged outputs, loaded again until
    // every tag says they are written.
    float2 v[kStepsPerWarp];
    if (step == 0) {
#pragma unroll
      for (int i = 0; i < kStepsPerWarp; ++i)
        v[i] = __ldcg(reinterpret_cast<const float2*>(a.x0 + (warp + kComputeWarps * i) * 64) + lane);
    } else {
      const unsigned long long* src = a.ll + int64_t(step - 1) * kWidth;
      bool done = false;
      do {
        bool mine = true;
#pragma unroll
        for (int i = 0; i < kStepsPerWarp; ++i) {
          const ulonglong2 e = ld_volatile_u64x2(src + (warp + kComputeWarps * i) * 64 + 2 * lane);
          mine = mine && unsigned(e.x >> 32) == unsigned(step) && unsigned(e.y >> 32) == unsigned(step);
          v[i] = make_float2(__uint_as_float(unsigned(e.x)), __uint_as_float(unsigned(e.y)));
        }
        done = a.timing_mode != 0 || __all_sync(0xffffffffu, mine);
      } while (!done);
    }
    stamp(1);
    if (threadIdx.x == 0) *x_seen = step;
    float* sqs = sq + (step & 1) * kComputeWarps;  // two buffers: the step's last readers may lag
    {
      float ss = 0.0f;
#pragma unroll
      for (int i = 0; i < kStepsPerWarp; ++i) {
        const int grp = warp + kComputeWarps * i;
        if constexpr (P == ChainPrecision::kE4M3)
          stage_e4m3_group(v[i], reinterpret_cast<uint8_t*>(xh) + grp * 64, xinv + grp);
        else
          moe_fast::stage_f16_group<P == ChainPrecision::kExact>(v[i], xh + grp * 64, xl + grp * 64, xinv + grp);
        ss = fmaf(v[i].x, v[i].x, ss), ss = fmaf(v[i].y, v[i].y, ss);
      }
      ss = warp_sum(ss);
      if (lane == 0) sqs[warp] = ss;
    }
    compute_sync();  // x staged
    stamp(2);
    // 1 / rms(x) for the reduction's threads, while the stages land.
    float rinv = 0.0f;
    if (threadIdx.x < kTileRows * kComputeWarps) {
      float total = 0.0f;
#pragma unroll
      for (int w2 = 0; w2 < kComputeWarps; ++w2) total += sqs[w2];
      rinv = rms_inv(total, float(kWidth), a.eps);
    }
    stamp(3), stamp(4), stamp(5), stamp(6);  // overwritten by tile 0 where the block has one

    float* y = a.ys + int64_t(step) * kWidth;
    unsigned long long* yl = a.ll + int64_t(step) * kWidth;
    for (int t = 0; t < my_tiles; ++t) {
      const int tile = b + t * G;
      // The tile's 4 stages: rows 4 s .. 4 s + 3 in slot (q + s) % slots.
#pragma unroll
      for (int st = 0; st < kStagesPerTile; ++st)
        moe_fast::mbar_wait(full + (q + st) % slots, uint32_t((q + st) / slots) & 1u);
      if (t == 0) stamp(3);
      const int pc = (c + g) & 3;  // the 16-byte chunk this lane reads (see the top)
      const int64_t in_stage = (g % kStageRows) * kWidth + 16 * pc;
      const uint8_t* row_a = ring + ((q + g / kStageRows) % slots) * kStageBytes + in_stage;
      const uint8_t* row_b = ring + ((q + g / kStageRows + 2) % slots) * kStageBytes + in_stage;
      float acc0 = 0.0f, acc1 = 0.0f;  // rows g and g + 8, valid in the lanes with c = g / 2
#pragma unroll
      for (int j = 0; j < kStepsPerWarp; ++j) {
        const int kb = warp + kComputeWarps * j;  // the 64-column step within the row
        const uint4 ra = *reinterpret_cast<const uint4*>(row_a + kb * 64);
        const uint4 rb = *reinterpret_cast<const uint4*>(row_b + kb * 64);
        float cb[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if constexpr (P == ChainPrecision::kE4M3) {
          // The lane's 16 bytes of rows g and g + 8 against x's same 16 bytes:
          // two k32 products, each taking 8 of them (k labels only pair A and B).
          const uint4 xq = *reinterpret_cast<const uint4*>(reinterpret_cast<const uint8_t*>(xh) + kb * 64 + 16 * pc);
          const uint32_t a0[4] = {ra.x, rb.x, ra.y, rb.y}, a1[4] = {ra.z, rb.z, ra.w, rb.w};
          mma_e4m3_16832(cb, a0, xq.x, xq.y);
          mma_e4m3_16832(cb, a1, xq.z, xq.w);
        } else {
          moe_fast::fp8_step<P == ChainPrecision::kExact>(ra, rb, xh + kb * 64 + 16 * pc, xl + kb * 64 + 16 * pc, cb);
        }
        const float f = (t == 0 ? ws[0][j] : ws[kMaxTilesPerBlock - 1][j]) * xinv[kb];
        acc0 = fmaf(g & 1 ? cb[1] : cb[0], f, acc0);
        acc1 = fmaf(g & 1 ? cb[3] : cb[2], f, acc1);
      }
      if (t == 0) stamp(4);
      __syncwarp();  // every lane's reads of the tile's slots are done
      if (lane == 0)
        for (int st = 0; st < kStagesPerTile; ++st) moe_fast::mbar_arrive(empty + (q + st) % slots);
      q += kStagesPerTile;
      float* rb2 = red + (t & 1) * kComputeWarps * kTileRows;  // two buffers: one barrier per tile
      if (c == g / 2) rb2[warp * kTileRows + g] = acc0, rb2[warp * kTileRows + g + 8] = acc1;
      // Past this barrier every warp's reads of the staged x are done, so the
      // next step may stage over it; only the reduction below still reads
      // (the partials and this step's sums of squares).
      compute_sync();
      if (t == 0) stamp(5);
      // The tile's 16 rows over the first 256 threads: thread 16 r + w holds
      // warp w's partial of row r, and the 16 partials of a row meet in a
      // fixed shuffle tree (deterministic, 4 steps instead of 16 dependent
      // shared loads in one thread).
      if (threadIdx.x < kTileRows * kComputeWarps) {
        const int r = threadIdx.x / kComputeWarps, w2 = threadIdx.x % kComputeWarps;
        float o = rb2[w2 * kTileRows + r];
#pragma unroll
        for (int m = kComputeWarps / 2; m > 0; m >>= 1) o += __shfl_xor_sync(0xffffffffu, o, m);
        if (w2 == 0) {
          const float out = o * rinv;
          y[tile * kTileRows + r] = out;
          st_volatile_u64(yl + tile * kTileRows + r, (static_cast<unsigned long long>(step + 1) << 32) | __float_as_uint(out));
        }
      }
      if (t == 0) stamp(6);
    }
    stamp(7);
    if (stamps != nullptr && step == a.steps - 1) stamps[a.steps * 8 + 1] = clock64();
#pragma unroll
    for (int t = 0; t < kMaxTilesPerBlock; ++t)
#pragma unroll
      for (int j = 0; j < kStepsPerWarp; ++j) ws[t][j] = ws_next[t][j];
  }
}

using ChainKernel = void (*)(ChainArgs);

ChainKernel chain_kernel(ChainPrecision p) {
  switch (p) {
    case ChainPrecision::kF16: return gemv_chain_sm90<ChainPrecision::kF16>;
    case ChainPrecision::kE4M3: return gemv_chain_sm90<ChainPrecision::kE4M3>;
    default: return gemv_chain_sm90<ChainPrecision::kExact>;
  }
}

}  // namespace

// Asked once: the answer is a property of the kernel and the device.
bool gemv_chain_supported() {
  static const bool supported = [] {
    for (ChainPrecision p : {ChainPrecision::kExact, ChainPrecision::kF16, ChainPrecision::kE4M3}) {
      const ChainKernel k = chain_kernel(p);
      if (!raise_smem_limit(reinterpret_cast<const void*>(k), kSmem).is_ok()) return false;
      int blocks = 0;
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, k, kThreads, kSmem) != cudaSuccess) {
        cudaGetLastError();
        return false;
      }
      if (blocks < 1) return false;
    }
    return true;
  }();
  return supported;
}

Status gemv_chain(const ChainArgs& args, cudaStream_t stream) {
  if (args.steps <= 0) return Status::ok();
  if (args.w == nullptr || args.x0 == nullptr || args.ys == nullptr || args.ll == nullptr)
    return internal_error("gemv_chain: missing buffers");
  if (args.ring_stages != 0 && (args.ring_stages < kStagesPerTile || args.ring_stages > kRing))
    return invalid_argument("gemv_chain: ring_stages must be 0 or " + std::to_string(kStagesPerTile) + ".." +
                            std::to_string(kRing) + " (a tile's stages are resident at once)");
  if (!gemv_chain_supported()) return internal_error("gemv_chain: one block per SM does not fit");
  if (int64_t(current_device_multiprocessors()) * kMaxTilesPerBlock < kTilesPerStep)
    return internal_error("gemv_chain: too few SMs for two tiles per block");
  AFF_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(args.ll, 0, size_t(args.steps) * kWidth * sizeof(unsigned long long), stream));
  chain_kernel(args.precision)<<<unsigned(current_device_multiprocessors()), kThreads, kSmem, stream>>>(args);
  return launch_status("gemv_chain_sm90");
}

}  // namespace aff::cuda
