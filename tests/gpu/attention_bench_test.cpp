// Timings on a real device, off by default (run with
// --gtest_also_run_disabled_tests --gtest_filter='*Bench*'): decode attention
// and indexer at V4-Flash geometry for 4K and 32K contexts, prefill attention,
// indexer and GEMM at 8K, and the GEMV/GEMM crossover. Medians of CUDA-event
// timings, printed with the fraction of their ceiling (HBM bytes at 4.45 TB/s
// for decode, bf16 dense ~800 TFLOP/s for prefill).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "backend/cuda/kernels/attention/attention.h"
#include "backend/cuda/kernels/gemm/gemm.h"
#include "backend/cuda/kernels/gemm/moe_grouped.h"
#include "backend/cuda/kernels/moe/moe.h"
#include "backend/cuda/kernels/gemv/gemv.h"
#include "backend/cuda/kernels/indexer/indexer.h"
#include "backend/cuda/runtime/device_buffer.h"
#include "gpu_test_util.h"

namespace aff::cuda {
namespace {

constexpr double kHbmBytesPerS = 4.45e12;
constexpr int H = 64, Dh = 512, W = 128, kIdxHeads = 64, kIdxDim = 128, kTopk = 512;

// All timed work runs on this stream (capturable, unlike the legacy stream).
cudaStream_t bench_stream() {
  static cudaStream_t s = [] {
    cudaStream_t x = nullptr;
    cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking);
    return x;
  }();
  return s;
}

// Median microseconds of fn over reps (after a warm-up call), launched one by
// one from the host: includes launch gaps.
double time_us(const std::function<void()>& fn, int reps = 30) {
  fn();
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a, bench_stream());
    fn();
    cudaEventRecord(b, bench_stream());
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  cudaEventDestroy(a), cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return 1e3 * ms[ms.size() / 2];
}

// Microseconds per call of fn replayed from a CUDA graph of kPerGraph calls,
// as the captured decode step runs it (median of graph replays).
double graph_us(const std::function<void()>& fn) {
  constexpr int kPerGraph = 20;
  fn();
  cudaStreamSynchronize(bench_stream());
  cudaGraph_t g = nullptr;
  cudaGraphExec_t e = nullptr;
  cudaStreamBeginCapture(bench_stream(), cudaStreamCaptureModeThreadLocal);
  for (int i = 0; i < kPerGraph; ++i) fn();
  if (cudaStreamEndCapture(bench_stream(), &g) != cudaSuccess || cudaGraphInstantiate(&e, g, 0) != cudaSuccess) {
    ADD_FAILURE() << "capture failed";
    return 0.0;
  }
  const double us = time_us([&] { cudaGraphLaunch(e, bench_stream()); }, 10) / kPerGraph;
  cudaGraphExecDestroy(e);
  cudaGraphDestroy(g);
  return us;
}

DeviceBuffer random_buffer(size_t floats, std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(floats);
  for (float& x : v) x = nd(rng);
  auto b = upload_vector(v, "bench");
  EXPECT_TRUE(b.is_ok());
  return std::move(*b);
}

DeviceBuffer ids_buffer(int64_t T, int k, int64_t range, std::mt19937_64& rng) {
  std::uniform_int_distribution<int64_t> id(0, range - 1);
  std::vector<int32_t> v(size_t(T * k));
  for (int32_t& x : v) x = int32_t(id(rng));
  auto b = upload_vector(v, "ids");
  EXPECT_TRUE(b.is_ok());
  return std::move(*b);
}

DeviceBuffer step_buffer(int64_t pos0, int64_t T) {
  auto b = upload_vector(std::vector<StepInfo>{StepInfo{pos0, T}}, "step");
  EXPECT_TRUE(b.is_ok());
  return std::move(*b);
}

TEST(AttentionBench, DISABLED_DecodeAndPrefill) {
  AFF_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(1);
  for (int64_t ctx : {int64_t(4096), int64_t(32768)}) {
    const int64_t cap = ctx / 4 + 1;
    DeviceBuffer q = random_buffer(size_t(H * Dh), rng), kv = random_buffer(Dh, rng),
                 ring = random_buffer(size_t(W * Dh), rng), ent = random_buffer(size_t(cap * Dh), rng),
                 sinks = random_buffer(H, rng), out = random_buffer(size_t(H * Dh), rng),
                 scratch = random_buffer(size_t(64 * H * (Dh + 2)), rng);
    DeviceBuffer sel = ids_buffer(1, kTopk, cap - 1, rng);
    std::vector<int32_t> cnt_h = {kTopk};
    auto cnt = upload_vector(cnt_h, "count");
    DeviceBuffer step = step_buffer(ctx - 1, 1);
    for (MmaPrecision p : {MmaPrecision::kBf16x3, MmaPrecision::kBf16}) {
      for (AttnEntries mode : {AttnEntries::kSelected, AttnEntries::kVisible, AttnEntries::kNone}) {
        AttentionArgs a;
        a.step = step.as<StepInfo>(), a.q = q.as<float>(), a.kv = kv.as<float>(), a.ring = ring.as<float>();
        a.entries = ent.as<float>(), a.mode = mode, a.sinks = sinks.as<float>(), a.T = 1, a.H = H, a.Dh = Dh, a.W = W;
        a.ratio = mode == AttnEntries::kVisible ? 128 : 4;
        a.entry_capacity = mode == AttnEntries::kVisible ? ctx / 128 + 1 : cap;
        a.sel = sel.as<int32_t>(), a.sel_count = cnt->as<int32_t>(), a.sel_ld = kTopk;
        a.scale = 0.044f, a.precision = p, a.out = out.as<float>();
        a.scratch = scratch.as<float>(), a.scratch_floats = int64_t(scratch.bytes() / 4);
        const int64_t keys = W + (mode == AttnEntries::kSelected ? kTopk : mode == AttnEntries::kVisible ? ctx / 128 : 0);
        const auto run = [&] { ASSERT_TRUE(attention_sparse(a, bench_stream()).is_ok()); };
        const double us = time_us(run), gus = graph_us(run);
        const double bytes = double(keys * Dh * 4 + 2 * H * Dh * 4);
        std::printf("[bench] attention decode ctx %5lld %-4s %-6s keys %4lld splits %2d: eager %6.2f us, in a graph %6.2f us (HBM floor %.2f us)\n",
                    (long long)ctx, mode == AttnEntries::kSelected ? "csa" : mode == AttnEntries::kVisible ? "hca" : "swa",
                    p == MmaPrecision::kBf16x3 ? "bf16x3" : "bf16", (long long)keys, attention_splits(a), us, gus,
                    bytes / kHbmBytesPerS * 1e6);
      }
      // Indexer: scores over every visible key, then top-512.
      DeviceBuffer iq = random_buffer(size_t(kIdxHeads * kIdxDim), rng), iw = random_buffer(kIdxHeads, rng),
                   keys = random_buffer(size_t(cap * kIdxDim), rng), scores = random_buffer(size_t(cap), rng);
      auto isel = DeviceBuffer::allocate(kTopk * 4, "sel"), icnt = DeviceBuffer::allocate(4, "cnt");
      IndexerScoreArgs s;
      s.step = step.as<StepInfo>(), s.q = iq.as<float>(), s.w = iw.as<float>(), s.keys = keys.as<float>();
      s.T = 1, s.capacity = cap, s.nh = kIdxHeads, s.hd = kIdxDim, s.ratio = 4, s.precision = p;
      s.scores = scores.as<float>();
      TopkArgs k;
      k.step = s.step, k.scores = s.scores, k.ld = cap, k.T = 1, k.ratio = 4, k.k = kTopk;
      k.sel = isel->as<int32_t>(), k.count = icnt->as<int32_t>();
      const auto run_s = [&] { ASSERT_TRUE(indexer_scores(s, bench_stream()).is_ok()); };
      const auto run_k = [&] { ASSERT_TRUE(indexer_topk(k, bench_stream()).is_ok()); };
      const double us_s = time_us(run_s), us_k = time_us(run_k), g_s = graph_us(run_s), g_k = graph_us(run_k);
      const double bytes = double(ctx / 4) * kIdxDim * 4;
      std::printf("[bench] indexer decode ctx %5lld %-6s scores eager %6.2f / graph %6.2f us (HBM floor %.2f us), "
                  "top-%d eager %6.2f / graph %6.2f us\n",
                  (long long)ctx, p == MmaPrecision::kBf16x3 ? "bf16x3" : "bf16", us_s, g_s, bytes / kHbmBytesPerS * 1e6,
                  kTopk, us_k, g_k);
    }
  }

  // Prefill at 8K: the last 2048 queries of an 8K prompt (CSA, 512 selected; SWA).
  const int64_t T = 2048, pos0 = 8192 - T, cap = 8192 / 4 + 1;
  DeviceBuffer q = random_buffer(size_t(T * H * Dh), rng), kv = random_buffer(size_t(T * Dh), rng),
               ring = random_buffer(size_t(W * Dh), rng), ent = random_buffer(size_t(cap * Dh), rng),
               sinks = random_buffer(H, rng), out = random_buffer(size_t(T * H * Dh), rng);
  DeviceBuffer sel = ids_buffer(T, kTopk, cap - 1, rng);
  auto cnt = upload_vector(std::vector<int32_t>(size_t(T), kTopk), "count");
  DeviceBuffer step = step_buffer(pos0, T);
  for (MmaPrecision p : {MmaPrecision::kBf16x3, MmaPrecision::kBf16}) {
    for (AttnEntries mode : {AttnEntries::kSelected, AttnEntries::kNone}) {
      AttentionArgs a;
      a.step = step.as<StepInfo>(), a.q = q.as<float>(), a.kv = kv.as<float>(), a.ring = ring.as<float>();
      a.entries = ent.as<float>(), a.entry_capacity = cap, a.ratio = 4, a.mode = mode, a.sinks = sinks.as<float>();
      a.sel = sel.as<int32_t>(), a.sel_count = cnt->as<int32_t>(), a.sel_ld = kTopk;
      a.T = T, a.H = H, a.Dh = Dh, a.W = W, a.scale = 0.044f, a.precision = p, a.out = out.as<float>();
      const int64_t keys = W + (mode == AttnEntries::kSelected ? kTopk : 0);
      const double us = time_us([&] { ASSERT_TRUE(attention_sparse(a, bench_stream()).is_ok()); }, 5);
      const double flops = 4.0 * double(T) * H * Dh * keys;  // QK^T and PV
      std::printf("[bench] attention prefill T %lld %-4s %-6s keys/query %lld: %8.1f us, %.0f TFLOP/s (%.0f%% of 800)\n",
                  (long long)T, mode == AttnEntries::kSelected ? "csa" : "swa",
                  p == MmaPrecision::kBf16x3 ? "bf16x3" : "bf16", (long long)keys, us, flops / us * 1e-6,
                  100.0 * flops / us * 1e-6 / 800.0);
    }
    DeviceBuffer iq = random_buffer(size_t(T * kIdxHeads * kIdxDim), rng), iw = random_buffer(size_t(T * kIdxHeads), rng),
                 keys = random_buffer(size_t(cap * kIdxDim), rng), scores = random_buffer(size_t(T * cap), rng);
    auto isel = DeviceBuffer::allocate(size_t(T * kTopk) * 4, "sel"), icnt = DeviceBuffer::allocate(size_t(T) * 4, "cnt");
    IndexerScoreArgs s;
    s.step = step.as<StepInfo>(), s.q = iq.as<float>(), s.w = iw.as<float>(), s.keys = keys.as<float>();
    s.T = T, s.capacity = cap, s.nh = kIdxHeads, s.hd = kIdxDim, s.ratio = 4, s.precision = p;
    s.scores = scores.as<float>();
    TopkArgs k;
    k.step = s.step, k.scores = s.scores, k.ld = cap, k.T = T, k.ratio = 4, k.k = kTopk;
    k.sel = isel->as<int32_t>(), k.count = icnt->as<int32_t>();
    const double us_s = time_us([&] { ASSERT_TRUE(indexer_scores(s, bench_stream()).is_ok()); }, 5);
    const double us_k = time_us([&] { ASSERT_TRUE(indexer_topk(k, bench_stream()).is_ok()); }, 5);
    // Visible pairs: query t sees (pos0 + t + 1) / 4 keys.
    const double pairs = double(T) * (double(pos0 + 1) / 4 + double(T) / 8);
    const double flops = 2.0 * pairs * kIdxHeads * kIdxDim;
    std::printf("[bench] indexer prefill T %lld %-6s scores %8.1f us, %.0f TFLOP/s; top-%d %8.1f us\n", (long long)T,
                p == MmaPrecision::kBf16x3 ? "bf16x3" : "bf16", us_s, flops / us_s * 1e-6, kTopk, us_k);
  }
}

TEST(GemmBench, DISABLED_CrossoverAndPrefill) {
  AFF_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(2);
  const int64_t out = 4096, in = 4096;
  std::uniform_int_distribution<int> byte(0, 0x7e);  // finite E4M3 codes
  std::vector<uint8_t> w8(size_t(out * in)), s8(size_t(out / 128 * in / 128), 127), w4(size_t(out * in / 2)),
      s4(size_t(out * in / 32), 127);
  for (uint8_t& b : w8) b = uint8_t(byte(rng));
  for (uint8_t& b : w4) b = uint8_t(byte(rng));
  auto dw8 = upload_vector(w8, "w8"), ds8 = upload_vector(s8, "s8"), dw4 = upload_vector(w4, "w4"),
       ds4 = upload_vector(s4, "s4");
  ASSERT_TRUE(dw8.is_ok() && ds8.is_ok() && dw4.is_ok() && ds4.is_ok());
  DeviceLinear fp8;
  fp8.weight = dw8->as<uint8_t>(), fp8.scale = ds8->as<uint8_t>(), fp8.format = DevFormat::kFP8Block;
  fp8.scale_type = DevScale::kE8M0, fp8.out = out, fp8.in = in, fp8.block = 128, fp8.scale_cols = in / 128;
  DeviceLinear mx;
  mx.weight = dw4->as<uint8_t>(), mx.scale = ds4->as<uint8_t>(), mx.format = DevFormat::kMXFP4;
  mx.scale_type = DevScale::kE8M0, mx.out = out, mx.in = in, mx.scale_cols = in / 32;
  const int64_t Tmax = 8192;
  DeviceBuffer x = random_buffer(size_t(Tmax * in), rng), y = random_buffer(size_t(Tmax * out), rng);
  for (const DeviceLinear* w : {&fp8, &mx}) {
    const char* name = w == &fp8 ? "fp8" : "mxfp4";
    for (int64_t T : {8, 16, 32, 48, 64, 96, 128, 256}) {
      const double g = time_us([&] { ASSERT_TRUE(gemv_f32(*w, x.as<float>(), T, y.as<float>(), bench_stream()).is_ok()); }, 10);
      const double m3 = time_us([&] {
        ASSERT_TRUE(gemm_rows_bf16(*w, 0, out, x.as<float>(), in, T, y.as<float>(), out, MmaPrecision::kBf16x3, bench_stream()).is_ok());
      }, 10);
      const double m1 = time_us([&] {
        ASSERT_TRUE(gemm_rows_bf16(*w, 0, out, x.as<float>(), in, T, y.as<float>(), out, MmaPrecision::kBf16, bench_stream()).is_ok());
      }, 10);
      std::printf("[bench] linear %-5s 4096x4096 T %4lld: gemv %8.1f us, gemm bf16x3 %8.1f us, gemm bf16 %8.1f us\n", name,
                  (long long)T, g, m3, m1);
    }
    for (MmaPrecision p : {MmaPrecision::kBf16x3, MmaPrecision::kBf16}) {
      const double us = time_us([&] {
        ASSERT_TRUE(gemm_rows_bf16(*w, 0, out, x.as<float>(), in, Tmax, y.as<float>(), out, p, bench_stream()).is_ok());
      }, 5);
      const double flops = 2.0 * Tmax * out * in * (p == MmaPrecision::kBf16x3 ? 2 : 1);
      std::printf("[bench] gemm %-5s 4096x4096 T %lld %-6s: %8.1f us, %.0f TFLOP/s executed (%.0f%% of 800)\n", name,
                  (long long)Tmax, p == MmaPrecision::kBf16x3 ? "bf16x3" : "bf16", us, flops / us * 1e-6,
                  100.0 * flops / us * 1e-6 / 800.0);
    }
  }
}

// Prefill experts at V4-Flash width (D 4096, inter 2048, MXFP4), 2048 tokens x
// 6 pairs over 16 experts (768 tokens each): grouped GEMM vs per-pair GEMV.
TEST(GemmBench, DISABLED_GroupedMoe) {
  AFF_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(3);
  const int E = 16, k = 6;
  const int64_t D = 4096, F = 2048, T = 2048;
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<DeviceBuffer> keep;
  auto mx = [&](int64_t out, int64_t in) {
    std::vector<uint8_t> w(size_t(out * in / 2)), s(size_t(out * in / 32), 120);
    for (uint8_t& b : w) b = uint8_t(byte(rng));
    auto dw = upload_vector(w, "w"), ds = upload_vector(s, "s");
    EXPECT_TRUE(dw.is_ok() && ds.is_ok());
    DeviceLinear l;
    l.weight = dw->as<uint8_t>(), l.scale = ds->as<uint8_t>(), l.format = DevFormat::kMXFP4;
    l.scale_type = DevScale::kE8M0, l.out = out, l.in = in, l.scale_cols = in / 32;
    keep.push_back(std::move(*dw)), keep.push_back(std::move(*ds));
    return l;
  };
  std::vector<ExpertSlot> slots(E);
  for (ExpertSlot& s : slots) s.w1 = mx(F, D), s.w3 = mx(F, D), s.w2 = mx(D, F);
  std::vector<int32_t> ids(size_t(T * k));
  for (int64_t i = 0; i < T * k; ++i) ids[size_t(i)] = int32_t((i * 7 + i / k) % E);
  auto dslots = upload_vector(slots, "slots");
  auto dids = upload_vector(ids, "ids");
  DeviceBuffer x = random_buffer(size_t(T * D), rng), y = random_buffer(size_t(T * k * D), rng),
               act = random_buffer(size_t(T * k * F), rng);
  ASSERT_TRUE(dslots.is_ok() && dids.is_ok());
  const double flops = 2.0 * 3 * double(T * k) * D * F;
  for (MmaPrecision p : {MmaPrecision::kBf16x3, MmaPrecision::kBf16}) {
    GroupedMoeArgs g;
    g.slots = slots, g.ids = dids->as<int32_t>(), g.n_pairs = T * k, g.pairs_per_token = k;
    g.x = x.as<float>(), g.D = D, g.inter = F, g.swiglu_limit = 7.0f, g.y = y.as<float>();
    const double us = time_us([&] { ASSERT_TRUE(moe_grouped_ffn(g, p, bench_stream()).is_ok()); }, 5);
    std::printf("[bench] grouped moe mxfp4 T %lld k %d over %d experts %-6s: %8.1f us, %.0f TFLOP/s useful\n",
                (long long)T, k, E, p == MmaPrecision::kBf16x3 ? "bf16x3" : "bf16", us, flops / us * 1e-6);
  }
  ExpertFfnArgs e;
  e.slots = dslots->as<ExpertSlot>(), e.format = DevFormat::kMXFP4, e.ids = dids->as<int32_t>(), e.n_pairs = T * k;
  e.pairs_per_token = k, e.x = x.as<float>(), e.D = D, e.inter = F, e.swiglu_limit = 7.0f;
  e.act = act.as<float>(), e.y = y.as<float>();
  const double us = time_us([&] { ASSERT_TRUE(expert_ffn(e, bench_stream()).is_ok()); }, 2);
  std::printf("[bench] per-pair expert_ffn (GEMV) same problem: %8.1f us, %.1f TFLOP/s\n", us, flops / us * 1e-6);
}

}  // namespace
}  // namespace aff::cuda
