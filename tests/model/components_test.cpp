// Model components against straightforward double-precision restatements of
// v4-model-math.md: Sinkhorn, the streaming compressor (fed in random chunks)
// vs a one-pass pooling, and the MoE router.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "backend/ref/linear.h"
#include "backend/ref/rope.h"
#include "backend/ref/vec.h"
#include "model/dsv4/compressor.h"
#include "model/dsv4/forward.h"
#include "model/dsv4/mhc.h"
#include "model/dsv4/moe.h"
#include "model/dsv4/state.h"
#include "random_model.h"

namespace aff::dsv4 {
namespace {

TEST(Sinkhorn, DoublyStochasticAndMatchesDouble) {
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (int n : {2, 4, 5}) {
    std::vector<float> c(size_t(n * n));
    for (float& v : c) v = nd(rng);
    std::vector<double> d(c.begin(), c.end());
    hc_sinkhorn(c.data(), n, 20, 1e-6f);
    // The same sequence in double: row softmax + eps, column, then 19 x (row, column).
    const double eps = 1e-6;
    for (int j = 0; j < n; ++j) {
      double m = -1e300, s = 0.0;
      for (int k = 0; k < n; ++k) m = std::max(m, d[size_t(j * n + k)]);
      for (int k = 0; k < n; ++k) s += std::exp(d[size_t(j * n + k)] - m);
      for (int k = 0; k < n; ++k) d[size_t(j * n + k)] = std::exp(d[size_t(j * n + k)] - m) / s + eps;
    }
    auto cols = [&] {
      for (int k = 0; k < n; ++k) {
        double s = 0.0;
        for (int j = 0; j < n; ++j) s += d[size_t(j * n + k)];
        for (int j = 0; j < n; ++j) d[size_t(j * n + k)] /= s + eps;
      }
    };
    auto rows = [&] {
      for (int j = 0; j < n; ++j) {
        double s = 0.0;
        for (int k = 0; k < n; ++k) s += d[size_t(j * n + k)];
        for (int k = 0; k < n; ++k) d[size_t(j * n + k)] /= s + eps;
      }
    };
    cols();
    for (int i = 0; i < 19; ++i) rows(), cols();
    for (int i = 0; i < n * n; ++i) EXPECT_NEAR(c[size_t(i)], d[size_t(i)], 1e-5);
    // Columns are normalised last, so they sum to 1 after any number of
    // iterations; rows only in the limit (20 iterations leave up to ~1e-2).
    for (int k = 0; k < n; ++k) {
      double cs = 0.0;
      for (int j = 0; j < n; ++j) cs += c[size_t(j * n + k)];
      EXPECT_NEAR(cs, 1.0, 1e-5);
    }
    for (float v : c) EXPECT_GT(v, 0.0f);
  }
}

TEST(Sinkhorn, ConvergesToDoublyStochastic) {
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (int n : {3, 4}) {
    std::vector<float> c(static_cast<size_t>(n * n));
    for (float& v : c) v = nd(rng);
    hc_sinkhorn(c.data(), n, 1000, 1e-6f);
    for (int j = 0; j < n; ++j) {
      double rs = 0.0, cs = 0.0;
      for (int k = 0; k < n; ++k) rs += c[size_t(j * n + k)], cs += c[size_t(k * n + j)];
      EXPECT_NEAR(rs, 1.0, 1e-4) << "row " << j;
      EXPECT_NEAR(cs, 1.0, 1e-5) << "column " << j;
    }
  }
}

// One-pass pooling of the first n_entries blocks, in double.
std::vector<double> pool_reference(const CompressorWeights& w, const ModelConfig& cfg,
                                   const std::vector<float>& inv_freq, const std::vector<float>& x,
                                   int64_t T) {
  const int r = w.ratio, d = w.dim, width = w.overlap ? 2 * d : d;
  const int64_t D = cfg.hidden_size;
  std::vector<double> kv(size_t(T * width)), g(size_t(T * width));
  std::vector<float> row(static_cast<size_t>(D));
  for (int c = 0; c < width; ++c) {
    std::vector<float> wr(static_cast<size_t>(D)), gr(static_cast<size_t>(D));
    ref::linear_dequant_row(w.wkv, c, wr.data());
    ref::linear_dequant_row(w.wgate, c, gr.data());
    for (int64_t t = 0; t < T; ++t) {
      double a = 0.0, b = 0.0;
      for (int64_t i = 0; i < D; ++i) {
        a += double(wr[size_t(i)]) * x[size_t(t * D + i)];
        b += double(gr[size_t(i)]) * x[size_t(t * D + i)];
      }
      kv[size_t(t * width + c)] = a;
      g[size_t(t * width + c)] = b + ref::tensor_f32_at(w.ape, (t % r) * width + c);
    }
  }
  const int64_t n = T / r;
  std::vector<double> out(size_t(n * d));
  for (int64_t j = 0; j < n; ++j) {
    for (int ch = 0; ch < d; ++ch) {
      std::vector<std::pair<double, double>> slots;  // (gate, kv)
      if (w.overlap && j > 0)
        for (int64_t t = (j - 1) * r; t < j * r; ++t)
          slots.push_back({g[size_t(t * width + ch)], kv[size_t(t * width + ch)]});
      const int off = w.overlap ? d : 0;
      for (int64_t t = j * r; t < (j + 1) * r; ++t)
        slots.push_back({g[size_t(t * width + off + ch)], kv[size_t(t * width + off + ch)]});
      double m = -1e300, s = 0.0, acc = 0.0;
      for (auto& sl : slots) m = std::max(m, sl.first);
      for (auto& sl : slots) s += std::exp(sl.first - m), acc += std::exp(sl.first - m) * sl.second;
      out[size_t(j * d + ch)] = acc / s;
    }
    double ss = 0.0;
    for (int ch = 0; ch < d; ++ch) ss += out[size_t(j * d + ch)] * out[size_t(j * d + ch)];
    const double inv = 1.0 / std::sqrt(ss / d + cfg.rms_norm_eps);
    for (int ch = 0; ch < d; ++ch) out[size_t(j * d + ch)] *= inv * ref::tensor_f32_at(w.norm, ch);
    const int rd = int(inv_freq.size()) * 2;
    for (size_t i = 0; i < inv_freq.size(); ++i) {
      const double a = double(float(j * r) * inv_freq[i]);
      double* p = out.data() + j * d + d - rd + 2 * i;
      const double x0 = p[0], x1 = p[1];
      p[0] = x0 * std::cos(a) - x1 * std::sin(a);
      p[1] = x1 * std::cos(a) + x0 * std::sin(a);
    }
  }
  return out;
}

TEST(Compressor, StreamingInRandomChunksMatchesOnePassPooling) {
  std::mt19937_64 rng(std::random_device{}());
  const ModelConfig cfg = testing::tiny_config({4, 16}, 0);
  auto model = testing::random_model(cfg, rng());
  ASSERT_NE(model, nullptr);
  auto st = make_state(*model, 1);
  const int64_t T = 71, D = cfg.hidden_size;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(T * D));
  for (float& v : x) v = nd(rng);
  const CompressorWeights* cws[] = {&model->weights.layers[0].attn.compressor,
                                    &model->weights.layers[0].attn.indexer.compressor,
                                    &model->weights.layers[1].attn.compressor};
  for (const CompressorWeights* w : cws) {
    CompressorState cs;
    std::uniform_int_distribution<int64_t> len(1, 9);
    for (int64_t t = 0; t < T;) {
      const int64_t n = std::min(T - t, len(rng));
      compressor_run(*w, cfg, st->rope_compress, x.data() + t * D, n, t, cs);
      t += n;
    }
    ASSERT_EQ(cs.n_entries, T / w->ratio);
    EXPECT_EQ(cs.n_pending, int(T % w->ratio));
    const std::vector<double> want = pool_reference(*w, cfg, st->rope_compress, x, T);
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(cs.entries[i], want[i], 2e-4 * (1.0 + std::fabs(want[i])))
          << "ratio " << w->ratio << " dim " << w->dim << " element " << i;
  }
}

TEST(Router, SelectionUsesBiasWeightsDoNot) {
  std::mt19937_64 rng(std::random_device{}());
  const ModelConfig cfg = testing::tiny_config({0, 0}, 1);
  auto model = testing::random_model(cfg, rng());
  ASSERT_NE(model, nullptr);
  const int64_t T = 31, D = cfg.hidden_size;
  const int E = cfg.n_routed_experts, k = cfg.n_experts_per_tok;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(T * D));
  for (float& v : x) v = nd(rng);
  std::vector<int32_t> tokens(static_cast<size_t>(T));
  for (auto& t : tokens) t = int32_t(rng() % uint64_t(cfg.vocab_size));

  for (int layer : {0, 1}) {
    const MoeWeights& w = model->weights.layers[size_t(layer)].ffn;
    const bool hash = cfg.is_hash_layer(layer);
    Routing r;
    ASSERT_TRUE(moe_route(cfg, w, hash, tokens.data(), x.data(), T, r).is_ok());
    std::vector<float> logits(size_t(T * E));
    ref::linear(w.gate, x.data(), T, logits.data());
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> s(static_cast<size_t>(E));
      for (int e = 0; e < E; ++e) s[size_t(e)] = std::sqrt(std::log1p(std::exp(double(logits[size_t(t * E + e)]))));
      std::vector<int> want(static_cast<size_t>(k));
      if (hash) {
        for (int i = 0; i < k; ++i) want[size_t(i)] = int(ref::tensor_i64_at(w.tid2eid, tokens[size_t(t)] * k + i));
      } else {
        std::vector<int> order(static_cast<size_t>(E));
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(), [&](int a, int b) {
          return s[size_t(a)] + ref::tensor_f32_at(w.gate_bias, a) > s[size_t(b)] + ref::tensor_f32_at(w.gate_bias, b);
        });
        want.assign(order.begin(), order.begin() + k);
      }
      std::vector<int> got(r.experts.begin() + t * k, r.experts.begin() + (t + 1) * k);
      std::vector<int> gs = got, ws = want;
      std::sort(gs.begin(), gs.end());
      std::sort(ws.begin(), ws.end());
      ASSERT_EQ(gs, ws) << "layer " << layer << " token " << t;
      double sum = 0.0;
      for (int i = 0; i < k; ++i) sum += s[size_t(got[size_t(i)])];
      for (int i = 0; i < k; ++i)
        EXPECT_NEAR(r.weights[size_t(t * k + i)], s[size_t(got[size_t(i)])] / sum * cfg.routed_scaling_factor, 1e-5);
    }
  }
}

TEST(Moe, OutputIsWeightedExpertsPlusShared) {
  std::mt19937_64 rng(std::random_device{}());
  const ModelConfig cfg = testing::tiny_config({0, 0}, 1);
  auto model = testing::random_model(cfg, rng());
  ASSERT_NE(model, nullptr);
  const int64_t T = 9, D = cfg.hidden_size;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(T * D));
  for (float& v : x) v = nd(rng);
  std::vector<int32_t> tokens(static_cast<size_t>(T));
  for (auto& t : tokens) t = int32_t(rng() % uint64_t(cfg.vocab_size));
  const MoeWeights& w = model->weights.layers[1].ffn;
  std::vector<float> out(size_t(T * D));
  ASSERT_TRUE(moe_forward(cfg, w, false, tokens.data(), x.data(), T, false, out.data()).is_ok());
  Routing r;
  ASSERT_TRUE(moe_route(cfg, w, false, tokens.data(), x.data(), T, r).is_ok());
  // Naive SwiGLU expert in double from dequantised rows.
  auto expert = [&](const ExpertWeights& e, const float* xt, std::vector<double>& y) {
    const int64_t I = e.w1.out;
    std::vector<float> row(size_t(std::max(D, I)));
    std::vector<double> h(static_cast<size_t>(I));
    for (int64_t i = 0; i < I; ++i) {
      double a = 0.0, b = 0.0;
      ref::linear_dequant_row(e.w1, i, row.data());
      for (int64_t c = 0; c < D; ++c) a += double(row[size_t(c)]) * xt[c];
      ref::linear_dequant_row(e.w3, i, row.data());
      for (int64_t c = 0; c < D; ++c) b += double(row[size_t(c)]) * xt[c];
      a = std::min(a, cfg.swiglu_limit);
      b = std::clamp(b, -cfg.swiglu_limit, cfg.swiglu_limit);
      h[size_t(i)] = a / (1.0 + std::exp(-a)) * b;
    }
    y.assign(size_t(D), 0.0);
    for (int64_t o = 0; o < D; ++o) {
      ref::linear_dequant_row(e.w2, o, row.data());
      for (int64_t i = 0; i < I; ++i) y[size_t(o)] += double(row[size_t(i)]) * h[size_t(i)];
    }
  };
  std::vector<double> y;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> want(size_t(D), 0.0);
    expert(w.shared, x.data() + t * D, y);
    for (int64_t o = 0; o < D; ++o) want[size_t(o)] += y[size_t(o)];
    for (int i = 0; i < r.k; ++i) {
      expert(w.experts[size_t(r.experts[size_t(t * r.k + i)])], x.data() + t * D, y);
      for (int64_t o = 0; o < D; ++o) want[size_t(o)] += r.weights[size_t(t * r.k + i)] * y[size_t(o)];
    }
    for (int64_t o = 0; o < D; ++o)
      ASSERT_NEAR(out[size_t(t * D + o)], want[size_t(o)], 1e-4 * (1.0 + std::fabs(want[size_t(o)])));
  }
}

}  // namespace
}  // namespace aff::dsv4
