// The decode MoE in one launch (moe_fused: router, shared expert, routed up
// and down behind two grid barriers) against the launches it replaces: the
// router launch (router_gate_topk) and the streaming up and down launches
// with the shared expert inside. Both compute the same products and sums in
// the same order, so logits, picks, weights and the output must agree bit
// for bit. Also checked: a deferred mHC comb finished by the launch equals
// hc_comb_run's, the barrier counters are left at zero, and a second launch
// (as the next step's) gives the same bits. Hash-routed layers, an F32 gate,
// fewer gate rows than blocks and both MMA precisions are covered.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/check/op_check.h"
#include "backend/cuda/kernels/gemm/mma_precision.h"
#include "backend/cuda/kernels/mhc/mhc.h"
#include "backend/cuda/kernels/moe/moe.h"
#include "backend/cuda/runtime/device_buffer.h"
#include "device_random_linear.h"
#include "gpu_test_util.h"
#include "random_weights.h"
#include "upload_experts.h"

namespace aff::cuda {
namespace {

using dsv4::WeightFormat;
using quant::GgmlType;
using testing::upload_experts;
using testing::UploadedExperts;

struct FusedCase {
  std::string name;
  GgmlType up, down;
  DevFormat gate;
  int E, k;
  int64_t D, I;
  // Runs on the same weights: {hash routing, MMA precision kBf16x3 (else kBf16)}.
  std::vector<std::pair<bool, bool>> runs;
};

class MoeFusedTest : public ::testing::TestWithParam<FusedCase> {};

template <class T>
std::vector<T> fetch(const DeviceBuffer& b, size_t n) {
  auto v = download_vector(b.as<T>(), n, "result");
  EXPECT_TRUE(v.is_ok());
  return v.is_ok() ? std::move(v).value() : std::vector<T>{};
}

TEST_P(MoeFusedTest, MatchesRouterAndLaunchesBitForBit) {
  AFF_SKIP_WITHOUT_GPU();
  const FusedCase c = GetParam();
  AFF_SEEDED_RNG(seed, rng);
  testing::Keep keep;
  // Two distinct experts, repeated through the E slots (random V4-sized experts are slow to make).
  std::vector<dsv4::ExpertWeights> routed(size_t(std::min(c.E, 2))), shared(1);
  for (auto& e : routed) {
    e.w1 = testing::random_ggml_linear(c.up, c.I, c.D, rng, keep);
    e.w3 = testing::random_ggml_linear(c.up, c.I, c.D, rng, keep);
    e.w2 = testing::random_ggml_linear(c.down, c.D, c.I, rng, keep);
  }
  shared[0].w1 = testing::random_native_linear(WeightFormat::kFP8Block, c.I, c.D, rng, keep);
  shared[0].w3 = testing::random_native_linear(WeightFormat::kFP8Block, c.I, c.D, rng, keep);
  shared[0].w2 = testing::random_native_linear(WeightFormat::kFP8Block, c.D, c.I, rng, keep);
  UploadedExperts ur, us;
  upload_experts(routed, ur);
  upload_experts(shared, us);
  ASSERT_FALSE(HasFatalFailure());
  std::vector<ExpertSlot> slot_table(size_t(c.E));
  for (size_t e = 0; e < slot_table.size(); ++e) slot_table[e] = ur.host[e % ur.host.size()];
  auto slots = upload_vector(slot_table, "slots");
  ASSERT_TRUE(slots.is_ok());
  testing::RandomWeight gate = testing::make_weight(c.gate, c.E, c.D, rng);

  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(c.D)), bias(size_t(c.E)), comb(16);
  for (float& v : x) v = nd(rng);
  for (float& v : bias) v = 0.05f * nd(rng);
  for (float& v : comb) v = nd(rng);
  std::vector<int32_t> tokens{3}, table(size_t(10 * c.k));
  std::uniform_int_distribution<int> ex(0, c.E - 1);
  for (int32_t& v : table) v = ex(rng);
  auto dx = upload_vector(x, "x");
  auto db = upload_vector(bias, "bias");
  auto dt = upload_vector(tokens, "tokens");
  auto dh = upload_vector(table, "tid2eid");
  auto ticket = upload_vector(std::vector<uint32_t>{0u}, "ticket");
  auto sync = upload_vector(std::vector<uint32_t>{0u, 0u, 0u}, "sync");
  auto comb_a = upload_vector(comb, "comb"), comb_b = upload_vector(comb, "comb");
  ASSERT_TRUE(dx.is_ok() && db.is_ok() && dt.is_ok() && dh.is_ok() && ticket.is_ok() && sync.is_ok() &&
              comb_a.is_ok() && comb_b.is_ok());

  // Two sets of outputs: the launches' (a) and the fused launch's (b).
  const size_t E = size_t(c.E), k = size_t(c.k), D = size_t(c.D);
  struct Outs {
    Result<DeviceBuffer> logits, ids, w, out, act;
  };
  auto outs = [&](const MoeDecodeArgs& shape) {
    return Outs{DeviceBuffer::allocate(E * 4, "logits"), DeviceBuffer::allocate(k * 4, "ids"),
                DeviceBuffer::allocate(k * 4, "w"), DeviceBuffer::allocate(D * 4, "out"),
                DeviceBuffer::allocate(size_t(moe_decode_act_bytes(shape)), "act")};
  };
  MoeDecodeArgs m;
  m.slots = slots->as<ExpertSlot>(), m.k = c.k;
  m.routed_format = DevFormat::kGgml, m.shared_format = DevFormat::kFP8Block;
  m.routed_ggml_up = ur.host[0].w1.ggml_type, m.routed_ggml_down = ur.host[0].w2.ggml_type;
  m.shared_fp8_block = us.host[0].w1.block, m.shared_slot = us.table.as<ExpertSlot>();
  m.x = dx->as<float>(), m.T = 1, m.D = c.D, m.inter = c.I, m.swiglu_limit = 0.6f;
  Outs a = outs(m), b = outs(m);
  for (Outs* o : {&a, &b})
    ASSERT_TRUE(o->logits.is_ok() && o->ids.is_ok() && o->w.is_ok() && o->out.is_ok() && o->act.is_ok());
  const HcCombJob no_job{};
  auto job = [&](DeviceBuffer& cb) { return HcCombJob{cb.as<float>(), 1, 4, 20, 1e-6f}; };
  for (const auto& [hash, exact] : c.runs) {
    SCOPED_TRACE(std::string(hash ? "hash routing" : "top-k routing") + (exact ? ", exact" : ", fast"));
    ASSERT_TRUE(copy_to_device(comb_a->data(), comb.data(), 64, "comb").is_ok());
    ASSERT_TRUE(copy_to_device(comb_b->data(), comb.data(), 64, "comb").is_ok());
    RouterArgs r;
    r.bias = hash ? nullptr : db->as<float>();
    r.tid2eid = hash ? dh->as<int32_t>() : nullptr, r.tokens = dt->as<int32_t>();
    r.T = 1, r.E = c.E, r.k = c.k, r.func = ScoreFunc::kSqrtSoftplus, r.scaling = 1.5f;
    set_mma_precision(exact ? MmaPrecision::kBf16x3 : MmaPrecision::kBf16);
    // (a) the router launch, then up and down launches with the shared expert inside.
    RouterArgs ra = r;
    ra.logits = a.logits->as<float>(), ra.ids = a.ids->as<int32_t>(), ra.weights = a.w->as<float>();
    ASSERT_TRUE(router_gate_topk(ra, gate.w, dx->as<float>(), ticket->as<unsigned>(), nullptr, no_job).is_ok());
    MoeDecodeArgs ma = m;
    ma.ids = ra.ids, ma.route_w = ra.weights, ma.act = a.act->as<float>(), ma.out = a.out->as<float>();
    ASSERT_TRUE(moe_decode_up(ma, nullptr).is_ok());
    ASSERT_TRUE(moe_decode_down(ma, nullptr).is_ok());
    ASSERT_TRUE(hc_comb_run(job(*comb_a), nullptr).is_ok());
    // (b) the fused launch, twice (the counters it leaves must serve the next launch).
    RouterArgs rb = r;
    rb.logits = b.logits->as<float>(), rb.ids = b.ids->as<int32_t>(), rb.weights = b.w->as<float>();
    MoeDecodeArgs mb = m;
    mb.ids = rb.ids, mb.route_w = rb.weights, mb.act = b.act->as<float>(), mb.out = b.out->as<float>();
    ASSERT_TRUE(moe_fused_supported(mb, rb, gate.w)) << "the fused launch must take this layout";
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
      SCOPED_TRACE("fused launch " + std::to_string(run + 1));
      ASSERT_EQ(cudaMemset(b.out->data(), 0xff, D * 4), cudaSuccess);
      ASSERT_EQ(cudaMemset(b.ids->data(), 0xff, k * 4), cudaSuccess);
      // The comb job runs once (its input is overwritten by its output).
      ASSERT_TRUE(moe_fused(mb, rb, gate.w, run == 0 ? job(*comb_b) : no_job, sync->as<unsigned>(), nullptr).is_ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(fetch<uint32_t>(*sync, 3), (std::vector<uint32_t>{0u, 0u, 0u})) << "counters left non-zero";
      EXPECT_EQ(fetch<int32_t>(*b.ids, k), fetch<int32_t>(*a.ids, k)) << "picks";
      const std::vector<float> lw_a = fetch<float>(*a.w, k), lw_b = fetch<float>(*b.w, k);
      EXPECT_EQ(std::memcmp(lw_a.data(), lw_b.data(), k * 4), 0) << "route weights";
      const std::vector<float> lg_a = fetch<float>(*a.logits, E), lg_b = fetch<float>(*b.logits, E);
      EXPECT_EQ(std::memcmp(lg_a.data(), lg_b.data(), E * 4), 0) << "logits";
      const std::vector<float> out_a = fetch<float>(*a.out, D), out_b = fetch<float>(*b.out, D);
      for (float v : out_b) ASSERT_TRUE(std::isfinite(v));
      EXPECT_EQ(std::memcmp(out_a.data(), out_b.data(), D * 4), 0)
          << "output differs from the launches' (rel rms " << rel_rms(out_b.data(), out_a.data(), D) << ")";
      if (run == 0) first = out_b;
      else EXPECT_EQ(std::memcmp(first.data(), out_b.data(), D * 4), 0) << "second launch differs";
    }
    EXPECT_EQ(fetch<float>(*comb_b, 16), fetch<float>(*comb_a, 16)) << "the deferred comb";
    set_mma_precision(MmaPrecision::kBf16x3);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, MoeFusedTest,
    ::testing::Values(
        // V4: 256 experts, top 6, Q2_K gate/up, Q3_K down, BF16 gate.
        FusedCase{"V4_Q2K_Q3K_bf16", GgmlType::kQ2_K, GgmlType::kQ3_K, DevFormat::kBF16, 256, 6, 4096, 2048,
                  {{false, true}, {false, false}, {true, true}}},
        // Fewer gate rows than blocks, an F32 gate, the other format pair.
        FusedCase{"IQ2XXS_Q2K_f32_E24", GgmlType::kIQ2_XXS, GgmlType::kQ2_K, DevFormat::kF32, 24, 4, 1024, 512,
                  {{false, true}}}),
    [](const ::testing::TestParamInfo<FusedCase>& i) { return i.param.name; });

}  // namespace
}  // namespace aff::cuda
