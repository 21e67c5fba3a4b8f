#include "model/dsv4/indexer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/ref/linear.h"
#include "backend/ref/rope.h"
#include "backend/ref/vec.h"

namespace aff::dsv4 {

void indexer_select(const IndexerWeights& w, const ModelConfig& cfg,
                    const std::vector<float>& inv_freq, const float* x, const float* qr, int64_t T,
                    int64_t pos0, CompressorState& keys,
                    std::vector<std::vector<int32_t>>& selected) {
  compressor_run(w.compressor, cfg, inv_freq, x, T, pos0, keys);

  const int nh = cfg.index_n_heads, hd = cfg.index_head_dim;
  const int rope_dim = int(inv_freq.size()) * 2;
  const int ratio = w.compressor.ratio;
  std::vector<float> q(size_t(T * nh * hd)), wts(size_t(T * nh));
  ref::linear(w.wq_b, qr, T, q.data());
  ref::linear(w.weights_proj, x, T, wts.data());
  // Both scales of the score folded into the per-head weight.
  const float scale = 1.0f / std::sqrt(float(hd)) / std::sqrt(float(nh));
  for (float& v : wts) v *= scale;

  selected.assign(size_t(T), {});
#pragma omp parallel if (T * keys.n_entries * nh * hd >= ref::kParallelMinWork)
  {
    std::vector<float> score;
    std::vector<int32_t> order;
#pragma omp for schedule(dynamic, 4)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t pos = pos0 + t;
      float* qt = q.data() + t * nh * hd;
      for (int h = 0; h < nh; ++h) ref::rope_apply(qt + h * hd + hd - rope_dim, inv_freq, pos, false);
      const int64_t n_vis = std::min(keys.n_entries, compressor_visible(ratio, pos));
      score.assign(size_t(n_vis), 0.0f);
      for (int64_t j = 0; j < n_vis; ++j) {
        const float* k = keys.entries.data() + j * hd;
        float s = 0.0f;
        for (int h = 0; h < nh; ++h)
          s += std::max(ref::dot(qt + h * hd, k, hd), 0.0f) * wts[size_t(t * nh + h)];
        score[size_t(j)] = s;
      }
      const int64_t k = std::min<int64_t>(cfg.index_topk, n_vis);
      order.resize(size_t(n_vis));
      std::iota(order.begin(), order.end(), 0);
      if (k < n_vis) {
        // Highest score first; ties go to the lower id (deterministic).
        std::nth_element(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
          const float sa = score[size_t(a)], sb = score[size_t(b)];
          return sa > sb || (sa == sb && a < b);
        });
        order.resize(size_t(k));
      }
      selected[size_t(t)] = order;
    }
  }
}

}  // namespace aff::dsv4
