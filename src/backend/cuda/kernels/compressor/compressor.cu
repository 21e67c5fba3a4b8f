// compressor_pool_f32_sm90: one block per entry the chunk may complete (the
// grid covers the most a chunk of T tokens can complete; blocks past the
// count read from StepInfo exit). Each thread pools channels, then the block
// normalises the entry and rotates its tail in place.
// ring_store_f32_sm90: one thread per stored element.
#include <cfloat>

#include "backend/cuda/kernels/common/decode.cuh"
#include "backend/cuda/kernels/compressor/compressor.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/pdl.h"

namespace aff::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxDim = 1024;

// Value and gate of channel `col` of the token at position p.
__device__ __forceinline__ void fetch_slot(const CompressorPoolArgs& a, int64_t pos0, int64_t p, int width,
                                           int col, float& g, float& v) {
  if (p >= pos0) {
    const int64_t row = p - pos0;
    v = a.kv[row * width + col];
    g = a.gate[row * width + col] + a.ape[int64_t(p % a.ratio) * width + col];
  } else {
    const int64_t row = p % (2 * a.ratio);
    v = a.ring_kv[row * width + col];
    g = a.ring_gate[row * width + col];
  }
}

// Channel ch of entry b: the softmax over its slots' gates of their values,
// slots in order (the previous block's r when overlapping, then its own r).
// The slots' loads go out kBatch at a time: a slot is a dependent L2 round
// trip otherwise, and a ratio-4 entry with overlap (8 slots, two passes) took
// ~20 us of them in the decode step that completes it. Same terms in the same
// order as one slot at a time, so the same bits.
__device__ float pool_channel(const CompressorPoolArgs& a, int64_t pos0, int64_t b, int ch) {
  constexpr int kBatch = 8;
  const int r = a.ratio;
  const int width = a.overlap ? 2 * a.dim : a.dim;
  const int n_prev = a.overlap && b > 0 ? r : 0, n = n_prev + r;
  const int own_col = a.overlap ? a.dim + ch : ch;  // this block's own (B) half
  auto fetch = [&](int i, float& g, float& v) {
    if (i < n_prev) fetch_slot(a, pos0, (b - 1) * r + i, width, ch, g, v);
    else fetch_slot(a, pos0, b * r + (i - n_prev), width, own_col, g, v);
  };
  float g[kBatch], v[kBatch];
  float m = -FLT_MAX;
  for (int i0 = 0; i0 < n; i0 += kBatch) {
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
      if (i0 + j < n) fetch(i0 + j, g[j], v[j]);
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
      if (i0 + j < n) m = fmaxf(m, g[j]);
  }
  float denom = 0.0f, acc = 0.0f;
  for (int i0 = 0; i0 < n; i0 += kBatch) {
    if (n > kBatch) {  // one batch: its values are still in registers
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (i0 + j < n) fetch(i0 + j, g[j], v[j]);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (i0 + j < n) {
        const float p = expf(g[j] - m);
        denom += p;
        acc += p * v[j];
      }
    }
  }
  return acc / denom;
}

// Blocks [pool_blocks, ...) of a store_ring launch: the token's kv then gate
// row into the rings (a thread per element). Its row is not one the entry
// this step may complete reads (that window ends at the token, read directly).
// Deferred: the unit's rows (compressor_defer_rows), only in a step that completes it.
__device__ void store_rows(const CompressorPoolArgs& a, int64_t i) {
  const int width = a.overlap ? 2 * a.dim : a.dim;
  const int unit = compressor_defer_rows(a.ratio);
  const int64_t rows = a.deferred ? unit : 1;
  if (i >= 2 * int64_t(width) * rows) return;
  const int64_t pos_now = a.step->pos0;
  if (a.deferred && (pos_now + 1) % unit != 0) return;
  const int64_t t = i / (2 * width), j = i % (2 * width);
  const int64_t pos = pos_now - (rows - 1) + t, row = pos % (2 * a.ratio);
  const int c = int(j % width);
  if (j < width) {
    a.ring_kv[row * width + c] = a.kv[t * width + c];
  } else {
    a.ring_gate[row * width + c] = a.gate[t * width + c] + a.ape[(pos % a.ratio) * width + c];
  }
}

__global__ void __launch_bounds__(kThreads) compressor_pool_f32_sm90(CompressorPoolArgs a, unsigned pool_blocks) {
  pdl_start();  // runtime/pdl.h: nothing in this kernel runs before the wait
  if (blockIdx.x >= pool_blocks) {
    store_rows(a, int64_t(blockIdx.x - pool_blocks) * kThreads + threadIdx.x);
    return;
  }
  const StepInfo st = *a.step;
  if (blockIdx.x >= new_entries(st, a.ratio)) return;
  const int64_t b = first_new_entry(st, a.ratio) + blockIdx.x;
  // Deferred: kv / gate hold the completed unit's rows (its first position
  // first); the block's earlier units are in the rings.
  const int64_t chunk0 = a.deferred ? st.pos0 + 1 - compressor_defer_rows(a.ratio) : st.pos0;
  __shared__ float row[kMaxDim];
  __shared__ float partial[kThreads / 32];
  float ss = 0.0f;
  for (int ch = threadIdx.x; ch < a.dim; ch += kThreads) {
    const float v = pool_channel(a, chunk0, b, ch);
    row[ch] = v;
    ss = fmaf(v, v, ss);
  }
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) total += partial[w];
  const float inv = rms_inv(total, float(a.dim), a.eps);
  for (int ch = threadIdx.x; ch < a.dim; ch += kThreads) row[ch] = a.norm[ch] * (row[ch] * inv);
  __syncthreads();
  // RoPE on the trailing rope_dim dims at the entry's first position, with the
  // same f32 angle as the reference.
  float* out = a.entries + b * a.dim;
  const int off = a.dim - a.rope_dim;
  const float pos = float(b * a.ratio);
  for (int ch = threadIdx.x; ch < a.dim; ch += kThreads) {
    float v = row[ch];
    if (ch >= off) {
      const int i = (ch - off) >> 1;
      float s, c;
      sincosf(pos * a.inv_freq[i], &s, &c);
      const float x0 = row[off + 2 * i], x1 = row[off + 2 * i + 1];
      v = ((ch - off) & 1) ? x1 * c + x0 * s : x0 * c - x1 * s;
    }
    out[ch] = v;
  }
}

__global__ void ring_store_f32_sm90(RingStoreArgs a, int64_t t_first) {
  pdl_start();  // runtime/pdl.h: nothing in this kernel runs before the wait
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t n = (a.T - t_first) * a.width;
  if (i >= n) return;
  const int64_t t = t_first + i / a.width, c = i % a.width;
  const int64_t pos = a.step->pos0 + a.pos_offset + t;
  float v = a.src[t * a.width + c];
  if (a.add) v += a.add[(pos % a.period) * a.width + c];
  a.ring[(pos % a.capacity) * a.width + c] = v;
}

}  // namespace

Status compressor_pool(const CompressorPoolArgs& a, cudaStream_t stream) {
  if (a.dim > kMaxDim || a.rope_dim > a.dim || (a.rope_dim & 1))
    return internal_error("compressor_pool: entry width " + std::to_string(a.dim) + " / rope dims " +
                          std::to_string(a.rope_dim) + " unsupported");
  // The most entries T consecutive positions can complete, wherever they start.
  const int64_t most = a.T / a.ratio + 1;
  if (most > 0x7fffffff) return internal_error("compressor_pool: too many entries in one launch");
  if (a.store_ring && a.T != 1) return internal_error("compressor_pool: ring stores ride along only with one token");
  if (a.deferred && (a.T != 1 || compressor_defer_rows(a.ratio) == 0))
    return internal_error("compressor_pool: deferred projections are for one token and a ratio with a deferral unit");
  const int64_t width = a.overlap ? 2 * a.dim : a.dim;
  const int64_t store_rows_n = a.deferred ? compressor_defer_rows(a.ratio) : 1;
  const int64_t store_blocks = a.store_ring ? (2 * width * store_rows_n + kThreads - 1) / kThreads : 0;
  const cudaError_t e = launch_pdl(compressor_pool_f32_sm90, dim3(unsigned(most + store_blocks)), dim3(kThreads), 0,
                                   stream, a, unsigned(most));
  return cuda_status(e, "compressor_pool_f32_sm90");
}

Status ring_store(const RingStoreArgs& a, cudaStream_t stream) {
  const int64_t t_first = a.T > a.capacity ? a.T - a.capacity : 0;
  const int64_t n = (a.T - t_first) * a.width;
  if (n <= 0) return Status::ok();
  const cudaError_t e = launch_pdl(ring_store_f32_sm90, dim3(unsigned((n + 255) / 256)), dim3(256), 0, stream, a,
                                   t_first);
  return cuda_status(e, "ring_store_f32_sm90");
}

}  // namespace aff::cuda
