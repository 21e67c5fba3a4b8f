// AMX-INT8 kernels for the batched product (GemmFn: several tokens against one row
// block, as in prefill and for experts that several tokens picked). A tile multiply does
// 16 rows x 16 tokens x 64 inputs in one instruction, so the integer dot products cost
// next to nothing and what remains per weight is its decode, once for up to 16 tokens:
//   - weights are the A operand, 16 rows x 64 (Q8_0: 32) inputs of int8: Q8_0's quants
//     are loaded straight from the weight rows (tileloadd with the row stride); K-quant
//     blocks are decoded row by row into a small buffer of products that fit a byte:
//       Q2_K: scale x code (<= 15 x 3) and the block's min per input (<= 15);
//       Q4_K: the 6-bit scale split as 8 hi + lo (each <= 7) times the code (<= 15), and
//             the min per input (<= 63);
//     each product its own A tile and int32 accumulator tile, so a super-block's 256
//     inputs accumulate in integers and are scaled in f32 once, like the VNNI kernels do;
//   - activations are the B operand, in the tile's 4-byte interleaved layout (row r: inputs
//     4r .. 4r+3 of each of 16 tokens), laid out once per call; tokens past n are zeros;
//   - after each weight block (Q8_0) or super-block (K-quants) the int32 tiles are stored
//     and scaled in AVX-512: per row d_w (and dmin) times the 16 tokens' activation d.
// Results equal the VNNI kernels' up to f32 rounding (the integer block dots are exact in
// both; the f32 sums are taken in another order), not bit for bit.
//
// Tile operations go through a small interface with two implementations: the hardware
// (HwTiles, compiled for AMX) and a plain C++ model of the same instructions (EmuTiles),
// so the decode, layout and scaling code is tested on every CPU with AVX-512 VBMI, and
// on AMX hosts the hardware result is checked against the model bit for bit.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "backend/cpu/act_quant.h"
#include "backend/cpu/isa/gemv_isa.h"
#include "backend/cpu/isa/kernel_common.h"

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,bmi2,amx-tile,amx-int8")
// GCC 12 flags the deliberately undefined upper halves inside its own intrinsics.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "backend/cpu/isa/avx512_common.h"

namespace aff::cpu::isa {
namespace {

// ldtilecfg's 64-byte operand, palette 1: per tile its rows and bytes per row.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// The hardware tiles. The intrinsics paste their tile number into the instruction text,
// so it must be a literal: each template argument is mapped to one.
#define AFF_TILE_LITERAL(T, OP)     \
  if constexpr (T == 0) {           \
    OP(0);                          \
  } else if constexpr (T == 1) {    \
    OP(1);                          \
  } else if constexpr (T == 2) {    \
    OP(2);                          \
  } else if constexpr (T == 3) {    \
    OP(3);                          \
  } else if constexpr (T == 4) {    \
    OP(4);                          \
  } else if constexpr (T == 5) {    \
    OP(5);                          \
  } else if constexpr (T == 6) {    \
    OP(6);                          \
  } else {                          \
    static_assert(T == 7);          \
    OP(7);                          \
  }
// The (C, A, B) triples the kernels below use: product p accumulates A tile kProducts + p
// times B tile 2 kProducts into C tile p.
#define AFF_TILE_DP(INSN, C, A, B)                              \
  if constexpr (C == 0 && A == 1 && B == 2) {                   \
    INSN(0, 1, 2);                                              \
  } else if constexpr (C == 0 && A == 2 && B == 4) {            \
    INSN(0, 2, 4);                                              \
  } else if constexpr (C == 1 && A == 3 && B == 4) {            \
    INSN(1, 3, 4);                                              \
  } else if constexpr (C == 0 && A == 3 && B == 6) {            \
    INSN(0, 3, 6);                                              \
  } else if constexpr (C == 1 && A == 4 && B == 6) {            \
    INSN(1, 4, 6);                                              \
  } else {                                                      \
    static_assert(C == 2 && A == 5 && B == 6);                  \
    INSN(2, 5, 6);                                              \
  }

struct HwTiles {
  void config(const TileConfig& c) { _tile_loadconfig(&c); }
  void release() { _tile_release(); }
  template <int T>
  void zero() {
#define AFF_OP(i) _tile_zero(i)
    AFF_TILE_LITERAL(T, AFF_OP)
#undef AFF_OP
  }
  template <int T>
  void load(const void* p, int64_t stride) {
#define AFF_OP(i) _tile_loadd(i, p, stride)
    AFF_TILE_LITERAL(T, AFF_OP)
#undef AFF_OP
  }
  template <int T>
  void store(void* p, int64_t stride) {
#define AFF_OP(i) _tile_stored(i, p, stride)
    AFF_TILE_LITERAL(T, AFF_OP)
#undef AFF_OP
  }
  template <int C, int A, int B>
  void dp_ss() {  // s8 x s8
    AFF_TILE_DP(_tile_dpbssd, C, A, B)
  }
  template <int C, int A, int B>
  void dp_us() {  // u8 x s8
    AFF_TILE_DP(_tile_dpbusd, C, A, B)
  }
};
#undef AFF_TILE_DP
#undef AFF_TILE_LITERAL

// The same instructions on memory, as the ISA defines them: a load fills `rows` rows of
// `colsb` bytes and zeroes the rest; C[m][n] (int32, n < colsb(C) / 4) += sum over k <
// colsb(A) / 4 and i < 4 of A[m][4k + i] * B[k][4n + i].
class EmuTiles {
 public:
  void config(const TileConfig& c) {
    cfg_ = c;
    std::memset(reg_, 0, sizeof(reg_));
  }
  void release() {}
  template <int T>
  void zero() { std::memset(reg_[T], 0, sizeof(reg_[T])); }
  template <int T>
  void load(const void* p, int64_t stride) {
    std::memset(reg_[T], 0, sizeof(reg_[T]));
    for (int r = 0; r < cfg_.rows[T]; ++r) std::memcpy(reg_[T][r], static_cast<const uint8_t*>(p) + r * stride, cfg_.colsb[T]);
  }
  template <int T>
  void store(void* p, int64_t stride) {
    for (int r = 0; r < cfg_.rows[T]; ++r) std::memcpy(static_cast<uint8_t*>(p) + r * stride, reg_[T][r], cfg_.colsb[T]);
  }
  template <int C, int A, int B>
  void dp_ss() { dp<int8_t>(C, A, B); }
  template <int C, int A, int B>
  void dp_us() { dp<uint8_t>(C, A, B); }

 private:
  template <class TA>
  void dp(int c, int a, int b) {
    for (int m = 0; m < cfg_.rows[c]; ++m) {
      for (int n = 0; n < cfg_.colsb[c] / 4; ++n) {
        int32_t acc;
        std::memcpy(&acc, reg_[c][m] + 4 * n, 4);
        for (int k = 0; k < cfg_.colsb[a] / 4; ++k) {
          for (int i = 0; i < 4; ++i) acc += int32_t(TA(reg_[a][m][4 * k + i])) * int32_t(int8_t(reg_[b][k][4 * n + i]));
        }
        std::memcpy(reg_[c][m] + 4 * n, &acc, 4);
      }
    }
  }

  TileConfig cfg_;
  uint8_t reg_[8][16][64];
};

constexpr int kTileRows = 16;    // weight rows per tile (M)
constexpr int kTileTokens = 16;  // tokens per tile (N)

// One row of an int32 result tile (16 tokens) as f32. The formats' epilogue(c, rs, dx,
// acc) adds one weight row's block to its 16 tokens' sums: c[p] = that row of product p's
// tile, rs = the row's scale factors for the block, dx = the tokens' activation d.
inline __m512 load_c(const int32_t* c) { return _mm512_cvtepi32_ps(_mm512_loadu_si512(c)); }

// Byte j of each 16-byte lane: j * s for the lane's s (words 2w + 256 (2w + 1) times s in
// vpmullw; no carry while 15 s < 256).
struct Ramp {
  uint16_t w[32] = {};
  constexpr Ramp() {
    for (int i = 0; i < 32; ++i) w[i] = uint16_t((2 * (i % 8)) | ((2 * (i % 8) + 1) << 8));
  }
};
constexpr Ramp kRamp{};

inline __m512i load64(const void* p) { return _mm512_loadu_si512(p); }

// Q8_0: the weight quants are the A tile as stored (32 per block, one K = 32 step).
struct AmxQ8_0 {
  using Block = quant::BlockQ8_0;
  static constexpr int kBlockElems = 32;   // inputs per weight block = per activation block
  static constexpr int kChunk = 32;        // inputs per tile step
  static constexpr int kChunks = 1;        // steps per block
  static constexpr int kProducts = 1;      // A tiles (and int32 accumulators) per step
  static constexpr int kRowScales = 1;
  static constexpr bool kDirectA = true;   // A loaded from the weight rows
  static constexpr bool kSignedA = true;
  static constexpr int64_t kActBlockBytes = sizeof(ActQ8_0);
  static constexpr int64_t kActQsOffset = offsetof(ActQ8_0, qs);
  static constexpr int64_t kWeightQsOffset = offsetof(quant::BlockQ8_0, qs);

  static void row_scales(const Block& b, float* rs) { rs[0] = f16(b.d); }
  static __m512 epilogue(const int32_t* const* c, const float* rs, __m512 dx, __m512 acc) {
    return _mm512_fmadd_ps(load_c(c[0]), _mm512_mul_ps(dx, _mm512_set1_ps(rs[0])), acc);
  }
};

// Q2_K: 16 sub-blocks of 16, 2-bit codes, 4-bit scale and min each. Chunk c (inputs 64c ..
// 64c + 63) is sub-blocks 4c .. 4c + 3, one per 16-byte lane.
struct Q2KTables {
  uint8_t scale_ctrl[4][64] = {};  // byte 16L + 2w <- scale byte 4c + L (odd bytes zeroed)
  uint8_t min_ctrl[4][64] = {};    // every byte of lane L <- min byte 4c + L
  constexpr Q2KTables() {
    for (int c = 0; c < 4; ++c) {
      for (int i = 0; i < 64; ++i) {
        scale_ctrl[c][i] = uint8_t(4 * c + i / 16);
        min_ctrl[c][i] = uint8_t(4 * c + i / 16);
      }
    }
  }
};
constexpr Q2KTables kQ2K{};

struct AmxQ2K {
  using Block = quant::BlockQ2K;
  static constexpr int kBlockElems = 256;
  static constexpr int kChunk = 64;
  static constexpr int kChunks = 4;
  static constexpr int kProducts = 2;  // scale x code, min
  static constexpr int kRowScales = 2;
  static constexpr bool kDirectA = false;
  static constexpr bool kSignedA = false;
  static constexpr int64_t kActBlockBytes = sizeof(ActQ8K);
  static constexpr int64_t kActQsOffset = offsetof(ActQ8K, qs);
  static constexpr int64_t kWeightQsOffset = 0;

  // Writes this row's 64 bytes of product p for chunk c at a + p * product_pitch +
  // c * chunk_pitch, and its d and dmin to rs.
  static void decode(const Block& b, uint8_t* a, int64_t chunk_pitch, int64_t product_pitch, float* rs) {
    const __m128i s8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
    const __m512i sc = _mm512_castsi128_si512(_mm_and_si128(s8, _mm_set1_epi8(0x0f)));
    const __m512i mn = _mm512_castsi128_si512(_mm_and_si128(_mm_srli_epi16(s8, 4), _mm_set1_epi8(0x0f)));
    const __m512i ramp = load64(kRamp.w);
    const __m512i m3 = _mm512_set1_epi8(3);
    // Chunk c = 2n + jj: qs[32n ..] shifted by 2 (2jj) (inputs 64c .. +31) and 2 (2jj + 1)
    // (64c + 32 .. +63).
    const __m512i shift01 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i shift23 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
    for (int c = 0; c < 4; ++c) {
      const __m512i qq = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * (c / 2))));
      const __m512i code = _mm512_and_si512(_mm512_srlv_epi16(qq, (c & 1) ? shift23 : shift01), m3);
      const __m512i tab =
          _mm512_mullo_epi16(_mm512_maskz_permutexvar_epi8(0x5555555555555555ull, load64(kQ2K.scale_ctrl[c]), sc), ramp);
      _mm512_storeu_si512(a + c * chunk_pitch, _mm512_shuffle_epi8(tab, code));
      _mm512_storeu_si512(a + product_pitch + c * chunk_pitch, _mm512_permutexvar_epi8(load64(kQ2K.min_ctrl[c]), mn));
    }
    rs[0] = f16(b.d);
    rs[1] = f16(b.dmin);
  }
  static __m512 epilogue(const int32_t* const* c, const float* rs, __m512 dx, __m512 acc) {
    acc = _mm512_fmadd_ps(load_c(c[0]), _mm512_mul_ps(dx, _mm512_set1_ps(rs[0])), acc);
    return _mm512_fnmadd_ps(load_c(c[1]), _mm512_mul_ps(dx, _mm512_set1_ps(rs[1])), acc);
  }
};

// Q4_K: 8 sub-blocks of 32, 4-bit codes, 6-bit scale and min each. Chunk k (inputs 64k ..
// 64k + 63) is sub-block 2k (lanes 0-1, the low nibbles of qs[32k ..]) and 2k + 1 (lanes
// 2-3, the high nibbles).
struct Q4KTables {
  uint8_t scale_ctrl[4][64] = {};  // byte 16L + 2w <- byte 2k + L / 2 (odd bytes zeroed)
  uint8_t min_ctrl[4][64] = {};    // every byte of lane L <- byte 2k + L / 2
  constexpr Q4KTables() {
    for (int k = 0; k < 4; ++k) {
      for (int i = 0; i < 64; ++i) {
        scale_ctrl[k][i] = uint8_t(2 * k + i / 32);
        min_ctrl[k][i] = uint8_t(2 * k + i / 32);
      }
    }
  }
};
constexpr Q4KTables kQ4K{};

struct AmxQ4K {
  using Block = quant::BlockQ4K;
  static constexpr int kBlockElems = 256;
  static constexpr int kChunk = 64;
  static constexpr int kChunks = 4;
  static constexpr int kProducts = 3;  // (scale / 8) x code, (scale % 8) x code, min
  static constexpr int kRowScales = 2;
  static constexpr bool kDirectA = false;
  static constexpr bool kSignedA = false;
  static constexpr int64_t kActBlockBytes = sizeof(ActQ8K);
  static constexpr int64_t kActQsOffset = offsetof(ActQ8K, qs);
  static constexpr int64_t kWeightQsOffset = 0;

  static void decode(const Block& b, uint8_t* a, int64_t chunk_pitch, int64_t product_pitch, float* rs) {
    uint64_t sc, mn;
    q4k_unpack_scales(b.scales, &sc, &mn);
    const __m128i s8 = _mm_cvtsi64_si128(int64_t(sc));
    const __m512i hi = _mm512_castsi128_si512(_mm_and_si128(_mm_srli_epi16(s8, 3), _mm_set1_epi8(7)));
    const __m512i lo = _mm512_castsi128_si512(_mm_and_si128(s8, _mm_set1_epi8(7)));
    const __m512i mv = _mm512_castsi128_si512(_mm_cvtsi64_si128(int64_t(mn)));
    const __m512i ramp = load64(kRamp.w);
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    for (int k = 0; k < 4; ++k) {
      const __m512i qq = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * k)));
      const __m512i code = _mm512_and_si512(_mm512_srlv_epi16(qq, shift), m4);
      const __m512i ctrl = load64(kQ4K.scale_ctrl[k]);
      const __m512i tab_hi = _mm512_mullo_epi16(_mm512_maskz_permutexvar_epi8(0x5555555555555555ull, ctrl, hi), ramp);
      const __m512i tab_lo = _mm512_mullo_epi16(_mm512_maskz_permutexvar_epi8(0x5555555555555555ull, ctrl, lo), ramp);
      _mm512_storeu_si512(a + k * chunk_pitch, _mm512_shuffle_epi8(tab_hi, code));
      _mm512_storeu_si512(a + product_pitch + k * chunk_pitch, _mm512_shuffle_epi8(tab_lo, code));
      _mm512_storeu_si512(a + 2 * product_pitch + k * chunk_pitch, _mm512_permutexvar_epi8(load64(kQ4K.min_ctrl[k]), mv));
    }
    rs[0] = f16(b.d);
    rs[1] = f16(b.dmin);
  }
  static __m512 epilogue(const int32_t* const* c, const float* rs, __m512 dx, __m512 acc) {
    // 8 hi + lo: |sum| <= 256 * 63 * 15 * 127 < 2^31.
    const __m512i s = _mm512_add_epi32(_mm512_slli_epi32(_mm512_loadu_si512(c[0]), 3), _mm512_loadu_si512(c[1]));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dx, _mm512_set1_ps(rs[0])), acc);
    return _mm512_fnmadd_ps(load_c(c[2]), _mm512_mul_ps(dx, _mm512_set1_ps(rs[1])), acc);
  }
};

// Per-thread scratch that grows to the largest call.
struct AmxScratch {
  std::vector<uint8_t> b;   // activations in the B layout: [token tile][block][chunk][kChunk/4][64]
  std::vector<float> dx;    // [token tile][block][16]: the tokens' activation d (0 past n)
  std::vector<float> acc;   // [token tile][16 rows][16 tokens]
  std::vector<uint8_t> a;   // decoded weights: [product][chunk][16 rows][64]
};

template <class F, int... P>
void tile_steps(auto& tiles, const uint8_t* a_base, int64_t a_stride, int64_t a_pitch, const uint8_t* b,
                std::integer_sequence<int, P...>) {
  constexpr int kB = 2 * F::kProducts;
  tiles.template load<kB>(b, 64);
  (tiles.template load<F::kProducts + P>(a_base + P * a_pitch, a_stride), ...);
  if constexpr (F::kSignedA) {
    (tiles.template dp_ss<P, F::kProducts + P, kB>(), ...);
  } else {
    (tiles.template dp_us<P, F::kProducts + P, kB>(), ...);
  }
}

template <int... P>
void tiles_zero(auto& tiles, std::integer_sequence<int, P...>) {
  (tiles.template zero<P>(), ...);
}

template <int... P>
void tiles_store(auto& tiles, int32_t* c, std::integer_sequence<int, P...>) {
  (tiles.template store<P>(c + P * kTileRows * 16, 64), ...);
}

template <class F>
void configure(auto& tiles, int m) {
  TileConfig cfg;
  for (int p = 0; p < F::kProducts; ++p) {
    cfg.rows[p] = uint8_t(m), cfg.colsb[p] = 64;                               // C: m rows x 16 tokens
    cfg.rows[F::kProducts + p] = uint8_t(m), cfg.colsb[F::kProducts + p] = F::kChunk;  // A
  }
  cfg.rows[2 * F::kProducts] = F::kChunk / 4, cfg.colsb[2 * F::kProducts] = 64;  // B
  tiles.config(cfg);
}

// Lays the n tokens' activations out as B tiles and gathers their d per block.
template <class F>
void prepare_acts(const uint8_t* act, int64_t act_stride, int64_t n, int64_t nb, AmxScratch& s) {
  const int64_t nt = (n + kTileTokens - 1) / kTileTokens;
  constexpr int kBRows = F::kChunk / 4;
  s.b.resize(size_t(nt * nb * F::kChunks * kBRows * 64));
  s.dx.resize(size_t(nt * nb * 16));
  const __m512i tok = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                         _mm512_set1_epi32(int32_t(act_stride)));
  for (int64_t tt = 0; tt < nt; ++tt) {
    const int64_t nv = std::min<int64_t>(kTileTokens, n - tt * kTileTokens);
    const __mmask16 valid = __mmask16((1u << nv) - 1);
    const uint8_t* base = act + tt * kTileTokens * act_stride;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = base + b * F::kActBlockBytes;
      _mm512_storeu_ps(s.dx.data() + (tt * nb + b) * 16,
                       _mm512_mask_i32gather_ps(_mm512_setzero_ps(), valid, tok, blk, 1));
      uint8_t* out = s.b.data() + (tt * nb + b) * F::kChunks * kBRows * 64;
      for (int r = 0; r < F::kChunks * kBRows; ++r) {
        // B row r: inputs 4r .. 4r + 3 of each token (dword t).
        const __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, tok, blk + F::kActQsOffset + 4 * r, 1);
        _mm512_storeu_si512(out + 64 * r, v);
      }
    }
  }
}

template <class F, class Tiles>
void amx_gemm(Tiles& tiles, const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t cols, const void* act,
              int64_t act_stride, int64_t n, float* y, int64_t ldy) {
  using Block = typename F::Block;
  if (rows <= 0 || n <= 0) return;
  const int64_t nb = cols / F::kBlockElems;
  const int64_t nt = (n + kTileTokens - 1) / kTileTokens;
  constexpr int kBRows = F::kChunk / 4;
  constexpr int64_t kAPitch = int64_t(F::kChunks) * kTileRows * 64;  // bytes per product
  thread_local AmxScratch s;
  prepare_acts<F>(static_cast<const uint8_t*>(act), act_stride, n, nb, s);
  s.acc.resize(size_t(nt * kTileRows * kTileTokens));
  s.a.resize(size_t(F::kProducts * kAPitch));
  alignas(64) int32_t cbuf[F::kProducts][kTileRows][16];
  float rs[kTileRows][F::kRowScales];
  constexpr auto kP = std::make_integer_sequence<int, F::kProducts>{};
  int configured = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += kTileRows) {
    const int m = int(std::min<int64_t>(kTileRows, rows - r0));
    if (m != configured) configure<F>(tiles, m), configured = m;
    std::fill(s.acc.begin(), s.acc.end(), 0.0f);
    const uint8_t* wt = w + r0 * row_bytes;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* a_base;
      int64_t a_stride, a_chunk;
      if constexpr (F::kDirectA) {
        for (int i = 0; i < m; ++i) F::row_scales(reinterpret_cast<const Block*>(wt + i * row_bytes)[b], rs[i]);
        a_base = wt + b * int64_t(sizeof(Block)) + F::kWeightQsOffset, a_stride = row_bytes, a_chunk = F::kChunk;
      } else {
        for (int i = 0; i < m; ++i) {
          F::decode(reinterpret_cast<const Block*>(wt + i * row_bytes)[b], s.a.data() + 64 * i, kTileRows * 64, kAPitch,
                    rs[i]);
        }
        a_base = s.a.data(), a_stride = 64, a_chunk = kTileRows * 64;
      }
      for (int64_t tt = 0; tt < nt; ++tt) {
        tiles_zero(tiles, kP);
        const uint8_t* bt = s.b.data() + (tt * nb + b) * F::kChunks * kBRows * 64;
        for (int c = 0; c < F::kChunks; ++c) {
          tile_steps<F>(tiles, a_base + c * a_chunk, a_stride, kAPitch, bt + c * kBRows * 64, kP);
        }
        tiles_store(tiles, &cbuf[0][0][0], kP);
        const __m512 dx = _mm512_loadu_ps(s.dx.data() + (tt * nb + b) * 16);
        float* acc = s.acc.data() + tt * kTileRows * kTileTokens;
        for (int i = 0; i < m; ++i) {
          const int32_t* c[F::kProducts];
          for (int p = 0; p < F::kProducts; ++p) c[p] = cbuf[p][i];
          _mm512_storeu_ps(acc + 16 * i, F::epilogue(c, rs[i], dx, _mm512_loadu_ps(acc + 16 * i)));
        }
      }
    }
    for (int64_t tt = 0; tt < nt; ++tt) {
      const int64_t nv = std::min<int64_t>(kTileTokens, n - tt * kTileTokens);
      const float* acc = s.acc.data() + tt * kTileRows * kTileTokens;
      for (int64_t t = 0; t < nv; ++t) {
        float* yt = y + (tt * kTileTokens + t) * ldy + r0;
        for (int i = 0; i < m; ++i) yt[i] = acc[16 * i + t];
      }
    }
  }
  tiles.release();
}

template <class F>
void gemm_hw(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* act, int64_t as, int64_t n,
             float* y, int64_t ldy) {
  HwTiles tiles;
  amx_gemm<F>(tiles, w, rb, rows, cols, act, as, n, y, ldy);
}

template <class F>
void gemm_emu(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* act, int64_t as, int64_t n,
              float* y, int64_t ldy) {
  EmuTiles tiles;
  amx_gemm<F>(tiles, w, rb, rows, cols, act, as, n, y, ldy);
}

}  // namespace

#define AFF_AMX_KERNELS(wname, F)                                                                                \
  void gemm_##wname##_amx(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* a, int64_t as,   \
                          int64_t n, float* y, int64_t ldy) {                                                    \
    gemm_hw<F>(w, rb, rows, cols, a, as, n, y, ldy);                                                             \
  }                                                                                                              \
  void gemm_##wname##_amxemu(const uint8_t* w, int64_t rb, int64_t rows, int64_t cols, const void* a, int64_t as, \
                             int64_t n, float* y, int64_t ldy) {                                                 \
    gemm_emu<F>(w, rb, rows, cols, a, as, n, y, ldy);                                                            \
  }
AFF_AMX_KERNELS(q8_0_q8_0, AmxQ8_0)
AFF_AMX_KERNELS(q2k_q8k, AmxQ2K)
AFF_AMX_KERNELS(q4k_q8k, AmxQ4K)
#undef AFF_AMX_KERNELS

}  // namespace aff::cpu::isa

#pragma GCC diagnostic pop
#pragma GCC pop_options
#else
namespace aff::cpu::isa {
AFF_UNREACHABLE_GEMM(gemm_q8_0_q8_0_amx)
AFF_UNREACHABLE_GEMM(gemm_q2k_q8k_amx)
AFF_UNREACHABLE_GEMM(gemm_q4k_q8k_amx)
AFF_UNREACHABLE_GEMM(gemm_q8_0_q8_0_amxemu)
AFF_UNREACHABLE_GEMM(gemm_q2k_q8k_amxemu)
AFF_UNREACHABLE_GEMM(gemm_q4k_q8k_amxemu)
}  // namespace aff::cpu::isa
#endif
