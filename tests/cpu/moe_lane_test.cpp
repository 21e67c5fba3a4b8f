// The MoE layer on the CPU lane in one parallel region (moe_lane.h) against the
// per-projection path it replaces (dsv4::expert_forward, each linear on the lane): the
// outputs must be bit-identical for several experts of mixed types and token counts,
// with and without the SwiGLU clamp, and must not depend on the thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/linear_fast.h"
#include "backend/cpu/moe_lane.h"
#include "model/dsv4/config.h"
#include "model/dsv4/moe.h"
#include "quant/type_traits.h"
#include "random_blocks.h"

namespace aff::cpu {
namespace {

using quant::GgmlType;

struct OwnedLinear {
  std::vector<uint8_t> bytes;
};

dsv4::Linear make_linear(GgmlType type, int64_t out, int64_t in, std::mt19937_64& rng, OwnedLinear& own) {
  own.bytes = random_weights(type, out, in, rng);
  dsv4::Linear l;
  l.weight.name = "test.expert.weight";
  l.weight.dtype = DType::kU8;
  l.weight.shape = {out, *quant::ggml_row_bytes(type, in)};
  l.weight.data = own.bytes.data();
  l.weight.nbytes = own.bytes.size();
  l.format = dsv4::WeightFormat::kGgml;
  l.ggml_type = int(type);
  l.out = out;
  l.in = in;
  return l;
}

struct Expert {
  OwnedLinear o1, o2, o3;
  dsv4::ExpertWeights w;
};

struct LaneOn {
  bool was = cpu_lane_enabled();
  LaneOn() { set_cpu_lane_enabled(true); }
  ~LaneOn() { set_cpu_lane_enabled(was); }
};

TEST(MoeLane, BitIdenticalToPerProjectionExpertsAtAnyThreadCount) {
  LaneOn lane;
  std::mt19937_64 rng(std::random_device{}());
  // D and I as small multiples of 256 (odd block counts), several row chunks each.
  const int64_t D = 3 * 256, I = 5 * 256;
  const GgmlType types[][2] = {{GgmlType::kIQ2_XXS, GgmlType::kQ4_K},
                               {GgmlType::kQ2_K, GgmlType::kQ3_K},
                               {GgmlType::kIQ4_XS, GgmlType::kQ8_0},
                               {GgmlType::kMXFP4, GgmlType::kMXFP4},
                               {GgmlType::kIQ1_M, GgmlType::kIQ2_XS}};
  std::vector<Expert> experts(std::size(types));
  for (size_t e = 0; e < experts.size(); ++e) {
    Expert& x = experts[e];
    x.w.w1 = make_linear(types[e][0], I, D, rng, x.o1);
    x.w.w3 = make_linear(types[e][0], I, D, rng, x.o3);
    x.w.w2 = make_linear(types[e][1], D, I, rng, x.o2);
    if (!moe_lane_supported(x.w)) GTEST_SKIP() << "no SIMD kernels on this CPU";
  }
  const int64_t tokens[] = {1, 3, 0, 2, 5};
  for (double limit : {0.0, 0.05}) {
    dsv4::ModelConfig cfg;
    cfg.hidden_size = D;
    cfg.swiglu_limit = limit;
    std::vector<std::vector<float>> xs(experts.size()), want(experts.size());
    std::vector<ExpertJob> jobs;
    for (size_t e = 0; e < experts.size(); ++e) {
      const int64_t n = tokens[e];
      xs[e] = random_floats(std::max<int64_t>(1, n) * D, rng);
      want[e].assign(size_t(std::max<int64_t>(1, n) * D), NAN);
      if (n > 0) dsv4::expert_forward(cfg, experts[e].w, xs[e].data(), n, want[e].data());
      jobs.push_back({&experts[e].w, xs[e].data(), n, nullptr});
    }
    for (int threads : {1, 3}) {
      std::vector<std::vector<float>> got(experts.size());
      for (size_t e = 0; e < experts.size(); ++e) {
        got[e].assign(want[e].size(), NAN);
        jobs[e].y = got[e].data();
      }
      const int saved = omp_get_max_threads();
      omp_set_num_threads(threads);
      ASSERT_TRUE(moe_lane_experts(jobs, float(limit)));
      omp_set_num_threads(saved);
      for (size_t e = 0; e < experts.size(); ++e) {
        if (tokens[e] == 0) continue;
        EXPECT_EQ(0, std::memcmp(want[e].data(), got[e].data(), want[e].size() * sizeof(float)))
            << "expert " << e << " threads " << threads << " limit " << limit;
      }
    }
  }
}

TEST(MoeLane, DeclinesExpertsOffTheLane) {
  LaneOn lane;
  std::mt19937_64 rng(1);
  Expert x;
  x.w.w1 = make_linear(GgmlType::kQ4_K, 256, 256, rng, x.o1);
  x.w.w3 = make_linear(GgmlType::kQ8_0, 256, 256, rng, x.o3);  // another activation format
  x.w.w2 = make_linear(GgmlType::kQ4_K, 256, 256, rng, x.o2);
  EXPECT_FALSE(moe_lane_supported(x.w));
  std::vector<float> in(256, 1.0f), out(256, -7.0f);
  const ExpertJob job{&x.w, in.data(), 1, out.data()};
  EXPECT_FALSE(moe_lane_experts({&job, 1}, 0.0f));
  EXPECT_EQ(out[0], -7.0f);
  set_cpu_lane_enabled(false);
  x.w.w3 = x.w.w1;
  EXPECT_FALSE(moe_lane_supported(x.w));
}

}  // namespace
}  // namespace aff::cpu
