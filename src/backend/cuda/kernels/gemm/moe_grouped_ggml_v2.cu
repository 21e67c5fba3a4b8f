// Fused grouped expert kernels for ggml experts, second form (moe_grouped_ggml.h,
// moe_ggml_up_v2 / moe_ggml_down_v2): the decoded weights are the MMA's A
// operand and go from the raw ggml bytes straight into registers; they are
// never stored to shared memory as bf16. Q2_K, Q3_K and IQ2_XXS (the V4
// recipes) only; every other type keeps the first form (moe_grouped_ggml.cu).
//
// Why: the first form decodes each weight into a shared bf16 tile and reads it
// back by ldmatrix, with a block barrier between the decode and the MMAs, so
// neither overlaps the other inside a block. Here each warp owns its weight
// rows for the whole K loop (no two warps decode one element), decodes them
// into A fragments, and multiplies them against all 64 tokens of the tile; the
// only barrier per step is the one that recycles the shared stages.
//
// Work: a block owns one tile (expert e, up to 64 sorted tokens of e) and 128
// staged weight rows: up, rows n0..n0+63 of w1 and the same rows of w3; down,
// rows n0..n0+127 of w2. Warp w owns one 16-row MMA tile: up, A rows 0..7 are
// w1 rows n0 + 8w .. +7 and A rows 8..15 the same rows of w3, so the gate and
// up sums of one output sit in one lane's accumulator (c[0..1], c[2..3]) and
// the SwiGLU stays in-thread; down, w2 rows n0 + 16w .. +15. The tokens are
// the MMA's N: 8 fragments of 8 tokens, 8 m16n8 accumulators per warp (32 f32
// per lane). (Two A tiles per warp would load each B word once for twice the
// MMAs, but 64 accumulators next to the decode spill at two blocks per SM.)
//
// K order. A dot product does not care about the order of its terms, so the K
// order inside each MMA is free as long as A and B follow the same map. Per
// 64-column group (four 16-element sub-blocks of a super-block), lane (g, c)
// (g = lane / 4, c = lane % 4) takes sub-block c of the group from its rows
// g and g + 8, and MMA j (0..3) of the group gives it elements [4j, 4j + 4) of
// that sub-block as its logical columns {2c, 2c+1, 2c+8, 2c+9}:
//   a0 = row g,   elements 4j, 4j+1      a2 = row g,   elements 4j+2, 4j+3
//   a1 = row g+8, elements 4j, 4j+1      a3 = row g+8, elements 4j+2, 4j+3
//   b0 = x[token g][16c + 4j .. +1]      b1 = x[token g][16c + 4j + 2 .. +3]
// (columns relative to the group). Over j = 0..3 each lane thus reads its
// sub-block's 16 consecutive elements of each row, and one Q2_K / Q3_K scale
// (one IQ2_XXS scale per 32) per row per group: the per-scale value table is
// computed once per 16 elements as in the first form, not once per 4. A lane's
// B words for MMAs 2hh and 2hh + 1 are 8 consecutive bf16 of one token row:
// one 16-byte shared load serves two MMAs.
//
// Decoding: the sub-block decoders of moe_grouped_decode.cuh, whose words equal
// the first form's chunk decoders bit for bit, so both forms multiply the same
// bf16 operands and differ only in the f32 summation order.
//
// Pipeline, per step of 128 columns (half a super-block):
//   - the raw rows of super-block kb + 1 are requested (one bulk copy per
//     staged row, completion counted on the stage's mbarrier) when step 2 kb
//     begins, into the stage super-block kb - 1 has just left: two raw stages;
//   - the activation tile of the next step (64 tokens x 128 bf16, cp.async) is
//     requested before this step's work: two activation stages;
//   - then decode + MMAs with no barrier between them (decode feeds registers).
// One __syncthreads per step, at its start: every thread's copies of this step
// have landed, and no warp still reads the stages the new requests overwrite.
// Rows are staged as 16-byte aligned windows, as in the first form: alignment
// modulo 16 is the same in shared memory as in global memory, so the
// decoders' u16/u32 reads stay aligned (the layout checks of moe_ggml_layout
// hold here too).
//
// Shared memory: two activation stages of 64 x 136 bf16 (rows padded to 272
// bytes: the eight lanes of a quarter warp read tokens g, g + 1 at 16-byte
// units 2c + hh, and the 17-unit row pitch puts them in eight different bank
// groups) 34 KiB, two raw stages of 128 rows x slot units (7 x 16 bytes for
// Q2_K and IQ2_XXS, 9 for Q3_K), two mbarriers, IQ2_XXS's tables (4 KiB):
// 62 KiB (Q2_K), 66 KiB (IQ2_XXS), 70 KiB (Q3_K). Registers (2 blocks per SM,
// at most 128): 109 (Q2_K), 114 (IQ2_XXS), 123 (Q3_K), no spills; at 3 blocks
// per SM (80) they spill, so two blocks (16 warps) share an SM.
//
// Tokens past the tile's count: their activation rows are zeros (stored once,
// never loaded), fragments of 8 tokens that lie wholly past the count skip
// their MMAs, and no output past the count is written. A weight row past the
// matrix's end (out not a multiple of the block's rows) decodes whatever its
// stage holds, which only reaches that row's own accumulators, never written.
// Every output element is one lane's fixed-order sum: no atomics, results
// independent of scheduling.
#include <cuda_bf16.h>

#include <algorithm>
#include <string>

#include "backend/cuda/kernels/common/ggml_tables.h"
#include "backend/cuda/kernels/gemm/mma_bf16.cuh"
#include "backend/cuda/kernels/gemm/moe_grouped_decode.cuh"
#include "backend/cuda/kernels/gemm/moe_grouped_ggml.h"
#include "backend/cuda/kernels/gemm/moe_grouped_stage.cuh"
#include "backend/cuda/kernels/moe/moe_fast.cuh"
#include "backend/cuda/kernels/moe/swiglu.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/smem_limit.h"
#include "quant/type_traits.h"

namespace aff::cuda {
namespace {

using quant::GgmlType;

constexpr int kThreads = 256;           // 8 warps, each owning one 16-row A tile
constexpr int kM = kMoeGgmlTileTokens;  // 64 tokens per tile: 8 N fragments
constexpr int kNFrag = kM / 8;
constexpr int kStaged = 128;            // staged weight rows per block (threads 0..127 stage one each)
constexpr int kMinBlocks = 2;           // blocks per SM the registers are sized for
// Output columns per block: up, 64 (8 per warp: w1 rows in A rows 0..7, the
// same w3 rows in A rows 8..15); down, 128 (16 w2 rows per warp).
template <bool kUp>
constexpr int kOutRows = kUp ? kStaged / 2 : kStaged;
constexpr int kStepK = 128;             // columns per step: half a super-block
constexpr int kXPitch = kStepK + 8;     // bf16 per staged token row (272 bytes: 17 units)
constexpr int kXStage = kM * kXPitch;   // bf16 per activation stage
using moe_grouped::kIq2TableBytes;
static_assert(kThreads == 2 * kStaged && kM == 64 && kStepK == 128, "index math below assumes these sizes");

using moe_grouped::kIQ2XXS;
using moe_grouped::kQ2K;
using moe_grouped::kQ3K;
using moe_grouped::sb_bytes;
using moe_grouped::slot_units;

// Activation stages | raw stages | two mbarriers | the tile's x row per token
// | (IQ2_XXS) tables.
int smem_bytes(int units, bool iq2_tables) {
  return 2 * kXStage * 2 + 2 * kStaged * units * 16 + 16 + kM * 4 + (iq2_tables ? kIq2TableBytes : 0);
}

struct V2Params {
  const MoeGgmlTile* tiles = nullptr;  // [n_tiles]
  int32_t n_tiles = 0;
  int32_t row_blocks = 0;       // up: ceil(inter / 64), down: ceil(D / 128)
  const uint16_t* x = nullptr;  // [total, K] bf16 bits, sorted rows; up with x_pair: [T, K] token rows
  const int32_t* x_pair = nullptr;  // up: sorted row r reads x row x_pair[r] / x_ppt (null: row r)
  int32_t x_ppt = 1;
  int64_t K = 0;                // reduction length (up: D, down: inter), a multiple of 256
  int64_t out = 0;              // output columns = weight rows (up: inter, down: D)
  int64_t row_bytes = 0;        // bytes of one weight row (w1 and w3 share it)
  int32_t sb = 0;               // bytes per 256 columns
  int32_t units = 0;            // slot_units(sb)
  const uint8_t* tables = nullptr;  // device GgmlTables
  float limit = 0.0f;           // SwiGLU clamp (up only)
  uint16_t* act = nullptr;      // up out: [total, out] bf16 bits
  float* y = nullptr;           // down out: [n_pairs, out] f32, sorted row r at row pair_of_slot[r]
  const int32_t* pair_of_slot = nullptr;  // down: [total] pair of each sorted row
};

using moe_fast::mbar_arrive;

__device__ __forceinline__ uint16_t bf16_rn_bits(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

// Per-sub-block value table of one row: Q3_K needs four bf16x2 words, the
// others two (the unused words stay zero and are dropped by the compiler).
template <int kType>
__device__ __forceinline__ uint4 sub_table(const uint8_t* b, int sb) {
  if constexpr (kType == kQ2K) {
    const uint2 t = moe_grouped::q2k_sub_table(b, sb);
    return make_uint4(t.x, t.y, 0u, 0u);
  } else if constexpr (kType == kQ3K) {
    return moe_grouped::q3k_sub_table(b, sb);
  } else {
    const uint2 t = moe_grouped::iq2xxs_sub_table(b, sb);
    return make_uint4(t.x, t.y, 0u, 0u);
  }
}

template <int kType>
__device__ __forceinline__ void sub_half(const uint8_t* b, int sb, int hh, uint4 t, const uint2* sel,
                                         const uint4* sign, uint32_t (&o)[4]) {
  if constexpr (kType == kQ2K) {
    moe_grouped::q2k_sub_half(b, sb, hh, make_uint2(t.x, t.y), o);
  } else if constexpr (kType == kQ3K) {
    moe_grouped::q3k_sub_half(b, sb, hh, t, o);
  } else {
    moe_grouped::iq2xxs_sub_half(b, sb, hh, make_uint2(t.x, t.y), sel, sign, o);
  }
}

template <int kType, bool kUp>
__global__ void __launch_bounds__(kThreads, kMinBlocks) moe_ggml_v2_sm90(const V2Params p) {
  extern __shared__ __align__(16) uint8_t smem[];
  uint16_t* xs = reinterpret_cast<uint16_t*>(smem);  // [2][kM][kXPitch] bf16
  uint8_t* raw = smem + 2 * kXStage * 2;             // [2][kStaged][units * 16] ggml bytes
  uint64_t* bars = reinterpret_cast<uint64_t*>(raw + 2 * kStaged * p.units * 16);  // [2] one per raw stage
  int32_t* xrow = reinterpret_cast<int32_t*>(bars + 2);                            // [kM] x row of each token
  uint2* iq2_sel = reinterpret_cast<uint2*>(xrow + kM);                            // [256] (IQ2_XXS only)
  uint4* iq2_sign = reinterpret_cast<uint4*>(iq2_sel + 256);                       // [128] (IQ2_XXS only)
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int tile_i = int(blockIdx.x / unsigned(p.row_blocks));
  const int rb = int(blockIdx.x % unsigned(p.row_blocks));
  if (tile_i >= p.n_tiles) return;  // whole block: before any barrier
  const MoeGgmlTile tile = p.tiles[tile_i];
  const int rows = min(tile.rows, kM);
  if (rows <= 0) return;
  const int64_t n0 = int64_t(rb) * kOutRows<kUp>;  // first output column of the block
  const int nkb = int(p.K / 256);
  const int row_stride = p.units * 16;  // bytes of one staged row

  // Staged row r (0..127): up, rows [0, 64) are w1 and [64, 128) the same
  // rows of w3; down, 128 consecutive rows of w2. Address of its first byte;
  // valid: the row exists.
  auto row_base = [&](int r, bool& valid) -> const uint8_t* {
    const int64_t wrow = n0 + (kUp ? (r & (kStaged / 2 - 1)) : r);
    valid = wrow < p.out;
    const uint8_t* base = kUp ? (r >= kStaged / 2 ? tile.w3 : tile.w1) : tile.w2;
    return base + wrow * p.row_bytes;
  };

  // Stage super-block kb of this thread's staged row (threads 0..127, thread r
  // stages row r): the row's aligned window by one bulk copy, counted on the
  // stage's mbarrier (128 arrivals per phase; a missing row arrives with no
  // bytes). The row's address is formed once: the tile's fields need no
  // registers in the K loop.
  bool my_valid;
  const uint8_t* const my_row = row_base(tid & (kStaged - 1), my_valid);
  auto issue_raw = [&](int kb) {
    uint64_t* bar = bars + (kb & 1);
    if (!my_valid) {
      mbar_arrive(bar);
      return;
    }
    const moe_fast::Span16 sp = moe_fast::span16(my_row + int64_t(kb) * p.sb, p.sb);
    if (sp.bytes > uint32_t(row_stride)) __trap();  // the host sized the stages for every window
    moe_fast::mbar_expect_tx(bar, sp.bytes);
    moe_fast::bulk_g2s(raw + (kb & 1) * kStaged * row_stride + tid * row_stride, sp.base, sp.bytes, bar);
  };

  // Activation tile of step s (columns [128 s, 128 s + 128)): 64 tokens x 16
  // units, 4 units per thread (tokens t0 + 16 i, unit u); only tokens below
  // the count are loaded. Token t's row of x is xrow[t]: the sorted row, or
  // (up from token-order x) its pair's token, so no gathered copy of x is
  // needed.
  const int x_t0 = tid >> 4, x_u = tid & 15;
  const int x_n = (rows - x_t0 + 15) >> 4;  // units of this thread below the count (0..4)
  const uint16_t* const x_src = p.x + x_u * 8;
  auto issue_x = [&](int s) {
    uint16_t* st = xs + (s & 1) * kXStage + x_t0 * kXPitch + x_u * 8;
#pragma unroll
    for (int i = 0; i < 4; ++i)
      if (i < x_n)
        cp_async16(st + 16 * i * kXPitch, x_src + int64_t(xrow[x_t0 + 16 * i]) * p.K + int64_t(s) * kStepK);
    cp_async_commit();
  };
  if (tid < kM) {
    const int32_t r = tile.row0 + tid;
    xrow[tid] = tid >= rows ? 0 : p.x_pair != nullptr ? p.x_pair[r] / p.x_ppt : r;
  }

  // Tokens past the count read zeros in both stages (their rows are never loaded).
  for (int q = tid; q < 2 * kM * 16; q += kThreads) {
    const int st = q / (kM * 16), t = (q >> 4) & (kM - 1), u = q & 15;
    if (t >= rows) *reinterpret_cast<uint4*>(xs + st * kXStage + t * kXPitch + u * 8) = make_uint4(0u, 0u, 0u, 0u);
  }
  if (tid == 0) {
    moe_fast::mbar_init(bars + 0, kStaged);
    moe_fast::mbar_init(bars + 1, kStaged);
    moe_fast::mbar_init_fence();
  }
  if constexpr (kType == kIQ2XXS) moe_grouped::stage_iq2_tables(p.tables, tid, iq2_sel, iq2_sign);  // kThreads == 256
  __syncthreads();  // barriers initialised before any copy counts on them; xrow written
  if (tid < kStaged) issue_raw(0);
  issue_x(0);

  const int g = lane >> 2, c = lane & 3;
  // This lane's two staged rows: A rows g (i = 0) and g + 8 (i = 1) of the
  // warp's tile. Up: w1 row n0 + 8 warp + g and the same row of w3, so the
  // gate and up sums of one output land in one lane (c[0..1] and c[2..3]);
  // down: w2 rows n0 + 16 warp + g and + 8. roff: the row's offset in a stage
  // plus its first byte's address mod 16 (super-block kb's offset in its
  // window adds kb * sb to the latter).
  int roff[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = kUp ? kStaged / 2 * i + 8 * warp + g : 16 * warp + g + 8 * i;
    bool valid;
    roff[i] = r * row_stride + int(reinterpret_cast<uintptr_t>(row_base(r, valid)) & 15);
  }
  const int nf_live = (rows + 7) >> 3;  // fragments of 8 tokens with at least one token

  float acc[kNFrag][4];
#pragma unroll
  for (int f = 0; f < kNFrag; ++f)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[f][e] = 0.0f;

  for (int s = 0; s < 2 * nkb; ++s) {
    const int kb = s >> 1, h = s & 1;
    cp_async_wait_all();  // this thread's activation units of step s have landed
    __syncthreads();      // everyone's have; nobody reads step s - 1's stages any more
    if (h == 0 && kb + 1 < nkb && tid < kStaged) issue_raw(kb + 1);  // into the stage kb - 1 has left
    if (s + 1 < 2 * nkb) issue_x(s + 1);                               // into the stage step s - 1 has left
    // Super-block kb's bytes (use n = kb / 2 of its stage: phase parity n & 1).
    if (h == 0) moe_fast::mbar_wait(bars + (kb & 1), uint32_t((kb >> 1) & 1));
    const uint16_t* xt = xs + (s & 1) * kXStage + g * kXPitch + 16 * c;
    const uint8_t* stage = raw + (kb & 1) * kStaged * row_stride;
    const int kmis = int((int64_t(kb) * p.sb) & 15);
    const uint8_t* rp[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) rp[i] = stage + (roff[i] & ~15) + (((roff[i] & 15) + kmis) & 15);
#pragma unroll
    for (int gh = 0; gh < 2; ++gh) {
      const int sb = 8 * h + 4 * gh + c;  // this lane's sub-block of super-block kb
      uint4 tab[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) tab[i] = sub_table<kType>(rp[i], sb);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        // A fragments of MMAs j = 2 hh + jj of the group.
        uint32_t a[2][4];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          uint32_t o[4];
          sub_half<kType>(rp[i], sb, hh, tab[i], iq2_sel, iq2_sign, o);
          a[0][i] = o[0], a[0][2 + i] = o[1];
          a[1][i] = o[2], a[1][2 + i] = o[3];
        }
#pragma unroll
        for (int f = 0; f < kNFrag; ++f) {
          if (f < nf_live) {  // warp-uniform
            const uint4 bv = *reinterpret_cast<const uint4*>(xt + 8 * f * kXPitch + 64 * gh + 8 * hh);
            mma_bf16_16816(acc[f], a[0], bv.x, bv.y);
            mma_bf16_16816(acc[f], a[1], bv.z, bv.w);
          }
        }
      }
    }
  }

  // Epilogue (the tile's first row read again rather than held through the
  // loop). acc[f][e]: A row g + 8 (e >> 1), token 8 f + 2 c + (e & 1).
  const int32_t row0 = p.tiles[tile_i].row0;
#pragma unroll
  for (int f = 0; f < kNFrag; ++f) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int t = 8 * f + 2 * c + e;
      if (t >= rows) continue;
      const int64_t orow = int64_t(row0) + t;
      if constexpr (kUp) {
        // Gate in row g, up in row g + 8: the same output column.
        const int64_t col = n0 + 8 * warp + g;
        if (col < p.out) p.act[orow * p.out + col] = bf16_rn_bits(swiglu_clamp(acc[f][e], acc[f][2 + e], p.limit));
      } else {
        // Written in pair order, as the first form.
        const int64_t yrow = p.pair_of_slot[orow];
        const int64_t col = n0 + 16 * warp + g;
        if (col < p.out) p.y[yrow * p.out + col] = acc[f][e];
        if (col + 8 < p.out) p.y[yrow * p.out + col + 8] = acc[f][2 + e];
      }
    }
  }
}

using Kernel = void (*)(V2Params);

bool v2_type(int32_t t) { return t == kQ2K || t == kQ3K || t == kIQ2XXS; }

template <bool kUp>
Kernel pick(int32_t type) {
  switch (type) {
    case kQ2K: return moe_ggml_v2_sm90<kQ2K, kUp>;
    case kQ3K: return moe_ggml_v2_sm90<kQ3K, kUp>;
    default: return moe_ggml_v2_sm90<kIQ2XXS, kUp>;
  }
}

Status launch(Kernel k, int32_t type, const V2Params& p, const char* name, cudaStream_t stream) {
  if (p.n_tiles <= 0 || p.row_blocks <= 0) return Status::ok();
  const int64_t grid = int64_t(p.n_tiles) * p.row_blocks;
  if (grid > INT32_MAX) return internal_error(std::string(name) + ": grid too large");
  const int smem = smem_bytes(p.units, type == kIQ2XXS);
  AFF_RETURN_IF_ERROR(raise_smem_limit(reinterpret_cast<const void*>(k), smem));
  k<<<unsigned(grid), kThreads, size_t(smem), stream>>>(p);
  return launch_status(name);
}

V2Params params(const DeviceLinear& w, const MoeGgmlTile* tiles, int n_tiles, const uint16_t* x, int rows_per_block) {
  V2Params p;
  p.tiles = tiles, p.n_tiles = n_tiles, p.row_blocks = int32_t((w.out + rows_per_block - 1) / rows_per_block);
  p.x = x, p.K = w.in, p.out = w.out, p.row_bytes = w.row_bytes;
  p.sb = int32_t(sb_bytes(w)), p.units = slot_units(p.sb), p.tables = w.tables;
  return p;
}

}  // namespace

bool moe_ggml_v2_takes_up(const MoeGgmlLayout& l) {
  return l.w1.ggml_type == l.w3.ggml_type && l.w1.row_bytes == l.w3.row_bytes && v2_type(l.w1.ggml_type);
}
bool moe_ggml_v2_takes_down(const MoeGgmlLayout& l) { return v2_type(l.w2.ggml_type); }

Status moe_ggml_up_v2(const MoeGgmlLayout& l, const MoeGgmlTile* tiles, int n_tiles, const uint16_t* x,
                      const int32_t* x_pair, int32_t pairs_per_token, float swiglu_limit, uint16_t* act,
                      cudaStream_t stream) {
  if (!moe_ggml_v2_takes_up(l)) return internal_error("moe_ggml_up_v2: gate/up types not taken by this form");
  if (pairs_per_token < 1) return internal_error("moe_ggml_up_v2: pairs_per_token < 1");
  V2Params p = params(l.w1, tiles, n_tiles, x, kOutRows<true>);
  p.x_pair = x_pair, p.x_ppt = pairs_per_token;
  p.limit = swiglu_limit, p.act = act;
  if (p.K % 256 != 0 || p.sb <= 0) return internal_error("moe_ggml_up_v2: layout not checked by moe_ggml_layout");
  return launch(pick<true>(l.w1.ggml_type), l.w1.ggml_type, p, "moe_ggml_up_v2_sm90", stream);
}

Status moe_ggml_down_v2(const MoeGgmlLayout& l, const MoeGgmlTile* tiles, int n_tiles, const uint16_t* act,
                        const int32_t* pair_of_slot, float* y, cudaStream_t stream) {
  if (!moe_ggml_v2_takes_down(l)) return internal_error("moe_ggml_down_v2: down type not taken by this form");
  V2Params p = params(l.w2, tiles, n_tiles, act, kOutRows<false>);
  p.y = y, p.pair_of_slot = pair_of_slot;
  if (p.K % 256 != 0 || p.sb <= 0) return internal_error("moe_ggml_down_v2: layout not checked by moe_ggml_layout");
  return launch(pick<false>(l.w2.ggml_type), l.w2.ggml_type, p, "moe_ggml_down_v2_sm90", stream);
}

}  // namespace aff::cuda
