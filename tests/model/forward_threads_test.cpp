// Thread count must not change results (each output row is computed by one
// thread with a fixed summation order), and a timing probe for the size the
// reference backend is meant for.
#include <gtest/gtest.h>

#include <omp.h>

#include <chrono>
#include <cstdio>
#include <random>

#include "backend/ref/vec.h"
#include "model/dsv4/forward.h"
#include "random_model.h"

namespace aff::dsv4 {
namespace {

std::vector<float> prefill(const LoadedModel& m, const std::vector<int32_t>& tokens) {
  auto st = make_state(m, int64_t(tokens.size()));
  std::vector<float> logits;
  const Status s = forward(m, *st, tokens, true, logits);
  EXPECT_TRUE(s.is_ok()) << s.message();
  return logits;
}

TEST(ForwardThreads, OneAndTwoThreadsGiveIdenticalLogits) {
  const ModelConfig cfg = testing::tiny_config({0, 4, 16}, 1);
  std::mt19937_64 rng(std::random_device{}());
  auto model = testing::random_model(cfg, rng());
  ASSERT_NE(model, nullptr);
  std::vector<int32_t> tokens(300);
  for (auto& t : tokens) t = int32_t(rng() % uint64_t(cfg.vocab_size));
  ref::adapt_threads_to_load();  // once per thread: must not undo the settings below
  const int saved = omp_get_max_threads();
  const int saved_dyn = omp_get_dynamic();
  omp_set_dynamic(0);
  omp_set_num_threads(1);
  const std::vector<float> one = prefill(*model, tokens);
  omp_set_num_threads(2);
  const std::vector<float> two = prefill(*model, tokens);
  omp_set_num_threads(saved);
  omp_set_dynamic(saved_dyn);
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); ++i) ASSERT_EQ(one[i], two[i]) << "logit " << i;
}

// Manual probe (--gtest_also_run_disabled_tests): a 5-layer, hidden-256 model
// prefilling 600 tokens, the size the golden-style tests use.
TEST(ForwardThreads, DISABLED_PrefillTiming) {
  ModelConfig cfg = testing::tiny_config({0, 4, 16, 4, 0}, 2);
  cfg.hidden_size = 256;
  cfg.num_heads = 4;
  cfg.head_dim = 128;
  cfg.rope_dim = 64;
  cfg.q_lora_rank = 128;
  cfg.o_lora_rank = 64;
  cfg.sliding_window = 64;
  cfg.index_n_heads = 4;
  cfg.index_head_dim = 64;
  cfg.index_topk = 16;
  cfg.n_routed_experts = 8;
  cfg.moe_inter = 128;
  cfg.vocab_size = 512;
  cfg.weight_block = 128;
  auto model = testing::random_model(cfg, 5);
  ASSERT_NE(model, nullptr);
  std::vector<int32_t> tokens(600);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 37) % 512);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<float> logits = prefill(*model, tokens);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("prefill 600 tokens, 5 layers, hidden 256: %.3f s (%d threads max)\n", s,
              omp_get_max_threads());
  auto st = make_state(*model, 600);
  std::vector<float> l;
  const auto t1 = std::chrono::steady_clock::now();
  for (int32_t t : tokens) ASSERT_TRUE(forward(*model, *st, std::span(&t, 1), false, l).is_ok());
  const double d = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  std::printf("decode 600 tokens one by one: %.3f s (%.2f ms/token)\n", d, 1e3 * d / 600);
}

}  // namespace
}  // namespace aff::dsv4
