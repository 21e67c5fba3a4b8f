// What both forms of the fused grouped ggml kernels (moe_grouped_ggml.cu,
// moe_grouped_ggml_v2.cu) share about staging weight rows in shared memory:
// the size of a row's staged window of a super-block, a weight's bytes per
// super-block, and IQ2_XXS's per-block decode tables.
#pragma once

#include <cstdint>

#include "backend/cuda/kernels/common/ggml_tables.h"
#include "backend/cuda/kernels/gemm/moe_grouped_decode.cuh"
#include "backend/cuda/runtime/device_weights.h"
#include "quant/type_traits.h"

namespace aff::cuda::moe_grouped {

constexpr int kQ2K = int(quant::GgmlType::kQ2_K), kQ3K = int(quant::GgmlType::kQ3_K),
              kIQ2XXS = int(quant::GgmlType::kIQ2_XXS);

// 16-byte units of one row's staged window of a super-block of sb bytes: the
// window may start up to 15 bytes before the bytes. Odd, so the eight rows a
// warp reads at once start in eight different bank groups.
inline int slot_units(int64_t sb_bytes) { return int((sb_bytes + 30) / 16) | 1; }

// Bytes per 256 columns of w (0: not a whole number).
inline int64_t sb_bytes(const DeviceLinear& w) {
  const int64_t n = w.in / 256;
  return n > 0 && w.row_bytes % n == 0 ? w.row_bytes / n : 0;
}

// IQ2_XXS's per-block tables (moe_grouped_decode.cuh): 256 selector pairs, 128 sign masks.
constexpr int kIq2TableBytes = 256 * 8 + 128 * 16;

// Fills a block's IQ2_XXS tables from the device GgmlTables; thread tid of a
// 256-thread block writes selector pair tid (and sign mask tid < 128). The
// caller synchronises before use.
__device__ __forceinline__ void stage_iq2_tables(const uint8_t* tables, int tid, uint2* sel, uint4* sign) {
  const GgmlTables* tab = reinterpret_cast<const GgmlTables*>(tables);
  sel[tid] = iq2xxs_selectors(tab->iq2xxs_grid[tid]);
  if (tid < 128) sign[tid] = iq2xxs_sign_masks(tab->signs_iq2xs[tid]);
}

}  // namespace aff::cuda::moe_grouped
