#include "model/dsv4/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/ref/linear.h"
#include "backend/ref/norm.h"
#include "backend/ref/rope.h"
#include "backend/ref/vec.h"
#include "core/check.h"
#include "model/dsv4/compressor.h"
#include "model/dsv4/indexer.h"

namespace aff::dsv4 {

void attention_forward(const ModelConfig& cfg, const AttentionWeights& w, int layer,
                       const State& state, LayerState& st, const float* x, int64_t T,
                       int64_t pos0, float* out) {
  const int H = cfg.num_heads, Dh = cfg.head_dim, rope_dim = cfg.rope_dim;
  const int64_t W = cfg.sliding_window;
  const float eps = float(cfg.rms_norm_eps);
  const bool compressed = cfg.compress_ratio(layer) != 0;
  const std::vector<float>& inv_freq = compressed ? state.rope_compress : state.rope_main;
  AFF_CHECK_EQ(int(inv_freq.size()) * 2, rope_dim);

  // Query path: q = per-head-rmsnorm(wq_b(q_norm(wq_a x))), RoPE on the tail.
  std::vector<float> qr(size_t(T * cfg.q_lora_rank));
  ref::linear(w.wq_a, x, T, qr.data());
  const std::vector<float> q_norm = ref::tensor_to_f32(w.q_norm);
  ref::rmsnorm(qr.data(), T, cfg.q_lora_rank, q_norm.data(), eps);
  std::vector<float> q(size_t(T * H * Dh));
  ref::linear(w.wq_b, qr.data(), T, q.data());
  ref::rmsnorm(q.data(), T * H, Dh, nullptr, eps);

  // The chunk's KV latents: kv_norm(wkv x), RoPE on the tail.
  std::vector<float> kv(size_t(T * Dh));
  ref::linear(w.wkv, x, T, kv.data());
  const std::vector<float> kv_norm = ref::tensor_to_f32(w.kv_norm);
  ref::rmsnorm(kv.data(), T, Dh, kv_norm.data(), eps);
  for (int64_t t = 0; t < T; ++t) {
    for (int h = 0; h < H; ++h)
      ref::rope_apply(q.data() + (t * H + h) * Dh + Dh - rope_dim, inv_freq, pos0 + t, false);
    ref::rope_apply(kv.data() + t * Dh + Dh - rope_dim, inv_freq, pos0 + t, false);
  }

  // Compressed entries (appended for blocks this chunk completes) and, for
  // CSA, the indexer's choice among them.
  std::vector<std::vector<int32_t>> selected;
  int ratio = 0;
  if (compressed) {
    AFF_CHECK(w.compressor.present);
    ratio = w.compressor.ratio;
    compressor_run(w.compressor, cfg, inv_freq, x, T, pos0, st.kv_comp);
    if (w.indexer.present)
      indexer_select(w.indexer, cfg, inv_freq, x, qr.data(), T, pos0, st.index_comp, selected);
  }

  // Window keys: the ring's past positions [ctx0, pos0) followed by the chunk.
  const int64_t ctx0 = std::max<int64_t>(0, pos0 - (W - 1));
  const int64_t n_ctx = pos0 - ctx0 + T;
  std::vector<float> ctx(size_t(n_ctx * Dh));
  for (int64_t p = ctx0; p < pos0; ++p)
    std::copy_n(st.window.data() + (p % W) * Dh, Dh, ctx.data() + (p - ctx0) * Dh);
  std::copy(kv.begin(), kv.end(), ctx.begin() + (pos0 - ctx0) * Dh);

  const float scale = 1.0f / std::sqrt(float(Dh));
  std::vector<float> sinks(static_cast<size_t>(H));
  for (int h = 0; h < H; ++h) sinks[size_t(h)] = ref::tensor_f32_at(w.attn_sink, h);
  std::vector<float> o(size_t(T * H * Dh));
  const int64_t n_keys_max = std::min<int64_t>(W, pos0 + T) + st.kv_comp.n_entries;
#pragma omp parallel if (T * H * n_keys_max * Dh * 2 >= ref::kParallelMinWork)
  {
    std::vector<const float*> keys;
    std::vector<float> s;
#pragma omp for schedule(dynamic, 2)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t pos = pos0 + t;
      keys.clear();
      for (int64_t p = std::max(ctx0, pos - W + 1); p <= pos; ++p)
        keys.push_back(ctx.data() + (p - ctx0) * Dh);
      if (compressed) {
        if (w.indexer.present) {
          for (int32_t j : selected[size_t(t)]) keys.push_back(st.kv_comp.entries.data() + j * Dh);
        } else {
          const int64_t n_vis = std::min(st.kv_comp.n_entries, compressor_visible(ratio, pos));
          for (int64_t j = 0; j < n_vis; ++j) keys.push_back(st.kv_comp.entries.data() + j * Dh);
        }
      }
      const int64_t n_keys = int64_t(keys.size());
      s.resize(size_t(n_keys));
      for (int h = 0; h < H; ++h) {
        const float* qh = q.data() + (t * H + h) * Dh;
        float m = sinks[size_t(h)];
        for (int64_t i = 0; i < n_keys; ++i) {
          s[size_t(i)] = ref::dot(qh, keys[size_t(i)], Dh) * scale;
          m = std::max(m, s[size_t(i)]);
        }
        float denom = std::exp(sinks[size_t(h)] - m);
        float* oh = o.data() + (t * H + h) * Dh;
        std::fill(oh, oh + Dh, 0.0f);
        for (int64_t i = 0; i < n_keys; ++i) {
          const float p = std::exp(s[size_t(i)] - m);
          denom += p;
          ref::axpy(p, keys[size_t(i)], oh, Dh);
        }
        const float inv = 1.0f / denom;
        for (int d = 0; d < Dh; ++d) oh[d] *= inv;
        // V carried RoPE on its tail: rotate back by the query's angle.
        ref::rope_apply(oh + Dh - rope_dim, inv_freq, pos, /*inverse=*/true);
      }
    }
  }

  // The ring keeps the newest W positions for later chunks.
  for (int64_t t = std::max<int64_t>(0, T - W); t < T; ++t)
    std::copy_n(kv.data() + t * Dh, Dh, st.window.data() + ((pos0 + t) % W) * Dh);

  // Grouped low-rank output: group g's heads through rows [g*r, (g+1)*r) of wo_a.
  const int G = cfg.o_groups;
  const int64_t R = cfg.o_lora_rank;
  const int64_t group_in = int64_t(H / G) * Dh;
  AFF_CHECK_EQ(w.wo_a.in, group_in);
  std::vector<float> u(size_t(T * G * R));
  for (int g = 0; g < G; ++g)
    ref::linear_rows(w.wo_a, g * R, (g + 1) * R, o.data() + g * group_in, int64_t(H) * Dh, T,
                     u.data() + g * R, G * R);
  ref::linear(w.wo_b, u.data(), T, out);
}

}  // namespace aff::dsv4
