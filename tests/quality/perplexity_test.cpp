// Perplexity: chunking, statistics against logits computed separately, and
// the affinity CLI (--perplexity against --logits-out on the tiny model).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "format/npy.h"
#include "model/dsv4/forward.h"
#include "model/dsv4/mtp.h"
#include "quality_test_util.h"
#include "runtime/perplexity.h"

namespace aff {
namespace {

namespace fs = std::filesystem;
using quality_test::argmax_of;
using quality_test::nll_of;

TEST(SplitIntoChunks, BosInsertedWhereMissing) {
  // BOS = 0; the text starts without one and holds one at index 5.
  const std::vector<int32_t> text = {7, 8, 9, 10, 11, 0, 12, 13, 14, 15, 16};
  const auto c = runtime::split_into_chunks(text, 4, true, 0);
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[0].ids, (std::vector<int32_t>{0, 7, 8, 9}));
  EXPECT_TRUE(c[0].inserted_bos);
  EXPECT_EQ(c[1].ids, (std::vector<int32_t>{0, 10, 11, 0}));
  EXPECT_EQ(c[1].text_begin, 3);
  // A chunk that already starts with BOS keeps it and takes `context` text tokens.
  EXPECT_EQ(c[2].ids, (std::vector<int32_t>{0, 12, 13, 14}));
  EXPECT_TRUE(c[2].inserted_bos);
  EXPECT_EQ(c[3].ids, (std::vector<int32_t>{0, 15, 16}));
  int64_t covered = 0;
  for (const auto& x : c) covered += x.text_tokens;
  EXPECT_EQ(covered, int64_t(text.size()));

  const std::vector<int32_t> starts = {0, 5, 6, 7, 0, 8};
  const auto d = runtime::split_into_chunks(starts, 4, true, 0);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].ids, (std::vector<int32_t>{0, 5, 6, 7}));
  EXPECT_FALSE(d[0].inserted_bos);
  EXPECT_EQ(d[1].ids, (std::vector<int32_t>{0, 8}));
  EXPECT_FALSE(d[1].inserted_bos);
}

TEST(SplitIntoChunks, PlainSlicesDropOnePositionTail) {
  const std::vector<int32_t> text = {3, 4, 5, 6, 7, 8, 9};
  const auto c = runtime::split_into_chunks(text, 3, false, 0);
  ASSERT_EQ(c.size(), 2u);  // {3,4,5} {6,7,8}; {9} predicts nothing
  EXPECT_EQ(c[0].ids, (std::vector<int32_t>{3, 4, 5}));
  EXPECT_EQ(c[1].ids, (std::vector<int32_t>{6, 7, 8}));
  EXPECT_TRUE(runtime::split_into_chunks(std::vector<int32_t>{5}, 8, false, 0).empty());
}

// Statistics equal those computed here from each chunk's logits (fresh
// state per chunk), for the main head, the MTP head and the draft agreement,
// whatever the piece size inside a chunk.
TEST(Perplexity, EqualsStatisticsOfSeparateLogits) {
  std::mt19937_64 rng(std::random_device{}());
  const dsv4::ModelConfig cfg = quality_test::mtp_config();
  auto m = dsv4::testing::random_model(cfg, rng());
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> text = quality_test::random_tokens(rng, 157, cfg.vocab_size);
  const int64_t ctx = 45, V = cfg.vocab_size, row = int64_t(cfg.hc_mult) * cfg.hidden_size;

  double nll = 0, mnll = 0;
  int64_t n = 0, hits = 0, mn = 0, mhits = 0, agree = 0;
  for (const auto& chunk : runtime::split_into_chunks(text, ctx, true, cfg.bos_token_id)) {
    const std::vector<int32_t>& ids = chunk.ids;
    const int64_t T = int64_t(ids.size());
    auto st = dsv4::make_state(*m, T);
    std::vector<float> logits, hidden, mlog;
    dsv4::ForwardOptions fo;
    fo.hidden_out = &hidden;
    ASSERT_TRUE(dsv4::forward(*m, *st, ids, true, logits, fo).is_ok());
    for (int64_t t = 0; t + 1 < T; ++t) {
      std::span<const float> r(logits.data() + t * V, size_t(V));
      nll += nll_of(r, ids[size_t(t + 1)]);
      hits += argmax_of(r) == ids[size_t(t + 1)];
      ++n;
    }
    if (T < 3) continue;
    auto ms = dsv4::make_mtp_state(*m, T);
    ASSERT_TRUE(ms.is_ok());
    ASSERT_TRUE(dsv4::mtp_forward(*m, *ms.value(), std::span<const float>(hidden.data(), size_t((T - 2) * row)),
                                  std::span<const int32_t>(ids).subspan(1, size_t(T - 2)), true, mlog)
                    .is_ok());
    for (int64_t t = 0; t + 2 < T; ++t) {
      std::span<const float> r(mlog.data() + t * V, size_t(V));
      mnll += nll_of(r, ids[size_t(t + 2)]);
      mhits += argmax_of(r) == ids[size_t(t + 2)];
      agree += argmax_of(r) == argmax_of(std::span<const float>(logits.data() + (t + 1) * V, size_t(V)));
      ++mn;
    }
  }

  for (int64_t batch : {0, 1, 13, 44}) {
    SCOPED_TRACE(batch);
    runtime::PerplexityOptions po;
    po.context = ctx;
    po.bos_id = cfg.bos_token_id;
    po.batch = batch;
    auto r = runtime::evaluate_perplexity(*m, text, po);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    const runtime::PerplexityReport& rep = r.value();
    EXPECT_EQ(rep.chunks, 4);  // 157 tokens = 44 + 44 + 44 + 25, each behind a BOS
    EXPECT_EQ(rep.main.predictions, n);
    EXPECT_NEAR(rep.main.mean_nll(), nll / double(n), 1e-4);
    EXPECT_NEAR(rep.main.perplexity(), std::exp(nll / double(n)), 1e-4 * rep.main.perplexity());
    EXPECT_NEAR(double(rep.main.top1_hits), double(hits), 1.0);
    ASSERT_TRUE(rep.has_mtp);
    EXPECT_EQ(rep.mtp.predictions, mn);
    EXPECT_NEAR(rep.mtp.mean_nll(), mnll / double(mn), 1e-4);
    EXPECT_NEAR(double(rep.mtp.top1_hits), double(mhits), 1.0);
    EXPECT_EQ(rep.draft_rows, mn);
    EXPECT_NEAR(double(rep.draft_agree), double(agree), 1.0);
  }
}

TEST(Perplexity, RejectsBadInput) {
  std::mt19937_64 rng(std::random_device{}());
  auto m = dsv4::testing::random_model(quality_test::mtp_config(), rng());
  ASSERT_NE(m, nullptr);
  runtime::PerplexityOptions po;
  // One token predicts nothing (with a BOS in front it would be predicted).
  po.bos_each_chunk = false;
  EXPECT_FALSE(runtime::evaluate_perplexity(*m, std::vector<int32_t>{3}, po).is_ok());
  po.bos_each_chunk = true;
  EXPECT_TRUE(runtime::evaluate_perplexity(*m, std::vector<int32_t>{3}, po).is_ok());
  auto bad = runtime::evaluate_perplexity(*m, std::vector<int32_t>{3, 4, int32_t(m->config.vocab_size)}, po);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("text position 2"), std::string::npos) << bad.status().message();
  po.context = 1;
  EXPECT_FALSE(runtime::evaluate_perplexity(*m, std::vector<int32_t>{3, 4}, po).is_ok());
}

// ---- the CLI on the committed tiny model ----------------------------------

struct CliRun {
  int rc = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

class PerplexityCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::mt19937_64 rng(std::random_device{}());
    dir_ = fs::temp_directory_path() / ("aff_ppl_" + std::to_string(rng()));
    fs::create_directories(dir_);
    // ~420 tokens of held-out text: from its start (which carries BOS), and
    // from the middle of a document (no BOS).
    const std::string all = slurp(fs::path(AFFINITY_TEST_DATA) / "tiny-v4" / "heldout.txt");
    ASSERT_GT(all.size(), 40000u);
    // Cut at spaces so no UTF-8 sequence is split.
    std::ofstream(dir_ / "head.txt", std::ios::binary) << all.substr(0, all.rfind(' ', 1500));
    const size_t mid = all.find(' ', 30000) + 1;
    std::ofstream(dir_ / "mid.txt", std::ios::binary) << all.substr(mid, all.rfind(' ', mid + 1400) - mid);
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  static CliRun run(const std::vector<std::string>& args) {
    static int counter = 0;
    const fs::path out = dir_ / ("out" + std::to_string(counter)), err = dir_ / ("err" + std::to_string(counter++));
    std::string cmd = quote(std::string(AFFINITY_BIN_DIR) + "/affinity");
    for (const std::string& a : args) {
      cmd += ' ';
      cmd += quote(a);
    }
    // Appended piece by piece: "literal" + std::string&& trips a GCC 12
    // -Wrestrict false positive.
    cmd += " >";
    cmd += quote(out.string());
    cmd += " 2>";
    cmd += quote(err.string());
    cmd += " </dev/null";
    const int status = std::system(cmd.c_str());
    CliRun r;
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }
  static inline fs::path dir_;
};

// One chunk covering the whole file: its perplexity is exp(mean NLL) of the
// --logits-out logits of the same ids (BOS added by both when the text lacks
// one; none added with --no-bos).
TEST_F(PerplexityCli, MatchesLogitsOut) {
  const std::string model = std::string(AFFINITY_SOURCE_DIR) + "/models/tiny-v4";
  for (const char* name : {"head.txt", "mid.txt"}) {
    for (bool no_bos : {false, true}) {
      SCOPED_TRACE(std::string(name) + (no_bos ? " --no-bos" : ""));
      const std::string file = (dir_ / name).string();
      const std::string json = (dir_ / "ppl.json").string(), npy = (dir_ / "logits.npy").string();
      std::vector<std::string> extra;
      if (no_bos) extra.push_back("--no-bos");
      std::vector<std::string> a = {"-m", model, "--perplexity", file, "--ppl-context", "1024", "--json-out", json};
      a.insert(a.end(), extra.begin(), extra.end());
      const CliRun p = run(a);
      ASSERT_EQ(p.rc, 0) << p.err;
      EXPECT_NE(p.out.find("perplexity"), std::string::npos) << p.out;
      EXPECT_NE(p.err.find("tok/s"), std::string::npos) << p.err;
      std::vector<std::string> b = {"-m", model, "--prompt-file", file, "--logits-out", npy};
      b.insert(b.end(), extra.begin(), extra.end());
      const CliRun l = run(b);
      ASSERT_EQ(l.rc, 0) << l.err;
      const std::vector<std::string> c = {"-m", model, "--prompt-file", file, "--dump-tokens"};
      std::vector<std::string> cc = c;
      cc.insert(cc.end(), extra.begin(), extra.end());
      const CliRun t = run(cc);
      ASSERT_EQ(t.rc, 0) << t.err;
      std::vector<int32_t> ids;
      for (size_t i = 0; i < t.out.size();) {
        size_t j = t.out.find_first_of(",\n", i);
        if (j == std::string::npos) j = t.out.size();
        if (j > i) ids.push_back(std::stoi(t.out.substr(i, j - i)));
        i = j + 1;
      }
      auto arr = format::read_npy_f32(npy);
      ASSERT_TRUE(arr.is_ok()) << arr.status().message();
      const int64_t T = arr.value().shape[0], V = arr.value().shape[1];
      ASSERT_EQ(T, int64_t(ids.size()));
      ASSERT_GT(T, 300);
      double nll = 0;
      int64_t hits = 0;
      for (int64_t i = 0; i + 1 < T; ++i) {
        std::span<const float> r(arr.value().data.data() + i * V, size_t(V));
        nll += nll_of(r, ids[size_t(i + 1)]);
        hits += argmax_of(r) == ids[size_t(i + 1)];
      }
      const auto j = nlohmann::json::parse(slurp(json));
      const auto& mj = j["perplexity"]["main"];
      EXPECT_EQ(mj["predictions"].get<int64_t>(), T - 1);
      EXPECT_NEAR(mj["mean_nll"].get<double>(), nll / double(T - 1), 1e-5);
      EXPECT_NEAR(mj["perplexity"].get<double>(), std::exp(nll / double(T - 1)), 1e-5 * std::exp(nll / double(T - 1)));
      EXPECT_NEAR(mj["top1"].get<double>() * double(T - 1), double(hits), 0.5);
      EXPECT_EQ(j["perplexity"]["mtp"]["predictions"].get<int64_t>(), T - 2);
      EXPECT_EQ(j["perplexity"]["chunks"].get<int64_t>(), 1);
    }
  }
}

TEST_F(PerplexityCli, UsageAndInputErrors) {
  const std::string file = (dir_ / "head.txt").string();
  EXPECT_EQ(run({"--ppl-context", "64"}).rc, 2);
  EXPECT_EQ(run({"--json-out", "x.json"}).rc, 2);
  EXPECT_EQ(run({"--perplexity", file, "-p", "hello"}).rc, 2);
  EXPECT_EQ(run({"--perplexity", file, "--ppl-context", "1"}).rc, 2);
  EXPECT_EQ(run({"--perplexity", file, "--port", "9"}).rc, 2);
  const CliRun missing = run({"--perplexity", (dir_ / "nope.txt").string()});
  EXPECT_EQ(missing.rc, 1);
  EXPECT_NE(missing.err.find("nope.txt"), std::string::npos) << missing.err;
  const CliRun too_long = run({"--perplexity", file, "-c", "64", "--ppl-context", "128"});
  EXPECT_EQ(too_long.rc, 1);
  EXPECT_NE(too_long.err.find("--ppl-context"), std::string::npos) << too_long.err;
}

}  // namespace
}  // namespace aff
