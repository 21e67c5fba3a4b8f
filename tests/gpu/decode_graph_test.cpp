// The captured decode step changes nothing: token-by-token logits through the
// CUDA graph are bit-identical to the same steps launched one by one, across
// positions that complete compressed entries (HCA and CSA layers), the window
// ring wrapping, and a second capture after the options change.
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "../model/random_model.h"
#include "backend/cuda/cuda_forward.h"
#include "backend/cuda/cuda_layers.h"
#include "backend/cuda/runtime/device_model.h"
#include "gpu_test_util.h"

namespace aff::cuda {
namespace {

// Runs a prefill of `prompt` tokens, then `steps` single-token decodes, and
// returns every decode step's logits (concatenated) plus the greedy ids.
void run_decode(const DeviceModel& dev, const std::vector<int32_t>& tokens, size_t prompt, bool graph,
                std::vector<float>& logits, std::vector<int32_t>& greedy, int64_t chunk = 16) {
  if (graph)
    unsetenv("AFF_CUDA_GRAPH");
  else
    setenv("AFF_CUDA_GRAPH", "0", 1);
  auto st = make_gpu_state(dev, int64_t(tokens.size()) + 1, chunk);
  ASSERT_TRUE(st.is_ok()) << st.status().message();
  std::vector<float> part;
  ASSERT_TRUE(gpu_forward(dev, **st, std::span(tokens).first(prompt), false, part).is_ok());
  for (size_t i = prompt; i < tokens.size(); ++i) {
    // Alternate logits and greedy steps so both captured variants are used.
    if (i % 3 == 0) {
      auto id = gpu_forward_greedy(dev, **st, std::span(tokens).subspan(i, 1));
      ASSERT_TRUE(id.is_ok()) << id.status().message();
      greedy.push_back(*id);
    } else {
      const Status s = gpu_forward(dev, **st, std::span(tokens).subspan(i, 1), false, part);
      ASSERT_TRUE(s.is_ok()) << s.message();
      logits.insert(logits.end(), part.begin(), part.end());
    }
  }
  EXPECT_EQ((*st)->n_past, int64_t(tokens.size()));
  unsetenv("AFF_CUDA_GRAPH");
}

// A random tiny model with SWA, CSA (ratio 4, indexer) and HCA (ratio 8)
// layers and hash routing on layer 0 decodes tokens [prompt, n) after a
// prefill of the first `prompt`, through graphs and launch by launch: both
// must give the same bits.
void expect_replay_matches(uint64_t seed, size_t n, size_t prompt, int64_t chunk = 16) {
  dsv4::ModelConfig cfg = dsv4::testing::tiny_config({0, 4, 8}, 1);
  auto model = dsv4::testing::random_model(cfg, seed);
  ASSERT_TRUE(model);
  auto dev = upload_model(*model);
  ASSERT_TRUE(dev.is_ok()) << dev.status().message();
  std::vector<int32_t> tokens;
  for (size_t i = 0; i < n; ++i) tokens.push_back(int32_t((i * 37 + 5) % size_t(cfg.vocab_size)));
  std::vector<float> with_graph, without_graph;
  std::vector<int32_t> ids_graph, ids_plain;
  run_decode(**dev, tokens, prompt, true, with_graph, ids_graph, chunk);
  run_decode(**dev, tokens, prompt, false, without_graph, ids_plain, chunk);
  ASSERT_FALSE(with_graph.empty());
  ASSERT_EQ(with_graph.size(), without_graph.size());
  size_t differ = 0;
  for (size_t i = 0; i < with_graph.size(); ++i) differ += with_graph[i] != without_graph[i];
  EXPECT_EQ(differ, 0u) << "logits differ between replayed and launched decode steps";
  EXPECT_EQ(ids_graph, ids_plain);
}

TEST(DecodeGraph, ReplayIsBitIdenticalToLaunchByLaunch) {
  AFF_SKIP_WITHOUT_GPU();
  expect_replay_matches(11, 70, 5);
}

// Steps past kShortDecodePositions take another captured graph
// (gpu_decode_shape): decode across that position, through graphs and launch
// by launch, gives the same bits (a replay of the short graph past its range
// would stop the indexer's top-k kernel).
TEST(DecodeGraph, NewShapeAtLongRows) {
  AFF_SKIP_WITHOUT_GPU();
  const int64_t first_long = kShortDecodePositions;
  ASSERT_EQ(gpu_decode_shape(first_long - 1), 0);
  ASSERT_NE(gpu_decode_shape(first_long), 0);
  expect_replay_matches(12, size_t(first_long + 8), size_t(first_long - 6), 1024);
}

}  // namespace
}  // namespace aff::cuda
