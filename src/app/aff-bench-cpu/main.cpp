// aff-bench-cpu: expert-shaped quantised GEMV on the CPU lane, reported as weight bytes
// consumed per second and as a fraction of a plain streaming read measured in the same
// run (one core and all cores). The data set is many experts, sized to exceed the caches,
// so every byte comes from DRAM as it will for non-resident experts.
//   aff-bench-cpu [--types Q4_K,Q2_K,...] [--rows 2048] [--cols 4096] [--mib 1024]
//                 [--threads N] [--disable avx512|vnni|vbmi|avx2] [--reps 3] [--batch 4]
//                 [--single 0|1]   (0: skip the one-thread columns)
//                 [--amx-batches 4,8,16,32]
// Every ISA the CPU runs is timed; '*' marks the selector's pick, and the last line per
// type says whether that pick was the fastest with its weights in L2 ("L2 Gw/s", one
// thread: compute speed, which DRAM-bound runs hide). "gemm xN" streams the same
// experts for N tokens at once (prefill, experts hit by several tokens): its GB/s are
// weight bytes per second, its Gw/s count every token's multiply-adds; the ISA in
// brackets is the path gemm() took. Where the kernel has an AMX form and the CPU has AMX,
// "gemm xN (avx512)" and "gemm xN (amx)" force either path for each N of --amx-batches,
// which is how the AMX threshold (amx_min_tokens) is chosen. "rows split per
// expert" is the engine's former decode path (cpu::linear_fast_rows, one projection at
// a time split over all threads); "moe layer, one region" is the current one
// (cpu::moe_lane_experts: a layer's 7 experts, one token each, in one parallel region).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backend/cpu/act_quant.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/gemv.h"
#include "backend/cpu/linear_fast.h"
#include "backend/cpu/moe_lane.h"
#include "core/dtype.h"
#include "quant/blocks.h"
#include "quant/type_traits.h"

namespace {

using aff::quant::GgmlType;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

// Random bytes (xorshift, fast enough for GiBs) with every scale field made sane.
void fill_weights(GgmlType type, uint8_t* w, size_t bytes, uint64_t seed) {
  uint64_t s = seed | 1;
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < bytes / 8; ++i) {
    uint64_t x = s ^ (i * 0x9E3779B97F4A7C15ull);
    x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33;
    std::memcpy(w + 8 * i, &x, 8);
  }
  const auto& tr = aff::quant::ggml_traits(type);
  const size_t nb = bytes / size_t(tr.block_bytes);
  const uint16_t d = aff::f32_to_f16(0.01f);
  for (size_t b = 0; b < nb; ++b) {
    uint8_t* p = w + b * size_t(tr.block_bytes);
    switch (type) {
      case GgmlType::kQ8_0: std::memcpy(p, &d, 2); break;
      case GgmlType::kQ4_K: std::memcpy(p, &d, 2), std::memcpy(p + 2, &d, 2); break;
      case GgmlType::kQ2_K: std::memcpy(p + 80, &d, 2), std::memcpy(p + 82, &d, 2); break;
      case GgmlType::kIQ2_XXS: std::memcpy(p, &d, 2); break;
      case GgmlType::kQ3_K: std::memcpy(p + 108, &d, 2); break;
      case GgmlType::kIQ4_XS: std::memcpy(p, &d, 2); break;
      case GgmlType::kMXFP4: p[0] = 120; break;
      case GgmlType::kIQ2_XS: std::memcpy(p, &d, 2); break;
      case GgmlType::kIQ3_XXS: std::memcpy(p, &d, 2); break;
      case GgmlType::kIQ1_S: std::memcpy(p, &d, 2); break;
      case GgmlType::kIQ1_M:  // the f16 super-scale: top nibbles of the four scale words
        for (int k = 0; k < 4; ++k) p[48 + 2 * k + 1] = uint8_t((p[48 + 2 * k + 1] & 0x0f) | (((d >> (4 * k)) & 0xf) << 4));
        break;
      default: break;
    }
  }
}

// Streaming read of `bytes` with `threads` threads; returns GB/s (best of reps).
double stream_read_gbs(const uint8_t* buf, size_t bytes, int threads, int reps) {
  double best = 0;
  volatile uint64_t sink = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    uint64_t total = 0;
    const auto* p = reinterpret_cast<const uint64_t*>(buf);
    const size_t n = bytes / 8;
#pragma omp parallel for num_threads(threads) reduction(^ : total) schedule(static)
    for (size_t i = 0; i < n; i += 4) total ^= p[i] + p[i + 1] + p[i + 2] + p[i + 3];
    const double s = seconds_since(t0);
    sink = sink + total;
    best = std::max(best, double(bytes) / s / 1e9);
  }
  return best;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t c = s.find(',', pos);
    out.push_back(s.substr(pos, c == std::string::npos ? std::string::npos : c - pos));
    if (c == std::string::npos) break;
    pos = c + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string types = "Q8_0,Q4_K,Q3_K,Q2_K,IQ4_XS,IQ2_XXS,MXFP4,IQ2_XS,IQ3_XXS,IQ1_S,IQ1_M";
  int64_t rows = 2048, cols = 4096, mib = 1024;
  int threads = omp_get_max_threads(), reps = 3;
  int64_t batch = 4;
  bool single = true;  // also time one thread (the "1T" columns)
  std::string amx_batches = "4,8,16,32";
  std::string disable;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has = i + 1 < argc;
    if (a == "--types" && has) types = argv[++i];
    else if (a == "--rows" && has) rows = std::atoll(argv[++i]);
    else if (a == "--cols" && has) cols = std::atoll(argv[++i]);
    else if (a == "--mib" && has) mib = std::atoll(argv[++i]);
    else if (a == "--threads" && has) threads = std::atoi(argv[++i]);
    else if (a == "--reps" && has) reps = std::atoi(argv[++i]);
    else if (a == "--batch" && has) batch = std::atoll(argv[++i]);
    else if (a == "--disable" && has) disable = argv[++i];
    else if (a == "--single" && has) single = std::atoi(argv[++i]) != 0;
    else if (a == "--amx-batches" && has) amx_batches = argv[++i];
    else {
      std::fprintf(stderr,
                   "usage: aff-bench-cpu [--types Q4_K,...] [--rows N] [--cols N] [--mib N] [--threads N] "
                   "[--reps N] [--batch N] [--disable avx512|vnni|vbmi|amx|avx2] [--single 0|1] "
                   "[--amx-batches N,N,...]\n");
      return 2;
    }
  }
  if (rows <= 0 || cols <= 0 || cols % 256 != 0 || mib <= 0 || threads <= 0 || reps <= 0 || batch <= 0) {
    std::fprintf(stderr, "aff-bench-cpu: rows, mib, threads, reps, batch must be > 0 and cols a multiple of 256\n");
    return 2;
  }
  const aff::cpu::CpuFeatures feats = aff::cpu::cpu_features_without(aff::cpu::cpu_features(), disable);
  std::vector<int64_t> amx_ns;
  if (feats.amx_int8 && feats.avx512_vbmi) {
    for (const auto& b : split(amx_batches)) {
      if (!b.empty() && std::atoll(b.c_str()) > 0) amx_ns.push_back(std::atoll(b.c_str()));
    }
  }
  const int64_t max_batch = std::max(batch, amx_ns.empty() ? int64_t(1) : *std::max_element(amx_ns.begin(), amx_ns.end()));
  std::printf("aff-bench-cpu  %s  [%s]  threads=%d  expert %lldx%lld, ~%lld MiB of weights per type\n",
              cpu_model().c_str(), aff::cpu::cpu_features_string(feats).c_str(), threads, (long long)rows,
              (long long)cols, (long long)mib);

  const size_t stream_bytes = size_t(mib) << 20;
  std::vector<uint8_t> stream(stream_bytes);
  fill_weights(GgmlType::kF32, stream.data(), stream.size(), 7);
  const double bw1 = stream_read_gbs(stream.data(), stream.size(), 1, reps);
  const double bwn = stream_read_gbs(stream.data(), stream.size(), threads, reps);
  std::printf("stream read: 1 thread %.1f GB/s, %d threads %.1f GB/s\n\n", bw1, threads, bwn);
  stream = {};

  std::printf("%-26s %6s %8s %9s %7s %9s %7s %8s %8s\n", "kernel", "bpw", "experts", "1T GB/s", "of BW", "NT GB/s",
              "of BW", "NT Gw/s", "L2 Gw/s");
  for (const auto& tn : split(types)) {
    const auto type = aff::quant::ggml_type_from_name(tn);
    if (!type || !aff::cpu::gemv_has_kernels(*type)) {
      std::fprintf(stderr, "aff-bench-cpu: no CPU-lane kernels for type '%s'\n", tn.c_str());
      return 2;
    }
    const aff::cpu::GemvKernel* selected = aff::cpu::select_gemv_kernel(*type, feats);
    const aff::cpu::ActFormat af = selected->act;
    const int64_t row_bytes = *aff::quant::ggml_row_bytes(*type, cols);
    const int64_t expert_bytes = rows * row_bytes;
    // A multiple of the thread count, so the last round of whole experts keeps every
    // thread busy (120 experts over 16 threads left the last round half idle).
    const int64_t n_exp_min = std::max<int64_t>(2 * threads, (int64_t(mib) << 20) / expert_bytes);
    const int64_t n_exp = (n_exp_min + threads - 1) / threads * threads;
    std::vector<uint8_t> w(size_t(n_exp * expert_bytes));
    fill_weights(*type, w.data(), w.size(), 11);
    // `max_batch` activations; a GEMV uses the first.
    const int64_t act_stride = aff::cpu::act_bytes(af, cols);
    std::vector<uint8_t> act(size_t(max_batch * act_stride));
    std::mt19937 rng(3);
    std::normal_distribution<float> nd;
    std::vector<float> x(static_cast<size_t>(cols));
    for (int64_t t = 0; t < max_batch; ++t) {
      for (auto& v : x) v = nd(rng);
      aff::cpu::quantize_act(af, x, act.data() + t * act_stride);
    }
    std::vector<float> y(size_t(n_exp * rows * max_batch));

    // Best-of-reps seconds for one pass over every expert with nt threads; n tokens per
    // expert (1 = GEMV, else the batched gemm).
    auto run = [&](const aff::cpu::GemvKernel& k, int nt, int64_t n) {
      double best = 1e30;
      for (int r = 0; r < reps; ++r) {
        const auto t0 = Clock::now();
        // Experts are independent; threads take whole experts so each streams
        // contiguous memory.
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
        for (int64_t e = 0; e < n_exp; ++e) {
          float* ye = y.data() + e * rows * n;
          if (n == 1) {
            k.fn(w.data() + e * expert_bytes, row_bytes, rows, cols, act.data(), ye);
          } else {
            aff::cpu::gemm(k, w.data() + e * expert_bytes, row_bytes, rows, cols, act.data(), act_stride, n, ye, rows);
          }
        }
        best = std::min(best, seconds_since(t0));
      }
      return best;
    };
    // Compute speed with the weights in L2 (a 192 KiB slice of the first expert, passed
    // over repeatedly): what a kernel does when memory is not the limit. The ISA choice
    // is judged on this, since from DRAM all ISAs may tie at the bandwidth.
    auto hot_gws = [&](const aff::cpu::GemvKernel& k) {
      const int64_t hot_rows = std::max<int64_t>(1, std::min<int64_t>(rows, (192 << 10) / row_bytes));
      const int64_t passes = std::max<int64_t>(1, (int64_t(256) << 20) / (hot_rows * row_bytes));
      double best = 1e30;
      for (int r = 0; r < reps; ++r) {
        const auto t0 = Clock::now();
        for (int64_t p = 0; p < passes; ++p) k.fn(w.data(), row_bytes, hot_rows, cols, act.data(), y.data());
        best = std::min(best, seconds_since(t0));
      }
      return double(passes * hot_rows * cols) / best / 1e9;
    };
    const double gb = double(w.size()) / 1e9;
    // t1 <= 0: the one-thread run was skipped (--single 0).
    auto report = [&](const std::string& label, double t1, double tn_s, int64_t n, double hot) {
      const std::string one = t1 > 0 ? fmt::format("{:9.1f} {:6.0f}%", gb / t1, 100 * gb / t1 / bw1)
                                     : fmt::format("{:>9} {:>7}", "-", "-");
      std::printf("%-26s %6.3f %8lld %s %9.1f %6.0f%% %8.2f %8s\n", label.c_str(),
                  aff::quant::ggml_bits_per_weight(*type), (long long)n_exp, one.c_str(), gb / tn_s,
                  100 * gb / tn_s / bwn, double(n_exp * rows * cols * n) / tn_s / 1e9,
                  hot > 0 ? fmt::format("{:.1f}", hot).c_str() : "");
    };
    // Every ISA this CPU runs (the scalar fallback only when it is all there is): the
    // selector's pick should be the measured best.
    std::string_view best;
    double best_hot = 0;
    for (const auto& k : aff::cpu::gemv_kernels(*type)) {
      if (!aff::cpu::isa_supported(k.isa, feats)) continue;
      if (k.isa == aff::cpu::Isa::kScalar && selected->isa != aff::cpu::Isa::kScalar) continue;
      const double hot = hot_gws(k);
      const double t1 = single ? run(k, 1, 1) : 0.0, tn_s = run(k, threads, 1);
      report(std::string(k.name) + (k.name == selected->name ? " *" : ""), t1, tn_s, 1, hot);
      if (hot > best_hot) best_hot = hot, best = k.name;
    }
    if (batch > 1) {
      // gemm() takes the AMX kernel where it would in the engine; feats may say otherwise.
      aff::cpu::GemvKernel k = *selected;
      if (!feats.amx_int8) k.amx_fn = nullptr;
      const std::string path = aff::cpu::gemm_uses_amx(k, batch) ? "amx" : std::string(aff::cpu::isa_name(k.isa));
      report(fmt::format("  gemm x{} ({})", batch, path), single ? run(k, 1, batch) : 0.0, run(k, threads, batch),
             batch, 0);
    }
    if (selected->amx_fn != nullptr) {
      aff::cpu::GemvKernel vnni = *selected, amx = *selected;
      vnni.amx_fn = nullptr;
      amx.amx_min_tokens = 1;
      for (const int64_t nb : amx_ns) {
        report(fmt::format("  gemm x{} ({})", nb, aff::cpu::isa_name(vnni.isa)), single ? run(vnni, 1, nb) : 0.0,
               run(vnni, threads, nb), nb, 0);
        report(fmt::format("  gemm x{} (amx)", nb), single ? run(amx, 1, nb) : 0.0, run(amx, threads, nb), nb, 0);
      }
    }
    // The engine's decode path: ref::linear -> cpu::linear_fast_rows for one token, one
    // expert after another, each split by rows over all threads (a fork/join per
    // projection, the f32 activation quantised inside). Compare with the whole-expert
    // rows above to see what the per-projection split costs.
    if (disable.empty()) {
      std::vector<aff::dsv4::Linear> lins(static_cast<size_t>(n_exp));
      for (int64_t e = 0; e < n_exp; ++e) {
        auto& l = lins[size_t(e)];
        l.weight.dtype = aff::DType::kU8;
        l.weight.shape = {rows, row_bytes};
        l.weight.data = w.data() + e * expert_bytes;
        l.weight.nbytes = uint64_t(expert_bytes);
        l.format = aff::dsv4::WeightFormat::kGgml;
        l.ggml_type = int(*type);
        l.out = rows;
        l.in = cols;
      }
      auto run_split = [&](int nt) {
        const int saved = omp_get_max_threads(), saved_dynamic = omp_get_dynamic();
        omp_set_num_threads(nt);
        // As the forward pass does (ref::adapt_threads_to_load): OpenMP may shrink a team
        // to the cores that are free, unless OMP_DYNAMIC says otherwise.
        if (std::getenv("OMP_DYNAMIC") == nullptr) omp_set_dynamic(1);
        double best_s = 1e30;
        for (int r = 0; r < reps; ++r) {
          const auto t0 = Clock::now();
          for (const auto& l : lins) aff::cpu::linear_fast_rows(l, 0, rows, x.data(), cols, 1, y.data(), rows);
          best_s = std::min(best_s, seconds_since(t0));
        }
        omp_set_num_threads(saved);
        omp_set_dynamic(saved_dynamic);
        return best_s;
      };
      report("  rows split per expert", single ? run_split(1) : 0.0, run_split(threads), 1, 0);
      // The engine's decode path since the MoE lane (cpu::moe_lane_experts): a layer's
      // 7 experts (6 routed + shared), one token each, in one parallel region. Three
      // consecutive matrices make an expert: gate and up as stored, the third read as
      // down [cols, rows] (the same bytes, rows of `rows` inputs).
      const int64_t per_layer = 7, n_layers = n_exp / (3 * per_layer);
      if (n_layers > 0 && (rows % aff::quant::ggml_traits(*type).block_elems) == 0) {
        std::vector<aff::dsv4::ExpertWeights> ex(size_t(n_layers * per_layer));
        for (size_t i = 0; i < ex.size(); ++i) {
          ex[i].w1 = lins[3 * i];
          ex[i].w3 = lins[3 * i + 1];
          aff::dsv4::Linear down = lins[3 * i + 2];
          down.out = cols;
          down.in = rows;
          down.weight.shape = {cols, *aff::quant::ggml_row_bytes(*type, rows)};
          ex[i].w2 = down;
        }
        std::vector<float> yl(size_t(per_layer * cols));
        auto run_moe = [&](int nt) {
          const int saved = omp_get_max_threads(), saved_dynamic = omp_get_dynamic();
          omp_set_num_threads(nt);
          if (std::getenv("OMP_DYNAMIC") == nullptr) omp_set_dynamic(1);
          double best_s = 1e30;
          for (int r = 0; r < reps; ++r) {
            const auto t0 = Clock::now();
            for (int64_t l = 0; l < n_layers; ++l) {
              aff::cpu::ExpertJob jobs[per_layer];
              for (int64_t j = 0; j < per_layer; ++j) {
                jobs[j] = {&ex[size_t(l * per_layer + j)], x.data(), 1, yl.data() + j * cols};
              }
              aff::cpu::moe_lane_experts(jobs, 10.0f);
            }
            best_s = std::min(best_s, seconds_since(t0));
          }
          omp_set_num_threads(saved);
          omp_set_dynamic(saved_dynamic);
          // Scaled to the whole data set so the GB/s columns count the bytes streamed.
          return best_s * double(n_exp) / double(n_layers * per_layer * 3);
        };
        report("  moe layer, one region", single ? run_moe(1) : 0.0, run_moe(threads), 1, 0);
      }
    }
    std::printf("  %s: selected %s%s\n", tn.c_str(), std::string(selected->name).c_str(),
                best == selected->name ? " (fastest with weights in L2)"
                                       : fmt::format(" (fastest with weights in L2: {})", best).c_str());
  }
  return 0;
}
