// End-to-end tests of the affinity binary: exit codes, error messages, and the
// diagnostic outputs, on a random-weight checkpoint in the official layout.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <algorithm>
#include <cstdlib>
#include <span>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "format/npy.h"
#include "model/dsv4/synthetic_checkpoint.h"
#include "tokenizer/tokenizer.h"

namespace aff {
namespace {

namespace fs = std::filesystem;

struct RunResult {
  int rc = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

class Cli : public ::testing::Test {
 public:
  static inline fs::path root_;
  static inline fs::path model_;       // the good checkpoint
  static inline int64_t vocab_ = 0;

  static void SetUpTestSuite() {
    std::mt19937_64 rng(std::random_device{}());
    root_ = fs::temp_directory_path() / ("aff_cli_" + std::to_string(rng()));
    model_ = root_ / "model";
    dsv4::ModelConfig cfg = dsv4::synthetic_tiny_config();
    cfg.vocab_size = 1031;  // covers the test tokenizer's ids, odd on purpose
    vocab_ = cfg.vocab_size;
    dsv4::SyntheticCheckpointOptions opts;
    opts.seed = rng();
    opts.max_shard_bytes = 400 << 10;  // several shards, so one can be damaged
    const Status st = dsv4::write_synthetic_checkpoint(cfg, model_.string(), opts);
    ASSERT_TRUE(st.is_ok()) << st.message();
    fs::copy_file(fs::path(AFFINITY_TEST_DATA) / "tokenizer" / "tiny_tokenizer.json", model_ / "tokenizer.json");
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  // Runs the built binary with stdout and stderr captured in files.
  static RunResult run(const std::vector<std::string>& args) {
    static int counter = 0;
    const fs::path out = root_ / ("out" + std::to_string(counter));
    const fs::path err = root_ / ("err" + std::to_string(counter++));
    std::string cmd = shell_quote(std::string(AFFINITY_BIN_DIR) + "/affinity");
    for (const std::string& a : args) cmd.append(" ").append(shell_quote(a));
    cmd += " >" + shell_quote(out.string()) + " 2>" + shell_quote(err.string()) + " </dev/null";
    const int status = std::system(cmd.c_str());
    RunResult r;
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }

  static const fs::path& scratch() { return root_; }

  static std::vector<std::string> with_model(std::vector<std::string> args, const fs::path& model = model_) {
    // One thread: ctest runs test binaries side by side on small CI machines,
    // where oversubscribed OpenMP threads are slower by orders of magnitude.
    args.insert(args.begin(), {"-m", model.string(), "--threads", "1"});
    return args;
  }

  // A copy of the good checkpoint to damage.
  static fs::path copy_model(const std::string& name) {
    const fs::path dst = root_ / name;
    fs::copy(model_, dst, fs::copy_options::recursive);
    return dst;
  }

  static std::vector<fs::path> shards(const fs::path& dir) {
    std::vector<fs::path> s;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().extension() == ".safetensors") s.push_back(e.path());
    }
    std::sort(s.begin(), s.end());
    return s;
  }
};

TEST_F(Cli, UsageErrorsExitTwo) {
  const std::vector<std::vector<std::string>> cases = {
      {"--bogus"}, {"-n", "abc"}, {"-p", "x", "--temp"}, {"stray"}, {"--top-p", "2"},
      {"--tokens", "1,x"}, {"-p", "a", "--tokens", "1"}, {"--ignore-eos=yes"},
      {"-p", "a", "--port", "9"}, {"--logits-out", "x.npy"}};
  for (const auto& args : cases) {
    const RunResult r = run(args);
    EXPECT_EQ(r.rc, 2) << ::testing::PrintToString(args) << "\n" << r.err;
    EXPECT_NE(r.err.find("affinity: error:"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--help"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  EXPECT_NE(run({"--bogus"}).err.find("'--bogus'"), std::string::npos);
  EXPECT_NE(run({"-n", "abc"}).err.find("--n-predict"), std::string::npos);
}

TEST_F(Cli, HelpAndVersion) {
  RunResult r = run({"--help"});
  EXPECT_EQ(r.rc, 0);
  for (const char* flag : {"--model", "--tokenizer", "--prompt", "--prompt-file", "--n-predict", "--ignore-eos",
                           "--no-echo", "--temp", "--top-k", "--top-p", "--min-p", "--seed", "--dump-tokens",
                           "--tokens", "--force-tokens", "--logits-out", "--dump-logits", "--max-layers",
                           "--no-routed-experts", "--prefill-chunk-size", "--threads", "--ctx-size", "--version"}) {
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
  }
  r = run({"--version"});
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(r.out, std::string("affinity ") + AFFINITY_VERSION + "\n");
  r = run({"--help-md"});
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(r.out.rfind("# Configuration", 0), 0u);
}

TEST_F(Cli, MissingModelDirExitsOneNamingIt) {
  const fs::path missing = root_ / "no_such_model";
  const RunResult r = run(with_model({"-p", "hi"}, missing));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find(missing.string()), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty());
}

TEST_F(Cli, CorruptShardExitsOneNamingTheFile) {
  const fs::path dir = copy_model("truncated");
  const std::vector<fs::path> s = shards(dir);
  ASSERT_GE(s.size(), 2u);
  const fs::path victim = s[s.size() / 2];
  fs::resize_file(victim, fs::file_size(victim) / 2);
  const RunResult r = run(with_model({"-p", "hi"}, dir));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find(victim.filename().string()), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty());
}

TEST_F(Cli, GarbageShardHeaderExitsOne) {
  const fs::path dir = copy_model("garbage");
  const fs::path victim = shards(dir).front();
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    const char junk[16] = {'\xff', '\xff', '\xff', '\x7f', 0, 0, 0, 0, '{', '!', '!', '!', '!', '!', '!', '!'};
    f.write(junk, sizeof(junk));
  }
  const RunResult r = run(with_model({"-p", "hi"}, dir));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find(victim.filename().string()), std::string::npos) << r.err;
}

TEST_F(Cli, MissingTensorExitsOneNamingIt) {
  const fs::path dir = copy_model("missing_tensor");
  const fs::path index = dir / "model.safetensors.index.json";
  nlohmann::json j = nlohmann::json::parse(slurp(index));
  const std::string victim = "layers.2.attn.wkv.weight";
  ASSERT_EQ(j["weight_map"].erase(victim), 1u);
  std::ofstream(index) << j.dump();
  const RunResult r = run(with_model({"-p", "hi"}, dir));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find(victim), std::string::npos) << r.err;
}

TEST_F(Cli, BrokenConfigExitsOneNamingIt) {
  const fs::path dir = copy_model("broken_config");
  std::ofstream(dir / "config.json") << "{\"model_type\": \"deepseek_v4\", ";
  const RunResult r = run(with_model({"-p", "hi"}, dir));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("config.json"), std::string::npos) << r.err;
}

TEST_F(Cli, MissingTokenizerExitsOneNamingIt) {
  const fs::path tok = root_ / "nowhere" / "tokenizer.json";
  const RunResult r = run(with_model({"-p", "hi", "--tokenizer", tok.string()}));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find(tok.string()), std::string::npos) << r.err;
}

TEST_F(Cli, OutOfVocabTokenExitsOne) {
  const RunResult r = run(with_model({"--tokens", "5," + std::to_string(vocab_)}));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find(std::to_string(vocab_)), std::string::npos) << r.err;
}

TEST_F(Cli, DumpTokensPrintsBosAndTheTokenizerIds) {
  const std::string text = "Hello wörld,  2 + 2 = 4<｜User｜>!";
  const RunResult r = run(with_model({"-p", text, "--dump-tokens"}));
  ASSERT_EQ(r.rc, 0) << r.err;
  auto tok = Tokenizer::load((model_ / "tokenizer.json").string());
  ASSERT_TRUE(tok.is_ok()) << tok.status().message();
  std::string want = "0";
  for (int32_t id : tok.value()->encode(text)) want.append(",").append(std::to_string(id));
  EXPECT_EQ(r.out, want + "\n");

  const RunResult no_bos = run(with_model({"-p", text, "--dump-tokens", "--no-bos"}));
  ASSERT_EQ(no_bos.rc, 0) << no_bos.err;
  EXPECT_EQ(no_bos.out, want.substr(2) + "\n");
}

// Runs with --logits-out and returns the array.
format::NpyArray logits_of(std::vector<std::string> args) {
  static int counter = 0;
  const fs::path out = Cli::scratch() / ("logits" + std::to_string(counter++) + ".npy");
  args.insert(args.end(), {"--logits-out", out.string()});
  const RunResult r = Cli::run(args);
  EXPECT_EQ(r.rc, 0) << r.err;
  auto arr = format::read_npy_f32(out.string());
  EXPECT_TRUE(arr.is_ok()) << arr.status().message();
  return arr.is_ok() ? std::move(arr).value() : format::NpyArray{};
}

float max_abs_diff(std::span<const float> a, std::span<const float> b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

TEST_F(Cli, LogitsOutCoversPromptAndForcedTokens) {
  const format::NpyArray a = logits_of(with_model({"--tokens", "0,5,17,3,250,1000,7", "--force-tokens", "9,10"}));
  ASSERT_EQ(a.shape, (std::vector<int64_t>{9, vocab_}));
  for (float x : a.data) ASSERT_TRUE(std::isfinite(x));
  // Rows differ from position to position (the model sees the tokens).
  EXPECT_GT(max_abs_diff(std::span(a.data).subspan(0, size_t(vocab_)),
                         std::span(a.data).subspan(size_t(vocab_), size_t(vocab_))), 1e-4f);

  // Causal: the first 7 rows do not depend on the forced continuation.
  const format::NpyArray b = logits_of(with_model({"--tokens", "0,5,17,3,250,1000,7"}));
  ASSERT_EQ(b.shape, (std::vector<int64_t>{7, vocab_}));
  EXPECT_LE(max_abs_diff(b.data, std::span(a.data).subspan(0, b.data.size())), 1e-5f);

  // Chunked prefill gives the same logits as one chunk.
  const format::NpyArray c =
      logits_of(with_model({"--tokens", "0,5,17,3,250,1000,7", "--force-tokens", "9,10", "--prefill-chunk-size", "2"}));
  EXPECT_LE(max_abs_diff(c.data, a.data), 1e-4f);
}

TEST_F(Cli, GreedyGenerationFollowsTheLogits) {
  const std::string prompt = "0,5,17,3,250";
  const format::NpyArray a = logits_of(with_model({"--tokens", prompt}));
  ASSERT_EQ(a.shape.size(), 2u);
  const std::span<const float> last = std::span(a.data).subspan(a.data.size() - size_t(vocab_));
  const int32_t want = int32_t(std::max_element(last.begin(), last.end()) - last.begin());

  const RunResult r = run(with_model({"--tokens", prompt, "-n", "4", "--no-echo", "--ignore-eos", "--dump-logits", "3"}));
  ASSERT_EQ(r.rc, 0) << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex("step 0 -> (\\d+): (\\d+)="))) << r.err;
  EXPECT_EQ(std::stoi(m[1]), want);
  EXPECT_EQ(std::stoi(m[2]), want);  // greedy takes the top logit
  EXPECT_NE(r.err.find("step 3 -> "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tok/s"), std::string::npos) << r.err;

  // The same run again gives the same text; the stream is the tokens' text.
  EXPECT_EQ(run(with_model({"--tokens", prompt, "-n", "4", "--no-echo", "--ignore-eos"})).out, r.out);
}

TEST_F(Cli, SeededSamplingIsReproducible) {
  const std::vector<std::string> args = {"-p", "Once", "-n", "12", "--temp", "1.5", "--seed", "4242",
                                         "--ignore-eos", "--no-echo", "--dump-logits", "1"};
  const RunResult a = run(with_model(args));
  const RunResult b = run(with_model(args));
  ASSERT_EQ(a.rc, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  auto steps = [](const std::string& err) {
    std::string s;
    std::regex re("step \\d+ -> \\d+");
    for (auto it = std::sregex_iterator(err.begin(), err.end(), re); it != std::sregex_iterator(); ++it) s += it->str();
    return s;
  };
  EXPECT_EQ(steps(a.err), steps(b.err));
  EXPECT_NE(steps(a.err).find("step 11 -> "), std::string::npos) << a.err;
}

TEST_F(Cli, ForcedTokensAreTheContinuation) {
  const RunResult r = run(with_model({"--tokens", "0,5", "--force-tokens", "40,41,42", "--no-echo", "--dump-logits", "1"}));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("step 0 -> 40:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("step 2 -> 42:"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("step 3 -> "), std::string::npos) << r.err;  // exactly the forced ids without -n
  auto tok = Tokenizer::load((model_ / "tokenizer.json").string());
  ASSERT_TRUE(tok.is_ok());
  EXPECT_EQ(r.out, tok.value()->decode({40, 41, 42}));
}

TEST_F(Cli, EchoesThePromptFromAFile) {
  const fs::path f = scratch() / "prompt.txt";
  std::ofstream(f) << "In the beginning";
  const RunResult r = run(with_model({"--prompt-file", f.string(), "-n", "2"}));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.rfind("In the beginning", 0), 0u) << r.out;
  const RunResult missing = run(with_model({"--prompt-file", (scratch() / "nope.txt").string()}));
  EXPECT_EQ(missing.rc, 1);
  EXPECT_NE(missing.err.find("nope.txt"), std::string::npos) << missing.err;
}

}  // namespace
}  // namespace aff
