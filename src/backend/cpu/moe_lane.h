// A whole MoE layer's SwiGLU experts on the CPU lane in one parallel region. Computing
// each expert projection as its own threaded linear costs a fork/join per projection
// (three per expert, ~21 per decoded token and layer) and splits a 2-9 MB matrix 16
// ways; here the team is forked once, the gate/up rows of every expert are cut into
// chunks that threads take in contiguous runs, then (after one barrier) SwiGLU and the
// down projections the same way.
//
// Numerics are exactly those of the per-projection path (ref::linear -> linear_fast_rows
// for w1 and w3, the same SwiGLU expression, then w2): every output is bit-identical to
// dsv4::expert_forward with the lane on, whatever the thread count.
#pragma once

#include <cstdint>
#include <span>

#include "model/dsv4/weights.h"

namespace aff::cpu {

// One expert applied to n tokens.
//   x: [n, D] f32 inputs (row t at x + t*D), D = e->w1.in;
//   y: [n, D] f32 outputs, overwritten (unweighted expert output).
struct ExpertJob {
  const dsv4::ExpertWeights* e = nullptr;
  const float* x = nullptr;
  int64_t n = 0;
  float* y = nullptr;
};

// True if every projection of e runs on the lane (kGgml with a SIMD kernel here, gate and
// up taking the same activation format) and cpu_lane_enabled().
bool moe_lane_supported(const dsv4::ExpertWeights& e);

// Runs all jobs (SwiGLU with the swiglu_limit clamp L, 0 = none). Returns false, touching
// nothing, when some job's expert is not moe_lane_supported.
bool moe_lane_experts(std::span<const ExpertJob> jobs, float swiglu_limit);

}  // namespace aff::cpu
