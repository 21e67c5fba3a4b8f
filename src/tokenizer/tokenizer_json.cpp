#include "tokenizer/tokenizer_json.h"

#include <nlohmann/json.hpp>

namespace aff::tokenizer {

namespace {

using nlohmann::json;

// Absent and null both mean "not set" in HF's serde structs.
bool is_unset(const json& obj, const char* key) {
  return !obj.contains(key) || obj.at(key).is_null();
}

Result<bool> get_bool(const json& obj, const char* key, bool fallback, const std::string& where) {
  if (is_unset(obj, key)) return fallback;
  if (!obj.at(key).is_boolean()) return corrupt(where + "." + key + " must be a boolean");
  return obj.at(key).get<bool>();
}

Status parse_normalizer(const json& root, const std::string& src) {
  if (is_unset(root, "normalizer")) return Status::ok();
  const json& n = root.at("normalizer");
  if (!n.is_object()) return corrupt(src + ": normalizer must be an object or null");
  // An empty Sequence (DeepSeek's choice) is the identity.
  if (n.is_object() && n.value("type", "") == "Sequence" && n.contains("normalizers") &&
      n.at("normalizers").is_array() && n.at("normalizers").empty()) {
    return Status::ok();
  }
  return unsupported(src + ": normalizer " + n.dump().substr(0, 120) +
                     " is not supported (only null or an empty Sequence)");
}

Status parse_split(const json& p, const std::string& where, TokenizerSpec& spec) {
  if (p.value("behavior", "") != "Isolated") {
    return unsupported(where + ".behavior must be \"Isolated\", got " +
                       (p.contains("behavior") ? p.at("behavior").dump() : "nothing"));
  }
  AFF_ASSIGN_OR_RETURN(bool invert, get_bool(p, "invert", false, where));
  if (invert) return unsupported(where + ".invert=true is not supported");
  if (!p.contains("pattern") || !p.at("pattern").is_object()) {
    return corrupt(where + ".pattern must be an object {\"Regex\": ...} or {\"String\": ...}");
  }
  const json& pat = p.at("pattern");
  SplitSpec s;
  if (pat.contains("Regex") && pat.at("Regex").is_string()) {
    s.pattern = pat.at("Regex").get<std::string>();
  } else if (pat.contains("String") && pat.at("String").is_string()) {
    s.pattern = pat.at("String").get<std::string>();
    s.literal = true;
  } else {
    return corrupt(where + ".pattern must hold a string \"Regex\" or \"String\"");
  }
  spec.splits.push_back(std::move(s));
  return Status::ok();
}

Status parse_byte_level(const json& p, const std::string& where) {
  AFF_ASSIGN_OR_RETURN(bool prefix, get_bool(p, "add_prefix_space", true, where));
  AFF_ASSIGN_OR_RETURN(bool use_regex, get_bool(p, "use_regex", true, where));
  if (prefix) return unsupported(where + ".add_prefix_space=true is not supported");
  if (use_regex) {
    return unsupported(where + ".use_regex=true (GPT-2 split) is not supported; " +
                       "express the split as Split pre-tokenizers");
  }
  return Status::ok();
}

Status parse_pre_tokenizer(const json& root, const std::string& src, TokenizerSpec& spec) {
  if (is_unset(root, "pre_tokenizer")) {
    return unsupported(src + ": pre_tokenizer is null; a ByteLevel pre-tokenizer is required");
  }
  const json& pt = root.at("pre_tokenizer");
  if (!pt.is_object()) return corrupt(src + ": pre_tokenizer must be an object");
  std::vector<const json*> steps;
  if (pt.value("type", "") == "Sequence") {
    if (!pt.contains("pretokenizers") || !pt.at("pretokenizers").is_array()) {
      return corrupt(src + ": pre_tokenizer.pretokenizers must be an array");
    }
    for (const json& p : pt.at("pretokenizers")) steps.push_back(&p);
  } else {
    steps.push_back(&pt);
  }
  bool saw_byte_level = false;
  for (size_t i = 0; i < steps.size(); ++i) {
    const json& p = *steps[i];
    const std::string where = src + ": pre_tokenizer.pretokenizers[" + std::to_string(i) + "]";
    if (!p.is_object()) return corrupt(where + " must be an object");
    const std::string type = p.value("type", "");
    if (saw_byte_level) {
      return unsupported(where + " (" + type + ") follows ByteLevel; only Splits before it are supported");
    }
    if (type == "Split") {
      AFF_RETURN_IF_ERROR(parse_split(p, where, spec));
    } else if (type == "ByteLevel") {
      AFF_RETURN_IF_ERROR(parse_byte_level(p, where));
      saw_byte_level = true;
    } else {
      return unsupported(where + ".type \"" + type + "\" is not supported (Split, ByteLevel)");
    }
  }
  if (!saw_byte_level) return unsupported(src + ": pre_tokenizer has no ByteLevel step");
  return Status::ok();
}

Status parse_decoder(const json& root, const std::string& src) {
  if (is_unset(root, "decoder") || !root.at("decoder").is_object() ||
      root.at("decoder").value("type", "") != "ByteLevel") {
    return unsupported(src + ": decoder must be ByteLevel, got " +
                       (is_unset(root, "decoder") ? std::string("null")
                                                  : root.at("decoder").dump().substr(0, 120)));
  }
  return Status::ok();
}

Status parse_model(const json& root, const std::string& src, TokenizerSpec& spec) {
  if (!root.contains("model") || !root.at("model").is_object()) {
    return corrupt(src + ": model is missing");
  }
  const json& m = root.at("model");
  const std::string where = src + ": model";
  if (m.contains("type") && m.at("type") != "BPE") {
    return unsupported(where + ".type " + m.at("type").dump() + " is not supported (BPE only)");
  }
  AFF_ASSIGN_OR_RETURN(bool byte_fallback, get_bool(m, "byte_fallback", false, where));
  if (byte_fallback) return unsupported(where + ".byte_fallback=true is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (!is_unset(m, key) && !(m.at(key).is_string() && m.at(key).get<std::string>().empty())) {
      return unsupported(where + "." + key + " is not supported");
    }
  }
  if (!is_unset(m, "dropout") && !(m.at("dropout").is_number() && m.at("dropout").get<double>() == 0)) {
    return unsupported(where + ".dropout is not supported (encoding would be random)");
  }
  AFF_ASSIGN_OR_RETURN(spec.bpe.ignore_merges, get_bool(m, "ignore_merges", false, where));
  AFF_ASSIGN_OR_RETURN(spec.bpe.fuse_unk, get_bool(m, "fuse_unk", false, where));

  if (!m.contains("vocab") || !m.at("vocab").is_object()) {
    return corrupt(where + ".vocab must be an object token -> id");
  }
  spec.vocab.reserve(m.at("vocab").size());
  for (const auto& [token, id] : m.at("vocab").items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (int64_t(1) << 30)) {
      return corrupt(where + ".vocab[\"" + token + "\"] must be an id in [0, 2^30)");
    }
    spec.vocab.emplace(token, int32_t(id.get<int64_t>()));
  }
  if (!is_unset(m, "unk_token")) {
    if (!m.at("unk_token").is_string()) return corrupt(where + ".unk_token must be a string");
    auto it = spec.vocab.find(m.at("unk_token").get<std::string>());
    if (it == spec.vocab.end()) return corrupt(where + ".unk_token is not in model.vocab");
    spec.bpe.unk_id = it->second;
  }

  if (!m.contains("merges") || !m.at("merges").is_array()) {
    return corrupt(where + ".merges must be an array");
  }
  spec.merges.reserve(m.at("merges").size());
  size_t i = 0;
  for (const json& e : m.at("merges")) {
    // Two encodings exist: "left right" strings (older files, DeepSeek) and
    // ["left", "right"] pairs (tokenizers >= 0.20). Byte-level tokens never
    // contain a plain space, so splitting a string at its first space is exact.
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return corrupt(where + ".merges[" + std::to_string(i) + "] \"" + s +
                       "\" is not two tokens separated by one space");
      }
      spec.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      spec.merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    } else {
      return corrupt(where + ".merges[" + std::to_string(i) + "] must be \"a b\" or [\"a\", \"b\"]");
    }
    ++i;
  }
  return Status::ok();
}

Status parse_added_tokens(const json& root, const std::string& src, TokenizerSpec& spec) {
  if (is_unset(root, "added_tokens")) return Status::ok();
  if (!root.at("added_tokens").is_array()) return corrupt(src + ": added_tokens must be an array");
  size_t i = 0;
  for (const json& t : root.at("added_tokens")) {
    const std::string where = src + ": added_tokens[" + std::to_string(i++) + "]";
    if (!t.is_object() || !t.contains("id") || !t.at("id").is_number_integer() ||
        !t.contains("content") || !t.at("content").is_string()) {
      return corrupt(where + " must be an object with an integer id and a string content");
    }
    AddedToken a;
    const int64_t id = t.at("id").get<int64_t>();
    if (id < 0 || id >= (int64_t(1) << 30)) return corrupt(where + ".id out of range");
    a.id = int32_t(id);
    a.content = t.at("content").get<std::string>();
    AFF_ASSIGN_OR_RETURN(a.special, get_bool(t, "special", false, where));
    AFF_ASSIGN_OR_RETURN(a.lstrip, get_bool(t, "lstrip", false, where));
    AFF_ASSIGN_OR_RETURN(a.rstrip, get_bool(t, "rstrip", false, where));
    AFF_ASSIGN_OR_RETURN(a.single_word, get_bool(t, "single_word", false, where));
    AFF_ASSIGN_OR_RETURN(a.normalized, get_bool(t, "normalized", !a.special, where));
    spec.added.push_back(std::move(a));
  }
  return Status::ok();
}

}  // namespace

Result<TokenizerSpec> parse_tokenizer_json(std::string_view json_text, const std::string& source) {
  json root = json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return corrupt(source + ": not a JSON object");
  }
  TokenizerSpec spec;
  try {
    AFF_RETURN_IF_ERROR(parse_normalizer(root, source));
    AFF_RETURN_IF_ERROR(parse_pre_tokenizer(root, source, spec));
    AFF_RETURN_IF_ERROR(parse_decoder(root, source));
    AFF_RETURN_IF_ERROR(parse_model(root, source, spec));
    AFF_RETURN_IF_ERROR(parse_added_tokens(root, source, spec));
  } catch (const json::exception& e) {
    // A field of an unexpected JSON type that the checks above did not foresee.
    return corrupt(source + ": unexpected JSON structure: " + e.what());
  }
  // post_processor is not read: encode never adds BOS/EOS (see tokenizer.h).
  return spec;
}

}  // namespace aff::tokenizer
