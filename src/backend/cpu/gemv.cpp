#include "backend/cpu/gemv.h"

#include <algorithm>

#include <omp.h>

#include "backend/cpu/isa/gemv_isa.h"
#include "core/check.h"

namespace aff::cpu {
namespace {

using quant::GgmlType;

// Preferred ISA first within each weight type. AVX-512 leads everywhere: it is the
// fastest on Zen 4 for IQ2_XXS/MXFP4, within 10% there for Q8_0/Q4_K/Q2_K (512-bit ops
// run as two halves on Zen 4, natively on Intel server cores), and the only ISA with
// fused multi-token gemm kernels (docs/kernels/cpu-gemv.md, "Selector").
// Tokens from which gemm() takes the AMX kernels (where the CPU has them) over the
// fused VNNI ones: where the AMX rows of aff-bench-cpu overtook the VNNI ones on all
// cores (docs/kernels/cpu-gemv.md, "AMX").
constexpr int kAmxMinTokensQ8_0 = 4;
constexpr int kAmxMinTokensQ4K = 12;
constexpr int kAmxMinTokensQ2K = 8;

const std::vector<GemvKernel>& kernel_table() {
  static const std::vector<GemvKernel> table = {
      {"gemv_q8_0_q8_0_avx512", GgmlType::kQ8_0, ActFormat::kQ8_0, Isa::kAvx512, isa::gemv_q8_0_q8_0_avx512,
       isa::gemm_q8_0_q8_0_avx512, isa::gemm_q8_0_q8_0_amx, kAmxMinTokensQ8_0},
      {"gemv_q8_0_q8_0_avx2", GgmlType::kQ8_0, ActFormat::kQ8_0, Isa::kAvx2, isa::gemv_q8_0_q8_0_avx2},
      {"gemv_q8_0_q8_0_scalar", GgmlType::kQ8_0, ActFormat::kQ8_0, Isa::kScalar, isa::gemv_q8_0_q8_0_scalar},
      {"gemv_q4k_q8k_avx512", GgmlType::kQ4_K, ActFormat::kQ8K, Isa::kAvx512, isa::gemv_q4k_q8k_avx512,
       isa::gemm_q4k_q8k_avx512, isa::gemm_q4k_q8k_amx, kAmxMinTokensQ4K},
      {"gemv_q4k_q8k_avx2", GgmlType::kQ4_K, ActFormat::kQ8K, Isa::kAvx2, isa::gemv_q4k_q8k_avx2},
      {"gemv_q4k_q8k_scalar", GgmlType::kQ4_K, ActFormat::kQ8K, Isa::kScalar, isa::gemv_q4k_q8k_scalar},
      {"gemv_q2k_q8k_avx512", GgmlType::kQ2_K, ActFormat::kQ8K, Isa::kAvx512, isa::gemv_q2k_q8k_avx512,
       isa::gemm_q2k_q8k_avx512, isa::gemm_q2k_q8k_amx, kAmxMinTokensQ2K},
      {"gemv_q2k_q8k_avx2", GgmlType::kQ2_K, ActFormat::kQ8K, Isa::kAvx2, isa::gemv_q2k_q8k_avx2},
      {"gemv_q2k_q8k_scalar", GgmlType::kQ2_K, ActFormat::kQ8K, Isa::kScalar, isa::gemv_q2k_q8k_scalar},
      {"gemv_iq2xxs_q8kt_avx512vbmi", GgmlType::kIQ2_XXS, ActFormat::kQ8KT, Isa::kAvx512Vbmi,
       isa::gemv_iq2xxs_q8kt_avx512vbmi, isa::gemm_iq2xxs_q8kt_avx512vbmi},
      {"gemv_iq2xxs_q8k_avx512", GgmlType::kIQ2_XXS, ActFormat::kQ8K, Isa::kAvx512, isa::gemv_iq2xxs_q8k_avx512,
       isa::gemm_iq2xxs_q8k_avx512},
      {"gemv_iq2xxs_q8k_avx2", GgmlType::kIQ2_XXS, ActFormat::kQ8K, Isa::kAvx2, isa::gemv_iq2xxs_q8k_avx2},
      {"gemv_iq2xxs_q8k_scalar", GgmlType::kIQ2_XXS, ActFormat::kQ8K, Isa::kScalar, isa::gemv_iq2xxs_q8k_scalar},
      {"gemv_mxfp4_q8_0_avx512", GgmlType::kMXFP4, ActFormat::kQ8_0, Isa::kAvx512, isa::gemv_mxfp4_q8_0_avx512,
       isa::gemm_mxfp4_q8_0_avx512},
      {"gemv_mxfp4_q8_0_avx2", GgmlType::kMXFP4, ActFormat::kQ8_0, Isa::kAvx2, isa::gemv_mxfp4_q8_0_avx2},
      {"gemv_mxfp4_q8_0_scalar", GgmlType::kMXFP4, ActFormat::kQ8_0, Isa::kScalar, isa::gemv_mxfp4_q8_0_scalar},
      {"gemv_q3k_q8k_avx512", GgmlType::kQ3_K, ActFormat::kQ8K, Isa::kAvx512, isa::gemv_q3k_q8k_avx512,
       isa::gemm_q3k_q8k_avx512},
      {"gemv_q3k_q8k_avx2", GgmlType::kQ3_K, ActFormat::kQ8K, Isa::kAvx2, isa::gemv_q3k_q8k_avx2},
      {"gemv_q3k_q8k_scalar", GgmlType::kQ3_K, ActFormat::kQ8K, Isa::kScalar, isa::gemv_q3k_q8k_scalar},
      {"gemv_iq4xs_q8k_avx512", GgmlType::kIQ4_XS, ActFormat::kQ8K, Isa::kAvx512, isa::gemv_iq4xs_q8k_avx512,
       isa::gemm_iq4xs_q8k_avx512},
      {"gemv_iq4xs_q8k_avx2", GgmlType::kIQ4_XS, ActFormat::kQ8K, Isa::kAvx2, isa::gemv_iq4xs_q8k_avx2},
      {"gemv_iq4xs_q8k_scalar", GgmlType::kIQ4_XS, ActFormat::kQ8K, Isa::kScalar, isa::gemv_iq4xs_q8k_scalar},
      {"gemv_iq2xs_q8kt_avx512vbmi", GgmlType::kIQ2_XS, ActFormat::kQ8KT, Isa::kAvx512Vbmi,
       isa::gemv_iq2xs_q8kt_avx512vbmi, isa::gemm_iq2xs_q8kt_avx512vbmi},
      {"gemv_iq2xs_q8k_avx512", GgmlType::kIQ2_XS, ActFormat::kQ8K, Isa::kAvx512, isa::gemv_iq2xs_q8k_avx512,
       isa::gemm_iq2xs_q8k_avx512},
      {"gemv_iq2xs_q8k_avx2", GgmlType::kIQ2_XS, ActFormat::kQ8K, Isa::kAvx2, isa::gemv_iq2xs_q8k_avx2},
      {"gemv_iq2xs_q8k_scalar", GgmlType::kIQ2_XS, ActFormat::kQ8K, Isa::kScalar, isa::gemv_iq2xs_q8k_scalar},
      {"gemv_iq3xxs_q8kt_avx512vbmi", GgmlType::kIQ3_XXS, ActFormat::kQ8KT, Isa::kAvx512Vbmi,
       isa::gemv_iq3xxs_q8kt_avx512vbmi, isa::gemm_iq3xxs_q8kt_avx512vbmi},
      {"gemv_iq3xxs_q8k_avx512", GgmlType::kIQ3_XXS, ActFormat::kQ8K, Isa::kAvx512, isa::gemv_iq3xxs_q8k_avx512,
       isa::gemm_iq3xxs_q8k_avx512},
      {"gemv_iq3xxs_q8k_avx2", GgmlType::kIQ3_XXS, ActFormat::kQ8K, Isa::kAvx2, isa::gemv_iq3xxs_q8k_avx2},
      {"gemv_iq3xxs_q8k_scalar", GgmlType::kIQ3_XXS, ActFormat::kQ8K, Isa::kScalar, isa::gemv_iq3xxs_q8k_scalar},
      {"gemv_iq1s_q8kt_avx512vbmi", GgmlType::kIQ1_S, ActFormat::kQ8KT, Isa::kAvx512Vbmi,
       isa::gemv_iq1s_q8kt_avx512vbmi, isa::gemm_iq1s_q8kt_avx512vbmi},
      {"gemv_iq1s_q8k_avx512", GgmlType::kIQ1_S, ActFormat::kQ8K, Isa::kAvx512, isa::gemv_iq1s_q8k_avx512,
       isa::gemm_iq1s_q8k_avx512},
      {"gemv_iq1s_q8k_avx2", GgmlType::kIQ1_S, ActFormat::kQ8K, Isa::kAvx2, isa::gemv_iq1s_q8k_avx2},
      {"gemv_iq1s_q8k_scalar", GgmlType::kIQ1_S, ActFormat::kQ8K, Isa::kScalar, isa::gemv_iq1s_q8k_scalar},
      {"gemv_iq1m_q8kt_avx512vbmi", GgmlType::kIQ1_M, ActFormat::kQ8KT, Isa::kAvx512Vbmi,
       isa::gemv_iq1m_q8kt_avx512vbmi, isa::gemm_iq1m_q8kt_avx512vbmi},
      {"gemv_iq1m_q8k_avx512", GgmlType::kIQ1_M, ActFormat::kQ8K, Isa::kAvx512, isa::gemv_iq1m_q8k_avx512,
       isa::gemm_iq1m_q8k_avx512},
      {"gemv_iq1m_q8k_avx2", GgmlType::kIQ1_M, ActFormat::kQ8K, Isa::kAvx2, isa::gemv_iq1m_q8k_avx2},
      {"gemv_iq1m_q8k_scalar", GgmlType::kIQ1_M, ActFormat::kQ8K, Isa::kScalar, isa::gemv_iq1m_q8k_scalar},
  };
  return table;
}

}  // namespace

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx512Vbmi: return "avx512vbmi";
  }
  return "?";
}

bool isa_supported(Isa isa, const CpuFeatures& f) {
  switch (isa) {
    case Isa::kScalar: return true;
    case Isa::kAvx2: return f.avx2;
    case Isa::kAvx512: return f.avx512_vnni;
    case Isa::kAvx512Vbmi: return f.avx512_vbmi;
  }
  return false;
}

bool gemv_has_kernels(GgmlType t) {
  for (const auto& k : kernel_table()) {
    if (k.weight == t) return true;
  }
  return false;
}

ActFormat gemv_act_format(GgmlType t) {
  for (const auto& k : kernel_table()) {
    if (k.weight == t) return k.act;
  }
  AFF_CHECK(!"gemv_act_format: no kernels for this weight type");
  return ActFormat::kQ8_0;
}

std::vector<GemvKernel> gemv_kernels(GgmlType t) {
  std::vector<GemvKernel> out;
  for (const auto& k : kernel_table()) {
    if (k.weight == t) out.push_back(k);
  }
  return out;
}

const GemvKernel* select_gemv_kernel(GgmlType t, const CpuFeatures& f) {
  for (const auto& k : kernel_table()) {
    if (k.weight == t && isa_supported(k.isa, f)) return &k;
  }
  return nullptr;
}

void gemv_parallel(const GemvKernel& k, const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t cols,
                   const void* act, float* y, int n_threads) {
  n_threads = std::max(1, n_threads);
  if (n_threads == 1 || rows < 2 * n_threads) {
    k.fn(w, row_bytes, rows, cols, act, y);
    return;
  }
#pragma omp parallel num_threads(n_threads)
  {
    const int nt = omp_get_num_threads();
    const int t = omp_get_thread_num();
    const int64_t r0 = rows * t / nt;
    const int64_t r1 = rows * (t + 1) / nt;
    if (r1 > r0) k.fn(w + r0 * row_bytes, row_bytes, r1 - r0, cols, act, y + r0);
  }
}

bool gemm_uses_amx(const GemvKernel& k, int64_t n) {
  if (k.amx_fn == nullptr || n < k.amx_min_tokens) return false;
  const CpuFeatures& f = cpu_features();
  return f.amx_int8 && f.avx512_vbmi;  // the AMX kernels decode with VBMI byte permutes
}

void gemm(const GemvKernel& k, const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t cols, const void* act,
          int64_t act_stride, int64_t n, float* y, int64_t ldy) {
  // Half of a 1-2 MiB L2 for the weight tile leaves room for the activations (n x ~1.1
  // bytes per input) and the streaming prefetchers' lines.
  constexpr int64_t kTileBytes = 256 << 10;
  const int64_t tile_rows = std::max<int64_t>(1, std::min(rows, kTileBytes / std::max<int64_t>(1, row_bytes)));
  if (gemm_uses_amx(k, n)) {
    // One pass: the kernel walks 16-row tiles itself and lays the activations out once.
    k.amx_fn(w, row_bytes, rows, cols, act, act_stride, n, y, ldy);
    return;
  }
  const auto* a = static_cast<const uint8_t*>(act);
  for (int64_t r0 = 0; r0 < rows; r0 += tile_rows) {
    const int64_t nr = std::min(tile_rows, rows - r0);
    if (k.gemm_fn != nullptr) {
      k.gemm_fn(w + r0 * row_bytes, row_bytes, nr, cols, a, act_stride, n, y + r0, ldy);
      continue;
    }
    for (int64_t t = 0; t < n; ++t) k.fn(w + r0 * row_bytes, row_bytes, nr, cols, a + t * act_stride, y + t * ldy + r0);
  }
}

}  // namespace aff::cpu
