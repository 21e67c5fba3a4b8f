#include "model/dsv4/config_json.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace aff::dsv4 {

using nlohmann::json;

namespace {

// Reads typed fields out of the config object; every failure names the file
// and the key. Errors are sticky: the first one is kept and later reads are
// no-ops, so parsing reads straight through and checks once.
class FieldReader {
 public:
  // `prefix` qualifies nested keys in messages ("rope_scaling.").
  FieldReader(const json& j, std::string file, std::string prefix = "")
      : j_(j), file_(std::move(file)), prefix_(std::move(prefix)) {}

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  const Status& status() const { return status_; }

  void fail(Status s) {
    if (status_.is_ok()) status_ = std::move(s);
  }
  void fail_field(const char* key, const std::string& what) {
    fail(invalid_argument(fmt::format("{}: field '{}{}' {}", file_, prefix_, key, what)));
  }

  int64_t i64(const char* key, std::optional<int64_t> def = std::nullopt) {
    if (!has(key)) return missing(key, def);
    const json& v = j_[key];
    if (v.is_number_integer()) return v.get<int64_t>();
    // Some exporters write integral values as floats (e.g. 65536.0).
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return int64_t(d);
    }
    fail_field(key, fmt::format("must be an integer, got {}", v.dump()));
    return 0;
  }
  int i32(const char* key, std::optional<int64_t> def = std::nullopt) {
    const int64_t v = i64(key, def);
    if (v < -(int64_t(1) << 31) || v >= (int64_t(1) << 31)) {
      fail_field(key, fmt::format("value {} does not fit in 32 bits", v));
      return 0;
    }
    return int(v);
  }
  double f64(const char* key, std::optional<double> def = std::nullopt) {
    if (!has(key)) {
      if (def) return *def;
      fail_field(key, "is required but missing");
      return 0.0;
    }
    const json& v = j_[key];
    if (v.is_number()) return v.get<double>();
    fail_field(key, fmt::format("must be a number, got {}", v.dump()));
    return 0.0;
  }
  bool boolean(const char* key, bool def) {
    if (!has(key)) return def;
    const json& v = j_[key];
    if (v.is_boolean()) return v.get<bool>();
    fail_field(key, fmt::format("must be true or false, got {}", v.dump()));
    return def;
  }
  std::string str(const char* key, std::optional<std::string> def = std::nullopt) {
    if (!has(key)) {
      if (def) return *def;
      fail_field(key, "is required but missing");
      return {};
    }
    const json& v = j_[key];
    if (v.is_string()) return v.get<std::string>();
    fail_field(key, fmt::format("must be a string, got {}", v.dump()));
    return {};
  }
  std::vector<int> int_list(const char* key, bool required) {
    std::vector<int> out;
    if (!has(key)) {
      if (required) fail_field(key, "is required but missing");
      return out;
    }
    const json& v = j_[key];
    if (!v.is_array()) {
      fail_field(key, fmt::format("must be a list of integers, got {}", v.dump()));
      return out;
    }
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_number_integer() || v[i].get<int64_t>() < -(int64_t(1) << 31) ||
          v[i].get<int64_t>() >= (int64_t(1) << 31)) {
        fail_field(key, fmt::format("entry {} must be an integer, got {}", i, v[i].dump()));
        return {};
      }
      out.push_back(int(v[i].get<int64_t>()));
    }
    return out;
  }

 private:
  int64_t missing(const char* key, std::optional<int64_t> def) {
    if (def) return *def;
    fail_field(key, "is required but missing");
    return 0;
  }

  const json& j_;
  std::string file_;
  std::string prefix_;
  Status status_;
};

bool is_v41(const json& j) {
  auto mt = j.find("model_type");
  if (mt != j.end() && mt->is_string() && mt->get<std::string>() == "deepseek_v41") return true;
  auto arch = j.find("architectures");
  if (arch != j.end() && arch->is_array()) {
    for (const json& a : *arch) {
      if (a.is_string() && a.get<std::string>().find("DeepseekV41") != std::string::npos) return true;
    }
  }
  auto tc = j.find("text_config");
  if (tc != j.end() && tc->is_object()) {
    auto tmt = tc->find("model_type");
    if (tmt != tc->end() && tmt->is_string() && tmt->get<std::string>().rfind("deepseek_v41", 0) == 0) return true;
    for (auto it = tc->begin(); it != tc->end(); ++it) {
      if (it.key().rfind("engram_", 0) == 0) return true;
    }
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key().rfind("engram_", 0) == 0) return true;
  }
  return false;
}

bool has_dspark_keys(const json& j) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key().rfind("dspark_", 0) == 0) return true;
  }
  return false;
}

void parse_rope_scaling(const json& j, const std::string& file, FieldReader& r, RopeScaling* out) {
  if (!r.has("rope_scaling")) return;
  const json& rs = j["rope_scaling"];
  if (!rs.is_object()) {
    r.fail_field("rope_scaling", fmt::format("must be an object or null, got {}", rs.dump()));
    return;
  }
  FieldReader sub(rs, file, "rope_scaling.");
  std::string type = sub.str("type", sub.str("rope_type", std::string("default")));
  if (type == "default" || type == "none") return;
  if (type != "yarn") {
    r.fail(unsupported(fmt::format("{}: field 'rope_scaling.type' is '{}'; only 'yarn' is supported", file, type)));
    return;
  }
  out->yarn = true;
  out->factor = sub.f64("factor");
  out->original_max_position = sub.i64("original_max_position_embeddings");
  out->beta_fast = sub.f64("beta_fast", 32.0);
  out->beta_slow = sub.f64("beta_slow", 1.0);
  if (!sub.status().is_ok()) r.fail(sub.status());
}

void parse_quantization(const json& j, const std::string& file, FieldReader& r, ModelConfig* cfg) {
  if (!r.has("quantization_config")) return;
  const json& q = j["quantization_config"];
  if (!q.is_object()) {
    r.fail_field("quantization_config", fmt::format("must be an object, got {}", q.dump()));
    return;
  }
  FieldReader sub(q, file, "quantization_config.");
  const std::string method = sub.str("quant_method", std::string());
  if (method != "fp8") {
    r.fail(unsupported(fmt::format("{}: field 'quantization_config.quant_method' is '{}'; only 'fp8' "
                                   "(E4M3 weights with E8M0 block scales) is supported", file, method)));
    return;
  }
  cfg->fp8_dense = true;
  const std::string fmt_name = sub.str("fmt", std::string("e4m3"));
  if (fmt_name != "e4m3") {
    r.fail(unsupported(fmt::format("{}: field 'quantization_config.fmt' is '{}'; only 'e4m3' is supported",
                                   file, fmt_name)));
  }
  const std::string scale_fmt = sub.str("scale_fmt", std::string("ue8m0"));
  if (scale_fmt != "ue8m0") {
    r.fail(unsupported(fmt::format("{}: field 'quantization_config.scale_fmt' is '{}'; only 'ue8m0' is "
                                   "supported", file, scale_fmt)));
  }
  if (q.contains("weight_block_size")) {
    const json& b = q["weight_block_size"];
    if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer()) {
      r.fail_field("quantization_config.weight_block_size", fmt::format("must be [B, B], got {}", b.dump()));
    } else if (b[0].get<int64_t>() != b[1].get<int64_t>() || b[0].get<int64_t>() <= 0 ||
               b[0].get<int64_t>() > (1 << 20)) {
      r.fail(unsupported(fmt::format("{}: field 'quantization_config.weight_block_size' is {}; only square "
                                     "positive blocks are supported", file, b.dump())));
    } else {
      cfg->weight_block = int(b[0].get<int64_t>());
    }
  }
  // transformers moves expert_dtype into quantization_config; accept it there too.
  if (q.contains("expert_dtype") && !r.has("expert_dtype")) {
    cfg->expert_dtype = sub.str("expert_dtype", std::string());
  }
  if (!sub.status().is_ok()) r.fail(sub.status());
}

}  // namespace

Result<ModelConfig> parse_config_json(std::string_view text, const std::string& file) {
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    return invalid_argument(fmt::format("{}: not valid JSON: {}", file, e.what()));
  }
  if (!j.is_object()) return invalid_argument(fmt::format("{}: top level is not a JSON object", file));
  if (is_v41(j)) {
    return unsupported(fmt::format("{}: this is a DeepSeek-V4.1 checkpoint (field 'model_type' / text_config "
                                   "with Engram keys); V4.1 is a different architecture (Engram, CSA2, "
                                   "single-pass mHC) and is not supported yet", file));
  }

  FieldReader r(j, file);
  ModelConfig c;
  c.model_type = r.str("model_type");
  if (r.status().is_ok() && c.model_type != "deepseek_v4") {
    return unsupported(fmt::format("{}: field 'model_type' is '{}'; only 'deepseek_v4' (DeepSeek-V4-Flash, "
                                   "-Base, -0731) is supported", file, c.model_type));
  }
  c.vocab_size = r.i64("vocab_size");
  c.hidden_size = r.i64("hidden_size");
  c.num_layers = r.i32("num_hidden_layers");
  const int nextn = r.i32("num_nextn_predict_layers", 0);
  c.num_heads = r.i32("num_attention_heads");
  const int kv_heads = r.i32("num_key_value_heads", 1);
  c.head_dim = r.i32("head_dim");
  c.rope_dim = r.i32("qk_rope_head_dim");
  c.q_lora_rank = r.i32("q_lora_rank");
  c.o_groups = r.i32("o_groups");
  c.o_lora_rank = r.i32("o_lora_rank");
  c.sliding_window = r.i32("sliding_window");
  c.compress_ratios = r.int_list("compress_ratios", true);
  c.rope_theta = r.f64("rope_theta", 10000.0);
  c.compress_rope_theta = r.f64("compress_rope_theta", 160000.0);
  parse_rope_scaling(j, file, r, &c.rope_scaling);
  c.max_position_embeddings = r.i64("max_position_embeddings", 0);
  c.index_n_heads = r.i32("index_n_heads", 0);
  c.index_head_dim = r.i32("index_head_dim", 0);
  c.index_topk = r.i32("index_topk", 0);
  c.n_routed_experts = r.i32("n_routed_experts");
  c.n_shared_experts = r.i32("n_shared_experts", 0);
  c.n_experts_per_tok = r.i32("num_experts_per_tok");
  c.moe_inter = r.i32("moe_intermediate_size");
  c.num_hash_layers = r.i32("num_hash_layers", 0);
  c.scoring_func = r.str("scoring_func", std::string("sqrtsoftplus"));
  c.routed_scaling_factor = r.f64("routed_scaling_factor", 1.0);
  c.norm_topk_prob = r.boolean("norm_topk_prob", true);
  c.swiglu_limit = r.f64("swiglu_limit", 0.0);
  c.rms_norm_eps = r.f64("rms_norm_eps", 1e-6);
  c.hc_mult = r.i32("hc_mult");
  c.hc_sinkhorn_iters = r.i32("hc_sinkhorn_iters");
  c.hc_eps = r.f64("hc_eps", 1e-6);
  c.bos_token_id = r.i32("bos_token_id", 0);
  if (r.has("eos_token_id") && j["eos_token_id"].is_array()) {
    // A list of stop ids: the first is the end-of-sentence token.
    const json& e = j["eos_token_id"];
    if (e.empty() || !e[0].is_number_integer()) r.fail_field("eos_token_id", "list must start with an integer");
    else c.eos_token_id = int(e[0].get<int64_t>());
  } else {
    c.eos_token_id = r.i32("eos_token_id", 1);
  }
  c.expert_dtype = r.str("expert_dtype", std::string());
  parse_quantization(j, file, r, &c);
  const bool tied = r.boolean("tie_word_embeddings", false);
  const std::string act = r.str("hidden_act", std::string("silu"));
  AFF_RETURN_IF_ERROR(r.status());

  if (kv_heads != 1) {
    return unsupported(fmt::format("{}: field 'num_key_value_heads' is {}; DeepSeek-V4 has one shared KV "
                                   "latent (1)", file, kv_heads));
  }
  if (tied) return unsupported(fmt::format("{}: field 'tie_word_embeddings' is true; V4 has a separate head", file));
  if (act != "silu") return unsupported(fmt::format("{}: field 'hidden_act' is '{}'; only 'silu' is supported", file, act));
  if (c.scoring_func != "sqrtsoftplus") {
    return unsupported(fmt::format("{}: field 'scoring_func' is '{}'; only 'sqrtsoftplus' is supported", file,
                                   c.scoring_func));
  }
  if (c.n_shared_experts > 1) {
    return unsupported(fmt::format("{}: field 'n_shared_experts' is {}; only 0 or 1 is supported", file,
                                   c.n_shared_experts));
  }
  if (c.expert_dtype == "bf16" || c.expert_dtype == "bfloat16") c.expert_dtype.clear();
  if (!c.expert_dtype.empty() && c.expert_dtype != "fp4" && c.expert_dtype != "fp8") {
    return unsupported(fmt::format("{}: field 'expert_dtype' is '{}'; expected 'fp4' or 'fp8'", file,
                                   c.expert_dtype));
  }
  if (c.num_layers <= 0) return invalid_argument(fmt::format("{}: field 'num_hidden_layers' must be positive", file));
  if (nextn < 0) return invalid_argument(fmt::format("{}: field 'num_nextn_predict_layers' must be >= 0", file));

  // Variant: -0731 ships DSpark stages in place of the MTP block. Its config
  // still says num_nextn_predict_layers 1, but compress_ratios carries one
  // entry per stage (46 = 43 + 3) and the dspark_* keys describe the drafter.
  const int extra = int(c.compress_ratios.size()) - c.num_layers;
  if (has_dspark_keys(j) || extra > std::max(nextn, 1)) {
    c.variant = Variant::kV4Flash0731;
    c.num_mtp_layers = 0;
    c.num_dspark_stages = extra;
    // Defaults are the 0731 release values, for configs that omit a key.
    c.dspark_block_size = r.i32("dspark_block_size", 5);
    c.dspark_noise_token_id = r.i32("dspark_noise_token_id", 128799);
    c.dspark_markov_rank = r.i32("dspark_markov_rank", 256);
    if (r.has("dspark_target_layer_ids")) {
      c.dspark_target_layer_ids = r.int_list("dspark_target_layer_ids", true);
    } else {
      for (int s = 0; s < extra; ++s) c.dspark_target_layer_ids.push_back(c.num_layers - extra + s);
    }
    AFF_RETURN_IF_ERROR(r.status());
  } else {
    c.variant = Variant::kV4Flash;
    c.num_mtp_layers = nextn;
  }
  AFF_RETURN_IF_ERROR(validate_config(c, file));
  return c;
}

Status validate_config(const ModelConfig& c, const std::string& file) {
  auto bad = [&](const char* field, const std::string& what) {
    return invalid_argument(fmt::format("{}: field '{}' {}", file, field, what));
  };
  auto positive = [&](const char* field, int64_t v) -> Status {
    if (v <= 0) return bad(field, fmt::format("must be positive, got {}", v));
    return Status::ok();
  };
  AFF_RETURN_IF_ERROR(positive("vocab_size", c.vocab_size));
  AFF_RETURN_IF_ERROR(positive("hidden_size", c.hidden_size));
  AFF_RETURN_IF_ERROR(positive("num_hidden_layers", c.num_layers));
  AFF_RETURN_IF_ERROR(positive("num_attention_heads", c.num_heads));
  AFF_RETURN_IF_ERROR(positive("head_dim", c.head_dim));
  AFF_RETURN_IF_ERROR(positive("qk_rope_head_dim", c.rope_dim));
  AFF_RETURN_IF_ERROR(positive("q_lora_rank", c.q_lora_rank));
  AFF_RETURN_IF_ERROR(positive("o_groups", c.o_groups));
  AFF_RETURN_IF_ERROR(positive("o_lora_rank", c.o_lora_rank));
  AFF_RETURN_IF_ERROR(positive("sliding_window", c.sliding_window));
  AFF_RETURN_IF_ERROR(positive("n_routed_experts", c.n_routed_experts));
  AFF_RETURN_IF_ERROR(positive("num_experts_per_tok", c.n_experts_per_tok));
  AFF_RETURN_IF_ERROR(positive("moe_intermediate_size", c.moe_inter));
  AFF_RETURN_IF_ERROR(positive("hc_mult", c.hc_mult));
  AFF_RETURN_IF_ERROR(positive("hc_sinkhorn_iters", c.hc_sinkhorn_iters));
  if (c.num_mtp_layers < 0) return bad("num_nextn_predict_layers", "must be >= 0");
  if (c.rope_dim % 2 != 0 || c.rope_dim >= c.head_dim) {
    return bad("qk_rope_head_dim", fmt::format("is {}; it must be even and smaller than head_dim ({})",
                                               c.rope_dim, c.head_dim));
  }
  if (c.num_heads % c.o_groups != 0) {
    return bad("o_groups", fmt::format("is {}; it must divide num_attention_heads ({})", c.o_groups, c.num_heads));
  }
  if (c.n_experts_per_tok > c.n_routed_experts) {
    return bad("num_experts_per_tok", fmt::format("is {}, more than n_routed_experts ({})", c.n_experts_per_tok,
                                                  c.n_routed_experts));
  }
  if (c.n_shared_experts < 0 || c.n_shared_experts > 1) return bad("n_shared_experts", "must be 0 or 1");
  if (c.num_hash_layers < 0 || c.num_hash_layers > c.num_layers) {
    return bad("num_hash_layers", fmt::format("is {}; it must lie in [0, num_hidden_layers = {}]",
                                              c.num_hash_layers, c.num_layers));
  }
  const size_t needed = size_t(c.num_layers) + size_t(c.num_mtp_layers) + size_t(c.num_dspark_stages);
  if (c.compress_ratios.size() < needed) {
    return bad("compress_ratios", fmt::format("has {} entries; {} are needed ({} layers + {} MTP + {} DSpark)",
                                              c.compress_ratios.size(), needed, c.num_layers, c.num_mtp_layers,
                                              c.num_dspark_stages));
  }
  bool any_csa = false;
  for (size_t i = 0; i < needed; ++i) {
    const int r = c.compress_ratios[i];
    if (r < 0 || r == 1) {
      return bad("compress_ratios", fmt::format("entry {} is {}; ratios are 0 (sliding window only), 4 (CSA) "
                                                "or another value >= 2 (HCA)", i, r));
    }
    any_csa = any_csa || r == 4;
  }
  if (any_csa) {
    AFF_RETURN_IF_ERROR(positive("index_n_heads", c.index_n_heads));
    AFF_RETURN_IF_ERROR(positive("index_head_dim", c.index_head_dim));
    AFF_RETURN_IF_ERROR(positive("index_topk", c.index_topk));
    // The indexer rotates q/k with a Walsh-Hadamard transform and applies
    // RoPE to the trailing rope dims of each indexer head.
    if ((c.index_head_dim & (c.index_head_dim - 1)) != 0) {
      return bad("index_head_dim", fmt::format("is {}; it must be a power of two (Hadamard rotation)",
                                               c.index_head_dim));
    }
    if (c.rope_dim >= c.index_head_dim) {
      return bad("index_head_dim", fmt::format("is {}; it must exceed qk_rope_head_dim ({})", c.index_head_dim,
                                               c.rope_dim));
    }
  }
  if (c.weight_block <= 0) return bad("quantization_config.weight_block_size", "must be positive");
  if (c.expert_dtype == "fp4" && (c.hidden_size % 32 != 0 || c.moe_inter % 32 != 0)) {
    return bad("expert_dtype", fmt::format("is 'fp4' (MXFP4, 32-wide scale blocks) but hidden_size ({}) or "
                                           "moe_intermediate_size ({}) is not a multiple of 32",
                                           c.hidden_size, c.moe_inter));
  }
  if (c.rope_scaling.yarn) {
    if (!(c.rope_scaling.factor > 0)) return bad("rope_scaling.factor", "must be positive");
    if (c.rope_scaling.original_max_position <= 0) {
      return bad("rope_scaling.original_max_position_embeddings", "must be positive");
    }
  }
  if (!(c.rms_norm_eps > 0)) return bad("rms_norm_eps", "must be positive");
  if (!(c.hc_eps > 0)) return bad("hc_eps", "must be positive");
  if (c.bos_token_id < 0 || c.bos_token_id >= c.vocab_size) return bad("bos_token_id", "is outside the vocabulary");
  if (c.eos_token_id < 0 || c.eos_token_id >= c.vocab_size) return bad("eos_token_id", "is outside the vocabulary");
  if (c.num_dspark_stages > 0) {
    AFF_RETURN_IF_ERROR(positive("dspark_block_size", c.dspark_block_size));
    AFF_RETURN_IF_ERROR(positive("dspark_markov_rank", c.dspark_markov_rank));
    if (c.dspark_noise_token_id < 0 || c.dspark_noise_token_id >= c.vocab_size) {
      return bad("dspark_noise_token_id", "is outside the vocabulary");
    }
    if (c.dspark_target_layer_ids.empty()) return bad("dspark_target_layer_ids", "must not be empty");
    for (int id : c.dspark_target_layer_ids) {
      if (id < 0 || id >= c.num_layers) {
        return bad("dspark_target_layer_ids", fmt::format("entry {} is not a layer of the model", id));
      }
    }
  }
  return Status::ok();
}

Result<ModelConfig> load_config_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(fmt::format("{}: cannot open (a checkpoint needs config.json)", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return io_error(fmt::format("{}: read error", path));
  return parse_config_json(ss.str(), path);
}

std::string config_to_json(const ModelConfig& c) {
  nlohmann::ordered_json j;
  j["architectures"] = {"DeepseekV4ForCausalLM"};
  j["model_type"] = "deepseek_v4";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_layers;
  // -0731's official config keeps 1 here although it ships DSpark stages.
  j["num_nextn_predict_layers"] = c.variant == Variant::kV4Flash0731 ? 1 : c.num_mtp_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = 1;
  j["head_dim"] = c.head_dim;
  j["qk_rope_head_dim"] = c.rope_dim;
  j["q_lora_rank"] = c.q_lora_rank;
  j["o_groups"] = c.o_groups;
  j["o_lora_rank"] = c.o_lora_rank;
  j["sliding_window"] = c.sliding_window;
  j["compress_ratios"] = c.compress_ratios;
  j["rope_theta"] = c.rope_theta;
  j["compress_rope_theta"] = c.compress_rope_theta;
  if (c.rope_scaling.yarn) {
    j["rope_scaling"] = {{"type", "yarn"},
                         {"factor", c.rope_scaling.factor},
                         {"original_max_position_embeddings", c.rope_scaling.original_max_position},
                         {"beta_fast", c.rope_scaling.beta_fast},
                         {"beta_slow", c.rope_scaling.beta_slow}};
  }
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["index_n_heads"] = c.index_n_heads;
  j["index_head_dim"] = c.index_head_dim;
  j["index_topk"] = c.index_topk;
  j["n_routed_experts"] = c.n_routed_experts;
  j["n_shared_experts"] = c.n_shared_experts;
  j["num_experts_per_tok"] = c.n_experts_per_tok;
  j["moe_intermediate_size"] = c.moe_inter;
  j["num_hash_layers"] = c.num_hash_layers;
  j["scoring_func"] = c.scoring_func;
  j["topk_method"] = "noaux_tc";
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["swiglu_limit"] = c.swiglu_limit;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["hc_mult"] = c.hc_mult;
  j["hc_sinkhorn_iters"] = c.hc_sinkhorn_iters;
  j["hc_eps"] = c.hc_eps;
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_id"] = c.eos_token_id;
  j["tie_word_embeddings"] = false;
  j["torch_dtype"] = "bfloat16";
  if (!c.expert_dtype.empty()) j["expert_dtype"] = c.expert_dtype;
  if (c.fp8_dense) {
    j["quantization_config"] = {{"activation_scheme", "dynamic"},
                                {"fmt", "e4m3"},
                                {"quant_method", "fp8"},
                                {"scale_fmt", "ue8m0"},
                                {"weight_block_size", {c.weight_block, c.weight_block}}};
  }
  if (c.variant == Variant::kV4Flash0731) {
    j["dspark_block_size"] = c.dspark_block_size;
    j["dspark_markov_rank"] = c.dspark_markov_rank;
    j["dspark_noise_token_id"] = c.dspark_noise_token_id;
    j["dspark_target_layer_ids"] = c.dspark_target_layer_ids;
  }
  return j.dump(2) + "\n";
}

}  // namespace aff::dsv4
