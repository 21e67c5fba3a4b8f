// The persistent GEMV chain (gemv_chain.cu): each step against a double-precision
// host product of the same FP8 weights with the step's own input (the previous
// step's output as the GPU wrote it), the chain's outputs bit-identical across
// runs (fixed summation order), and the whole chain against the same steps as
// gemv_mma_normed launches.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <tuple>
#include <vector>

#include "backend/cuda/kernels/gemm/mma_precision.h"
#include "backend/cuda/kernels/gemv/gemv.h"
#include "backend/cuda/kernels/gemv/gemv_chain.h"
#include "backend/cuda/runtime/device_buffer.h"
#include "core/dtype.h"
#include "gpu_test_util.h"

namespace aff::cuda {
namespace {

constexpr int64_t N = kChainWidth;
constexpr float kEps = 1e-6f;

struct HostStep {
  std::vector<uint8_t> w, s;  // [N, N] E4M3; [N / 128, N / 128] E8M0
};

double rel_rms(const float* got, const std::vector<double>& want) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// W rmsnorm(x) in double.
std::vector<double> host_step(const HostStep& h, const float* x) {
  double ss = 0.0;
  for (int64_t k = 0; k < N; ++k) ss += double(x[k]) * x[k];
  const double inv = 1.0 / std::sqrt(ss / double(N) + kEps);
  std::vector<double> y(size_t(N), 0.0);
  for (int64_t r = 0; r < N; ++r) {
    double acc = 0.0;
    for (int64_t k = 0; k < N; ++k)
      acc += double(e4m3_to_f32(h.w[size_t(r * N + k)])) * std::ldexp(1.0, int(h.s[size_t((r / 128) * (N / 128) + k / 128)]) - 127) *
             (double(x[k]) * inv);
    y[size_t(r)] = acc;
  }
  return y;
}

TEST(GemvChain, MatchesHostProductsAndLaunches) {
  AFF_SKIP_WITHOUT_GPU();
  if (!gemv_chain_supported()) GTEST_SKIP() << "the chain kernel does not fit one block per SM on this device";
  AFF_SEEDED_RNG(seed, rng);
  constexpr int kSteps = 3;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> e8(118, 124);
  std::vector<HostStep> host(kSteps);
  std::vector<DeviceBuffer> keep;
  std::vector<DeviceLinear> lin(kSteps);
  for (int i = 0; i < kSteps; ++i) {
    HostStep& h = host[size_t(i)];
    h.w.resize(size_t(N * N));
    for (uint8_t& v : h.w) v = f32_to_e4m3(nd(rng) * 40.0f);
    h.s.resize(size_t((N / 128) * (N / 128)));
    for (uint8_t& v : h.s) v = uint8_t(e8(rng));
    auto dw = upload_vector(h.w, "w");
    auto ds = upload_vector(h.s, "s");
    ASSERT_TRUE(dw.is_ok() && ds.is_ok());
    DeviceLinear& l = lin[size_t(i)];
    l.format = DevFormat::kFP8Block, l.scale_type = DevScale::kE8M0, l.block = 128;
    l.out = N, l.in = N, l.scale_cols = N / 128;
    l.weight = dw->as<uint8_t>(), l.scale = ds->as<uint8_t>();
    keep.push_back(std::move(*dw)), keep.push_back(std::move(*ds));
  }
  std::vector<float> x0(static_cast<size_t>(N));
  for (float& v : x0) v = nd(rng);
  x0[7] = 250.0f;  // an outlier the norm must carry
  auto dlin = upload_vector(lin, "steps");
  auto dx = upload_vector(x0, "x0");
  auto dys = upload_vector(std::vector<float>(size_t(kSteps * N), std::nanf("")), "ys");
  // The tagged workspace starts stale: every row already tagged as written,
  // with NaN values, which only gemv_chain's own zeroing keeps out.
  std::vector<unsigned long long> stale(size_t(kSteps * N));
  for (int i = 0; i < kSteps; ++i)
    for (int64_t j = 0; j < N; ++j) stale[size_t(i * N + j)] = (static_cast<unsigned long long>(i + 1) << 32) | 0x7fc00000u;
  auto dll = upload_vector(stale, "ll");
  ASSERT_TRUE(dlin.is_ok() && dx.is_ok() && dys.is_ok() && dll.is_ok());

  ChainArgs a;
  a.w = dlin->as<DeviceLinear>(), a.steps = kSteps, a.x0 = dx->as<float>(), a.ys = dys->as<float>();
  a.ll = dll->as<unsigned long long>(), a.eps = kEps;
  // One chain to its end, and its outputs.
  auto run = [&](const ChainArgs& r) -> Result<std::vector<float>> {
    AFF_RETURN_IF_ERROR(gemv_chain(r, nullptr));
    if (cudaDeviceSynchronize() != cudaSuccess) return internal_error("gemv_chain did not finish");
    return download_vector(r.ys, size_t(kSteps * N), "ys");
  };
  auto got = run(a);
  ASSERT_TRUE(got.is_ok()) << got.status().message();
  for (float v : *got) ASSERT_TRUE(std::isfinite(v));
  // Each step's outputs against the double product of its own input (x0, then
  // the previous step's outputs as the GPU wrote them): the relative RMS per step.
  auto step_errors = [&](const std::vector<float>& ys) {
    std::vector<double> e(kSteps);
    for (int i = 0; i < kSteps; ++i) {
      const float* x = i == 0 ? x0.data() : ys.data() + size_t(i - 1) * N;
      e[size_t(i)] = rel_rms(ys.data() + size_t(i) * N, host_step(host[size_t(i)], x));
    }
    return e;
  };
  const std::vector<double> exact_err = step_errors(*got);
  for (int i = 0; i < kSteps; ++i) {
    std::printf("[gemv-chain] step %d vs host: rel rms %.3e\n", i, exact_err[size_t(i)]);
    EXPECT_LT(exact_err[size_t(i)], 2e-6) << "step " << i;  // f32 sums of 4096 terms against double
  }

  // Again: the same bits (every sum in a fixed order).
  auto again = run(a);
  ASSERT_TRUE(again.is_ok()) << again.status().message();
  EXPECT_EQ(*again, *got);
  // With the producer's copies gated on the consumers' loads: the same bits.
  ChainArgs gated = a;
  gated.gate_copies = true;
  auto gated_out = run(gated);
  ASSERT_TRUE(gated_out.is_ok()) << gated_out.status().message();
  EXPECT_EQ(*gated_out, *got);

  // The same chain as launches of the normed tensor-core GEMV (exact setting).
  set_mma_precision(MmaPrecision::kBf16x3);
  auto ones = upload_vector(std::vector<float>(size_t(N), 1.0f), "norm");
  auto dyl = upload_vector(std::vector<float>(size_t(kSteps * N), std::nanf("")), "ys launches");
  ASSERT_TRUE(ones.is_ok() && dyl.is_ok());
  for (int i = 0; i < kSteps; ++i) {
    const float* x = i == 0 ? a.x0 : dyl->as<float>() + int64_t(i - 1) * N;
    ASSERT_TRUE(gemv_mma_normed(lin[size_t(i)], x, 1, dyl->as<float>() + int64_t(i) * N, ones->as<float>(), kEps, nullptr)
                    .is_ok());
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto launched = download_vector(dyl->as<float>(), size_t(kSteps * N), "ys launches");
  ASSERT_TRUE(launched.is_ok());
  std::vector<double> want(launched->begin(), launched->end());
  const double e = rel_rms(got->data(), want);
  std::printf("[gemv-chain] %d steps vs gemv_mma_normed launches: rel rms %.3e\n", kSteps, e);
  EXPECT_LT(e, 1e-5);

  // The rounded forms, each step against the double product of its own input.
  // Bounds: a value rounded to nearest with p fraction bits is off by at most
  // 2^-(p+1) of itself, so the output's relative error over many random-sign
  // terms stays below that: 2^-11 for f16 (hi only), 2^-4 for e4m3.
  for (const auto& [prec, name, bound] : {std::tuple{ChainPrecision::kF16, "f16", 0x1p-11},
                                          std::tuple{ChainPrecision::kE4M3, "e4m3", 0x1p-4}}) {
    ChainArgs r = a;
    r.precision = prec;
    auto out = run(r);
    ASSERT_TRUE(out.is_ok()) << out.status().message();
    const std::vector<double> err = step_errors(*out);
    for (int i = 0; i < kSteps; ++i) {
      const double er = err[size_t(i)];
      std::printf("[gemv-chain] %s step %d vs host: rel rms %.3e (bound %.1e)\n", name, i, er, bound);
      EXPECT_LT(er, bound) << name << " step " << i;
      EXPECT_GT(er, 1e-6) << name << " step " << i << ": no rounding seen, so the exact form ran";
    }
  }
}

}  // namespace
}  // namespace aff::cuda
