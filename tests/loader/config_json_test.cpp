// config.json parsing: the official V4-Flash / -0731 configs, V4.1 refusal,
// MTP count edge cases, and one test per consistency rule.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "../model/config_compare.h"
#include "model/dsv4/config_json.h"
#include "model/dsv4/synthetic_checkpoint.h"

namespace aff::dsv4 {
namespace {

using nlohmann::json;

// DeepSeek-V4-Flash's config.json as published (v4-formats-and-api.md §1.3).
json official_flash() {
  std::vector<int> ratios = {0, 0};
  for (int i = 0; i < 20; ++i) ratios.insert(ratios.end(), {4, 128});
  ratios.insert(ratios.end(), {4, 0});
  return json{{"architectures", {"DeepseekV4ForCausalLM"}},
              {"model_type", "deepseek_v4"},
              {"attention_bias", false},
              {"bos_token_id", 0},
              {"eos_token_id", 1},
              {"compress_ratios", ratios},
              {"compress_rope_theta", 160000},
              {"expert_dtype", "fp4"},
              {"hc_eps", 1e-06},
              {"hc_mult", 4},
              {"hc_sinkhorn_iters", 20},
              {"head_dim", 512},
              {"hidden_act", "silu"},
              {"hidden_size", 4096},
              {"index_head_dim", 128},
              {"index_n_heads", 64},
              {"index_topk", 512},
              {"max_position_embeddings", 1048576},
              {"moe_intermediate_size", 2048},
              {"n_routed_experts", 256},
              {"n_shared_experts", 1},
              {"norm_topk_prob", true},
              {"num_attention_heads", 64},
              {"num_experts_per_tok", 6},
              {"num_hash_layers", 3},
              {"num_hidden_layers", 43},
              {"num_key_value_heads", 1},
              {"num_nextn_predict_layers", 1},
              {"o_groups", 8},
              {"o_lora_rank", 1024},
              {"q_lora_rank", 1024},
              {"qk_rope_head_dim", 64},
              {"quantization_config",
               {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"quant_method", "fp8"},
                {"scale_fmt", "ue8m0"}, {"weight_block_size", {128, 128}}}},
              {"rms_norm_eps", 1e-06},
              {"rope_scaling",
               {{"beta_fast", 32}, {"beta_slow", 1}, {"factor", 16}, {"original_max_position_embeddings", 65536},
                {"type", "yarn"}}},
              {"rope_theta", 10000},
              {"routed_scaling_factor", 1.5},
              {"scoring_func", "sqrtsoftplus"},
              {"sliding_window", 128},
              {"swiglu_limit", 10.0},
              {"tie_word_embeddings", false},
              {"topk_method", "noaux_tc"},
              {"torch_dtype", "bfloat16"},
              {"vocab_size", 129280}};
}

json official_0731() {
  json j = official_flash();
  auto r = j["compress_ratios"].get<std::vector<int>>();
  r.insert(r.end(), {0, 0});  // 46 entries: 43 layers + 3 DSpark stages
  j["compress_ratios"] = r;
  j["dspark_block_size"] = 5;
  j["dspark_markov_rank"] = 256;
  j["dspark_noise_token_id"] = 128799;
  j["dspark_target_layer_ids"] = {40, 41, 42};
  return j;
}

Result<ModelConfig> parse(const json& j) { return parse_config_json(j.dump(), "ckpt/config.json"); }

void expect_error(const Status& s, std::initializer_list<std::string> needles) {
  ASSERT_FALSE(s.is_ok());
  for (const auto& n : needles) EXPECT_NE(s.message().find(n), std::string::npos) << s.message() << "\n  lacks: " << n;
}

TEST(ConfigJson, OfficialFlash) {
  auto r = parse(official_flash());
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.variant, Variant::kV4Flash);
  EXPECT_EQ(c.model_type, "deepseek_v4");
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_layers, 43);
  EXPECT_EQ(c.num_mtp_layers, 1);
  EXPECT_EQ(c.num_dspark_stages, 0);
  EXPECT_EQ(c.num_heads, 64);
  EXPECT_EQ(c.head_dim, 512);
  EXPECT_EQ(c.rope_dim, 64);
  EXPECT_EQ(c.q_lora_rank, 1024);
  EXPECT_EQ(c.o_groups, 8);
  EXPECT_EQ(c.o_lora_rank, 1024);
  EXPECT_EQ(c.sliding_window, 128);
  ASSERT_EQ(c.compress_ratios.size(), 44u);
  EXPECT_EQ(c.compress_ratio(0), 0);
  EXPECT_EQ(c.compress_ratio(2), 4);
  EXPECT_EQ(c.compress_ratio(41), 128);
  EXPECT_EQ(c.compress_ratio(42), 4);
  EXPECT_EQ(c.compress_ratio(43), 0);  // the MTP block
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.compress_rope_theta, 160000.0);
  EXPECT_TRUE(c.rope_scaling.yarn);
  EXPECT_EQ(c.rope_scaling.factor, 16.0);
  EXPECT_EQ(c.rope_scaling.original_max_position, 65536);
  EXPECT_EQ(c.rope_scaling.beta_fast, 32.0);
  EXPECT_EQ(c.rope_scaling.beta_slow, 1.0);
  EXPECT_EQ(c.max_position_embeddings, 1048576);
  EXPECT_EQ(c.index_n_heads, 64);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_topk, 512);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.n_experts_per_tok, 6);
  EXPECT_EQ(c.moe_inter, 2048);
  EXPECT_EQ(c.num_hash_layers, 3);
  EXPECT_TRUE(c.is_hash_layer(2));
  EXPECT_FALSE(c.is_hash_layer(3));
  EXPECT_EQ(c.scoring_func, "sqrtsoftplus");
  EXPECT_EQ(c.routed_scaling_factor, 1.5);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.swiglu_limit, 10.0);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.hc_mult, 4);
  EXPECT_EQ(c.hc_sinkhorn_iters, 20);
  EXPECT_EQ(c.hc_eps, 1e-6);
  EXPECT_TRUE(c.fp8_dense);
  EXPECT_EQ(c.weight_block, 128);
  EXPECT_EQ(c.expert_dtype, "fp4");
  EXPECT_EQ(c.bos_token_id, 0);
  EXPECT_EQ(c.eos_token_id, 1);
}

TEST(ConfigJson, Flash0731IsRecognised) {
  auto r = parse(official_0731());
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->variant, Variant::kV4Flash0731);
  EXPECT_EQ(r->num_mtp_layers, 0);
  EXPECT_EQ(r->num_dspark_stages, 3);
  EXPECT_EQ(r->dspark_block_size, 5);
  EXPECT_EQ(r->dspark_markov_rank, 256);
  EXPECT_EQ(r->dspark_noise_token_id, 128799);
  EXPECT_EQ(r->dspark_target_layer_ids, (std::vector<int>{40, 41, 42}));

  // 46 compress_ratios alone are enough to recognise it.
  json j = official_0731();
  for (const char* k : {"dspark_block_size", "dspark_markov_rank", "dspark_noise_token_id", "dspark_target_layer_ids"})
    j.erase(k);
  auto r2 = parse(j);
  ASSERT_TRUE(r2.is_ok()) << r2.status().message();
  EXPECT_EQ(r2->variant, Variant::kV4Flash0731);
  EXPECT_EQ(r2->num_dspark_stages, 3);
  EXPECT_EQ(r2->dspark_target_layer_ids, (std::vector<int>{40, 41, 42}));
}

TEST(ConfigJson, V41IsRefusedClearly) {
  json a = official_flash();
  a["model_type"] = "deepseek_v41";
  auto ra = parse(a);
  expect_error(ra.status(), {"ckpt/config.json", "V4.1", "not supported"});
  EXPECT_EQ(ra.status().code(), StatusCode::kUnsupported);

  // The released V4.1 config nests the text model under text_config.
  json b = {{"architectures", {"DeepseekV41ForConditionalGeneration"}},
            {"text_config", {{"hidden_size", 5120}, {"engram_layer_ids", {1, 14}}, {"num_hidden_layers", 40}}},
            {"vision_config", {{"hidden_size", 1024}}}};
  auto rb = parse(b);
  expect_error(rb.status(), {"ckpt/config.json", "V4.1"});
  EXPECT_EQ(rb.status().code(), StatusCode::kUnsupported);

  json c = {{"model_type", "something_else"}, {"text_config", {{"engram_vocab_size", 16000000}}}};
  EXPECT_EQ(parse(c).status().code(), StatusCode::kUnsupported);

  json d = official_flash();
  d["model_type"] = "deepseek_v3";
  expect_error(parse(d).status(), {"ckpt/config.json", "'model_type'", "deepseek_v3"});
}

TEST(ConfigJson, NextnZeroOneAndAbsent) {
  json j = official_flash();
  j["num_nextn_predict_layers"] = 0;
  auto zero = parse(j);
  ASSERT_TRUE(zero.is_ok()) << zero.status().message();
  EXPECT_EQ(zero->num_mtp_layers, 0);
  EXPECT_EQ(zero->variant, Variant::kV4Flash);
  j.erase("num_nextn_predict_layers");
  auto absent = parse(j);
  ASSERT_TRUE(absent.is_ok()) << absent.status().message();
  EXPECT_EQ(absent->num_mtp_layers, 0);
  j["num_nextn_predict_layers"] = 1;
  EXPECT_EQ(parse(j)->num_mtp_layers, 1);
  // Without the trailing MTP entry there is no ratio for the MTP block.
  auto r = j["compress_ratios"].get<std::vector<int>>();
  r.pop_back();
  j["compress_ratios"] = r;
  expect_error(parse(j).status(), {"ckpt/config.json", "'compress_ratios'", "43 entries", "44 are needed"});
}

TEST(ConfigJson, UnreadableAndInvalidFiles) {
  expect_error(parse_config_json("{\"model_type\": ", "dir/config.json").status(), {"dir/config.json", "JSON"});
  expect_error(parse_config_json("[]", "dir/config.json").status(), {"dir/config.json", "object"});
  const std::string missing = (std::filesystem::temp_directory_path() / "aff_no_such_dir" / "config.json").string();
  auto r = load_config_json(missing);
  expect_error(r.status(), {missing});
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
}

struct FieldCase {
  const char* what;
  std::function<void(json&)> edit;
  std::vector<std::string> needles;
};

TEST(ConfigJson, EveryConsistencyRuleNamesItsField) {
  const std::vector<FieldCase> cases = {
      {"missing hidden_size", [](json& j) { j.erase("hidden_size"); }, {"'hidden_size'", "missing"}},
      {"string hidden_size", [](json& j) { j["hidden_size"] = "4096"; }, {"'hidden_size'", "integer"}},
      {"fractional head_dim", [](json& j) { j["head_dim"] = 511.5; }, {"'head_dim'", "integer"}},
      {"heads not divisible by o_groups", [](json& j) { j["o_groups"] = 7; }, {"'o_groups'", "divide"}},
      {"odd rope dim", [](json& j) { j["qk_rope_head_dim"] = 63; }, {"'qk_rope_head_dim'", "even"}},
      {"rope dim not below head_dim", [](json& j) { j["qk_rope_head_dim"] = 512; }, {"'qk_rope_head_dim'"}},
      {"no index_topk with CSA layers", [](json& j) { j["index_topk"] = 0; }, {"'index_topk'"}},
      {"index_topk absent with CSA layers", [](json& j) { j.erase("index_topk"); }, {"'index_topk'"}},
      {"index head dim not pow2", [](json& j) { j["index_head_dim"] = 96; }, {"'index_head_dim'", "power of two"}},
      {"experts_per_tok > experts", [](json& j) { j["num_experts_per_tok"] = 300; }, {"'num_experts_per_tok'"}},
      {"hash layers beyond model", [](json& j) { j["num_hash_layers"] = 44; }, {"'num_hash_layers'"}},
      {"negative ratio", [](json& j) { j["compress_ratios"][5] = -4; }, {"'compress_ratios'", "entry 5"}},
      {"ratio 1", [](json& j) { j["compress_ratios"][3] = 1; }, {"'compress_ratios'", "entry 3"}},
      {"ratios not a list", [](json& j) { j["compress_ratios"] = 4; }, {"'compress_ratios'", "list"}},
      {"zero layers", [](json& j) { j["num_hidden_layers"] = 0; }, {"'num_hidden_layers'"}},
      {"several kv heads", [](json& j) { j["num_key_value_heads"] = 8; }, {"'num_key_value_heads'"}},
      {"unknown scoring", [](json& j) { j["scoring_func"] = "softmax"; }, {"'scoring_func'", "softmax"}},
      {"two shared experts", [](json& j) { j["n_shared_experts"] = 2; }, {"'n_shared_experts'"}},
      {"unknown expert dtype", [](json& j) { j["expert_dtype"] = "int4"; }, {"'expert_dtype'", "int4"}},
      {"fp4 with hidden not /32", [](json& j) { j["hidden_size"] = 4100; }, {"'expert_dtype'", "32"}},
      {"non-yarn scaling", [](json& j) { j["rope_scaling"]["type"] = "linear"; }, {"'rope_scaling.type'"}},
      {"yarn without factor", [](json& j) { j["rope_scaling"].erase("factor"); }, {"'rope_scaling.factor'"}},
      {"other quant method", [](json& j) { j["quantization_config"]["quant_method"] = "gptq"; },
       {"'quantization_config.quant_method'", "gptq"}},
      {"non-square block", [](json& j) { j["quantization_config"]["weight_block_size"] = {128, 64}; },
       {"'quantization_config.weight_block_size'"}},
      {"tied embeddings", [](json& j) { j["tie_word_embeddings"] = true; }, {"'tie_word_embeddings'"}},
      {"eos outside vocab", [](json& j) { j["eos_token_id"] = 129280; }, {"'eos_token_id'"}},
      {"bad norm flag", [](json& j) { j["norm_topk_prob"] = "yes"; }, {"'norm_topk_prob'"}},
  };
  for (const FieldCase& fc : cases) {
    SCOPED_TRACE(fc.what);
    json j = official_flash();
    fc.edit(j);
    auto r = parse(j);
    ASSERT_FALSE(r.is_ok());
    for (const auto& n : fc.needles) {
      EXPECT_NE(r.status().message().find(n), std::string::npos) << r.status().message() << "\n  lacks: " << n;
    }
    EXPECT_NE(r.status().message().find("ckpt/config.json"), std::string::npos) << r.status().message();
  }
}

TEST(ConfigJson, ToleratedSpellings) {
  json j = official_flash();
  j["eos_token_id"] = {1, 128803};
  j["rope_scaling"]["original_max_position_embeddings"] = 65536.0;  // integral float
  j.erase("expert_dtype");
  j["quantization_config"]["expert_dtype"] = "fp4";  // where transformers moves it
  auto r = parse(j);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->eos_token_id, 1);
  EXPECT_EQ(r->rope_scaling.original_max_position, 65536);
  EXPECT_EQ(r->expert_dtype, "fp4");

  j["rope_scaling"] = nullptr;
  j.erase("quantization_config");
  j.erase("expert_dtype");
  auto plain = parse(j);
  ASSERT_TRUE(plain.is_ok()) << plain.status().message();
  EXPECT_FALSE(plain->rope_scaling.yarn);
  EXPECT_FALSE(plain->fp8_dense);
  EXPECT_EQ(plain->expert_dtype, "");
}

TEST(ConfigJson, SerialiseRoundTrips) {
  std::mt19937 rng(std::random_device{}());
  for (Variant v : {Variant::kV4Flash, Variant::kV4Flash0731}) {
    ModelConfig c = synthetic_tiny_config(v);
    c.rms_norm_eps = 1e-6 * (1.0 + (rng() % 1000) / 1000.0);  // an arbitrary double survives the trip
    c.routed_scaling_factor = 0.5 + (rng() % 997) / 100.0;
    auto r = parse_config_json(config_to_json(c), "roundtrip/config.json");
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    dsv4::testing::expect_same_config(c, *r, dsv4::testing::ConfigFields::kExact);
  }
  auto official = parse(official_0731());
  ASSERT_TRUE(official.is_ok());
  auto again = parse_config_json(config_to_json(*official), "x/config.json");
  ASSERT_TRUE(again.is_ok()) << again.status().message();
  dsv4::testing::expect_same_config(*official, *again, dsv4::testing::ConfigFields::kExact);
}

}  // namespace
}  // namespace aff::dsv4
