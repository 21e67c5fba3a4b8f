#include "backend/cuda/decode_graph.h"

#include <string>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/env_switch.h"

namespace aff::cuda {

DecodeGraph::~DecodeGraph() {
  clear();
  if (io_) cudaFreeHost(io_);
  if (logits_) cudaFreeHost(logits_);
}

void DecodeGraph::clear() {
  for (Captured& c : graphs_) cudaGraphExecDestroy(c.exec);
  graphs_.clear();
  warmed_.clear();
}

cudaGraphExec_t DecodeGraph::find(const DecodeGraphKey& key) const {
  for (const Captured& c : graphs_)
    if (c.key == key) return c.exec;
  return nullptr;
}

bool DecodeGraph::warmed_for(const DecodeGraphKey& key) const {
  for (const DecodeGraphKey& k : warmed_)
    if (k == key) return true;
  return false;
}

void DecodeGraph::mark_warmed(const DecodeGraphKey& key) {
  if (!warmed_for(key)) warmed_.push_back(key);
}

Status DecodeGraph::prepare(int64_t vocab) {
  if (!io_) {
    void* p = nullptr;
    AFF_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, sizeof(DecodeIo), cudaHostAllocDefault));
    io_ = new (p) DecodeIo();
  }
  if (!logits_ || vocab_ != vocab) {
    if (logits_) cudaFreeHost(logits_);
    logits_ = nullptr;
    void* p = nullptr;
    AFF_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, size_t(vocab) * sizeof(float), cudaHostAllocDefault));
    logits_ = static_cast<float*>(p);
    vocab_ = vocab;
    clear();  // a capture holds the old buffer's address
  }
  return Status::ok();
}

Status DecodeGraph::finish_capture(cudaStream_t stream, const DecodeGraphKey& key) {
  cudaGraph_t graph = nullptr;
  AFF_CUDA_RETURN_IF_ERROR(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (e != cudaSuccess)
    return internal_error(std::string("decode graph: instantiation failed: ") + cudaGetErrorString(e));
  graphs_.push_back({key, exec});
  return Status::ok();
}

void DecodeGraph::abandon_capture(cudaStream_t stream) {
  cudaGraph_t graph = nullptr;
  if (cudaStreamEndCapture(stream, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
  cudaGetLastError();  // the failed capture's sticky-free error is consumed here
}

Status DecodeGraph::launch(cudaStream_t stream, const DecodeGraphKey& key) const {
  cudaGraphExec_t exec = find(key);
  if (!exec) return internal_error("decode graph: no capture for these options");
  AFF_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream));
  return Status::ok();
}

bool decode_graph_enabled() { return env_switch_on("AFF_CUDA_GRAPH"); }

}  // namespace aff::cuda
