// aff-quantize's library entry on synthetic V4 checkpoints: byte-identical output at any
// thread count, the container's names/types/shapes and values, tokenizer metadata,
// imatrix use and the expert popularity profile.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include <fmt/format.h>

#include "backend/ref/linear.h"
#include "format/gguf_reader.h"
#include "format/gguf_writer.h"
#include "format/tensor_index.h"
#include "model/dsv4/config_gguf.h"
#include "model/dsv4/config_json.h"
#include "model/dsv4/weights_bind.h"
#include "quant/codec.h"
#include "quant/quantizer/quantize_model.h"
#include "quantize_test_util.h"

namespace aff::quant {
namespace {

using testing::ScratchDir;
namespace fs = std::filesystem;

std::string write_checkpoint(const ScratchDir& dir, const dsv4::ModelConfig& cfg, const std::string& name,
                             bool tokenizer = false) {
  const std::string path = dir.str(name);
  dsv4::SyntheticCheckpointOptions opt;
  opt.seed = std::random_device{}();
  opt.max_shard_bytes = 1 << 20;  // several shards
  EXPECT_TRUE(dsv4::write_synthetic_checkpoint(cfg, path, opt).is_ok());
  if (tokenizer) {
    const std::string tj = testing::tiny_tokenizer_json(int(cfg.vocab_size) - 10);
    testing::write_file(fs::path(path) / "tokenizer.json", tj.data(), tj.size());
  }
  return path;
}

Result<QuantizeSummary> run(const std::string& src, const std::string& out, const std::string& recipe, int threads,
                            const std::string& imatrix = "") {
  QuantizeOptions o;
  o.src_dir = src;
  o.out_path = out;
  o.recipe = recipe;
  o.threads = threads;
  o.imatrix_path = imatrix;
  return quantize_checkpoint(o);
}

// Source values of HF tensor `hf` row r (via the same Linear view the quantiser uses).
std::vector<float> source_row(const format::TensorIndex& index, const dsv4::ModelConfig& cfg, const std::string& stem,
                              int64_t out, int64_t in, int64_t r) {
  dsv4::Linear l;
  l.weight = *index.get(stem + ".weight");
  l.out = out;
  l.in = in;
  l.block = cfg.weight_block;
  l.format = l.weight.dtype == DType::kI8 ? dsv4::WeightFormat::kMXFP4 : dsv4::WeightFormat::kFP8Block;
  l.scale = *index.get(stem + ".scale");
  std::vector<float> row(static_cast<size_t>(in));
  ref::linear_dequant_row(l, r, row.data());
  return row;
}

std::vector<float> gguf_row(const format::GgufFile& g, const std::string& name, int64_t mat, int64_t r) {
  const auto* t = g.find_tensor(name);
  EXPECT_NE(t, nullptr) << name;
  const int64_t rb = *ggml_row_bytes(t->type, t->ne[0]);
  const int64_t rows = t->ne.size() > 1 ? t->ne[1] : 1;
  std::vector<float> out(size_t(t->ne[0]));
  const auto data = g.tensor_data(*t);
  EXPECT_TRUE(dequantize_row(t->type, data.subspan(size_t((mat * rows + r) * rb), size_t(rb)), out).is_ok());
  return out;
}

double rel_rms(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) e += (a[i] - b[i]) * (a[i] - b[i]), n += double(b[i]) * b[i];
  return std::sqrt(e / std::max(n, 1e-30));
}

TEST(QuantizeModel, ByteIdenticalAtAnyThreadCount) {
  ScratchDir dir;
  const auto cfg = testing::k_quant_config();
  const std::string src = write_checkpoint(dir, cfg, "ckpt", true);
  for (const char* recipe : {"q2", "q4"}) {
    std::vector<uint8_t> first;
    for (int threads : {1, 2, 3}) {
      const std::string out = dir.str(std::string(recipe) + "-t" + std::to_string(threads) + ".gguf");
      auto r = run(src, out, recipe, threads);
      ASSERT_TRUE(r.is_ok()) << r.status().message();
      const auto bytes = testing::read_file(out);
      ASSERT_GT(bytes.size(), r->data_bytes);
      if (first.empty()) {
        first = bytes;
      } else {
        EXPECT_TRUE(bytes == first) << recipe << ": --threads " << threads << " differs from --threads 1";
      }
      EXPECT_FALSE(fs::exists(out + ".tmp"));
    }
  }
}

TEST(QuantizeModel, ContainerHasDeepseek4NamesTypesShapesAndCloseValues) {
  ScratchDir dir;
  const auto cfg = testing::k_quant_config();
  const std::string src = write_checkpoint(dir, cfg, "ckpt", true);
  const std::string out = dir.str("q2.gguf");
  auto sum = run(src, out, "q2", 2);
  ASSERT_TRUE(sum.is_ok()) << sum.status().message();
  // Dense rows of odd width (q_lora 48, o_lora 40) fall back; the experts never do.
  EXPECT_GT(sum->fallbacks, 0u);
  EXPECT_NEAR(8.0 * double(sum->expert_bytes) / double(sum->expert_elements), 2.25, 0.01);

  auto g = format::GgufFile::open(out);
  ASSERT_TRUE(g.is_ok()) << g.status().message();
  EXPECT_EQ(*g->architecture(), "deepseek4");
  auto back = dsv4::config_from_gguf(*g);
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  EXPECT_EQ(back->num_layers, cfg.num_layers);
  EXPECT_EQ(back->n_routed_experts, cfg.n_routed_experts);
  EXPECT_EQ(*g->get_string(std::string(kGgufKeyQuantizeRecipe)), "q2");

  const auto type_of = [&](const std::string& n) { return g->find_tensor(n)->type; };
  const int64_t E = cfg.n_routed_experts, D = cfg.hidden_size, I = cfg.moe_inter;
  const auto* up = g->find_tensor("blk.2.ffn_up_exps.weight");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(up->ne, (std::vector<int64_t>{D, I, E}));
  EXPECT_EQ(up->type, GgmlType::kIQ2_XXS);
  EXPECT_EQ(g->find_tensor("blk.2.ffn_down_exps.weight")->ne, (std::vector<int64_t>{I, D, E}));
  EXPECT_EQ(type_of("blk.2.ffn_down_exps.weight"), GgmlType::kQ2_K);
  EXPECT_EQ(type_of("blk.2.ffn_gate_exps.weight"), GgmlType::kIQ2_XXS);
  EXPECT_EQ(type_of("blk.0.attn_q_a.weight"), GgmlType::kQ8_0);
  EXPECT_EQ(type_of("blk.0.ffn_gate_shexp.weight"), GgmlType::kQ8_0);
  EXPECT_EQ(type_of("output.weight"), GgmlType::kQ8_0);
  EXPECT_EQ(type_of("token_embd.weight"), GgmlType::kF16);
  EXPECT_EQ(type_of("blk.2.ffn_gate_inp.weight"), GgmlType::kF16);
  EXPECT_EQ(type_of("blk.0.attn_norm.weight"), GgmlType::kF32);
  EXPECT_EQ(type_of("blk.0.hc_attn_fn.weight"), GgmlType::kF32);
  EXPECT_EQ(type_of("blk.0.attn_sinks.weight"), GgmlType::kF32);
  EXPECT_EQ(type_of("blk.2.exp_probs_b.bias"), GgmlType::kF32);
  EXPECT_EQ(type_of("blk.0.ffn_gate_tid2eid.weight"), GgmlType::kI32);
  EXPECT_NE(g->find_tensor("mtp.0.e_proj.weight"), nullptr);
  // Every checkpoint tensor except .scale companions and expert slices has one GGUF tensor:
  // count them.
  auto index = format::TensorIndex::open_dir(src);
  ASSERT_TRUE(index.is_ok());
  size_t plain = 0;
  for (const auto& [name, v] : index->tensors()) {
    const bool scale = name.size() > 6 && name.substr(name.size() - 6) == ".scale";
    if (!scale && name.find(".experts.") == std::string::npos) ++plain;
  }
  const size_t layers_with_experts = size_t(cfg.num_layers + cfg.num_mtp_layers);
  EXPECT_EQ(g->tensors().size(), plain + 3 * layers_with_experts);

  // Values: expert 3's row 7 of the up projection is within IQ2_XXS error of the source;
  // a Q8_0 dense row is within Q8_0 error; tid2eid is exact.
  const auto src_up = source_row(*index, cfg, "layers.2.ffn.experts.3.w3", I, D, 7);
  EXPECT_LT(rel_rms(gguf_row(*g, "blk.2.ffn_up_exps.weight", 3, 7), src_up), 0.45);
  const auto src_q = source_row(*index, cfg, "layers.1.attn.wq_a", cfg.q_lora_rank, D, 3);
  EXPECT_LT(rel_rms(gguf_row(*g, "blk.1.attn_q_a.weight", 0, 3), src_q), 0.01);
  const auto ids = index->get("layers.0.ffn.gate.tid2eid");
  const auto* gid = g->find_tensor("blk.0.ffn_gate_tid2eid.weight");
  ASSERT_EQ(gid->ne, (std::vector<int64_t>{cfg.n_experts_per_tok, cfg.vocab_size}));
  const auto gids = g->tensor_data(*gid);
  for (int64_t i = 0; i < ids->numel(); ++i) {
    int32_t v;
    std::memcpy(&v, gids.data() + 4 * i, 4);
    const int64_t want = ids->dtype == DType::kI64 ? ids->as<int64_t>()[i] : ids->as<int32_t>()[i];
    ASSERT_EQ(v, want) << i;
  }

  // Tokenizer metadata from tokenizer.json, padded to vocab_size.
  const auto* toks = g->find("tokenizer.ggml.tokens");
  ASSERT_NE(toks, nullptr);
  ASSERT_EQ(toks->array_size(), size_t(cfg.vocab_size));
  const int nb = int(cfg.vocab_size) - 10;
  EXPECT_EQ(toks->array_strings()[5], "t5");
  EXPECT_EQ(toks->array_strings()[size_t(nb)], "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(toks->array_strings()[size_t(cfg.vocab_size - 1)], fmt::format("[PAD{}]", cfg.vocab_size - 1));
  const auto* types = g->find("tokenizer.ggml.token_type");
  EXPECT_EQ(types->array_int(5), 1);
  EXPECT_EQ(types->array_int(size_t(nb)), 3);
  EXPECT_EQ(types->array_int(size_t(nb + 1)), 4);
  EXPECT_EQ(types->array_int(size_t(nb + 2)), 5);
  EXPECT_EQ(*g->get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(*g->get_string("tokenizer.ggml.pre"), "joyai-llm");
  EXPECT_EQ(g->find("tokenizer.ggml.merges")->array_strings(), (std::vector<std::string>{"t1 t2", "t3 t4"}));
}

TEST(QuantizeModel, Mxfp4RecipeIsLosslessForFp4Experts) {
  ScratchDir dir;
  const auto cfg = dsv4::synthetic_tiny_config();  // odd widths: dense rows fall back
  const std::string src = write_checkpoint(dir, cfg, "ckpt");
  const std::string out = dir.str("mx.gguf");
  auto sum = run(src, out, "mxfp4", 2);
  ASSERT_TRUE(sum.is_ok()) << sum.status().message();
  auto g = format::GgufFile::open(out);
  auto index = format::TensorIndex::open_dir(src);
  ASSERT_TRUE(g.is_ok() && index.is_ok());
  EXPECT_EQ(g->find_tensor("blk.2.ffn_gate_exps.weight")->type, GgmlType::kMXFP4);
  for (int e : {0, 3, cfg.n_routed_experts - 1}) {
    for (int64_t r : {int64_t(0), int64_t(cfg.moe_inter - 1)}) {
      const auto want = source_row(*index, cfg, fmt::format("layers.2.ffn.experts.{}.w1", e), cfg.moe_inter,
                                   cfg.hidden_size, r);
      EXPECT_EQ(gguf_row(*g, "blk.2.ffn_gate_exps.weight", e, r), want) << "expert " << e << " row " << r;
    }
  }
}

TEST(QuantizeModel, OddWidthsFallBackAndLayersTruncate) {
  ScratchDir dir;
  const auto cfg = dsv4::synthetic_tiny_config();  // hidden 160, moe_inter 64
  const std::string src = write_checkpoint(dir, cfg, "ckpt");
  QuantizeOptions o;
  o.src_dir = src;
  o.out_path = dir.str("q4-l3.gguf");
  o.recipe = "q4";
  o.max_layers = 3;
  std::vector<std::string> notes;
  o.on_note = [&](const std::string& s) { notes.push_back(s); };
  auto sum = quantize_checkpoint(o);
  ASSERT_TRUE(sum.is_ok()) << sum.status().message();
  EXPECT_GT(sum->fallbacks, 0u);
  auto g = format::GgufFile::open(o.out_path);
  ASSERT_TRUE(g.is_ok());
  EXPECT_EQ(g->find_tensor("blk.0.ffn_up_exps.weight")->type, GgmlType::kQ8_0);  // 160 % 256 != 0
  EXPECT_EQ(*g->get_uint("deepseek4.block_count"), 3u);
  EXPECT_NE(g->find_tensor("blk.2.attn_q_a.weight"), nullptr);
  EXPECT_EQ(g->find_tensor("blk.3.attn_q_a.weight"), nullptr);
  EXPECT_NE(g->find_tensor("mtp.0.attn_q_a.weight"), nullptr);
  auto back = dsv4::config_from_gguf(*g);
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  EXPECT_EQ(back->num_layers, 3);
  EXPECT_EQ(back->compress_ratios, (std::vector<int>{0, 0, 4, 0}));
  bool fallback_noted = false, no_tokenizer_noted = false;
  for (const auto& n : notes) {
    fallback_noted = fallback_noted || n.find("not a multiple") != std::string::npos;
    no_tokenizer_noted = no_tokenizer_noted || n.find("tokenizer.json") != std::string::npos;
  }
  EXPECT_TRUE(fallback_noted);
  EXPECT_TRUE(no_tokenizer_noted);
  QuantizeOptions bad = o;
  bad.max_layers = cfg.num_layers + 1;
  EXPECT_EQ(quantize_checkpoint(bad).status().code(), StatusCode::kInvalidArgument);
}

// GGUF imatrix for every expert stack: random in_sum2, per-expert counts.
void write_expert_imatrix(const std::string& path, const dsv4::ModelConfig& cfg, std::mt19937& rng,
                          std::vector<std::vector<float>>* counts_out, int64_t width_error = 0) {
  format::GgufWriter w(path);
  ASSERT_TRUE(w.set("general.type", format::GgufValue::string("imatrix")).is_ok());
  const int64_t E = cfg.n_routed_experts;
  struct Entry {
    std::string name;
    int64_t cols;
  };
  std::vector<Entry> entries;
  for (int L = 0; L < cfg.num_layers; ++L) {
    entries.push_back({fmt::format("blk.{}.ffn_gate_exps.weight", L), cfg.hidden_size + width_error});
    entries.push_back({fmt::format("blk.{}.ffn_up_exps.weight", L), cfg.hidden_size});
    entries.push_back({fmt::format("blk.{}.ffn_down_exps.weight", L), cfg.moe_inter});
  }
  for (const auto& e : entries) {
    ASSERT_TRUE(w.add_tensor(e.name + ".in_sum2", GgmlType::kF32, {e.cols, E}).is_ok());
    ASSERT_TRUE(w.add_tensor(e.name + ".counts", GgmlType::kF32, {1, E}).is_ok());
  }
  ASSERT_TRUE(w.write_header().is_ok());
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  counts_out->assign(size_t(cfg.num_layers), {});
  for (size_t k = 0; k < entries.size(); ++k) {
    std::vector<float> counts(static_cast<size_t>(E));
    for (auto& c : counts) c = float(1 + rng() % 50);
    if (k % 3 == 0) (*counts_out)[k / 3] = counts;
    std::vector<float> sum2(size_t(entries[k].cols * E));
    // Strongly uneven importance so weighted rounding visibly differs.
    for (size_t i = 0; i < sum2.size(); ++i) sum2[i] = counts[i / size_t(entries[k].cols)] * std::pow(u(rng), 4.0f) * 100;
    ASSERT_TRUE(w.append({reinterpret_cast<const uint8_t*>(sum2.data()), sum2.size() * 4}).is_ok());
    ASSERT_TRUE(w.append({reinterpret_cast<const uint8_t*>(counts.data()), counts.size() * 4}).is_ok());
  }
  ASSERT_TRUE(w.finish().is_ok());
}

TEST(QuantizeModel, ImatrixWeightsRoundingAndStoresExpertPopularity) {
  ScratchDir dir;
  const auto cfg = testing::k_quant_config();
  const std::string src = write_checkpoint(dir, cfg, "ckpt");
  std::mt19937 rng(std::random_device{}());
  std::vector<std::vector<float>> counts;
  const std::string im = dir.str("imatrix.gguf");
  write_expert_imatrix(im, cfg, rng, &counts);
  const std::string plain = dir.str("plain.gguf"), weighted = dir.str("weighted.gguf"), weighted3 = dir.str("w3.gguf");
  ASSERT_TRUE(run(src, plain, "q2", 2).is_ok());
  auto sum = run(src, weighted, "q2", 1, im);
  ASSERT_TRUE(sum.is_ok()) << sum.status().message();
  EXPECT_TRUE(sum->popularity_written);
  EXPECT_EQ(sum->imatrix_tensors, size_t(3 * cfg.num_layers));
  ASSERT_TRUE(run(src, weighted3, "q2", 3, im).is_ok());
  EXPECT_TRUE(testing::read_file(weighted) == testing::read_file(weighted3));

  auto gp = format::GgufFile::open(plain);
  auto gw = format::GgufFile::open(weighted);
  ASSERT_TRUE(gp.is_ok() && gw.is_ok());
  const auto* tp = gp->find_tensor("blk.2.ffn_up_exps.weight");
  const auto* tw = gw->find_tensor("blk.2.ffn_up_exps.weight");
  const auto bp = gp->tensor_data(*tp), bw = gw->tensor_data(*tw);
  EXPECT_FALSE(std::equal(bp.begin(), bp.end(), bw.begin())) << "imatrix did not change the rounding";
  // Dense tensors have no imatrix entry: identical.
  const auto* dp = gp->find_tensor("blk.2.attn_q_a.weight");
  const auto* dw = gw->find_tensor("blk.2.attn_q_a.weight");
  EXPECT_TRUE(std::ranges::equal(gp->tensor_data(*dp), gw->tensor_data(*dw)));

  const auto* pop = gw->find(std::string(kGgufKeyExpertPopularity));
  ASSERT_NE(pop, nullptr);
  ASSERT_EQ(pop->array_size(), size_t(cfg.num_layers * cfg.n_routed_experts));
  for (int L = 0; L < cfg.num_layers; ++L) {
    double total = 0;
    for (float c : counts[size_t(L)]) total += c;
    double row = 0;
    for (int e = 0; e < cfg.n_routed_experts; ++e) {
      const double p = *pop->array_float(size_t(L * cfg.n_routed_experts + e));
      EXPECT_NEAR(p, counts[size_t(L)][size_t(e)] / total, 1e-6);
      row += p;
    }
    EXPECT_NEAR(row, 1.0, 1e-5);
  }
  EXPECT_EQ(gp->find(std::string(kGgufKeyExpertPopularity)), nullptr);

  // An imatrix whose widths do not fit the tensors fails, naming the tensor, and leaves no file.
  const std::string bad_im = dir.str("bad.gguf");
  write_expert_imatrix(bad_im, cfg, rng, &counts, 32);
  const std::string bad_out = dir.str("bad-out.gguf");
  auto bad = run(src, bad_out, "q2", 2, bad_im);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("ffn_gate_exps"), std::string::npos) << bad.status().message();
  EXPECT_FALSE(fs::exists(bad_out));
  EXPECT_FALSE(fs::exists(bad_out + ".tmp"));
}

}  // namespace
}  // namespace aff::quant
