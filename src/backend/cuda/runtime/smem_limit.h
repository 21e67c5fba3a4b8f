// A kernel's dynamic shared-memory limit above the 48 KB default is a
// per-function attribute. Setting it is a host call that must not happen
// inside a graph capture, so it is done once per kernel, before any capture
// (the *_prepare functions and the eager first decode step call this).
#pragma once

#include <initializer_list>

#include "affinity/status.h"

namespace aff::cuda {

// Raises kernel's limit to at least `bytes`; later calls with the same or a
// smaller size do nothing. Thread-safe.
Status raise_smem_limit(const void* kernel, int bytes);

// One kernel's requirement, for raising several at once.
struct SmemLimit {
  const void* kernel;
  int bytes;
};

// raise_smem_limit for each; the first failure, or ok. A file whose kernels
// are chosen per call raises all of them on its first call (an eager
// prefill), so a captured step never reaches a kernel not yet raised.
Status raise_smem_limits(std::initializer_list<SmemLimit> limits);

}  // namespace aff::cuda
