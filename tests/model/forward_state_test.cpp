// The incremental state: one-shot prefill, chunked prefill of several chunk
// sizes and token-by-token decode must give the same logits on random models
// that exercise every layer type (sliding with a wrapping ring, CSA whose
// indexer really selects, HCA with emitted entries) and hash routing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "model/dsv4/forward.h"
#include "random_model.h"

namespace aff::dsv4 {
namespace {

std::vector<int32_t> random_tokens(int64_t n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = d(rng);
  return t;
}

// All-position logits [T, V] from feeding the tokens in chunks (0 = one call).
std::vector<float> run(const LoadedModel& m, const std::vector<int32_t>& tokens, size_t chunk,
                       const ForwardOptions& opts = {}) {
  auto st = make_state(m, int64_t(tokens.size()));
  std::vector<float> all, part;
  if (chunk == 0) chunk = tokens.size();
  for (size_t i = 0; i < tokens.size(); i += chunk) {
    const size_t n = std::min(chunk, tokens.size() - i);
    const Status s = forward(m, *st, std::span(tokens).subspan(i, n), true, part, opts);
    EXPECT_TRUE(s.is_ok()) << s.message();
    all.insert(all.end(), part.begin(), part.end());
  }
  EXPECT_EQ(state_n_past(*st), int64_t(tokens.size()));
  return all;
}

// max |a - b| / max |b|.
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0.0, m = 0.0;
  for (size_t i = 0; i < b.size(); ++i) {
    d = std::max(d, double(std::fabs(a[i] - b[i])));
    m = std::max(m, double(std::fabs(b[i])));
  }
  return d / m;
}

struct Case {
  const char* name;
  std::vector<int> ratios;
  int hash_layers;
  int64_t n_tokens;
};

class ForwardState : public ::testing::TestWithParam<Case> {};

TEST_P(ForwardState, ChunkingDoesNotChangeLogits) {
  const Case& c = GetParam();
  std::random_device rd;
  const uint64_t seed = rd();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const ModelConfig cfg = testing::tiny_config(c.ratios, c.hash_layers);
  auto model = testing::random_model(cfg, seed);
  ASSERT_NE(model, nullptr);
  const auto tokens = random_tokens(c.n_tokens, int(cfg.vocab_size), seed + 1);

  const std::vector<float> one_shot = run(*model, tokens, 0);
  ASSERT_EQ(one_shot.size(), size_t(c.n_tokens * cfg.vocab_size));
  for (float v : one_shot) ASSERT_TRUE(std::isfinite(v));
  // Non-degenerate: logits vary across positions.
  EXPECT_NE(one_shot[0], one_shot[size_t((c.n_tokens - 1) * cfg.vocab_size)]);
  for (size_t chunk : {size_t(1), size_t(7), size_t(64)}) {
    const std::vector<float> got = run(*model, tokens, chunk);
    EXPECT_LE(max_rel_diff(got, one_shot), 1e-5) << c.name << " chunk " << chunk;
  }
}

// Sizes chosen so that: the 16-slot window wraps; HCA ratio 16 emits entries;
// CSA emits more than index_topk (5) entries so the indexer selects.
INSTANTIATE_TEST_SUITE_P(
    Layers, ForwardState,
    ::testing::Values(Case{"swa_only", {0, 0}, 1, 41},
                      Case{"swa_csa_hca16_hash", {0, 4, 16, 4}, 2, 133},
                      Case{"hca_first", {8, 0, 4}, 1, 90}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Forward, LastPositionOnlyMatchesAllPositions) {
  const ModelConfig cfg = testing::tiny_config({4, 0}, 1);
  auto model = testing::random_model(cfg, 7);
  ASSERT_NE(model, nullptr);
  const auto tokens = random_tokens(23, int(cfg.vocab_size), 8);
  const std::vector<float> all = run(*model, tokens, 0);
  auto st = make_state(*model, 64);
  std::vector<float> last;
  ASSERT_TRUE(forward(*model, *st, tokens, false, last).is_ok());
  ASSERT_EQ(last.size(), size_t(cfg.vocab_size));
  const std::vector<float> want(all.end() - cfg.vocab_size, all.end());
  EXPECT_LE(max_rel_diff(last, want), 1e-6);
}

TEST(Forward, ResetStartsANewSequence) {
  const ModelConfig cfg = testing::tiny_config({4, 16}, 0);
  auto model = testing::random_model(cfg, 11);
  ASSERT_NE(model, nullptr);
  const auto a = random_tokens(37, int(cfg.vocab_size), 12);
  const auto b = random_tokens(29, int(cfg.vocab_size), 13);
  auto st = make_state(*model, 64);
  std::vector<float> tmp, got;
  ASSERT_TRUE(forward(*model, *st, a, true, tmp).is_ok());
  state_reset(*st);
  EXPECT_EQ(state_n_past(*st), 0);
  ASSERT_TRUE(forward(*model, *st, b, true, got).is_ok());
  EXPECT_LE(max_rel_diff(got, run(*model, b, 0)), 1e-6);
}

TEST(Forward, DebugOptionsChangeTheComputation) {
  const ModelConfig cfg = testing::tiny_config({0, 4, 0}, 1);
  auto model = testing::random_model(cfg, 21);
  ASSERT_NE(model, nullptr);
  const auto tokens = random_tokens(19, int(cfg.vocab_size), 22);
  const std::vector<float> full = run(*model, tokens, 0);
  ForwardOptions two_layers;
  two_layers.max_layers = 2;
  ForwardOptions shared_only;
  shared_only.no_routed_experts = true;
  const std::vector<float> a = run(*model, tokens, 0, two_layers);
  const std::vector<float> b = run(*model, tokens, 0, shared_only);
  ASSERT_EQ(a.size(), full.size());
  ASSERT_EQ(b.size(), full.size());
  EXPECT_GT(max_rel_diff(a, full), 1e-3);
  EXPECT_GT(max_rel_diff(b, full), 1e-3);
  // max_layers = all layers is the full model; chunked debug runs stay consistent.
  ForwardOptions all_layers;
  all_layers.max_layers = cfg.num_layers;
  EXPECT_LE(max_rel_diff(run(*model, tokens, 0, all_layers), full), 1e-7);
  EXPECT_LE(max_rel_diff(run(*model, tokens, 5, two_layers), a), 1e-5);

  // Changing max_layers mid-sequence would leave skipped layers without history.
  auto st = make_state(*model, 64);
  std::vector<float> logits;
  ASSERT_TRUE(forward(*model, *st, std::span(tokens).first(5), false, logits, two_layers).is_ok());
  const Status s = forward(*model, *st, std::span(tokens).subspan(5, 3), false, logits);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("max_layers"), std::string::npos) << s.message();
  state_reset(*st);
  EXPECT_TRUE(forward(*model, *st, std::span(tokens).first(5), false, logits).is_ok());
}

TEST(Forward, RejectsBadTokensAndOverflow) {
  const ModelConfig cfg = testing::tiny_config({0}, 0);
  auto model = testing::random_model(cfg, 31);
  ASSERT_NE(model, nullptr);
  auto st = make_state(*model, 4);
  std::vector<float> logits;
  const std::vector<int32_t> bad = {1, int32_t(cfg.vocab_size)};
  Status s = forward(*model, *st, bad, false, logits);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("vocabulary"), std::string::npos) << s.message();
  EXPECT_EQ(state_n_past(*st), 0);
  const std::vector<int32_t> five = {1, 2, 3, 4, 5};
  s = forward(*model, *st, five, false, logits);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(forward(*model, *st, std::span(five).first(4), false, logits).code(), StatusCode::kOk);
}

}  // namespace
}  // namespace aff::dsv4
