// The tensor-core attention core (kernels/attention) and indexer scores
// (kernels/indexer) against a double-precision reference of the same math,
// on odd shapes with fresh random data: decode with and without key splits,
// no / one / 513 compressed keys, a window that is not full yet, prefill
// chunks that straddle the ring and the chunk, head counts that are not a
// multiple of 16 or exceed one block's 64, and head_dim 64 / 192 / 512; and
// the decode form that finishes its raw queries itself (q_finish) against
// qkv_finish followed by the plain form.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/check/op_check.h"
#include "backend/cuda/kernels/attention/attention.h"
#include "backend/cuda/kernels/indexer/indexer.h"
#include "backend/cuda/kernels/rope/rope.h"
#include "backend/cuda/runtime/device_buffer.h"
#include "backend/ref/rope.h"
#include "gpu_test_util.h"

namespace aff::cuda {
namespace {

// hi + lo bf16 operands keep ~16 mantissa bits per product (see mma_bf16.cuh):
// errors of a few 1e-6 relative, well inside the op checker's f32 1e-4.
constexpr double kTolBf16x3 = 2e-5;
// One rounding of q, k and the probabilities to bf16 (2^-9 relative each);
// outputs are weighted means of keys, so the relative RMS stays near 3e-3.
constexpr double kTolBf16 = 1e-2;

using testing::randn;

struct AttnCase {
  std::string name;
  int H, Dh, W;
  int64_t T, pos0;
  AttnEntries mode;
  int ratio = 4;
  int64_t capacity = 0;  // compressed entry rows
  int sel_ld = 0;
  int sel_max = 0;       // kSelected: counts drawn in [0, sel_max] (last query gets sel_max)
  bool scratch = true;   // allow key splits
  MmaPrecision precision = MmaPrecision::kBf16x3;
  int64_t entry_bound = 0;  // kVisible: AttentionArgs::entry_bound
};

void run_attention_case(const AttnCase& c, std::mt19937_64& rng) {
  SCOPED_TRACE(c.name);
  const int64_t T = c.T, H = c.H, Dh = c.Dh, W = c.W;
  // Sharp-ish scores (|q.k| * scale up to a few units) so the softmax is not flat.
  std::vector<float> q = randn(size_t(T * H * Dh), rng, 2.0f), kv = randn(size_t(T * Dh), rng),
                     ring = randn(size_t(W * Dh), rng), entries = randn(size_t(std::max<int64_t>(1, c.capacity) * Dh), rng),
                     sinks = randn(size_t(H), rng);
  std::vector<int32_t> sel(size_t(std::max<int64_t>(1, T * c.sel_ld))), count(size_t(T), 0);
  if (c.mode == AttnEntries::kSelected) {
    std::uniform_int_distribution<int> cnt(0, c.sel_max);
    std::uniform_int_distribution<int64_t> id(0, c.capacity - 1);
    for (int64_t t = 0; t < T; ++t) {
      count[size_t(t)] = t + 1 == T ? c.sel_max : cnt(rng);
      for (int i = 0; i < count[size_t(t)]; ++i) sel[size_t(t * c.sel_ld + i)] = int32_t(id(rng));
    }
  }
  const float scale = 1.0f / std::sqrt(float(Dh));

  // Reference in double.
  std::vector<float> want(size_t(T * H * Dh));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pos = c.pos0 + t, ws = std::max<int64_t>(0, pos - W + 1);
    std::vector<const float*> keys;
    for (int64_t p = ws; p <= pos; ++p)
      keys.push_back(p >= c.pos0 ? kv.data() + (p - c.pos0) * Dh : ring.data() + (p % W) * Dh);
    if (c.mode == AttnEntries::kVisible)
      for (int64_t j = 0; j < std::min(c.capacity, (pos + 1) / c.ratio); ++j) keys.push_back(entries.data() + j * Dh);
    if (c.mode == AttnEntries::kSelected)
      for (int i = 0; i < count[size_t(t)]; ++i) keys.push_back(entries.data() + sel[size_t(t * c.sel_ld + i)] * Dh);
    for (int64_t h = 0; h < H; ++h) {
      const float* qh = q.data() + (t * H + h) * Dh;
      std::vector<double> s(keys.size());
      double m = sinks[size_t(h)];
      for (size_t i = 0; i < keys.size(); ++i) {
        double d = 0.0;
        for (int64_t x = 0; x < Dh; ++x) d += double(qh[x]) * keys[i][x];
        s[i] = d * scale;
        m = std::max(m, s[i]);
      }
      double den = std::exp(sinks[size_t(h)] - m);
      std::vector<double> o(size_t(Dh), 0.0);
      for (size_t i = 0; i < keys.size(); ++i) {
        const double p = std::exp(s[i] - m);
        den += p;
        for (int64_t x = 0; x < Dh; ++x) o[size_t(x)] += p * keys[i][x];
      }
      for (int64_t x = 0; x < Dh; ++x) want[size_t((t * H + h) * Dh + x)] = float(o[size_t(x)] / den);
    }
  }

  auto dq = upload_vector(q, "q"), dkv = upload_vector(kv, "kv"), dring = upload_vector(ring, "ring"),
       dent = upload_vector(entries, "entries"), dsink = upload_vector(sinks, "sinks");
  auto dsel = upload_vector(sel, "sel"), dcnt = upload_vector(count, "count");
  auto dstep = upload_vector(std::vector<StepInfo>{StepInfo{c.pos0, T}}, "step");
  auto dout = DeviceBuffer::allocate(size_t(T * H * Dh) * 4, "out");
  const int64_t scratch_floats = c.scratch ? T * H * (Dh + 2) * 64 : 0;
  auto dscratch = DeviceBuffer::allocate(size_t(scratch_floats) * 4, "scratch");
  ASSERT_TRUE(dq.is_ok() && dkv.is_ok() && dring.is_ok() && dent.is_ok() && dsink.is_ok() && dsel.is_ok() &&
              dcnt.is_ok() && dstep.is_ok() && dout.is_ok() && dscratch.is_ok());
  AttentionArgs a;
  a.step = dstep->as<StepInfo>(), a.q = dq->as<float>(), a.kv = dkv->as<float>(), a.ring = dring->as<float>();
  a.entries = dent->as<float>(), a.entry_capacity = c.capacity, a.ratio = c.ratio, a.mode = c.mode;
  a.entry_bound = c.entry_bound;
  a.sel = dsel->as<int32_t>(), a.sel_count = dcnt->as<int32_t>(), a.sel_ld = c.sel_ld;
  a.sinks = dsink->as<float>(), a.T = T, a.H = c.H, a.Dh = c.Dh, a.W = c.W, a.scale = scale;
  a.precision = c.precision, a.out = dout->as<float>();
  a.scratch = dscratch->as<float>(), a.scratch_floats = scratch_floats;
  if (c.scratch && T == 1) {
    EXPECT_GT(attention_splits(a), 1) << "a decode step with scratch should split its keys";
  }
  ASSERT_TRUE(attention_sparse(a, nullptr).is_ok());
  auto got = download_vector(dout->as<float>(), want.size(), "out");
  ASSERT_TRUE(got.is_ok());
  const double err = rel_rms(got->data(), want.data(), want.size());
  const double tol = c.precision == MmaPrecision::kBf16x3 ? kTolBf16x3 : kTolBf16;
  std::printf("[attention] %-34s splits %2d  rel rms %.2e (tol %.0e)\n", c.name.c_str(), attention_splits(a), err, tol);
  EXPECT_LE(err, tol);
}

TEST(AttentionMma, DecodeMatchesReference) {
  AFF_SKIP_WITHOUT_GPU();
  AFF_SEEDED_RNG(seed, rng);
  const std::vector<AttnCase> cases = {
      {"decode hca, 0 entries, window 3/128", 64, 512, 128, 1, 2, AttnEntries::kVisible, 4, 40},
      {"decode hca, 1 entry", 64, 512, 128, 1, 4, AttnEntries::kVisible, 4, 40},
      {"decode hca, 37 entries, ring wrapped", 64, 512, 128, 1, 150, AttnEntries::kVisible, 4, 40},
      {"decode csa, 513 selected", 64, 512, 128, 1, 1000, AttnEntries::kSelected, 4, 700, 600, 513},
      {"decode csa, 0 selected", 64, 512, 128, 1, 1000, AttnEntries::kSelected, 4, 700, 600, 0},
      {"decode swa, no splits", 64, 512, 128, 1, 300, AttnEntries::kNone, 4, 0, 0, 0, false},
      {"decode swa, 70 heads, dh 64", 70, 64, 48, 1, 61, AttnEntries::kNone},
      {"decode hca, 6 heads, dh 192", 6, 192, 32, 1, 97, AttnEntries::kVisible, 8, 20},
  };
  for (const AttnCase& c : cases) run_attention_case(c, rng);
  // The split grid sized by a bound on the visible entries (a short-context
  // decode graph) rather than the capacity: within the bound, and past it
  // (the keys are dealt to the splits by their count, so none is dropped).
  AttnCase bounded{"decode hca, 100 entries, bound 128", 64, 512, 128, 1, 128 * 100 - 1, AttnEntries::kVisible, 128, 8193};
  bounded.entry_bound = 128;
  run_attention_case(bounded, rng);
  bounded.name = "decode hca, 200 entries, bound 128", bounded.pos0 = 128 * 200 - 1;
  run_attention_case(bounded, rng);
  AttnCase fast = cases[3];
  fast.name = "decode csa 513, bf16", fast.precision = MmaPrecision::kBf16;
  run_attention_case(fast, rng);
}

TEST(AttentionMma, PrefillMatchesReference) {
  AFF_SKIP_WITHOUT_GPU();
  AFF_SEEDED_RNG(seed, rng);
  const std::vector<AttnCase> cases = {
      {"prefill swa from 0", 64, 512, 128, 37, 0, AttnEntries::kNone},
      {"prefill hca across ring+chunk", 64, 512, 128, 45, 203, AttnEntries::kVisible, 16, 30},
      {"prefill csa, counts 0..70", 64, 512, 128, 23, 517, AttnEntries::kSelected, 4, 200, 80, 70},
      {"prefill csa, 5 heads dh 128", 5, 128, 64, 19, 33, AttnEntries::kSelected, 4, 20, 6, 6, false},
      {"prefill hca, 130 heads dh 64", 130, 64, 32, 11, 70, AttnEntries::kVisible, 8, 12},
  };
  for (const AttnCase& c : cases) run_attention_case(c, rng);
  AttnCase fast = cases[1];
  fast.name = "prefill hca, bf16", fast.precision = MmaPrecision::kBf16;
  run_attention_case(fast, rng);
}

// q_finish: attention on raw queries, finishing them (per-head RMS norm, RoPE
// on the tail) as it stages them, against qkv_finish's queries through the
// plain form. The two differ only in the order of the norm's sums (a few f32
// roundings of q), so they agree far inside the attention's own tolerance.
// Not to f32 rounding, though: each path carries the bf16x3 MMAs' error (a
// few 1e-6, kTolBf16x3), and a one-ulp change in q moves which low bits of
// each product survive the hi / lo split. Over 30 draws the two differed by
// 3.7e-7 to 1.02e-6 relative RMS; the bound leaves that margin and stays 5x
// under kTolBf16x3 (a wrong norm or RoPE is off by orders of magnitude).
constexpr double kTolQFinish = 4e-6;
void run_q_finish_case(const std::string& name, int H, int Dh, int rope_dim, int64_t T, int64_t pos0, AttnEntries mode,
                       std::mt19937_64& rng) {
  SCOPED_TRACE(name);
  const int W = 64, ratio = 4;
  const int64_t capacity = 300, sel_ld = 256;
  std::vector<float> q = randn(size_t(T * H * Dh), rng, 3.0f), kv = randn(size_t(T * Dh), rng),
                     ring = randn(size_t(W * Dh), rng), entries = randn(size_t(capacity * Dh), rng),
                     sinks = randn(size_t(H), rng), freq(size_t(rope_dim / 2));
  for (int i = 0; i < rope_dim / 2; ++i) freq[size_t(i)] = std::pow(10000.0f, -2.0f * float(i) / float(rope_dim));
  std::vector<int32_t> sel(size_t(T * sel_ld));
  const std::vector<int32_t> count(size_t(T), int32_t{int32_t(sel_ld)});
  std::uniform_int_distribution<int32_t> id(0, int32_t(capacity) - 1);
  for (int32_t& v : sel) v = id(rng);
  auto dq_raw = upload_vector(q, "q raw"), dq = upload_vector(q, "q"), dkv = upload_vector(kv, "kv"),
       dring = upload_vector(ring, "ring"), dent = upload_vector(entries, "entries"), dsink = upload_vector(sinks, "sinks"),
       dfreq = upload_vector(freq, "freq");
  auto dsel = upload_vector(sel, "sel"), dcnt = upload_vector(count, "count");
  auto dstep = upload_vector(std::vector<StepInfo>{StepInfo{pos0, T}}, "step");
  auto dout = DeviceBuffer::allocate(size_t(T * H * Dh) * 4, "out"), dfused = DeviceBuffer::allocate(size_t(T * H * Dh) * 4, "fused");
  const int64_t scratch_floats = T * H * (Dh + 2) * 64;
  auto dscratch = DeviceBuffer::allocate(size_t(scratch_floats) * 4, "scratch");
  ASSERT_TRUE(dq_raw.is_ok() && dq.is_ok() && dkv.is_ok() && dring.is_ok() && dent.is_ok() && dsink.is_ok() &&
              dfreq.is_ok() && dsel.is_ok() && dcnt.is_ok() && dstep.is_ok() && dout.is_ok() && dfused.is_ok() &&
              dscratch.is_ok());
  const float eps = 1e-6f;
  QkvFinishArgs f;
  f.parts[0] = QkvPart{dq->as<float>(), H, Dh, true, nullptr, dfreq->as<float>()};
  f.n_parts = 1, f.step = dstep->as<StepInfo>(), f.T = T, f.rope_dim = rope_dim, f.eps = eps;
  ASSERT_TRUE(qkv_finish(f, nullptr).is_ok());
  AttentionArgs a;
  a.step = dstep->as<StepInfo>(), a.q = dq->as<float>(), a.kv = dkv->as<float>(), a.ring = dring->as<float>();
  a.entries = dent->as<float>(), a.entry_capacity = capacity, a.ratio = ratio, a.mode = mode;
  a.sel = dsel->as<int32_t>(), a.sel_count = dcnt->as<int32_t>(), a.sel_ld = int(sel_ld);
  a.sinks = dsink->as<float>(), a.T = T, a.H = H, a.Dh = Dh, a.W = W, a.scale = 1.0f / std::sqrt(float(Dh));
  a.out = dout->as<float>(), a.scratch = dscratch->as<float>(), a.scratch_floats = scratch_floats;
  a.unrope_freq = dfreq->as<float>(), a.rope_dim = rope_dim;
  ASSERT_TRUE(attention_finishes_q(a));
  ASSERT_TRUE(attention_sparse(a, nullptr).is_ok());
  AttentionArgs b = a;
  b.q = dq_raw->as<float>(), b.out = dfused->as<float>(), b.q_finish = true, b.q_eps = eps;
  ASSERT_TRUE(attention_sparse(b, nullptr).is_ok());
  auto want = download_vector(dout->as<float>(), size_t(T * H * Dh), "out");
  auto got = download_vector(dfused->as<float>(), size_t(T * H * Dh), "fused");
  ASSERT_TRUE(want.is_ok() && got.is_ok());
  const double err = rel_rms(got->data(), want->data(), want->size());
  std::printf("[attention q_finish] %-32s splits %2d  rel rms vs qkv_finish + attention %.2e (tol %.0e)\n",
              name.c_str(), attention_splits(a), err, kTolQFinish);
  EXPECT_LE(err, kTolQFinish);
}

TEST(AttentionMma, FinishesItsQueries) {
  AFF_SKIP_WITHOUT_GPU();
  AFF_SEEDED_RNG(seed, rng);
  run_q_finish_case("V4 decode csa (64 x 512, rope 64)", 64, 512, 64, 1, 1000, AttnEntries::kSelected, rng);
  run_q_finish_case("V4 draft of 3, hca", 64, 512, 64, 3, 777, AttnEntries::kVisible, rng);
  run_q_finish_case("5 heads x 128, rope 64, swa", 5, 128, 64, 1, 40, AttnEntries::kNone, rng);
  run_q_finish_case("20 heads x 448, rope 32", 20, 448, 32, 2, 123, AttnEntries::kVisible, rng);
  run_q_finish_case("3 heads x 256, rope 256", 3, 256, 256, 1, 5, AttnEntries::kNone, rng);
  // Shapes the form does not take: a row across part of a warp, a rope tail of half float4s.
  AttentionArgs a;
  a.T = 1, a.Dh = 64, a.rope_dim = 64, a.unrope_freq = reinterpret_cast<const float*>(&a);
  EXPECT_FALSE(attention_finishes_q(a));
  a.Dh = 192;
  EXPECT_FALSE(attention_finishes_q(a));
  a.Dh = 512, a.rope_dim = 62;
  EXPECT_FALSE(attention_finishes_q(a));
  a.rope_dim = 64, a.T = 17;
  EXPECT_FALSE(attention_finishes_q(a));
}

// Indexer scores: sum_h w[t,h] * w_scale * relu(q[t,h] . k[j]) for the visible j.
// rope_dim > 0: the launch is given q without its RoPE (the trailing rope_dim
// dims, interleaved pairs, at each query's position) and applies it; the
// reference rotates q first. w_parts > 0: the head weights are given as that
// many partial sums (the decode mHC site's, IndexerScoreArgs::w_parts) and
// the reference's w is their sum in order.
void run_indexer_case(int64_t T, int64_t pos0, int64_t capacity, int nh, int hd, int ratio, MmaPrecision prec,
                      std::mt19937_64& rng, int rope_dim = 0, int w_parts = 0) {
  SCOPED_TRACE("T " + std::to_string(T) + " pos0 " + std::to_string(pos0) + " nh " + std::to_string(nh) +
               " rope " + std::to_string(rope_dim) + " w parts " + std::to_string(w_parts));
  std::vector<float> q = randn(size_t(T * nh * hd), rng), w = randn(size_t(T * nh), rng),
                     keys = randn(size_t(capacity * hd), rng);
  const std::vector<float> parts = randn(size_t(T * std::max(w_parts, 1) * nh), rng);
  for (int64_t t = 0; t < T && w_parts > 0; ++t)
    for (int h = 0; h < nh; ++h) {
      float s = 0.0f;
      for (int p = 0; p < w_parts; ++p) s += parts[size_t((t * w_parts + p) * nh + h)];
      w[size_t(t * nh + h)] = s;
    }
  const std::vector<float> q_given = q;
  const std::vector<float> inv_freq = rope_dim > 0 ? ref::rope_inv_freq(160000.0, rope_dim, nullptr)
                                                   : std::vector<float>{};
  for (int64_t t = 0; t < T && rope_dim > 0; ++t)
    for (int h = 0; h < nh; ++h) ref::rope_apply(q.data() + (t * nh + h) * hd + (hd - rope_dim), inv_freq, pos0 + t, false);
  auto dfreq = upload_vector(rope_dim > 0 ? inv_freq : std::vector<float>{0.0f}, "inv_freq");
  ASSERT_TRUE(dfreq.is_ok());
  const float w_scale = 1.0f / std::sqrt(float(hd)) / std::sqrt(float(nh));
  auto dq = upload_vector(q_given, "q"), dw = upload_vector(w, "w"), dk = upload_vector(keys, "keys");
  auto dparts = upload_vector(parts, "w parts");
  ASSERT_TRUE(dparts.is_ok());
  auto dstep = upload_vector(std::vector<StepInfo>{StepInfo{pos0, T}}, "step");
  auto dsc = DeviceBuffer::allocate(size_t(T * capacity) * 4, "scores");
  ASSERT_TRUE(dq.is_ok() && dw.is_ok() && dk.is_ok() && dstep.is_ok() && dsc.is_ok());
  IndexerScoreArgs a;
  a.step = dstep->as<StepInfo>(), a.q = dq->as<float>(), a.w = dw->as<float>(), a.w_scale = w_scale;
  a.keys = dk->as<float>(), a.T = T, a.capacity = capacity, a.nh = nh, a.hd = hd, a.ratio = ratio;
  a.precision = prec, a.scores = dsc->as<float>();
  if (rope_dim > 0) a.rope_freq = dfreq->as<float>(), a.rope_dim = rope_dim;
  if (w_parts > 0) a.w = nullptr, a.w_parts = dparts->as<float>(), a.w_nparts = w_parts;
  ASSERT_TRUE(indexer_scores(a, nullptr).is_ok());
  auto got = download_vector(dsc->as<float>(), size_t(T * capacity), "scores");
  ASSERT_TRUE(got.is_ok());
  // Scores are sums of signed head terms that can cancel: the error is taken
  // relative to the sum of the terms' magnitudes, which bounds the rounding.
  double err2 = 0.0, mag2 = 0.0;
  size_t n_checked = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t n_vis = std::min(capacity, (pos0 + t + 1) / ratio);
    for (int64_t j = 0; j < n_vis; ++j) {
      double s = 0.0, mag = 0.0;
      for (int h = 0; h < nh; ++h) {
        double d = 0.0;
        for (int x = 0; x < hd; ++x) d += double(q[size_t((t * nh + h) * hd + x)]) * keys[size_t(j * hd + x)];
        const double term = std::max(d, 0.0) * w[size_t(t * nh + h)] * w_scale;
        s += term;
        mag += std::abs(term);
      }
      const double e = double((*got)[size_t(t * capacity + j)]) - s;
      err2 += e * e, mag2 += mag * mag, ++n_checked;
    }
  }
  ASSERT_GT(n_checked, 0u);
  const double err = std::sqrt(err2 / std::max(mag2, 1e-300));
  const double tol = prec == MmaPrecision::kBf16x3 ? kTolBf16x3 : kTolBf16;
  std::printf("[indexer] T %3lld nh %2d capacity %5lld: rel rms %.2e (tol %.0e)\n", (long long)T, nh,
              (long long)capacity, err, tol);
  EXPECT_LE(err, tol);
}

TEST(IndexerScoresMma, MatchesReference) {
  AFF_SKIP_WITHOUT_GPU();
  AFF_SEEDED_RNG(seed, rng);
  run_indexer_case(1, 1203, 333, 64, 128, 4, MmaPrecision::kBf16x3, rng);   // decode, capacity past visible
  run_indexer_case(1, 3, 333, 64, 128, 4, MmaPrecision::kBf16x3, rng);      // decode, one entry visible
  run_indexer_case(37, 500, 140, 64, 128, 4, MmaPrecision::kBf16x3, rng);   // prefill, visibility grows
  run_indexer_case(19, 40, 30, 6, 128, 4, MmaPrecision::kBf16x3, rng);      // tiny head count
  run_indexer_case(37, 500, 140, 64, 128, 4, MmaPrecision::kBf16, rng);
  // q given without its RoPE (the decode step's stacked indexer queries).
  run_indexer_case(1, 4095, 1100, 64, 128, 4, MmaPrecision::kBf16x3, rng, 64);
  run_indexer_case(3, 77, 30, 6, 128, 4, MmaPrecision::kBf16x3, rng, 64);
  // A decode step at a long context: more key tiles than the grid's blocks,
  // so each block loops over several with its query rows staged once.
  run_indexer_case(1, 4 * 40000 - 1, 40000, 64, 128, 4, MmaPrecision::kBf16x3, rng, 64);
  // Head weights as the decode mHC site's 32 partial sums (V4's 4096 channels / 128).
  run_indexer_case(1, 4095, 1100, 64, 128, 4, MmaPrecision::kBf16x3, rng, 64, 32);
  run_indexer_case(3, 77, 30, 6, 128, 4, MmaPrecision::kBf16x3, rng, 64, 5);
}

}  // namespace
}  // namespace aff::cuda
