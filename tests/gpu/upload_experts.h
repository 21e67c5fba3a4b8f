// Host expert weights (checkpoint or ggml formats) uploaded into one device
// arena, as the model loader does, for the MoE kernel tests: the slot table
// on the host and a device copy of it.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "backend/cuda/runtime/device_buffer.h"
#include "backend/cuda/runtime/device_model.h"
#include "model/dsv4/weights.h"

namespace aff::cuda::testing {

struct UploadedExperts {
  DeviceArena arena;
  std::vector<ExpertSlot> host;  // [E] slots, device pointers into arena
  DeviceBuffer table;            // the same slots on the device
};

// Fatal gtest failures on error: callers check HasFatalFailure().
inline void upload_experts(const std::vector<dsv4::ExpertWeights>& ex, UploadedExperts& u) {
  size_t bytes = 0;
  for (const auto& e : ex) bytes += linear_device_bytes(e.w1) + linear_device_bytes(e.w2) + linear_device_bytes(e.w3);
  ASSERT_TRUE(u.arena.reserve(bytes, "experts").is_ok());
  for (const auto& e : ex) {
    auto w1 = upload_linear(e.w1, u.arena), w3 = upload_linear(e.w3, u.arena), w2 = upload_linear(e.w2, u.arena);
    ASSERT_TRUE(w1.is_ok() && w2.is_ok() && w3.is_ok());
    u.host.push_back(ExpertSlot{*w1, *w3, *w2});
  }
  auto t = DeviceBuffer::allocate(u.host.size() * sizeof(ExpertSlot), "slots");
  ASSERT_TRUE(t.is_ok());
  u.table = std::move(t).value();
  ASSERT_TRUE(copy_to_device(u.table.data(), u.host.data(), u.host.size() * sizeof(ExpertSlot), "slots").is_ok());
}

}  // namespace aff::cuda::testing
