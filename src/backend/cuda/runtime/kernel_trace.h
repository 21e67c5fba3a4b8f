// A kernel timeline without a profiler binary: with AFF_CUDA_TRACE=FILE the
// process records every kernel the GPU runs (graph nodes included) through
// CUPTI's activity API and, at exit, writes one CSV row per kernel:
//
//   launch,stream,start_ns,end_ns,grid,block,name
//
// `launch` is the correlation id of the API call that ran it: every kernel of
// one graph launch (a decode step) shares it. scripts/gpu/trace-step.py turns
// a step into its critical path, launch gaps and overlap.
//
// CUPTI is loaded with dlopen when tracing is asked for (AFF_CUPTI_LIB names
// the library when it is not on the loader's path), so a build never links it
// and a run without the variable never touches it. Tracing adds a timestamp
// pair per kernel; absolute times shift a little, the shape does not.
#pragma once

namespace aff::cuda {

// Starts tracing once per process when AFF_CUDA_TRACE is set (later calls do
// nothing); call before the kernels of interest are launched. A failure to
// load CUPTI is reported on stderr and leaves the run untraced.
void kernel_trace_from_env();

}  // namespace aff::cuda
