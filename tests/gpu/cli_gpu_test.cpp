// The affinity CLI on the GPU: greedy generation on the trained tiny model
// must print exactly the CPU path's text (the GPU agrees with the CPU
// reference to f32 rounding, far inside greedy margins on this model).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "gpu_test_util.h"

namespace aff {
namespace {

namespace fs = std::filesystem;

struct CliRun {
  int rc = -1;
  std::string out, err;
};

CliRun run_cli(const std::string& args) {
  const fs::path dir = fs::temp_directory_path() / ("aff_cli_gpu_" + std::to_string(std::random_device{}()));
  fs::create_directories(dir);
  const std::string model = (fs::path(AFFINITY_SOURCE_DIR) / "models" / "tiny-v4").string();
  // AFF_TEST_AFFINITY: how to start the CLI where it is not at its build path
  // (binaries packed by scripts/gpu/bundle.sh run through the bundle's wrapper).
  const char* launcher = std::getenv("AFF_TEST_AFFINITY");
  const std::string exe = launcher && *launcher ? std::string(launcher) : std::string(AFFINITY_BIN_DIR) + "/affinity";
  const std::string cmd = exe + " -m '" + model + "' " + args + " >'" +
                          (dir / "out").string() + "' 2>'" + (dir / "err").string() + "' </dev/null";
  const int status = std::system(cmd.c_str());
  CliRun r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  auto slurp = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  r.out = slurp(dir / "out");
  r.err = slurp(dir / "err");
  std::error_code ec;
  fs::remove_all(dir, ec);
  return r;
}

TEST(CliGpu, GreedyTextMatchesTheCpuPath) {
  AFF_SKIP_WITHOUT_GPU();
  const std::string args = "-p 'Once upon a time, in a small village,' -n 40 --kv-commit 16";
  const CliRun gpu = run_cli("--gpu on " + args);
  const CliRun cpu = run_cli("--gpu off " + args);
  ASSERT_EQ(gpu.rc, 0) << gpu.err;
  ASSERT_EQ(cpu.rc, 0) << cpu.err;
  EXPECT_NE(gpu.err.find("running on cuda"), std::string::npos) << gpu.err;
  EXPECT_NE(cpu.err.find("running on cpu"), std::string::npos) << cpu.err;
  EXPECT_GT(gpu.out.size(), 40u);
  EXPECT_EQ(gpu.out, cpu.out);
}

TEST(CliGpu, LogitsOutMatchTheCpuPath) {
  AFF_SKIP_WITHOUT_GPU();
  const fs::path g = fs::temp_directory_path() / "aff_cli_gpu_logits_g.npy";
  const fs::path c = fs::temp_directory_path() / "aff_cli_gpu_logits_c.npy";
  const std::string args = "-p 'The quick brown fox jumps over the lazy dog.' --logits-out ";
  const CliRun gpu = run_cli("--gpu on " + args + "'" + g.string() + "'");
  const CliRun cpu = run_cli("--gpu off " + args + "'" + c.string() + "'");
  ASSERT_EQ(gpu.rc, 0) << gpu.err;
  ASSERT_EQ(cpu.rc, 0) << cpu.err;
  std::ifstream a(g, std::ios::binary), b(c, std::ios::binary);
  const std::string sa(std::istreambuf_iterator<char>(a), {}), sb(std::istreambuf_iterator<char>(b), {});
  ASSERT_EQ(sa.size(), sb.size());
  ASSERT_GT(sa.size(), 128u);
  // float32 payload after the npy header (same header on both: same shape).
  const size_t header = 10 + size_t(uint8_t(sa[8])) + (size_t(uint8_t(sa[9])) << 8);  // npy v1 header length
  double num = 0, den = 0;
  for (size_t i = header; i + 4 <= sa.size(); i += 4) {
    float x, y;
    std::memcpy(&x, sa.data() + i, 4);
    std::memcpy(&y, sb.data() + i, 4);
    num += double(x - y) * double(x - y);
    den += double(y) * double(y);
  }
  // The GPU path agrees with the CPU reference to f32 rounding (rel RMS ~1e-7 in tests/gpu/model_test).
  constexpr double kTolRelRms = 1e-3;
  EXPECT_LE(std::sqrt(num / std::max(den, 1e-30)), kTolRelRms);
  std::error_code ec;
  fs::remove(g, ec);
  fs::remove(c, ec);
}

}  // namespace
}  // namespace aff
