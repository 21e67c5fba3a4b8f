// The MoE site and router in one launch (site_router) against the two
// launches it replaces (hc_fused, then router_gate_topk on the site's x), on
// V4's shape and an odd one, in one launch and as two on two streams
// (site_router_split), and with the gate's stream columns in a launch of
// their own before the site, reading the streams in place
// (site_router_streams, then site_router_split with them done), 1 and 2 tokens, top-k with a bias and hash
// routing, BF16 and F32 gates. The site's outputs must be the same bits (same
// body; the merged launch finishes comb's Sinkhorn itself, which must give the
// bits of the site's own); the picks must agree exactly, the logits and weights to f32 rounding
// (the gate's sums are reassociated through the site's linear mix). Each case
// runs twice: the tickets the kernel leaves must let the next launch route.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "backend/cuda/kernels/mhc/mhc.h"
#include "backend/cuda/kernels/moe/moe.h"
#include "backend/cuda/kernels/moe/site_router.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/device_buffer.h"
#include "device_random_linear.h"
#include "gpu_test_util.h"

namespace aff::cuda {
namespace {

constexpr int kHc = 4, kMix = 24;

struct SiteRouterCase {
  DevFormat format;
  int E, k;
  int64_t D, T;
  bool hash;
};

double rel_rms(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = double(got[i]) - want[i];
    num += d * d, den += double(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

class SiteRouter : public ::testing::TestWithParam<SiteRouterCase> {};

TEST_P(SiteRouter, MatchesSiteThenRouter) {
  AFF_SKIP_WITHOUT_GPU();
  const SiteRouterCase c = GetParam();
  AFF_SEEDED_RNG(seed, rng);
  const size_t T = size_t(c.T), D = size_t(c.D), E = size_t(c.E), Tk = T * size_t(c.k);
  testing::RandomWeight gate = testing::make_weight(c.format, c.E, c.D, rng);
  // The site's inputs as a decode step sees them: the previous site's streams
  // (and its copies), the attention's output, post / comb of the previous site.
  const std::vector<float> h1 = testing::randn(T * kHc * D, rng), a = testing::randn(T * D, rng, 2.0f);
  const std::vector<float> post1 = testing::uniform(T * kHc, rng, 0.0f, 2.0f);
  const std::vector<float> comb1 = testing::uniform(T * kHc * kHc, rng, 0.0f, 0.5f);
  const std::vector<float> fn = testing::randn(size_t(kMix) * kHc * D, rng, 0.02f);
  const std::vector<float> base = testing::randn(kMix, rng, 0.5f), scale{0.7f, 0.9f, 1.1f};
  std::vector<float> g = testing::randn(D, rng, 0.1f);
  for (float& v : g) v += 1.0f;
  const std::vector<float> bias = testing::randn(E, rng, 0.05f);
  std::vector<int32_t> tokens(T), table(size_t(10 * c.k));
  std::uniform_int_distribution<int> tok(0, 9), ex(0, c.E - 1);
  for (int32_t& v : tokens) v = tok(rng);
  for (int32_t& v : table) v = ex(rng);

  auto up = [](const auto& v) { return upload_vector(v, "test"); };
  auto alloc = [](size_t n) { return DeviceBuffer::allocate(n * 4, "test"); };
  auto d_a = up(a), d_fn = up(fn), d_base = up(base), d_scale = up(scale), d_g = up(g), d_bias = up(bias);
  auto d_tok = up(tokens), d_tab = up(table), d_hp = up(h1), d_pp = up(post1), d_cp = up(comb1);
  ASSERT_TRUE(d_a.is_ok() && d_fn.is_ok() && d_base.is_ok() && d_scale.is_ok() && d_g.is_ok() && d_bias.is_ok() &&
              d_tok.is_ok() && d_tab.is_ok() && d_hp.is_ok() && d_pp.is_ok() && d_cp.is_ok());
  const size_t n_part = T * size_t(hc_fused_blocks(c.D)) * ((2 + kHc) * kHc + 1 + kHc * (kHc + 1) / 2);

  struct Out {
    std::vector<float> x, h, pre, post, comb, logits, w;
    std::vector<int32_t> ids;
    std::vector<uint32_t> tickets;
  };
  // One path from fresh copies of the site's in-place inputs. merged 0: hc_fused
  // then router_gate_topk; 1: site_router; 2: site_router_split on two streams;
  // 3: site_router_streams on h (before the site overwrites it), then the split
  // launch with only a's column left to its gate blocks.
  auto run = [&](int merged, int launches) -> Result<Out> {
    AFF_ASSIGN_OR_RETURN(DeviceBuffer h, upload_vector(h1, "test"));
    AFF_ASSIGN_OR_RETURN(DeviceBuffer post, upload_vector(post1, "test"));
    AFF_ASSIGN_OR_RETURN(DeviceBuffer comb, upload_vector(comb1, "test"));
    AFF_ASSIGN_OR_RETURN(DeviceBuffer pre, alloc(T * kHc));
    AFF_ASSIGN_OR_RETURN(DeviceBuffer x, alloc(T * D));
    AFF_ASSIGN_OR_RETURN(DeviceBuffer x_inv, alloc(T));
    AFF_ASSIGN_OR_RETURN(DeviceBuffer partials, alloc(n_part));
    AFF_ASSIGN_OR_RETURN(DeviceBuffer tickets, upload_vector(std::vector<uint32_t>(2 * T + 2, 0u), "test"));
    AFF_ASSIGN_OR_RETURN(DeviceBuffer logits, alloc(T * E));
    AFF_ASSIGN_OR_RETURN(DeviceBuffer ids, alloc(Tk));
    AFF_ASSIGN_OR_RETURN(DeviceBuffer w, alloc(Tk));
    AFF_ASSIGN_OR_RETURN(DeviceBuffer parts, alloc(T * kSiteRouterCols * E));
    HcFusedArgs f;
    f.h = h.as<float>(), f.a = d_a->as<float>();
    f.fn = d_fn->as<uint8_t>(), f.fn_dtype = 0;
    f.base = d_base->as<float>(), f.scale = d_scale->as<float>();
    f.T = c.T, f.hc = kHc, f.D = c.D;
    f.post = post.as<float>(), f.comb = comb.as<float>(), f.pre = pre.as<float>();
    f.x_norm = d_g->as<float>(), f.x = x.as<float>();
    f.partials = partials.as<float>(), f.tickets = tickets.as<unsigned>();
    RouterArgs r;
    r.bias = c.hash ? nullptr : d_bias->as<float>();
    r.tid2eid = c.hash ? d_tab->as<int32_t>() : nullptr, r.tokens = d_tok->as<int32_t>();
    r.T = c.T, r.E = c.E, r.k = c.k, r.func = ScoreFunc::kSqrtSoftplus, r.scaling = 1.5f;
    r.logits = logits.as<float>(), r.ids = ids.as<int32_t>(), r.weights = w.as<float>();
    unsigned* router_ticket = tickets.as<unsigned>() + 2 * T;
    for (int i = 0; i < launches; ++i) {
      if (i > 0) {  // the site updates h, post and comb in place: start the second launch from the inputs again
        for (auto [dst, src] : {std::pair{&h, &h1}, std::pair{&post, &post1}, std::pair{&comb, &comb1}})
          AFF_RETURN_IF_ERROR(cuda_status(
              cudaMemcpy(dst->data(), src->data(), src->size() * 4, cudaMemcpyHostToDevice), "test"));
        AFF_RETURN_IF_ERROR(cuda_status(cudaMemset(ids.data(), 0xff, Tk * 4), "test"));
      }
      if (merged) {
        // As the forward pass runs it: the site's Sinkhorn left to the launch's finishing block.
        f.x_inv = x_inv.as<float>(), f.defer_comb = true;
        SiteRouterArgs s;
        s.comb_job = HcCombJob{f.comb, c.T, kHc, f.sinkhorn_iters, f.hc_eps};
        s.site = f, s.router = r;
        s.gate = gate.w.weight, s.gate_bf16 = gate.w.format == DevFormat::kBF16;
        s.h_prev = d_hp->as<float>(), s.post_prev = d_pp->as<float>(), s.comb_prev = d_cp->as<float>();
        s.parts = parts.as<float>(), s.ticket = router_ticket;
        if (!site_router_supported(f, r, gate.w)) return internal_error("site_router_supported refused the case");
        if (merged == 3) {
          SiteRouterArgs early = s;
          early.h_prev = h.as<float>();
          AFF_RETURN_IF_ERROR(site_router_streams(early, nullptr));
          AFF_RETURN_IF_ERROR(cuda_status(cudaDeviceSynchronize(), "test"));
          s.h_prev = nullptr;  // the gate blocks must not need the streams any more
        }
        if (merged >= 2) {
          AFF_ASSIGN_OR_RETURN(Stream s1, Stream::create());
          AFF_ASSIGN_OR_RETURN(Stream s2, Stream::create());
          AFF_RETURN_IF_ERROR(site_router_split(s, s1.get(), s2.get(), /*streams_done=*/merged == 3));
          AFF_RETURN_IF_ERROR(cuda_status(cudaDeviceSynchronize(), "test"));
        } else {
          AFF_RETURN_IF_ERROR(site_router(s, nullptr));
        }
      } else {
        AFF_RETURN_IF_ERROR(hc_fused(f, nullptr));
        AFF_RETURN_IF_ERROR(router_gate_topk(r, gate.w, x.as<float>(), router_ticket, nullptr));
      }
      AFF_RETURN_IF_ERROR(cuda_status(cudaDeviceSynchronize(), "test"));
    }
    Out o;
    AFF_ASSIGN_OR_RETURN(o.x, download_vector(x.as<float>(), T * D, "test"));
    AFF_ASSIGN_OR_RETURN(o.h, download_vector(h.as<float>(), T * kHc * D, "test"));
    AFF_ASSIGN_OR_RETURN(o.pre, download_vector(pre.as<float>(), T * kHc, "test"));
    AFF_ASSIGN_OR_RETURN(o.post, download_vector(post.as<float>(), T * kHc, "test"));
    AFF_ASSIGN_OR_RETURN(o.comb, download_vector(comb.as<float>(), T * kHc * kHc, "test"));
    AFF_ASSIGN_OR_RETURN(o.logits, download_vector(logits.as<float>(), T * E, "test"));
    AFF_ASSIGN_OR_RETURN(o.w, download_vector(w.as<float>(), Tk, "test"));
    AFF_ASSIGN_OR_RETURN(o.ids, download_vector(ids.as<int32_t>(), Tk, "test"));
    AFF_ASSIGN_OR_RETURN(o.tickets, download_vector(tickets.as<uint32_t>(), 2 * T + 2, "test"));
    return o;
  };
  auto want = run(0, 1);
  ASSERT_TRUE(want.is_ok()) << want.status().message();
  for (int merged : {1, 2, 3}) {
    SCOPED_TRACE(merged == 1   ? "one launch"
                 : merged == 2 ? "two launches on two streams"
                               : "the stream columns first, then two launches");
    auto got = run(merged, 2);
    ASSERT_TRUE(got.is_ok()) << got.status().message();
    EXPECT_EQ(got->x, want->x) << "the site's x";
    EXPECT_EQ(got->h, want->h) << "the site's streams";
    EXPECT_EQ(got->pre, want->pre);
    EXPECT_EQ(got->post, want->post);
    EXPECT_EQ(got->comb, want->comb);
    for (uint32_t v : got->tickets) EXPECT_EQ(v, 0u) << "tickets must be left at zero";
    EXPECT_EQ(got->ids, want->ids);
    for (size_t i = 0; i < Tk; ++i) EXPECT_NEAR(got->w[i], want->w[i], 1e-5f * std::fabs(want->w[i]) + 1e-7f);
    EXPECT_LE(rel_rms(got->logits, want->logits), 1e-5) << "logits";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, SiteRouter,
    ::testing::Values(SiteRouterCase{DevFormat::kBF16, 256, 6, 4096, 1, false},
                      SiteRouterCase{DevFormat::kBF16, 256, 6, 4096, 2, false},
                      SiteRouterCase{DevFormat::kBF16, 256, 6, 4096, 1, true},
                      SiteRouterCase{DevFormat::kF32, 72, 5, 768, 2, false},
                      SiteRouterCase{DevFormat::kBF16, 19, 3, 1280, 1, false}),
    [](const ::testing::TestParamInfo<SiteRouterCase>& i) {
      return std::string(testing::name_of(i.param.format)) + "_E" + std::to_string(i.param.E) + "_T" +
             std::to_string(i.param.T) + (i.param.hash ? "_hash" : "");
    });

}  // namespace
}  // namespace aff::cuda
