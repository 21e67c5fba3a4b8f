// A GGUF written by another tool: tests/data/gguf_model/gguf_py_deepseek4.gguf
// comes from the `gguf` Python package (tools/gguf_model/make_gguf_py_fixture.py)
// with llama.cpp's deepseek4 names/keys and Q8_0, Q2_K, Q3_K, Q4_K, Q6_K,
// IQ2_XXS, IQ4_XS and MXFP4 weights. It must load, decode the same numbers
// gguf-py decodes at the same tensor/expert/row, and run exactly like the same
// weights stored as an F32 safetensors checkpoint.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "backend/cpu/linear_fast.h"
#include "backend/ref/linear.h"
#include "backend/ref/vec.h"
#include "format/safetensors_writer.h"
#include "gguf_test_util.h"
#include "model/dsv4/config_json.h"
#include "model/dsv4/forward.h"
#include "model/dsv4/load_gguf.h"
#include "model/dsv4/loaded_model.h"
#include "model/dsv4/state.h"
#include "model/dsv4/weights_bind.h"

namespace aff {
namespace {

namespace fs = std::filesystem;

const fs::path kFixture = fs::path(AFFINITY_TEST_DATA) / "gguf_model" / "gguf_py_deepseek4.gguf";
const fs::path kSpots = fs::path(AFFINITY_TEST_DATA) / "gguf_model" / "gguf_py_deepseek4.json";

// The Linear a spot's tensor name stands for (stacked experts take the expert index).
const dsv4::Linear* linear_for(const dsv4::ModelWeights& w, const std::string& name, int expert) {
  if (name == "output.weight") return &w.head;
  int layer = -1;
  char rest[64] = {};
  if (std::sscanf(name.c_str(), "blk.%d.%63s", &layer, rest) != 2 || layer < 0 || layer >= int(w.layers.size())) {
    return nullptr;
  }
  const dsv4::LayerWeights& l = w.layers[size_t(layer)];
  const std::string r = rest;
  if (r == "attn_q_b.weight") return &l.attn.wq_b;
  if (expert < 0 || expert >= int(l.ffn.experts.size())) return nullptr;
  const dsv4::ExpertWeights& e = l.ffn.experts[size_t(expert)];
  if (r == "ffn_gate_exps.weight") return &e.w1;
  if (r == "ffn_up_exps.weight") return &e.w3;
  if (r == "ffn_down_exps.weight") return &e.w2;
  return nullptr;
}

TEST(GgufPyFixture, DecodesWhatGgufPyDecodes) {
  auto m = dsv4::load_gguf_file(kFixture.string());
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  std::ifstream in(kSpots);
  const nlohmann::json j = nlohmann::json::parse(in);
  ASSERT_GE(j["spots"].size(), 19u);
  std::set<int> types_seen;
  for (const auto& spot : j["spots"]) {
    const std::string name = spot["tensor"];
    const auto idx = spot["index"].get<std::vector<int64_t>>();
    const int expert = idx.size() == 2 ? int(idx[0]) : -1;
    const int64_t row = idx.back();
    const dsv4::Linear* l = linear_for((*m)->weights, name, expert);
    ASSERT_NE(l, nullptr) << name;
    ASSERT_EQ(l->format, dsv4::WeightFormat::kGgml) << name;
    types_seen.insert(l->ggml_type);
    const auto want = spot["values"].get<std::vector<float>>();
    ASSERT_EQ(int64_t(want.size()), l->in) << name;
    std::vector<float> got(want.size(), std::nanf(""));
    ref::linear_dequant_row(*l, row, got.data());
    size_t differ = 0;
    for (size_t i = 0; i < want.size(); ++i) differ += got[i] != want[i];
    EXPECT_EQ(differ, 0u) << name << " expert " << expert << " row " << row;
  }
  EXPECT_EQ(types_seen.size(), 8u) << "Q8_0, Q2_K, Q3_K, Q4_K, Q6_K, IQ2_XXS, IQ4_XS, MXFP4";
}

// Writes the loaded model's weights, decoded, as an official-layout F32
// checkpoint: every value exactly what the GGUF path computes with.
class TwinWriter final : public dsv4::LayoutVisitor {
 public:
  format::SafetensorsWriter out;

  Status linear(const std::string& stem, int64_t rows, int64_t cols, dsv4::LinearKind, dsv4::Linear* dst) override {
    std::vector<uint8_t> bytes(size_t(rows * cols * 4));
    for (int64_t r = 0; r < rows; ++r) {
      ref::linear_dequant_row(*dst, r, reinterpret_cast<float*>(bytes.data()) + r * cols);
    }
    out.add(stem + ".weight", DType::kF32, {rows, cols}, std::move(bytes));
    return Status::ok();
  }
  Status tensor(const std::string& name, dsv4::TensorKind kind, const std::vector<int64_t>& shape,
                TensorView* dst) override {
    if (kind == dsv4::TensorKind::kExpertIds) {
      out.add(name, dst->dtype, shape, std::vector<uint8_t>(dst->data, dst->data + dst->nbytes));
      return Status::ok();
    }
    const std::vector<float> v = ref::tensor_to_f32(*dst);
    const auto* b = reinterpret_cast<const uint8_t*>(v.data());
    out.add(name, DType::kF32, shape, std::vector<uint8_t>(b, b + v.size() * 4));
    return Status::ok();
  }
};

TEST(GgufPyFixture, RunsLikeItsF32Checkpoint) {
  auto m = dsv4::load_gguf_file(kFixture.string());
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  const dsv4::LoadedModel& g = **m;
  test::TempDir tmp("gguf_py");
  {
    dsv4::ModelWeights copy = g.weights;
    TwinWriter twin;
    ASSERT_TRUE(dsv4::walk_checkpoint_layout(g.config, twin, &copy).is_ok());
    ASSERT_TRUE(twin.out.write((tmp.path() / "model.safetensors").string()).is_ok());
    std::ofstream(tmp.path() / "config.json") << dsv4::config_to_json(g.config);
  }
  auto d = dsv4::load_checkpoint_dir(tmp.path().string());
  ASSERT_TRUE(d.is_ok()) << d.status().message();

  std::mt19937_64 rng(std::random_device{}());
  std::vector<int32_t> tokens(29);
  for (auto& t : tokens) t = int32_t(rng() % uint64_t(g.config.vocab_size));
  auto run = [&](const dsv4::LoadedModel& model) {
    auto state = dsv4::make_state(model, 64);
    std::vector<float> logits;
    const Status st = dsv4::forward(model, *state, tokens, true, logits, {});
    EXPECT_TRUE(st.is_ok()) << st.message();
    return logits;
  };
  // Exact decode is a property of the reference path: the CPU lane rounds activations.
  const bool lane = cpu::cpu_lane_enabled();
  cpu::set_cpu_lane_enabled(false);
  const std::vector<float> a = run(g), b = run(**d);
  cpu::set_cpu_lane_enabled(lane);
  ASSERT_EQ(a.size(), tokens.size() * size_t(g.config.vocab_size));
  ASSERT_EQ(a.size(), b.size());
  size_t differ = 0, finite = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    differ += a[i] != b[i];
    finite += std::isfinite(a[i]);
  }
  EXPECT_EQ(finite, a.size());
  EXPECT_EQ(differ, 0u) << "of " << a.size();
}

}  // namespace
}  // namespace aff
