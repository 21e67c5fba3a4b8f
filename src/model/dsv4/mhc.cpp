#include "model/dsv4/mhc.h"

#include <algorithm>
#include <cmath>

#include "backend/ref/activation.h"
#include "backend/ref/linear.h"
#include "backend/ref/norm.h"
#include "backend/ref/vec.h"

namespace aff::dsv4 {
namespace {

// fn as a Linear so the reference GEMM (which parallelises over rows) runs it.
Linear as_linear(const TensorView& t) {
  Linear l;
  l.weight = t;
  l.format = t.dtype == DType::kBF16 ? WeightFormat::kBF16
             : t.dtype == DType::kF16 ? WeightFormat::kF16
                                      : WeightFormat::kF32;
  l.out = t.dim(0);
  l.in = t.dim(1);
  return l;
}

// m = fn . rmsnorm_unweighted(flatten(h)) for every token: m: [T, fn.out].
std::vector<float> hc_mixes(const ModelConfig& cfg, const TensorView& fn, const float* h,
                            int64_t T) {
  const int64_t width = int64_t(cfg.hc_mult) * cfg.hidden_size;
  std::vector<float> z(h, h + T * width);
  ref::rmsnorm(z.data(), T, width, nullptr, float(cfg.rms_norm_eps));
  const Linear l = as_linear(fn);
  std::vector<float> m(size_t(T * l.out));
  ref::linear(l, z.data(), T, m.data());
  return m;
}

// x[t] = sum_j pre[t][j] * h[t][j]; x: [T, D].
void collapse(const float* pre, const float* h, int64_t T, int hc, int64_t D, float* x) {
#pragma omp parallel for schedule(static) if (T * hc * D >= ref::kParallelMinWork)
  for (int64_t t = 0; t < T; ++t) {
    float* xt = x + t * D;
    std::fill(xt, xt + D, 0.0f);
    for (int j = 0; j < hc; ++j) ref::axpy(pre[t * hc + j], h + (t * hc + j) * D, xt, D);
  }
}

}  // namespace

void hc_sinkhorn(float* c, int n, int iters, float eps) {
  for (int j = 0; j < n; ++j) {
    ref::softmax(c + j * n, n);
    for (int k = 0; k < n; ++k) c[j * n + k] += eps;
  }
  auto normalise_columns = [&] {
    for (int k = 0; k < n; ++k) {
      float s = 0.0f;
      for (int j = 0; j < n; ++j) s += c[j * n + k];
      for (int j = 0; j < n; ++j) c[j * n + k] /= s + eps;
    }
  };
  auto normalise_rows = [&] {
    for (int j = 0; j < n; ++j) {
      float s = 0.0f;
      for (int k = 0; k < n; ++k) s += c[j * n + k];
      for (int k = 0; k < n; ++k) c[j * n + k] /= s + eps;
    }
  };
  normalise_columns();
  for (int it = 0; it < iters - 1; ++it) {
    normalise_rows();
    normalise_columns();
  }
}

void hc_pre(const ModelConfig& cfg, const HcWeights& w, const float* h, int64_t T, float* x,
            HcMix& mix) {
  const int hc = cfg.hc_mult;
  const int64_t D = cfg.hidden_size;
  const int64_t n_mix = int64_t(2 + hc) * hc;
  const std::vector<float> m = hc_mixes(cfg, w.fn, h, T);
  const std::vector<float> base = ref::tensor_to_f32(w.base);
  const std::vector<float> scale = ref::tensor_to_f32(w.scale);
  const float eps = float(cfg.hc_eps);

  std::vector<float> pre(size_t(T * hc));
  mix.post.assign(size_t(T * hc), 0.0f);
  mix.comb.assign(size_t(T * hc * hc), 0.0f);
  for (int64_t t = 0; t < T; ++t) {
    const float* mt = m.data() + t * n_mix;
    for (int j = 0; j < hc; ++j) {
      pre[size_t(t * hc + j)] = ref::sigmoid(mt[j] * scale[0] + base[size_t(j)]) + eps;
      mix.post[size_t(t * hc + j)] =
          2.0f * ref::sigmoid(mt[hc + j] * scale[1] + base[size_t(hc + j)]);
    }
    float* c = mix.comb.data() + t * hc * hc;
    for (int i = 0; i < hc * hc; ++i) c[i] = mt[2 * hc + i] * scale[2] + base[size_t(2 * hc + i)];
    hc_sinkhorn(c, hc, cfg.hc_sinkhorn_iters, eps);
  }
  collapse(pre.data(), h, T, hc, D, x);
}

void hc_post(const ModelConfig& cfg, const HcMix& mix, const float* a, int64_t T, float* h) {
  const int hc = cfg.hc_mult;
  const int64_t D = cfg.hidden_size;
#pragma omp parallel if (T * hc * hc * D >= ref::kParallelMinWork)
  {
    std::vector<float> out(size_t(hc * D));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      float* ht = h + t * hc * D;
      const float* c = mix.comb.data() + t * hc * hc;
      for (int k = 0; k < hc; ++k) {
        float* o = out.data() + k * D;
        const float post = mix.post[size_t(t * hc + k)];
        for (int64_t d = 0; d < D; ++d) o[d] = post * a[t * D + d];
        for (int j = 0; j < hc; ++j) ref::axpy(c[j * hc + k], ht + j * D, o, D);
      }
      std::copy(out.begin(), out.end(), ht);
    }
  }
}

void hc_head(const ModelConfig& cfg, const HcWeights& w, const float* h, int64_t T, float* y) {
  const int hc = cfg.hc_mult;
  const std::vector<float> m = hc_mixes(cfg, w.fn, h, T);
  const std::vector<float> base = ref::tensor_to_f32(w.base);
  const float scale = ref::tensor_f32_at(w.scale, 0);
  std::vector<float> pre(size_t(T * hc));
  for (int64_t t = 0; t < T; ++t)
    for (int j = 0; j < hc; ++j)
      pre[size_t(t * hc + j)] =
          ref::sigmoid(m[size_t(t * hc + j)] * scale + base[size_t(j)]) + float(cfg.hc_eps);
  collapse(pre.data(), h, T, hc, cfg.hidden_size, y);
}

}  // namespace aff::dsv4
