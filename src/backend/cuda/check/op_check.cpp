#include "backend/cuda/check/op_check.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <random>

#include <fmt/format.h>

#include "backend/cuda/cuda_forward.h"
#include "backend/cuda/cuda_layers.h"
#include "backend/cuda/gpu_state.h"
#include "backend/cuda/kernels/gemv/gemv.h"
#include "backend/cuda/kernels/moe/moe.h"
#include "backend/cuda/kernels/norm/norm.h"
#include "backend/cuda/kernels/rope/rope.h"
#include "backend/cpu/linear_fast.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/ref/linear.h"
#include "backend/ref/norm.h"
#include "backend/ref/rope.h"
#include "model/dsv4/attention.h"
#include "model/dsv4/forward.h"
#include "model/dsv4/mhc.h"
#include "model/dsv4/moe.h"
#include "model/dsv4/routing_margin.h"
#include "model/dsv4/state.h"

namespace aff::cuda {

double rel_rms(const float* got, const float* want, size_t n) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double d = double(got[i]) - double(want[i]);
    num += d * d;
    den += double(want[i]) * double(want[i]);
  }
  if (std::isnan(num)) return INFINITY;
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num / double(std::max<size_t>(n, 1)));
}

std::vector<OpResult> worst_per_op(const std::vector<OpResult>& results) {
  std::vector<OpResult> out;
  for (const OpResult& r : results) {
    auto it = std::find_if(out.begin(), out.end(), [&](const OpResult& o) { return o.op == r.op; });
    if (it == out.end()) out.push_back(r);
    else if (r.error > it->error || (r.error == it->error && !r.ok())) *it = r;
  }
  return out;
}

namespace {

const char* format_name(dsv4::WeightFormat f) {
  switch (f) {
    case dsv4::WeightFormat::kF32: return "f32";
    case dsv4::WeightFormat::kBF16: return "bf16";
    case dsv4::WeightFormat::kF16: return "f16";
    case dsv4::WeightFormat::kFP8Block: return "fp8";
    case dsv4::WeightFormat::kMXFP4: return "mxfp4";
    case dsv4::WeightFormat::kGgml: return "ggml";
  }
  return "?";
}

class Checker {
 public:
  Checker(const dsv4::LoadedModel& m, const DeviceModel& d, const OpCheckOptions& o)
      : model_(m), dev_(d), cfg_(m.config), opts_(o), rng_(o.seed) {}

  Status run() {
    AFF_RETURN_IF_ERROR(check_linears());
    AFF_RETURN_IF_ERROR(check_norm_rope());
    AFF_RETURN_IF_ERROR(check_mhc());
    for (int l = 0; l < cfg_.num_layers; ++l) AFF_RETURN_IF_ERROR(check_moe(l));
    for (int l = 0; l < cfg_.num_layers; ++l) AFF_RETURN_IF_ERROR(check_attention(l));
    return check_model();
  }
  std::vector<OpResult> results;

 private:
  void add(std::string op, std::string detail, double err, double tol) {
    results.push_back({std::move(op), std::move(detail), err, tol});
    if (opts_.on_result) opts_.on_result(results.back());
  }

  std::vector<float> randn(int64_t n, float sd = 1.0f) {
    std::normal_distribution<float> d(0.0f, sd);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = d(rng_);
    return v;
  }

  Result<std::vector<float>> down(const float* p, int64_t n) { return download_vector(p, size_t(n), "op check"); }

  // kTolRounded when any of the weights takes a rounding path (int8 activations
  // on the GEMV, bf16 weights in the prefill GEMM: ggml and kQ8), else kTolOpF32.
  static double tol_for(std::initializer_list<const DeviceLinear*> ws) {
    for (const DeviceLinear* w : ws)
      if (w->weight != nullptr && (w->format == DevFormat::kGgml || w->format == DevFormat::kQ8)) return kTolRounded;
    return kTolOpF32;
  }

  // tol_for over an attention's projections.
  static double attention_tol(const DeviceAttention& a) {
    return tol_for({&a.wq_a, &a.wq_b, &a.wkv, &a.wo_a, &a.wo_b, &a.indexer.wq_b});
  }

  // kTolRounded when a MoE's routed experts are ggml-stored or its shared expert
  // takes a rounding path, else kTolOpF32.
  static double moe_tol(const DeviceMoe& m) {
    if (!m.host_slots.empty() && m.expert_format == DevFormat::kGgml) return kTolRounded;
    return m.has_shared ? tol_for({&m.shared_host.w1}) : kTolOpF32;
  }

  // Whether any weight of the forward pass takes a rounding path (tol_for).
  bool model_rounded() const {
    if (tol_for({&dev_.head}) == kTolRounded) return true;
    for (const DeviceLayer& d : dev_.layers)
      if (attention_tol(d.attn) == kTolRounded || moe_tol(d.ffn) == kTolRounded) return true;
    return false;
  }

  Status linear_one(const dsv4::Linear& w, const DeviceLinear& d, const std::string& what) {
    if (!w.valid()) return Status::ok();
    const int64_t T = opts_.tokens;
    const std::vector<float> x = randn(T * w.in);
    std::vector<float> want(size_t(T * w.out));
    ref::linear(w, x.data(), T, want.data());
    AFF_ASSIGN_OR_RETURN(DeviceBuffer dx, upload_vector(x, "op check"));
    AFF_ASSIGN_OR_RETURN(DeviceBuffer dy, DeviceBuffer::allocate(want.size() * 4, "op check"));
    AFF_RETURN_IF_ERROR(gemv_f32(d, dx.as<float>(), T, dy.as<float>(), nullptr));
    AFF_ASSIGN_OR_RETURN(std::vector<float> got, down(dy.as<float>(), T * w.out));
    // (the GEMV at opts_.tokens rows reads kQ8 exactly)
    add(std::string("linear.") + format_name(w.format), what, rel_rms(got.data(), want.data(), got.size()),
        d.format == DevFormat::kGgml ? kTolRounded : kTolOpF32);
    return Status::ok();
  }

  Status check_linears() {
    AFF_RETURN_IF_ERROR(linear_one(model_.weights.head, dev_.head, "head"));
    for (int l = 0; l < cfg_.num_layers; ++l) {
      const dsv4::LayerWeights& w = model_.weights.layers[size_t(l)];
      const DeviceLayer& d = dev_.layers[size_t(l)];
      const std::string p = "layer " + std::to_string(l) + " ";
      AFF_RETURN_IF_ERROR(linear_one(w.attn.wq_a, d.attn.wq_a, p + "wq_a"));
      AFF_RETURN_IF_ERROR(linear_one(w.attn.wq_b, d.attn.wq_b, p + "wq_b"));
      AFF_RETURN_IF_ERROR(linear_one(w.attn.wkv, d.attn.wkv, p + "wkv"));
      AFF_RETURN_IF_ERROR(linear_one(w.attn.wo_a, d.attn.wo_a, p + "wo_a"));
      AFF_RETURN_IF_ERROR(linear_one(w.attn.wo_b, d.attn.wo_b, p + "wo_b"));
      if (w.attn.compressor.present) {
        AFF_RETURN_IF_ERROR(linear_one(w.attn.compressor.wkv, d.attn.compressor.wkv, p + "compressor.wkv"));
        AFF_RETURN_IF_ERROR(linear_one(w.attn.compressor.wgate, d.attn.compressor.wgate, p + "compressor.wgate"));
      }
      if (w.attn.indexer.present) {
        AFF_RETURN_IF_ERROR(linear_one(w.attn.indexer.wq_b, d.attn.indexer.wq_b, p + "indexer.wq_b"));
        AFF_RETURN_IF_ERROR(
            linear_one(w.attn.indexer.weights_proj, d.attn.indexer.weights_proj, p + "indexer.weights_proj"));
      }
      AFF_RETURN_IF_ERROR(linear_one(w.ffn.gate, d.ffn.gate, p + "router"));
      const size_t E = w.ffn.experts.size();
      std::vector<size_t> picks;
      for (int i = 0; i < opts_.experts_per_layer && size_t(i) < E; ++i)
        picks.push_back(i == 0 ? 0 : E - size_t(i));
      for (size_t e : picks) {
        const std::string q = p + "expert " + std::to_string(e) + " ";
        AFF_RETURN_IF_ERROR(linear_one(w.ffn.experts[e].w1, d.ffn.host_slots[e].w1, q + "w1"));
        AFF_RETURN_IF_ERROR(linear_one(w.ffn.experts[e].w3, d.ffn.host_slots[e].w3, q + "w3"));
        AFF_RETURN_IF_ERROR(linear_one(w.ffn.experts[e].w2, d.ffn.host_slots[e].w2, q + "w2"));
      }
    }
    return Status::ok();
  }

  Status check_norm_rope() {
    const int64_t T = opts_.tokens, D = cfg_.hidden_size, H = cfg_.num_heads, Dh = cfg_.head_dim;
    const float eps = float(cfg_.rms_norm_eps);
    {  // weighted norm over D, unweighted per-head norm over Dh
      AFF_ASSIGN_OR_RETURN(std::vector<float> wn, tensor_f32_host(model_.weights.layers[0].attn_norm));
      std::vector<float> x = randn(T * D, 3.0f), want = x;
      ref::rmsnorm(want.data(), T, D, wn.data(), eps);
      AFF_ASSIGN_OR_RETURN(DeviceBuffer dx, upload_vector(x, "op check"));
      AFF_ASSIGN_OR_RETURN(DeviceBuffer dw, upload_vector(wn, "op check"));
      AFF_RETURN_IF_ERROR(rmsnorm_f32(dx.as<float>(), dx.as<float>(), T, D, dw.as<float>(), eps, nullptr));
      AFF_ASSIGN_OR_RETURN(std::vector<float> got, down(dx.as<float>(), T * D));
      add("rmsnorm", "weighted, D", rel_rms(got.data(), want.data(), got.size()), kTolOpF32);
      std::vector<float> q = randn(T * H * Dh), qwant = q;
      ref::rmsnorm(qwant.data(), T * H, Dh, nullptr, eps);
      AFF_ASSIGN_OR_RETURN(DeviceBuffer dq, upload_vector(q, "op check"));
      AFF_RETURN_IF_ERROR(rmsnorm_f32(dq.as<float>(), dq.as<float>(), T * H, Dh, nullptr, eps, nullptr));
      AFF_ASSIGN_OR_RETURN(std::vector<float> qgot, down(dq.as<float>(), T * H * Dh));
      add("rmsnorm", "unweighted, per head", rel_rms(qgot.data(), qwant.data(), qgot.size()), kTolOpF32);
    }
    // RoPE with the compressed layers' (YaRN) frequencies at far positions, both directions.
    ref::YarnParams yarn;
    yarn.factor = cfg_.rope_scaling.factor;
    yarn.original_max_position = cfg_.rope_scaling.original_max_position;
    yarn.beta_fast = cfg_.rope_scaling.beta_fast;
    yarn.beta_slow = cfg_.rope_scaling.beta_slow;
    const std::vector<float> inv =
        ref::rope_inv_freq(cfg_.compress_rope_theta, cfg_.rope_dim, cfg_.rope_scaling.yarn ? &yarn : nullptr);
    AFF_ASSIGN_OR_RETURN(DeviceBuffer dinv, upload_vector(inv, "op check"));
    for (bool inverse : {false, true}) {
      const int64_t pos0 = 65531;
      std::vector<float> v = randn(T * H * Dh), want = v;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H; ++h)
          ref::rope_apply(want.data() + (t * H + h) * Dh + Dh - cfg_.rope_dim, inv, pos0 + t, inverse);
      AFF_ASSIGN_OR_RETURN(DeviceBuffer dv, upload_vector(v, "op check"));
      RopeArgs a;
      a.x = dv.as<float>(), a.rows = T * H, a.stride = Dh, a.offset = Dh - cfg_.rope_dim;
      a.inv_freq = dinv.as<float>(), a.half = cfg_.rope_dim / 2, a.rows_per_pos = int(H), a.pos0 = pos0;
      a.inverse = inverse;
      AFF_RETURN_IF_ERROR(rope_f32(a, nullptr));
      AFF_ASSIGN_OR_RETURN(std::vector<float> got, down(dv.as<float>(), T * H * Dh));
      add("rope", inverse ? "inverse, yarn" : "forward, yarn", rel_rms(got.data(), want.data(), got.size()),
          kTolOpF32);
    }
    return Status::ok();
  }

  Status check_mhc() {
    const int64_t T = opts_.tokens, D = cfg_.hidden_size, hc = cfg_.hc_mult;
    AFF_ASSIGN_OR_RETURN(auto st, make_gpu_state(dev_, T, T));
    for (int l = 0; l < std::min(cfg_.num_layers, 2); ++l) {
      const std::string detail = "layer " + std::to_string(l);
      std::vector<float> h = randn(T * hc * D), x(size_t(T * D));
      dsv4::HcMix mix;
      dsv4::hc_pre(cfg_, model_.weights.layers[size_t(l)].hc_attn, h.data(), T, x.data(), mix);
      AFF_ASSIGN_OR_RETURN(DeviceBuffer dh, upload_vector(h, "op check"));
      AFF_ASSIGN_OR_RETURN(DeviceBuffer dx, DeviceBuffer::allocate(x.size() * 4, "op check"));
      AFF_RETURN_IF_ERROR(gpu_hc_pre(dev_, dev_.layers[size_t(l)].hc_attn, *st, dh.as<float>(), T, dx.as<float>()));
      AFF_ASSIGN_OR_RETURN(std::vector<float> gx, down(dx.as<float>(), T * D));
      AFF_ASSIGN_OR_RETURN(std::vector<float> gpost, down(st->ws.post.as<float>(), T * hc));
      AFF_ASSIGN_OR_RETURN(std::vector<float> gcomb, down(st->ws.comb.as<float>(), T * hc * hc));
      add("mhc.pre", detail, rel_rms(gx.data(), x.data(), gx.size()), kTolOpF32);
      add("mhc.post_weights", detail, rel_rms(gpost.data(), mix.post.data(), gpost.size()), kTolOpF32);
      add("mhc.sinkhorn", detail, rel_rms(gcomb.data(), mix.comb.data(), gcomb.size()), kTolOpF32);

      const std::vector<float> a = randn(T * D);
      dsv4::hc_post(cfg_, mix, a.data(), T, h.data());
      AFF_ASSIGN_OR_RETURN(DeviceBuffer da, upload_vector(a, "op check"));
      AFF_RETURN_IF_ERROR(gpu_hc_post(dev_, *st, da.as<float>(), T, dh.as<float>()));
      AFF_ASSIGN_OR_RETURN(std::vector<float> gh, down(dh.as<float>(), T * hc * D));
      add("mhc.post", detail, rel_rms(gh.data(), h.data(), gh.size()), kTolOpF32);
    }
    std::vector<float> h = randn(T * hc * D), y(size_t(T * D));
    dsv4::hc_head(cfg_, model_.weights.hc_head, h.data(), T, y.data());
    AFF_ASSIGN_OR_RETURN(DeviceBuffer dh, upload_vector(h, "op check"));
    AFF_ASSIGN_OR_RETURN(DeviceBuffer dy, DeviceBuffer::allocate(y.size() * 4, "op check"));
    AFF_RETURN_IF_ERROR(gpu_hc_head(dev_, *st, dh.as<float>(), T, dy.as<float>()));
    AFF_RETURN_IF_ERROR(st->stream.synchronize());
    AFF_ASSIGN_OR_RETURN(std::vector<float> gy, down(dy.as<float>(), T * D));
    add("mhc.head", "hc_head", rel_rms(gy.data(), y.data(), gy.size()), kTolOpF32);
    return Status::ok();
  }

  // Inputs as they reach the router and experts: an RMS-normed row.
  std::vector<float> normed_rows(int64_t T, const TensorView& w) {
    std::vector<float> x = randn(T * cfg_.hidden_size);
    auto wn = tensor_f32_host(w);
    ref::rmsnorm(x.data(), T, cfg_.hidden_size, wn.is_ok() ? wn->data() : nullptr, float(cfg_.rms_norm_eps));
    return x;
  }

  Status check_moe(int l) {
    const int64_t T = opts_.tokens, D = cfg_.hidden_size;
    const int k = cfg_.n_experts_per_tok;
    const std::string detail = "layer " + std::to_string(l);
    const dsv4::LayerWeights& lw = model_.weights.layers[size_t(l)];
    const bool hash = cfg_.is_hash_layer(l);
    const std::vector<float> x = normed_rows(T, lw.ffn_norm);
    std::vector<int32_t> tokens(static_cast<size_t>(T));
    std::uniform_int_distribution<int32_t> tok(0, int32_t(cfg_.vocab_size - 1));
    for (int32_t& t : tokens) t = tok(rng_);

    dsv4::Routing routing;
    AFF_RETURN_IF_ERROR(dsv4::moe_route(cfg_, lw.ffn, hash, tokens.data(), x.data(), T, routing));
    std::vector<float> want(size_t(T * D));
    AFF_RETURN_IF_ERROR(dsv4::moe_forward(cfg_, lw.ffn, hash, tokens.data(), x.data(), T, false, want.data()));

    AFF_ASSIGN_OR_RETURN(auto st, make_gpu_state(dev_, T, T));
    AFF_ASSIGN_OR_RETURN(DeviceBuffer dx, upload_vector(x, "op check"));
    AFF_ASSIGN_OR_RETURN(DeviceBuffer dt, upload_vector(tokens, "op check"));
    AFF_ASSIGN_OR_RETURN(DeviceBuffer dy, DeviceBuffer::allocate(want.size() * 4, "op check"));
    AFF_RETURN_IF_ERROR(gpu_moe(dev_, l, *st, dt.as<int32_t>(), dx.as<float>(), T, false, dy.as<float>()));
    AFF_RETURN_IF_ERROR(st->stream.synchronize());
    // gpu_moe leaves its routing in the workspace.
    AFF_ASSIGN_OR_RETURN(std::vector<int32_t> ids, download_vector(st->ws.route_ids.as<int32_t>(), size_t(T * k), "op check"));
    AFF_ASSIGN_OR_RETURN(std::vector<float> wts, down(st->ws.route_w.as<float>(), T * k));
    int64_t differ = 0;
    std::vector<float> wts_aligned(wts.size(), 0.0f);
    for (int64_t t = 0; t < T; ++t)
      for (int i = 0; i < k; ++i) {
        // Same set, any order: align the GPU weights to the CPU's expert order.
        const int32_t e = routing.experts[size_t(t * k + i)];
        int found = -1;
        for (int j = 0; j < k; ++j)
          if (ids[size_t(t * k + j)] == e) found = j;
        if (found < 0) ++differ;
        else wts_aligned[size_t(t * k + i)] = wts[size_t(t * k + found)];
      }
    add("router.ids", detail, double(differ) / double(T * k), kTolDiscrete);
    add("router.weights", detail, rel_rms(wts_aligned.data(), routing.weights.data(), wts.size()), kTolOpF32);
    AFF_ASSIGN_OR_RETURN(std::vector<float> got, down(dy.as<float>(), T * D));
    add("moe", detail + (hash ? " (hash)" : ""), rel_rms(got.data(), want.data(), got.size()),
        moe_tol(dev_.layers[size_t(l)].ffn));
    return Status::ok();
  }

  Status check_attention(int l) {
    const int64_t D = cfg_.hidden_size;
    const int ratio = cfg_.compress_ratio(l);
    const std::string kind = ratio == 0 ? "swa" : ratio == 4 ? "csa" : "hca";
    // A first chunk long enough to complete entries and wrap the window ring,
    // then a short chunk and two decode steps.
    const int64_t first = std::max<int64_t>(2 * ratio + 3, cfg_.sliding_window + 3) | 1;
    const std::vector<int64_t> chunks = {first, 3, 1, 1};
    int64_t total = 0;
    for (int64_t c : chunks) total += c;
    const dsv4::LayerWeights& lw = model_.weights.layers[size_t(l)];
    const std::vector<float> x = normed_rows(total, lw.attn_norm);

    auto cpu = dsv4::make_state(model_, total);
    AFF_ASSIGN_OR_RETURN(auto gpu, make_gpu_state(dev_, total, first));
    AFF_ASSIGN_OR_RETURN(DeviceBuffer dx, upload_vector(x, "op check"));
    AFF_ASSIGN_OR_RETURN(DeviceBuffer dy, DeviceBuffer::allocate(size_t(first * D) * 4, "op check"));
    int64_t pos = 0;
    for (int64_t T : chunks) {
      std::vector<float> want(size_t(T * D));
      dsv4::attention_forward(cfg_, lw.attn, l, *cpu, cpu->layers[size_t(l)], x.data() + pos * D, T, pos, want.data());
      AFF_RETURN_IF_ERROR(gpu_begin_chunk(*gpu, pos, T));
      AFF_RETURN_IF_ERROR(gpu_attention(dev_, l, *gpu, dx.as<float>() + pos * D, T, pos, dy.as<float>()));
      AFF_RETURN_IF_ERROR(gpu->stream.synchronize());
      AFF_ASSIGN_OR_RETURN(std::vector<float> got, down(dy.as<float>(), T * D));
      add("attention." + kind, "layer " + std::to_string(l) + " positions " + std::to_string(pos) + "+" +
                                   std::to_string(T),
          rel_rms(got.data(), want.data(), got.size()), attention_tol(dev_.layers[size_t(l)].attn));
      pos += T;
    }
    const dsv4::LayerState& cl = cpu->layers[size_t(l)];
    const GpuLayerState& gl = gpu->layers[size_t(l)];
    auto entries = [&](const dsv4::CompressorState& c, const GpuCompressorState& g, const char* op) -> Status {
      if (c.n_entries == 0) return Status::ok();
      AFF_ASSIGN_OR_RETURN(std::vector<float> got, down(g.entries.as<float>(), int64_t(c.entries.size())));
      add(op, "layer " + std::to_string(l) + ", " + std::to_string(c.n_entries) + " entries",
          rel_rms(got.data(), c.entries.data(), got.size()), kTolOpF32);
      return Status::ok();
    };
    if (lw.attn.compressor.present) AFF_RETURN_IF_ERROR(entries(cl.kv_comp, gl.kv, "compressor.entries"));
    if (lw.attn.indexer.present) AFF_RETURN_IF_ERROR(entries(cl.index_comp, gl.idx, "indexer.keys"));
    return Status::ok();
  }

  // Tokens for the whole-model checks (prefill, then the decode steps' tokens)
  // whose learned routing clears opts_.routing_margin on the CPU reference (see
  // OpCheckOptions), reported as "model.routing_margin". Attempt 0 continues
  // the checker's stream, so a seed replays the tokens it drew before the
  // margin existed; attempt a > 0 draws from seed + a.
  Result<std::vector<int32_t>> model_tokens() {
    std::uniform_int_distribution<int32_t> tok(0, int32_t(cfg_.vocab_size - 1));
    const int64_t total = opts_.model_tokens + opts_.decode_steps;
    const int attempts = std::max(1, opts_.routing_attempts);
    std::vector<int32_t> tokens(static_cast<size_t>(total)), best;
    dsv4::RoutingMargin best_m;
    int best_attempt = -1;
    std::string rejected;  // earlier draws' gaps
    for (int a = 0; a < attempts; ++a) {
      std::mt19937_64 derived(opts_.seed + uint64_t(a));
      std::mt19937_64& r = a == 0 ? rng_ : derived;
      for (int32_t& t : tokens) t = tok(r);
      AFF_ASSIGN_OR_RETURN(dsv4::RoutingMargin m, dsv4::routing_margin(model_, tokens, opts_.model_tokens));
      if (best_attempt < 0 || m.gap > best_m.gap) best = tokens, best_m = m, best_attempt = a;
      if (m.gap >= opts_.routing_margin) break;
      rejected += fmt::format("{}{:.3e}", rejected.empty() ? "" : ", ", m.gap);
    }
    const bool ok = best_m.gap >= opts_.routing_margin;
    std::string detail;
    if (best_m.decisions == 0) {
      detail = "no learned-router layer";
    } else {
      detail = ok ? fmt::format("attempt {} (of up to {})", best_attempt, attempts)
                  : fmt::format("no draw of {} clears {:.3e}; widest: attempt {}", attempts, opts_.routing_margin,
                                best_attempt);
      detail += fmt::format(", min gap {:.3e} at layer {} position {} (k-th selected expert {} vs runner-up {}, {} decisions)",
                            best_m.gap, best_m.layer, best_m.position, best_m.last_selected, best_m.runner_up,
                            best_m.decisions);
      if (!rejected.empty()) detail += "; rejected draws' gaps " + rejected;
      if (!ok) detail += "; the model checks ran on the widest draw";
    }
    add("model.routing_margin", detail, ok ? 0.0 : 1.0, kTolDiscrete);
    return best;
  }

  Status check_model() {
    const int L = cfg_.num_layers;
    std::vector<int> depths = {1, (L + 1) / 2, L};
    depths.erase(std::unique(depths.begin(), depths.end()), depths.end());
    const int64_t total = opts_.model_tokens + opts_.decode_steps;
    AFF_ASSIGN_OR_RETURN(const std::vector<int32_t> tokens, model_tokens());
    for (int depth : depths) {
      dsv4::ForwardOptions fo;
      fo.max_layers = depth;
      const bool whole = depth == L;
      const std::string op = whole ? "forward" : "layers";
      const double tol = model_rounded() ? kTolRounded : whole ? kTolModelF32 : kTolOpF32;
      const std::string detail = std::to_string(depth) + " of " + std::to_string(L) + " layers";
      auto cpu = dsv4::make_state(model_, total);
      AFF_ASSIGN_OR_RETURN(auto gpu, make_gpu_state(dev_, total, opts_.max_chunk));
      const std::span<const int32_t> all(tokens);
      std::vector<float> want, got;
      AFF_RETURN_IF_ERROR(dsv4::forward(model_, *cpu, all.first(size_t(opts_.model_tokens)), true, want, fo));
      AFF_RETURN_IF_ERROR(gpu_forward(dev_, *gpu, all.first(size_t(opts_.model_tokens)), true, got, fo));
      add(op + ".prefill", detail, rel_rms(got.data(), want.data(), want.size()), tol);
      int64_t greedy_differ = 0;
      for (int s = 0; s < opts_.decode_steps; ++s) {
        const auto one = all.subspan(size_t(opts_.model_tokens + s), 1);
        AFF_RETURN_IF_ERROR(dsv4::forward(model_, *cpu, one, false, want, fo));
        if (whole && s + 1 == opts_.decode_steps) {  // the last step through the on-device argmax
          AFF_ASSIGN_OR_RETURN(int32_t g, gpu_forward_greedy(dev_, *gpu, one, fo));
          greedy_differ += g != int32_t(std::max_element(want.begin(), want.end()) - want.begin());
          continue;
        }
        AFF_RETURN_IF_ERROR(gpu_forward(dev_, *gpu, one, false, got, fo));
        add(op + ".decode", detail + ", step " + std::to_string(s), rel_rms(got.data(), want.data(), want.size()),
            tol);
      }
      if (whole) add("forward.greedy", detail, double(greedy_differ), kTolDiscrete);
    }
    return Status::ok();
  }

  const dsv4::LoadedModel& model_;
  const DeviceModel& dev_;
  const dsv4::ModelConfig& cfg_;
  OpCheckOptions opts_;
  std::mt19937_64 rng_;
};

}  // namespace

Result<std::vector<OpResult>> check_ops(const dsv4::LoadedModel& model, const DeviceModel& dev,
                                        const OpCheckOptions& opts) {
  // The reference is f32: the CPU lane would quantise the activations of ggml
  // weights (and the GPU reads split Q8_0 weights exactly).
  const bool lane = ::aff::cpu::cpu_lane_enabled();
  ::aff::cpu::set_cpu_lane_enabled(false);
  Checker c(model, dev, opts);
  const Status st = c.run();
  ::aff::cpu::set_cpu_lane_enabled(lane);
  AFF_RETURN_IF_ERROR(st);
  return std::move(c.results);
}

}  // namespace aff::cuda
