#include <gtest/gtest.h>

#include "format/gguf_dsv4_names.h"

namespace aff::format {
namespace {

using Kind = Dsv4GgufName::Kind;

TEST(Dsv4Names, HfToGgufAndBack) {
  const std::pair<const char*, const char*> cases[] = {
      {"embed.weight", "token_embd.weight"},
      {"head.weight", "output.weight"},
      {"norm.weight", "output_norm.weight"},
      {"hc_head_fn", "output_hc_fn.weight"},
      {"hc_head_scale", "output_hc_scale.weight"},
      {"layers.0.hc_attn_fn", "blk.0.hc_attn_fn.weight"},
      {"layers.42.hc_ffn_base", "blk.42.hc_ffn_base.weight"},
      {"layers.7.attn.wq_a.weight", "blk.7.attn_q_a.weight"},
      {"layers.7.attn.q_norm.weight", "blk.7.attn_q_a_norm.weight"},
      {"layers.7.attn.wkv.weight", "blk.7.attn_kv.weight"},
      {"layers.7.attn.kv_norm.weight", "blk.7.attn_kv_a_norm.weight"},
      {"layers.7.attn.wo_b.weight", "blk.7.attn_output_b.weight"},
      {"layers.7.attn.attn_sink", "blk.7.attn_sinks.weight"},
      {"layers.2.attn.compressor.ape", "blk.2.attn_compressor_ape.weight"},
      {"layers.2.attn.compressor.wgate.weight", "blk.2.attn_compressor_gate.weight"},
      {"layers.2.attn.indexer.wq_b.weight", "blk.2.indexer.attn_q_b.weight"},
      {"layers.2.attn.indexer.weights_proj.weight", "blk.2.indexer.proj.weight"},
      {"layers.2.attn.indexer.compressor.norm.weight", "blk.2.indexer_compressor_norm.weight"},
      {"layers.3.ffn.gate.weight", "blk.3.ffn_gate_inp.weight"},
      {"layers.3.ffn.gate.bias", "blk.3.exp_probs_b.bias"},
      {"layers.1.ffn.gate.tid2eid", "blk.1.ffn_gate_tid2eid.weight"},
      {"layers.3.ffn.shared_experts.w1.weight", "blk.3.ffn_gate_shexp.weight"},
      {"layers.3.ffn.shared_experts.w2.weight", "blk.3.ffn_down_shexp.weight"},
      {"mtp.0.e_proj.weight", "mtp.0.e_proj.weight"},
      {"mtp.0.attn.wq_b.weight", "mtp.0.attn_q_b.weight"},
      {"mtp.0.hc_head_base", "mtp.0.hc_head_base.weight"},
  };
  for (const auto& [hf, gguf] : cases) {
    const auto g = dsv4_gguf_name(hf);
    ASSERT_TRUE(g.has_value()) << hf;
    EXPECT_EQ(g->gguf, gguf) << hf;
    EXPECT_EQ(g->kind, Kind::kTensor) << hf;
    EXPECT_EQ(dsv4_hf_name(gguf).value_or("<none>"), hf) << gguf;
  }
  EXPECT_EQ(dsv4_gguf_name("model.layers.5.ffn_norm.weight")->gguf, "blk.5.ffn_norm.weight");
}

TEST(Dsv4Names, StackedExperts) {
  const auto g = dsv4_gguf_name("layers.17.ffn.experts.203.w3.weight");
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->gguf, "blk.17.ffn_up_exps.weight");
  EXPECT_EQ(g->kind, Kind::kExpertSlice);
  EXPECT_EQ(g->expert, 203);
  EXPECT_EQ(dsv4_gguf_name("layers.0.ffn.experts.0.w1.weight")->gguf, "blk.0.ffn_gate_exps.weight");
  EXPECT_EQ(dsv4_gguf_name("layers.0.ffn.experts.255.w2.weight")->gguf, "blk.0.ffn_down_exps.weight");
  EXPECT_EQ(dsv4_hf_name("blk.17.ffn_up_exps.weight", 203).value(), "layers.17.ffn.experts.203.w3.weight");
  EXPECT_FALSE(dsv4_hf_name("blk.17.ffn_up_exps.weight").has_value());     // needs an expert
  EXPECT_FALSE(dsv4_hf_name("blk.17.attn_kv.weight", 3).has_value());      // not stacked
}

TEST(Dsv4Names, ScaleCompanions) {
  const auto s = dsv4_gguf_name("layers.4.attn.wq_b.scale");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->kind, Kind::kScaleCompanion);
  EXPECT_EQ(s->gguf, "blk.4.attn_q_b.weight");
  const auto e = dsv4_gguf_name("layers.4.ffn.experts.9.w2.scale");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->kind, Kind::kScaleCompanion);
  EXPECT_EQ(e->gguf, "blk.4.ffn_down_exps.weight");
  EXPECT_EQ(e->expert, 9);
}

TEST(Dsv4Names, RejectsUnknown) {
  for (const char* bad : {"", "layers.x.attn.wq_a.weight", "layers.3.attn.unknown.weight", "layers.03.attn_norm.weight",
                          "layers.3", "layers.-1.attn_norm.weight", "layers.3.ffn.experts.w1.weight",
                          "layers.3.ffn.experts.1.w4.weight", "mtpx.0.e_proj.weight", "layers.3.e_proj.weight"}) {
    EXPECT_FALSE(dsv4_gguf_name(bad).has_value()) << bad;
  }
  for (const char* bad : {"blk.x.attn_kv.weight", "blk.1.nope.weight", "foo", "blk.1.e_proj.weight"}) {
    EXPECT_FALSE(dsv4_hf_name(bad).has_value()) << bad;
  }
}

}  // namespace
}  // namespace aff::format
