// Routing statistics: buckets and shares by hand, a recorder fed a known
// routing sequence, and the hash layers of a real forward pass, whose experts
// are fixed by tid2eid for the given token ids.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "backend/ref/vec.h"
#include "model/dsv4/forward.h"
#include "quality_test_util.h"
#include "runtime/perplexity.h"
#include "runtime/route_stats.h"

namespace aff {
namespace {

using runtime::kReuseFar;
using runtime::kReuseNever;

TEST(RouteStats, ReuseBuckets) {
  EXPECT_EQ(runtime::reuse_bucket(1), 0);
  EXPECT_EQ(runtime::reuse_bucket(2), 1);
  EXPECT_EQ(runtime::reuse_bucket(3), 1);
  EXPECT_EQ(runtime::reuse_bucket(4), 2);
  EXPECT_EQ(runtime::reuse_bucket(7), 2);
  EXPECT_EQ(runtime::reuse_bucket(8), 3);
  EXPECT_EQ(runtime::reuse_bucket(1023), 9);
  EXPECT_EQ(runtime::reuse_bucket(1024), kReuseFar);
  EXPECT_EQ(runtime::reuse_bucket(99999), kReuseFar);
  EXPECT_EQ(runtime::reuse_bucket_label(0), "1");
  EXPECT_EQ(runtime::reuse_bucket_label(3), "8-15");
  EXPECT_EQ(runtime::reuse_bucket_label(9), "512-1023");
  EXPECT_EQ(runtime::reuse_bucket_label(kReuseFar), ">=1024");
  EXPECT_EQ(runtime::reuse_bucket_label(kReuseNever), "never");
}

TEST(RouteStats, TopShare) {
  EXPECT_DOUBLE_EQ(runtime::top_share(std::vector<int64_t>(32, 5), 0.1), 0.1);
  EXPECT_DOUBLE_EQ(runtime::top_share(std::vector<int64_t>(10, 3), 0.1), 0.1);
  // 32 experts: 3.2 of them = the top 3 counts + 0.2 x the 4th.
  std::vector<int64_t> c(32, 1);
  c[7] = 40;
  c[3] = 30;
  c[20] = 20;
  c[9] = 10;  // total = 100 + 28
  EXPECT_DOUBLE_EQ(runtime::top_share(c, 0.1), (40 + 30 + 20 + 0.2 * 10) / 128.0);
  EXPECT_DOUBLE_EQ(runtime::top_share(std::vector<int64_t>(5, 0), 0.1), 0.0);
}

dsv4::Routing routing_of(int k, const std::vector<std::vector<int32_t>>& rows) {
  dsv4::Routing r;
  r.k = k;
  for (const auto& row : rows) {
    r.experts.insert(r.experts.end(), row.begin(), row.end());
    r.weights.insert(r.weights.end(), row.size(), 1.0f);
  }
  return r;
}

// A known sequence, k = 2 of 4 experts, in two calls (positions 0-3 and 10-11).
TEST(RouteStats, RecorderOnKnownSequence) {
  dsv4::ModelConfig cfg;
  cfg.n_routed_experts = 4;
  cfg.num_hash_layers = 1;
  runtime::RouteStatsRecorder rec(cfg);
  // pos 0: {0,1} never,never   pos 1: {0,2} d1,never   pos 2: {1,2} d2,d1   pos 3: {0,1} d2,d1
  // pos 10: {3,0} never,d7     pos 11: {1,3} d8,d1
  rec.observer()(1, 0, routing_of(2, {{0, 1}, {0, 2}, {1, 2}, {0, 1}}));
  rec.observer()(1, 10, routing_of(2, {{3, 0}, {1, 3}}));
  rec.observe(0, 0, routing_of(2, {{2, 3}}));
  const auto layers = rec.layers();
  ASSERT_EQ(layers.size(), 2u);
  EXPECT_EQ(layers[0].layer, 0);
  EXPECT_TRUE(layers[0].hash);
  EXPECT_EQ(layers[0].reuse[kReuseNever], 2);
  const runtime::LayerRouteStats& l = layers[1];
  EXPECT_EQ(l.layer, 1);
  EXPECT_FALSE(l.hash);
  EXPECT_EQ(l.tokens, 6);
  EXPECT_EQ(l.activations, 12);
  EXPECT_EQ(l.expert_counts, (std::vector<int64_t>{4, 4, 2, 2}));
  std::array<int64_t, runtime::kReuseBuckets> want{};
  want[0] = 4;            // d = 1: pos1 e0, pos2 e2, pos3 e1, pos11 e3
  want[1] = 2;            // d = 2: pos2 e1, pos3 e0
  want[2] = 1;            // d = 7: pos10 e0
  want[3] = 1;            // d = 8: pos11 e1
  want[kReuseNever] = 4;  // e0, e1, e2 at their first use, e3 at pos 10
  EXPECT_EQ(l.reuse, want);
  // 4 experts: 0.4 of the busiest (4 of 12).
  EXPECT_DOUBLE_EQ(l.top10_share, 0.4 * 4 / 12.0);
}

// Hash layers route by token id: over a whole text in chunks, the recorder's
// counts and reuse distances are those computed here from tid2eid directly.
TEST(RouteStats, HashLayersFollowTid2eid) {
  std::mt19937_64 rng(std::random_device{}());
  const dsv4::ModelConfig cfg = quality_test::mtp_config();
  auto m = dsv4::testing::random_model(cfg, rng());
  ASSERT_NE(m, nullptr);
  // Few distinct ids, so experts come back at short and long distances.
  std::vector<int32_t> text = quality_test::random_tokens(rng, 211, 9);
  for (int32_t& t : text) t += 3;
  runtime::RouteStatsRecorder rec(cfg);
  runtime::PerplexityOptions po;
  po.context = 50;
  po.bos_each_chunk = false;
  po.score = false;
  po.route_observer = &rec.observer();
  auto r = runtime::evaluate_perplexity(*m, text, po);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  // 211 tokens = 4 chunks of 50 + 11: the stream is the text itself.
  EXPECT_EQ(r.value().positions, 211);
  const auto layers = rec.layers();
  ASSERT_EQ(int(layers.size()), cfg.num_layers);  // no MTP block when not scoring
  const int k = cfg.n_experts_per_tok;
  for (int layer = 0; layer < cfg.num_hash_layers; ++layer) {
    SCOPED_TRACE(layer);
    const TensorView& tid2eid = m->weights.layers[size_t(layer)].ffn.tid2eid;
    std::vector<int64_t> counts(size_t(cfg.n_routed_experts), 0);
    std::array<int64_t, runtime::kReuseBuckets> want{};
    for (size_t p = 0; p < text.size(); ++p) {
      for (int i = 0; i < k; ++i) {
        const int64_t e = ref::tensor_i64_at(tid2eid, int64_t(text[p]) * k + i);
        ++counts[size_t(e)];
        int64_t d = 0;  // scan back for the last token that chose e
        for (size_t q = p; q-- > 0 && d == 0;)
          for (int j = 0; j < k; ++j)
            if (ref::tensor_i64_at(tid2eid, int64_t(text[q]) * k + j) == e) d = int64_t(p - q);
        ++want[size_t(d == 0 ? kReuseNever : runtime::reuse_bucket(d))];
      }
    }
    EXPECT_TRUE(layers[size_t(layer)].hash);
    EXPECT_EQ(layers[size_t(layer)].tokens, 211);
    EXPECT_EQ(layers[size_t(layer)].expert_counts, counts);
    EXPECT_EQ(layers[size_t(layer)].reuse, want);
  }
  for (int layer = cfg.num_hash_layers; layer < cfg.num_layers; ++layer) {
    const auto& l = layers[size_t(layer)];
    EXPECT_FALSE(l.hash);
    EXPECT_EQ(l.activations, 211 * k);
    int64_t sum = 0;
    for (int64_t v : l.reuse) sum += v;
    EXPECT_EQ(sum, l.activations);
    EXPECT_GE(l.top10_share, 0.1 - 1e-12);  // the busiest tenth never holds less than a tenth
  }
}

// When the MTP head is scored its block's routing is recorded too, as layer
// num_layers, one row per MTP prediction.
TEST(RouteStats, MtpBlockWhenScoring) {
  std::mt19937_64 rng(std::random_device{}());
  const dsv4::ModelConfig cfg = quality_test::mtp_config();
  auto m = dsv4::testing::random_model(cfg, rng());
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> text = quality_test::random_tokens(rng, 89, cfg.vocab_size);
  runtime::RouteStatsRecorder rec(cfg);
  runtime::PerplexityOptions po;
  po.context = 40;
  po.bos_id = cfg.bos_token_id;
  po.batch = 11;
  po.route_observer = &rec.observer();
  auto r = runtime::evaluate_perplexity(*m, text, po);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  const auto layers = rec.layers();
  ASSERT_EQ(int(layers.size()), cfg.num_layers + 1);
  EXPECT_TRUE(layers.back().mtp);
  EXPECT_STREQ(runtime::router_name(layers.back()), "mtp");
  EXPECT_EQ(layers.back().tokens, r.value().mtp.predictions);
  EXPECT_EQ(layers.front().tokens, r.value().positions);
  const std::string table = runtime::route_stats_table(layers);
  EXPECT_NE(table.find(" mtp "), std::string::npos) << table;
}

}  // namespace
}  // namespace aff
