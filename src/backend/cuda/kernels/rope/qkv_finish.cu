// The attention inputs' last step in one launch: rows of query heads, then KV
// latents, then indexer query heads, each normalised (when its part asks for
// it) and its trailing rope_dim dims rotated at the row token's position
// (StepInfo.pos0 + t), so the five launches this replaces (two norms, three
// RoPEs) read and write each row once. Two kernels:
//  - qkv_finish_rows_f32_sm90: a block takes up to 8 * rows_per_warp rows of
//    one (part, token), a warp per row with float4 loads, the norm by warp
//    shuffles; the token's sin/cos are computed once per block into shared
//    memory (all heads of a token rotate by the same angles), with the
//    precise sincosf of f32(pos) * inv_freq as before;
//  - qkv_finish_f32_sm90: one block of 128 threads per row, for rows the
//    vector form does not take (a length or rope_dim not a multiple of 4,
//    or unaligned rows).
#include <cstdint>

#include "backend/cuda/kernels/common/decode.cuh"
#include "backend/cuda/kernels/rope/rope.h"
#include "backend/cuda/kernels/rope/rope_pairs.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/pdl.h"

namespace aff::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxLen = 1024;

// Fallback, one row per block: the row staged in shared memory, a sincosf per
// rotated element.
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
    scale = rms_inv(total, float(len), a.eps);
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

constexpr int kRowThreads = 256;
constexpr int kRowWarps = kRowThreads / 32;
constexpr int kRowVec = kMaxLen / 4 / 32;  // float4s of a row per lane
constexpr int kMaxParts = 3;
// Chunks of at least this many tokens give each warp 4 rows (one sin/cos
// table per 32 rows); shorter ones one row per warp (more blocks).
constexpr int64_t kManyRowsTokens = 32;

// Part i of a (constant indices only: the parts stay kernel parameters).
__device__ __forceinline__ QkvPart part_at(const QkvFinishArgs& a, int i) {
  QkvPart p = a.parts[0];
  if (i == 1) p = a.parts[1];
  if (i == 2) p = a.parts[2];
  return p;
}

// Blocks of part p: T tokens x ceil(rows_per_token / rows per block).
__host__ __device__ __forceinline__ int64_t row_chunks(const QkvPart& p, int rows_per_block) {
  return (p.rows_per_token + rows_per_block - 1) / rows_per_block;
}

// Block b: part, token t, rows [row0, row0 + 8 * rows_per_warp) of that token
// (warp w takes rows row0 + w, row0 + w + 8, ...). Needs len % 4 == 0,
// rope_dim % 4 == 0 (so the rope tail starts on a float4) and 16-byte
// aligned rows and norm weights: the host checks.
// At most 64 registers: 4 blocks (32 warps) per SM keep enough rows in flight.
__global__ void __launch_bounds__(kRowThreads, 4) qkv_finish_rows_f32_sm90(QkvFinishArgs a, int rows_per_warp) {
  pdl_start();  // runtime/pdl.h: nothing in this kernel runs before the wait
  __shared__ __align__(16) float2 tab[kMaxLen / 2];  // [rope_dim / 2] (cos, sin) of the block's token
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rows_per_block = kRowWarps * rows_per_warp;
  int64_t b = blockIdx.x;
  int pi = -1;
  int64_t chunks = 1;
#pragma unroll
  for (int i = 0; i < kMaxParts; ++i) {
    if (pi >= 0 || i >= a.n_parts) continue;
    chunks = row_chunks(part_at(a, i), rows_per_block);
    if (b < a.T * chunks) pi = i;
    else b -= a.T * chunks;
  }
  if (pi < 0) return;
  const QkvPart part = part_at(a, pi);
  const int64_t t = b / chunks;
  const int64_t row0 = (b % chunks) * rows_per_block;
  const int len = part.len, nv = len / 4, off = len - a.rope_dim;

  // A row's float4s: lane l holds numbers l, l + 32, ... (zeros past the row).
  float4 v[kRowVec];
  auto load = [&](int64_t row) {
    const float4* x = reinterpret_cast<const float4*>(part.x + (t * part.rows_per_token + row) * len);
#pragma unroll
    for (int k = 0; k < kRowVec; ++k) {
      const int q = lane + 32 * k;
      v[k] = q < nv ? x[q] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  };
  // The first row's loads go out before the table's sincosf.
  if (row0 + warp < part.rows_per_token) load(row0 + warp);
  const int64_t pos = a.step->pos0 + t;
  rope_table_fill(tab, pos, part.inv_freq, a.rope_dim / 2, threadIdx.x, kRowThreads);
  __syncthreads();

  // Without a norm or weight only the rope tail changes.
  const bool whole = part.norm || part.norm_weight;
  for (int i = 0; i < rows_per_warp; ++i) {
    const int64_t row = row0 + warp + int64_t(kRowWarps) * i;
    if (row >= part.rows_per_token) break;
    if (i > 0) load(row);
    float scale = 1.0f;
    if (part.norm) {
      float ss = 0.0f;
#pragma unroll
      for (int k = 0; k < kRowVec; ++k) {
        ss = fmaf(v[k].x, v[k].x, ss);
        ss = fmaf(v[k].y, v[k].y, ss);
        ss = fmaf(v[k].z, v[k].z, ss);
        ss = fmaf(v[k].w, v[k].w, ss);
      }
      scale = rms_inv(warp_sum(ss), float(len), a.eps);
    }
    float4* x = reinterpret_cast<float4*>(part.x + (t * part.rows_per_token + row) * len);
#pragma unroll
    for (int k = 0; k < kRowVec; ++k) {
      const int q = lane + 32 * k;
      if (q >= nv) continue;
      const int e = 4 * q;  // first element of this float4
      float4 n = make_float4(v[k].x * scale, v[k].y * scale, v[k].z * scale, v[k].w * scale);
      if (part.norm_weight) {
        const float4 w = reinterpret_cast<const float4*>(part.norm_weight)[q];
        n = make_float4(w.x * n.x, w.y * n.y, w.z * n.z, w.w * n.w);
      }
      if (e >= off) {
        // Pairs (e, e+1) and (e+2, e+3) are pairs (e - off) / 2 and + 1 of the tail.
        const float4 cs = reinterpret_cast<const float4*>(tab)[(e - off) / 4];  // c0, s0, c1, s1
        n = rope_rotate4(n, cs);
        x[q] = n;
      } else if (whole) {
        x[q] = n;
      }
    }
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

Status qkv_finish(const QkvFinishArgs& a, cudaStream_t stream) {
  if (a.n_parts < 0 || a.n_parts > kMaxParts) return internal_error("qkv_finish: at most 3 parts");
  if (a.rope_dim < 0 || a.rope_dim % 2 != 0) return internal_error("qkv_finish: rope_dim must be even");
  int64_t rows = 0;
  bool vec = a.rope_dim % 4 == 0;
  for (int i = 0; i < a.n_parts; ++i) {
    const QkvPart& p = a.parts[i];
    if (p.len > kMaxLen || p.len < a.rope_dim)
      return internal_error("qkv_finish: row length " + std::to_string(p.len) + " unsupported");
    rows += a.T * p.rows_per_token;
    vec = vec && p.len % 4 == 0 && aligned16(p.x) && (!p.norm_weight || aligned16(p.norm_weight));
  }
  if (rows == 0) return Status::ok();
  if (!vec) {
    if (rows > 0x7fffffff) return internal_error("qkv_finish: too many rows");
    const cudaError_t e = launch_pdl(qkv_finish_f32_sm90, dim3(unsigned(rows)), dim3(kThreads), 0, stream, a);
    return cuda_status(e, "qkv_finish_f32_sm90");
  }
  const int rows_per_warp = a.T >= kManyRowsTokens ? 4 : 1;
  int64_t blocks = 0;
  for (int i = 0; i < a.n_parts; ++i) blocks += a.T * row_chunks(a.parts[i], kRowWarps * rows_per_warp);
  if (blocks > 0x7fffffff) return internal_error("qkv_finish: too many rows");
  const cudaError_t e =
      launch_pdl(qkv_finish_rows_f32_sm90, dim3(unsigned(blocks)), dim3(kRowThreads), 0, stream, a, rows_per_warp);
  return cuda_status(e, "qkv_finish_rows_f32_sm90");
}

}  // namespace aff::cuda
