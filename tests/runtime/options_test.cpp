#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/options.h"

namespace aff::core {
namespace {

EnvLookup no_env() {
  return [](const char*) -> const char* { return nullptr; };
}

Result<Options> parse(std::vector<std::string> args, EnvLookup env = no_env()) {
  return parse_options(args, env);
}

TEST(Options, DefaultsFollowTheReferenceDesign) {
  auto r = parse({});
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  const Options& o = r.value();
  EXPECT_EQ(o.n_predict, 32);
  EXPECT_EQ(o.temp, 0.0f);
  EXPECT_EQ(o.top_k, 0);
  EXPECT_EQ(o.top_p, 1.0f);
  EXPECT_EQ(o.min_p, 0.0f);
  EXPECT_EQ(o.prefill_chunk_size, 1408);
  EXPECT_EQ(o.seed, -1);
  EXPECT_EQ(o.max_layers, 0);
  EXPECT_EQ(o.threads, 0);
  EXPECT_TRUE(o.model.empty());
  EXPECT_FALSE(o.ignore_eos);
  EXPECT_FALSE(o.no_echo);
  EXPECT_FALSE(o.dump_tokens);
  EXPECT_TRUE(o.tokens.empty());
  EXPECT_TRUE(o.given.empty());
}

TEST(Options, ParsesEveryValueSyntax) {
  auto r = parse({"-m", "/x/model", "--tokenizer=/x/tok.json", "-p", "hello world", "-n", "7", "--temp", "0.7",
                  "--top-k=40", "--top-p", "0.9", "--min-p", "0.05", "--seed", "12345", "--ignore-eos", "--no-echo",
                  "--force-tokens", "3, 17,0", "--dump-logits", "5", "--max-layers", "2", "--no-routed-experts",
                  "--prefill-chunk-size", "64", "--threads", "3", "--ctx-size", "4096"});
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  const Options& o = r.value();
  EXPECT_EQ(o.model, "/x/model");
  EXPECT_EQ(o.tokenizer, "/x/tok.json");
  EXPECT_EQ(o.prompt, "hello world");
  EXPECT_EQ(o.n_predict, 7);
  EXPECT_FLOAT_EQ(o.temp, 0.7f);
  EXPECT_EQ(o.top_k, 40);
  EXPECT_FLOAT_EQ(o.top_p, 0.9f);
  EXPECT_FLOAT_EQ(o.min_p, 0.05f);
  EXPECT_EQ(o.seed, 12345);
  EXPECT_TRUE(o.ignore_eos);
  EXPECT_TRUE(o.no_echo);
  EXPECT_EQ(o.force_tokens, (std::vector<int32_t>{3, 17, 0}));
  EXPECT_EQ(o.dump_logits, 5);
  EXPECT_EQ(o.max_layers, 2);
  EXPECT_TRUE(o.no_routed_experts);
  EXPECT_EQ(o.prefill_chunk_size, 64);
  EXPECT_EQ(o.threads, 3);
  EXPECT_EQ(o.ctx_size, 4096);
  EXPECT_TRUE(o.was_given("--prompt"));
  EXPECT_TRUE(o.was_given("--n-predict"));
  EXPECT_FALSE(o.was_given("--tokens"));
}

TEST(Options, NegativeValueIsTakenAsTheValue) {
  auto r = parse({"--seed", "-1", "-p", "-starts with a dash"});
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r.value().seed, -1);
  EXPECT_EQ(r.value().prompt, "-starts with a dash");
}

TEST(Options, UsageErrorsNameTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::string must_contain;
  };
  const std::vector<Case> cases = {
      {{"--bogus"}, "unknown option '--bogus'"},
      {{"--bogus=3"}, "unknown option '--bogus'"},
      {{"-x"}, "unknown option '-x'"},
      {{"stray"}, "unexpected argument 'stray'"},
      {{"-n"}, "option --n-predict needs a value"},
      {{"-p", "x", "--temp"}, "option --temp needs a value"},
      {{"-n", "abc"}, "option --n-predict: invalid value 'abc'"},
      {{"-n", "12x"}, "option --n-predict: invalid value '12x'"},
      {{"-n", ""}, "option --n-predict: invalid value ''"},
      {{"-n", "-3"}, "must be between"},
      {{"-n", "99999999999"}, "must be between"},
      {{"--temp", "hot"}, "option --temp: invalid value 'hot'"},
      {{"--temp", "nan"}, "option --temp: invalid value 'nan'"},
      {{"--temp", "-0.5"}, "must be between"},
      {{"--top-p", "0"}, "must be between"},
      {{"--top-p", "1.5"}, "must be between"},
      {{"--min-p", "2"}, "must be between"},
      {{"--prefill-chunk-size", "0"}, "must be between"},
      {{"--tokens", "1,,2"}, "option --tokens: invalid value"},
      {{"--tokens", "1,-2"}, "option --tokens: invalid value"},
      {{"--tokens", "1,2,"}, "option --tokens: invalid value"},
      {{"--tokens", "3000000000"}, "option --tokens: invalid value"},
      {{"--force-tokens", "a"}, "option --force-tokens: invalid value"},
      {{"--ignore-eos=1"}, "option --ignore-eos takes no value"},
      {{"-p", "a", "--tokens", "1"}, "only one of"},
      {{"--prompt-file", "f", "-p", "a"}, "only one of"},
      {{"--dump-tokens", "--tokens", "5"}, "--dump-tokens"},
      {{"--dump-tokens"}, "--dump-tokens needs a prompt"},
  };
  for (const Case& c : cases) {
    auto r = parse(c.args);
    ASSERT_FALSE(r.is_ok()) << "accepted: " << ::testing::PrintToString(c.args);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.must_contain), std::string::npos)
        << "args " << ::testing::PrintToString(c.args) << " gave: " << r.status().message();
  }
}

TEST(Options, EnvironmentSitsBetweenDefaultsAndArgv) {
  std::map<std::string, std::string> env = {{"AFF_THREADS", "5"}, {"AFF_MODEL", "/env/model"}};
  EnvLookup lookup = [&env](const char* n) -> const char* {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  auto r = parse({}, lookup);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r.value().threads, 5);
  EXPECT_EQ(r.value().model, "/env/model");
  r = parse({"--threads", "2"}, lookup);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r.value().threads, 2);

  env["AFF_THREADS"] = "many";
  r = parse({}, lookup);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("environment variable AFF_THREADS"), std::string::npos) << r.status().message();
}

TEST(Options, TableIsWellFormed) {
  std::set<std::string> names;
  for (const OptionSpec& s : option_table()) {
    ASSERT_EQ(s.long_name.substr(0, 2), "--") << s.long_name;
    EXPECT_TRUE(names.insert(std::string(s.long_name)).second) << "duplicate " << s.long_name;
    if (!s.short_name.empty()) {
      EXPECT_TRUE(names.insert(std::string(s.short_name)).second) << s.short_name;
    }
    EXPECT_FALSE(s.help.empty()) << s.long_name;
    EXPECT_EQ(s.kind == OptionKind::kFlag, s.metavar.empty()) << s.long_name;
  }
}

TEST(Options, HelpListsEveryFlagWithDefaultAndEnv) {
  const std::string help = options_help("affinity");
  for (const OptionSpec& s : option_table()) {
    EXPECT_NE(help.find(std::string(s.long_name)), std::string::npos) << s.long_name;
    if (!s.env.empty()) {
      EXPECT_NE(help.find(std::string(s.env)), std::string::npos) << s.env;
    }
  }
  EXPECT_NE(help.find("-n, --n-predict N"), std::string::npos);
  EXPECT_NE(help.find("[32]"), std::string::npos);
  EXPECT_NE(help.find("[1408]"), std::string::npos);
  for (size_t start = 0; start < help.size();) {
    size_t end = help.find('\n', start);
    if (end == std::string::npos) end = help.size();
    EXPECT_LE(end - start, 100u) << help.substr(start, end - start);
    start = end + 1;
  }
  const std::string md = options_markdown();
  for (const OptionSpec& s : option_table()) {
    EXPECT_NE(md.find(std::string(1, '`').append(s.long_name)), std::string::npos) << s.long_name;
  }
}

TEST(Options, StrictNumberParsers) {
  int64_t i = 0;
  double d = 0;
  EXPECT_TRUE(parse_int64("42", i));
  EXPECT_EQ(i, 42);
  EXPECT_TRUE(parse_int64("-7", i));
  EXPECT_EQ(i, -7);
  EXPECT_FALSE(parse_int64(" 4", i));
  EXPECT_FALSE(parse_int64("4 ", i));
  EXPECT_FALSE(parse_int64("0x10", i));
  EXPECT_FALSE(parse_int64("1e3", i));
  EXPECT_TRUE(parse_double("1e-3", d));
  EXPECT_DOUBLE_EQ(d, 1e-3);
  EXPECT_TRUE(parse_double(".5", d));
  EXPECT_FALSE(parse_double("inf", d));
  EXPECT_FALSE(parse_double("0.5.", d));
  std::vector<int32_t> ids;
  EXPECT_TRUE(parse_id_list("0", ids));
  EXPECT_EQ(ids, std::vector<int32_t>{0});
  EXPECT_FALSE(parse_id_list("", ids));
  EXPECT_FALSE(parse_id_list(",", ids));
  EXPECT_FALSE(parse_id_list("+1", ids));
}

}  // namespace
}  // namespace aff::core

namespace aff::core {
namespace {

// docs/config.md is generated (`affinity --help-md`); a flag added to the
// table without regenerating it fails here.
TEST(Options, DocsConfigMdIsUpToDate) {
  std::ifstream in(std::string(AFFINITY_SOURCE_DIR) + "/docs/config.md", std::ios::binary);
  ASSERT_TRUE(in) << "docs/config.md is missing";
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(doc, options_markdown()) << "regenerate with: build/bin/affinity --help-md > docs/config.md";
}

}  // namespace
}  // namespace aff::core
