// --gpu on a machine without a usable GPU: `on` must fail with a clear message
// and exit 1 (the model could not be used as asked), `auto` must fall back to
// the CPU, and a bad mode is a usage error. On a machine with a GPU the first
// two are covered by tests/gpu/cli_gpu_test.cpp instead.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "backend/device_probe.h"
#include "model/dsv4/synthetic_checkpoint.h"

namespace aff {
namespace {

namespace fs = std::filesystem;

struct CliRun {
  int rc = -1;
  std::string err;
};

class GpuFlag : public ::testing::Test {
 protected:
  static inline fs::path root_, model_;

  static void SetUpTestSuite() {
    std::mt19937_64 rng(std::random_device{}());
    root_ = fs::temp_directory_path() / ("aff_gpuflag_" + std::to_string(rng()));
    model_ = root_ / "model";
    dsv4::ModelConfig cfg = dsv4::synthetic_tiny_config();
    cfg.vocab_size = 1031;  // covers the test tokenizer's ids
    dsv4::SyntheticCheckpointOptions opts;
    opts.seed = rng();
    ASSERT_TRUE(dsv4::write_synthetic_checkpoint(cfg, model_.string(), opts).is_ok());
    fs::copy_file(fs::path(AFFINITY_TEST_DATA) / "tokenizer" / "tiny_tokenizer.json", model_ / "tokenizer.json");
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  static CliRun run(const std::string& args) {
    const fs::path err = root_ / "err.txt";
    const std::string cmd = std::string(AFFINITY_BIN_DIR) + "/affinity -m '" + model_.string() +
                            "' --threads 1 " + args + " >/dev/null 2>'" + err.string() + "' </dev/null";
    const int status = std::system(cmd.c_str());
    CliRun r;
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::ifstream in(err);
    r.err.assign(std::istreambuf_iterator<char>(in), {});
    return r;
  }
};

TEST_F(GpuFlag, OnWithoutAGpuIsAClearErrorAndExitOne) {
  if (!probe_gpus().empty()) GTEST_SKIP() << "a GPU is visible: tests/gpu covers --gpu on";
  const CliRun r = run("--gpu on -p hello -n 2");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("--gpu on"), std::string::npos) << r.err;
  // Either no CUDA in this build, or no device: the message must say which.
  EXPECT_TRUE(r.err.find("no CUDA device") != std::string::npos || r.err.find("no CUDA backend") != std::string::npos)
      << r.err;
}

TEST_F(GpuFlag, AutoWithoutAGpuRunsOnTheCpu) {
  if (!probe_gpus().empty()) GTEST_SKIP() << "a GPU is visible";
  const CliRun r = run("--gpu auto -p hello -n 2");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("running on cpu"), std::string::npos) << r.err;
}

TEST_F(GpuFlag, UnknownModeIsAUsageError) {
  const CliRun r = run("--gpu maybe -p hello -n 2");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("--gpu"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace aff
