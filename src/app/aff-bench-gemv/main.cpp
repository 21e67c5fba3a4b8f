// aff-bench-gemv: the weight-streaming kernels on V4-Flash shapes. Each row is
// the median over repetitions of a batch of back-to-back launches timed with
// CUDA events, as GB/s of weight bytes and the fraction of the H200's measured
// 4.45 TB/s. Every launch in a batch reads a different copy of the weights
// (together several times the 50 MB L2), so the numbers are HBM reads, not L2
// hits. The last rows read one expert from pinned host memory mapped into the
// device (zero-copy over PCIe), the path of a tiered expert store.
//   --quick      fewer rows;
//   --floors     the decode step's FP8 projections, some as split Q8_0, and the head against a plain
//                read of the same bytes;
//   --moe-parts  the decode MoE's launches alone and together, replayed from
//                CUDA graphs (no launch gaps, as in the decode step), and the
//                one-launch MoE with its per-block phase times;
//   --chain      a chain of dependent normed FP8 GEMVs (4096 x 4096) as launches
//                and as one persistent launch (gemv_chain.h) in each rounding of
//                x, with and without its copies gated, ring sizes, and block 0's
//                per-step phase times, against the plain read of the same bytes,
//                replayed from CUDA graphs;
//   --handoff    what a dependency between two steps that move almost no bytes
//                costs: a launch per step (plain or programmatic dependent) against
//                one persistent launch handing values over through memory
//                (kernels/misc/handoff_probe.h), replayed from CUDA graphs.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#ifdef AFFINITY_HAS_CUDA
#include <cuda_runtime.h>

#include "backend/cuda/kernels/common/ggml_tables.h"
#include "backend/cuda/kernels/gemv/gemv.h"
#include "backend/cuda/kernels/gemv/gemv_chain.h"
#include "backend/cuda/kernels/misc/handoff_probe.h"
#include "backend/cuda/kernels/misc/misc.h"
#include "backend/cuda/kernels/moe/moe.h"
#include "backend/cuda/runtime/device_weights.h"
#include "quant/type_traits.h"
#endif

#ifdef AFFINITY_HAS_CUDA
namespace {

using namespace aff;
using namespace aff::cuda;
using quant::GgmlType;

constexpr double kHbmBytesPerS = 4.45e12;      // H200, measured (docs/BENCHMARKS.md)
constexpr size_t kRotateBytes = size_t(512) << 20;  // weights cycled per batch: 10x the L2
constexpr int kReps = 25;                      // median over this many batches

#define CK(call)                                                                  \
  do {                                                                            \
    cudaError_t e_ = (call);                                                      \
    if (e_ != cudaSuccess) {                                                      \
      std::fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_));            \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

void ok(const Status& s) {
  if (!s.is_ok()) {
    std::fprintf(stderr, "error: %s\n", s.message().c_str());
    std::exit(1);
  }
}

struct Fmt {
  const char* name;
  DevFormat format;
  GgmlType ggml;
};

// Bytes of a weight [out, in] in f (plus its scales).
size_t weight_bytes(const Fmt& f, int64_t out, int64_t in) {
  switch (f.format) {
    case DevFormat::kFP8Block: return size_t(out * in + ((out + 127) / 128) * ((in + 127) / 128));
    case DevFormat::kMXFP4: return size_t(out * in / 2 + out * in / 32);
    case DevFormat::kBF16:
    case DevFormat::kF16: return size_t(out * in * 2);
    case DevFormat::kF32: return size_t(out * in * 4);
    case DevFormat::kGgml: return size_t(out * *quant::ggml_row_bytes(f.ggml, in));
    case DevFormat::kQ8: return size_t(out * in + out * in / 16);
  }
  return 0;
}

// A DeviceLinear over bytes at p (weights first, scales after), filled with a
// constant pattern: speed does not depend on the values, and 0x11 decodes to
// finite numbers in every format.
DeviceLinear describe(const Fmt& f, int64_t out, int64_t in, uint8_t* p) {
  DeviceLinear w;
  w.weight = p, w.format = f.format, w.out = out, w.in = in;
  if (f.format == DevFormat::kFP8Block) {
    w.scale = p + out * in, w.scale_type = DevScale::kE8M0, w.block = 128, w.scale_cols = (in + 127) / 128;
  } else if (f.format == DevFormat::kMXFP4) {
    w.scale = p + out * in / 2, w.scale_type = DevScale::kE8M0, w.scale_cols = in / 32;
  } else if (f.format == DevFormat::kQ8) {
    w.scale = p + out * in, w.scale_type = DevScale::kF16, w.scale_cols = in / 32;
  } else if (f.format == DevFormat::kGgml) {
    w.ggml_type = int(f.ggml), w.row_bytes = *quant::ggml_row_bytes(f.ggml, in);
    auto t = ggml_device_tables();
    ok(t.status());
    w.tables = reinterpret_cast<const uint8_t*>(*t);
  }
  return w;
}

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// n copies of a weight in one allocation (device, or mapped pinned host memory).
struct Copies {
  std::vector<DeviceLinear> w;
  uint8_t* base = nullptr;
  bool host = false;
  size_t bytes_each = 0;
  Copies(const Fmt& f, int64_t out, int64_t in, int n, bool on_host = false) : host(on_host) {
    bytes_each = weight_bytes(f, out, in);
    const size_t stride = align256(bytes_each);
    if (host) {
      CK(cudaHostAlloc(&base, stride * n, cudaHostAllocMapped));
      std::memset(base, 0x11, stride * n);
    } else {
      CK(cudaMalloc(&base, stride * n));
      CK(cudaMemset(base, 0x11, stride * n));
    }
    for (int i = 0; i < n; ++i) {
      uint8_t* p = base + stride * i;
      if (host) CK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&p), base + stride * i, 0));
      w.push_back(describe(f, out, in, p));
    }
  }
  ~Copies() {
    if (host) cudaFreeHost(base);
    else cudaFree(base);
  }
};

template <class Launch>
double median_us_per_launch(int per_batch, Launch launch) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < per_batch; ++i) launch(i);  // warm-up
  CK(cudaDeviceSynchronize());
  std::vector<double> us;
  for (int r = 0; r < kReps; ++r) {
    CK(cudaEventRecord(a));
    for (int i = 0; i < per_batch; ++i) launch(i);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    us.push_back(double(ms) * 1e3 / per_batch);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

void row(const std::string& kernel, const std::string& shape, const char* fmt, int T, double bytes, double us,
         double ceiling = kHbmBytesPerS) {
  const double gbs = bytes / (us * 1e-6) / 1e9;
  std::printf("| %-22s | %-26s | %-8s | %d | %8.1f | %7.2f | %7.0f | %5.1f%% |\n", kernel.c_str(), shape.c_str(), fmt, T,
              bytes / 1e6, us, gbs, 100.0 * gbs * 1e9 / ceiling);
  std::fflush(stdout);
}

float* device_floats(size_t n, float v) {
  std::vector<float> h(n, v);
  float* p = nullptr;
  CK(cudaMalloc(&p, n * 4));
  CK(cudaMemcpy(p, h.data(), n * 4, cudaMemcpyHostToDevice));
  return p;
}

void bench_gemv(const Fmt& f, int64_t out, int64_t in, int T, const std::string& what, float* x, float* y) {
  const size_t bytes = weight_bytes(f, out, in);
  const int n = int(std::clamp<size_t>(kRotateBytes / bytes, 2, 64));
  Copies c(f, out, in, n);
  const double us = median_us_per_launch(n, [&](int i) { ok(gemv_f32(c.w[size_t(i)], x, T, y, nullptr)); });
  row("gemv " + what, std::to_string(in) + "->" + std::to_string(out), f.name, T, double(bytes), us);
}

// The same bytes through the plain streaming read (hbm_read_probe), then the
// GEMV, each over rotating copies (HBM) and over one copy again and again (as
// much as L2 keeps). The probe is what a kernel of that size can reach.
void bench_floor(const Fmt& f, int64_t out, int64_t in, const std::string& what, float* x, float* y, uint32_t* sink,
                 int64_t rows_per_group = 0, int64_t x_group_stride = 0) {
  const size_t bytes = weight_bytes(f, out, in);
  const int n = int(std::clamp<size_t>(kRotateBytes / bytes, 2, 64));
  Copies c(f, out, in, n);
  const std::string shape = std::to_string(in) + "->" + std::to_string(out);
  auto gemv = [&](int i) {
    const DeviceLinear& w = c.w[size_t(i)];
    if (rows_per_group > 0) ok(gemv_mma(w, 0, w.out, x, x_group_stride * (w.out / rows_per_group), 1, y, w.out,
                                        rows_per_group, x_group_stride, nullptr));
    else ok(gemv_f32(w, x, 1, y, nullptr));
  };
  const double probe = median_us_per_launch(n, [&](int i) { ok(hbm_read_probe(c.w[size_t(i)].weight, int64_t(bytes) / 16 * 16, sink, nullptr)); });
  row("read probe " + what, shape, f.name, 1, double(bytes), probe);
  row("gemv " + what, shape, f.name, 1, double(bytes), median_us_per_launch(n, gemv));
  const double probe_l2 = median_us_per_launch(n, [&](int) { ok(hbm_read_probe(c.w[0].weight, int64_t(bytes) / 16 * 16, sink, nullptr)); });
  row("read probe, one copy " + what, shape, f.name, 1, double(bytes), probe_l2);
  row("gemv, one copy " + what, shape, f.name, 1, double(bytes), median_us_per_launch(n, [&](int) { gemv(0); }));
}

// Full-geometry decode MoE: E experts (routed formats w13 for gate/up, w2 for
// down) and an FP8 shared expert; every launch pair uses fresh expert ids.
void bench_moe(const Fmt& w13, const Fmt& w2, int T, float* x, float* out) {
  const int E = 256, k = 6;
  const int64_t D = 4096, I = 2048;
  Copies g(w13, I, D, E), u(w13, I, D, E), d(w2, D, I, E);
  const Fmt fp8{"FP8", DevFormat::kFP8Block, GgmlType::kF32};
  Copies sg(fp8, I, D, 1), su(fp8, I, D, 1), sd(fp8, D, I, 1);
  std::vector<ExpertSlot> slots(E);
  for (int e = 0; e < E; ++e) slots[size_t(e)] = {g.w[size_t(e)], u.w[size_t(e)], d.w[size_t(e)]};
  ExpertSlot shared{sg.w[0], su.w[0], sd.w[0]};
  ExpertSlot *dslots = nullptr, *dshared = nullptr;
  CK(cudaMalloc(&dslots, sizeof(ExpertSlot) * E));
  CK(cudaMalloc(&dshared, sizeof(ExpertSlot)));
  CK(cudaMemcpy(dslots, slots.data(), sizeof(ExpertSlot) * E, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dshared, &shared, sizeof(ExpertSlot), cudaMemcpyHostToDevice));
  const int batches = 32;  // distinct id sets: 32 * 6 * T experts cycle through the 256
  std::vector<int32_t> ids(size_t(batches * T * k));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 37 + i / 6) % E);
  int32_t* dids = nullptr;
  CK(cudaMalloc(&dids, ids.size() * 4));
  CK(cudaMemcpy(dids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  float* rw = device_floats(size_t(T * k), 0.2f);
  float* act = nullptr;
  CK(cudaMalloc(&act, size_t(T * (k + 1) * I) * 4));
  MoeDecodeArgs a;
  a.slots = dslots, a.route_w = rw, a.k = k, a.routed_format = w13.format, a.shared_format = DevFormat::kFP8Block;
  a.routed_ggml_up = int(w13.ggml), a.routed_ggml_down = int(w2.ggml);
  a.shared_slot = dshared, a.x = x, a.T = T, a.D = D, a.inter = I, a.swiglu_limit = 10.0f, a.act = act, a.out = out;
  // Distinct experts read per launch pair (ids may repeat within a token set for T > 1).
  const double routed_bytes = double(std::min(T * k, E)) * double(2 * weight_bytes(w13, I, D) + weight_bytes(w2, D, I));
  const double shared_bytes = double(3 * weight_bytes(fp8, I, D));
  const double up_bytes = double(std::min(T * k, E)) * double(2 * weight_bytes(w13, I, D)) + 2.0 * weight_bytes(fp8, I, D);
  const std::string fmts = std::string(w13.name) + "+" + w2.name;
  const double us_up = median_us_per_launch(batches, [&](int i) {
    a.ids = dids + size_t(i) * T * k;
    ok(moe_decode_up(a, nullptr));
  });
  const double us_all = median_us_per_launch(batches, [&](int i) {
    a.ids = dids + size_t(i) * T * k;
    ok(moe_decode_up(a, nullptr));
    ok(moe_decode_down(a, nullptr));
  });
  row("moe up (6 routed+shared)", "4096->2x2048 x7", fmts.c_str(), T, up_bytes, us_up);
  row("moe up+down (whole FFN)", "7 experts, fp8 shared", fmts.c_str(), T, routed_bytes + shared_bytes, us_all);
  cudaFree(dslots), cudaFree(dshared), cudaFree(dids), cudaFree(rw), cudaFree(act);
}

// Median microseconds per item of `items` launched by launch(i, stream),
// captured once into a CUDA graph and replayed (no launch gaps, as in the
// decode step's graph).
template <class Launch>
double graph_us_per_item(int items, Launch launch) {
  cudaStream_t cs = nullptr;
  CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < items; ++i) launch(i, cs);
  CK(cudaStreamEndCapture(cs, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  CK(cudaGraphLaunch(exec, cs));  // warm-up
  CK(cudaStreamSynchronize(cs));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<double> us;
  for (int r = 0; r < kReps; ++r) {
    CK(cudaEventRecord(a, cs));
    CK(cudaGraphLaunch(exec, cs));
    CK(cudaEventRecord(b, cs));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    us.push_back(double(ms) * 1e3 / items);
  }
  cudaEventDestroy(a), cudaEventDestroy(b);
  cudaGraphExecDestroy(exec), cudaGraphDestroy(graph), cudaStreamDestroy(cs);
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// The decode MoE's parts as the decode step runs them (Q2_K gate/up, Q3_K down,
// FP8 shared expert; the shared expert's copies rotate too, so every launch
// reads HBM), timed in a CUDA graph: each launch alone over a given number of
// SMs, then the split form (shared up + down on a side stream over S SMs, the
// routed up over the rest, the routed down after both) for several S.
void bench_moe_parts(float* x, float* out) {
  const Fmt q2{"Q2_K", DevFormat::kGgml, GgmlType::kQ2_K}, q3{"Q3_K", DevFormat::kGgml, GgmlType::kQ3_K};
  const Fmt fp8{"FP8", DevFormat::kFP8Block, GgmlType::kF32};
  const int E = 256, k = 6, nsh = 8, batches = 32;
  const int64_t D = 4096, I = 2048;
  Copies g(q2, I, D, E), u(q2, I, D, E), d(q3, D, I, E);
  Copies sg(fp8, I, D, nsh), su(fp8, I, D, nsh), sd(fp8, D, I, nsh);
  std::vector<ExpertSlot> slots(E), shared(nsh);
  for (int e = 0; e < E; ++e) slots[size_t(e)] = {g.w[size_t(e)], u.w[size_t(e)], d.w[size_t(e)]};
  for (int i = 0; i < nsh; ++i) shared[size_t(i)] = {sg.w[size_t(i)], su.w[size_t(i)], sd.w[size_t(i)]};
  ExpertSlot *dslots = nullptr, *dshared = nullptr;
  CK(cudaMalloc(&dslots, sizeof(ExpertSlot) * E));
  CK(cudaMalloc(&dshared, sizeof(ExpertSlot) * nsh));
  CK(cudaMemcpy(dslots, slots.data(), sizeof(ExpertSlot) * E, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dshared, shared.data(), sizeof(ExpertSlot) * nsh, cudaMemcpyHostToDevice));
  std::vector<int32_t> ids(size_t(batches * k));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 37 + i / 6) % E);
  int32_t* dids = nullptr;
  CK(cudaMalloc(&dids, ids.size() * 4));
  CK(cudaMemcpy(dids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  float* rw = device_floats(size_t(k), 0.2f);
  float* act = nullptr;
  CK(cudaMalloc(&act, size_t((k + 1) * I) * 4));
  float* ysh = device_floats(size_t(D), 0.0f);
  ok(moe_decode_prepare());
  MoeDecodeArgs base;
  base.slots = dslots, base.route_w = rw, base.k = k, base.routed_format = DevFormat::kGgml;
  base.shared_format = DevFormat::kFP8Block, base.routed_ggml_up = int(q2.ggml), base.routed_ggml_down = int(q3.ggml);
  base.x = x, base.T = 1, base.D = D, base.inter = I, base.swiglu_limit = 10.0f, base.act = act, base.out = out;
  MoeDecodeArgs routed = base, sh = base;
  routed.add = ysh;
  sh.k = 0, sh.act = act + k * I, sh.out = ysh;
  const double up_r = double(k) * 2.0 * double(weight_bytes(q2, I, D));
  const double down_r = double(k) * double(weight_bytes(q3, D, I));
  const double up_s = 2.0 * double(weight_bytes(fp8, I, D)), down_s = double(weight_bytes(fp8, D, I));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  auto at = [&](MoeDecodeArgs a, int i, int max_sms, bool with_shared) {
    a.ids = dids + size_t(i) * k;
    a.shared_slot = with_shared ? dshared + i % nsh : nullptr;
    a.max_sms = max_sms;
    return a;
  };
  for (int n : {sms / 4, sms / 2, sms * 3 / 4, sms}) {
    const std::string on = "over " + std::to_string(n) + " SMs";
    row("moe shared up alone", on, "FP8", 1, up_s,
        graph_us_per_item(batches, [&](int i, cudaStream_t s) { ok(moe_decode_up(at(sh, i, n, true), s)); }));
    row("moe shared down alone", on, "FP8", 1, down_s,
        graph_us_per_item(batches, [&](int i, cudaStream_t s) { ok(moe_decode_down(at(sh, i, n, true), s)); }));
    row("moe routed up alone", on, "Q2_K", 1, up_r,
        graph_us_per_item(batches, [&](int i, cudaStream_t s) { ok(moe_decode_up(at(routed, i, n, false), s)); }));
    row("moe routed down alone", on, "Q3_K", 1, down_r,
        graph_us_per_item(batches, [&](int i, cudaStream_t s) { ok(moe_decode_down(at(routed, i, n, false), s)); }));
  }
  row("moe up, mixed", "routed + shared, all SMs", "Q2_K+FP8", 1, up_r + up_s,
      graph_us_per_item(batches, [&](int i, cudaStream_t s) { ok(moe_decode_up(at(base, i, 0, true), s)); }));
  // The split form, as gpu_moe runs it at decode.
  cudaStream_t ss = nullptr;
  CK(cudaStreamCreateWithFlags(&ss, cudaStreamNonBlocking));
  cudaEvent_t fork, join;
  CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  // Item i of the split form over n shared-expert SMs; args(a, i, max_sms, with_shared) gives
  // a launch's arguments.
  auto split_form = [&](int i, cudaStream_t s, int n, const auto& args) {
    CK(cudaEventRecord(fork, s));
    CK(cudaStreamWaitEvent(ss, fork, 0));
    ok(moe_decode_up(args(sh, i, n, true), ss));
    ok(moe_decode_down(args(sh, i, n, true), ss));
    ok(moe_decode_up(args(routed, i, sms - n, false), s));
    CK(cudaEventRecord(join, ss));
    CK(cudaStreamWaitEvent(s, join, 0));
    ok(moe_decode_down(args(routed, i, 0, false), s));
  };
  for (int n : {sms / 4, sms / 3, sms / 2, sms * 2 / 3}) {
    row("moe split, shared on " + std::to_string(n), "routed up on the rest", "Q2+Q3+FP8", 1,
        up_r + down_r + up_s + down_s,
        graph_us_per_item(batches, [&](int i, cudaStream_t s) { split_form(i, s, n, at); }));
  }
  // The router (BF16 gate, random so that each item picks its own experts from its own x),
  // then the split form; and the fused launch doing all of it.
  const int64_t E64 = E;
  std::vector<uint16_t> gate_host(size_t(E64 * D));
  std::vector<float> xs_host(size_t(batches * D)), bias_host(static_cast<size_t>(E));
  uint64_t st = 0x9e3779b97f4a7c15ull;
  auto uni = [&] {  // xorshift, uniform in [-1, 1)
    st ^= st << 13, st ^= st >> 7, st ^= st << 17;
    return float(int64_t(st >> 40) - (int64_t(1) << 23)) / float(int64_t(1) << 23);
  };
  for (uint16_t& v : gate_host) {
    const float f = 0.02f * uni();
    uint32_t b;
    std::memcpy(&b, &f, 4);
    v = uint16_t(b >> 16);
  }
  for (float& v : xs_host) v = uni();
  for (float& v : bias_host) v = 0.001f * uni();
  uint8_t* dgate = nullptr;
  float *dxs = nullptr, *dbias = nullptr, *logits = nullptr, *rwf = nullptr;
  int32_t* idsf = nullptr;
  unsigned *ticket = nullptr, *sync = nullptr;
  CK(cudaMalloc(&dgate, gate_host.size() * 2));
  CK(cudaMemcpy(dgate, gate_host.data(), gate_host.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMalloc(&dxs, xs_host.size() * 4));
  CK(cudaMemcpy(dxs, xs_host.data(), xs_host.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMalloc(&dbias, bias_host.size() * 4));
  CK(cudaMemcpy(dbias, bias_host.data(), bias_host.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMalloc(&logits, size_t(E) * 4));
  CK(cudaMalloc(&rwf, size_t(k) * 4));
  CK(cudaMalloc(&idsf, size_t(k) * 4));
  CK(cudaMalloc(&ticket, 4));
  CK(cudaMalloc(&sync, 16));
  CK(cudaMemset(ticket, 0, 4));
  CK(cudaMemset(sync, 0, 16));
  DeviceLinear gate;
  gate.weight = dgate, gate.format = DevFormat::kBF16, gate.out = E, gate.in = D;
  RouterArgs r;
  r.logits = logits, r.bias = dbias, r.T = 1, r.E = E, r.k = k, r.func = ScoreFunc::kSqrtSoftplus, r.scaling = 1.5f;
  r.ids = idsf, r.weights = rwf;
  auto routed_on = [&](MoeDecodeArgs a, int i, int max_sms, bool with_shared) {
    a = at(a, i, max_sms, with_shared);
    a.ids = idsf, a.route_w = rwf, a.x = dxs + size_t(i) * D;
    return a;
  };
  for (int n : {sms / 3, sms / 2}) {
    auto one = [&](int i, cudaStream_t s) {
      ok(router_gate_topk(r, gate, dxs + size_t(i) * D, ticket, s));
      split_form(i, s, n, routed_on);
    };
    row("router + split, shared " + std::to_string(n), "the decode step's MoE now", "Q2+Q3+FP8", 1,
        up_r + down_r + up_s + down_s, graph_us_per_item(batches, one));
  }
  MoeDecodeArgs fused = base;
  fused.act = act;
  if (!moe_fused_supported(routed_on(fused, 0, 0, true), r, gate)) {
    std::printf("(the fused launch does not take this layout)\n");
  } else {
    auto one = [&](int i, cudaStream_t s) {
      ok(moe_fused(routed_on(fused, i, 0, true), r, gate, HcCombJob{}, sync, s));
    };
    row("moe fused (one launch)", "router + shared + routed", "Q2+Q3+FP8", 1, up_r + down_r + up_s + down_s,
        graph_us_per_item(batches, one));
    // Phase times of one launch per block (globaltimer): medians over blocks.
    constexpr int kStamps = 15;
    unsigned long long* stamps = nullptr;
    CK(cudaMalloc(&stamps, size_t(sms) * kStamps * 8));
    moe_fused_set_stamps(stamps);
    std::vector<std::vector<double>> ph(kStamps - 1);
    for (int rep = 0; rep < 9; ++rep) {
      ok(moe_fused(routed_on(fused, rep, 0, true), r, gate, HcCombJob{}, sync, nullptr));
      CK(cudaDeviceSynchronize());
      std::vector<unsigned long long> h(size_t(sms) * kStamps);
      CK(cudaMemcpy(h.data(), stamps, h.size() * 8, cudaMemcpyDeviceToHost));
      unsigned long long t0 = h[0];
      for (int b = 0; b < sms; ++b) t0 = std::min(t0, h[size_t(b) * kStamps]);
      for (int b = 0; b < sms; ++b)
        for (int i = 1; i < kStamps; ++i) {
          // blocks without down work (or without a phase) leave its stamp at 0
          const unsigned long long e = h[size_t(b) * kStamps + i];
          if (e != 0) ph[size_t(i - 1)].push_back(double(e - t0) / 1e3);
        }
      CK(cudaMemset(stamps, 0, size_t(sms) * kStamps * 8));
    }
    moe_fused_set_stamps(nullptr);
    cudaFree(stamps);
    const char* names[kStamps - 1] = {"gate + arrive", "staged",       "shared done", "picks",      "routed issued",
                                      "routed loop",   "up done",      "down setup",  "down issued", "acts complete",
                                      "down staged",   "routed down",  "shared down", "end"};
    std::printf("\nfused launch, per block: when each phase ends (us from the first block's start; "
                "median / max over blocks and 9 launches)\n");
    for (int i = 0; i < kStamps - 1; ++i) {
      std::vector<double>& v = ph[size_t(i)];
      std::sort(v.begin(), v.end());
      if (!v.empty()) std::printf("  %-14s %7.2f %7.2f\n", names[i], v[v.size() / 2], v.back());
    }
  }
  cudaFree(dgate), cudaFree(dxs), cudaFree(dbias), cudaFree(logits), cudaFree(rwf), cudaFree(idsf);
  cudaFree(ticket), cudaFree(sync);
  cudaStreamDestroy(ss), cudaEventDestroy(fork), cudaEventDestroy(join);
  cudaFree(dslots), cudaFree(dshared), cudaFree(dids), cudaFree(rw), cudaFree(act), cudaFree(ysh);
}

// The hand-over probe: S dependent steps as launches and as one persistent
// launch, microseconds per step, and the last step's outputs compared (the
// same sums in the same order: equal bits).
void bench_handoff() {
  constexpr int S = 64;
  constexpr int64_t W = kHandoffWidth;
  std::vector<float> h0(static_cast<size_t>(W));
  for (int64_t i = 0; i < W; ++i) h0[size_t(i)] = float((i * 37) % 101) / 101.0f;
  float* bufs[3] = {};
  for (float*& b : bufs) b = device_floats(size_t(S + 1) * W, 0.0f);
  for (float* b : bufs) CK(cudaMemcpy(b, h0.data(), size_t(W) * 4, cudaMemcpyHostToDevice));
  unsigned long long* tagged = nullptr;
  unsigned* counters = nullptr;
  CK(cudaMalloc(&tagged, size_t(S) * W * 8));
  CK(cudaMalloc(&counters, size_t(S) * 4));
  auto launches = [&](bool pdl) {
    return graph_us_per_item(S, [&](int i, cudaStream_t s) { ok(handoff_step(bufs[0] + i * W, bufs[0] + (i + 1) * W, pdl, s)); });
  };
  HandoffChainArgs t;
  t.steps = S, t.x0 = bufs[1], t.ys = bufs[1] + W, t.tagged = tagged;
  HandoffChainArgs c = t;
  c.x0 = bufs[2], c.ys = bufs[2] + W, c.tagged = nullptr, c.counters = counters;
  const double us_plain = launches(false), us_pdl = launches(true);
  const double us_tagged = graph_us_per_item(1, [&](int, cudaStream_t s) { ok(handoff_chain(t, s)); }) / S;
  const double us_counter = graph_us_per_item(1, [&](int, cudaStream_t s) { ok(handoff_chain(c, s)); }) / S;
  CK(cudaDeviceSynchronize());
  std::vector<float> last[3];
  for (int k = 0; k < 3; ++k) {
    last[k].resize(size_t(W));
    CK(cudaMemcpy(last[k].data(), bufs[k] + S * W, size_t(W) * 4, cudaMemcpyDeviceToHost));
  }
  const bool same = std::memcmp(last[0].data(), last[1].data(), size_t(W) * 4) == 0 &&
                    std::memcmp(last[0].data(), last[2].data(), size_t(W) * 4) == 0;
  std::printf("\n%d dependent steps of %d blocks (each reads all %lld values of the step before, writes its %d), "
              "us per step, median of %d graph replays:\n",
              S, kHandoffBlocks, static_cast<long long>(W), int(W / kHandoffBlocks), kReps);
  std::printf("| form | us per step |\n|---|---|\n");
  std::printf("| a launch per step | %.2f |\n| a launch per step, programmatic dependent | %.2f |\n", us_plain, us_pdl);
  std::printf("| one persistent launch, tagged 64-bit words | %.2f |\n", us_tagged);
  std::printf("| one persistent launch, a grid counter per step | %.2f |\n", us_counter);
  std::printf("outputs of the four forms after %d steps: %s\n", S, same ? "equal bits" : "DIFFER");
  for (float* b : bufs) cudaFree(b);
  cudaFree(tagged), cudaFree(counters);
  if (!same) std::exit(1);
}

// A chain of S dependent steps y_i = W_i rmsnorm(y_{i-1}) (FP8 [4096, 4096],
// S copies: ~16.8 MB each, together ~10x the L2), timed per step from CUDA
// graph replays: as S gemv_mma_normed launches (programmatic dependents, as
// in the decode step), as one gemv_chain launch, the same without its waits
// (the streaming alone), and a plain read of each step's bytes.
void bench_chain() {
  const Fmt fp8{"FP8", DevFormat::kFP8Block, GgmlType::kF32};
  constexpr int S = 32;
  const int64_t N = kChainWidth;
  if (!gemv_chain_supported()) {
    std::fprintf(stderr, "aff-bench-gemv: gemv_chain does not fit one block per SM here\n");
    std::exit(1);
  }
  Copies c(fp8, N, N, S);
  for (const DeviceLinear& w : c.w) CK(cudaMemset(const_cast<uint8_t*>(w.scale), 127, size_t((N / 128) * (N / 128))));
  DeviceLinear* dw = nullptr;
  CK(cudaMalloc(&dw, sizeof(DeviceLinear) * S));
  CK(cudaMemcpy(dw, c.w.data(), sizeof(DeviceLinear) * S, cudaMemcpyHostToDevice));
  std::vector<float> xh(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) xh[size_t(i)] = float((i * 7919) % 101) / 50.0f - 1.0f;
  float* x0 = device_floats(size_t(N), 0.0f);
  CK(cudaMemcpy(x0, xh.data(), size_t(N) * 4, cudaMemcpyHostToDevice));
  float* norm = device_floats(size_t(N), 1.0f);
  float* ys_l = device_floats(size_t(S * N), 0.0f);
  float* ys_c = device_floats(size_t(S * N), 0.0f);
  unsigned long long* ll = nullptr;
  CK(cudaMalloc(&ll, sizeof(unsigned long long) * S * N));
  uint32_t* sink = nullptr;
  CK(cudaMalloc(&sink, 4));
  const double bytes = double(c.bytes_each);
  auto launches = [&](int i, cudaStream_t s) {
    ok(gemv_mma_normed(c.w[size_t(i)], i == 0 ? x0 : ys_l + (i - 1) * N, 1, ys_l + i * N, norm, 1e-6f, s));
  };
  ChainArgs a;
  a.w = dw, a.steps = S, a.x0 = x0, a.ys = ys_c, a.ll = ll, a.eps = 1e-6f;
  ChainArgs free_run = a, stream_only = a;
  free_run.timing_mode = 1, stream_only.timing_mode = 2;
  const double us_probe = graph_us_per_item(S, [&](int i, cudaStream_t s) {
    ok(hbm_read_probe(c.w[size_t(i)].weight, int64_t(N * N), sink, s));
  });
  const double us_launch = graph_us_per_item(S, launches);
  const double us_chain = graph_us_per_item(1, [&](int, cudaStream_t s) { ok(gemv_chain(a, s)); }) / S;
  const double us_free = graph_us_per_item(1, [&](int, cudaStream_t s) { ok(gemv_chain(free_run, s)); }) / S;
  const double us_stream = graph_us_per_item(1, [&](int, cudaStream_t s) { ok(gemv_chain(stream_only, s)); }) / S;
  // The dependent chain once more, then both outputs compared (the same function).
  ok(gemv_chain(a, nullptr));
  CK(cudaDeviceSynchronize());
  std::vector<float> yl(size_t(S * N)), yc(size_t(S * N));
  CK(cudaMemcpy(yl.data(), ys_l, yl.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(yc.data(), ys_c, yc.size() * 4, cudaMemcpyDeviceToHost));
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < yl.size(); ++i) num += double(yl[i] - yc[i]) * (yl[i] - yc[i]), den += double(yl[i]) * yl[i];
  const std::string shape = "4096->4096 x" + std::to_string(S);
  row("read probe (per step)", shape, fp8.name, 1, bytes, us_probe);
  row("gemv_mma_normed launches", shape, fp8.name, 1, bytes, us_launch);
  row("gemv_chain (persistent)", shape, fp8.name, 1, bytes, us_chain);
  row("gemv_chain, no waits", shape, fp8.name, 1, bytes, us_free);
  row("gemv_chain, streaming only", shape, fp8.name, 1, bytes, us_stream);
  for (const auto& [prec, name] : {std::pair{ChainPrecision::kExact, "exact"}, std::pair{ChainPrecision::kF16, "f16"},
                                   std::pair{ChainPrecision::kE4M3, "e4m3"}}) {
    for (bool gate : {false, true}) {
      if (prec == ChainPrecision::kExact && !gate) continue;  // the rows above
      ChainArgs r = a, rf = free_run;
      r.precision = rf.precision = prec;
      r.gate_copies = rf.gate_copies = gate;
      const std::string tag = std::string(", ") + name + (gate ? ", gated copies" : "");
      row("gemv_chain" + tag, shape, fp8.name, 1, bytes,
          graph_us_per_item(1, [&](int, cudaStream_t s) { ok(gemv_chain(r, s)); }) / S);
      row("gemv_chain, no waits" + tag, shape, fp8.name, 1, bytes,
          graph_us_per_item(1, [&](int, cudaStream_t s) { ok(gemv_chain(rf, s)); }) / S);
    }
  }
  for (int ring : {4, 5, 6, 8, 10}) {  // fewer ring slots in flight per SM
    ChainArgs r = a, rf = free_run, rs = stream_only;
    r.ring_stages = rf.ring_stages = rs.ring_stages = ring;
    const std::string tag = ", ring " + std::to_string(ring);
    row("gemv_chain" + tag, shape, fp8.name, 1, bytes,
        graph_us_per_item(1, [&](int, cudaStream_t s) { ok(gemv_chain(r, s)); }) / S);
    row("gemv_chain, no waits" + tag, shape, fp8.name, 1, bytes,
        graph_us_per_item(1, [&](int, cudaStream_t s) { ok(gemv_chain(rf, s)); }) / S);
    row("gemv_chain, streaming" + tag, shape, fp8.name, 1, bytes,
        graph_us_per_item(1, [&](int, cudaStream_t s) { ok(gemv_chain(rs, s)); }) / S);
  }
  // Where a step goes: block 0's stamps (gemv_chain.h), median phase lengths
  // over the steps after the first, in the dependent chain and without waits.
  unsigned long long* st = nullptr;
  CK(cudaMalloc(&st, sizeof(unsigned long long) * (S * 8 + 2)));
  const char* phase[7] = {"load x (waits included)", "stage x",          "tile 0 stages in",
                          "tile 0 dots (warp 0)",    "tile 0 barrier",   "tile 0 reduce, write",
                          "tile 1 (all of it)"};
  ChainArgs a_f16 = a, a_e4m3 = a, a_gate = a;
  a_f16.precision = ChainPrecision::kF16, a_e4m3.precision = ChainPrecision::kE4M3, a_gate.gate_copies = true;
  for (const ChainArgs* base : {&a, &free_run, &a_f16, &a_e4m3, &a_gate}) {
    ChainArgs t = *base;
    t.stamps = st;
    ok(gemv_chain(t, nullptr));
    ok(gemv_chain(t, nullptr));  // the second run's stamps (warm)
    CK(cudaDeviceSynchronize());
    std::vector<unsigned long long> h(size_t(S) * 8 + 2);
    CK(cudaMemcpy(h.data(), st, h.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
    std::printf("\nblock 0's step phases, %s (median us over steps 1..%d):\n",
                base == &a        ? "dependent chain"
                : base == &a_f16  ? "dependent chain, f16"
                : base == &a_e4m3 ? "dependent chain, e4m3"
                : base == &a_gate ? "dependent chain, gated copies"
                                  : "no waits",
                S - 1);
    for (int p = 0; p < 8; ++p) {
      std::vector<double> d;
      for (int i = 1; i < S; ++i) {
        const unsigned long long* r = h.data() + size_t(i) * 8;
        d.push_back(p < 7 ? double(r[p + 1] - r[p]) * 1e-3 : double(r[0] - r[-8]) * 1e-3);
      }
      std::sort(d.begin(), d.end());
      std::printf("  %-26s %6.2f\n", p < 7 ? phase[p] : "step start to step start", d[d.size() / 2]);
    }
    std::printf("  SM clock over the run: %.0f MHz\n",
                double(h[size_t(S) * 8 + 1] - h[size_t(S) * 8]) / double(h[size_t(S - 1) * 8 + 7] - h[0]) * 1e3);
  }
  cudaFree(st);
  std::printf("\nper step: launches %.2f us, chain %.2f us, chain without waits %.2f us, streaming only %.2f us,"
              " bytes at %.2f TB/s %.2f us; outputs rel rms %.2e\n",
              us_launch, us_chain, us_free, us_stream, kHbmBytesPerS / 1e12, bytes / kHbmBytesPerS * 1e6,
              std::sqrt(num / std::max(den, 1e-300)));
  cudaFree(dw), cudaFree(x0), cudaFree(norm), cudaFree(ys_l), cudaFree(ys_c), cudaFree(ll), cudaFree(sink);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const bool floors = argc > 1 && std::strcmp(argv[1], "--floors") == 0;
  const bool moe_parts = argc > 1 && std::strcmp(argv[1], "--moe-parts") == 0;
  const bool chain = argc > 1 && std::strcmp(argv[1], "--chain") == 0;
  const bool handoff = argc > 1 && std::strcmp(argv[1], "--handoff") == 0;
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs; median of %d batches; ceiling %.2f TB/s\n\n", prop.name, prop.multiProcessorCount,
              kReps, kHbmBytesPerS / 1e12);
  std::printf("| kernel | shape (in->out) | weights | T | MB | us/launch | GB/s | of HBM |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  float* x = device_floats(size_t(8) * 32768, 0.5f);
  float* y = device_floats(size_t(8) * 65536, 0.0f);
  const Fmt fp8{"FP8", DevFormat::kFP8Block, GgmlType::kF32};
  const Fmt bf16{"BF16", DevFormat::kBF16, GgmlType::kF32};
  const Fmt mxfp4{"MXFP4", DevFormat::kMXFP4, GgmlType::kF32};
  if (moe_parts) {
    bench_moe_parts(x, y);
    return 0;
  }
  if (chain) {
    bench_chain();
    return 0;
  }
  if (handoff) {
    bench_handoff();
    return 0;
  }
  if (floors) {  // the decode step's FP8 and split Q8_0 projections against the plain read of their bytes
    uint32_t* sink = nullptr;
    CK(cudaMalloc(&sink, 4));
    bench_floor(fp8, 32768, 1024, "wq_b", x, y, sink);
    bench_floor(fp8, 8192, 4096, "wo_a (8 groups)", x, y, sink, 1024, 4096);
    bench_floor(fp8, 4096, 8192, "wo_b", x, y, sink);
    bench_floor(fp8, 2048, 4096, "shared w1", x, y, sink);
    bench_floor(fp8, 1024, 4096, "wq_a", x, y, sink);
    bench_floor(fp8, 32768, 4096, "134 MB", x, y, sink);
    bench_floor(bf16, 129280, 4096, "head", x, y, sink);
    bench_floor(bf16, 129280, 4096, "head (mma)", x, y, sink, 129280, 0);
    // The same projections as aff-quantize's containers store them (Q8_0, split on upload).
    const Fmt q8{"Q8_0 split", DevFormat::kQ8, GgmlType::kQ8_0};
    bench_floor(q8, 32768, 1024, "wq_b", x, y, sink);
    bench_floor(q8, 8192, 4096, "wo_a (8 groups)", x, y, sink, 1024, 4096);
    bench_floor(q8, 4096, 8192, "wo_b", x, y, sink);
    bench_floor(q8, 129280, 4096, "head", x, y, sink);
    cudaFree(sink);
    return 0;
  }
  // Dense attention/shared-expert shapes (FP8 block-scaled).
  bench_gemv(fp8, 32768, 4096, 1, "large", x, y);
  bench_gemv(fp8, 4096, 32768, 1, "large", x, y);
  bench_gemv(fp8, 32768, 1024, 1, "wq_b", x, y);
  bench_gemv(fp8, 4096, 8192, 1, "wo_b", x, y);
  bench_gemv(fp8, 1024, 4096, 1, "wq_a", x, y);
  bench_gemv(fp8, 512, 4096, 1, "wkv", x, y);
  bench_gemv(fp8, 2048, 4096, 1, "shared w1", x, y);
  bench_gemv(fp8, 4096, 2048, 1, "shared w2", x, y);
  // The same with x staged permuted in shared memory (warp-contiguous reads).
  gemv_set_native_perm(true);
  bench_gemv(fp8, 32768, 4096, 1, "large, perm x", x, y);
  bench_gemv(fp8, 4096, 8192, 1, "wo_b, perm x", x, y);
  bench_gemv(fp8, 512, 4096, 1, "wkv, perm x", x, y);
  bench_gemv(bf16, 4096, 4096, 1, "bf16, perm x", x, y);
  bench_gemv(mxfp4, 14336, 4096, 1, "7 experts, perm x", x, y);
  gemv_set_native_perm(false);
  if (!quick) {
    for (int T : {2, 4, 8}) bench_gemv(fp8, 32768, 4096, T, "large", x, y);
    bench_gemv(bf16, 4096, 4096, 1, "bf16", x, y);
    bench_gemv(mxfp4, 14336, 4096, 1, "7 experts", x, y);
    bench_gemv(mxfp4, 4096, 2048, 1, "expert w2", x, y);
  }
  // Expert formats: 7 experts' gate rows stacked (4096 -> 7*2048) and one down.
  const Fmt ggml_types[] = {{"Q2_K", DevFormat::kGgml, GgmlType::kQ2_K},     {"Q3_K", DevFormat::kGgml, GgmlType::kQ3_K},
                            {"IQ2_XXS", DevFormat::kGgml, GgmlType::kIQ2_XXS}, {"Q4_K", DevFormat::kGgml, GgmlType::kQ4_K},
                            {"IQ4_XS", DevFormat::kGgml, GgmlType::kIQ4_XS},   {"Q8_0", DevFormat::kGgml, GgmlType::kQ8_0},
                            {"MXFP4g", DevFormat::kGgml, GgmlType::kMXFP4},    {"Q6_K", DevFormat::kGgml, GgmlType::kQ6_K}};
  for (const Fmt& f : ggml_types) {
    bench_gemv(f, 14336, 4096, 1, "7 experts", x, y);
    if (!quick) bench_gemv(f, 4096, 2048, 1, "expert w2", x, y);
  }
  // The same rows read directly instead of through the shared-memory ring.
  gemv_set_ggml_ring(false);
  moe_decode_set_ggml_ring(false);
  for (const Fmt& f : ggml_types) bench_gemv(f, 14336, 4096, 1, "7 experts, no ring", x, y);
  bench_moe(ggml_types[2], ggml_types[0], 1, x, y);
  gemv_set_ggml_ring(true);
  moe_decode_set_ggml_ring(true);
  if (!quick) bench_gemv(ggml_types[0], 14336, 4096, 8, "7 experts", x, y);
  // The decode MoE at full geometry.
  bench_moe(ggml_types[2], ggml_types[0], 1, x, y);   // IQ2_XXS gate/up + Q2_K down
  bench_moe(ggml_types[0], ggml_types[1], 1, x, y);   // Q2_K gate/up + Q3_K down
  if (!quick) {
    bench_moe(fp8, fp8, 1, x, y);
    bench_moe(mxfp4, mxfp4, 1, x, y);
    bench_moe(ggml_types[2], ggml_types[0], 4, x, y);
  }
  // One expert (Q2_K, 3 x 2048x4096) in mapped pinned host memory, as one GEMV.
  {
    Copies h(ggml_types[0], 3 * 2048, 4096, 2, /*on_host=*/true);
    const double us = median_us_per_launch(2, [&](int i) { ok(gemv_f32(h.w[size_t(i)], x, 1, y, nullptr)); });
    row("gemv host-mapped", "4096->6144 (1 expert)", "Q2_K", 1, double(h.bytes_each), us);
    Copies hf(fp8, 3 * 2048, 4096, 2, /*on_host=*/true);
    const double us2 = median_us_per_launch(2, [&](int i) { ok(gemv_f32(hf.w[size_t(i)], x, 1, y, nullptr)); });
    row("gemv host-mapped", "4096->6144 (1 expert)", "FP8", 1, double(hf.bytes_each), us2);
  }
  std::printf("\n(host-mapped rows: %% of HBM; PCIe Gen5 x16 is ~64 GB/s per direction)\n");
  return 0;
}
#else
int main() {
  std::fprintf(stderr, "aff-bench-gemv: built without CUDA\n");
  return 1;
}
#endif
