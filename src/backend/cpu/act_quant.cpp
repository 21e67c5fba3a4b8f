#include "backend/cpu/act_quant.h"

#include <cmath>
#include <cstring>

#include "core/check.h"

namespace aff::cpu {
namespace {

// Quantises one block of n values; returns d.
float quantize_block(const float* x, int n, int8_t* q) {
  float amax = 0.0f;
  for (int j = 0; j < n; ++j) amax = std::fmax(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < n; ++j) q[j] = int8_t(std::nearbyint(x[j] * id));
  return d;
}

}  // namespace

void quantize_act(ActFormat f, std::span<const float> x, void* out) {
  const int64_t be = act_block_elems(f);
  AFF_CHECK(int64_t(x.size()) % be == 0);
  const int64_t nb = int64_t(x.size()) / be;
  if (f == ActFormat::kQ8_0) {
    auto* y = static_cast<ActQ8_0*>(out);
    for (int64_t b = 0; b < nb; ++b) y[b].d = quantize_block(x.data() + b * 32, 32, y[b].qs);
    return;
  }
  auto* y = static_cast<ActQ8K*>(out);
  for (int64_t b = 0; b < nb; ++b) {
    y[b].d = quantize_block(x.data() + b * 256, 256, y[b].qs);
    for (int i = 0; i < 16; ++i) {
      int s = 0;
      for (int j = 0; j < 16; ++j) s += y[b].qs[16 * i + j];
      y[b].bsums[i] = int16_t(s);
    }
    if (f == ActFormat::kQ8KT) {
      int8_t nat[256];
      std::memcpy(nat, y[b].qs, sizeof(nat));
      for (int i = 0; i < 256; ++i) y[b].qs[act_q8kt_pos(i)] = nat[i];
    }
  }
}

void dequantize_act(ActFormat f, const void* act, std::span<float> out) {
  const int64_t be = act_block_elems(f);
  AFF_CHECK(int64_t(out.size()) % be == 0);
  const int64_t nb = int64_t(out.size()) / be;
  for (int64_t b = 0; b < nb; ++b) {
    const float d = f == ActFormat::kQ8_0 ? static_cast<const ActQ8_0*>(act)[b].d
                                          : static_cast<const ActQ8K*>(act)[b].d;
    const int8_t* q = f == ActFormat::kQ8_0 ? static_cast<const ActQ8_0*>(act)[b].qs
                                            : static_cast<const ActQ8K*>(act)[b].qs;
    for (int64_t j = 0; j < be; ++j) {
      const int64_t pos = f == ActFormat::kQ8KT ? act_q8kt_pos(int(j)) : j;
      out[size_t(b * be + j)] = d * float(q[pos]);
    }
  }
}

}  // namespace aff::cpu
