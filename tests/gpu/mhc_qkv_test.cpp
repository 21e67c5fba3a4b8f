// Two fused kernels against the CPU reference, at decode sizes (T = 1, 3, 8:
// hc_fused's decode variant) and prefill sizes (T = 9, 37, 333: its prefill
// variant), with fresh random data and a printed seed:
//  - hc_fused (one mHC site): mixes matrix in f32, bf16 and f16; the op
//    checker's hc_pre (no expand, no norm), a forward-pass site (expand of the
//    previous sublayer's output + the sublayer's rmsnorm), the final head with
//    and without expand and norm; V4's hidden size and two small ones (200: a
//    partial channel block; 100: 16-bit mixes take the generic kernel); a
//    decode site that also computes an indexer's head weights (partial sums);
//  - qkv_finish: per-head query norm, weighted KV norm and a rope-only part
//    with its own frequencies, at V4's shapes and near position 1M; a small
//    head size (fewer float4s than lanes) and an odd one (the fallback kernel).
// Every case also runs twice and must give the same bits (no atomics in any
// sum), and hc_fused must leave its tickets at zero.
// MhcQkvBench.DISABLED_Timing prints the time per launch of both at V4
// geometry, T = 2048 and T = 1.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/check/op_check.h"
#include "backend/cuda/kernels/gemv/gemv.h"
#include "backend/cuda/kernels/mhc/mhc.h"
#include "backend/cuda/kernels/moe/moe.h"
#include "backend/cuda/kernels/rope/rope.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/device_buffer.h"
#include "backend/cuda/runtime/step_info.h"
#include "backend/ref/norm.h"
#include "backend/ref/rope.h"
#include "core/dtype.h"
#include "device_random_linear.h"
#include "gpu_test_util.h"
#include "model/dsv4/config.h"
#include "model/dsv4/mhc.h"

namespace aff::cuda {
namespace {

constexpr int kHc = 4;

std::vector<float> randn(std::mt19937_64& rng, size_t n, float mean = 0.0f, float sd = 1.0f) {
  std::normal_distribution<float> d(mean, sd);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

template <typename T>
T* dev(const Result<DeviceBuffer>& b) {
  return b->as<T>();
}

// ---------------------------------------------------------------- hc_fused

enum class HcMode { kPre, kSite, kHead, kHeadPlain };

const char* mode_name(HcMode m) {
  switch (m) {
    case HcMode::kPre: return "pre (no expand, no norm)";
    case HcMode::kSite: return "site (expand + norm)";
    case HcMode::kHead: return "head (expand + norm)";
    case HcMode::kHeadPlain: return "head (no expand, no norm)";
  }
  return "?";
}

// The bytes of a random mixes matrix of n = n_mix * hc * D elements stored as
// `dtype` (0 f32, 1 bf16, 2 f16); the CPU reference decodes the same bytes.
std::vector<uint8_t> random_fn(std::mt19937_64& rng, int dtype, int64_t n) {
  const float sd = 1.0f / std::sqrt(float(n) / 24.0f);  // mixes of order 1 before the scales
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<uint8_t> bytes(size_t(n) * (dtype == 0 ? 4 : 2));
  for (int64_t i = 0; i < n; ++i) {
    const float v = d(rng);
    if (dtype == 0) {
      std::memcpy(bytes.data() + 4 * i, &v, 4);
    } else {
      const uint16_t b = dtype == 1 ? f32_to_bf16(v) : f32_to_f16(v);
      std::memcpy(bytes.data() + 2 * i, &b, 2);
    }
  }
  return bytes;
}

struct HcOut {
  std::vector<float> x, h, pre, post, comb;
  std::vector<float> iw;  // [T, iw_heads] the indexer head weights' partial sums, added up
  std::vector<uint32_t> tickets;
};

// One hc_fused launch from fresh copies of the inputs.
struct HcCase {
  int64_t T, D;
  int dtype;
  HcMode mode;
  bool head() const { return mode == HcMode::kHead || mode == HcMode::kHeadPlain; }
  bool expand() const { return mode == HcMode::kSite || mode == HcMode::kHead; }
  int n_mix() const { return head() ? kHc : (2 + kHc) * kHc; }
};

struct HcInputs {
  std::vector<float> h, a, post_prev, comb_prev, base, scale, x_norm;
  std::vector<uint8_t> fn;
  std::vector<uint16_t> iw;  // [kIwHeads, D] BF16: an indexer's weights_proj for the decode site
};

constexpr int kIwHeads = 64;

HcInputs make_hc_inputs(const HcCase& c, std::mt19937_64& rng) {
  HcInputs in;
  const size_t T = size_t(c.T), D = size_t(c.D);
  in.h = randn(rng, T * kHc * D);
  in.a = randn(rng, T * D, 0.0f, 2.0f);
  in.post_prev = testing::uniform(T * kHc, rng, 0.0f, 2.0f);
  in.comb_prev = testing::uniform(T * kHc * kHc, rng, 0.0f, 0.5f);
  in.fn = random_fn(rng, c.dtype, int64_t(c.n_mix()) * kHc * c.D);
  in.base = randn(rng, size_t(c.n_mix()), 0.0f, 0.5f);
  in.scale = c.head() ? std::vector<float>{0.8f} : std::vector<float>{0.7f, 0.9f, 1.1f};
  in.x_norm = randn(rng, D, 1.0f, 0.1f);
  const std::vector<float> iw = randn(rng, size_t(kIwHeads) * D, 0.0f, 0.05f);
  in.iw.resize(iw.size());
  for (size_t i = 0; i < iw.size(); ++i) in.iw[i] = f32_to_bf16(iw[i]);
  return in;
}

// defer: the decode variant leaves comb's Sinkhorn to an HcCombJob, run here
// by its own launch after the site (as the forward pass's consumers run it).
// iw: the decode site also computes the indexer head weights' partial sums
// (HcFusedArgs::iw_weight), added up here in block order into HcOut::iw.
Result<HcOut> run_hc(const HcCase& c, const HcInputs& in, cudaStream_t s, bool defer = false, bool iw = false) {
  const size_t T = size_t(c.T), D = size_t(c.D);
  AFF_ASSIGN_OR_RETURN(DeviceBuffer h, upload_vector(in.h, "test"));
  AFF_ASSIGN_OR_RETURN(DeviceBuffer a, upload_vector(in.a, "test"));
  AFF_ASSIGN_OR_RETURN(DeviceBuffer fn, upload_vector(in.fn, "test"));
  AFF_ASSIGN_OR_RETURN(DeviceBuffer base, upload_vector(in.base, "test"));
  AFF_ASSIGN_OR_RETURN(DeviceBuffer scale, upload_vector(in.scale, "test"));
  AFF_ASSIGN_OR_RETURN(DeviceBuffer x_norm, upload_vector(in.x_norm, "test"));
  AFF_ASSIGN_OR_RETURN(DeviceBuffer post, upload_vector(in.post_prev, "test"));
  AFF_ASSIGN_OR_RETURN(DeviceBuffer comb, upload_vector(in.comb_prev, "test"));
  AFF_ASSIGN_OR_RETURN(DeviceBuffer pre, DeviceBuffer::allocate(T * kHc * 4, "test"));
  AFF_ASSIGN_OR_RETURN(DeviceBuffer x, DeviceBuffer::allocate(T * D * 4, "test"));
  // Scratch as the forward pass's workspace sizes it (gpu_state.cpp).
  const size_t n_part = T * size_t(hc_fused_blocks(c.D)) * ((2 + kHc) * kHc + 1 + kHc * (kHc + 1) / 2);
  AFF_ASSIGN_OR_RETURN(DeviceBuffer partials, DeviceBuffer::allocate(n_part * 4, "test"));
  AFF_ASSIGN_OR_RETURN(DeviceBuffer tickets, upload_vector(std::vector<uint32_t>(2 * T, 0u), "test"));

  HcFusedArgs f;
  f.h = h.as<float>();
  f.a = c.expand() ? a.as<float>() : nullptr;
  f.fn = fn.as<uint8_t>(), f.fn_dtype = c.dtype;
  f.base = base.as<float>(), f.scale = scale.as<float>();
  f.T = c.T, f.hc = kHc, f.D = c.D, f.head = c.head();
  f.sinkhorn_iters = 20, f.hc_eps = 1e-6f, f.norm_eps = 1e-6f;
  f.post = post.as<float>(), f.comb = comb.as<float>(), f.pre = pre.as<float>();
  f.x_norm = c.expand() ? x_norm.as<float>() : nullptr;
  f.x = x.as<float>();
  f.partials = partials.as<float>();
  f.tickets = tickets.as<unsigned>();
  f.defer_comb = defer;
  const int nb = hc_decode_blocks(c.D);
  AFF_ASSIGN_OR_RETURN(DeviceBuffer iw_w, upload_vector(in.iw, "test"));
  AFF_ASSIGN_OR_RETURN(DeviceBuffer iw_parts, DeviceBuffer::allocate(T * size_t(nb) * kIwHeads * 4, "test"));
  if (iw) f.iw_weight = iw_w.as<uint8_t>(), f.iw_heads = kIwHeads, f.iw_parts = iw_parts.as<float>();
  AFF_RETURN_IF_ERROR(hc_fused(f, s));
  if (defer) AFF_RETURN_IF_ERROR(hc_comb_run(HcCombJob{f.comb, c.T, kHc, f.sinkhorn_iters, f.hc_eps}, s));
  AFF_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(s), "hc_fused test"));

  HcOut o;
  AFF_ASSIGN_OR_RETURN(o.x, download_vector(x.as<float>(), T * D, "test"));
  AFF_ASSIGN_OR_RETURN(o.h, download_vector(h.as<float>(), T * kHc * D, "test"));
  AFF_ASSIGN_OR_RETURN(o.pre, download_vector(pre.as<float>(), T * kHc, "test"));
  AFF_ASSIGN_OR_RETURN(o.post, download_vector(post.as<float>(), T * kHc, "test"));
  AFF_ASSIGN_OR_RETURN(o.comb, download_vector(comb.as<float>(), T * kHc * kHc, "test"));
  AFF_ASSIGN_OR_RETURN(o.tickets, download_vector(tickets.as<uint32_t>(), 2 * T, "test"));
  if (iw) {
    AFF_ASSIGN_OR_RETURN(std::vector<float> parts, download_vector(iw_parts.as<float>(), T * nb * kIwHeads, "test"));
    o.iw.assign(T * kIwHeads, 0.0f);
    for (size_t t = 0; t < T; ++t)
      for (int b = 0; b < nb; ++b)
        for (int hd = 0; hd < kIwHeads; ++hd) o.iw[t * kIwHeads + hd] += parts[(t * nb + b) * kIwHeads + hd];
  }
  return o;
}

TEST(HcFused, MatchesCpuAtDecodeAndPrefillSizes) {
  AFF_SKIP_WITHOUT_GPU();
  AFF_SEEDED_RNG(seed, rng);
  auto stream = Stream::create();
  ASSERT_TRUE(stream.is_ok()) << stream.status().message();

  std::vector<HcCase> cases;
  for (int dtype : {0, 1, 2})
    for (HcMode mode : {HcMode::kPre, HcMode::kSite, HcMode::kHead, HcMode::kHeadPlain}) {
      for (int64_t T : {1, 3, 8, 9, 333}) cases.push_back({T, 4096, dtype, mode});
      for (int64_t T : {3, 37}) {
        cases.push_back({T, 200, dtype, mode});
        cases.push_back({T, 100, dtype, mode});
      }
    }

  for (const HcCase& c : cases) {
    const std::string what = "T " + std::to_string(c.T) + " D " + std::to_string(c.D) + " fn " +
                             (c.dtype == 0 ? "f32" : c.dtype == 1 ? "bf16" : "f16") + " " + mode_name(c.mode);
    SCOPED_TRACE(what);
    const HcInputs in = make_hc_inputs(c, rng);

    // CPU reference: expand, then the site's or the head's pre half, then the norm.
    dsv4::ModelConfig cfg;
    cfg.hc_mult = kHc, cfg.hidden_size = c.D, cfg.rms_norm_eps = 1e-6, cfg.hc_eps = 1e-6;
    cfg.hc_sinkhorn_iters = 20;
    dsv4::HcWeights w;
    w.fn.name = "test.fn", w.fn.dtype = c.dtype == 0 ? DType::kF32 : c.dtype == 1 ? DType::kBF16 : DType::kF16;
    w.fn.shape = {c.n_mix(), kHc * c.D}, w.fn.data = in.fn.data(), w.fn.nbytes = in.fn.size();
    w.base.name = "test.base", w.base.dtype = DType::kF32, w.base.shape = {c.n_mix()};
    w.base.data = reinterpret_cast<const uint8_t*>(in.base.data()), w.base.nbytes = in.base.size() * 4;
    w.scale.name = "test.scale", w.scale.dtype = DType::kF32, w.scale.shape = {int64_t(in.scale.size())};
    w.scale.data = reinterpret_cast<const uint8_t*>(in.scale.data()), w.scale.nbytes = in.scale.size() * 4;
    std::vector<float> h = in.h, x(size_t(c.T * c.D));
    if (c.expand()) {
      dsv4::HcMix prev;
      prev.post = in.post_prev, prev.comb = in.comb_prev;
      dsv4::hc_post(cfg, prev, in.a.data(), c.T, h.data());
    }
    dsv4::HcMix mix;
    if (c.head()) dsv4::hc_head(cfg, w, h.data(), c.T, x.data());
    else dsv4::hc_pre(cfg, w, h.data(), c.T, x.data(), mix);
    if (c.expand()) ref::rmsnorm(x.data(), c.T, c.D, in.x_norm.data(), 1e-6f);

    auto got = run_hc(c, in, stream->get());
    ASSERT_TRUE(got.is_ok()) << got.status().message();
    EXPECT_LE(rel_rms(got->x.data(), x.data(), x.size()), kTolOpF32) << "x";
    EXPECT_LE(rel_rms(got->h.data(), h.data(), h.size()), kTolOpF32) << "h";
    if (!c.head()) {
      EXPECT_LE(rel_rms(got->post.data(), mix.post.data(), mix.post.size()), kTolOpF32) << "post";
      EXPECT_LE(rel_rms(got->comb.data(), mix.comb.data(), mix.comb.size()), kTolOpF32) << "comb";
    }
    for (uint32_t t : got->tickets) ASSERT_EQ(t, 0u) << "tickets must be left at zero";

    auto again = run_hc(c, in, stream->get());
    ASSERT_TRUE(again.is_ok()) << again.status().message();
    EXPECT_TRUE(same_bits(got->x, again->x)) << "x differs between two runs";
    EXPECT_TRUE(same_bits(got->h, again->h)) << "h differs between two runs";
    EXPECT_TRUE(same_bits(got->pre, again->pre)) << "pre differs between two runs";
    if (!c.head()) {
      EXPECT_TRUE(same_bits(got->post, again->post)) << "post differs between two runs";
      EXPECT_TRUE(same_bits(got->comb, again->comb)) << "comb differs between two runs";
    }
    // A decode site whose comb is finished by a job afterwards: the same bits.
    if (!c.head() && c.T <= kHcSmallT) {
      auto deferred = run_hc(c, in, stream->get(), true);
      ASSERT_TRUE(deferred.is_ok()) << deferred.status().message();
      EXPECT_TRUE(same_bits(got->x, deferred->x)) << "x differs with a deferred comb";
      EXPECT_TRUE(same_bits(got->pre, deferred->pre)) << "pre differs with a deferred comb";
      EXPECT_TRUE(same_bits(got->post, deferred->post)) << "post differs with a deferred comb";
      EXPECT_TRUE(same_bits(got->comb, deferred->comb)) << "comb differs with a deferred comb";
    }
    // A decode site that also computes the next indexer's head weights
    // (weights_proj x): its own outputs keep their bits, and the partial sums
    // add up to the CPU's product with the reference x.
    if (c.mode == HcMode::kSite && c.T <= kHcSmallT && hc_site_iw_supported(c.D, kIwHeads)) {
      auto with_iw = run_hc(c, in, stream->get(), true, true);
      ASSERT_TRUE(with_iw.is_ok()) << with_iw.status().message();
      EXPECT_TRUE(same_bits(got->x, with_iw->x)) << "x differs with the head weights";
      EXPECT_TRUE(same_bits(got->h, with_iw->h)) << "h differs with the head weights";
      std::vector<float> iw_ref(size_t(c.T) * kIwHeads, 0.0f);
      for (int64_t t = 0; t < c.T; ++t)
        for (int hd = 0; hd < kIwHeads; ++hd) {
          double acc = 0.0;
          for (int64_t d = 0; d < c.D; ++d)
            acc += double(bf16_to_f32(in.iw[size_t(hd * c.D + d)])) * x[size_t(t * c.D + d)];
          iw_ref[size_t(t * kIwHeads + hd)] = float(acc);
        }
      EXPECT_LE(rel_rms(with_iw->iw.data(), iw_ref.data(), iw_ref.size()), kTolOpF32) << "head weights";
    }
  }
}

// A deferred comb (HcCombJob) finished by the extra block of the launches that
// take it (the wq_a + wkv pair GEMV, the decode router) must get the bits its
// own launch (hc_comb_run) gives, while those launches still do their own work.
TEST(HcCombJob, ExtraBlocksGiveTheBitsOfTheJobsOwnLaunch) {
  AFF_SKIP_WITHOUT_GPU();
  AFF_SEEDED_RNG(seed, rng);
  for (int64_t T : {1, 3, 8}) {
    SCOPED_TRACE("T " + std::to_string(T));
    const std::vector<float> logits = randn(rng, size_t(T * kHc * kHc), 0.0f, 2.0f);
    auto own = upload_vector(logits, "comb");
    auto by_pair = upload_vector(logits, "comb");
    auto by_router = upload_vector(logits, "comb");
    ASSERT_TRUE(own.is_ok() && by_pair.is_ok() && by_router.is_ok());
    auto job = [&](DeviceBuffer& b) { return HcCombJob{b.as<float>(), T, kHc, 20, 1e-6f}; };
    ASSERT_TRUE(hc_comb_run(job(*own), nullptr).is_ok());

    // The pair GEMV with the job, against the same pair without it.
    const int64_t D = 1024;
    testing::RandomWeight w1 = testing::make_weight(DevFormat::kFP8Block, 256, D, rng);
    testing::RandomWeight w2 = testing::make_weight(DevFormat::kFP8Block, 128, D, rng);
    auto x = upload_vector(randn(rng, size_t(T * D)), "x");
    auto y1 = DeviceBuffer::allocate(size_t(T * 256) * 4, "y1"), y2 = DeviceBuffer::allocate(size_t(T * 128) * 4, "y2");
    auto z1 = DeviceBuffer::allocate(size_t(T * 256) * 4, "z1"), z2 = DeviceBuffer::allocate(size_t(T * 128) * 4, "z2");
    ASSERT_TRUE(x.is_ok() && y1.is_ok() && y2.is_ok() && z1.is_ok() && z2.is_ok());
    PairOptions with_job;
    with_job.job = job(*by_pair);
    ASSERT_TRUE(gemv_mma_pair(w1.w, w2.w, x->as<float>(), D, T, y1->as<float>(), 256, y2->as<float>(), 128, nullptr,
                              with_job)
                    .is_ok());
    ASSERT_TRUE(
        gemv_mma_pair(w1.w, w2.w, x->as<float>(), D, T, z1->as<float>(), 256, z2->as<float>(), 128, nullptr).is_ok());

    // The router with the job, against the router without it.
    testing::RandomWeight gate = testing::make_weight(DevFormat::kBF16, 256, 4096, rng);
    auto gx = upload_vector(randn(rng, size_t(T * 4096), 0.0f, 0.05f), "x");
    auto ticket = upload_vector(std::vector<uint32_t>{0u}, "ticket");
    auto lg = DeviceBuffer::allocate(size_t(T * 256) * 4, "logits"), lg2 = DeviceBuffer::allocate(size_t(T * 256) * 4, "logits");
    auto ids = DeviceBuffer::allocate(size_t(T * 6) * 4, "ids"), ids2 = DeviceBuffer::allocate(size_t(T * 6) * 4, "ids");
    auto rw = DeviceBuffer::allocate(size_t(T * 6) * 4, "w"), rw2 = DeviceBuffer::allocate(size_t(T * 6) * 4, "w");
    ASSERT_TRUE(gx.is_ok() && ticket.is_ok() && lg.is_ok() && lg2.is_ok() && ids.is_ok() && ids2.is_ok() && rw.is_ok() &&
                rw2.is_ok());
    RouterArgs r;
    r.T = T, r.E = 256, r.k = 6, r.func = ScoreFunc::kSqrtSoftplus, r.scaling = 1.5f;
    RouterArgs r2 = r;
    r.logits = lg->as<float>(), r.ids = ids->as<int32_t>(), r.weights = rw->as<float>();
    r2.logits = lg2->as<float>(), r2.ids = ids2->as<int32_t>(), r2.weights = rw2->as<float>();
    ASSERT_TRUE(router_gate_topk(r, gate.w, gx->as<float>(), ticket->as<unsigned>(), nullptr, job(*by_router)).is_ok());
    ASSERT_TRUE(router_gate_topk(r2, gate.w, gx->as<float>(), ticket->as<unsigned>(), nullptr).is_ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

    const size_t n = size_t(T * kHc * kHc);
    auto want = download_vector(own->as<float>(), n, "comb");
    auto got_pair = download_vector(by_pair->as<float>(), n, "comb");
    auto got_router = download_vector(by_router->as<float>(), n, "comb");
    ASSERT_TRUE(want.is_ok() && got_pair.is_ok() && got_router.is_ok());
    EXPECT_FALSE(same_bits(*want, logits)) << "the job left the logits as they were";
    EXPECT_TRUE(same_bits(*want, *got_pair)) << "the pair GEMV's job block";
    EXPECT_TRUE(same_bits(*want, *got_router)) << "the router's job block";
    for (auto [a, b, what] : {std::tuple{&*y1, &*z1, "pair y1"}, std::tuple{&*y2, &*z2, "pair y2"},
                              std::tuple{&*lg, &*lg2, "router logits"}, std::tuple{&*rw, &*rw2, "router weights"}}) {
      auto u = download_vector(a->as<float>(), a->bytes() / 4, what), v = download_vector(b->as<float>(), b->bytes() / 4, what);
      ASSERT_TRUE(u.is_ok() && v.is_ok());
      EXPECT_TRUE(same_bits(*u, *v)) << what << " changed with the job";
    }
    auto i1 = download_vector(ids->as<int32_t>(), size_t(T * 6), "ids"), i2 = download_vector(ids2->as<int32_t>(), size_t(T * 6), "ids");
    ASSERT_TRUE(i1.is_ok() && i2.is_ok());
    EXPECT_EQ(*i1, *i2) << "router picks changed with the job";
    auto tk = download_vector(ticket->as<uint32_t>(), 1, "ticket");
    ASSERT_TRUE(tk.is_ok());
    EXPECT_EQ((*tk)[0], 0u) << "the router's ticket must be left at zero";
  }
}

// ------------------------------------------------------------- qkv_finish

struct QkvShape {
  int64_t rows_per_token, len;
  bool norm, weight;
  bool own_freq;  // this part's frequencies differ from the first part's
};

struct QkvCase {
  int64_t T, pos0;
  int rope_dim;
  std::vector<QkvShape> parts;
};

// V4 compressed-layer frequencies (theta 160000, YaRN factor 16 over 65536)
// and plain theta 10000 for a part with its own table.
std::vector<float> freq(int rope_dim, bool yarn) {
  ref::YarnParams y;
  y.factor = 16.0, y.original_max_position = 65536, y.beta_fast = 32.0, y.beta_slow = 1.0;
  return yarn ? ref::rope_inv_freq(160000.0, rope_dim, &y) : ref::rope_inv_freq(10000.0, rope_dim, nullptr);
}

Result<std::vector<std::vector<float>>> run_qkv(const QkvCase& c, const std::vector<std::vector<float>>& x,
                                                const std::vector<std::vector<float>>& weights,
                                                cudaStream_t s) {
  std::vector<DeviceBuffer> bufs;
  QkvFinishArgs f;
  AFF_ASSIGN_OR_RETURN(DeviceBuffer step, upload_vector(std::vector<StepInfo>{StepInfo{c.pos0, c.T}}, "test"));
  AFF_ASSIGN_OR_RETURN(DeviceBuffer f_main, upload_vector(freq(c.rope_dim, true), "test"));
  AFF_ASSIGN_OR_RETURN(DeviceBuffer f_own, upload_vector(freq(c.rope_dim, false), "test"));
  for (size_t i = 0; i < c.parts.size(); ++i) {
    const QkvShape& p = c.parts[i];
    AFF_ASSIGN_OR_RETURN(DeviceBuffer dx, upload_vector(x[i], "test"));
    QkvPart& q = f.parts[i];
    q.x = dx.as<float>(), q.rows_per_token = int(p.rows_per_token), q.len = int(p.len), q.norm = p.norm;
    q.inv_freq = p.own_freq ? f_own.as<float>() : f_main.as<float>();
    bufs.push_back(std::move(dx));
    if (p.weight) {
      AFF_ASSIGN_OR_RETURN(DeviceBuffer dw, upload_vector(weights[i], "test"));
      q.norm_weight = dw.as<float>();
      bufs.push_back(std::move(dw));
    }
  }
  f.n_parts = int(c.parts.size()), f.step = step.as<StepInfo>(), f.T = c.T, f.rope_dim = c.rope_dim;
  f.eps = 1e-6f;
  AFF_RETURN_IF_ERROR(qkv_finish(f, s));
  AFF_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(s), "qkv_finish test"));
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < c.parts.size(); ++i) {
    AFF_ASSIGN_OR_RETURN(std::vector<float> v, download_vector(f.parts[i].x, x[i].size(), "test"));
    out.push_back(std::move(v));
  }
  return out;
}

TEST(QkvFinish, MatchesCpuAtDecodeAndPrefillSizes) {
  AFF_SKIP_WITHOUT_GPU();
  AFF_SEEDED_RNG(seed, rng);
  auto stream = Stream::create();
  ASSERT_TRUE(stream.is_ok()) << stream.status().message();

  // V4: 64 query heads of 512 (per-head norm), the KV latent (weighted norm),
  // 64 indexer heads of 128 (rope only here, with their own frequencies).
  const std::vector<QkvShape> v4 = {{64, 512, true, false, false}, {1, 512, true, true, false},
                                    {64, 128, false, false, true}};
  // The tiny model's sizes: fewer float4s in a row than lanes in a warp.
  const std::vector<QkvShape> tiny = {{4, 48, true, false, false}, {1, 48, true, true, false},
                                      {3, 32, true, false, true}};
  // An odd length and rope_dim: the fallback kernel.
  const std::vector<QkvShape> odd = {{5, 50, true, false, false}, {1, 50, true, true, false}};
  std::vector<QkvCase> cases;
  for (int64_t T : {1, 3, 8, 333})
    for (int64_t pos0 : {int64_t(5), int64_t(1000000) - T}) cases.push_back({T, pos0, 64, v4});
  for (int64_t T : {1, 8, 37}) {
    cases.push_back({T, 123457, 16, tiny});
    cases.push_back({T, 123457, 10, odd});
  }

  for (const QkvCase& c : cases) {
    SCOPED_TRACE("T " + std::to_string(c.T) + " pos0 " + std::to_string(c.pos0) + " rope_dim " +
                 std::to_string(c.rope_dim) + " first len " + std::to_string(c.parts[0].len));
    std::vector<std::vector<float>> x, w, want;
    for (const QkvShape& p : c.parts) {
      x.push_back(randn(rng, size_t(c.T * p.rows_per_token * p.len), 0.0f, 2.0f));
      w.push_back(randn(rng, size_t(p.len), 1.0f, 0.2f));
      want.push_back(x.back());
      std::vector<float>& v = want.back();
      const std::vector<float> inv = freq(c.rope_dim, !p.own_freq);
      for (int64_t t = 0; t < c.T; ++t)
        for (int64_t r = 0; r < p.rows_per_token; ++r) {
          float* row = v.data() + (t * p.rows_per_token + r) * p.len;
          if (p.norm) ref::rmsnorm(row, 1, p.len, p.weight ? w.back().data() : nullptr, 1e-6f);
          ref::rope_apply(row + p.len - c.rope_dim, inv, c.pos0 + t, false);
        }
    }
    auto got = run_qkv(c, x, w, stream->get());
    ASSERT_TRUE(got.is_ok()) << got.status().message();
    for (size_t i = 0; i < c.parts.size(); ++i)
      EXPECT_LE(rel_rms((*got)[i].data(), want[i].data(), want[i].size()), kTolOpF32) << "part " << i;
    auto again = run_qkv(c, x, w, stream->get());
    ASSERT_TRUE(again.is_ok()) << again.status().message();
    for (size_t i = 0; i < c.parts.size(); ++i)
      EXPECT_TRUE(same_bits((*got)[i], (*again)[i])) << "part " << i << " differs between two runs";
  }
}

// ----------------------------------------------------------------- timing

// Mean time per launch of `launch` over `reps` launches after 3 warm-ups, ms.
template <typename F>
double time_ms(cudaStream_t s, int reps, F&& launch) {
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(launch().is_ok());
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  cudaEventRecord(e0, s);
  for (int i = 0; i < reps; ++i) EXPECT_TRUE(launch().is_ok());
  cudaEventRecord(e1, s);
  cudaEventSynchronize(e1);
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  return double(ms) / reps;
}

TEST(MhcQkvBench, DISABLED_Timing) {
  AFF_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(7);
  auto stream = Stream::create();
  ASSERT_TRUE(stream.is_ok()) << stream.status().message();
  cudaStream_t s = stream->get();
  const int64_t D = 4096, Tmax = 2048;

  {  // hc_fused, a forward-pass site (expand + norm), and the head
    const std::vector<float> h = randn(rng, size_t(Tmax * kHc * D), 0.0f, 1.0f);
    const std::vector<float> a = randn(rng, size_t(Tmax * D));
    auto dh = upload_vector(h, "bench");
    auto da = upload_vector(a, "bench");
    auto dpost = upload_vector(testing::uniform(size_t(Tmax * kHc), rng, 0.0f, 1.0f), "bench");
    auto dcomb = upload_vector(std::vector<float>(size_t(Tmax * kHc * kHc), 0.25f), "bench");
    auto dpre = DeviceBuffer::allocate(size_t(Tmax * kHc) * 4, "bench");
    auto dx = DeviceBuffer::allocate(size_t(Tmax * D) * 4, "bench");
    auto dnorm = upload_vector(std::vector<float>(size_t(D), 1.0f), "bench");
    auto dbase = upload_vector(randn(rng, 24, 0.0f, 0.5f), "bench");
    auto dscale = upload_vector(std::vector<float>{0.7f, 0.9f, 1.1f}, "bench");
    const size_t n_part = size_t(Tmax) * size_t(hc_fused_blocks(D)) * ((2 + kHc) * kHc + 1 + kHc * (kHc + 1) / 2);
    auto dpart = DeviceBuffer::allocate(n_part * 4, "bench");
    auto dtick = upload_vector(std::vector<uint32_t>(size_t(2 * Tmax), 0u), "bench");
    ASSERT_TRUE(dh.is_ok() && da.is_ok() && dpost.is_ok() && dcomb.is_ok() && dpre.is_ok() && dx.is_ok() &&
                dnorm.is_ok() && dbase.is_ok() && dscale.is_ok() && dpart.is_ok() && dtick.is_ok());
    for (int dtype : {1, 0}) {
      auto dfn = upload_vector(random_fn(rng, dtype, int64_t(24) * kHc * D), "bench");
      ASSERT_TRUE(dfn.is_ok());
      for (bool head : {false, true}) {
        for (int64_t T : {Tmax, int64_t(1)}) {
          HcFusedArgs f;
          f.h = dev<float>(dh), f.a = dev<float>(da), f.fn = dev<uint8_t>(dfn), f.fn_dtype = dtype;
          f.base = dev<float>(dbase), f.scale = dev<float>(dscale), f.T = T, f.hc = kHc, f.D = D, f.head = head;
          f.post = dev<float>(dpost), f.comb = dev<float>(dcomb), f.pre = dev<float>(dpre);
          f.x_norm = dev<float>(dnorm), f.x = dev<float>(dx);
          f.partials = dev<float>(dpart), f.tickets = dev<unsigned>(dtick);
          // The expand rewrites h in place every launch; the values stay finite
          // (comb is doubly stochastic-ish, post < 1) and the timing does not care.
          const double ms = time_ms(s, T == 1 ? 200 : 20, [&] { return hc_fused(f, s); });
          const double bytes = double(T) * D * 4 * (2.0 * kHc + 2.0);  // h r+w, a, x
          std::printf("[bench] hc_fused %-4s fn %-4s T %5lld: %8.1f us/launch (%6.0f GB/s of h r+w, a, x)\n",
                      head ? "head" : "site", dtype == 1 ? "bf16" : "f32", static_cast<long long>(T), ms * 1e3,
                      bytes / (ms * 1e-3) / 1e9);
        }
      }
    }
  }

  {  // qkv_finish, V4: 64 query heads x 512 (rope 64), the KV latent, 64 indexer heads x 128
    const int rd = 64;
    const int64_t H = 64, Dh = 512, Hi = 64, Di = 128;
    auto dq = DeviceBuffer::allocate(size_t(Tmax * H * Dh) * 4, "bench");
    auto dkv = DeviceBuffer::allocate(size_t(Tmax * Dh) * 4, "bench");
    auto diq = DeviceBuffer::allocate(size_t(Tmax * Hi * Di) * 4, "bench");
    auto dw = upload_vector(std::vector<float>(size_t(Dh), 1.0f), "bench");
    auto dfreq = upload_vector(freq(rd, true), "bench");
    auto dstep = upload_vector(std::vector<StepInfo>{StepInfo{65536, Tmax}}, "bench");
    ASSERT_TRUE(dq.is_ok() && dkv.is_ok() && diq.is_ok() && dw.is_ok() && dfreq.is_ok() && dstep.is_ok());
    for (auto* b : {&*dq, &*dkv, &*diq}) ASSERT_EQ(cudaMemset(b->data(), 0, b->bytes()), cudaSuccess);
    for (int64_t T : {Tmax, int64_t(1)}) {
      QkvFinishArgs f;
      f.parts[0] = QkvPart{dq->as<float>(), int(H), int(Dh), true, nullptr, dfreq->as<float>()};
      f.parts[1] = QkvPart{dkv->as<float>(), 1, int(Dh), true, dw->as<float>(), dfreq->as<float>()};
      f.parts[2] = QkvPart{diq->as<float>(), int(Hi), int(Di), false, nullptr, dfreq->as<float>()};
      f.n_parts = 3, f.step = dstep->as<StepInfo>(), f.T = T, f.rope_dim = rd, f.eps = 1e-6f;
      const double ms = time_ms(s, T == 1 ? 200 : 20, [&] { return qkv_finish(f, s); });
      // Everything is read; the rope-only indexer part writes its tail only.
      const double bytes = double(T) * (2.0 * (H * Dh + Dh) + Hi * Di + Hi * rd) * 4;
      std::printf("[bench] qkv_finish T %5lld: %8.1f us/launch (%6.0f GB/s read + written)\n",
                  static_cast<long long>(T), ms * 1e3, bytes / (ms * 1e-3) / 1e9);
    }
  }
}

}  // namespace
}  // namespace aff::cuda
