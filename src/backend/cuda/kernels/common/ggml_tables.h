// ggml's codebooks and value tables in device memory, for the kernels that decode
// ggml block formats. The one home of the values is src/quant/ggml_grids.h; this
// is a device copy made from it at start (never a second hand-written copy).
// Tables are read with divergent indices (one gather per 8 weights), which
// global memory through L1 serves well and constant memory would serialise.
#pragma once

#include <cstdint>

#include "affinity/status.h"

namespace aff::cuda {

struct GgmlTables {
  uint64_t iq2xxs_grid[256];   // 8 magnitudes (bytes) per entry
  uint64_t iq2xs_grid[512];
  uint64_t iq1s_grid[2048];    // 8 int8 values in {-1, 0, 1} per entry
  uint32_t iq3xxs_grid[256];   // 4 magnitudes (bytes) per entry
  uint8_t signs_iq2xs[128];    // 7-bit sign index -> 8 sign bits (bit j set: element j negative)
  int8_t values_iq4nl[16];     // IQ4_NL / IQ4_XS levels
  int8_t values_mxfp4[16];     // E2M1 values doubled (ggml's table; scale 2^(e-128))
};

// The device copy for the current device, made on first use (call it before a
// stream capture begins: the first call allocates and copies). Thread-safe.
Result<const GgmlTables*> ggml_device_tables();

}  // namespace aff::cuda
