// KV memory that grows on demand (gpu_state.h): a state that backs only a few
// positions at creation and grows chunk by chunk must give exactly the logits
// of a fully backed one (same kernels, same grids: the reserved capacity is
// the same), its addresses must never move, and running past --kv-size must
// be a clear error.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <filesystem>
#include <random>
#include <vector>

#include "backend/cuda/cuda_forward.h"
#include "backend/cuda/gpu_state.h"
#include "backend/cuda/runtime/device_model.h"
#include "gpu_test_util.h"
#include "model/dsv4/loaded_model.h"

namespace aff::cuda {
namespace {

namespace fs = std::filesystem;

TEST(GrowableDeviceBuffer, KeepsAddressAndContentsAcrossCommits) {
  AFF_SKIP_WITHOUT_GPU();
  constexpr size_t kReserve = 64ull << 20;  // several allocation granules (2 MiB on current GPUs)
  auto b = GrowableDeviceBuffer::reserve(kReserve, "test buffer");
  ASSERT_TRUE(b.is_ok()) << b.status().message();
  EXPECT_GE(b->reserved(), kReserve);
  EXPECT_EQ(b->bytes(), 0u);
  void* const base = b->data();

  ASSERT_TRUE(b->commit(1000).is_ok());
  const size_t first = b->bytes();
  ASSERT_GE(first, 1000u);
  std::vector<uint8_t> a(first), back(first);
  std::mt19937 rng(7);
  for (auto& x : a) x = uint8_t(rng());
  ASSERT_EQ(cudaMemcpy(b->data(), a.data(), first, cudaMemcpyHostToDevice), cudaSuccess);

  ASSERT_TRUE(b->commit(first + 3 * 1000 * 1000).is_ok());  // spans a further granule boundary
  EXPECT_EQ(b->data(), base);
  EXPECT_GT(b->bytes(), first);
  std::vector<uint8_t> tail(b->bytes() - first, 0x5a), tail_back(tail.size());
  ASSERT_EQ(cudaMemcpy(static_cast<uint8_t*>(b->data()) + first, tail.data(), tail.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(back.data(), b->data(), first, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(tail_back.data(), static_cast<uint8_t*>(b->data()) + first, tail.size(),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(back, a);
  EXPECT_EQ(tail_back, tail);

  const Status over = b->commit(b->reserved() + 1);
  EXPECT_FALSE(over.is_ok());
  EXPECT_NE(over.message().find("reserved"), std::string::npos) << over.message();
}

TEST(KvGrowth, GrowingStateGivesTheLogitsOfAFullyCommittedOne) {
  AFF_SKIP_WITHOUT_GPU();
  auto loaded = dsv4::load_checkpoint_dir((fs::path(AFFINITY_SOURCE_DIR) / "models" / "tiny-v4").string());
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  auto dev = upload_model(**loaded);
  ASSERT_TRUE(dev.is_ok()) << dev.status().message();
  const int64_t V = (*loaded)->config.vocab_size;

  // Odd chunk sizes, a prefill past the initial commit, then decode steps.
  const uint64_t seed = ::aff::cuda::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng{uint32_t(seed)};
  std::uniform_int_distribution<int32_t> tok(2, int32_t(V - 1));
  const size_t chunks[] = {3, 150, 1, 1, 77, 1, 1, 1, 66, 1};
  size_t total = 0;
  for (size_t n : chunks) total += n;
  std::vector<int32_t> tokens(total);
  for (auto& t : tokens) t = tok(rng);
  const int64_t kKvSize = 4096;

  GpuStateOptions full_opt, grow_opt;
  full_opt.kv_size = grow_opt.kv_size = kKvSize;
  full_opt.max_chunk = grow_opt.max_chunk = 64;
  full_opt.kv_commit = kKvSize;
  grow_opt.kv_commit = 5;
  auto full = make_gpu_state(**dev, full_opt);
  auto grow = make_gpu_state(**dev, grow_opt);
  ASSERT_TRUE(full.is_ok()) << full.status().message();
  ASSERT_TRUE(grow.is_ok()) << grow.status().message();
  EXPECT_EQ((*grow)->kv_committed, 5);
  EXPECT_EQ((*full)->kv_committed, kKvSize);
  std::vector<void*> bases;
  for (const auto& ls : (*grow)->layers) bases.push_back(ls.kv.entries.data());

  size_t at = 0;
  for (size_t n : chunks) {
    const auto part = std::span<const int32_t>(tokens).subspan(at, n);
    at += n;
    ASSERT_TRUE(gpu_state_reserve(**full, int64_t(at)).is_ok());
    const Status st = gpu_state_reserve(**grow, int64_t(at));
    ASSERT_TRUE(st.is_ok()) << st.message();
    EXPECT_GE((*grow)->kv_committed, int64_t(at));
    std::vector<float> want, got;
    const Status a = gpu_forward(**dev, **full, part, true, want);
    ASSERT_TRUE(a.is_ok()) << "fully committed state, after " << at << " positions: " << a.message();
    const Status b = gpu_forward(**dev, **grow, part, true, got);
    ASSERT_TRUE(b.is_ok()) << "growing state, after " << at << " positions: " << b.message();
    ASSERT_EQ(got.size(), size_t(n) * size_t(V));
    // Same kernels on the same data with the same grids: bit-identical, not just close.
    ASSERT_EQ(got, want) << "after " << at << " positions";
  }
  ASSERT_EQ(at, tokens.size());
  EXPECT_LT((*grow)->kv_committed, kKvSize);
  for (size_t l = 0; l < bases.size(); ++l) EXPECT_EQ((*grow)->layers[l].kv.entries.data(), bases[l]);
  EXPECT_LE(gpu_state_committed_kv_bytes(**grow), gpu_state_committed_kv_bytes(**full));

  const Status past = gpu_state_reserve(**grow, kKvSize + 1);
  EXPECT_FALSE(past.is_ok());
  EXPECT_NE(past.message().find("--kv-size"), std::string::npos) << past.message();
}

}  // namespace
}  // namespace aff::cuda
