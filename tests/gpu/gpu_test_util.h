// Shared by the GPU tests: skip (with a message) when no CUDA device is
// visible, so a CUDA build on a GPU-less CI machine stays green.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "backend/device_probe.h"

namespace aff::cuda::testing {

inline bool gpu_present(std::string* why) {
  static std::string error;
  static const bool present = !aff::probe_gpus(&error).empty();
  if (why) *why = error.empty() ? "no device listed" : error;
  return present;
}

}  // namespace aff::cuda::testing

#define AFF_SKIP_WITHOUT_GPU()                                                                   \
  do {                                                                                           \
    std::string why_;                                                                            \
    if (!::aff::cuda::testing::gpu_present(&why_))                                               \
      GTEST_SKIP() << "no CUDA device visible (" << why_ << "): GPU tests skipped on this machine"; \
  } while (0)
