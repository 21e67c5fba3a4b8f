// Fused grouped expert kernels for ggml block formats (moe_grouped_ggml.h).
//
// Work: a block owns one tile (expert e, up to 64 sorted tokens of e) and one
// block of output columns: 64 rows of w1 and the same 64 rows of w3 (up), or
// 128 rows of w2 (down). Either way it decodes 128 weight rows, and its output
// is 64 tokens x 128 accumulators per row block. The grid is tiles x row
// blocks with row blocks varying fastest, so the blocks of one tile run
// together and share its activation rows in L2, and an expert's second tile
// re-reads the weights soon after its first.
//
// K loop, per super-block kb (256 columns of every row):
//   - the rows' ggml bytes of super-block kb + 2 go to shared memory while kb
//     is used (two stages, so one super-block is always in flight): one bulk
//     copy per row (cp.async.bulk), completion counted on the stage's
//     mbarrier, so these copies are tracked apart from the activation tile's
//     cp.async groups. A row's super-block is only 2-byte aligned in general
//     (Q3_K is 110 bytes), so each row copies the 16-byte aligned window that
//     holds it and remembers the offset: alignment modulo 16 is the same in
//     shared memory as in global memory, so the decoders' u16/u32 reads stay
//     aligned. The window can reach up to 15 bytes before and after a row's
//     bytes; those lie in the same aligned 16 bytes as bytes of the tensor,
//     and tensors are 256-byte aligned in the weight arena.
//   - two steps of 128 columns: the activation tile (64 tokens x 128 bf16) is
//     requested by cp.async first, each thread decodes two 32-column chunks
//     into a bf16 weight tile meanwhile (Q2_K, Q3_K, IQ2_XXS: the
//     conversion-free decoders of moe_grouped_decode.cuh; other types:
//     ggml_decode32_at, the GEMV's decoders, then a rounding per pair), then
//     8 warps multiply: warp (wm, wn) owns tokens [32 wm, 32 wm + 32) and 32
//     accumulator columns (up: 16 gate + the same 16 up rows; down: 32
//     rows), 2 x 4 m16n8k16 MMAs per 16 columns, operands by ldmatrix.
// Shared memory: weight tile 128 x 128 bf16 (32 KiB), activation tile 64 x 128
// (16 KiB), two raw stages of 128 rows x an odd count of 16-byte units (7 for
// Q2_K and IQ2_XXS, 9 for Q3_K), IQ2_XXS's tables (4 KiB): 76 KiB for Q2_K,
// 80 for IQ2_XXS, 84 for Q3_K, so two blocks (16 warps) share an SM and one's
// decode overlaps the other's MMAs.
//
// Tokens past the tile's count: their activation rows are stored as zeros
// (never read from global), the warps whose 16 or 32 tokens all lie past the
// count skip their MMAs, and no output row past the count is written. Every
// output element is one warp's fixed-order sum: results do not depend on
// scheduling.
#include "backend/cuda/kernels/gemm/moe_grouped_ggml.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <string>

#include "backend/cuda/kernels/common/ggml_decode.cuh"
#include "backend/cuda/kernels/common/ggml_tables.h"
#include "backend/cuda/kernels/gemm/mma_bf16.cuh"
#include "backend/cuda/kernels/gemm/moe_grouped_decode.cuh"
#include "backend/cuda/kernels/gemm/moe_grouped_stage.cuh"
#include "backend/cuda/kernels/moe/moe_fast.cuh"
#include "backend/cuda/kernels/moe/swiglu.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/smem_limit.h"
#include "quant/type_traits.h"

namespace aff::cuda {
namespace {

using quant::GgmlType;

constexpr int kThreads = 256;              // 8 warps: 2 (tokens) x 4 (accumulator columns)
constexpr int kM = kMoeGgmlTileTokens;     // 64 tokens per tile
constexpr int kRows = 128;                 // weight rows decoded per block
constexpr int kStepK = 128;                // columns per step: half a super-block
constexpr int kUnits = kStepK / 8;         // 16-byte units (8 bf16) per tile row per step
constexpr int kWBytes = kRows * kStepK * 2;
constexpr int kXBytes = kM * kStepK * 2;
constexpr int kMaxSlotUnits = 19;          // Q8_0: 272 bytes per 256 columns (+ up to 15 of misalignment)
static_assert(kUnits == 16 && kThreads == 256 && kM == 64, "index math below assumes these sizes");

using moe_grouped::kIq2TableBytes;
using moe_grouped::sb_bytes;
using moe_grouped::slot_units;

// Weight tile | activation tile | two raw stages | two mbarriers | (IQ2_XXS) tables.
int smem_bytes(int units, bool iq2_tables) {
  return kWBytes + kXBytes + 2 * kRows * units * 16 + 16 + (iq2_tables ? kIq2TableBytes : 0);
}

struct GemmParams {
  const MoeGgmlTile* tiles = nullptr;  // [n_tiles]
  int32_t n_tiles = 0;
  int32_t row_blocks = 0;     // output column blocks (up: inter / 64, down: D / 128)
  const uint16_t* x = nullptr;  // [total, K] bf16 bits, sorted rows
  int64_t K = 0;              // reduction length (up: D, down: inter), a multiple of 256
  int64_t out = 0;            // output columns = weight rows (up: inter, down: D)
  int32_t type_a = -1;        // ggml type of w1 (up) or w2 (down)
  int32_t type_b = -1;        // ggml type of w3 (up only)
  int64_t row_bytes_a = 0, row_bytes_b = 0;
  int32_t sb_a = 0, sb_b = 0;  // bytes per 256 columns
  int32_t units = 0;          // slot_units of the larger of sb_a, sb_b
  const uint8_t* tables = nullptr;  // device GgmlTables
  float limit = 0.0f;         // SwiGLU clamp (up only)
  uint16_t* act = nullptr;    // up out: [total, out] bf16 bits
  float* y = nullptr;         // down out: [n_pairs, out] f32, sorted row r at row pair_of_slot[r]
  const int32_t* pair_of_slot = nullptr;  // down: [total] pair of each sorted row
};

using moe_fast::mbar_arrive;

// Four 8x8 b16 matrices; lane i gives the address of row i % 8 of matrix i / 8.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const uint16_t* p) {
  const uint32_t a = uint32_t(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// Element offset of 16-byte unit u (0..15) of row r in a [rows][kStepK] bf16
// tile. Units are XOR-swizzled by r % 8: eight consecutive rows at one unit
// (an ldmatrix 8x8 matrix, or eight lanes' decode stores) land in eight
// different bank groups, with no padding.
__device__ __forceinline__ int swz(int r, int u) { return r * kStepK + ((u ^ (r & 7)) << 3); }

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo, round to nearest even
  return *reinterpret_cast<const uint32_t*>(&h);
}

using moe_grouped::kIQ2XXS;
using moe_grouped::kQ2K;
using moe_grouped::kQ3K;

// 32 elements of chunk `chunk` (0..7) of the super-block at b (shared memory)
// as 16 bf16x2 words. Q2_K, Q3_K and IQ2_XXS (the V4 recipes) take the
// conversion-free decoders; any other type (kType = -1: the type read at run
// time) decodes to f32 with ggml_decode32_at and rounds each pair.
template <int kType>
__device__ __forceinline__ void decode_chunk(int type, const uint8_t* tables, const uint2* iq2_sel,
                                             const uint4* iq2_sign, const uint8_t* b, int chunk, uint32_t (&o)[16]) {
  if constexpr (kType == kQ2K) {
    moe_grouped::q2k_chunk_bf16(b, chunk, o);
  } else if constexpr (kType == kQ3K) {
    moe_grouped::q3k_chunk_bf16(b, chunk, o);
  } else if constexpr (kType == kIQ2XXS) {
    moe_grouped::iq2xxs_chunk_bf16(b, chunk, iq2_sel, iq2_sign, o);
  } else {
    DeviceLinear w;
    w.ggml_type = kType >= 0 ? kType : type;
    w.tables = tables;
    float v[32];
    ggml_decode32_at(w, b, chunk, v);
#pragma unroll
    for (int i = 0; i < 16; ++i) o[i] = pack_bf16x2(v[2 * i], v[2 * i + 1]);
  }
}

template <int kType, bool kUp>
__global__ void __launch_bounds__(kThreads, 2) moe_ggml_gemm_sm90(const GemmParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  uint16_t* wt = reinterpret_cast<uint16_t*>(smem);            // [kRows][kStepK] bf16, swizzled
  uint16_t* xt = reinterpret_cast<uint16_t*>(smem + kWBytes);  // [kM][kStepK] bf16, swizzled
  uint8_t* raw = smem + kWBytes + kXBytes;                     // [2][kRows][units * 16] ggml bytes
  uint64_t* bars = reinterpret_cast<uint64_t*>(raw + 2 * kRows * p.units * 16);  // [2] one per raw stage
  uint2* iq2_sel = reinterpret_cast<uint2*>(bars + 2);                           // [256] (IQ2_XXS only)
  uint4* iq2_sign = reinterpret_cast<uint4*>(iq2_sel + 256);                     // [128] (IQ2_XXS only)
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int tile_i = int(blockIdx.x / unsigned(p.row_blocks));
  const int rb = int(blockIdx.x % unsigned(p.row_blocks));
  if (tile_i >= p.n_tiles) return;  // whole block: before any barrier
  const MoeGgmlTile tile = p.tiles[tile_i];
  const int rows = min(tile.rows, kM);
  if (rows <= 0) return;
  const int64_t n0 = int64_t(rb) * (kUp ? kRows / 2 : kRows);  // first output column of the block
  const int nkb = int(p.K / 256);
  const int row_stride = p.units * 16;  // bytes of one staged row

  // Weight row of tile row r (0..127): up, rows [0, 64) are w1 and [64, 128)
  // the same rows of w3; down, 128 consecutive rows of w2. Address of its
  // super-block kb; valid: the row exists (out need not be a multiple of the
  // block's rows).
  auto row_src = [&](int r, int kb, bool& valid) -> const uint8_t* {
    const bool second = kUp && r >= kRows / 2;
    const int64_t wrow = n0 + (kUp ? (r & (kRows / 2 - 1)) : r);
    valid = wrow < p.out;
    const uint8_t* base = kUp ? (second ? tile.w3 : tile.w1) : tile.w2;
    const int64_t rbytes = second ? p.row_bytes_b : p.row_bytes_a;
    const int64_t sb = second ? p.sb_b : p.sb_a;
    return base + (wrow * rbytes + int64_t(kb) * sb);
  };

  // Stage super-block kb of tile row r (threads 0..127, one row each): the
  // row's aligned window by one bulk copy, counted on the stage's mbarrier
  // (128 arrivals per phase; a missing row arrives with no bytes).
  auto issue_raw = [&](int kb, int r) {
    uint64_t* bar = bars + (kb & 1);
    bool valid;
    const uint8_t* src = row_src(r, kb, valid);
    if (!valid) {
      mbar_arrive(bar);
      return;
    }
    const moe_fast::Span16 sp = moe_fast::span16(src, (kUp && r >= kRows / 2) ? p.sb_b : p.sb_a);
    if (sp.bytes > uint32_t(row_stride)) __trap();  // the host sized the stages for every window
    moe_fast::mbar_expect_tx(bar, sp.bytes);
    moe_fast::bulk_g2s(raw + (kb & 1) * kRows * row_stride + r * row_stride, sp.base, sp.bytes, bar);
  };

  float acc[2][4][4];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int f = 0; f < 4; ++f)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][f][i] = 0.0f;

  const int wm = warp >> 2, wn = warp & 3;
  const bool m0_live = 32 * wm < rows, m1_live = 32 * wm + 16 < rows;  // warp-uniform

  if (tid == 0) {
    moe_fast::mbar_init(bars + 0, kRows);
    moe_fast::mbar_init(bars + 1, kRows);
    moe_fast::mbar_init_fence();
  }
  if constexpr (kType == kIQ2XXS) moe_grouped::stage_iq2_tables(p.tables, tid, iq2_sel, iq2_sign);  // kThreads == 256
  __syncthreads();
  if (tid < kRows) {
    issue_raw(0, tid);
    if (nkb > 1) issue_raw(1, tid);
  }

  for (int s = 0; s < 2 * nkb; ++s) {
    const int kb = s >> 1, h = s & 1;
    // Activation tile: 64 tokens x 16 units, 4 units per thread (16 lanes per
    // token row); tokens past the tile's count are zeros, not loads.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int q = tid + kThreads * i, t = q >> 4, u = q & 15;
      uint16_t* dst = xt + swz(t, u);
      if (t < rows)
        cp_async16(dst, p.x + (int64_t(tile.row0) + t) * p.K + int64_t(kb) * 256 + h * kStepK + u * 8);
      else
        *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
    }
    cp_async_commit();
    // Super-block kb's bytes (use n = kb / 2 of its stage: phase parity n & 1).
    if (h == 0) moe_fast::mbar_wait(bars + (kb & 1), uint32_t((kb >> 1) & 1));
    // Decode: lane (row r % 8 = lane % 8, chunk lane / 8 of this half), two rows per thread.
    {
      const uint8_t* stage = raw + (kb & 1) * kRows * row_stride;
      const int jj = lane >> 3;
#pragma unroll 1  // one row's 32 values live at a time: registers are the limit at two blocks per SM
      for (int i = 0; i < 2; ++i) {
        const int r = 64 * i + 8 * warp + (lane & 7);
        bool valid;
        const uint8_t* src = row_src(r, kb, valid);
        uint32_t o[16];
        if (valid) {
          decode_chunk<kType>(kUp && i == 1 ? p.type_b : p.type_a, p.tables, iq2_sel, iq2_sign,
                              stage + r * row_stride + int(reinterpret_cast<uintptr_t>(src) & 15), 4 * h + jj, o);
        } else {
#pragma unroll
          for (int k = 0; k < 16; ++k) o[k] = 0u;
        }
#pragma unroll
        for (int q = 0; q < 4; ++q)
          *reinterpret_cast<uint4*>(wt + swz(r, 4 * jj + q)) =
              make_uint4(o[4 * q], o[4 * q + 1], o[4 * q + 2], o[4 * q + 3]);
      }
    }
    cp_async_wait_all();  // this thread's activation units have landed
    __syncthreads();      // both tiles complete; after h == 1 no thread reads stage kb & 1 again
    if (h == 1 && kb + 2 < nkb && tid < kRows) issue_raw(kb + 2, tid);  // into the stage kb just left
    if (m0_live) {
#pragma unroll
      for (int kk = 0; kk < kStepK / 16; ++kk) {
        uint32_t a0[4], a1[4], b[2][4];
        ldsm_x4(a0, xt + swz(32 * wm + (lane & 15), 2 * kk + (lane >> 4)));
        if (m1_live) ldsm_x4(a1, xt + swz(32 * wm + 16 + (lane & 15), 2 * kk + (lane >> 4)));
#pragma unroll
        for (int fp = 0; fp < 2; ++fp) {
          // Two 8-row B fragments (rows nb..nb+7 and nb+8..nb+15) of k 16 kk..16 kk + 15.
          const int nb = kUp ? fp * (kRows / 2) + 16 * wn : 32 * wn + 16 * fp;
          const int r = nb + (lane & 7) + ((lane >> 4) << 3);
          ldsm_x4(b[fp], wt + swz(r, 2 * kk + ((lane >> 3) & 1)));
        }
#pragma unroll
        for (int f = 0; f < 4; ++f) mma_bf16_16816(acc[0][f], a0, b[f >> 1][2 * (f & 1)], b[f >> 1][2 * (f & 1) + 1]);
        if (m1_live) {
#pragma unroll
          for (int f = 0; f < 4; ++f)
            mma_bf16_16816(acc[1][f], a1, b[f >> 1][2 * (f & 1)], b[f >> 1][2 * (f & 1) + 1]);
        }
      }
    }
    __syncthreads();  // tiles free for the next step
  }

  // Epilogue. Accumulator f of m-fragment m: rows g and g + 8 (c[0..1], c[2..3]),
  // columns 2c, 2c + 1 of its 8-column fragment.
  const int g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int m = 0; m < 2; ++m) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int t = 32 * wm + 16 * m + g + 8 * hh;
      if (t >= rows) continue;
      const int64_t orow = int64_t(tile.row0) + t;
      if constexpr (kUp) {
#pragma unroll
        for (int f = 0; f < 2; ++f) {  // gate fragments f, up fragments f + 2: the same columns
          const int64_t col = n0 + 16 * wn + 8 * f + 2 * c;
          if (col >= p.out) continue;
          const float v0 = swiglu_clamp(acc[m][f][2 * hh], acc[m][f + 2][2 * hh], p.limit);
          const float v1 = swiglu_clamp(acc[m][f][2 * hh + 1], acc[m][f + 2][2 * hh + 1], p.limit);
          *reinterpret_cast<uint32_t*>(p.act + orow * p.out + col) = pack_bf16x2(v0, v1);
        }
      } else {
        // Written in pair order: the pass that scattered a sorted copy is gone.
        const int64_t yrow = p.pair_of_slot[orow];
#pragma unroll
        for (int f = 0; f < 4; ++f) {
          const int64_t col = n0 + 32 * wn + 8 * f + 2 * c;
          if (col >= p.out) continue;
          *reinterpret_cast<float2*>(p.y + yrow * p.out + col) = make_float2(acc[m][f][2 * hh], acc[m][f][2 * hh + 1]);
        }
      }
    }
  }
}

bool decodable(int32_t type) {
  switch (GgmlType(type)) {
    case GgmlType::kQ8_0:
    case GgmlType::kMXFP4:
    case GgmlType::kIQ4_NL:
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
    case GgmlType::kIQ4_XS:
    case GgmlType::kIQ2_XXS:
    case GgmlType::kIQ2_XS:
    case GgmlType::kIQ3_XXS:
    case GgmlType::kIQ1_S:
    case GgmlType::kIQ1_M: return true;
    default: return false;
  }
}

using Kernel = void (*)(GemmParams);

// The compiled instantiation for a (w1 = w3 or w2) type: the V4 recipes' types
// and Q4_K with the type fixed, everything else (and gate/up of different
// types) through the run-time switch of the decoder.
template <bool kUp>
Kernel pick(int32_t type) {
  switch (GgmlType(type)) {
    case GgmlType::kQ2_K: return moe_ggml_gemm_sm90<int(GgmlType::kQ2_K), kUp>;
    case GgmlType::kQ3_K: return moe_ggml_gemm_sm90<int(GgmlType::kQ3_K), kUp>;
    case GgmlType::kQ4_K: return moe_ggml_gemm_sm90<int(GgmlType::kQ4_K), kUp>;
    case GgmlType::kIQ2_XXS: return moe_ggml_gemm_sm90<int(GgmlType::kIQ2_XXS), kUp>;
    default: return moe_ggml_gemm_sm90<-1, kUp>;
  }
}

Status launch(Kernel k, bool iq2_tables, const GemmParams& p, const char* name, cudaStream_t stream) {
  if (p.n_tiles <= 0 || p.row_blocks <= 0) return Status::ok();
  const int64_t grid = int64_t(p.n_tiles) * p.row_blocks;
  if (grid > INT32_MAX) return internal_error(std::string(name) + ": grid too large");
  const int smem = smem_bytes(p.units, iq2_tables);
  AFF_RETURN_IF_ERROR(raise_smem_limit(reinterpret_cast<const void*>(k), smem));
  k<<<unsigned(grid), kThreads, size_t(smem), stream>>>(p);
  return launch_status(name);
}

}  // namespace

Result<MoeGgmlLayout> moe_ggml_layout(const ExpertSlot* slots, size_t n, int64_t D, int64_t inter) {
  if (slots == nullptr || n == 0) return unsupported("moe_ggml: no experts");
  if (D <= 0 || inter <= 0 || D % 256 != 0 || inter % 256 != 0)
    return unsupported("moe_ggml: D and inter must be multiples of 256");
  const ExpertSlot& f = slots[0];
  auto same = [](const DeviceLinear& a, const DeviceLinear& b) {
    return a.format == DevFormat::kGgml && b.format == DevFormat::kGgml && a.ggml_type == b.ggml_type &&
           a.row_bytes == b.row_bytes && a.tables == b.tables && a.out == b.out && a.in == b.in;
  };
  for (size_t e = 0; e < n; ++e) {
    const ExpertSlot& s = slots[e];
    if (!same(s.w1, f.w1) || !same(s.w3, f.w3) || !same(s.w2, f.w2))
      return unsupported("moe_ggml: experts differ in format, type or row size");
    // Staged windows are read at 16-byte granularity around each row's bytes:
    // a tensor must start on a 16-byte boundary (the arena gives 256).
    for (const DeviceLinear* w : {&s.w1, &s.w3, &s.w2})
      if (reinterpret_cast<uintptr_t>(w->weight) % 16 != 0)
        return unsupported("moe_ggml: expert weights not 16-byte aligned");
  }
  if (f.w1.tables == nullptr || f.w3.tables != f.w1.tables || f.w2.tables != f.w1.tables)
    return unsupported("moe_ggml: no ggml tables");
  if (f.w1.out != inter || f.w1.in != D || f.w3.out != inter || f.w3.in != D || f.w2.out != D || f.w2.in != inter)
    return unsupported("moe_ggml: expert shape differs from [inter, D] / [D, inter]");
  for (const DeviceLinear* w : {&f.w1, &f.w3, &f.w2}) {
    if (!decodable(w->ggml_type)) return unsupported("moe_ggml: ggml type without a device decoder");
    const int64_t sb = sb_bytes(*w);
    if (sb <= 0 || slot_units(sb) > kMaxSlotUnits) return unsupported("moe_ggml: row size does not fit the stages");
  }
  return MoeGgmlLayout{f.w1, f.w3, f.w2};
}

Status moe_ggml_up(const MoeGgmlLayout& l, const MoeGgmlTile* tiles, int n_tiles, const uint16_t* x,
                   float swiglu_limit, uint16_t* act, cudaStream_t stream) {
  GemmParams p;
  p.tiles = tiles, p.n_tiles = n_tiles, p.row_blocks = int32_t((l.w1.out + kRows / 2 - 1) / (kRows / 2));
  p.x = x, p.K = l.w1.in, p.out = l.w1.out;
  p.type_a = l.w1.ggml_type, p.type_b = l.w3.ggml_type;
  p.row_bytes_a = l.w1.row_bytes, p.row_bytes_b = l.w3.row_bytes;
  p.sb_a = int32_t(sb_bytes(l.w1)), p.sb_b = int32_t(sb_bytes(l.w3));
  p.units = slot_units(std::max(p.sb_a, p.sb_b));
  p.tables = l.w1.tables, p.limit = swiglu_limit, p.act = act;
  if (p.K % 256 != 0 || p.sb_a <= 0 || p.sb_b <= 0 || p.units > kMaxSlotUnits)
    return internal_error("moe_ggml_up: layout not checked by moe_ggml_layout");
  const bool same = l.w1.ggml_type == l.w3.ggml_type;
  const Kernel k = same ? pick<true>(l.w1.ggml_type) : moe_ggml_gemm_sm90<-1, true>;
  return launch(k, same && l.w1.ggml_type == kIQ2XXS, p, "moe_ggml_up_sm90", stream);
}

Status moe_ggml_down(const MoeGgmlLayout& l, const MoeGgmlTile* tiles, int n_tiles, const uint16_t* act,
                     const int32_t* pair_of_slot, float* y, cudaStream_t stream) {
  GemmParams p;
  p.tiles = tiles, p.n_tiles = n_tiles, p.row_blocks = int32_t((l.w2.out + kRows - 1) / kRows);
  p.x = act, p.K = l.w2.in, p.out = l.w2.out;
  p.type_a = p.type_b = l.w2.ggml_type;
  p.row_bytes_a = p.row_bytes_b = l.w2.row_bytes;
  p.sb_a = p.sb_b = int32_t(sb_bytes(l.w2));
  p.units = slot_units(p.sb_a);
  p.tables = l.w2.tables, p.y = y, p.pair_of_slot = pair_of_slot;
  if (p.K % 256 != 0 || p.sb_a <= 0 || p.units > kMaxSlotUnits)
    return internal_error("moe_ggml_down: layout not checked by moe_ggml_layout");
  return launch(pick<false>(l.w2.ggml_type), l.w2.ggml_type == kIQ2XXS, p, "moe_ggml_down_sm90", stream);
}

}  // namespace aff::cuda
