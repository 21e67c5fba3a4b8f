// The aff-quantize binary: exit codes, messages and leftovers on failure, progress lines
// when piped, identical output at --threads 1/2/3.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <random>

#include "format/tensor_index.h"
#include "quantize_test_util.h"

namespace aff::quant {
namespace {

using testing::ScratchDir;
namespace fs = std::filesystem;

struct CliResult {
  int code;
  std::string out, err;
};

CliResult run_cli(const ScratchDir& dir, const std::string& args) {
  const std::string bin = std::string(AFFINITY_BIN_DIR) + "/aff-quantize";
  const std::string so = dir.str("stdout.txt"), se = dir.str("stderr.txt");
  const std::string cmd = bin + " " + args + " >" + so + " 2>" + se;
  const int st = std::system(cmd.c_str());
  CliResult r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  const auto o = testing::read_file(so), e = testing::read_file(se);
  r.out.assign(o.begin(), o.end());
  r.err.assign(e.begin(), e.end());
  return r;
}

class QuantizeCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(std::string(AFFINITY_BIN_DIR) + "/aff-quantize")) {
      GTEST_FAIL() << "aff-quantize is not built in " << AFFINITY_BIN_DIR;
    }
    dsv4::SyntheticCheckpointOptions opt;
    opt.seed = std::random_device{}();
    ASSERT_TRUE(dsv4::write_synthetic_checkpoint(dsv4::synthetic_tiny_config(), dir_.str("ckpt"), opt).is_ok());
  }
  ScratchDir dir_;
};

TEST_F(QuantizeCli, UsageErrorsExitTwo) {
  EXPECT_EQ(run_cli(dir_, "").code, 2);
  EXPECT_EQ(run_cli(dir_, "--src " + dir_.str("ckpt")).code, 2);  // no --out
  const CliResult r = run_cli(dir_, "--src " + dir_.str("ckpt") + " --out x.gguf --recipe q3");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("unknown recipe 'q3'"), std::string::npos) << r.err;
  EXPECT_EQ(run_cli(dir_, "--src a --out b --type nonsense").code, 2);
  EXPECT_EQ(run_cli(dir_, "--src a --out b --threads 0").code, 2);
  EXPECT_EQ(run_cli(dir_, "--src a --out b --bogus").code, 2);
  const CliResult h = run_cli(dir_, "--help");
  EXPECT_EQ(h.code, 0);
  EXPECT_NE(h.out.find("--imatrix"), std::string::npos);
}

TEST_F(QuantizeCli, SameBytesAtOneTwoThreeThreadsAndPlainProgressWhenPiped) {
  std::vector<uint8_t> first;
  for (int t : {1, 2, 3}) {
    const std::string out = dir_.str("t" + std::to_string(t) + ".gguf");
    const CliResult r = run_cli(dir_, "--src " + dir_.str("ckpt") + " --out " + out + " --recipe q8 --threads " +
                                    std::to_string(t));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find("aff-quantize: 100%"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find('\r'), std::string::npos) << "no carriage returns when stderr is not a terminal";
    EXPECT_NE(r.out.find("wrote " + out), std::string::npos);
    const auto bytes = testing::read_file(out);
    if (first.empty()) first = bytes;
    EXPECT_TRUE(bytes == first) << "--threads " << t;
  }
}

TEST_F(QuantizeCli, MissingCheckpointFailsWithoutOutput) {
  const std::string out = dir_.str("none.gguf");
  const CliResult r = run_cli(dir_, "--src " + dir_.str("nope") + " --out " + out);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("nope"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  const CliResult m = run_cli(dir_, "--src " + dir_.str("ckpt") + " --out " + dir_.str("missing-dir/x.gguf"));
  EXPECT_EQ(m.code, 1) << m.err;
  const CliResult i = run_cli(dir_, "--src " + dir_.str("ckpt") + " --out " + out + " --imatrix " + dir_.str("no.dat"));
  EXPECT_EQ(i.code, 1);
  EXPECT_NE(i.err.find("no.dat"), std::string::npos) << i.err;
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(QuantizeCli, TensorFailureExitsNonZeroNamingItAndLeavesNoFile) {
  // Poison one FP8 weight byte with E4M3's NaN code (0x7f) in its shard.
  std::string shard;
  size_t at = 0;
  {
    auto index = format::TensorIndex::open_dir(dir_.str("ckpt"));
    ASSERT_TRUE(index.is_ok());
    const TensorView v = *index->get("layers.3.attn.wq_b.weight");
    shard = v.file;
    const auto bytes = testing::read_file(shard);
    const auto* hit = static_cast<const uint8_t*>(memmem(bytes.data(), bytes.size(), v.data, 64));
    ASSERT_NE(hit, nullptr);
    at = size_t(hit - bytes.data()) + 100;
  }
  auto bytes = testing::read_file(shard);
  bytes[at] = 0x7f;
  testing::write_file(shard, bytes.data(), bytes.size());
  const std::string out = dir_.str("poisoned.gguf");
  const CliResult r = run_cli(dir_, "--src " + dir_.str("ckpt") + " --out " + out + " --threads 2");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("layers.3.attn.wq_b.weight"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("non-finite"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".tmp"));
}

}  // namespace
}  // namespace aff::quant
