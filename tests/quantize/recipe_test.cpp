#include <gtest/gtest.h>

#include "quant/quantizer/recipe.h"

namespace aff::quant {
namespace {

TEST(Recipe, RolesOfDeepseek4Names) {
  EXPECT_EQ(tensor_role("blk.7.ffn_gate_exps.weight"), TensorRole::kExpertGateUp);
  EXPECT_EQ(tensor_role("blk.7.ffn_up_exps.weight"), TensorRole::kExpertGateUp);
  EXPECT_EQ(tensor_role("mtp.0.ffn_down_exps.weight"), TensorRole::kExpertDown);
  EXPECT_EQ(tensor_role("blk.0.attn_q_b.weight"), TensorRole::kDense);
  EXPECT_EQ(tensor_role("blk.3.ffn_down_shexp.weight"), TensorRole::kDense);
  EXPECT_EQ(tensor_role("mtp.0.e_proj.weight"), TensorRole::kDense);
  EXPECT_EQ(tensor_role("output.weight"), TensorRole::kOutput);
  EXPECT_EQ(tensor_role("token_embd.weight"), TensorRole::kEmbedding);
  EXPECT_EQ(tensor_role("blk.2.ffn_gate_inp.weight"), TensorRole::kSide);
  EXPECT_EQ(tensor_role("blk.2.indexer.attn_q_b.weight"), TensorRole::kSide);
  EXPECT_EQ(tensor_role("blk.2.indexer_compressor_kv.weight"), TensorRole::kSide);
  EXPECT_EQ(tensor_role("blk.1.ffn_gate_tid2eid.weight"), TensorRole::kExpertIds);
  for (const char* small : {"blk.0.attn_norm.weight", "blk.0.hc_attn_fn.weight", "blk.0.attn_sinks.weight",
                            "blk.2.attn_compressor_ape.weight", "blk.4.exp_probs_b.bias", "output_hc_fn.weight"}) {
    EXPECT_EQ(tensor_role(small), TensorRole::kSmallF32) << small;
  }
}

TEST(Recipe, ExpertTypesPerRecipeAndTheQ2BitsPerWeight) {
  auto q2 = recipe_by_name("q2");
  ASSERT_TRUE(q2.is_ok());
  EXPECT_EQ(q2->expert_gate_up, GgmlType::kIQ2_XXS);
  EXPECT_EQ(q2->expert_down, GgmlType::kQ2_K);
  const double bpw = (2 * ggml_bits_per_weight(q2->expert_gate_up) + ggml_bits_per_weight(q2->expert_down)) / 3;
  EXPECT_NEAR(bpw, 2.25, 0.01);
  EXPECT_EQ(recipe_by_name("q4")->expert_down, GgmlType::kQ4_K);
  EXPECT_EQ(recipe_by_name("q8")->expert_gate_up, GgmlType::kQ8_0);
  EXPECT_EQ(recipe_by_name("mxfp4")->expert_gate_up, GgmlType::kMXFP4);
  const auto bad = recipe_by_name("q3");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("q3"), std::string::npos);
}

TEST(Recipe, GlobMatching) {
  EXPECT_TRUE(glob_match("blk.*.ffn_down_exps.weight", "blk.12.ffn_down_exps.weight"));
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_TRUE(glob_match("blk.?.attn*", "blk.3.attn_q_a.weight"));
  EXPECT_FALSE(glob_match("blk.?.attn*", "blk.13.attn_q_a.weight"));
  EXPECT_TRUE(glob_match("*exps*", "mtp.0.ffn_up_exps.weight"));
  EXPECT_FALSE(glob_match("*exps", "mtp.0.ffn_up_exps.weight"));
  EXPECT_TRUE(glob_match("a*b*c", "aXXbYYbZc"));
}

TEST(Recipe, TypeRulesParseAndRejectBadSpecs) {
  auto r = parse_type_rule("blk.*.ffn_down_exps.weight=q4_k");
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->pattern, "blk.*.ffn_down_exps.weight");
  EXPECT_EQ(r->type, GgmlType::kQ4_K);
  EXPECT_FALSE(parse_type_rule("no-equals").is_ok());
  EXPECT_FALSE(parse_type_rule("=Q4_K").is_ok());
  EXPECT_FALSE(parse_type_rule("x=").is_ok());
  EXPECT_EQ(parse_type_rule("x=Q9_Z").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(parse_type_rule("x=IQ3_S").status().code(), StatusCode::kUnsupported);  // no quantiser
  for (const char* iq : {"IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ1_M"}) {
    const auto rule = parse_type_rule(std::string("blk.*.ffn_up_exps.weight=") + iq);
    ASSERT_TRUE(rule.is_ok()) << iq;
    EXPECT_EQ(ggml_type_name(rule->type), iq);
  }
}

TEST(Recipe, RulesOverrideLastMatchWinsAndSmallTensorsStayF32) {
  const Recipe q4 = *recipe_by_name("q4");
  const std::vector<TypeRule> rules = {{"*exps*", GgmlType::kQ8_0}, {"blk.1.*", GgmlType::kQ2_K}};
  EXPECT_EQ(choose_type(q4, rules, "blk.0.ffn_up_exps.weight", 4096).type, GgmlType::kQ8_0);
  EXPECT_EQ(choose_type(q4, rules, "blk.1.ffn_up_exps.weight", 4096).type, GgmlType::kQ2_K);
  EXPECT_EQ(choose_type(q4, rules, "blk.1.attn_norm.weight", 4096).type, GgmlType::kF32);
  EXPECT_EQ(choose_type(q4, rules, "blk.1.ffn_gate_tid2eid.weight", 6).type, GgmlType::kI32);
  EXPECT_EQ(choose_type(q4, {}, "blk.0.attn_q_a.weight", 4096).type, GgmlType::kQ8_0);
  EXPECT_EQ(choose_type(q4, {}, "token_embd.weight", 4096).type, GgmlType::kF16);
}

TEST(Recipe, BlockSizeFallback) {
  const Recipe q2 = *recipe_by_name("q2");
  const TypeChoice a = choose_type(q2, {}, "blk.0.ffn_up_exps.weight", 160);  // 160 % 256 != 0, % 32 == 0
  EXPECT_EQ(a.wanted, GgmlType::kIQ2_XXS);
  EXPECT_EQ(a.type, GgmlType::kQ8_0);
  EXPECT_TRUE(a.fell_back());
  const TypeChoice b = choose_type(q2, {}, "blk.0.attn_q_a.weight", 100);
  EXPECT_EQ(b.type, GgmlType::kF16);
  EXPECT_FALSE(choose_type(q2, {}, "blk.0.ffn_up_exps.weight", 512).fell_back());
}

}  // namespace
}  // namespace aff::quant
