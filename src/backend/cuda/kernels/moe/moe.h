// Mixture-of-experts kernels: the router (score function, bias-steered top-k or
// hash table, normalised weights) and the expert SwiGLU FFN batched over
// (token, expert) pairs, reading experts through a slot table.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "affinity/status.h"
#include "backend/cuda/kernels/mhc/mhc.h"
#include "backend/cuda/runtime/device_weights.h"

namespace aff::cuda {

enum class ScoreFunc : int32_t { kSqrtSoftplus, kSigmoid, kSoftmax };

struct RouterArgs {
  float* logits = nullptr;         // [T, E] router logits (gate x): router_topk reads them, router_gate_topk writes them first
  const float* bias = nullptr;     // [E] selection bias, or null (hash layers ignore it)
  const int32_t* tid2eid = nullptr;  // [vocab, k] hash table, or null for top-k layers
  const int32_t* tokens = nullptr;   // [T] token ids (hash layers)
  int64_t T = 0;
  int E = 0, k = 0;
  ScoreFunc func = ScoreFunc::kSqrtSoftplus;
  float scaling = 1.0f;            // routed_scaling_factor
  int32_t* ids = nullptr;          // out [T, k] expert ids
  float* weights = nullptr;        // out [T, k] normalised weights x scaling
};

// Top-k picks the k largest score + bias (ties: lower id); the weights use the
// unbiased scores: w_i = s_i / (sum_selected s + 1e-20) * scaling.
Status router_topk(const RouterArgs& a, cudaStream_t stream);

// Decode (T <= 8): the router gate (BF16 or F32 [E, D], the logits into
// a.logits) and router_topk in one launch; ticket: one u32, zero between
// launches (the kernel leaves it zero). job: a deferred mHC comb the launch
// finishes in one extra block beside the gate (mhc.h; none by default).
bool router_gate_topk_supports(const RouterArgs& a, const DeviceLinear& gate);
Status router_gate_topk(const RouterArgs& a, const DeviceLinear& gate, const float* x, unsigned* ticket,
                        cudaStream_t stream, const HcCombJob& job = {});

struct ExpertFfnArgs {
  const ExpertSlot* slots = nullptr;  // device table, indexed by expert id
  DevFormat format = DevFormat::kMXFP4;  // storage of every expert in the table
  const int32_t* ids = nullptr;       // [n_pairs] expert of pair p (token p / pairs_per_token)
  int64_t n_pairs = 0;
  int pairs_per_token = 1;
  const float* x = nullptr;           // [T, D] expert input
  int64_t D = 0, inter = 0;           // hidden size, expert intermediate size
  float swiglu_limit = 0.0f;          // 0 disables the clamp
  float* act = nullptr;               // scratch [n_pairs, inter]
  float* y = nullptr;                 // out [n_pairs, D], unweighted expert outputs
};

// y[p] = w2 (silu(min(w1 x, L)) * clamp(w3 x, -L, L)) for every pair p, with
// x = x[p / pairs_per_token] and the expert of slot ids[p].
Status expert_ffn(const ExpertFfnArgs& a, cudaStream_t stream);

// Decode-sized MoE (T <= kMoeDecodeMaxTokens) in two launches, every format
// (routed and shared experts may differ), experts read through slot tables:
//   moe_decode_up:   act[p] = swiglu_clamp(w1 x_t, w3 x_t) for every routed
//                    pair p = t*k + j (expert ids[p]) and, after them, the
//                    shared expert of each token (pair T*k + t);
//   moe_decode_down: out[t] = sum_j route_w[t, j] * (w2_{ids[t*k+j]} act[t*k+j])
//                    + w2_shared act[T*k + t], summed in this fixed order
//                    (deterministic), no separate combine pass.
// The act scratch is private to the pair of launches: for the V4 layouts
// (moe_decode_fast.h) a routed pair's row holds its SwiGLU output as int8 with
// one scale per 16 elements, not f32.
constexpr int64_t kMoeDecodeMaxTokens = 8;

struct MoeDecodeArgs {
  const ExpertSlot* slots = nullptr;         // routed table [E], or null when k == 0
  const int32_t* ids = nullptr;              // [T, k] expert ids (device)
  const float* route_w = nullptr;            // [T, k] combine weights (device)
  int k = 0;                                 // routed experts per token (0: shared only)
  // Host-side copies of the storage (they pick the kernel and the activation
  // staging): format of every routed / the shared expert, and for kGgml the ggml
  // type ids of the gate/up (w1, w3) and down (w2) weights.
  DevFormat routed_format = DevFormat::kMXFP4;
  DevFormat shared_format = DevFormat::kFP8Block;
  int routed_ggml_up = -1, routed_ggml_down = -1;
  int shared_ggml_up = -1, shared_ggml_down = -1;
  int shared_fp8_block = 128;                // kFP8Block shared expert: its tile edge (V4: 128)
  const ExpertSlot* shared_slot = nullptr;   // [1] shared expert, or null
  const float* x = nullptr;                  // [T, D] expert input
  int64_t T = 0, D = 0, inter = 0;
  float swiglu_limit = 0.0f;                 // 0 disables the clamp
  float* act = nullptr;                      // scratch [T*k + (shared ? T : 0), inter]
  float* out = nullptr;                      // [T, D]
  // Streaming kernels only (moe_fast_supported); the general ones refuse them.
  const float* add = nullptr;                // [T, D] added to out by the down launch, or null
  // [T * k] or null: the up launch writes each routed pair's w2 here, so the
  // down launch finds it with one load instead of two dependent ones (ids,
  // then the slot), which its blocks' first weight copies wait for.
  const uint8_t** pair_w2 = nullptr;
  int max_sms = 0;                           // SMs the launches spread over (0: all): a launch
                                             // running beside other work leaves it the rest
};

// Bytes of act scratch the two launches need.
inline int64_t moe_decode_act_bytes(const MoeDecodeArgs& a) {
  return (a.T * a.k + (a.shared_slot ? a.T : 0)) * a.inter * 4;
}

// The decode step's whole MoE in one launch (T = 1): the router (gate and
// top-k, r's outputs written as router_gate_topk writes them), the shared
// expert and the routed experts' up and down, out = m.out. Needs m.add null,
// a BF16 or F32 gate [E, D], and (gate/up, down) in (Q2_K, Q3_K) or
// (IQ2_XXS, Q2_K). job: a deferred mHC comb it also finishes (or none). sync:
// 3 u32 counters, zero between launches (the launch leaves them zero). Its
// blocks are all resident at once (one per SM) and meet at two barriers.
bool moe_fused_supported(const MoeDecodeArgs& m, const RouterArgs& r, const DeviceLinear& gate);
Status moe_fused(const MoeDecodeArgs& m, const RouterArgs& r, const DeviceLinear& gate, const HcCombJob& job,
                 unsigned* sync, cudaStream_t stream);
// Tuning (aff-bench-gemv): later moe_fused launches write each block's phase
// times, [grid, 15] globaltimer ns (thread 0's view: start, gate done, shared
// tiles staged, shared up done, picks known, routed copies issued, routed
// passes done, up done, down set up, down copies issued, acts complete, down
// staged, routed down done, shared down done, end), to stamps (device); null
// turns it off.
void moe_fused_set_stamps(unsigned long long* stamps);
Status moe_decode_up(const MoeDecodeArgs& a, cudaStream_t stream);
// Raises the kernels' dynamic shared-memory limits (launches do it on first use
// too); call before capturing a graph (upload_model does).
Status moe_decode_prepare();
// Tuning knob for aff-bench-gemv (see gemv_set_ggml_ring).
void moe_decode_set_ggml_ring(bool on);
// Whether the V4 layouts take the streaming kernels (moe_decode_fast.h; on by
// default) or the general ones. Process-wide; change it only between decode
// steps (an up launch and its down launch must agree on the act layout).
void moe_decode_set_fast(bool on);
// Whether moe_decode_up/down take the streaming kernels for these arguments
// (and so accept add and max_sms).
bool moe_decode_streams(const MoeDecodeArgs& m);
Status moe_decode_down(const MoeDecodeArgs& a, cudaStream_t stream);

// out[t, d] = sum_i weights[t, i] * y[t*k + i, d] (+ add[t, d] when add != null).
//   weights: [T, k]; y: [T*k, D]; add, out: [T, D]. out may alias add.
Status moe_combine(const float* weights, const float* y, int64_t T, int k, int64_t D, const float* add,
                   float* out, cudaStream_t stream);

}  // namespace aff::cuda
