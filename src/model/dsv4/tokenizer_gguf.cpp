#include "model/dsv4/tokenizer_gguf.h"

#include <array>
#include <unordered_set>

#include <fmt/format.h>

#include "format/gguf_dsv4_names.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/tokenizer_json.h"

namespace aff::dsv4 {

namespace key = format::dsv4_key;
using format::GgufType;
using format::GgufValue;

namespace {

// llama_token_type values.
enum TokenType : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

// DeepSeek-V4's pre-tokenizer: three ordered Split (Isolated) regexes before
// ByteLevel, as in its tokenizer.json. llama.cpp names this pre-tokenizer
// "joyai-llm" in V4 GGUFs.
const std::array<const char*, 3> kV4Splits = {
    "\\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
    "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
};
constexpr std::string_view kV4PreName = "joyai-llm";
// Other spellings of the same pre-tokenizer seen in deepseek4 converters.
constexpr std::array<std::string_view, 3> kV4PreAliases = {"joyai-llm", "deepseek-v4", "deepseek4"};

bool is_v4_splits(const std::vector<tokenizer::SplitSpec>& splits) {
  if (splits.size() != kV4Splits.size()) return false;
  for (size_t i = 0; i < splits.size(); ++i) {
    if (splits[i].literal || splits[i].pattern != kV4Splits[i]) return false;
  }
  return true;
}

}  // namespace

bool gguf_has_tokenizer(const format::GgufFile& f) {
  return f.find(kGgufKeyTokenizerJson) != nullptr ||
         (f.find(key::kTokenizerModel) != nullptr && f.find(key::kTokenizerTokens) != nullptr);
}

Result<std::unique_ptr<Tokenizer>> tokenizer_from_gguf(const format::GgufFile& f) {
  if (f.find(kGgufKeyTokenizerJson) != nullptr) {
    AFF_ASSIGN_OR_RETURN(std::string text, f.get_string(kGgufKeyTokenizerJson));
    return Tokenizer::load_from_json(text, fmt::format("{}: {}", f.label(), kGgufKeyTokenizerJson));
  }
  if (!gguf_has_tokenizer(f)) {
    return not_found(fmt::format("{}: the file carries no tokenizer ({} / {}); give one with --tokenizer FILE",
                                 f.label(), key::kTokenizerModel, key::kTokenizerTokens));
  }
  AFF_ASSIGN_OR_RETURN(std::string model, f.get_string(key::kTokenizerModel));
  if (model != "gpt2") {
    return unsupported(fmt::format("{}: {} is '{}'; only byte-level BPE ('gpt2') is supported (give a "
                                   "tokenizer.json with --tokenizer FILE)", f.label(), key::kTokenizerModel, model));
  }
  const std::string pre = f.find(key::kTokenizerPre) ? f.get_string(key::kTokenizerPre).value() : std::string();
  tokenizer::TokenizerSpec spec;
  bool known_pre = false;
  for (std::string_view alias : kV4PreAliases) known_pre = known_pre || pre == alias;
  if (!known_pre) {
    return unsupported(fmt::format("{}: {} is '{}', a pre-tokenizer affinity does not know (known: {}); give "
                                   "the model's tokenizer.json with --tokenizer FILE", f.label(), key::kTokenizerPre,
                                   pre, kV4PreName));
  }
  for (const char* re : kV4Splits) spec.splits.push_back({re, false});

  const format::GgufValue* tokens = f.find(key::kTokenizerTokens);
  if (!tokens->is_array() || tokens->array_type() != GgufType::kString) {
    return corrupt(fmt::format("{}: {} is not an array of strings", f.label(), key::kTokenizerTokens));
  }
  const std::vector<std::string>& strs = tokens->array_strings();
  const format::GgufValue* types = f.find(key::kTokenizerTokenType);
  if (types && (!types->is_array() || types->array_size() != strs.size())) {
    return corrupt(fmt::format("{}: {} must be an integer array with one entry per token ({})", f.label(),
                               key::kTokenizerTokenType, strs.size()));
  }
  for (size_t id = 0; id < strs.size(); ++id) {
    int64_t type = kNormal;
    if (types) {
      const auto t = types->array_int(id);
      if (!t) return corrupt(fmt::format("{}: {} entry {} is not an integer", f.label(), key::kTokenizerTokenType, id));
      type = *t;
    }
    if (type == kUnknown || type == kUnused || type == kByte) continue;
    if (type != kNormal && type != kControl && type != kUserDefined) {
      return corrupt(fmt::format("{}: {} entry {} is {}, not a llama.cpp token type", f.label(),
                                 key::kTokenizerTokenType, id, type));
    }
    if (!spec.vocab.emplace(strs[id], int32_t(id)).second) {
      return corrupt(fmt::format("{}: token '{}' appears twice in {} (ids {} and {})", f.label(), strs[id],
                                 key::kTokenizerTokens, spec.vocab[strs[id]], id));
    }
    if (type == kControl || type == kUserDefined) {
      tokenizer::AddedToken a;
      a.content = strs[id];
      a.id = int32_t(id);
      a.special = type == kControl;
      a.normalized = type == kUserDefined;
      spec.added.push_back(std::move(a));
    }
  }
  if (const format::GgufValue* merges = f.find(key::kTokenizerMerges)) {
    if (!merges->is_array() || merges->array_type() != GgufType::kString) {
      return corrupt(fmt::format("{}: {} is not an array of strings", f.label(), key::kTokenizerMerges));
    }
    for (size_t i = 0; i < merges->array_strings().size(); ++i) {
      const std::string& m = merges->array_strings()[i];
      // Byte-level token strings never hold a plain space, so the first one splits the pair.
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos) {
        return corrupt(fmt::format("{}: {} entry {} ('{}') is not 'left right'", f.label(), key::kTokenizerMerges,
                                   i, m));
      }
      spec.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
    }
  }
  const std::string source = fmt::format("{}: tokenizer.ggml", f.label());
  AFF_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::BpeTokenizer> tok,
                       tokenizer::BpeTokenizer::create(std::move(spec), source));
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

Result<GgufMetadata> tokenizer_gguf_metadata(std::string_view json_text, const std::string& source,
                                             int64_t vocab_size) {
  AFF_ASSIGN_OR_RETURN(tokenizer::TokenizerSpec spec, tokenizer::parse_tokenizer_json(json_text, source));
  int64_t n = vocab_size;
  for (const auto& [tok, id] : spec.vocab) n = std::max<int64_t>(n, int64_t(id) + 1);
  for (const auto& a : spec.added) n = std::max<int64_t>(n, int64_t(a.id) + 1);
  std::vector<std::string> tokens(static_cast<size_t>(n));
  std::vector<int32_t> types(static_cast<size_t>(n), kUnused);
  for (const auto& [tok, id] : spec.vocab) {
    tokens[size_t(id)] = tok;
    types[size_t(id)] = kNormal;
  }
  for (const auto& a : spec.added) {
    tokens[size_t(a.id)] = a.content;
    types[size_t(a.id)] = a.special ? kControl : kUserDefined;
  }
  for (int64_t id = 0; id < n; ++id) {
    if (types[size_t(id)] == kUnused) tokens[size_t(id)] = fmt::format("[PAD{}]", id);
  }
  std::vector<std::string> merges;
  merges.reserve(spec.merges.size());
  for (const auto& [l, r] : spec.merges) merges.push_back(l + " " + r);

  GgufMetadata m;
  m.emplace_back(std::string(key::kTokenizerModel), GgufValue::string("gpt2"));
  // Files whose pre-tokenizer is not V4's still say so; our reader then uses
  // the tokenizer.json copy.
  m.emplace_back(std::string(key::kTokenizerPre),
                 GgufValue::string(is_v4_splits(spec.splits) ? std::string(kV4PreName) : "affinity-custom"));
  m.emplace_back(std::string(key::kTokenizerTokens), GgufValue::array_strings(std::move(tokens)));
  m.emplace_back(std::string(key::kTokenizerTokenType), GgufValue::array(GgufType::kI32, types));
  m.emplace_back(std::string(key::kTokenizerMerges), GgufValue::array_strings(std::move(merges)));
  m.emplace_back(std::string(kGgufKeyTokenizerJson), GgufValue::string(std::string(json_text)));
  return m;
}

}  // namespace aff::dsv4
