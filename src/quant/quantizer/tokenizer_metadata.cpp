#include "quant/quantizer/tokenizer_metadata.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "format/gguf_dsv4_names.h"

namespace aff::quant {

Result<std::vector<std::pair<std::string, format::GgufValue>>> tokenizer_gguf_metadata(
    std::string_view json_text, const std::string& source, int64_t vocab_size) {
  using nlohmann::json;
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return corrupt(fmt::format("{}: not valid JSON", source));
  const json* model = j.contains("model") ? &j["model"] : nullptr;
  if (model == nullptr || !model->is_object()) return corrupt(fmt::format("{}: no \"model\" object", source));
  if (model->value("type", std::string()) != "BPE") {
    return unsupported(fmt::format("{}: model.type must be \"BPE\" (byte-level BPE)", source));
  }
  if (!model->contains("vocab") || !(*model)["vocab"].is_object()) {
    return corrupt(fmt::format("{}: model.vocab is missing or not an object", source));
  }
  constexpr int64_t kMaxTokens = 1 << 24;
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  auto place = [&](int64_t id, const std::string& text, GgufTokenType type) -> Status {
    if (id < 0 || id >= kMaxTokens) return corrupt(fmt::format("{}: token id {} out of range", source, id));
    if (id >= int64_t(tokens.size())) {
      tokens.resize(size_t(id + 1));
      types.resize(size_t(id + 1), 0);
    }
    tokens[size_t(id)] = text;
    types[size_t(id)] = int32_t(type);
    return Status::ok();
  };
  for (const auto& [text, id] : (*model)["vocab"].items()) {
    if (!id.is_number_integer()) return corrupt(fmt::format("{}: model.vocab['{}'] is not an integer", source, text));
    AFF_RETURN_IF_ERROR(place(id.get<int64_t>(), text, GgufTokenType::kNormal));
  }
  if (j.contains("added_tokens")) {
    if (!j["added_tokens"].is_array()) return corrupt(fmt::format("{}: added_tokens is not an array", source));
    for (const auto& t : j["added_tokens"]) {
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") ||
          !t["content"].is_string()) {
        return corrupt(fmt::format("{}: an added_tokens entry lacks an integer id or string content", source));
      }
      const bool special = t.value("special", false);
      AFF_RETURN_IF_ERROR(place(t["id"].get<int64_t>(), t["content"].get<std::string>(),
                                special ? GgufTokenType::kControl : GgufTokenType::kUserDefined));
    }
  }
  if (vocab_size > int64_t(tokens.size())) {
    tokens.resize(size_t(vocab_size));
    types.resize(size_t(vocab_size), 0);
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (types[i] == 0) {
      tokens[i] = fmt::format("[PAD{}]", i);
      types[i] = int32_t(GgufTokenType::kUnused);
    }
  }
  std::vector<std::string> merges;
  if (model->contains("merges")) {
    for (const auto& m : (*model)["merges"]) {
      if (m.is_string()) {
        merges.push_back(m.get<std::string>());
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
      } else {
        return corrupt(fmt::format("{}: a model.merges entry is neither \"a b\" nor [\"a\", \"b\"]", source));
      }
    }
  }
  namespace key = format::dsv4_key;
  using format::GgufType;
  using format::GgufValue;
  std::vector<std::pair<std::string, GgufValue>> kv;
  kv.emplace_back(std::string(key::kTokenizerModel), GgufValue::string("gpt2"));
  kv.emplace_back(std::string(key::kTokenizerPre), GgufValue::string("joyai-llm"));
  kv.emplace_back(std::string(key::kTokenizerTokens), GgufValue::array_strings(std::move(tokens)));
  kv.emplace_back(std::string(key::kTokenizerTokenType), GgufValue::array(GgufType::kI32, types));
  kv.emplace_back(std::string(key::kTokenizerMerges), GgufValue::array_strings(std::move(merges)));
  return kv;
}

}  // namespace aff::quant
