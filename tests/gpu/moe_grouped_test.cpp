// The grouped prefill experts (kernels/gemm/moe_grouped) against expert_ffn,
// the per-pair GEMV path that tests/gpu holds to the CPU reference: random
// experts in FP8 block, MXFP4 and BF16, tokens whose pairs leave some experts
// unused and give others many tokens, with and without the SwiGLU clamp.
// MoeGroupedGgmlDecode (host only, no GPU needed): the fused kernels'
// conversion-free chunk decoders equal bf16_rn of the CPU reference decoders
// bit for bit, the second form's sub-block decoders equal the chunk decoders,
// and its permuted MMA fragments give the full dot product. MoeGroupedGgml:
// the fused kernels for ggml experts, both forms (moe_grouped_set_ggml_kernel),
// against a CPU reference (rows dequantised by src/quant, f64 dots), token
// counts per expert around the 64-token tile (0, 1, 63, 64, 65, 130), small
// and V4-sized shapes, both MMA precisions, repeatability, agreement with the
// per-expert cuBLAS path on the same bf16 operands, and of the two forms.
// MoeGroupedGgmlForms: the two forms launch by launch at V4 geometry.
// MoeGroupedBench times the forms and cuBLAS at V4 geometry.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/check/op_check.h"
#include "backend/cuda/kernels/common/ggml_tables.h"
#include "backend/cuda/kernels/gemm/moe_grouped.h"
#include "backend/cuda/kernels/gemm/moe_grouped_decode.cuh"
#include "backend/cuda/kernels/gemm/moe_grouped_ggml.h"
#include "backend/cuda/kernels/moe/moe.h"
#include "backend/cuda/runtime/device_buffer.h"
#include "backend/cuda/runtime/device_model.h"
#include "backend/ref/linear.h"
#include "core/dtype.h"
#include "device_random_linear.h"
#include "gpu_test_util.h"
#include "quant/codec.h"
#include "quant/ggml_grids.h"
#include "quant/type_traits.h"
#include "random_weights.h"
#include "upload_experts.h"

namespace aff::cuda {
namespace {

// Weights decode to bf16 exactly; activations (x, then the SwiGLU output) as
// hi + lo bf16: a few 1e-6 through two GEMMs.
constexpr double kTolBf16x3 = 3e-5;
// x and the SwiGLU output rounded once each to bf16: ~3e-3 relative RMS.
constexpr double kTolBf16 = 1.5e-2;

TEST(MoeGrouped, MatchesPerPairExperts) {
  AFF_SKIP_WITHOUT_GPU();
  AFF_SEEDED_RNG(seed, rng);
  const int E = 9, k = 3;
  const int64_t D = 256, F = 192, T = 41;
  for (DevFormat f : {DevFormat::kFP8Block, DevFormat::kMXFP4, DevFormat::kBF16}) {
    std::vector<testing::RandomWeight> keep;
    std::vector<ExpertSlot> slots(E);
    for (int e = 0; e < E; ++e) {
      keep.push_back(testing::make_weight(f, F, D, rng));
      slots[size_t(e)].w1 = keep.back().w;
      keep.push_back(testing::make_weight(f, F, D, rng));
      slots[size_t(e)].w3 = keep.back().w;
      keep.push_back(testing::make_weight(f, D, F, rng));
      slots[size_t(e)].w2 = keep.back().w;
    }
    // Experts 0..5 only, expert 1 favoured: 3 unused experts and one with many tokens.
    std::vector<int32_t> ids(size_t(T * k));
    std::uniform_int_distribution<int> pick(0, 7);
    for (int64_t t = 0; t < T; ++t)
      for (int i = 0; i < k; ++i) {
        const int v = pick(rng);
        ids[size_t(t * k + i)] = int32_t(v >= 6 ? 1 : (v + i) % 6);
      }
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(size_t(T * D));
    for (float& v : x) v = nd(rng) * 0.05f;
    auto dslots = upload_vector(slots, "slots");
    auto dids = upload_vector(ids, "ids");
    auto dx = upload_vector(x, "x");
    auto act = DeviceBuffer::allocate(size_t(T * k * F) * 4, "act");
    auto want = DeviceBuffer::allocate(size_t(T * k * D) * 4, "want");
    auto got = DeviceBuffer::allocate(size_t(T * k * D) * 4, "got");
    ASSERT_TRUE(dslots.is_ok() && dids.is_ok() && dx.is_ok() && act.is_ok() && want.is_ok() && got.is_ok());
    for (float limit : {0.0f, 7.0f}) {
      ExpertFfnArgs e;
      e.slots = dslots->as<ExpertSlot>(), e.format = f, e.ids = dids->as<int32_t>(), e.n_pairs = T * k;
      e.pairs_per_token = k, e.x = dx->as<float>(), e.D = D, e.inter = F, e.swiglu_limit = limit;
      e.act = act->as<float>(), e.y = want->as<float>();
      ASSERT_TRUE(expert_ffn(e, nullptr).is_ok());
      auto w_host = download_vector(want->as<float>(), size_t(T * k * D), "want");
      ASSERT_TRUE(w_host.is_ok());
      for (MmaPrecision p : {MmaPrecision::kBf16x3, MmaPrecision::kBf16}) {
        GroupedMoeArgs g;
        g.slots = slots, g.ids = dids->as<int32_t>(), g.n_pairs = T * k, g.pairs_per_token = k;
        g.x = dx->as<float>(), g.D = D, g.inter = F, g.swiglu_limit = limit, g.y = got->as<float>();
        ASSERT_TRUE(moe_grouped_supports(slots, p));
        const Status st = moe_grouped_ffn(g, p, nullptr);
        ASSERT_TRUE(st.is_ok()) << st.message();
        auto g_host = download_vector(got->as<float>(), size_t(T * k * D), "got");
        ASSERT_TRUE(g_host.is_ok());
        const double err = rel_rms(g_host->data(), w_host->data(), g_host->size());
        const double tol = p == MmaPrecision::kBf16x3 ? kTolBf16x3 : kTolBf16;
        std::printf("[moe-grouped] %-5s limit %.0f %-6s rel rms %.2e (tol %.1e)\n", testing::name_of(f), limit,
                    p == MmaPrecision::kBf16x3 ? "bf16x3" : "bf16", err, tol);
        EXPECT_LE(err, tol) << testing::name_of(f);
      }
    }
  }
}

// The shared expert's form: one expert, every id 0, one pair per token. With
// ids_all_zero the call skips the count read-back, the sort, the gather and the
// scatter; each output row depends on its own input row only, so the result
// must be bit-identical to the sorted route's.
TEST(MoeGrouped, OneExpertIdentityMatchesSortedRoute) {
  AFF_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(11);
  const int64_t D = 256, F = 192, T = 77;
  for (DevFormat f : {DevFormat::kFP8Block, DevFormat::kBF16}) {
    std::vector<testing::RandomWeight> keep;
    std::vector<ExpertSlot> slots(1);
    keep.push_back(testing::make_weight(f, F, D, rng));
    slots[0].w1 = keep.back().w;
    keep.push_back(testing::make_weight(f, F, D, rng));
    slots[0].w3 = keep.back().w;
    keep.push_back(testing::make_weight(f, D, F, rng));
    slots[0].w2 = keep.back().w;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(size_t(T * D));
    for (float& v : x) v = nd(rng) * 0.05f;
    auto dids = upload_vector(std::vector<int32_t>(size_t(T), 0), "ids");
    auto dx = upload_vector(x, "x");
    auto y_sorted = DeviceBuffer::allocate(size_t(T * D) * 4, "y_sorted");
    auto y_direct = upload_vector(std::vector<float>(size_t(T * D), std::nanf("")), "y_direct");
    ASSERT_TRUE(dids.is_ok() && dx.is_ok() && y_sorted.is_ok() && y_direct.is_ok());
    for (MmaPrecision p : {MmaPrecision::kBf16x3, MmaPrecision::kBf16}) {
      GroupedMoeArgs g;
      g.slots = slots, g.ids = dids->as<int32_t>(), g.n_pairs = T, g.pairs_per_token = 1;
      g.x = dx->as<float>(), g.D = D, g.inter = F, g.swiglu_limit = 7.0f, g.y = y_sorted->as<float>();
      ASSERT_TRUE(moe_grouped_ffn(g, p, nullptr).is_ok());
      g.ids_all_zero = true, g.y = y_direct->as<float>();
      ASSERT_TRUE(moe_grouped_ffn(g, p, nullptr).is_ok());
      auto a = download_vector(y_sorted->as<float>(), size_t(T * D), "y_sorted");
      auto b = download_vector(y_direct->as<float>(), size_t(T * D), "y_direct");
      ASSERT_TRUE(a.is_ok() && b.is_ok());
      for (float v : *b) ASSERT_TRUE(std::isfinite(v)) << testing::name_of(f);
      EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size() * 4), 0) << testing::name_of(f);
    }
  }
}

// ---- ggml experts: the fused kernels (moe_grouped_ggml.h) ---------------------------

using quant::GgmlType;

// The chunk decoders of moe_grouped_decode.cuh, run on the host: every word must
// equal bf16_rn of the reference decoder's two values (their f32 values are
// exact, so there is no rounding-order slack). Random bytes cover every code,
// scale and grid/sign index; the f16 scale fields get finite values of both
// signs, some subnormal. Blocks sit at 2-byte (Q3_K, IQ2_XXS) or 4-byte (Q2_K)
// offsets, as in a row.
TEST(MoeGroupedGgmlDecode, ChunksEqualReferenceRoundedToBf16) {
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint2> sel(256);
  std::vector<uint4> sign(128);
  for (int i = 0; i < 256; ++i) sel[size_t(i)] = moe_grouped::iq2xxs_selectors(quant::kIq2xxsGrid[i]);
  for (int i = 0; i < 128; ++i) sign[size_t(i)] = moe_grouped::iq2xxs_sign_masks(quant::kSignsIq2xs[i]);
  struct Case {
    GgmlType type;
    std::vector<int> f16_fields;
    int offset;  // bytes from a 16-byte boundary to the first block
  };
  for (const Case& c : {Case{GgmlType::kQ2_K, {80, 82}, 4}, Case{GgmlType::kQ3_K, {108}, 2},
                        Case{GgmlType::kIQ2_XXS, {0}, 2}}) {
    const int bb = int(quant::ggml_traits(c.type).block_bytes);
    const int n_blocks = 512;
    std::vector<uint8_t> buf(size_t(c.offset + n_blocks * bb + 16));
    uint8_t* blocks = buf.data() + c.offset;  // vector storage is at least 16-byte aligned
    for (int i = 0; i < n_blocks * bb; ++i) blocks[i] = uint8_t(byte(rng));
    for (int b = 0; b < n_blocks; ++b)
      for (int off : c.f16_fields) {
        // Mostly normal scales of both signs, every 16th block a subnormal one.
        const float v = (b % 16 == 15) ? nd(rng) * 3e-6f : nd(rng) * 0.01f;
        const uint16_t h = f32_to_f16(v);
        std::memcpy(blocks + b * bb + off, &h, 2);
      }
    std::vector<float> want(size_t(n_blocks) * 256);
    ASSERT_TRUE(quant::dequantize_row(c.type, {blocks, size_t(n_blocks * bb)}, want).is_ok());
    int64_t bad = 0, bad_sub = 0;
    for (int b = 0; b < n_blocks; ++b)
      for (int j = 0; j < 8; ++j) {
        uint32_t o[16];
        const uint8_t* blk = blocks + b * bb;
        if (c.type == GgmlType::kQ2_K) moe_grouped::q2k_chunk_bf16(blk, j, o);
        if (c.type == GgmlType::kQ3_K) moe_grouped::q3k_chunk_bf16(blk, j, o);
        if (c.type == GgmlType::kIQ2_XXS) moe_grouped::iq2xxs_chunk_bf16(blk, j, sel.data(), sign.data(), o);
        for (int i = 0; i < 16; ++i) {
          const float* w = want.data() + b * 256 + j * 32 + 2 * i;
          const uint32_t expect = moe_grouped::bf16x2_rn(w[0], w[1]);
          if (o[i] != expect && bad++ < 5)
            ADD_FAILURE() << quant::ggml_type_name(c.type) << " block " << b << " chunk " << j << " pair " << i
                          << ": got 0x" << std::hex << o[i] << " want 0x" << expect << std::dec << " (" << w[0]
                          << ", " << w[1] << ")";
        }
        // The second form's sub-block decoders (16 elements, two halves of
        // four words): the same words as the chunk decoder, bit for bit.
        for (int h = 0; h < 2; ++h) {
          const int sb = 2 * j + h;
          for (int hh = 0; hh < 2; ++hh) {
            uint32_t q[4];
            if (c.type == GgmlType::kQ2_K) moe_grouped::q2k_sub_half(blk, sb, hh, moe_grouped::q2k_sub_table(blk, sb), q);
            if (c.type == GgmlType::kQ3_K) moe_grouped::q3k_sub_half(blk, sb, hh, moe_grouped::q3k_sub_table(blk, sb), q);
            if (c.type == GgmlType::kIQ2_XXS)
              moe_grouped::iq2xxs_sub_half(blk, sb, hh, moe_grouped::iq2xxs_sub_table(blk, sb), sel.data(),
                                           sign.data(), q);
            for (int i = 0; i < 4; ++i)
              if (q[i] != o[8 * h + 4 * hh + i] && bad_sub++ < 5)
                ADD_FAILURE() << quant::ggml_type_name(c.type) << " block " << b << " sub-block " << sb << " half "
                              << hh << " word " << i << ": got 0x" << std::hex << q[i] << " want 0x"
                              << o[8 * h + 4 * hh + i] << std::dec;
          }
        }
      }
    EXPECT_EQ(bad, 0) << quant::ggml_type_name(c.type);
    EXPECT_EQ(bad_sub, 0) << quant::ggml_type_name(c.type) << " (sub-block decoders)";
  }
}

// The second form's K-order permutation (moe_grouped_ggml_v2.cu), emulated on
// the host: lanes fill their A and B registers as the kernel does (lane (g, c)
// takes sub-block c of a 64-column group, MMA j elements [4j, 4j + 4) of it;
// B the same columns of token g), and m16n8k16 is applied by its documented
// fragment layout (mma_bf16.cuh). The four MMAs of a group must give every
// (row, token) the full 64-term dot product. Small integers: exact sums.
TEST(MoeGroupedGgmlDecode, PermutedFragmentsGiveTheGroupDot) {
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int> v(-8, 8);
  int A[16][64], X[8][64];  // weight rows x group columns, tokens x group columns
  for (auto& r : A)
    for (int& e : r) e = v(rng);
  for (auto& r : X)
    for (int& e : r) e = v(rng);
  int64_t C[16][8] = {};
  for (int j = 0; j < 4; ++j) {
    // Registers as the kernel fills them: element pairs (low, high half).
    int a[32][4][2], b[32][2][2];
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, c = lane % 4, col = 16 * c + 4 * j;  // group column of element 4j of sub-block c
      for (int e = 0; e < 2; ++e) {
        a[lane][0][e] = A[g][col + e];          // row g,     elements 4j, 4j+1
        a[lane][1][e] = A[g + 8][col + e];      // row g + 8, elements 4j, 4j+1
        a[lane][2][e] = A[g][col + 2 + e];      // row g,     elements 4j+2, 4j+3
        a[lane][3][e] = A[g + 8][col + 2 + e];  // row g + 8, elements 4j+2, 4j+3
        b[lane][0][e] = X[g][col + e];          // b0: the first 16-bit pair of the 16-byte load
        b[lane][1][e] = X[g][col + 2 + e];      // b1
      }
    }
    // m16n8k16 by its fragment layout: A(r, k) and B(k, n) from the lanes that hold them.
    for (int r = 0; r < 16; ++r)
      for (int n = 0; n < 8; ++n)
        for (int k = 0; k < 16; ++k) {
          const int ca = k % 8 / 2, ea = k % 2, ra = (r % 8) * 4 + ca;  // lane holding A(r, k)
          const int ia = (r >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
          const int lb = n * 4 + ca;                                       // lane holding B(k, n)
          C[r][n] += int64_t(a[ra][ia][ea]) * b[lb][k >= 8 ? 1 : 0][ea];
        }
  }
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 8; ++n) {
      int64_t want = 0;
      for (int k = 0; k < 64; ++k) want += int64_t(A[r][k]) * X[n][k];
      EXPECT_EQ(C[r][n], want) << "row " << r << " token " << n;
    }
}

// Against the CPU reference (exactly dequantised weights, x rounded to bf16 as
// the path specifies, f64 sums). The fused path rounds four operands to bf16
// once each: x (applied in the reference too), the decoded w1/w3 rows, the
// SwiGLU output and the decoded w2 rows; the estimate below counts all four. One bf16 rounding is a
// relative error of RMS ~1.6e-3 per element (half an ulp of 2^-7..2^-8,
// uniform); a random dot sums independent errors, so gate and up carry
// ~2.3e-3 (x and w), the activation ~3e-3 after the SwiGLU plus 1.6e-3 of its
// own rounding, and the output ~4e-3 after w2's rounding. 1e-2 is that with
// ~2.5x margin for the SwiGLU's gain where silu is steep; a decode or index
// error (wrong element, row, scale or token) gives errors of order 1.
constexpr double kGgmlMaxRelRms = 1e-2;
// Against the per-expert path (ggml rows decoded to bf16 by the same decoder,
// cuBLAS) in kBf16: the same bf16 operands, so only the f32 summation order
// differs (a few 1e-6 relative), and that flips the bf16 rounding of a few
// activation elements: a fraction ~3e-6 / 2^-7.5 ~ 5e-4 of them, each off by
// one bf16 ulp (~5.5e-3 relative), an output error of ~sqrt(5e-4) * 5.5e-3 ~
// 1.2e-4. 1e-3 leaves ~8x margin and is still 10x below the reference bound.
constexpr double kGgmlVsPerExpertMaxRelRms = 1e-3;
// Against a reference that rounds the same four operands to bf16 (x, decoded
// w1/w3 and w2 rows, the activation) and sums in f64: what is left is the
// kernels' f32 summation order and the activation roundings it flips, the
// same ~1.2e-4 as against the per-expert path; 1e-3 as there. This is the
// check for the clamped cases: with the clamp engaged, the budget above does
// not hold against exact operands (a Q5_K/Q6_K case at D = 256 measured
// 1.3e-2 and 2.0e-2 with f32 and with bf16 x, the per-expert path giving the
// same bits), so the clamp is checked against the emulated reference only.
constexpr double kGgmlVsEmulatedMaxRelRms = 1e-3;
// Second form against the first (end to end, through moe_grouped_ffn): the
// same bf16 operands, only the f32 summation order differs, and as against the
// per-expert path that flips the bf16 rounding of a few activation elements
// (~1.2e-4 estimated above); 1e-3 as there. Kernel by kernel on the same
// inputs the bound is tighter: MoeGroupedGgmlForms.
constexpr double kGgmlV2VsV1MaxRelRms = 1e-3;
constexpr float kGgmlClamp = 0.6f;  // engages on these weights (gate/up of std ~1 at D = 512)

struct GgmlExpertCase {
  std::string name;
  GgmlType w1, w3, w2;
  int64_t D, I;
  std::vector<int> counts;  // pairs routed to each expert (the table has counts.size() experts)
  int k;                    // pairs per token; the counts sum to a multiple of k
  bool random_blocks = false;  // random bytes instead of quantised Gaussians (Q2_K / Q3_K only)
};

// W [out, in] in Q2_K, Q3_K or IQ2_XXS as random bytes with every f16 scale field set
// to a value in [lo, hi): valid blocks without the reference quantisers, which
// take about a second per million weights on one core (a V4-sized expert has
// 25 million).
dsv4::Linear random_block_linear(GgmlType t, int64_t out, int64_t in, float lo, float hi, std::mt19937_64& rng,
                                 testing::Keep& keep) {
  const std::vector<int> fields = t == GgmlType::kQ2_K   ? std::vector<int>{80, 82}
                                  : t == GgmlType::kQ3_K ? std::vector<int>{108}
                                                         : std::vector<int>{0};
  EXPECT_TRUE(t == GgmlType::kQ2_K || t == GgmlType::kQ3_K || t == GgmlType::kIQ2_XXS);
  const int64_t bb = quant::ggml_traits(t).block_bytes, row_bytes = *quant::ggml_row_bytes(t, in);
  keep.push_back(std::make_shared<std::vector<uint8_t>>(size_t(out * row_bytes)));
  uint8_t* data = keep.back()->data();
  for (int64_t i = 0; i + 8 <= out * row_bytes; i += 8) {
    const uint64_t v = rng();
    std::memcpy(data + i, &v, 8);
  }
  std::uniform_real_distribution<float> scale(lo, hi);
  for (int64_t b = 0; b < out * row_bytes / bb; ++b)
    for (int off : fields) {
      const uint16_t h = f32_to_f16(scale(rng));
      std::memcpy(data + b * bb + off, &h, 2);
    }
  dsv4::Linear w;
  w.format = dsv4::WeightFormat::kGgml;
  w.ggml_type = int(t);
  w.out = out, w.in = in;
  w.weight.name = "test.ggml", w.weight.file = "<random>";
  w.weight.dtype = DType::kU8;
  w.weight.shape = {out, row_bytes};
  w.weight.data = data;
  w.weight.nbytes = out * row_bytes;
  return w;
}

// An expert's three matrices dequantised by the CPU reference (f32, row-major).
struct GgmlRefExpert {
  std::vector<float> w1, w3, w2;  // [I, D], [I, D], [D, I]
};

GgmlRefExpert dequant_expert(const dsv4::ExpertWeights& e) {
  GgmlRefExpert r;
  const int64_t D = e.w1.in, I = e.w1.out;
  r.w1.resize(size_t(I * D)), r.w3.resize(size_t(I * D)), r.w2.resize(size_t(D * I));
  for (int64_t i = 0; i < I; ++i) {
    ref::linear_dequant_row(e.w1, i, r.w1.data() + i * D);
    ref::linear_dequant_row(e.w3, i, r.w3.data() + i * D);
  }
  for (int64_t d = 0; d < D; ++d) ref::linear_dequant_row(e.w2, d, r.w2.data() + d * I);
  return r;
}

float ref_swiglu(double g, double u, float limit) {
  float gf = float(g), uf = float(u);
  if (limit > 0.0f) gf = std::min(gf, limit), uf = std::clamp(uf, -limit, limit);
  return gf / (1.0f + std::exp(-gf)) * uf;
}

class MoeGroupedGgml : public ::testing::TestWithParam<GgmlExpertCase> {};

TEST_P(MoeGroupedGgml, MatchesReferenceAndRepeatsBits) {
  AFF_SKIP_WITHOUT_GPU();
  const GgmlExpertCase c = GetParam();
  AFF_SEEDED_RNG(seed, rng);
  const int E = int(c.counts.size());
  const int64_t D = c.D, I = c.I;
  const int64_t P = std::accumulate(c.counts.begin(), c.counts.end(), int64_t(0));
  ASSERT_EQ(P % c.k, 0) << "case counts must fill whole tokens";
  const int64_t T = P / c.k;

  testing::Keep keep;
  std::vector<dsv4::ExpertWeights> experts(static_cast<size_t>(E));
  // Scales for random blocks: elements of magnitude ~0.03-0.06, as the quantised
  // N(0, 0.05) weights of the other cases.
  auto make = [&](GgmlType t, int64_t out, int64_t in) {
    if (!c.random_blocks) return testing::random_ggml_linear(t, out, in, rng, keep);
    return t == GgmlType::kQ2_K ? random_block_linear(t, out, in, 0.002f, 0.006f, rng, keep)
                                : random_block_linear(t, out, in, 0.001f, 0.002f, rng, keep);
  };
  for (auto& e : experts) e.w1 = make(c.w1, I, D), e.w3 = make(c.w3, I, D), e.w2 = make(c.w2, D, I);
  testing::UploadedExperts uploaded;
  testing::upload_experts(experts, uploaded);
  if (HasFatalFailure()) return;
  const std::vector<ExpertSlot>& slots = uploaded.host;
  // The table must take the fused kernels, or this test would check the other path.
  const auto layout = moe_ggml_layout(slots.data(), slots.size(), D, I);
  ASSERT_TRUE(layout.is_ok()) << layout.status().message();

  // Pairs: expert e appears counts[e] times, in random order; pair p reads token p / k.
  std::vector<int32_t> ids;
  for (int e = 0; e < E; ++e) ids.insert(ids.end(), size_t(c.counts[size_t(e)]), int32_t(e));
  std::shuffle(ids.begin(), ids.end(), rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(T * D));
  for (float& v : x) v = nd(rng);

  // Reference: gate and up once per pair, then SwiGLU and down per clamp setting.
  std::vector<GgmlRefExpert> ref(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e)
    if (c.counts[size_t(e)] > 0) ref[size_t(e)] = dequant_expert(experts[size_t(e)]);
  // gate/up: exact operands; gate_e/up_e: the operands the kernels multiply
  // (x and the decoded rows rounded to bf16), for the emulated reference.
  std::vector<double> gate(size_t(P * I)), up(size_t(P * I)), gate_e(size_t(P * I)), up_e(size_t(P * I));
  for (int64_t p = 0; p < P; ++p) {
    const GgmlRefExpert& r = ref[size_t(ids[size_t(p)])];
    const float* xt = x.data() + (p / c.k) * D;
    for (int64_t i = 0; i < I; ++i) {
      double g = 0.0, u = 0.0, ge = 0.0, ue = 0.0;
      for (int64_t d = 0; d < D; ++d) {
        g += double(r.w1[size_t(i * D + d)]) * double(xt[d]);
        u += double(r.w3[size_t(i * D + d)]) * double(xt[d]);
        const double xb = double(round_bf16(xt[d]));
        ge += double(round_bf16(r.w1[size_t(i * D + d)])) * xb;
        ue += double(round_bf16(r.w3[size_t(i * D + d)])) * xb;
      }
      gate[size_t(p * I + i)] = g, up[size_t(p * I + i)] = u;
      gate_e[size_t(p * I + i)] = ge, up_e[size_t(p * I + i)] = ue;
    }
  }

  auto dids = upload_vector(ids, "ids");
  auto dx = upload_vector(x, "x");
  auto dy = DeviceBuffer::allocate(size_t(P * D) * 4, "y");
  ASSERT_TRUE(dids.is_ok() && dx.is_ok() && dy.is_ok());
  struct FusedGuard {
    int form = moe_grouped_ggml_kernel();
    ~FusedGuard() { moe_grouped_set_ggml_fused(true), moe_grouped_set_ggml_kernel(form); }
  } fused_guard;
  auto run = [&](float limit, MmaPrecision prec, bool fused, std::vector<float>& out) {
    moe_grouped_set_ggml_fused(fused);
    // NaN first: an output row the kernels forgot to write fails the test.
    ASSERT_TRUE(copy_to_device(dy->data(), std::vector<float>(size_t(P * D), std::nanf("")).data(),
                               size_t(P * D) * 4, "y")
                    .is_ok());
    GroupedMoeArgs g;
    g.slots = slots, g.ids = dids->as<int32_t>(), g.n_pairs = P, g.pairs_per_token = c.k;
    g.x = dx->as<float>(), g.D = D, g.inter = I, g.swiglu_limit = limit, g.y = dy->as<float>();
    const Status st = moe_grouped_ffn(g, prec, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.message();
    auto got = download_vector(dy->as<float>(), size_t(P * D), "y");
    ASSERT_TRUE(got.is_ok());
    out = std::move(got).value();
    moe_grouped_set_ggml_fused(true);
  };

  for (float limit : {0.0f, kGgmlClamp}) {
    std::vector<float> want(size_t(P * D)), want_e(size_t(P * D));
    std::vector<float> act(static_cast<size_t>(I)), act_e(static_cast<size_t>(I));
    for (int64_t p = 0; p < P; ++p) {
      const GgmlRefExpert& r = ref[size_t(ids[size_t(p)])];
      for (int64_t i = 0; i < I; ++i) {
        act[size_t(i)] = ref_swiglu(gate[size_t(p * I + i)], up[size_t(p * I + i)], limit);
        act_e[size_t(i)] = round_bf16(ref_swiglu(gate_e[size_t(p * I + i)], up_e[size_t(p * I + i)], limit));
      }
      for (int64_t d = 0; d < D; ++d) {
        double s = 0.0, se = 0.0;
        for (int64_t i = 0; i < I; ++i) {
          s += double(r.w2[size_t(d * I + i)]) * double(act[size_t(i)]);
          se += double(round_bf16(r.w2[size_t(d * I + i)])) * double(act_e[size_t(i)]);
        }
        want[size_t(p * D + d)] = float(s), want_e[size_t(p * D + d)] = float(se);
      }
    }
    std::vector<float> per_expert;
    run(limit, MmaPrecision::kBf16, false, per_expert);
    if (HasFatalFailure()) return;
    // Both forms of the fused kernels (moe_grouped_set_ggml_kernel; the second
    // takes Q2_K, Q3_K and IQ2_XXS launches, the first the rest): every bound
    // above holds for either, since they multiply the same bf16 operands.
    std::vector<float> by_form[2];
    for (int form = 1; form <= 2; ++form) {
      moe_grouped_set_ggml_kernel(form);
      const std::string tag = "v" + std::to_string(form);
      std::vector<float> by_prec[2];
      for (int pi = 0; pi < 2; ++pi) {
        const MmaPrecision prec = pi == 0 ? MmaPrecision::kBf16x3 : MmaPrecision::kBf16;
        std::vector<float> runs[2];
        run(limit, prec, true, runs[0]);
        run(limit, prec, true, runs[1]);
        if (HasFatalFailure()) return;
        for (size_t i = 0; i < runs[0].size(); ++i)
          ASSERT_TRUE(std::isfinite(runs[0][i])) << tag << " output " << i << " (pair " << i / size_t(D) << ")";
        EXPECT_EQ(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * 4), 0) << tag << " not repeatable";
        const double err = rel_rms(runs[0].data(), want.data(), want.size());
        const double err_e = rel_rms(runs[0].data(), want_e.data(), want_e.size());
        std::printf("[moe-grouped-ggml] %-22s %s limit %.1f %-6s rel rms vs reference %.3e (tol %s), "
                    "vs bf16-emulated reference %.3e (tol %.0e)\n",
                    c.name.c_str(), tag.c_str(), limit, pi == 0 ? "bf16x3" : "bf16", err,
                    limit > 0.0f ? "-" : "1e-02", err_e, kGgmlVsEmulatedMaxRelRms);
        if (limit == 0.0f) {
          EXPECT_LE(err, kGgmlMaxRelRms) << tag << (pi == 0 ? " bf16x3" : " bf16");
        }
        EXPECT_LE(err_e, kGgmlVsEmulatedMaxRelRms) << tag << (pi == 0 ? " bf16x3" : " bf16") << " limit " << limit;
        by_prec[pi] = std::move(runs[0]);
      }
      // Only x's bf16 hi part enters the fused kernels, in both settings.
      EXPECT_EQ(std::memcmp(by_prec[0].data(), by_prec[1].data(), by_prec[0].size() * 4), 0)
          << tag << ": the two precisions should give the same bits";
      const double diff = rel_rms(by_prec[1].data(), per_expert.data(), per_expert.size());
      std::printf("[moe-grouped-ggml] %-22s %s limit %.1f        rel rms vs per-expert cuBLAS %.3e (tol %.0e)\n",
                  c.name.c_str(), tag.c_str(), limit, diff, kGgmlVsPerExpertMaxRelRms);
      EXPECT_LE(diff, kGgmlVsPerExpertMaxRelRms) << tag << " limit " << limit;
      by_form[form - 1] = std::move(by_prec[1]);
    }
    const double forms = rel_rms(by_form[1].data(), by_form[0].data(), by_form[0].size());
    std::printf("[moe-grouped-ggml] %-22s limit %.1f        rel rms v2 vs v1 %.3e (tol %.0e)\n", c.name.c_str(),
                limit, forms, kGgmlV2VsV1MaxRelRms);
    EXPECT_LE(forms, kGgmlV2VsV1MaxRelRms) << "limit " << limit;
  }
}

const std::vector<int> kEdgeCounts = {0, 1, 63, 64, 65, 130, 0, 2};  // 325 pairs

INSTANTIATE_TEST_SUITE_P(
    Types, MoeGroupedGgml,
    ::testing::Values(
        // The V4 recipes at a small width: down reads 256 columns (one super-block;
        // Q3_K rows of 110 bytes start at 2-byte offsets).
        GgmlExpertCase{"Q2K_Q3K", GgmlType::kQ2_K, GgmlType::kQ2_K, GgmlType::kQ3_K, 512, 256, kEdgeCounts, 5},
        GgmlExpertCase{"IQ2XXS_Q2K", GgmlType::kIQ2_XXS, GgmlType::kIQ2_XXS, GgmlType::kQ2_K, 512, 256, kEdgeCounts, 5},
        // Three super-blocks per up row (odd), two per down row.
        GgmlExpertCase{"Q4K_Q4K", GgmlType::kQ4_K, GgmlType::kQ4_K, GgmlType::kQ4_K, 768, 512, {3, 0, 64, 129}, 4},
        // Types without a compiled instantiation (run-time decoder switch), the
        // widest staged row (Q8_0) and 2-byte aligned Q6_K rows.
        GgmlExpertCase{"IQ4XS_Q8_0", GgmlType::kIQ4_XS, GgmlType::kIQ4_XS, GgmlType::kQ8_0, 512, 256, {5, 70, 0}, 3},
        GgmlExpertCase{"Q5K_Q6K", GgmlType::kQ5_K, GgmlType::kQ5_K, GgmlType::kQ6_K, 256, 256, {1, 2, 64}, 1},
        // Gate and up in different types (different row sizes in one block).
        GgmlExpertCase{"Q2K_Q3K_gate_up_IQ2XXS", GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kIQ2_XXS, 512, 512,
                       {33, 1, 0, 64}, 2},
        // The V4 geometry and recipe, few experts (random blocks: see random_block_linear).
        GgmlExpertCase{"V4_Q2K_Q3K", GgmlType::kQ2_K, GgmlType::kQ2_K, GgmlType::kQ3_K, 4096, 2048, {65, 0, 1}, 6,
                       true}),
    [](const ::testing::TestParamInfo<GgmlExpertCase>& i) { return i.param.name; });

// The shared expert's form (one expert, every id 0, one pair per token) for
// ggml experts, through the fused kernels in both forms: with ids_all_zero the
// call skips the count read-back and the sort; the sorted order is then the
// pair order and each output row depends on its own input row only, so the
// result must be bit-identical to the sorted route's. 77 tokens: one full tile
// and one partial one.
TEST(MoeGroupedGgmlIdentity, OneExpertMatchesSortedRouteBothForms) {
  AFF_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(13);
  const int64_t D = 512, F = 256, T = 77;
  testing::Keep keep;
  dsv4::ExpertWeights e;
  e.w1 = testing::random_ggml_linear(GgmlType::kQ2_K, F, D, rng, keep);
  e.w3 = testing::random_ggml_linear(GgmlType::kQ2_K, F, D, rng, keep);
  e.w2 = testing::random_ggml_linear(GgmlType::kQ3_K, D, F, rng, keep);
  testing::UploadedExperts uploaded;
  testing::upload_experts({e}, uploaded);
  if (HasFatalFailure()) return;
  const std::vector<ExpertSlot>& slots = uploaded.host;
  ASSERT_TRUE(moe_ggml_layout(slots.data(), slots.size(), D, F).is_ok());
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(T * D));
  for (float& v : x) v = nd(rng);
  auto dids = upload_vector(std::vector<int32_t>(size_t(T), 0), "ids");
  auto dx = upload_vector(x, "x");
  auto y_sorted = DeviceBuffer::allocate(size_t(T * D) * 4, "y_sorted");
  auto y_direct = DeviceBuffer::allocate(size_t(T * D) * 4, "y_direct");
  ASSERT_TRUE(dids.is_ok() && dx.is_ok() && y_sorted.is_ok() && y_direct.is_ok());
  struct FormGuard {
    int form = moe_grouped_ggml_kernel();
    ~FormGuard() { moe_grouped_set_ggml_kernel(form); }
  } form_guard;
  std::vector<float> by_form[2];
  for (int form = 1; form <= 2; ++form) {
    moe_grouped_set_ggml_kernel(form);
    const std::vector<float> nan(size_t(T * D), std::nanf(""));
    ASSERT_TRUE(copy_to_device(y_sorted->data(), nan.data(), nan.size() * 4, "y_sorted").is_ok());
    ASSERT_TRUE(copy_to_device(y_direct->data(), nan.data(), nan.size() * 4, "y_direct").is_ok());
    GroupedMoeArgs g;
    g.slots = slots, g.ids = dids->as<int32_t>(), g.n_pairs = T, g.pairs_per_token = 1;
    g.x = dx->as<float>(), g.D = D, g.inter = F, g.swiglu_limit = 7.0f, g.y = y_sorted->as<float>();
    ASSERT_TRUE(moe_grouped_ffn(g, MmaPrecision::kBf16, nullptr).is_ok());
    g.ids_all_zero = true, g.y = y_direct->as<float>();
    ASSERT_TRUE(moe_grouped_ffn(g, MmaPrecision::kBf16, nullptr).is_ok());
    auto a = download_vector(y_sorted->as<float>(), size_t(T * D), "y_sorted");
    auto b = download_vector(y_direct->as<float>(), size_t(T * D), "y_direct");
    ASSERT_TRUE(a.is_ok() && b.is_ok());
    for (float v : *b) ASSERT_TRUE(std::isfinite(v)) << "form " << form;
    EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size() * 4), 0) << "form " << form;
    by_form[form - 1] = std::move(a).value();
  }
  // Same operands, summation order only (the bound of MoeGroupedGgml).
  const double diff = rel_rms(by_form[1].data(), by_form[0].data(), by_form[0].size());
  std::printf("[moe-grouped-ggml] one expert, ids all zero: rel rms v2 vs v1 %.3e (tol %.0e)\n", diff,
              kGgmlV2VsV1MaxRelRms);
  EXPECT_LE(diff, kGgmlV2VsV1MaxRelRms);
}

// The two forms of the fused kernels launch by launch at the V4 geometry and
// recipes, on the same inputs: sorted bf16 rows, a tile list with full,
// partial and one-token tiles, pair_of_slot a random permutation. Both forms
// multiply the same bf16 operands (the decoders agree bit for bit:
// MoeGroupedGgmlDecode), so
//  - down, fed the same activations: only the f32 summation order over 2048
//    terms differs, a few 1e-7 relative; 1e-4 leaves a wide margin, and a
//    wrong element, scale, row or token gives errors of order 1;
//  - up: the gate/up sums differ by summation order (~1e-6 relative), which
//    flips the bf16 rounding of a fraction ~1e-6 / 2^-8 ~ 3e-4 of the
//    activations by one ulp (~5.5e-3 relative): rel RMS ~ sqrt(3e-4) * 5.5e-3
//    ~ 1e-4, bound 1e-3, and at most 1% of the elements may differ at all.
// The second form must also repeat its bits.
TEST(MoeGroupedGgmlForms, V2MatchesV1AtV4) {
  AFF_SKIP_WITHOUT_GPU();
  const int64_t D = 4096, I = 2048;
  const std::vector<int> counts = {65, 1, 0, 64, 130, 37};
  const int E = int(counts.size());
  struct Recipe {
    const char* name;
    GgmlType up, down;
  };
  std::mt19937_64 rng(23);
  // Scales giving elements of magnitude ~0.01-0.05 (see random_block_linear).
  auto make = [&](GgmlType t, int64_t out, int64_t in, testing::Keep& keep) {
    if (t == GgmlType::kQ2_K) return random_block_linear(t, out, in, 0.002f, 0.006f, rng, keep);
    if (t == GgmlType::kQ3_K) return random_block_linear(t, out, in, 0.001f, 0.002f, rng, keep);
    return random_block_linear(t, out, in, 0.0002f, 0.0006f, rng, keep);
  };
  for (const Recipe& r : {Recipe{"Q2_K+Q3_K", GgmlType::kQ2_K, GgmlType::kQ3_K},
                          Recipe{"IQ2_XXS+Q2_K", GgmlType::kIQ2_XXS, GgmlType::kQ2_K}}) {
    SCOPED_TRACE(r.name);
    testing::Keep keep;
    std::vector<dsv4::ExpertWeights> experts(static_cast<size_t>(E));
    for (auto& e : experts) e.w1 = make(r.up, I, D, keep), e.w3 = make(r.up, I, D, keep), e.w2 = make(r.down, D, I, keep);
    testing::UploadedExperts uploaded;
    testing::upload_experts(experts, uploaded);
    if (HasFatalFailure()) return;
    const std::vector<ExpertSlot>& slots = uploaded.host;
    const auto lr = moe_ggml_layout(slots.data(), slots.size(), D, I);
    ASSERT_TRUE(lr.is_ok()) << lr.status().message();
    const MoeGgmlLayout* layout = &lr.value();
    ASSERT_TRUE(moe_ggml_v2_takes_up(*layout) && moe_ggml_v2_takes_down(*layout));

    // Tiles of up to 64 sorted rows per expert, as moe_grouped_ffn builds them.
    std::vector<MoeGgmlTile> tiles;
    int32_t total = 0;
    for (int e = 0; e < E; ++e) {
      for (int t0 = 0; t0 < counts[size_t(e)]; t0 += kMoeGgmlTileTokens) {
        MoeGgmlTile t;
        t.w1 = slots[size_t(e)].w1.weight, t.w3 = slots[size_t(e)].w3.weight, t.w2 = slots[size_t(e)].w2.weight;
        t.row0 = total + t0, t.rows = std::min(kMoeGgmlTileTokens, counts[size_t(e)] - t0);
        tiles.push_back(t);
      }
      total += counts[size_t(e)];
    }
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<uint16_t> x(size_t(total) * size_t(D));
    for (uint16_t& v : x) v = f32_to_bf16(nd(rng));
    std::vector<int32_t> pos(static_cast<size_t>(total));
    std::iota(pos.begin(), pos.end(), 0);
    std::shuffle(pos.begin(), pos.end(), rng);
    auto dtiles = upload_vector(tiles, "tiles");
    auto dx = upload_vector(x, "x");
    auto dpos = upload_vector(pos, "pair_of_slot");
    auto act1 = DeviceBuffer::allocate(size_t(total) * size_t(I) * 2, "act v1");
    auto act2 = DeviceBuffer::allocate(size_t(total) * size_t(I) * 2, "act v2");
    auto y1 = DeviceBuffer::allocate(size_t(total) * size_t(D) * 4, "y v1");
    auto y2 = DeviceBuffer::allocate(size_t(total) * size_t(D) * 4, "y v2");
    ASSERT_TRUE(dtiles.is_ok() && dx.is_ok() && dpos.is_ok() && act1.is_ok() && act2.is_ok() && y1.is_ok() &&
                y2.is_ok());
    const int n_tiles = int(tiles.size());
    const MoeGgmlTile* tl = dtiles->as<MoeGgmlTile>();
    for (float limit : {0.0f, 10.0f}) {
      ASSERT_TRUE(moe_ggml_up(*layout, tl, n_tiles, dx->as<uint16_t>(), limit, act1->as<uint16_t>(), nullptr).is_ok());
      ASSERT_TRUE(
          moe_ggml_up_v2(*layout, tl, n_tiles, dx->as<uint16_t>(), nullptr, 1, limit, act2->as<uint16_t>(), nullptr).is_ok());
      auto a1 = download_vector(act1->as<uint16_t>(), size_t(total) * size_t(I), "act v1");
      auto a2 = download_vector(act2->as<uint16_t>(), size_t(total) * size_t(I), "act v2");
      ASSERT_TRUE(a1.is_ok() && a2.is_ok());
      std::vector<float> f1(a1->size()), f2(a2->size());
      int64_t differ = 0;
      for (size_t i = 0; i < f1.size(); ++i) {
        f1[i] = bf16_to_f32((*a1)[i]), f2[i] = bf16_to_f32((*a2)[i]);
        ASSERT_TRUE(std::isfinite(f2[i])) << "act " << i;
        differ += (*a1)[i] != (*a2)[i];
      }
      const double act_err = rel_rms(f2.data(), f1.data(), f1.size());
      const double act_frac = double(differ) / double(f1.size());
      // Down on the first form's activations, both forms: summation order only.
      ASSERT_TRUE(moe_ggml_down(*layout, tl, n_tiles, act1->as<uint16_t>(), dpos->as<int32_t>(), y1->as<float>(),
                                nullptr)
                      .is_ok());
      ASSERT_TRUE(moe_ggml_down_v2(*layout, tl, n_tiles, act1->as<uint16_t>(), dpos->as<int32_t>(),
                                   y2->as<float>(), nullptr)
                      .is_ok());
      auto d1 = download_vector(y1->as<float>(), size_t(total) * size_t(D), "y v1");
      auto d2 = download_vector(y2->as<float>(), size_t(total) * size_t(D), "y v2");
      ASSERT_TRUE(d1.is_ok() && d2.is_ok());
      for (size_t i = 0; i < d2->size(); ++i) ASSERT_TRUE(std::isfinite((*d2)[i])) << "y " << i;
      const double y_err = rel_rms(d2->data(), d1->data(), d1->size());
      // Repeatability of the second form, both launches.
      ASSERT_TRUE(
          moe_ggml_up_v2(*layout, tl, n_tiles, dx->as<uint16_t>(), nullptr, 1, limit, act2->as<uint16_t>(), nullptr).is_ok());
      ASSERT_TRUE(moe_ggml_down_v2(*layout, tl, n_tiles, act1->as<uint16_t>(), dpos->as<int32_t>(),
                                   y2->as<float>(), nullptr)
                      .is_ok());
      auto a2b = download_vector(act2->as<uint16_t>(), size_t(total) * size_t(I), "act v2");
      auto d2b = download_vector(y2->as<float>(), size_t(total) * size_t(D), "y v2");
      ASSERT_TRUE(a2b.is_ok() && d2b.is_ok());
      EXPECT_EQ(std::memcmp(a2b->data(), a2->data(), a2->size() * 2), 0) << "up v2 not repeatable";
      EXPECT_EQ(std::memcmp(d2b->data(), d2->data(), d2->size() * 4), 0) << "down v2 not repeatable";
      std::printf("[moe-grouped-forms] %-13s limit %4.1f up: act rel rms v2 vs v1 %.3e (tol 1e-03), %.2e of "
                  "elements differ (tol 1e-02); down: rel rms v2 vs v1 %.3e (tol 1e-04)\n",
                  r.name, limit, act_err, act_frac, y_err);
      EXPECT_LE(act_err, 1e-3) << "limit " << limit;
      EXPECT_LE(act_frac, 1e-2) << "limit " << limit;
      EXPECT_LE(y_err, 1e-4) << "limit " << limit;
    }
  }
}

// Timing of moe_grouped_ffn at the V4 geometry: 256 experts, 2048 tokens x 6
// distinct random experts each (one prefill chunk), fused kernels against the
// per-expert cuBLAS path; the fused kernels in both forms
// (moe_grouped_set_ggml_kernel). Not a correctness test (random bytes with finite
// scales; every expert has the same bytes at its own address, so every expert
// is read from memory); run with --gtest_also_run_disabled_tests. Times are
// per call and include the counts' read-back, the tile upload, the gather and
// the scatter: the whole routed-expert FFN of a chunk.
TEST(MoeGroupedBench, DISABLED_Timing) {
  AFF_SKIP_WITHOUT_GPU();
  const int64_t D = 4096, I = 2048, T = 2048;
  const int E = 256, k = 6;
  struct Recipe {
    const char* name;
    GgmlType up, down;
  };
  const Recipe recipes[] = {{"Q2_K+Q3_K", GgmlType::kQ2_K, GgmlType::kQ3_K},
                            {"IQ2_XXS+Q2_K", GgmlType::kIQ2_XXS, GgmlType::kQ2_K}};
  auto tables = ggml_device_tables();
  ASSERT_TRUE(tables.is_ok());
  struct FusedGuard {
    ~FusedGuard() { moe_grouped_set_ggml_fused(true); }
  } fused_guard;
  const int form_before = moe_grouped_ggml_kernel();
  std::mt19937_64 rng(11);
  // Offsets of the f16 scale fields per 256-element block (random bits there
  // would give inf/NaN).
  auto f16_fields = [](GgmlType t) -> std::vector<int> {
    switch (t) {
      case GgmlType::kQ2_K: return {80, 82};
      case GgmlType::kQ3_K: return {108};
      case GgmlType::kIQ2_XXS: return {0};
      default: return {};
    }
  };
  // One expert's matrix [out, in] of type t as random bytes, copied to every
  // expert's place in one buffer [E, out, row_bytes].
  auto matrices = [&](GgmlType t, int64_t out, int64_t in, int64_t& row_bytes) {
    const quant::GgmlTypeTraits& tr = quant::ggml_traits(t);
    row_bytes = in / tr.block_elems * tr.block_bytes;
    const size_t one = size_t(out * row_bytes);
    std::vector<uint8_t> h(one);
    for (size_t i = 0; i + 8 <= one; i += 8) {
      const uint64_t v = rng();
      std::memcpy(h.data() + i, &v, 8);
    }
    std::uniform_real_distribution<float> scale(0.0005f, 0.004f);
    for (size_t b = 0; b + size_t(tr.block_bytes) <= one; b += size_t(tr.block_bytes))
      for (int off : f16_fields(t)) {
        const uint16_t v = f32_to_f16(scale(rng));
        std::memcpy(h.data() + b + size_t(off), &v, 2);
      }
    auto buf = DeviceBuffer::allocate(one * size_t(E), "bench experts");
    EXPECT_TRUE(buf.is_ok());
    for (int e = 0; e < E; ++e)
      EXPECT_TRUE(copy_to_device(buf->as<uint8_t>() + size_t(e) * one, h.data(), one, "bench experts").is_ok());
    return std::move(buf).value();
  };
  // Routes: 6 distinct experts per token, uniformly random.
  std::vector<int32_t> ids(size_t(T * k));
  std::uniform_int_distribution<int> pick(0, E - 1);
  for (int64_t t = 0; t < T; ++t)
    for (int j = 0; j < k; ++j) {
      int e;
      do {
        e = pick(rng);
      } while (std::find(ids.begin() + t * k, ids.begin() + t * k + j, e) != ids.begin() + t * k + j);
      ids[size_t(t * k + j)] = e;
    }
  std::vector<int> per_expert(size_t(E), 0);
  for (int32_t e : ids) ++per_expert[size_t(e)];
  const int active = int(std::count_if(per_expert.begin(), per_expert.end(), [](int n) { return n > 0; }));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(T * D));
  for (float& v : x) v = nd(rng);
  auto dids = upload_vector(ids, "ids");
  auto dx = upload_vector(x, "x");
  auto dy = DeviceBuffer::allocate(size_t(T * k * D) * 4, "y");
  ASSERT_TRUE(dids.is_ok() && dx.is_ok() && dy.is_ok());
  const double flop = 2.0 * double(T * k) * 3.0 * double(D * I);
  for (const Recipe& r : recipes) {
    int64_t rb_up = 0, rb_down = 0;
    DeviceBuffer w1 = matrices(r.up, I, D, rb_up), w3 = matrices(r.up, I, D, rb_up);
    DeviceBuffer w2 = matrices(r.down, D, I, rb_down);
    std::vector<ExpertSlot> slots(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) {
      auto lin = [&](GgmlType t, int64_t out, int64_t in, int64_t rb, const DeviceBuffer& b) {
        DeviceLinear w;
        w.format = DevFormat::kGgml, w.ggml_type = int32_t(t), w.out = out, w.in = in, w.row_bytes = rb;
        w.tables = reinterpret_cast<const uint8_t*>(*tables);
        w.weight = b.as<uint8_t>() + size_t(e) * size_t(out * rb);
        return w;
      };
      slots[size_t(e)] = {lin(r.up, I, D, rb_up, w1), lin(r.up, I, D, rb_up, w3), lin(r.down, D, I, rb_down, w2)};
    }
    ASSERT_TRUE(moe_ggml_layout(slots.data(), slots.size(), D, I).is_ok());
    const double weight_bytes = double(active) * double(2 * I * rb_up + D * rb_down);
    GroupedMoeArgs g;
    g.slots = slots, g.ids = dids->as<int32_t>(), g.n_pairs = T * k, g.pairs_per_token = k;
    g.x = dx->as<float>(), g.D = D, g.inter = I, g.swiglu_limit = 10.0f, g.y = dy->as<float>();
    // 0, 1: fused, first and second form side by side; 2, 3: per-expert cuBLAS in bf16x3, bf16.
    for (int mode = 0; mode < 4; ++mode) {
      const bool fused = mode <= 1;
      const MmaPrecision prec = mode == 2 ? MmaPrecision::kBf16x3 : MmaPrecision::kBf16;
      moe_grouped_set_ggml_fused(fused);
      moe_grouped_set_ggml_kernel(mode == 1 ? 2 : 1);
      ASSERT_TRUE(moe_grouped_ffn(g, prec, nullptr).is_ok());  // warm-up: scratch, smem limits, cuBLAS
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const int reps = fused ? 10 : 3;
      cudaEvent_t e0, e1;
      cudaEventCreate(&e0), cudaEventCreate(&e1);
      cudaEventRecord(e0);
      for (int i = 0; i < reps; ++i) ASSERT_TRUE(moe_grouped_ffn(g, prec, nullptr).is_ok());
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float ms = 0.0f;
      cudaEventElapsedTime(&ms, e0, e1);
      cudaEventDestroy(e0), cudaEventDestroy(e1);
      moe_grouped_set_ggml_fused(true);
      moe_grouped_set_ggml_kernel(form_before);
      const double per = double(ms) / reps;
      std::printf("[moe-grouped-bench] %-13s %-24s %2d experts active, %lld pairs: %8.3f ms/call  %6.1f TFLOP/s  "
                  "%7.1f GB/s of weights\n",
                  r.name,
                  mode == 0   ? "fused v1"
                  : mode == 1 ? "fused v2"
                  : mode == 2 ? "per-expert cuBLAS bf16x3"
                              : "per-expert cuBLAS bf16",
                  active, (long long)(T * k), per, flop / per * 1e-9, weight_bytes / per * 1e-6);
    }
  }
}

}  // namespace
}  // namespace aff::cuda
