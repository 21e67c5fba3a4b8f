// qkv_finish_f32_sm90: one block per row (query heads, then KV latents, then
// indexer query heads), 128 threads. A row is normalised (when its part asks
// for it) and its trailing rope_dim dims rotated at the row token's position
// (StepInfo.pos0 + t), all in shared memory, so the five launches this
// replaces (two norms, three RoPEs) read and write each row once.
#include "backend/cuda/kernels/common/decode.cuh"
#include "backend/cuda/kernels/rope/rope.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/pdl.h"

namespace aff::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxLen = 1024;

__global__ void __launch_bounds__(kThreads) qkv_finish_f32_sm90(QkvFinishArgs a) {
  pdl_start();  // runtime/pdl.h: nothing in this kernel runs before the wait
  __shared__ float row[kMaxLen];
  __shared__ float red[kThreads / 32];
  int64_t r = blockIdx.x;
  const QkvPart* part = nullptr;
  for (int i = 0; i < a.n_parts; ++i) {
    const int64_t n = a.T * a.parts[i].rows_per_token;
    if (r < n) {
      part = &a.parts[i];
      break;
    }
    r -= n;
  }
  if (!part) return;
  const int len = part->len;
  float* x = part->x + r * len;
  const int64_t pos = a.step->pos0 + r / part->rows_per_token;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < len; i += kThreads) {
    const float v = x[i];
    row[i] = v;
    ss = fmaf(v, v, ss);
  }
  float scale = 1.0f;
  if (part->norm) {
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) total += red[w];
    scale = 1.0f / sqrtf(total / float(len) + a.eps);
  }
  __syncthreads();
  const int off = len - a.rope_dim;
  for (int i = threadIdx.x; i < len; i += kThreads) {
    auto normed = [&](int j) {
      const float v = row[j] * scale;
      return part->norm_weight ? part->norm_weight[j] * v : v;
    };
    float v = normed(i);
    if (i >= off) {
      const int p = (i - off) >> 1;
      float s, c;
      sincosf(float(pos) * part->inv_freq[p], &s, &c);
      const float x0 = normed(off + 2 * p), x1 = normed(off + 2 * p + 1);
      v = ((i - off) & 1) ? x1 * c + x0 * s : x0 * c - x1 * s;
    }
    x[i] = v;
  }
}

}  // namespace

Status qkv_finish(const QkvFinishArgs& a, cudaStream_t stream) {
  int64_t rows = 0;
  for (int i = 0; i < a.n_parts; ++i) {
    if (a.parts[i].len > kMaxLen || a.parts[i].len < a.rope_dim)
      return internal_error("qkv_finish: row length " + std::to_string(a.parts[i].len) + " unsupported");
    rows += a.T * a.parts[i].rows_per_token;
  }
  if (rows == 0) return Status::ok();
  if (rows > 0x7fffffff) return internal_error("qkv_finish: too many rows");
  const cudaError_t e = launch_pdl(qkv_finish_f32_sm90, dim3(unsigned(rows)), dim3(kThreads), 0, stream, a);
  return cuda_status(e, "qkv_finish_f32_sm90");
}

}  // namespace aff::cuda
