// The CUDA backend's on/off environment switches (AFF_CUDA_GRAPH,
// AFF_CUDA_SIDE_STREAM, AFF_CUDA_L2_AHEAD, ...): on unless set to "0", so a
// run can be compared with a feature taken out; and its integer tuning knobs.
#pragma once

#include <cstdlib>
#include <cstring>

namespace aff::cuda {

inline bool env_switch_on(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// An opt-in switch (a form kept for work in progress): on only when set to "1".
inline bool env_opt_in(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "1") == 0;
}

// An integer tuning knob: its value when set within [lo, hi], else fallback.
inline int env_int(const char* name, int fallback, int lo, int hi) {
  const char* e = std::getenv(name);
  if (e == nullptr) return fallback;
  const int v = std::atoi(e);
  return v >= lo && v <= hi ? v : fallback;
}

}  // namespace aff::cuda
