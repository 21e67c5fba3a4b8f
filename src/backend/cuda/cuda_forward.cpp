#include "backend/cuda/cuda_forward.h"

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_layers.h"
#include "backend/cuda/decode_graph.h"
#include "backend/cuda/kernels/gemv/gemv.h"
#include "backend/cuda/kernels/misc/misc.h"
#include "backend/cuda/kernels/norm/norm.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/profile.h"
#include "backend/cuda/runtime/step_info.h"

namespace aff::cuda {
namespace {

Status validate(const DeviceModel& model, const GpuState& state, std::span<const int32_t> tokens,
                const dsv4::ForwardOptions& opts, int& n_layers) {
  const dsv4::ModelConfig& cfg = model.config;
  const int64_t T = int64_t(tokens.size());
  if (T == 0) return invalid_argument("gpu forward: no tokens given");
  if (state.n_past + T > state.max_positions)
    return out_of_range("gpu forward: positions up to " + std::to_string(state.n_past + T) +
                        " exceed the state's capacity of " + std::to_string(state.max_positions));
  for (int64_t t = 0; t < T; ++t)
    if (tokens[size_t(t)] < 0 || tokens[size_t(t)] >= cfg.vocab_size)
      return invalid_argument("gpu forward: token id " + std::to_string(tokens[size_t(t)]) + " at index " +
                              std::to_string(t) + " is outside the vocabulary [0, " +
                              std::to_string(cfg.vocab_size) + ")");
  n_layers = cfg.num_layers;
  if (opts.max_layers >= 0) n_layers = std::min(n_layers, opts.max_layers);
  if (int(model.layers.size()) < n_layers || int(state.layers.size()) < n_layers)
    return internal_error("gpu forward: model has fewer uploaded layers than configured");
  return Status::ok();
}

// Embedding and the layers for the chunk whose tokens and StepInfo are
// already in ws.tokens / st.step; leaves the streams in ws.h. Nothing here may
// branch on the position on the host: a decode step is captured from it once.
Status enqueue_layers(const DeviceModel& model, GpuState& st, int64_t T, int64_t pos0, int n_layers,
                      const dsv4::ForwardOptions& opts) {
  const dsv4::ModelConfig& cfg = model.config;
  const int64_t D = cfg.hidden_size;
  cudaStream_t s = st.stream.get();
  Workspace& ws = st.ws;
  float* h = ws.h.as<float>();
  float* x = ws.x.as<float>();
  float* y = ws.y.as<float>();
  prof_mark(s, "start");
  AFF_RETURN_IF_ERROR(embed_rows(model.embed, model.embed_format, ws.tokens.as<int32_t>(), T, D, cfg.hc_mult, h, s));
  prof_mark(s, "embed");
  // Each mHC site also applies the previous sublayer's hc_post (y into h): the
  // last layer's is applied by the head (run_head), so y must survive until then.
  for (int l = 0; l < n_layers; ++l) {
    const DeviceLayer& lw = model.layers[size_t(l)];
    AFF_RETURN_IF_ERROR(gpu_prefetch_query_weights(model, l, st, T));
    // Each site may leave its comb's Sinkhorn to the launch after it (job).
    HcCombJob job;
    // The site also computes what the attention's side work reads (x rings, the indexer's head weights).
    const HcSiteFeeds feeds = ablated("mhc") ? HcSiteFeeds{} : gpu_attention_site_feeds(model, l, st, T);
    // Decode: the MoE site and the router in one launch, fed copies the first site keeps.
    const bool site_router = gpu_site_router_takes(model, l, T, opts.no_routed_experts);
    AFF_RETURN_IF_ERROR(gpu_hc_site(model, lw.hc_attn, st, h, l > 0 ? y : nullptr, 0, T, false, lw.attn_norm, x,
                                    &job, feeds, site_router ? gpu_site_copies(st) : HcCopies{}));
    prof_mark(s, "mhc");
    if (site_router) AFF_RETURN_IF_ERROR(gpu_site_router_streams(model, l, st, h, T, x, ws.tokens.as<int32_t>()));
    AFF_RETURN_IF_ERROR(gpu_attention(model, l, st, x, T, pos0, y, job, feeds));
    if (site_router) {
      job = HcCombJob{};  // the launch finishes its own comb
      AFF_RETURN_IF_ERROR(gpu_hc_site_router(model, l, st, h, y, T, x, ws.tokens.as<int32_t>()));
    } else {
      AFF_RETURN_IF_ERROR(gpu_hc_site(model, lw.hc_ffn, st, h, y, 0, T, false, lw.ffn_norm, x, &job));
      prof_mark(s, "mhc");
    }
    AFF_RETURN_IF_ERROR(
        gpu_moe(model, l, st, ws.tokens.as<int32_t>(), x, T, opts.no_routed_experts, y, job, site_router));
  }
  return gpu_prefetch_join(st);
}

// One chunk through embedding and the layers, launch by launch.
Status run_layers(const DeviceModel& model, GpuState& st, std::span<const int32_t> tokens, int n_layers,
                  const dsv4::ForwardOptions& opts) {
  const int64_t T = int64_t(tokens.size()), pos0 = st.n_past;
  cudaStream_t s = st.stream.get();
  AFF_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(st.ws.tokens.data(), tokens.data(), size_t(T) * 4, cudaMemcpyHostToDevice, s));
  AFF_RETURN_IF_ERROR(gpu_begin_chunk(st, pos0, T));
  AFF_RETURN_IF_ERROR(enqueue_layers(model, st, T, pos0, n_layers, opts));
  st.n_past = pos0 + T;
  return Status::ok();
}

// Final collapse and norm for rows [first, T) of ws.h into ws.x (row r of
// ws.x is row first + r). Runs right after the chunk's layers: it also
// applies the last layer's hc_post (ws.y into ws.h) for the rows it reads.
Status run_head_norm(const DeviceModel& model, GpuState& st, int n_layers, int64_t first, int64_t T) {
  AFF_RETURN_IF_ERROR(gpu_hc_site(model, model.hc_head, st, st.ws.h.as<float>(),
                                  n_layers > 0 ? st.ws.y.as<float>() : nullptr, first, T - first, true, model.norm,
                                  st.ws.x.as<float>()));
  prof_mark(st.stream.get(), "head.mhc");
  return Status::ok();
}

// The head for n <= kLogitRows rows of ws.x from row r: ws.logits [n, vocab].
Status run_head_rows(const DeviceModel& model, GpuState& st, int64_t r, int64_t n) {
  if (n > kLogitRows) return internal_error("head: more rows than the logits workspace");
  const float* x = st.ws.x.as<float>() + r * model.config.hidden_size;
  if (!ablated("head")) AFF_RETURN_IF_ERROR(linear(model.head, x, n, st.ws.logits.as<float>(), st.stream.get()));
  prof_mark(st.stream.get(), "head.gemv");
  return Status::ok();
}

// The last row's logits into ws.logits row 0.
Status run_head(const DeviceModel& model, GpuState& st, int n_layers, int64_t T) {
  AFF_RETURN_IF_ERROR(run_head_norm(model, st, n_layers, T - 1, T));
  return run_head_rows(model, st, 0, 1);
}

// The whole decode step for one token as enqueued work: inputs from the
// pinned I/O block, layers, head, and either the argmax or the logits row
// back into pinned memory.
Status enqueue_decode(const DeviceModel& model, GpuState& st, DecodeGraph& g, int n_layers,
                      const dsv4::ForwardOptions& opts, bool greedy) {
  cudaStream_t s = st.stream.get();
  const int64_t V = model.config.vocab_size;
  AFF_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(st.step.data(), &g.io()->step, sizeof(StepInfo), cudaMemcpyHostToDevice, s));
  AFF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(st.ws.tokens.data(), &g.io()->token, 4, cudaMemcpyHostToDevice, s));
  // The position is only used by host-side checks here; kernels read StepInfo.
  AFF_RETURN_IF_ERROR(enqueue_layers(model, st, 1, g.io()->step.pos0, n_layers, opts));
  AFF_RETURN_IF_ERROR(run_head(model, st, n_layers, 1));
  if (greedy) {
    AFF_RETURN_IF_ERROR(argmax_rows(st.ws.logits.as<float>(), 1, V, st.ws.argmax.as<int32_t>(), s));
    AFF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&g.io()->argmax, st.ws.argmax.data(), 4, cudaMemcpyDeviceToHost, s));
  } else {
    AFF_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(g.logits(), st.ws.logits.data(), size_t(V) * 4, cudaMemcpyDeviceToHost, s));
  }
  return Status::ok();
}

// One token at position n_past through the captured graph (captured now if
// the graph is missing or was made for other options). On return the
// results are in the graph's pinned I/O block and logits row.
Status decode_step(const DeviceModel& model, GpuState& st, int32_t token, int n_layers,
                   const dsv4::ForwardOptions& opts, bool greedy) {
  if (!st.decode_graph) st.decode_graph = std::make_shared<DecodeGraph>();
  DecodeGraph& g = *st.decode_graph;
  AFF_RETURN_IF_ERROR(g.prepare(model.config.vocab_size));
  cudaStream_t s = st.stream.get();
  // The previous step's replay may still read the I/O block: wait before rewriting it.
  AFF_RETURN_IF_ERROR(st.stream.synchronize());
  // Back the caches for the new position on the host (a replay only sees the addresses).
  AFF_RETURN_IF_ERROR(gpu_state_reserve(st, st.n_past + 1));
  g.io()->step = StepInfo{st.n_past, 1};
  g.io()->token = token;
  const DecodeGraphKey key{&model, n_layers, opts.no_routed_experts, greedy, gpu_decode_shape(st.n_past)};
  if (!decode_graph_enabled() || profiling_enabled() || (!g.ready_for(key) && !g.warmed_for(key))) {
    AFF_RETURN_IF_ERROR(enqueue_decode(model, st, g, n_layers, opts, greedy));
    g.mark_warmed(key);
  } else {
    if (!g.ready_for(key)) {
      AFF_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
      const Status captured = enqueue_decode(model, st, g, n_layers, opts, greedy);
      if (!captured.is_ok()) {
        DecodeGraph::abandon_capture(s);
        return captured;
      }
      AFF_RETURN_IF_ERROR(g.finish_capture(s, key));
    }
    AFF_RETURN_IF_ERROR(g.launch(s, key));
  }
  AFF_RETURN_IF_ERROR(st.stream.synchronize());
  prof_step_end(s);
  st.n_past += 1;
  return Status::ok();
}

}  // namespace

Status gpu_forward(const DeviceModel& model, GpuState& state, std::span<const int32_t> tokens,
                   bool all_positions, std::vector<float>& logits, const dsv4::ForwardOptions& opts) {
  int n_layers = 0;
  AFF_RETURN_IF_ERROR(validate(model, state, tokens, opts, n_layers));
  const int64_t V = model.config.vocab_size;
  logits.clear();
  if (tokens.size() == 1) {
    AFF_RETURN_IF_ERROR(decode_step(model, state, tokens[0], n_layers, opts, /*greedy=*/false));
    logits.assign(state.decode_graph->logits(), state.decode_graph->logits() + V);
    return Status::ok();
  }
  for (size_t i = 0; i < tokens.size(); i += size_t(state.max_chunk)) {
    const size_t n = std::min(tokens.size() - i, size_t(state.max_chunk));
    const bool last = i + n == tokens.size();
    AFF_RETURN_IF_ERROR(run_layers(model, state, tokens.subspan(i, n), n_layers, opts));
    if (!all_positions && !last) continue;
    const int64_t first = all_positions ? 0 : int64_t(n) - 1, n_out = int64_t(n) - first;
    AFF_RETURN_IF_ERROR(run_head_norm(model, state, n_layers, first, int64_t(n)));
    const size_t base = logits.size();
    logits.resize(base + size_t(n_out * V));
    // In passes of kLogitRows: each pass's copy is ordered before the next
    // pass overwrites ws.logits (one stream).
    for (int64_t r = 0; r < n_out; r += kLogitRows) {
      const int64_t m = std::min(kLogitRows, n_out - r);
      AFF_RETURN_IF_ERROR(run_head_rows(model, state, r, m));
      AFF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logits.data() + base + size_t(r * V), state.ws.logits.data(),
                                               size_t(m * V) * 4, cudaMemcpyDeviceToHost, state.stream.get()));
    }
    AFF_RETURN_IF_ERROR(state.stream.synchronize());
  }
  return Status::ok();
}

Result<int32_t> gpu_forward_greedy(const DeviceModel& model, GpuState& state, std::span<const int32_t> tokens,
                                   const dsv4::ForwardOptions& opts) {
  int n_layers = 0;
  AFF_RETURN_IF_ERROR(validate(model, state, tokens, opts, n_layers));
  if (tokens.size() == 1) {
    AFF_RETURN_IF_ERROR(decode_step(model, state, tokens[0], n_layers, opts, /*greedy=*/true));
    return state.decode_graph->io()->argmax;
  }
  size_t n = 0;
  for (size_t i = 0; i < tokens.size(); i += n) {
    n = std::min(tokens.size() - i, size_t(state.max_chunk));
    AFF_RETURN_IF_ERROR(run_layers(model, state, tokens.subspan(i, n), n_layers, opts));
  }
  AFF_RETURN_IF_ERROR(run_head(model, state, n_layers, int64_t(n)));
  cudaStream_t s = state.stream.get();
  AFF_RETURN_IF_ERROR(argmax_rows(state.ws.logits.as<float>(), 1, model.config.vocab_size,
                                  state.ws.argmax.as<int32_t>(), s));
  int32_t id = 0;
  AFF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&id, state.ws.argmax.data(), 4, cudaMemcpyDeviceToHost, s));
  AFF_RETURN_IF_ERROR(state.stream.synchronize());
  return id;
}

}  // namespace aff::cuda
