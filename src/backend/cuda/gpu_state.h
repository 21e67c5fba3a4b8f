// Per-sequence state of the GPU forward pass, the device twin of dsv4::State:
// the sliding-window ring, the compressors' rings of recent projections, the
// compressed entries and indexer keys, plus the scratch activations of one
// chunk. Every count (entries per layer, pending tokens) is a function of
// n_past, so the host knows all shapes without reading the device back.
//
// KV memory: the compressed entries and indexer keys grow with the context
// (the window and compressor rings do not). Each is a range of virtual
// addresses reserved for --kv-size positions, of which only the first
// --kv-commit positions are backed by device memory at creation; more is
// mapped on demand by gpu_state_reserve, on the host, before a chunk runs.
// Addresses never move, so a captured decode graph stays valid, and kernels
// size their grids by the reserved capacity, which never changes either.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "affinity/status.h"
#include "backend/cuda/runtime/device_buffer.h"
#include "backend/cuda/runtime/device_model.h"

namespace aff::cuda {

class DecodeGraph;  // decode_graph.h

// Device memory at a fixed virtual address that can be backed piece by piece
// (CUDA virtual memory management: reserve addresses, then create and map
// physical chunks). Only [0, bytes()) may be touched. Where the driver has no
// VMM, the whole reservation is one cudaMalloc instead.
class GrowableDeviceBuffer {
 public:
  GrowableDeviceBuffer() = default;
  ~GrowableDeviceBuffer() { reset(); }
  GrowableDeviceBuffer(GrowableDeviceBuffer&& o) noexcept { *this = std::move(o); }
  GrowableDeviceBuffer& operator=(GrowableDeviceBuffer&& o) noexcept;
  GrowableDeviceBuffer(const GrowableDeviceBuffer&) = delete;
  GrowableDeviceBuffer& operator=(const GrowableDeviceBuffer&) = delete;

  // Reserves `max_bytes` of addresses on the current device, backs none.
  static Result<GrowableDeviceBuffer> reserve(size_t max_bytes, const std::string& what);
  // Backs [0, bytes) (rounded up to the allocation granularity); never shrinks.
  Status commit(size_t bytes);
  void reset();

  void* data() const { return reinterpret_cast<void*>(base_); }
  template <typename T>
  T* as() const { return reinterpret_cast<T*>(base_); }
  size_t bytes() const { return committed_; }     // backed
  size_t reserved() const { return reserved_; }   // address space

 private:
  uintptr_t base_ = 0;
  size_t reserved_ = 0, committed_ = 0, granularity_ = 0;
  int device_ = 0;
  bool vmm_ = false;                  // false: one cudaMalloc of reserved_
  std::vector<uint64_t> handles_;     // CUmemGenericAllocationHandle of each mapped piece
  std::vector<size_t> piece_bytes_;
  std::string what_;
};

struct GpuCompressorState {
  DeviceBuffer ring_kv;    // [2*ratio, width] projections of the last 2*ratio positions (p at row p % 2r)
  DeviceBuffer ring_gate;  // [2*ratio, width] gate logits + ape
  DeviceBuffer ring_x;     // [u, D] compressor input of the positions of the unit being filled (row p % u), with
                           // u = compressor_defer_rows(ratio) (none when 0): decode projections wait for the unit's end
  GrowableDeviceBuffer entries;  // [capacity, dim]; entry j covers positions [j*ratio, (j+1)*ratio);
                                 // rows past the committed positions are not backed
  int64_t capacity = 0;    // rows reserved: kv_size / ratio + 1
  int ratio = 0, dim = 0;
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
  DeviceBuffer pre, post, comb;         // [T, hc], [T, hc], [T, hc, hc]
  DeviceBuffer hc_partials;             // [T, hc_fused_blocks(D), (2+hc)*hc + 1] fused mHC partial sums
  DeviceBuffer hc_tickets;              // u32 [T], zero between launches
  DeviceBuffer qr;                      // [T, q_lora_rank]
  DeviceBuffer q, o;                    // [T, H, Dh]
  DeviceBuffer kv;                      // [T, Dh]
  DeviceBuffer u;                       // [T, o_groups * o_lora_rank]
  DeviceBuffer comp_kv, comp_gate;      // [T, 2 * max(Dh, index_head_dim)]
  DeviceBuffer icomp_kv, icomp_gate;    // [T, 2 * index_head_dim] the indexer's compressor (runs beside comp_*)
  DeviceBuffer iq;                      // [T, index_n_heads, index_head_dim]
  DeviceBuffer iw;                      // [T, index_n_heads]
  DeviceBuffer scores;                  // [T, max indexer entries]
  DeviceBuffer sel, sel_count;          // i32 [T, index_topk], i32 [T]
  DeviceBuffer topk_scratch;            // u32 [kTopkScratchWords], zero between launches (indexer_topk's grid form)
  DeviceBuffer router_logits;           // [T, E]
  DeviceBuffer router_ticket;           // u32 [1], zero between launches (router_gate_topk)
  DeviceBuffer moe_sync;                // u32 [3], zero between launches (moe_fused's barriers)
  // The second mHC site with the router's gate beside it (kernels/moe/site_router.h),
  // for chunks of at most kSiteRouterMaxT tokens:
  DeviceBuffer h_copy;                  // [kSiteRouterMaxT, hc, D] the first site's output streams
  DeviceBuffer post_copy, comb_copy;    // [kSiteRouterMaxT, hc], [.., hc, hc] the first site's post / comb
  DeviceBuffer x_inv;                   // [kSiteRouterMaxT] the second site's inverse rms of x
  DeviceBuffer gate_parts;              // [kSiteRouterMaxT, kSiteRouterCols, E] the gate's partial sums
  DeviceBuffer site_router_ticket;      // u32 [1], zero between launches
  DeviceBuffer iw_parts;                // [kHcSmallT, hc_decode_blocks(D), index_n_heads] (HcSiteFeeds)
  DeviceBuffer route_ids;               // i32 [T, k]
  DeviceBuffer route_w;                 // [T, k]
  DeviceBuffer pair_w2;                 // pointers [T, k]: each routed pair's w2 (MoeDecodeArgs::pair_w2)
  DeviceBuffer act;                     // [T*k, moe_inter]
  DeviceBuffer y_pairs;                 // [T*k, D]
  DeviceBuffer y_shared;                // [T, D]
  DeviceBuffer zero_ids;                // i32 [T], all 0 (the shared expert's slot)
  DeviceBuffer logits;                  // [min(T, kLogitRows), vocab]
  DeviceBuffer argmax;                  // i32 [T]
};

// Head rows computed per pass: all-positions logits of a long chunk go
// through ws.logits in passes of this many rows, so the workspace does not
// hold [chunk, vocab] (2 GB at 4,096 tokens and V4's vocabulary).
constexpr int64_t kLogitRows = 256;

class GpuState {
 public:
  int64_t n_past = 0;
  int64_t max_positions = 0;   // KV address space in positions (--kv-size)
  int64_t kv_committed = 0;    // positions whose caches are backed (grows, see gpu_state_reserve)
  int64_t max_chunk = 0;
  Stream stream;
  // Decode of a compressed layer runs its compressors and indexer beside the
  // query path on `stream` (short chains of latency-bound kernels): the
  // attention's compressor on `side`, the indexer's compressor and its
  // selection on `side2`, the indexer's head weights and then its queries
  // on `side3` (after qr). Fork at the layer's start, join before attention.
  // When the attention finishes its queries itself, the KV latent's norm and
  // RoPE run on `side3` (which the indexer's queries then leave free) beside
  // wq_b: forked at kv_ready, joined at kv_done before attention.
  // (A CSA layer whose attention finishes its queries: that KV part on side4.)
  Stream side, side2, side3, side4;
  Event fork, qr_ready, iq_ready, iw_ready, join, join2, join3, kv_ready, kv_done;
  // The MoE router's gate beside its mHC site on side3 (AFF_CUDA_SITE_ROUTER=2),
  // joined at gate_join before the routed launches while gate_pending.
  Event gate_join;
  bool gate_pending = false;
  // AFF_CUDA_SITE_ROUTER=3: the gate's stream columns on side_gate, from the
  // layer's first site to its MoE site (joined at streams_done while pending).
  Stream side_gate;
  Event streams_done;
  bool streams_pending = false;
  // Decode: L2 prefetches of weights a few kernels ahead of their readers run
  // on `ahead` (forked where they should start, joined once at the step's end).
  Stream ahead;
  Event ahead_fork, ahead_join;
  bool ahead_pending = false;
  DeviceBuffer step;           // StepInfo of the chunk being run (runtime/step_info.h)
  std::vector<GpuLayerState> layers;
  DeviceBuffer rope_main;      // [rope_dim/2] inverse frequencies, sliding layers
  DeviceBuffer rope_compress;  // [rope_dim/2] compressed layers (YaRN when configured)
  Workspace ws;
  std::shared_ptr<DecodeGraph> decode_graph;  // the captured decode step, made on first use
};

struct GpuStateOptions {
  int64_t kv_size = 0;      // most positions a sequence can reach (address space)
  int64_t kv_commit = 0;    // positions backed at creation (clamped to kv_size)
  int64_t max_chunk = 256;  // most tokens per forward call (workspace rows)
};

// A state for sequences of at most kv_size tokens, fed in chunks of at most
// max_chunk tokens (longer inputs are split by gpu_forward).
Result<std::unique_ptr<GpuState>> make_gpu_state(const DeviceModel& model, const GpuStateOptions& options);
// Fully committed: kv_size = kv_commit = max_positions.
Result<std::unique_ptr<GpuState>> make_gpu_state(const DeviceModel& model, int64_t max_positions,
                                                 int64_t max_chunk = 256);

// Backs the caches for positions [0, positions) (with some margin, so growth
// is rare). Call on the host before running a chunk that ends at `positions`;
// never while a graph is being captured. Fails with a clear Status when
// positions exceed kv_size or the GPU has no memory left (state unchanged).
Status gpu_state_reserve(GpuState& state, int64_t positions);

// Cache bytes per position of `model` (compressed entries and indexer keys,
// f32), the window rings of a state, and what a state has backed now.
double gpu_state_kv_bytes_per_position(const DeviceModel& model);
size_t gpu_state_window_bytes(const GpuState& state);
size_t gpu_state_committed_kv_bytes(const GpuState& state);

// Back to position 0 (the rings need no clearing: nothing before n_past is read).
void gpu_state_reset(GpuState& state);

}  // namespace aff::cuda
