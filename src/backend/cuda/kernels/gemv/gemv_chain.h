// A chain of dependent decode GEMVs in one persistent launch (gemv_chain.cu):
// the measured prototype of a decode step whose weights stream across its
// dependencies (docs/NOTES.md, "What a 4 ms step would take").
//
// Step i computes y_i = W_i rmsnorm(x_i) for one token, x_0 given and
// x_{i+1} = y_i, rmsnorm(x) = x / sqrt(mean(x^2) + eps) (a norm weight of
// ones): what gemv_mma_normed computes, launch by launch. Every W_i is FP8
// E4M3 [4096, 4096] with 128 x 128 block scales. One block per SM; a warp of
// each block streams the block's row tiles of every step, in step order, into
// a ring of shared-memory stages by bulk copies that never wait for data, so
// step i + 1's weights land while step i's activations are still being
// computed; the other warps wait for step i's output (its values tagged
// with the step) only when they reach step i + 1.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "affinity/status.h"
#include "backend/cuda/runtime/device_weights.h"

namespace aff::cuda {

constexpr int64_t kChainWidth = 4096;  // rows and columns of every step's weight

// How the dots round x: kExact, f16 hi + lo per value (two MMAs per product:
// the exact setting of the decode GEMVs); kF16, hi only (the fast setting);
// kE4M3, x as e4m3 with a power of two per 64 columns on the FP8 MMA (the
// official FP8 linears' activation rounding).
enum class ChainPrecision { kExact, kF16, kE4M3 };

struct ChainArgs {
  const DeviceLinear* w = nullptr;  // device array [steps], each kFP8Block [4096, 4096], block 128
  int steps = 0;
  const float* x0 = nullptr;        // [4096]
  float* ys = nullptr;              // [steps, 4096]: y_i at ys + i * 4096
  // [steps, 4096] workspace, zeroed by gemv_chain: y_i again, each value
  // tagged with i + 1 in one 64-bit word (value bits low, tag high), which
  // step i + 1 loads until every tag it needs is there.
  unsigned long long* ll = nullptr;
  float eps = 1e-6f;
  ChainPrecision precision = ChainPrecision::kExact;
  // Timing only (wrong results): 1, the compute warps do not wait for the
  // previous step; 2, they only take each stage and hand it back (no
  // arithmetic, no outputs): what the streaming alone costs.
  int timing_mode = 0;
  // Ring slots in use (16 KB each), 4..12 (a tile's 4 stages are resident at
  // once); 0: all 12. Tuning: bytes in flight per SM against the latency of
  // the loads queued behind them.
  int ring_stages = 0;
  // Tuning: the producer issues a step's copies only once the block's warp 0 has
  // loaded the previous step's x (a load issued behind copies returns after
  // them).
  bool gate_copies = false;
  // Timing: when set, block 0's thread 0 writes %globaltimer (ns) at 8
  // points of every step, [steps, 8]: step start, x loaded (the previous
  // step's outputs seen), x staged, tile 0's stages in, its dots done, every
  // warp's dots done (barrier), tile 0 written, step end (the block's other
  // tile included); then [2] the SM's clock64 at the first and the last.
  unsigned long long* stamps = nullptr;
};

// Whether the device can keep one block of the chain kernel on every SM.
bool gemv_chain_supported();
// Zeroes args.ll on `stream`, then launches the chain.
Status gemv_chain(const ChainArgs& args, cudaStream_t stream);

}  // namespace aff::cuda
