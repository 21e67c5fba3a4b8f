// GGUF models end to end: config metadata round trip, a checkpoint converted
// to GGUF loading and running exactly like the checkpoint, loader errors, the
// tokenizer carried in the file.
#include <gtest/gtest.h>

// The cases below name only the edits they make (designated initializers of
// test::RewriteOptions, whose other fields default to "no edit"); GCC 12 warns
// about every field left out.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <sys/wait.h>

#include "backend/cpu/linear_fast.h"
#include "../model/config_compare.h"
#include "checkpoint_to_gguf.h"
#include "format/gguf_dsv4_names.h"
#include "format/gguf_reader.h"
#include "format/gguf_writer.h"
#include "gguf_test_util.h"
#include "model/dsv4/config_gguf.h"
#include "model/dsv4/forward.h"
#include "model/dsv4/load_gguf.h"
#include "model/dsv4/loaded_model.h"
#include "model/dsv4/model_summary.h"
#include "model/dsv4/state.h"
#include "model/dsv4/synthetic_checkpoint.h"
#include "model/dsv4/tokenizer_gguf.h"
#include "tokenizer/tokenizer.h"

namespace aff {
namespace {

namespace fs = std::filesystem;
using dsv4::ModelConfig;
constexpr auto kGguf = dsv4::testing::ConfigFields::kGgufMetadata;
using format::GgufFile;
using format::GgufValue;

// Q8_0 moves each weight by at most half a step, d/2 with d = max|block|/127.
// Compared with routing off (shared expert only: routed top-k choices flip
// under any perturbation, which is the model's nature, not an error), the
// tiny random model's logits moved by 1.7-2.1% of their largest magnitude over
// six seeds (the synthetic weights are uniform, so every block's max is large
// relative to its typical value). 4% is twice that; a wrong row, scale or type
// moves logits by order 100%. The exact check above is the sharp one.
constexpr float kQ8LogitTolerance = 0.04f;
// CPU lane vs reference: the lane rounds each expert input with the Q8_0 quantiser
// (int8, step max|x|/127 per 32 values), the same rounding the Q8_0 container applies
// to dense weights, so positions before any change of expert choice get the same logit
// budget, kQ8LogitTolerance of max |logit|. A flipped top-k choice swaps a whole expert
// (the random model's router scores are close); it may happen, but at under half of
// the positions, or the lane is perturbing far more than its rounding.
constexpr double kLaneMaxFlippedFraction = 0.5;

ModelConfig metadata_round_trip(const ModelConfig& c, const fs::path& path) {
  {
    format::GgufWriter w(path.string());
    EXPECT_TRUE(dsv4::config_to_gguf(c, w).is_ok());
    EXPECT_TRUE(w.write_header().is_ok());
    EXPECT_TRUE(w.finish().is_ok());
  }
  auto f = GgufFile::open(path.string());
  EXPECT_TRUE(f.is_ok()) << f.status().message();
  auto back = dsv4::config_from_gguf(*f);
  EXPECT_TRUE(back.is_ok()) << back.status().message();
  return back.is_ok() ? *back : ModelConfig{};
}

TEST(GgufConfig, RoundTripsEveryVariantAndRandomValues) {
  test::TempDir tmp("cfg");
  std::mt19937_64 rng(std::random_device{}());
  for (auto variant : {dsv4::Variant::kV4Flash, dsv4::Variant::kV4Flash0731}) {
    ModelConfig c = dsv4::synthetic_tiny_config(variant);
    dsv4::testing::expect_same_config(c, metadata_round_trip(c, tmp.path() / "a.gguf"), kGguf);
    // Values off the release defaults, so a reader falling back to a default shows.
    c.rope_theta = 1000.0 + double(rng() % 9000);
    c.compress_rope_theta = 50000.0 + double(rng() % 1000);
    c.rope_scaling.factor = 2.0 + double(rng() % 7);
    c.rope_scaling.beta_fast = 16.0 + double(rng() % 16);
    c.swiglu_limit = 3.0 + double(rng() % 5);
    c.routed_scaling_factor = 1.0 + 0.25 * double(rng() % 4);
    c.norm_topk_prob = rng() % 2 == 0;
    c.hc_sinkhorn_iters = 1 + int(rng() % 30);
    c.bos_token_id = int(rng() % 50);
    c.eos_token_id = 50 + int(rng() % 50);
    c.max_position_embeddings = 1000 + int64_t(rng() % 9000);
    dsv4::testing::expect_same_config(c, metadata_round_trip(c, tmp.path() / "b.gguf"), kGguf);
    c.rope_scaling.yarn = false;
    dsv4::testing::expect_same_config(c, metadata_round_trip(c, tmp.path() / "c.gguf"), kGguf);
  }
}

// Writes cfg's metadata with `edit` applied, returns config_from_gguf's status.
Status config_status_with(const fs::path& path, const std::function<void(dsv4::GgufMetadata&)>& edit) {
  dsv4::GgufMetadata m = dsv4::config_gguf_metadata(dsv4::synthetic_tiny_config());
  edit(m);
  {
    format::GgufWriter w(path.string());
    for (auto& [k, v] : m) AFF_RETURN_IF_ERROR(w.set(k, v));
    AFF_RETURN_IF_ERROR(w.write_header());
    AFF_RETURN_IF_ERROR(w.finish());
  }
  AFF_ASSIGN_OR_RETURN(GgufFile f, GgufFile::open(path.string()));
  return dsv4::config_from_gguf(f).status();
}

void set_key(dsv4::GgufMetadata& m, std::string_view key, GgufValue v) {
  for (auto& [k, old] : m) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  m.emplace_back(std::string(key), std::move(v));
}

void drop_key(dsv4::GgufMetadata& m, std::string_view key) {
  std::erase_if(m, [&](const auto& kv) { return kv.first == key; });
}

TEST(GgufConfig, ErrorsNameTheFileAndKey) {
  test::TempDir tmp("cfgerr");
  const fs::path p = tmp.path() / "bad.gguf";
  namespace key = format::dsv4_key;
  struct Case {
    std::function<void(dsv4::GgufMetadata&)> edit;
    StatusCode code;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {[](auto& m) { drop_key(m, key::kBlockCount); }, StatusCode::kNotFound, "deepseek4.block_count"},
      {[](auto& m) { drop_key(m, key::kCompressRatios); }, StatusCode::kNotFound, "compress_ratios"},
      {[](auto& m) { set_key(m, key::kArchitecture, GgufValue::string("deepseek41")); }, StatusCode::kUnsupported,
       "deepseek41"},
      {[](auto& m) { set_key(m, key::kArchitecture, GgufValue::string("llama")); }, StatusCode::kUnsupported,
       "llama"},
      {[](auto& m) { set_key(m, key::kHeadCountKv, GgufValue::u32(2)); }, StatusCode::kUnsupported,
       "head_count_kv"},
      {[](auto& m) { set_key(m, key::kHeadCount, GgufValue::string("four")); }, StatusCode::kCorrupt,
       "attention.head_count"},
      {[](auto& m) { set_key(m, key::kHeadCount, GgufValue::i32(-4)); }, StatusCode::kCorrupt, "negative"},
      {[](auto& m) {
         set_key(m, key::kSwigluClampExp,
                 GgufValue::array(format::GgufType::kF32, std::vector<float>{10, 10, 7, 10, 10, 10}));
       },
       StatusCode::kUnsupported, "swiglu_clamp_exp"},
      {[](auto& m) {
         set_key(m, key::kCompressRatios, GgufValue::array(format::GgufType::kU32, std::vector<int>{0, 0, 4}));
       },
       StatusCode::kInvalidArgument, "compress_ratios"},
      {[](auto& m) { set_key(m, dsv4::kGgufKeyScoringFunc, GgufValue::string("softmax")); },
       StatusCode::kUnsupported, "scoring_func"},
  };
  for (const Case& c : cases) {
    const Status st = config_status_with(p, c.edit);
    EXPECT_EQ(st.code(), c.code) << st.message();
    EXPECT_NE(st.message().find(c.needle), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(p.string()), std::string::npos) << st.message();
  }
  // A scalar clamp (older files) is accepted.
  EXPECT_TRUE(config_status_with(p, [](auto& m) { set_key(m, key::kSwigluClampExp, GgufValue::f32(10)); }).is_ok());
}

// ---- models ----------------------------------------------------------------

class GgufModel : public ::testing::Test {
 public:
  static inline test::TempDir* tmp_ = nullptr;
  static inline fs::path ckpt_;
  static inline fs::path lossless_;
  static inline uint64_t seed_ = 0;
  static inline bool lane_was_on_ = true;

  static void SetUpTestSuite() {
    // The exactness checks below run the reference path (f32 activations); the CPU
    // lane's int8 activations are checked in CpuLaneStaysCloseToTheReferencePath.
    lane_was_on_ = cpu::cpu_lane_enabled();
    cpu::set_cpu_lane_enabled(false);
    tmp_ = new test::TempDir("model");
    seed_ = std::random_device{}();
    ckpt_ = tmp_->path() / "ckpt";
    ModelConfig cfg = dsv4::synthetic_tiny_config();
    // Multiples of 32 everywhere so that the Q8_0 variant quantises every dense Linear.
    cfg.q_lora_rank = 64;
    cfg.o_lora_rank = 32;
    cfg.vocab_size = 1031;  // covers the test tokenizer's ids
    dsv4::SyntheticCheckpointOptions o;
    o.seed = seed_;
    ASSERT_TRUE(dsv4::write_synthetic_checkpoint(cfg, ckpt_.string(), o).is_ok());
    fs::copy_file(fs::path(AFFINITY_TEST_DATA) / "tokenizer" / "tiny_tokenizer.json", ckpt_ / "tokenizer.json");
    lossless_ = tmp_->path() / "lossless.gguf";
    const Status st = test::checkpoint_to_gguf(ckpt_.string(), lossless_.string());
    ASSERT_TRUE(st.is_ok()) << st.message();
  }
  static void TearDownTestSuite() {
    cpu::set_cpu_lane_enabled(lane_was_on_);
    delete tmp_;
    tmp_ = nullptr;
  }

  static std::vector<int32_t> random_tokens(int n, int64_t vocab) {
    std::mt19937_64 rng(seed_ + 7);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = int32_t(rng() % uint64_t(vocab));
    return t;
  }

  static std::vector<float> logits_of(const dsv4::LoadedModel& m, const std::vector<int32_t>& tokens,
                                      const dsv4::ForwardOptions& opts = {}) {
    auto state = dsv4::make_state(m, 64);
    std::vector<float> logits;
    const Status st = dsv4::forward(m, *state, tokens, true, logits, opts);
    EXPECT_TRUE(st.is_ok()) << st.message();
    return logits;
  }
};

TEST_F(GgufModel, LosslessContainerGivesBitIdenticalLogits) {
  auto dir = dsv4::load_checkpoint_dir(ckpt_.string());
  ASSERT_TRUE(dir.is_ok()) << dir.status().message();
  auto gguf = dsv4::load_gguf_file(lossless_.string());
  ASSERT_TRUE(gguf.is_ok()) << gguf.status().message();
  const dsv4::LoadedModel& g = **gguf;
  // Experts stay MXFP4 (as ggml blocks); FP8 dense weights became BF16.
  EXPECT_EQ(g.weights.layers[2].ffn.experts[5].w2.format, dsv4::WeightFormat::kGgml);
  EXPECT_EQ(g.weights.layers[2].ffn.experts[5].w2.ggml_type, int(quant::GgmlType::kMXFP4));
  EXPECT_EQ(g.weights.layers[1].attn.wq_b.format, dsv4::WeightFormat::kBF16);
  EXPECT_EQ(g.config.num_mtp_layers, 1);
  ASSERT_EQ(g.weights.mtp.size(), 1u);

  const auto tokens = random_tokens(23, g.config.vocab_size);
  const std::vector<float> a = logits_of(**dir, tokens);
  const std::vector<float> b = logits_of(g, tokens);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), tokens.size() * size_t(g.config.vocab_size));
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += a[i] != b[i];
  EXPECT_EQ(differ, 0u) << "of " << a.size() << " logits";
}

TEST_F(GgufModel, CpuLaneStaysCloseToTheReferencePath) {
  // The container's MXFP4 experts through the CPU lane (activations rounded to int8 per
  // 32 inputs) against the reference path on the same file. Top-1 agreement is printed,
  // not asserted: a random model's top logits are often closer than the rounding.
  auto gguf = dsv4::load_gguf_file(lossless_.string());
  ASSERT_TRUE(gguf.is_ok()) << gguf.status().message();
  const dsv4::LoadedModel& g = **gguf;
  if (!cpu::linear_fast_supported(g.weights.layers[2].ffn.experts[5].w2)) GTEST_SKIP() << "no CPU-lane kernel here";
  const auto tokens = random_tokens(23, g.config.vocab_size);
  // Expert choice per (layer, position): a perturbation that flips a top-k choice
  // changes that position's output by a whole expert, which no rounding bound covers.
  std::vector<std::vector<int32_t>> routes[2];
  auto run = [&](bool lane_on) {
    cpu::set_cpu_lane_enabled(lane_on);
    auto& r = routes[lane_on];
    r.assign(tokens.size(), {});
    const dsv4::RouteObserver obs = [&](int, int64_t pos0, const dsv4::Routing& rt) {
      for (size_t i = 0; i < rt.experts.size(); ++i) r[size_t(pos0) + i / size_t(rt.k)].push_back(rt.experts[i]);
    };
    dsv4::ForwardOptions o;
    o.route_observer = &obs;
    std::vector<float> l = logits_of(g, tokens, o);
    cpu::set_cpu_lane_enabled(false);
    return l;
  };
  const std::vector<float> ref = run(false);
  const std::vector<float> lane = run(true);
  ASSERT_EQ(ref.size(), lane.size());
  const int64_t V = g.config.vocab_size;
  double err2 = 0, ref2 = 0;
  float max_abs = 0, max_diff = 0;
  size_t differ = 0, same_top1 = 0;
  // A flip at position p also reaches every later position through attention, so the
  // rounding budget applies to the positions before the first flip.
  size_t flipped = 0, checked = 0;
  bool same_routes = true;
  for (size_t i = 0; i < ref.size(); ++i) {
    const size_t t = i / size_t(V);
    if (i % size_t(V) == 0) {
      flipped += routes[0][t] != routes[1][t];
      same_routes = same_routes && routes[0][t] == routes[1][t];
      checked += same_routes;
    }
    err2 += double(lane[i] - ref[i]) * (lane[i] - ref[i]);
    ref2 += double(ref[i]) * ref[i];
    differ += lane[i] != ref[i];
    max_abs = std::max(max_abs, std::fabs(ref[i]));
    if (same_routes) max_diff = std::max(max_diff, std::fabs(lane[i] - ref[i]));
  }
  for (size_t t = 0; t < tokens.size(); ++t) {
    const auto top = [&](const std::vector<float>& l) {
      return std::max_element(l.begin() + t * V, l.begin() + (t + 1) * V) - (l.begin() + t * V);
    };
    same_top1 += top(ref) == top(lane);
  }
  const double rel_rms = std::sqrt(err2 / ref2);
  std::printf("CPU lane vs reference on MXFP4 experts: max |dlogit| %.5f of max |logit| %.4f (%.5f), "
              "relative RMS %.5f, top-1 %zu/%zu, positions with a flipped expert choice %zu, checked %zu\n",
              max_diff, max_abs, max_diff / max_abs, rel_rms, same_top1, tokens.size(), flipped, checked);
  EXPECT_GT(differ, 0u) << "the lane was not used";
  EXPECT_LE(max_diff, kQ8LogitTolerance * max_abs) << "max |logit| " << max_abs;
  EXPECT_LT(double(flipped), kLaneMaxFlippedFraction * double(tokens.size()));
}

TEST_F(GgufModel, Q8DenseAndQ8EmbeddingRunExactlyTheirDecodedValues) {
  // The Q8_0 container against the same weights decoded to F32: identical
  // rows reach the same kernels, so the logits must match bit for bit.
  const fs::path q8 = tmp_->path() / "q8.gguf", q8_f32 = tmp_->path() / "q8_f32.gguf";
  test::CheckpointToGgufOptions o;
  o.dense_q8_0 = true;
  o.embed_q8_0 = true;
  ASSERT_TRUE(test::checkpoint_to_gguf(ckpt_.string(), q8.string(), o).is_ok());
  o.q8_0_decoded_as_f32 = true;
  ASSERT_TRUE(test::checkpoint_to_gguf(ckpt_.string(), q8_f32.string(), o).is_ok());
  auto quantised = dsv4::load_gguf_file(q8.string());
  auto decoded = dsv4::load_gguf_file(q8_f32.string());
  ASSERT_TRUE(quantised.is_ok()) << quantised.status().message();
  ASSERT_TRUE(decoded.is_ok()) << decoded.status().message();
  const dsv4::LoadedModel& g = **quantised;
  EXPECT_TRUE(g.weights.embed_rows.valid());
  EXPECT_FALSE(g.weights.embed.valid());
  EXPECT_EQ(g.weights.layers[0].attn.wq_b.ggml_type, int(quant::GgmlType::kQ8_0));
  EXPECT_EQ((*decoded)->weights.layers[0].attn.wq_b.format, dsv4::WeightFormat::kF32);

  const auto tokens = random_tokens(19, g.config.vocab_size);
  const std::vector<float> a = logits_of(**decoded, tokens);
  const std::vector<float> b = logits_of(g, tokens);
  ASSERT_EQ(a.size(), b.size());
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += a[i] != b[i];
  EXPECT_EQ(differ, 0u) << "of " << a.size() << " logits";

  // Against the original checkpoint: close, within the stated tolerance.
  auto dir = dsv4::load_checkpoint_dir(ckpt_.string());
  ASSERT_TRUE(dir.is_ok());
  dsv4::ForwardOptions shared_only;
  shared_only.no_routed_experts = true;
  const std::vector<float> c = logits_of(**dir, tokens, shared_only);
  const std::vector<float> d = logits_of(g, tokens, shared_only);
  float max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    max_abs = std::max(max_abs, std::fabs(c[i]));
    max_diff = std::max(max_diff, std::fabs(c[i] - d[i]));
  }
  EXPECT_GT(max_diff, 0.0f) << "Q8_0 should perturb something";
  EXPECT_LE(max_diff, kQ8LogitTolerance * max_abs) << "max |logit| " << max_abs;
  std::printf("Q8_0 dense+embed vs checkpoint (shared expert only): max |dlogit| %.5f of max |logit| %.4f (%.5f)\n",
              max_diff, max_abs, max_diff / max_abs);
}

TEST_F(GgufModel, TokenizerFromTheFile) {
  auto json_tok = Tokenizer::load((ckpt_ / "tokenizer.json").string());
  ASSERT_TRUE(json_tok.is_ok());
  auto f = GgufFile::open(lossless_.string());
  ASSERT_TRUE(f.is_ok());
  ASSERT_TRUE(dsv4::gguf_has_tokenizer(*f));
  auto exact = dsv4::tokenizer_from_gguf(*f);
  ASSERT_TRUE(exact.is_ok()) << exact.status().message();
  // Without the tokenizer.json copy, the tokenizer.ggml.* keys alone must give the same ids.
  const fs::path ggml_only = tmp_->path() / "ggml_tok.gguf";
  ASSERT_TRUE(test::rewrite_gguf(lossless_, ggml_only, {.drop_keys = {std::string(dsv4::kGgufKeyTokenizerJson)}})
                  .is_ok());
  auto g = GgufFile::open(ggml_only.string());
  ASSERT_TRUE(g.is_ok());
  auto from_keys = dsv4::tokenizer_from_gguf(*g);
  ASSERT_TRUE(from_keys.is_ok()) << from_keys.status().message();
  const std::vector<std::string> texts = {
      "Hello, world! 12345 tokens", "<｜User｜>hi<｜Assistant｜><think>x</think>", "  spaces\n\nand\ttabs 3.14159",
      "日本語のテキストと中文", "emoji 🙂 and ümlauts", "<｜begin▁of▁sentence｜>abc<｜end▁of▁sentence｜>"};
  for (const std::string& t : texts) {
    const auto want = (*json_tok)->encode(t);
    EXPECT_EQ((*exact)->encode(t), want) << t;
    EXPECT_EQ((*from_keys)->encode(t), want) << t;
    EXPECT_EQ((*from_keys)->decode(want), (*json_tok)->decode(want)) << t;
  }
  for (int32_t id = 0; id < (*json_tok)->vocab_size(); id += 37) {
    EXPECT_EQ((*from_keys)->token_bytes(id), (*json_tok)->token_bytes(id)) << id;
    EXPECT_EQ((*from_keys)->is_special(id), (*json_tok)->is_special(id)) << id;
  }
  // An unknown pre-tokenizer name is refused, pointing at --tokenizer.
  const fs::path odd_pre = tmp_->path() / "odd_pre.gguf";
  ASSERT_TRUE(test::rewrite_gguf(ggml_only, odd_pre,
                                 {.set_keys = {{std::string(format::dsv4_key::kTokenizerPre), GgufValue::string("qwen2")}}})
                  .is_ok());
  auto o = GgufFile::open(odd_pre.string());
  const auto st = dsv4::tokenizer_from_gguf(*o).status();
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_NE(st.message().find("--tokenizer"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("qwen2"), std::string::npos) << st.message();
}

TEST_F(GgufModel, LoaderErrorsNameFileAndTensor) {
  struct Case {
    test::RewriteOptions edit;
    StatusCode code;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {{.drop_tensors = {"blk.3.attn_q_b.weight"}}, StatusCode::kNotFound,
       {"blk.3.attn_q_b.weight", "layers.3.attn.wq_b.weight", "missing"}},
      {{.reshape = {{"blk.1.attn_kv.weight", {160, 32}}}}, StatusCode::kCorrupt,
       {"blk.1.attn_kv.weight", "[160, 32]", "[160, 64]"}},
      {{.reshape = {{"blk.2.ffn_up_exps.weight", {160, 64, 7}}}}, StatusCode::kCorrupt,
       {"blk.2.ffn_up_exps.weight", "[160, 64, 8]"}},
      {{.retype = {{"blk.0.attn_norm.weight", quant::GgmlType::kI32}}}, StatusCode::kCorrupt,
       {"blk.0.attn_norm.weight", "I32"}},
      {{.retype = {{"blk.4.ffn_down_exps.weight", quant::GgmlType::kI8}}}, StatusCode::kCorrupt,
       {"blk.4.ffn_down_exps.weight", "I8"}},
      {{.poison_tid2eid = "blk.1.ffn_gate_tid2eid.weight"}, StatusCode::kCorrupt,
       {"blk.1.ffn_gate_tid2eid.weight", "expert id"}},
  };
  int i = 0;
  for (const Case& c : cases) {
    const fs::path p = tmp_->path() / ("bad" + std::to_string(i++) + ".gguf");
    const Status w = test::rewrite_gguf(lossless_, p, c.edit);
    ASSERT_TRUE(w.is_ok()) << w.message();
    const Status st = dsv4::load_gguf_file(p.string()).status();
    EXPECT_EQ(st.code(), c.code) << st.message();
    EXPECT_NE(st.message().find(p.string()), std::string::npos) << st.message();
    for (const std::string& n : c.needles) EXPECT_NE(st.message().find(n), std::string::npos) << n << ": " << st.message();
  }
  // MTP counted in metadata but shipped elsewhere (ds4): loads without it.
  const fs::path no_mtp = tmp_->path() / "no_mtp.gguf";
  ASSERT_TRUE(test::rewrite_gguf(lossless_, no_mtp, {.drop_prefix = "mtp."}).is_ok());
  auto m = dsv4::load_gguf_file(no_mtp.string());
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  EXPECT_EQ((*m)->config.num_mtp_layers, 0);
  EXPECT_TRUE((*m)->weights.mtp.empty());
}


// ---- the CLI -----------------------------------------------------------------

namespace cli {

struct Run {
  int rc = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

Run run(const std::string& binary, const std::vector<std::string>& args, const fs::path& scratch) {
  static int n = 0;
  const fs::path out = scratch / ("out" + std::to_string(n)), err = scratch / ("err" + std::to_string(n++));
  std::string cmd = quote(std::string(AFFINITY_BIN_DIR) + "/" + binary);
  for (const auto& a : args) cmd.append(" ").append(quote(a));
  cmd += " >" + quote(out.string()) + " 2>" + quote(err.string()) + " </dev/null";
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128, slurp(out), slurp(err)};
}

}  // namespace cli

TEST_F(GgufModel, CliRunsAContainerExactlyAsItsDirectory) {
  const fs::path a = tmp_->path() / "dir.npy", b = tmp_->path() / "gguf.npy";
  // --cpu-lane 0: the container's MXFP4 experts on the exact reference path.
  const std::vector<std::string> common = {"--threads", "1", "--cpu-lane", "0", "-p", "Hello GGUF, 42 times!",
                                           "--logits-out"};
  auto args = [&](const fs::path& model, const fs::path& out) {
    std::vector<std::string> v = {"-m", model.string()};
    v.insert(v.end(), common.begin(), common.end());
    v.push_back(out.string());
    return v;
  };
  const cli::Run r1 = cli::run("affinity", args(ckpt_, a), tmp_->path());
  ASSERT_EQ(r1.rc, 0) << r1.err;
  const cli::Run r2 = cli::run("affinity", args(lossless_, b), tmp_->path());
  ASSERT_EQ(r2.rc, 0) << r2.err;
  const std::string na = cli::slurp(a), nb = cli::slurp(b);
  EXPECT_GT(na.size(), 1000u);
  EXPECT_EQ(na, nb) << "logits files differ";

  // Generation too: same greedy tokens.
  const std::vector<std::string> gen = {"--threads", "1", "--cpu-lane", "0", "-p", "abc", "-n", "6", "--ignore-eos"};
  auto with = [&](const fs::path& m) {
    std::vector<std::string> v = {"-m", m.string()};
    v.insert(v.end(), gen.begin(), gen.end());
    return v;
  };
  const cli::Run g1 = cli::run("affinity", with(ckpt_), tmp_->path());
  const cli::Run g2 = cli::run("affinity", with(lossless_), tmp_->path());
  ASSERT_EQ(g1.rc, 0) << g1.err;
  ASSERT_EQ(g2.rc, 0) << g2.err;
  EXPECT_EQ(g1.out, g2.out);

  // No tokenizer in the file: the error says to pass --tokenizer; passing it works.
  const fs::path bare = tmp_->path() / "bare.gguf";
  test::RewriteOptions strip;
  for (std::string_view k : {format::dsv4_key::kTokenizerModel, format::dsv4_key::kTokenizerPre,
                             format::dsv4_key::kTokenizerTokens, format::dsv4_key::kTokenizerTokenType,
                             format::dsv4_key::kTokenizerMerges, dsv4::kGgufKeyTokenizerJson}) {
    strip.drop_keys.emplace_back(k);
  }
  ASSERT_TRUE(test::rewrite_gguf(lossless_, bare, strip).is_ok());
  const cli::Run e = cli::run("affinity", with(bare), tmp_->path());
  EXPECT_EQ(e.rc, 1) << e.err;
  EXPECT_NE(e.err.find("--tokenizer"), std::string::npos) << e.err;
  EXPECT_NE(e.err.find(bare.string()), std::string::npos) << e.err;
  std::vector<std::string> with_tok = with(bare);
  with_tok.insert(with_tok.end(), {"--tokenizer", (ckpt_ / "tokenizer.json").string()});
  const cli::Run ok = cli::run("affinity", with_tok, tmp_->path());
  EXPECT_EQ(ok.rc, 0) << ok.err;
  EXPECT_EQ(ok.out, g1.out);
}

// ---- aff-info ----------------------------------------------------------------

TEST_F(GgufModel, SummaryCountsExpertsAndTypes) {
  auto d = dsv4::summarize_model(ckpt_.string());
  auto g = dsv4::summarize_model(lossless_.string());
  ASSERT_TRUE(d.is_ok() && g.is_ok());
  EXPECT_TRUE(d->problems.empty()) << d->problems.front();
  EXPECT_TRUE(g->problems.empty()) << g->problems.front();
  const ModelConfig& c = *g->config;
  // One expert = gate + up [moe_inter, D] and down [D, moe_inter] in MXFP4:
  // 17 bytes per 32 weights, in the checkpoint (packed I8 + E8M0) and the GGUF alike.
  const uint64_t per_expert = 3 * uint64_t(c.moe_inter) * uint64_t(c.hidden_size) / 32 * 17;
  ASSERT_EQ(g->expert_unit_bytes.size(), size_t(c.num_layers));
  for (const auto& row : g->expert_unit_bytes) {
    ASSERT_EQ(row.size(), size_t(c.n_routed_experts));
    for (uint64_t b : row) EXPECT_EQ(b, per_expert);
  }
  EXPECT_EQ(d->expert_unit_bytes, g->expert_unit_bytes);
  EXPECT_EQ(g->experts.bytes, per_expert * uint64_t(c.num_layers) * uint64_t(c.n_routed_experts));
  EXPECT_EQ(g->experts.bytes, d->experts.bytes);
  EXPECT_DOUBLE_EQ(double(g->experts.bytes) * 8 / double(g->experts.elements), 4.25);
  // Stacked expert tensors: 3 per main layer plus 3 in the MTP block.
  EXPECT_EQ(g->by_type.at("MXFP4").tensors, 3 * (c.num_layers + 1));
  EXPECT_EQ(g->by_type.count("F8_E4M3"), 0u);
  EXPECT_GT(d->by_type.at("F8_E4M3").tensors, 0);

  // Placement: room for dense + KV + exactly 7 experts puts 7 in VRAM, the
  // first expert of each of five layers and then two more, round-robin.
  const int64_t ctx = 1000;
  const uint64_t kv = dsv4::kv_state_bytes(c, ctx);
  const uint64_t budget = g->dense.bytes + kv + 7 * per_expert + per_expert / 2;
  const dsv4::Placement p = dsv4::plan_placement(*g, budget, ctx);
  EXPECT_TRUE(p.dense_fits);
  EXPECT_EQ(p.experts_vram, 7);
  EXPECT_EQ(p.experts_ram, c.num_layers * c.n_routed_experts - 7);
  EXPECT_EQ(p.expert_bytes_vram, 7 * per_expert);
  const dsv4::Placement none = dsv4::plan_placement(*g, g->dense.bytes / 2, ctx);
  EXPECT_FALSE(none.dense_fits);
  EXPECT_EQ(none.experts_vram, 0);
  // KV: window + compressed entries (+ indexer keys on CSA layers), 4 bytes each.
  uint64_t want_kv = 0;
  for (int l = 0; l < c.num_layers; ++l) {
    const int r = c.compress_ratio(l);
    want_kv += uint64_t(c.sliding_window) * c.head_dim;
    if (r) want_kv += uint64_t(ctx / r) * c.head_dim;
    if (r == 4) want_kv += uint64_t(ctx / 4) * c.index_head_dim;
  }
  EXPECT_EQ(kv, 4 * want_kv);
}

TEST_F(GgufModel, AffInfoReportsAndExitsNonZeroOnProblems) {
  cli::Run r = cli::run("aff-info", {lossless_.string(), "--gpu-mib", "64", "--ctx", "512"}, tmp_->path());
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  for (const char* needle : {"GGUF v3", "MXFP4", "BF16", "routed experts: 40 (5 layers x 8)", "4.250 bpw",
                             "VRAM: dense", "RAM:  0 experts", "problems: none"}) {
    EXPECT_NE(r.out.find(needle), std::string::npos) << needle << "\n" << r.out;
  }
  r = cli::run("aff-info", {ckpt_.string()}, tmp_->path());
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("checkpoint directory"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("F8_E4M3"), std::string::npos) << r.out;

  // Too small a budget is a problem.
  r = cli::run("aff-info", {lossless_.string(), "--gpu-mib", "1"}, tmp_->path());
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("do not fit"), std::string::npos) << r.out;

  // A missing tensor is a problem naming it.
  const fs::path broken = tmp_->path() / "info_broken.gguf";
  ASSERT_TRUE(test::rewrite_gguf(lossless_, broken, {.drop_tensors = {"blk.2.indexer.proj.weight"}}).is_ok());
  r = cli::run("aff-info", {broken.string()}, tmp_->path());
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("blk.2.indexer.proj.weight"), std::string::npos) << r.out;

  // Usage errors exit 2.
  EXPECT_EQ(cli::run("aff-info", {}, tmp_->path()).rc, 2);
  EXPECT_EQ(cli::run("aff-info", {lossless_.string(), "--gpu-mib", "x"}, tmp_->path()).rc, 2);
  EXPECT_EQ(cli::run("aff-info", {(tmp_->path() / "absent").string()}, tmp_->path()).rc, 1);
}

}  // namespace
}  // namespace aff
