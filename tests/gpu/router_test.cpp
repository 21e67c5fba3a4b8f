// The decode router in one launch (router_gate_topk: gate GEMV, then the last
// block routes) against the two-launch path it replaces (gemv + router_topk),
// on V4's shape and odd ones, 1..8 tokens, top-k with a bias and hash
// routing, BF16 and F32 gates. The picks must agree exactly and the weights
// and logits to f32 rounding of a differently ordered dot product. Each case
// runs twice: the ticket the kernel leaves must let the next launch route.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cuda/kernels/gemv/gemv.h"
#include "backend/cuda/kernels/moe/moe.h"
#include "backend/cuda/runtime/device_buffer.h"
#include "device_random_linear.h"
#include "gpu_test_util.h"

namespace aff::cuda {
namespace {

struct RouterCase {
  DevFormat format;
  int E, k;
  int64_t D, T;
  bool hash;
};

class RouterGateTopk : public ::testing::TestWithParam<RouterCase> {};

TEST_P(RouterGateTopk, MatchesGemvThenTopk) {
  AFF_SKIP_WITHOUT_GPU();
  const RouterCase c = GetParam();
  AFF_SEEDED_RNG(seed, rng);
  testing::RandomWeight gate = testing::make_weight(c.format, c.E, c.D, rng);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::vector<float> x(size_t(c.T * c.D)), bias(size_t(c.E));
  for (float& v : x) v = nd(rng);
  for (float& v : bias) v = nd(rng);
  std::vector<int32_t> tokens(size_t(c.T)), table(size_t(10 * c.k));
  std::uniform_int_distribution<int> tok(0, 9), ex(0, c.E - 1);
  for (int32_t& v : tokens) v = tok(rng);
  for (int32_t& v : table) v = ex(rng);
  auto dx = upload_vector(x, "x");
  auto db = upload_vector(bias, "bias");
  auto dt = upload_vector(tokens, "tokens");
  auto dh = upload_vector(table, "tid2eid");
  auto ticket = upload_vector(std::vector<uint32_t>{0u}, "ticket");
  const size_t TE = size_t(c.T * c.E), Tk = size_t(c.T * c.k);
  auto l1 = DeviceBuffer::allocate(TE * 4, "logits");
  auto l2 = DeviceBuffer::allocate(TE * 4, "logits");
  auto i1 = DeviceBuffer::allocate(Tk * 4, "ids"), i2 = DeviceBuffer::allocate(Tk * 4, "ids");
  auto w1 = DeviceBuffer::allocate(Tk * 4, "w"), w2 = DeviceBuffer::allocate(Tk * 4, "w");
  ASSERT_TRUE(dx.is_ok() && db.is_ok() && dt.is_ok() && dh.is_ok() && ticket.is_ok() && l1.is_ok() && l2.is_ok() &&
              i1.is_ok() && i2.is_ok() && w1.is_ok() && w2.is_ok());

  RouterArgs r;
  r.bias = c.hash ? nullptr : db->as<float>();
  r.tid2eid = c.hash ? dh->as<int32_t>() : nullptr, r.tokens = dt->as<int32_t>();
  r.T = c.T, r.E = c.E, r.k = c.k, r.func = ScoreFunc::kSqrtSoftplus, r.scaling = 1.5f;
  RouterArgs two = r, one = r;
  two.logits = l1->as<float>(), two.ids = i1->as<int32_t>(), two.weights = w1->as<float>();
  one.logits = l2->as<float>(), one.ids = i2->as<int32_t>(), one.weights = w2->as<float>();
  ASSERT_TRUE(gemv_f32(gate.w, dx->as<float>(), c.T, l1->as<float>(), nullptr).is_ok());
  ASSERT_TRUE(router_topk(two, nullptr).is_ok());
  ASSERT_TRUE(router_gate_topk_supports(one, gate.w));
  auto want_ids = download_vector(i1->as<int32_t>(), Tk, "ids");
  auto want_w = download_vector(w1->as<float>(), Tk, "w");
  auto want_l = download_vector(l1->as<float>(), TE, "logits");
  ASSERT_TRUE(want_ids.is_ok() && want_w.is_ok() && want_l.is_ok());
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE("launch " + std::to_string(run + 1));
    ASSERT_TRUE(cudaMemset(i2->data(), 0xff, Tk * 4) == cudaSuccess);
    ASSERT_TRUE(router_gate_topk(one, gate.w, dx->as<float>(), ticket->as<unsigned>(), nullptr).is_ok());
    auto got_ids = download_vector(i2->as<int32_t>(), Tk, "ids");
    auto got_w = download_vector(w2->as<float>(), Tk, "w");
    auto got_l = download_vector(l2->as<float>(), TE, "logits");
    auto got_ticket = download_vector(ticket->as<uint32_t>(), 1, "ticket");
    ASSERT_TRUE(got_ids.is_ok() && got_w.is_ok() && got_l.is_ok() && got_ticket.is_ok());
    EXPECT_EQ((*got_ticket)[0], 0u) << "the ticket must be left at zero";
    EXPECT_EQ(*got_ids, *want_ids);
    for (size_t i = 0; i < Tk; ++i) EXPECT_NEAR((*got_w)[i], (*want_w)[i], 1e-5f * std::fabs((*want_w)[i]) + 1e-7f);
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < TE; ++i) {
      const double d = double((*got_l)[i]) - (*want_l)[i];
      num += d * d, den += double((*want_l)[i]) * (*want_l)[i];
    }
    EXPECT_LE(std::sqrt(num / den), 1e-6) << "logits";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, RouterGateTopk,
    ::testing::Values(RouterCase{DevFormat::kBF16, 256, 6, 4096, 1, false}, RouterCase{DevFormat::kBF16, 256, 6, 4096, 8, false},
                      RouterCase{DevFormat::kBF16, 256, 6, 4096, 3, true}, RouterCase{DevFormat::kF32, 72, 5, 768, 2, false},
                      RouterCase{DevFormat::kBF16, 19, 3, 2304, 7, false}),
    [](const ::testing::TestParamInfo<RouterCase>& i) {
      return std::string(testing::name_of(i.param.format)) + "_E" + std::to_string(i.param.E) + "_T" +
             std::to_string(i.param.T) + (i.param.hash ? "_hash" : "");
    });

}  // namespace
}  // namespace aff::cuda
