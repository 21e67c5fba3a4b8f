// compressor_pool_f32_sm90: grid (channel tiles, new entries), one thread per
// channel. ring_store_f32_sm90: one thread per stored element.
#include <cfloat>

#include "backend/cuda/kernels/compressor/compressor.h"
#include "backend/cuda/runtime/cuda_check.h"

namespace aff::cuda {
namespace {

constexpr int kThreads = 128;

// Value and gate of channel `col` of the token at position p.
__device__ __forceinline__ void fetch_slot(const CompressorPoolArgs& a, int64_t p, int width, int col, float& g,
                                           float& v) {
  if (p >= a.pos0) {
    const int64_t row = p - a.pos0;
    v = a.kv[row * width + col];
    g = a.gate[row * width + col] + a.ape[int64_t(p % a.ratio) * width + col];
  } else {
    const int64_t row = p % (2 * a.ratio);
    v = a.ring_kv[row * width + col];
    g = a.ring_gate[row * width + col];
  }
}

__global__ void __launch_bounds__(kThreads) compressor_pool_f32_sm90(CompressorPoolArgs a) {
  const int ch = blockIdx.x * kThreads + threadIdx.x;
  if (ch >= a.dim) return;
  const int64_t b = a.first_entry + blockIdx.y;
  const int r = a.ratio;
  const int width = a.overlap ? 2 * a.dim : a.dim;
  const bool with_prev = a.overlap && b > 0;
  const int own_col = a.overlap ? a.dim + ch : ch;  // this block's own (B) half
  float m = -FLT_MAX, g, v;
  if (with_prev)
    for (int s = 0; s < r; ++s) {
      fetch_slot(a, (b - 1) * r + s, width, ch, g, v);
      m = fmaxf(m, g);
    }
  for (int s = 0; s < r; ++s) {
    fetch_slot(a, b * r + s, width, own_col, g, v);
    m = fmaxf(m, g);
  }
  float denom = 0.0f, acc = 0.0f;
  if (with_prev)
    for (int s = 0; s < r; ++s) {
      fetch_slot(a, (b - 1) * r + s, width, ch, g, v);
      const float p = expf(g - m);
      denom += p;
      acc += p * v;
    }
  for (int s = 0; s < r; ++s) {
    fetch_slot(a, b * r + s, width, own_col, g, v);
    const float p = expf(g - m);
    denom += p;
    acc += p * v;
  }
  a.entries[b * a.dim + ch] = acc / denom;
}

__global__ void ring_store_f32_sm90(RingStoreArgs a, int64_t t_first) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t n = (a.T - t_first) * a.width;
  if (i >= n) return;
  const int64_t t = t_first + i / a.width, c = i % a.width;
  const int64_t pos = a.pos0 + t;
  float v = a.src[t * a.width + c];
  if (a.add) v += a.add[(pos % a.period) * a.width + c];
  a.ring[(pos % a.capacity) * a.width + c] = v;
}

}  // namespace

Status compressor_pool(const CompressorPoolArgs& a, cudaStream_t stream) {
  if (a.n_new == 0) return Status::ok();
  if (a.n_new > 65535) return internal_error("compressor_pool: too many entries in one launch");
  const dim3 grid(unsigned((a.dim + kThreads - 1) / kThreads), unsigned(a.n_new));
  compressor_pool_f32_sm90<<<grid, kThreads, 0, stream>>>(a);
  return launch_status("compressor_pool_f32_sm90");
}

Status ring_store(const RingStoreArgs& a, cudaStream_t stream) {
  const int64_t t_first = a.T > a.capacity ? a.T - a.capacity : 0;
  const int64_t n = (a.T - t_first) * a.width;
  if (n <= 0) return Status::ok();
  ring_store_f32_sm90<<<unsigned((n + 255) / 256), 256, 0, stream>>>(a, t_first);
  return launch_status("ring_store_f32_sm90");
}

}  // namespace aff::cuda
