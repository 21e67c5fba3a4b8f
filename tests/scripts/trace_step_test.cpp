// scripts/gpu/trace-step.py on a small made-up kernel trace (the CSV that
// AFF_CUDA_TRACE writes): it must pick the step with the most kernels, find
// the layers by their mHC sites and attribute each kernel's added time. And
// scripts/gpu/trace-decode.sh around it, with a stand-in for a bundle's run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

namespace {

namespace fs = std::filesystem;

// stdout of a shell command; ok: it ran and exited 0.
std::string run(const std::string& cmd, bool& ok) {
  std::string out;
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
  ok = p != nullptr;
  if (!ok) return out;
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = fread(buf.data(), 1, buf.size(), p.get())) > 0) out.append(buf.data(), n);
  ok = pclose(p.release()) == 0;
  return out;
}

// A made-up trace: a short launch (warm-up), then the step: one layer (site,
// projection, site, MoE) and the head's site. Times in ns from 1 s.
void write_trace(const fs::path& csv) {
  std::ofstream f(csv);
  f << "launch,stream,start_ns,end_ns,grid,block,name\n";
  f << "7,14,1000000000,1000001000,1,32,embed_f32_sm90\n";
  f << "7,14,1000002000,1000003000,1,32,argmax_f32_sm90\n";
  f << "9,14,1000000000,1000010000,32,128,hc_fused_small_f32_sm90\n";
  f << "9,14,1000005000,1000020000,256,256,gemv_mma_sm90\n";
  f << "9,14,1000018000,1000025000,32,128,hc_fused_small_f32_sm90\n";
  f << "9,15,1000024000,1000040000,66,512,moe_up_fast_sm90\n";
  f << "9,14,1000040000,1000045000,32,128,hc_fused_small_f32_sm90\n";
}

fs::path repo_root() { return fs::path(AFFINITY_TEST_DATA) / ".." / ".."; }

TEST(TraceStep, LayersAndAddedTimes) {
  const fs::path script = repo_root() / "scripts" / "gpu" / "trace-step.py";
  ASSERT_TRUE(fs::exists(script)) << script;
  const fs::path csv = fs::temp_directory_path() / ("trace_step_test_" + std::to_string(::getpid()) + ".csv");
  write_trace(csv);
  bool ok = false, ok_all = false;
  const std::string cmd = "python3 '" + script.string() + "' '" + csv.string() + "'";
  const std::string out = run(cmd + " --layer 0", ok);
  const std::string all = run(cmd, ok_all);
  fs::remove(csv);
  ASSERT_TRUE(ok) << out;
  ASSERT_TRUE(ok_all) << all;
  // The per-kind summary: one layer without an indexer, its kernels' added
  // times summing to its span (first site's start to the head site's end).
  EXPECT_NE(all.find("other layers (1), mean added per kernel in end order"), std::string::npos) << all;
  EXPECT_NE(all.find("end: 45.0):"), std::string::npos) << all;
  EXPECT_NE(all.find("  15.00    66x512  moe_up_fast_sm90"), std::string::npos) << all;
  EXPECT_NE(out.find("launch 9: 5 kernels over 45.0 us"), std::string::npos) << out;
  // Site end to site end: the attention sublayer 10 -> 25 us, the MoE 25 -> 45 us.
  EXPECT_NE(out.find("attention: mean 15.0"), std::string::npos) << out;
  EXPECT_NE(out.find("MoE:       mean 20.0"), std::string::npos) << out;
  // End order with what each added: the GEMV ends 10 us after the first site,
  // the MoE kernel 15 us after the second site.
  EXPECT_NE(out.find("     5.00     20.00   10.00   256x256  gemv_mma_sm90"), std::string::npos) << out;
  EXPECT_NE(out.find("    24.00     40.00   15.00    66x512  moe_up_fast_sm90"), std::string::npos) << out;
  // Per kernel name: the three sites' durations (10 + 7 + 5 us).
  EXPECT_NE(out.find("hc_fused_small_f32_sm90"), std::string::npos) << out;
  EXPECT_NE(out.find("     3     7.33      22.0"), std::string::npos) << out;
}

// trace-decode.sh with a stand-in bundle whose `run` writes the made-up trace
// where AFF_CUDA_TRACE says: the tables come out, the trace is kept; a bench
// that fails makes the script fail with a message.
TEST(TraceDecode, RunsTheBenchAndSummarises) {
  const fs::path script = repo_root() / "scripts" / "gpu" / "trace-decode.sh";
  ASSERT_TRUE(fs::exists(script)) << script;
  const fs::path dir = fs::temp_directory_path() / ("trace_decode_test_" + std::to_string(::getpid()));
  fs::create_directories(dir / "bundle");
  write_trace(dir / "made_up.csv");
  auto stand_in = [&](bool fail) {
    std::ofstream f(dir / "bundle" / "run");
    f << "#!/usr/bin/env bash\n";
    if (fail) f << "echo 'no GPU' >&2; exit 3\n";
    else f << "cp '" << (dir / "made_up.csv").string() << "' \"$AFF_CUDA_TRACE\"\necho \"bench $*\"\n";
    f.close();
    fs::permissions(dir / "bundle" / "run", fs::perms::owner_all);
  };
  const std::string cmd = "BIN_DIR='" + (dir / "bundle").string() + "' bash '" + script.string() + "' '" +
                          (dir / "out").string() + "' --contexts 4096 2>&1";
  stand_in(false);
  bool ok = false;
  const std::string out = run(cmd, ok);
  EXPECT_TRUE(ok) << out;
  EXPECT_NE(out.find("launch 9: 5 kernels over 45.0 us"), std::string::npos) << out;
  EXPECT_NE(out.find("other layers (1)"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(dir / "out" / "step.txt"));
  EXPECT_TRUE(fs::exists(dir / "out" / "trace.csv") || fs::exists(dir / "out" / "trace.csv.xz"));
  std::ifstream bench(dir / "out" / "bench.txt");
  const std::string bench_text((std::istreambuf_iterator<char>(bench)), {});
  EXPECT_NE(bench_text.find("bench affinity-bench --contexts 4096"), std::string::npos) << bench_text;
  stand_in(true);
  const std::string failed = run(cmd, ok);
  EXPECT_FALSE(ok) << failed;
  EXPECT_NE(failed.find("trace-decode: affinity-bench failed"), std::string::npos) << failed;
  fs::remove_all(dir);
}

}  // namespace
