// The decode step (one token) as a CUDA graph: captured on the first step,
// replayed for every later one. Everything that changes from token to token
// lives in device memory (StepInfo, the token id, the routed experts), so
// one capture serves all positions; the host only writes the step's inputs
// into pinned memory and launches. Launching ~1,000 small kernels one by one
// costs more than the kernels themselves at batch 1; a replay costs one call.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "affinity/status.h"
#include "backend/cuda/runtime/step_info.h"

namespace aff::cuda {

// Inputs and outputs of a captured step, in page-locked host memory so that
// the captured copies read and write them directly.
struct DecodeIo {
  StepInfo step;
  int32_t token = 0;
  int32_t argmax = 0;
};

// What a capture depends on besides the model and state it was made with.
struct DecodeGraphKey {
  const void* model = nullptr;
  int n_layers = -1;
  bool no_routed = false;
  bool greedy = false;  // argmax only (else the logits row is copied out)
  int shape = 0;        // gpu_decode_shape at the step's position
  bool operator==(const DecodeGraphKey&) const = default;
};

class DecodeGraph {
 public:
  DecodeGraph() = default;
  ~DecodeGraph();
  DecodeGraph(const DecodeGraph&) = delete;
  DecodeGraph& operator=(const DecodeGraph&) = delete;

  // Pinned I/O block and, for logits, a pinned [vocab] row.
  Status prepare(int64_t vocab);
  DecodeIo* io() const { return io_; }
  float* logits() const { return logits_; }

  bool ready_for(const DecodeGraphKey& key) const { return find(key) != nullptr; }
  // A path is captured only after it has run once launch by launch, so that
  // lazy one-time set-up (tables, library handles, kernel attributes), which
  // may not happen inside a capture, is done by then.
  bool warmed_for(const DecodeGraphKey& key) const;
  void mark_warmed(const DecodeGraphKey& key);
  // Ends a capture begun on `stream` and instantiates it for `key`.
  Status finish_capture(cudaStream_t stream, const DecodeGraphKey& key);
  // Abandons a capture that failed part-way (the stream is usable again).
  static void abandon_capture(cudaStream_t stream);
  Status launch(cudaStream_t stream, const DecodeGraphKey& key) const;
  void clear();

 private:
  struct Captured {
    DecodeGraphKey key;
    cudaGraphExec_t exec = nullptr;
  };
  cudaGraphExec_t find(const DecodeGraphKey& key) const;
  std::vector<Captured> graphs_;       // one per key seen (greedy and logits steps, typically)
  std::vector<DecodeGraphKey> warmed_;
  DecodeIo* io_ = nullptr;
  float* logits_ = nullptr;
  int64_t vocab_ = 0;
};

// AFF_CUDA_GRAPH=0 runs decode steps launch by launch (for debugging and for
// the test that the graph changes nothing).
bool decode_graph_enabled();

}  // namespace aff::cuda
