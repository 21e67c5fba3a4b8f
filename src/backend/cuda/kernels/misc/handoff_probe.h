// What a dependency between two decode steps costs when the steps move
// almost no bytes (aff-bench-gemv --handoff). Each step needs every value the
// step before wrote, as a GEMV needs all of x, and writes kHandoffWidth values
// of its own: y[d] = x[d] / 2 + sum(x) / 2^20, over kHandoffBlocks blocks that
// each read all of x and write their own kHandoffWidth / kHandoffBlocks values.
// The same chain runs as a launch per step (plain, or a programmatic
// dependent) and as one persistent launch whose blocks hand the values over
// through memory (a value tagged with its step in one 64-bit word, or a grid
// counter per step), so the difference is what a launch boundary costs beyond
// the dependency itself.
#pragma once

#include <cuda_runtime.h>

#include "affinity/status.h"

namespace aff::cuda {

constexpr int kHandoffWidth = 4096;
constexpr int kHandoffBlocks = 128;

// One step as a launch: y = step(x). x, y: [kHandoffWidth] device, x 16-byte aligned.
Status handoff_step(const float* x, float* y, bool programmatic, cudaStream_t stream);

struct HandoffChainArgs {
  int steps = 0;
  const float* x0 = nullptr;            // [kHandoffWidth], 16-byte aligned
  float* ys = nullptr;                  // [steps, kHandoffWidth]: step i's outputs at ys + i * kHandoffWidth
  // Tagged hand-over: [steps, kHandoffWidth] words (value bits low, step + 1
  // high), zeroed by handoff_chain; null: a grid counter per step instead.
  unsigned long long* tagged = nullptr;
  unsigned* counters = nullptr;         // [steps], zeroed by handoff_chain (counter form)
};

// All steps in one launch of kHandoffBlocks resident blocks (the device must
// have that many SMs). Zeroes the hand-over words or counters first.
Status handoff_chain(const HandoffChainArgs& a, cudaStream_t stream);

}  // namespace aff::cuda
