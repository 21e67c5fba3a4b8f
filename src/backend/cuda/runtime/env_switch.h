// The CUDA backend's on/off environment switches (AFF_CUDA_GRAPH,
// AFF_CUDA_SIDE_STREAM, AFF_CUDA_L2_AHEAD, ...): on unless set to "0", so a
// run can be compared with a feature taken out.
#pragma once

#include <cstdlib>
#include <cstring>

namespace aff::cuda {

inline bool env_switch_on(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::strcmp(v, "0") != 0;
}

}  // namespace aff::cuda
