#include "model/dsv4/compressor.h"

#include <cmath>
#include <limits>

#include "backend/ref/linear.h"
#include "backend/ref/norm.h"
#include "backend/ref/rope.h"
#include "backend/ref/vec.h"
#include "core/check.h"

namespace aff::dsv4 {

void CompressorState::reset() {
  std::fill(cur_kv.begin(), cur_kv.end(), 0.0f);
  std::fill(cur_gate.begin(), cur_gate.end(), 0.0f);
  n_pending = 0;
  std::fill(prev_kv.begin(), prev_kv.end(), 0.0f);
  std::fill(prev_gate.begin(), prev_gate.end(), 0.0f);
  has_prev = false;
  entries.clear();
  n_entries = 0;
}

namespace {

// Pools the completed block in st into one entry appended to st.entries.
void emit_entry(const CompressorWeights& w, const ModelConfig& cfg,
                const std::vector<float>& inv_freq, const std::vector<float>& norm,
                CompressorState& st) {
  const int r = w.ratio, d = w.dim;
  const int width = w.overlap ? 2 * d : d;
  const int b_off = w.overlap ? d : 0;  // this block's own half
  const size_t base = st.entries.size();
  st.entries.resize(base + size_t(d));
  float* e = st.entries.data() + base;
  const int n_slots = (w.overlap && st.has_prev) ? 2 * r : r;
  std::vector<float> g(static_cast<size_t>(n_slots)), v(static_cast<size_t>(n_slots));
  for (int ch = 0; ch < d; ++ch) {
    int n = 0;
    if (w.overlap && st.has_prev) {
      for (int s = 0; s < r; ++s, ++n) {
        g[size_t(n)] = st.prev_gate[size_t(s * d + ch)];
        v[size_t(n)] = st.prev_kv[size_t(s * d + ch)];
      }
    }
    for (int s = 0; s < r; ++s, ++n) {
      g[size_t(n)] = st.cur_gate[size_t(s * width + b_off + ch)];
      v[size_t(n)] = st.cur_kv[size_t(s * width + b_off + ch)];
    }
    float m = -std::numeric_limits<float>::infinity();
    for (int i = 0; i < n_slots; ++i) m = std::max(m, g[size_t(i)]);
    float denom = 0.0f, acc = 0.0f;
    for (int i = 0; i < n_slots; ++i) {
      const float p = std::exp(g[size_t(i)] - m);
      denom += p;
      acc += p * v[size_t(i)];
    }
    e[ch] = acc / denom;
  }
  ref::rmsnorm(e, 1, d, norm.data(), float(cfg.rms_norm_eps));
  const int rope_dim = int(inv_freq.size()) * 2;
  ref::rope_apply(e + d - rope_dim, inv_freq, st.n_entries * r, /*inverse=*/false);
  ++st.n_entries;

  if (w.overlap) {  // this block's A halves feed the next entry
    for (int s = 0; s < r; ++s)
      for (int ch = 0; ch < d; ++ch) {
        st.prev_kv[size_t(s * d + ch)] = st.cur_kv[size_t(s * width + ch)];
        st.prev_gate[size_t(s * d + ch)] = st.cur_gate[size_t(s * width + ch)];
      }
    st.has_prev = true;
  }
  st.n_pending = 0;
}

}  // namespace

void compressor_run(const CompressorWeights& w, const ModelConfig& cfg,
                    const std::vector<float>& inv_freq, const float* x, int64_t T, int64_t pos0,
                    CompressorState& st) {
  const int r = w.ratio, d = w.dim;
  const int width = w.overlap ? 2 * d : d;
  AFF_CHECK(w.present && r > 0);
  AFF_CHECK_EQ(w.wkv.out, width);
  AFF_CHECK_EQ(int64_t(st.n_pending), (pos0 % r));
  st.cur_kv.resize(size_t(r * width));
  st.cur_gate.resize(size_t(r * width));
  if (w.overlap) {
    st.prev_kv.resize(size_t(r * d));
    st.prev_gate.resize(size_t(r * d));
  }
  if (T == 0) return;

  std::vector<float> kv(size_t(T * width)), gate(size_t(T * width));
  ref::linear(w.wkv, x, T, kv.data());
  ref::linear(w.wgate, x, T, gate.data());
  const std::vector<float> norm = ref::tensor_to_f32(w.norm);

  for (int64_t t = 0; t < T; ++t) {
    const int slot = int((pos0 + t) % r);
    AFF_CHECK_EQ(slot, st.n_pending);
    for (int c = 0; c < width; ++c) {
      st.cur_kv[size_t(slot * width + c)] = kv[size_t(t * width + c)];
      st.cur_gate[size_t(slot * width + c)] =
          gate[size_t(t * width + c)] + ref::tensor_f32_at(w.ape, int64_t(slot) * width + c);
    }
    ++st.n_pending;
    if (st.n_pending == r) emit_entry(w, cfg, inv_freq, norm, st);
  }
}

}  // namespace aff::dsv4
