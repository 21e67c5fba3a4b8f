// Per-sequence state of the GPU forward pass, the device twin of dsv4::State:
// the sliding-window ring, the compressors' rings of recent projections, the
// compressed entries and indexer keys, plus the scratch activations of one
// chunk. Every count (entries per layer, pending tokens) is a function of
// n_past, so the host knows all shapes without reading the device back.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "affinity/status.h"
#include "backend/cuda/runtime/device_buffer.h"
#include "backend/cuda/runtime/device_model.h"

namespace aff::cuda {

class DecodeGraph;  // decode_graph.h

struct GpuCompressorState {
  DeviceBuffer ring_kv;    // [2*ratio, width] projections of the last 2*ratio positions (p at row p % 2r)
  DeviceBuffer ring_gate;  // [2*ratio, width] gate logits + ape
  DeviceBuffer entries;    // [capacity, dim]; entry j covers positions [j*ratio, (j+1)*ratio)
  int64_t capacity = 0;
};

struct GpuLayerState {
  DeviceBuffer window;     // [sliding_window, head_dim]; position p at row p % window
  GpuCompressorState kv;   // CSA/HCA attention entries
  GpuCompressorState idx;  // CSA indexer keys
};

// Activations of one chunk of at most max_chunk tokens (f32 unless noted).
struct Workspace {
  DeviceBuffer tokens;                  // i32 [T]
  DeviceBuffer h;                       // [T, hc, D] residual streams
  DeviceBuffer x, y;                    // [T, D] sublayer input / output
  DeviceBuffer z;                       // [T, hc*D] normed streams (mHC mixes)
  DeviceBuffer mix;                     // [T, (2+hc)*hc]
  DeviceBuffer pre, post, comb;         // [T, hc], [T, hc], [T, hc, hc]
  DeviceBuffer qr;                      // [T, q_lora_rank]
  DeviceBuffer q, o;                    // [T, H, Dh]
  DeviceBuffer kv;                      // [T, Dh]
  DeviceBuffer u;                       // [T, o_groups * o_lora_rank]
  DeviceBuffer comp_kv, comp_gate;      // [T, 2 * max(Dh, index_head_dim)]
  DeviceBuffer iq;                      // [T, index_n_heads, index_head_dim]
  DeviceBuffer iw;                      // [T, index_n_heads]
  DeviceBuffer scores;                  // [T, max indexer entries]
  DeviceBuffer sel, sel_count;          // i32 [T, index_topk], i32 [T]
  DeviceBuffer router_logits;           // [T, E]
  DeviceBuffer route_ids;               // i32 [T, k]
  DeviceBuffer route_w;                 // [T, k]
  DeviceBuffer act;                     // [T*k, moe_inter]
  DeviceBuffer y_pairs;                 // [T*k, D]
  DeviceBuffer y_shared;                // [T, D]
  DeviceBuffer zero_ids;                // i32 [T], all 0 (the shared expert's slot)
  DeviceBuffer logits;                  // [T, vocab]
  DeviceBuffer argmax;                  // i32 [T]
};

class GpuState {
 public:
  int64_t n_past = 0;
  int64_t max_positions = 0;
  int64_t max_chunk = 0;
  Stream stream;
  DeviceBuffer step;           // StepInfo of the chunk being run (runtime/step_info.h)
  std::vector<GpuLayerState> layers;
  DeviceBuffer rope_main;      // [rope_dim/2] inverse frequencies, sliding layers
  DeviceBuffer rope_compress;  // [rope_dim/2] compressed layers (YaRN when configured)
  Workspace ws;
  std::shared_ptr<DecodeGraph> decode_graph;  // the captured decode step, made on first use
};

// A state for sequences of at most max_positions tokens, fed in chunks of at
// most max_chunk tokens (longer inputs are split by gpu_forward).
Result<std::unique_ptr<GpuState>> make_gpu_state(const DeviceModel& model, int64_t max_positions,
                                                 int64_t max_chunk = 256);

// Back to position 0 (the rings need no clearing: nothing before n_past is read).
void gpu_state_reset(GpuState& state);

}  // namespace aff::cuda
