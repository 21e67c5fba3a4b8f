// A kernel's dynamic shared-memory limit above the 48 KB default is a
// per-function attribute. Setting it is a host call that must not happen
// inside a graph capture, so it is done once per kernel, before any capture
// (the *_prepare functions and the eager first decode step call this).
#pragma once

#include "affinity/status.h"

namespace aff::cuda {

// Raises kernel's limit to at least `bytes`; later calls with the same or a
// smaller size do nothing. Thread-safe.
Status raise_smem_limit(const void* kernel, int bytes);

}  // namespace aff::cuda
