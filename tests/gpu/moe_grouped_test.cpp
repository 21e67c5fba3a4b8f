// The grouped prefill experts (kernels/gemm/moe_grouped) against expert_ffn,
// the per-pair GEMV path that tests/gpu holds to the CPU reference: random
// experts in FP8 block, MXFP4 and BF16, tokens whose pairs leave some experts
// unused and give others many tokens, with and without the SwiGLU clamp.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "backend/cuda/check/op_check.h"
#include "backend/cuda/kernels/gemm/moe_grouped.h"
#include "backend/cuda/kernels/moe/moe.h"
#include "backend/cuda/runtime/device_buffer.h"
#include "device_random_linear.h"
#include "gpu_test_util.h"

namespace aff::cuda {
namespace {

// Weights decode to bf16 exactly; activations (x, then the SwiGLU output) as
// hi + lo bf16: a few 1e-6 through two GEMMs.
constexpr double kTolBf16x3 = 3e-5;
// x and the SwiGLU output rounded once each to bf16: ~3e-3 relative RMS.
constexpr double kTolBf16 = 1.5e-2;

TEST(MoeGrouped, MatchesPerPairExperts) {
  AFF_SKIP_WITHOUT_GPU();
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
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

}  // namespace
}  // namespace aff::cuda
