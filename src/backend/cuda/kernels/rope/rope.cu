// rope_interleaved_f32_sm90: one thread per (row, pair). The angle is
// f32(pos) * inv_freq[i] as in the reference, then accurate sinf/cosf (the
// build does not use fast math, so large angles are reduced correctly).
#include "backend/cuda/kernels/rope/rope.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/pdl.h"

namespace aff::cuda {
namespace {

__global__ void rope_interleaved_f32_sm90(RopeArgs a) {
  pdl_start();  // runtime/pdl.h: nothing in this kernel runs before the wait
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.rows * a.half) return;
  const int64_t r = i / a.half;
  const int p = int(i % a.half);
  const int64_t base = a.step ? a.step->pos0 : 0;
  const int64_t pos = base + a.pos0 + (r / a.rows_per_pos) * a.pos_step;
  const float angle = float(pos) * a.inv_freq[p];
  float s, c;
  sincosf(angle, &s, &c);
  if (a.inverse) s = -s;
  float* v = a.x + r * a.stride + a.offset + 2 * p;
  const float x0 = v[0], x1 = v[1];
  v[0] = x0 * c - x1 * s;
  v[1] = x1 * c + x0 * s;
}

}  // namespace

Status rope_f32(const RopeArgs& a, cudaStream_t stream) {
  const int64_t n = a.rows * a.half;
  if (n == 0) return Status::ok();
  const cudaError_t e = launch_pdl(rope_interleaved_f32_sm90, dim3(unsigned((n + 255) / 256)), dim3(256), 0, stream, a);
  return cuda_status(e, "rope_interleaved_f32_sm90");
}

}  // namespace aff::cuda
