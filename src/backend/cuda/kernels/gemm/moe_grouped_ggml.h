// Fused grouped kernels of moe_grouped_ffn for experts stored in ggml block
// formats: one launch computes gate, up and the clamped SwiGLU for every
// (expert, token block), one launch computes down. Each block decodes its
// weight rows from the ggml bytes into shared memory as bf16, one half
// super-block (128 columns) at a time, and multiplies them with the tokens'
// bf16 activations on tensor cores (mma.sync m16n8k16, f32 accumulation).
// Internal to kernels/gemm.
//
// Precision: x and the SwiGLU output enter as one bf16 each (no hi + lo
// split) in both MmaPrecision settings. The decode-time kernels for these
// formats quantise x to int8 per 32, so bf16 operands are already more precise
// than the path that serves the same weights at T <= 8, and the weights
// themselves are rounded to bf16 (~2^-9) when decoded.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "affinity/status.h"
#include "backend/cuda/runtime/device_weights.h"

namespace aff::cuda {

// Sorted rows (tokens) per tile: the MMA's M. An expert with n tokens takes
// ceil(n / 64) tiles; rows past the expert's count are neither read nor written.
constexpr int kMoeGgmlTileTokens = 64;

// One unit of work of both launches: tokens [row0, row0 + rows) of the sorted
// order, all routed to the expert whose matrices are w1, w3, w2 (device or
// host-mapped addresses of that expert's ggml rows).
struct MoeGgmlTile {
  const uint8_t* w1 = nullptr;  // gate [inter, row_bytes of w1]
  const uint8_t* w3 = nullptr;  // up   [inter, row_bytes of w3]
  const uint8_t* w2 = nullptr;  // down [D, row_bytes of w2]
  int32_t row0 = 0;             // first sorted row
  int32_t rows = 0;             // 1..kMoeGgmlTileTokens
};

// What every expert of a table shares (the fused kernels read one type and
// row size per matrix): w1/w3/w2 hold type, shape, row_bytes and the tables
// of the first expert; weight pointers are unused (they come per tile).
struct MoeGgmlLayout {
  DeviceLinear w1, w3, w2;
};

// The layout when every expert of slots [n] (host copy of the table) can
// take the fused kernels: all three matrices kGgml with one ggml type and row
// size per matrix across the table, one device table set, shapes [inter, D] /
// [D, inter] with D and inter multiples of 256 (the kernels step over whole
// super-blocks), and a staged super-block that fits the shared-memory budget.
// Else an unsupported Status saying why (the caller keeps the per-expert path).
// (Pointer and count: this header is also compiled as CUDA C++17.)
Result<MoeGgmlLayout> moe_ggml_layout(const ExpertSlot* slots, size_t n, int64_t D, int64_t inter);

// Upper bound of the tiles of n_pairs pairs over E experts (scratch sizing).
inline int64_t moe_ggml_max_tiles(int64_t n_pairs, int E) {
  return n_pairs / kMoeGgmlTileTokens + E + 1;
}

// act[r, :] = silu(min(w1 x_r, L)) * clamp(w3 x_r, -L, L) for every sorted row
// r of every tile, w1/w3 of the tile's expert (L = swiglu_limit, 0: no clamp).
// tiles: device [n_tiles]; x: device [total, D] bf16 bits; act: device
// [total, inter] bf16 bits (rows no tile covers are not written).
Status moe_ggml_up(const MoeGgmlLayout& l, const MoeGgmlTile* tiles, int n_tiles, const uint16_t* x,
                   float swiglu_limit, uint16_t* act, cudaStream_t stream);

// y[pair_of_slot[r], :] = w2 act_r for every sorted row r of every tile (f32
// out, written in pair order: no scatter pass). act: device [total, inter]
// bf16 bits; pair_of_slot: device [total]; y: device [n_pairs, D] f32 (rows
// of pairs that no tile covers are not written).
Status moe_ggml_down(const MoeGgmlLayout& l, const MoeGgmlTile* tiles, int n_tiles, const uint16_t* act,
                     const int32_t* pair_of_slot, float* y, cudaStream_t stream);

// Second form of the same two launches (moe_grouped_ggml_v2.cu): each warp
// decodes its own weight rows from the staged ggml bytes straight into the
// MMA's A registers (no decoded tile in shared memory, no barrier between
// decode and MMA). Same operands, contracts and output layout as moe_ggml_up
// / moe_ggml_down; the decoded bf16 weights are bit-identical, so the results
// differ from the first form's only by the f32 summation order. Q2_K, Q3_K
// and IQ2_XXS only: takes_up needs w1 and w3 of one such type (and row size),
// takes_down w2 of one; the caller keeps the first form otherwise.
bool moe_ggml_v2_takes_up(const MoeGgmlLayout& l);
bool moe_ggml_v2_takes_down(const MoeGgmlLayout& l);
// Shapes as moe_ggml_up: tiles device [n_tiles]; act device [total, inter]
// bf16 bits. x: with x_pair null, device [total, D] bf16 bits in sorted order
// (as moe_ggml_up); else device [T, D] bf16 bits in token order, sorted row r
// reading row x_pair[r] / pairs_per_token (x_pair: the pair of each sorted
// row, device [total]), which saves gathering x.
Status moe_ggml_up_v2(const MoeGgmlLayout& l, const MoeGgmlTile* tiles, int n_tiles, const uint16_t* x,
                      const int32_t* x_pair, int32_t pairs_per_token, float swiglu_limit, uint16_t* act,
                      cudaStream_t stream);
// Shapes as moe_ggml_down: act device [total, inter] bf16 bits; pair_of_slot
// device [total]; y device [n_pairs, D] f32.
Status moe_ggml_down_v2(const MoeGgmlLayout& l, const MoeGgmlTile* tiles, int n_tiles, const uint16_t* act,
                        const int32_t* pair_of_slot, float* y, cudaStream_t stream);

}  // namespace aff::cuda
