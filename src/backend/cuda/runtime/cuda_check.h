// CUDA errors as aff::Status. Library code never exits on a CUDA failure: every
// runtime call and every launch is checked and turned into a Status that names
// the operation, so a caller (server, test, gpucheck) decides what happens.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "affinity/status.h"

namespace aff::cuda {

// Ok for cudaSuccess, else an internal error "<what>: <cuda error name>: <text>".
inline Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::ok();
  return internal_error(std::string("CUDA ") + what + ": " + cudaGetErrorName(err) + ": " +
                        cudaGetErrorString(err));
}

// Status of the most recent launch on this thread (clears the non-sticky error).
inline Status launch_status(const char* kernel) { return cuda_status(cudaGetLastError(), kernel); }

}  // namespace aff::cuda

// Return the Status of a CUDA runtime call when it fails.
#define AFF_CUDA_RETURN_IF_ERROR(call) AFF_RETURN_IF_ERROR(::aff::cuda::cuda_status((call), #call))
