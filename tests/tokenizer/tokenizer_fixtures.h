// Shared fixtures of the tokenizer tests: the committed tokenizers (the real
// DeepSeek-V4 tokenizer.json, zstd-compressed, and a tiny one trained in V4's
// shape) and the HF `tokenizers` expectations made by tools/tokenizer/.
#pragma once

#include <gtest/gtest.h>
#include <zstd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tokenizer/tokenizer.h"

namespace aff::tokenizer_test {

inline std::string data_path(const std::string& name) {
  return std::string(AFFINITY_TEST_DATA) + "/tokenizer/" + name;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::string zstd_decompress(const std::string& packed, const std::string& what) {
  const unsigned long long size = ZSTD_getFrameContentSize(packed.data(), packed.size());
  EXPECT_NE(size, ZSTD_CONTENTSIZE_ERROR) << what;
  EXPECT_NE(size, ZSTD_CONTENTSIZE_UNKNOWN) << what;
  if (size == ZSTD_CONTENTSIZE_ERROR || size == ZSTD_CONTENTSIZE_UNKNOWN) return {};
  std::string out(size, '\0');
  const size_t got = ZSTD_decompress(out.data(), out.size(), packed.data(), packed.size());
  EXPECT_FALSE(ZSTD_isError(got)) << what << ": " << ZSTD_getErrorName(got);
  out.resize(ZSTD_isError(got) ? 0 : got);
  return out;
}

inline const std::string& v4_tokenizer_json() {
  static const std::string text = zstd_decompress(
      read_file(data_path("deepseek_v4_tokenizer.json.zst")), "deepseek_v4_tokenizer.json.zst");
  return text;
}

inline const std::string& tiny_tokenizer_json() {
  static const std::string text = read_file(data_path("tiny_tokenizer.json"));
  return text;
}

inline const Tokenizer& load_once(const std::string& json, const char* name,
                                  std::unique_ptr<Tokenizer>& slot) {
  if (!slot) {
    auto r = Tokenizer::load_from_json(json, name);
    if (!r.is_ok()) {
      ADD_FAILURE() << r.status().message();
      std::abort();  // every later test would dereference a missing tokenizer
    }
    slot = std::move(r).value();
  }
  return *slot;
}

// Loaded once per test binary (the V4 file takes a few hundred ms to parse).
inline const Tokenizer& v4_tokenizer() {
  static std::unique_ptr<Tokenizer> tok;
  return load_once(v4_tokenizer_json(), "deepseek_v4_tokenizer.json", tok);
}

inline const Tokenizer& tiny_tokenizer() {
  static std::unique_ptr<Tokenizer> tok;
  return load_once(tiny_tokenizer_json(), "tiny_tokenizer.json", tok);
}

// {"vocab_size", "cases": [{text, ids, ids_plain, decoded, decoded_skip_special,
// (tiny only) ids_ignore_merges}], "decode_cases": [{ids, text, text_skip_special}]}
inline const nlohmann::json& expected(const std::string& name) {
  static std::map<std::string, nlohmann::json> cache;
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, nlohmann::json::parse(read_file(data_path(name)))).first;
  return it->second;
}

inline std::vector<int32_t> ids_of(const nlohmann::json& arr) {
  return arr.get<std::vector<int32_t>>();
}

// Printable form of a text for failure messages.
inline std::string show(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else out += char(c);
  }
  return out.size() > 200 ? out.substr(0, 200) + "..." : out;
}

}  // namespace aff::tokenizer_test

#include <random>
#include <vector>

namespace aff::tokenizer_test {

// Random valid UTF-8 mixing scripts, whitespace kinds, digits, emoji and
// (optionally) added-token strings: fresh data for round-trip properties.
inline std::string random_text(std::mt19937& rng, int parts,
                               const std::vector<std::string>& specials = {}) {
  static const std::vector<std::vector<std::string>> pools = {
      {"a", "b", "z", "Q", "e", "the", "int", "_", "'s"},
      {"0", "7", "42", "123", "９", "٣"},
      {" ", "  ", "\t", "\n", "\r\n", "\r", "\xC2\xA0", "\xE3\x80\x80", "\xE2\x80\xA8", "\xC2\x85"},
      {".", ",", "!", "~", ">;", "{", "}", "\"", "(", "\xE3\x80\x82", "\xE2\x80\x94"},
      {"\xE4\xBD\xA0", "\xE5\xA5\xBD", "\xE3\x81\x82", "\xE3\x82\xA2", "\xED\x95\x9C"},
      {"\xD8\xB3", "\xD9\x84", "\xE0\xA4\x95", "\xE0\xA4\xBF", "\xCC\x81", "\xC3\xA9"},
      {"\xF0\x9F\x98\x80", "\xF0\x9F\x91\x8D", "\xF0\x9F\x8F\xBD", "\xE2\x80\x8D", "\xEF\xB8\x8F"},
  };
  std::string out;
  for (int i = 0; i < parts; ++i) {
    const size_t p = rng() % (pools.size() + (specials.empty() ? 0 : 1));
    const std::vector<std::string>& pool = p < pools.size() ? pools[p] : specials;
    const int run = 1 + int(rng() % 4);
    for (int k = 0; k < run; ++k) out += pool[rng() % pool.size()];
  }
  return out;
}

inline std::mt19937 fresh_rng() {
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  std::printf("random seed %u\n", seed);
  return rng;
}

}  // namespace aff::tokenizer_test
