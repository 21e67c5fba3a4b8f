#include "backend/cuda/gpu_state.h"

#include "backend/cuda/kernels/compressor/compressor.h"
#include "backend/cuda/kernels/indexer/indexer.h"
#include "backend/cuda/kernels/mhc/mhc.h"
#include "backend/cuda/kernels/moe/site_router.h"
#include "backend/cuda/runtime/step_info.h"

#include <cuda.h>  // driver API types only: the functions come from cudaGetDriverEntryPointByVersion

#include <algorithm>
#include <mutex>
#include <string>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/kernel_trace.h"
#include "backend/ref/rope.h"

namespace aff::cuda {
namespace {

// The driver's VMM entry points, looked up through the runtime so that the
// binaries need no link-time libcuda (CPU-only machines run them too).
struct VmmApi {
  bool ok = false;
  decltype(&cuMemAddressReserve) address_reserve = nullptr;
  decltype(&cuMemAddressFree) address_free = nullptr;
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&cuDeviceGetAttribute) attribute = nullptr;
};

template <typename F>
bool lookup(const char* name, F& fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess || p == nullptr)
    return false;
  fn = reinterpret_cast<F>(p);
  return true;
}

const VmmApi& vmm_api() {
  static VmmApi api;
  static std::once_flag once;
  std::call_once(once, [] {
    VmmApi a;
    a.ok = lookup("cuMemAddressReserve", a.address_reserve) && lookup("cuMemAddressFree", a.address_free) &&
           lookup("cuMemCreate", a.create) && lookup("cuMemRelease", a.release) && lookup("cuMemMap", a.map) &&
           lookup("cuMemUnmap", a.unmap) && lookup("cuMemSetAccess", a.set_access) &&
           lookup("cuMemGetAllocationGranularity", a.granularity) && lookup("cuDeviceGetAttribute", a.attribute);
    api = a;
  });
  return api;
}

CUmemAllocationProp device_prop(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

std::string mib(size_t b) { return std::to_string((b + (1 << 20) - 1) >> 20) + " MiB"; }

Status alloc(DeviceBuffer& b, int64_t elems, size_t elem_size, const char* what) {
  AFF_ASSIGN_OR_RETURN(b, DeviceBuffer::allocate(size_t(std::max<int64_t>(elems, 1)) * elem_size, what));
  return Status::ok();
}

Status alloc_compressor(GpuCompressorState& s, int ratio, int dim, bool overlap, int64_t max_positions, int64_t D,
                        const char* what) {
  const int64_t width = (overlap ? 2 : 1) * int64_t(dim);
  s.capacity = max_positions / ratio + 1;
  s.ratio = ratio, s.dim = dim;
  AFF_RETURN_IF_ERROR(alloc(s.ring_kv, 2 * ratio * width, 4, "compressor ring"));
  AFF_RETURN_IF_ERROR(alloc(s.ring_gate, 2 * ratio * width, 4, "compressor ring"));
  if (const int u = compressor_defer_rows(ratio); u > 0)
    AFF_RETURN_IF_ERROR(alloc(s.ring_x, int64_t(u) * D, 4, "compressor ring"));
  AFF_ASSIGN_OR_RETURN(s.entries, GrowableDeviceBuffer::reserve(size_t(s.capacity) * size_t(dim) * 4, what));
  return Status::ok();
}

// Bytes of `s` that back positions [0, positions).
size_t entry_bytes(const GpuCompressorState& s, int64_t positions) {
  return size_t(std::min(positions / s.ratio + 1, s.capacity)) * size_t(s.dim) * 4;
}

}  // namespace

GrowableDeviceBuffer& GrowableDeviceBuffer::operator=(GrowableDeviceBuffer&& o) noexcept {
  if (this == &o) return *this;
  reset();
  base_ = o.base_, reserved_ = o.reserved_, committed_ = o.committed_, granularity_ = o.granularity_;
  device_ = o.device_, vmm_ = o.vmm_;
  handles_ = std::move(o.handles_), piece_bytes_ = std::move(o.piece_bytes_), what_ = std::move(o.what_);
  o.base_ = 0, o.reserved_ = o.committed_ = 0;
  o.handles_.clear(), o.piece_bytes_.clear();
  return *this;
}

Result<GrowableDeviceBuffer> GrowableDeviceBuffer::reserve(size_t max_bytes, const std::string& what) {
  GrowableDeviceBuffer b;
  b.what_ = what;
  AFF_CUDA_RETURN_IF_ERROR(cudaGetDevice(&b.device_));
  AFF_CUDA_RETURN_IF_ERROR(cudaFree(nullptr));  // the primary context must exist before driver calls
  const VmmApi& api = vmm_api();
  int vmm_supported = 0;
  if (api.ok &&
      api.attribute(&vmm_supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, CUdevice(b.device_)) !=
          CUDA_SUCCESS)
    vmm_supported = 0;
  max_bytes = std::max<size_t>(max_bytes, 1);
  if (!api.ok || !vmm_supported) {
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, max_bytes);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      return out_of_range(what + ": cannot allocate " + mib(max_bytes) + " (no virtual memory management on this "
                          "device, so the whole --kv-size is allocated at once): " + cudaGetErrorString(err));
    }
    b.base_ = reinterpret_cast<uintptr_t>(p);
    b.reserved_ = b.committed_ = max_bytes;
    return b;
  }
  const CUmemAllocationProp prop = device_prop(b.device_);
  if (api.granularity(&b.granularity_, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS)
    return internal_error(what + ": cuMemGetAllocationGranularity failed");
  const size_t rounded = (max_bytes + b.granularity_ - 1) / b.granularity_ * b.granularity_;
  CUdeviceptr base = 0;
  if (api.address_reserve(&base, rounded, 0, 0, 0) != CUDA_SUCCESS)
    return out_of_range(what + ": cannot reserve " + mib(rounded) + " of GPU address space (lower --kv-size)");
  b.vmm_ = true;
  b.base_ = uintptr_t(base);
  b.reserved_ = rounded;
  return b;
}

Status GrowableDeviceBuffer::commit(size_t bytes) {
  if (bytes <= committed_) return Status::ok();
  if (bytes > reserved_)
    return out_of_range(what_ + ": " + mib(bytes) + " requested, only " + mib(reserved_) + " reserved");
  const VmmApi& api = vmm_api();
  const size_t target = std::min(reserved_, (bytes + granularity_ - 1) / granularity_ * granularity_);
  const size_t piece = target - committed_;
  const CUmemAllocationProp prop = device_prop(device_);
  CUmemGenericAllocationHandle h = 0;
  if (api.create(&h, piece, &prop, 0) != CUDA_SUCCESS) {
    size_t free_b = 0, total_b = 0;
    (void)cudaMemGetInfo(&free_b, &total_b);
    return out_of_range(what_ + ": out of GPU memory backing " + mib(piece) + " more (" + mib(free_b) +
                        " free); lower the context or --kv-size");
  }
  const CUdeviceptr at = CUdeviceptr(base_ + committed_);
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (api.map(at, piece, 0, h, 0) != CUDA_SUCCESS) {
    api.release(h);
    return internal_error(what_ + ": cuMemMap failed");
  }
  if (api.set_access(at, piece, &access, 1) != CUDA_SUCCESS) {
    api.unmap(at, piece);
    api.release(h);
    return internal_error(what_ + ": cuMemSetAccess failed");
  }
  handles_.push_back(uint64_t(h));
  piece_bytes_.push_back(piece);
  committed_ = target;
  return Status::ok();
}

void GrowableDeviceBuffer::reset() {
  if (base_ == 0) return;
  if (!vmm_) {
    cudaFree(reinterpret_cast<void*>(base_));
  } else {
    // Nothing may still be reading: the owner's stream is idle when a state is destroyed.
    cudaDeviceSynchronize();
    const VmmApi& api = vmm_api();
    size_t off = 0;
    for (size_t i = 0; i < handles_.size(); ++i) {
      api.unmap(CUdeviceptr(base_ + off), piece_bytes_[i]);
      api.release(CUmemGenericAllocationHandle(handles_[i]));
      off += piece_bytes_[i];
    }
    api.address_free(CUdeviceptr(base_), reserved_);
  }
  base_ = 0, reserved_ = committed_ = 0;
  handles_.clear(), piece_bytes_.clear();
}

Status gpu_state_reserve(GpuState& st, int64_t positions) {
  if (positions > st.max_positions)
    return out_of_range("context of " + std::to_string(positions) + " positions exceeds the KV address space of " +
                        std::to_string(st.max_positions) + " positions (--kv-size)");
  if (positions <= st.kv_committed) return Status::ok();
  // Grow by half again at least, so a long generation maps memory a few times, not every token.
  const int64_t target = std::min(st.max_positions, std::max(positions, st.kv_committed + st.kv_committed / 2));
  for (GpuLayerState& ls : st.layers) {
    for (GpuCompressorState* cs : {&ls.kv, &ls.idx}) {
      if (cs->capacity == 0) continue;
      AFF_RETURN_IF_ERROR(cs->entries.commit(entry_bytes(*cs, target)));
    }
  }
  st.kv_committed = target;
  return Status::ok();
}

double gpu_state_kv_bytes_per_position(const DeviceModel& model) {
  double b = 0;
  for (const DeviceLayer& l : model.layers) {
    if (l.attn.compressor.present) b += 4.0 * l.attn.compressor.dim / l.attn.compressor.ratio;
    if (l.attn.indexer.present) b += 4.0 * l.attn.indexer.compressor.dim / l.attn.indexer.compressor.ratio;
  }
  return b;
}

size_t gpu_state_window_bytes(const GpuState& st) {
  size_t b = 0;
  for (const GpuLayerState& ls : st.layers) b += ls.window.bytes();
  return b;
}

size_t gpu_state_committed_kv_bytes(const GpuState& st) {
  size_t b = 0;
  for (const GpuLayerState& ls : st.layers) b += ls.kv.entries.bytes() + ls.idx.entries.bytes();
  return b;
}

Result<std::unique_ptr<GpuState>> make_gpu_state(const DeviceModel& model, int64_t max_positions,
                                                 int64_t max_chunk) {
  GpuStateOptions o;
  o.kv_size = o.kv_commit = max_positions;
  o.max_chunk = max_chunk;
  return make_gpu_state(model, o);
}

Result<std::unique_ptr<GpuState>> make_gpu_state(const DeviceModel& model, const GpuStateOptions& options) {
  const dsv4::ModelConfig& c = model.config;
  const int64_t max_positions = options.kv_size;
  int64_t max_chunk = options.max_chunk;
  if (max_positions < 1 || max_chunk < 1) return invalid_argument("GPU state: positions and chunk must be >= 1");
  if (options.kv_commit < 0) return invalid_argument("GPU state: kv_commit must be >= 0");
  max_chunk = std::min(max_chunk, max_positions);
  kernel_trace_from_env();  // AFF_CUDA_TRACE: the timeline of every kernel from here on
  auto st = std::make_unique<GpuState>();
  st->max_positions = max_positions;
  st->max_chunk = max_chunk;
  AFF_ASSIGN_OR_RETURN(st->stream, Stream::create());
  AFF_ASSIGN_OR_RETURN(st->side, Stream::create());
  AFF_ASSIGN_OR_RETURN(st->side2, Stream::create());
  AFF_ASSIGN_OR_RETURN(st->side3, Stream::create());
  AFF_ASSIGN_OR_RETURN(st->side4, Stream::create());
  AFF_ASSIGN_OR_RETURN(st->side_gate, Stream::create());
  for (Event* e : {&st->fork, &st->qr_ready, &st->iq_ready, &st->iw_ready, &st->join, &st->join2, &st->join3,
                   &st->kv_ready, &st->kv_done, &st->gate_join, &st->streams_done}) {
    AFF_ASSIGN_OR_RETURN(*e, Event::create());
  }
  AFF_ASSIGN_OR_RETURN(st->ahead, Stream::create());
  AFF_ASSIGN_OR_RETURN(st->ahead_fork, Event::create());
  AFF_ASSIGN_OR_RETURN(st->ahead_join, Event::create());

  int64_t max_idx_entries = 1;
  st->layers.resize(model.layers.size());
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const DeviceAttention& a = model.layers[l].attn;
    GpuLayerState& ls = st->layers[l];
    AFF_RETURN_IF_ERROR(alloc(ls.window, int64_t(c.sliding_window) * c.head_dim, 4, "sliding-window ring"));
    if (a.compressor.present)
      AFF_RETURN_IF_ERROR(alloc_compressor(ls.kv, a.compressor.ratio, a.compressor.dim, a.compressor.overlap,
                                           max_positions, c.hidden_size, "compressed KV entries"));
    if (a.indexer.present) {
      const DeviceCompressor& ic = a.indexer.compressor;
      AFF_RETURN_IF_ERROR(
          alloc_compressor(ls.idx, ic.ratio, ic.dim, ic.overlap, max_positions, c.hidden_size, "indexer keys"));
      max_idx_entries = std::max(max_idx_entries, ls.idx.capacity);
    }
  }

  dsv4::ModelConfig cfg = c;
  const std::vector<float> main = ref::rope_inv_freq(cfg.rope_theta, cfg.rope_dim, nullptr);
  ref::YarnParams yarn;
  yarn.factor = cfg.rope_scaling.factor;
  yarn.original_max_position = cfg.rope_scaling.original_max_position;
  yarn.beta_fast = cfg.rope_scaling.beta_fast;
  yarn.beta_slow = cfg.rope_scaling.beta_slow;
  const std::vector<float> comp =
      ref::rope_inv_freq(cfg.compress_rope_theta, cfg.rope_dim, cfg.rope_scaling.yarn ? &yarn : nullptr);
  AFF_ASSIGN_OR_RETURN(st->rope_main, upload_vector(main, "rope frequencies"));
  AFF_ASSIGN_OR_RETURN(st->rope_compress, upload_vector(comp, "rope frequencies"));
  AFF_RETURN_IF_ERROR(alloc(st->step, 1, sizeof(StepInfo), "step info"));

  const int64_t T = max_chunk, D = c.hidden_size, hc = c.hc_mult, H = c.num_heads, Dh = c.head_dim;
  const int64_t k = std::max(c.n_experts_per_tok, 1);
  Workspace& w = st->ws;
  AFF_RETURN_IF_ERROR(alloc(w.tokens, T, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.h, T * hc * D, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.x, T * D, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.y, T * D, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.pre, T * hc, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.post, T * hc, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.comb, T * hc * hc, 4, "workspace"));
  AFF_RETURN_IF_ERROR(
      alloc(w.hc_partials, T * hc_fused_blocks(D) * ((2 + hc) * hc + 1 + hc * (hc + 1) / 2), 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.hc_tickets, 2 * T, 4, "workspace"));
  AFF_RETURN_IF_ERROR(cuda_status(cudaMemset(w.hc_tickets.data(), 0, w.hc_tickets.bytes()), "cudaMemset"));
  AFF_RETURN_IF_ERROR(alloc(w.router_ticket, 1, 4, "workspace"));
  AFF_RETURN_IF_ERROR(cuda_status(cudaMemset(w.router_ticket.data(), 0, w.router_ticket.bytes()), "cudaMemset"));
  AFF_RETURN_IF_ERROR(alloc(w.moe_sync, 3, 4, "workspace"));
  AFF_RETURN_IF_ERROR(cuda_status(cudaMemset(w.moe_sync.data(), 0, w.moe_sync.bytes()), "cudaMemset"));
  AFF_RETURN_IF_ERROR(alloc(w.h_copy, kSiteRouterMaxT * hc * D, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.post_copy, kSiteRouterMaxT * hc, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.comb_copy, kSiteRouterMaxT * hc * hc, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.x_inv, kSiteRouterMaxT, 4, "workspace"));
  AFF_RETURN_IF_ERROR(
      alloc(w.gate_parts, kSiteRouterMaxT * kSiteRouterCols * std::max(c.n_routed_experts, 1), 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.site_router_ticket, 1, 4, "workspace"));
  AFF_RETURN_IF_ERROR(
      cuda_status(cudaMemset(w.site_router_ticket.data(), 0, w.site_router_ticket.bytes()), "cudaMemset"));
  if (c.index_n_heads > 0)
    AFF_RETURN_IF_ERROR(alloc(w.iw_parts, kHcSmallT * hc_decode_blocks(D) * c.index_n_heads, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.qr, T * c.q_lora_rank, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.q, T * H * Dh, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.o, T * H * Dh, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.kv, T * Dh, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.u, T * int64_t(c.o_groups) * c.o_lora_rank, 4, "workspace"));
  // A decode step that completes a deferral unit projects its rows at once (compressor_run).
  const int64_t comp_rows = std::max<int64_t>(T, kCompressorDeferRows);
  const int64_t comp_width = 2 * std::max<int64_t>(Dh, c.index_head_dim);
  AFF_RETURN_IF_ERROR(alloc(w.comp_kv, comp_rows * comp_width, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.comp_gate, comp_rows * comp_width, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.icomp_kv, comp_rows * 2 * std::max<int64_t>(c.index_head_dim, 1), 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.icomp_gate, comp_rows * 2 * std::max<int64_t>(c.index_head_dim, 1), 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.iq, T * int64_t(c.index_n_heads) * c.index_head_dim, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.iw, T * int64_t(c.index_n_heads), 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.scores, T * max_idx_entries, 4, "indexer scores"));
  AFF_RETURN_IF_ERROR(alloc(w.sel, T * std::max(c.index_topk, 1), 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.sel_count, T, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.topk_scratch, kTopkScratchWords, 4, "workspace"));
  AFF_RETURN_IF_ERROR(cuda_status(cudaMemset(w.topk_scratch.data(), 0, w.topk_scratch.bytes()), "cudaMemset"));
  AFF_RETURN_IF_ERROR(alloc(w.router_logits, T * int64_t(c.n_routed_experts), 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.route_ids, T * k, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.route_w, T * k, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.pair_w2, T * k, int64_t(sizeof(void*)), "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.act, T * k * c.moe_inter, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.y_pairs, T * k * D, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.y_shared, T * D, 4, "workspace"));
  AFF_RETURN_IF_ERROR(alloc(w.zero_ids, T, 4, "workspace"));
  AFF_RETURN_IF_ERROR(cuda_status(cudaMemset(w.zero_ids.data(), 0, w.zero_ids.bytes()), "cudaMemset"));
  AFF_RETURN_IF_ERROR(alloc(w.logits, std::min(T, kLogitRows) * c.vocab_size, 4, "logits"));
  AFF_RETURN_IF_ERROR(alloc(w.argmax, T, 4, "workspace"));
  AFF_RETURN_IF_ERROR(gpu_state_reserve(*st, std::min(std::max<int64_t>(options.kv_commit, 1), max_positions)));
  return st;
}

void gpu_state_reset(GpuState& state) { state.n_past = 0; }

}  // namespace aff::cuda
