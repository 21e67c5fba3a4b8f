// Lattice-codebook i-quant encoders (IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ1_M): error budgets
// on fresh random rows with and without an importance vector, importance actually used,
// every block decoding to exactly what the encoder reports, degenerate blocks, and output
// that does not depend on threads or repetition. Decoding these blocks is held bit-exact
// to gguf-py by dequant_vs_gguf_py_test, so "decodes to the encoder's reconstruction"
// here also means "gguf-py and ggml read what the encoder meant".
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <ctime>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "quant/codec.h"
#include "quant/quantizer/iq_grid_index.h"
#include "quant/quantizer/iq_quantize.h"

namespace aff::quant {
namespace {

// Relative RMS error budgets ||x - deq(q(x))|| / ||x|| on Gaussian rows with 0.5% outliers
// (x8), pooled over 72 rows, unweighted and (with a random importance vector given to the
// encoder) importance-weighted. Measured over 12 runs (min..max): IQ3_XXS .197-.207 /
// .104-.118, IQ2_XS .319-.332 / .185-.197, IQ2_XXS .382-.390 / .227-.242, IQ1_M .433-.439 /
// .230-.253, IQ1_S .500-.510 / .306-.328. Budgets sit ~8% above the worst run. For scale:
// Q3_K (3.44 bpw) reaches .17 and Q2_K (2.63 bpw) .28 on the same rows; the i-quants pay
// for 0.4-1.1 fewer bits per weight, and their order IQ3_XXS < IQ2_XS < IQ2_XXS < IQ1_M <
// IQ1_S is the order of their bits per weight (3.06, 2.31, 2.06, 1.75, 1.56).
struct Budget {
  GgmlType type;
  double plain;     // unweighted relative RMS error
  double weighted;  // importance-weighted, with the importance given to the encoder
};
constexpr Budget kBudgets[] = {
    {GgmlType::kIQ3_XXS, 0.224, 0.128}, {GgmlType::kIQ2_XS, 0.358, 0.213}, {GgmlType::kIQ2_XXS, 0.421, 0.262},
    {GgmlType::kIQ1_M, 0.474, 0.273},   {GgmlType::kIQ1_S, 0.551, 0.354},
};

std::vector<float> random_row(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  const float scale = 0.01f + uni(rng) * 0.2f;
  for (auto& v : x) {
    v = normal(rng) * scale;
    if (uni(rng) < 0.005f) v *= 8.0f;  // occasional outliers, as in real weights
  }
  return x;
}

// An imatrix-like importance row: mostly O(1) with a tenth of hot columns.
std::vector<float> random_importance(std::mt19937& rng, int64_t n) {
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  std::vector<float> imp(static_cast<size_t>(n));
  for (auto& w : imp) w = uni(rng) < 0.1f ? 50.0f : 0.05f + uni(rng);
  return imp;
}

std::vector<uint8_t> quantize(GgmlType type, const std::vector<float>& x, const std::vector<float>* imp) {
  std::vector<uint8_t> q(size_t(*ggml_row_bytes(type, int64_t(x.size()))), 0xCD);  // poisoned
  const Status st = quantize_row(type, x, q, imp ? std::span<const float>(*imp) : std::span<const float>());
  EXPECT_TRUE(st.is_ok()) << st.message();
  return q;
}

std::vector<float> dequantize(GgmlType type, const std::vector<uint8_t>& q, size_t n) {
  std::vector<float> y(n, std::nanf(""));
  EXPECT_TRUE(dequantize_row(type, q, y).is_ok());
  return y;
}

// The encoder called directly, for its reconstruction. recon: [x.size()].
std::vector<uint8_t> quantize_with_recon(GgmlType type, const std::vector<float>& x, const float* imp,
                                         std::vector<float>* recon) {
  std::vector<uint8_t> q(size_t(*ggml_row_bytes(type, int64_t(x.size()))), 0xCD);
  recon->assign(x.size(), std::nanf(""));
  const int64_t n = int64_t(x.size());
  float* r = recon->data();
  switch (type) {
    case GgmlType::kIQ2_XXS: quantize_row_iq2_xxs(x.data(), reinterpret_cast<BlockIq2Xxs*>(q.data()), n, imp, r); break;
    case GgmlType::kIQ2_XS: quantize_row_iq2_xs(x.data(), reinterpret_cast<BlockIq2Xs*>(q.data()), n, imp, r); break;
    case GgmlType::kIQ3_XXS: quantize_row_iq3_xxs(x.data(), reinterpret_cast<BlockIq3Xxs*>(q.data()), n, imp, r); break;
    case GgmlType::kIQ1_S: quantize_row_iq1_s(x.data(), reinterpret_cast<BlockIq1S*>(q.data()), n, imp, r); break;
    case GgmlType::kIQ1_M: quantize_row_iq1_m(x.data(), reinterpret_cast<BlockIq1M*>(q.data()), n, imp, r); break;
    default: ADD_FAILURE() << "not an i-quant encoder";
  }
  return q;
}

class IqQuant : public ::testing::TestWithParam<Budget> {};

TEST_P(IqQuant, RoundTripWithinBudget) {
  const Budget c = GetParam();
  std::mt19937 rng(std::random_device{}());
  // Pooled over many rows so that the budget measures the encoder, not one row's luck;
  // row lengths are odd multiples of the super-block.
  double num = 0, den = 0, wnum = 0, wden = 0;
  for (const int64_t blocks : {1, 3, 17}) {
    for (int row = 0; row < 24; ++row) {
      const auto x = random_row(rng, 256 * blocks);
      const auto y = dequantize(c.type, quantize(c.type, x, nullptr), x.size());
      const auto imp = random_importance(rng, int64_t(x.size()));
      const auto yw = dequantize(c.type, quantize(c.type, x, &imp), x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_TRUE(std::isfinite(y[i]) && std::isfinite(yw[i])) << i;
        num += double(x[i] - y[i]) * double(x[i] - y[i]);
        den += double(x[i]) * double(x[i]);
        wnum += imp[i] * double(x[i] - yw[i]) * double(x[i] - yw[i]);
        wden += imp[i] * double(x[i]) * double(x[i]);
      }
    }
  }
  const double err = std::sqrt(num / den), werr = std::sqrt(wnum / wden);
  EXPECT_LE(err, c.plain) << ggml_type_name(c.type);
  EXPECT_LE(werr, c.weighted) << ggml_type_name(c.type);
  std::printf("  %-7s rel RMS error %.4f (budget %.3f), weighted %.4f (budget %.3f)\n",
              std::string(ggml_type_name(c.type)).c_str(), err, c.plain, werr, c.weighted);
}

// Told which columns matter, the encoder must trade error away from them.
TEST_P(IqQuant, ImportanceLowersWeightedError) {
  const Budget c = GetParam();
  std::mt19937 rng(std::random_device{}());
  auto weighted_error = [](const std::vector<float>& x, const std::vector<float>& y, const std::vector<float>& w) {
    double num = 0, den = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      num += w[i] * double(x[i] - y[i]) * double(x[i] - y[i]);
      den += w[i] * double(x[i]) * double(x[i]);
    }
    return std::sqrt(num / den);
  };
  double plain = 0, weighted = 0;
  for (int trial = 0; trial < 4; ++trial) {
    const auto x = random_row(rng, 256 * 16);
    const auto imp = random_importance(rng, int64_t(x.size()));
    plain += weighted_error(x, dequantize(c.type, quantize(c.type, x, nullptr), x.size()), imp);
    weighted += weighted_error(x, dequantize(c.type, quantize(c.type, x, &imp), x.size()), imp);
  }
  // With a tenth of the columns 50x hotter the weighted error falls to 0.55-0.65 of the
  // importance-blind encoder's (see the budgets above); 0.85 leaves room for noise.
  EXPECT_LT(weighted, plain * 0.85) << ggml_type_name(c.type);
}

// Every bit the encoder writes must mean to the decoder what the encoder meant: the
// reconstruction it computes from its own choices equals the decoded row bit for bit.
TEST_P(IqQuant, BlocksDecodeToTheEncodersReconstruction) {
  const Budget c = GetParam();
  std::mt19937 rng(std::random_device{}());
  std::vector<std::vector<float>> rows;
  for (int i = 0; i < 6; ++i) rows.push_back(random_row(rng, 256 * 5));
  // Awkward blocks: zeros next to data, one huge value, values near the f16 floor, all
  // negative, alternating signs.
  std::vector<float> odd = random_row(rng, 256 * 5);
  std::fill(odd.begin(), odd.begin() + 40, 0.0f);
  odd[300] = 30.0f;
  for (int i = 512; i < 768; ++i) odd[size_t(i)] *= 1e-6f;
  for (int i = 768; i < 1024; ++i) odd[size_t(i)] = -std::fabs(odd[size_t(i)]);
  for (int i = 1024; i < 1280; ++i) odd[size_t(i)] = (i % 2 ? 0.1f : -0.1f);
  rows.push_back(odd);
  for (const auto& x : rows) {
    for (const bool with_imp : {false, true}) {
      const auto imp = random_importance(rng, int64_t(x.size()));
      std::vector<float> recon;
      const auto q = quantize_with_recon(c.type, x, with_imp ? imp.data() : nullptr, &recon);
      const auto y = dequantize(c.type, q, x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_EQ(bits_from_f32(recon[i]), bits_from_f32(y[i]))
            << ggml_type_name(c.type) << " element " << i << ": encoder " << recon[i] << ", decoder " << y[i];
      }
      // The direct call writes the same bytes as the codec's dispatch.
      EXPECT_EQ(q, quantize(c.type, x, with_imp ? &imp : nullptr));
    }
  }
}

TEST_P(IqQuant, DegenerateBlocks) {
  const Budget c = GetParam();
  const std::vector<float> zeros(512, 0.0f);
  for (float v : dequantize(c.type, quantize(c.type, zeros, nullptr), zeros.size())) ASSERT_EQ(v, 0.0f);
  // A constant block: every format has an entry of equal values (IQ1's ternary ones plus
  // the shift), so the reconstruction must land close.
  const std::vector<float> constant(256, -0.75f);
  for (float v : dequantize(c.type, quantize(c.type, constant, nullptr), constant.size())) {
    ASSERT_NEAR(v, -0.75f, 0.75f * 0.15f) << ggml_type_name(c.type);
  }
  // All-zero importance is no information, not "nothing matters": still a fair fit.
  std::mt19937 rng(7);
  const auto x = random_row(rng, 256);
  const std::vector<float> no_imp(256, 0.0f);
  const auto y = dequantize(c.type, quantize(c.type, x, &no_imp), x.size());
  const auto y_plain = dequantize(c.type, quantize(c.type, x, nullptr), x.size());
  EXPECT_EQ(y, y_plain);
}

// Same input, same bytes: repeated, and with rows quantised on several threads at once
// (the codebook indexes are shared; nothing else is).
TEST_P(IqQuant, DeterministicAndThreadIndependent) {
  const Budget c = GetParam();
  std::mt19937 rng(std::random_device{}());
  constexpr int kRows = 8;
  std::vector<std::vector<float>> rows, imps;
  for (int i = 0; i < kRows; ++i) {
    rows.push_back(random_row(rng, 256 * 3));
    imps.push_back(random_importance(rng, 256 * 3));
  }
  std::vector<std::vector<uint8_t>> serial, parallel(kRows);
  for (int i = 0; i < kRows; ++i) serial.push_back(quantize(c.type, rows[size_t(i)], i % 2 ? &imps[size_t(i)] : nullptr));
  std::vector<std::thread> threads;
  for (int i = 0; i < kRows; ++i) {
    threads.emplace_back([&, i] {
      std::vector<uint8_t> q(serial[size_t(i)].size());
      const auto& imp = imps[size_t(i)];
      if (quantize_row(c.type, rows[size_t(i)], q, i % 2 ? std::span<const float>(imp) : std::span<const float>())
              .is_ok()) {
        parallel[size_t(i)] = std::move(q);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kRows; ++i) {
    EXPECT_EQ(serial[size_t(i)], parallel[size_t(i)]) << "row " << i;
    EXPECT_EQ(serial[size_t(i)], quantize(c.type, rows[size_t(i)], i % 2 ? &imps[size_t(i)] : nullptr));
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, IqQuant, ::testing::ValuesIn(kBudgets),
                         [](const auto& info) { return std::string(ggml_type_name(info.param.type)); });

// The search tables: each codebook entry is found at its own lattice point; every point
// off the codebook lists its nearest entries, nearest first, and no other entry is nearer
// than the last one listed.
TEST(IqGridIndex, EntriesAtTheirKeysAndNeighboursNearest) {
  for (const IqGrid g : {IqGrid::kIq2xxs, IqGrid::kIq2xs, IqGrid::kIq3xxs, IqGrid::kIq1s}) {
    const IqGridIndex& index = IqGridIndex::get(g);
    for (int e = 0; e < index.n_entries(); ++e) ASSERT_EQ(index.entry_at(index.key_of(index.entry(e))), e);
    int keys = 1, off_grid = 0;
    for (int j = 0; j < index.dims(); ++j) keys *= index.n_levels();
    for (int key = 0; key < keys; ++key) {
      float point[IqGridIndex::kMaxDims];
      for (int j = 0, k = key; j < index.dims(); ++j, k /= index.n_levels()) point[j] = index.level(k % index.n_levels());
      ASSERT_EQ(index.key_of(point), key);
      const auto nb = index.neighbours(key);
      if (index.entry_at(key) >= 0) {
        EXPECT_TRUE(nb.empty());
        continue;
      }
      ++off_grid;
      ASSERT_FALSE(nb.empty()) << "key " << key;
      auto dist2 = [&](int e) {
        float d = 0;
        for (int j = 0; j < index.dims(); ++j) d += (point[j] - index.entry(e)[j]) * (point[j] - index.entry(e)[j]);
        return d;
      };
      for (size_t i = 1; i < nb.size(); ++i) ASSERT_LE(dist2(nb[i - 1]), dist2(nb[i]));
      if (key % 97 == 0) {  // the exhaustive check is slow for 2048 entries; sample keys
        std::vector<bool> listed(size_t(index.n_entries()), false);
        for (uint16_t e : nb) listed[e] = true;
        for (int e = 0; e < index.n_entries(); ++e) {
          if (!listed[size_t(e)]) {
            ASSERT_GT(dist2(e), dist2(nb.back())) << "key " << key << " entry " << e;
          }
        }
      }
    }
    EXPECT_GT(off_grid, 0);
  }
}

// key_of between the lattice points: each digit is the level nearest the coordinate,
// the lower one at an exact midpoint, the end levels beyond the ends.
TEST(IqGridIndex, KeyOfRoundsEachCoordinateToItsNearestLevel) {
  std::mt19937 rng(std::random_device{}());
  for (const IqGrid g : {IqGrid::kIq2xxs, IqGrid::kIq3xxs, IqGrid::kIq1s}) {
    const IqGridIndex& index = IqGridIndex::get(g);
    const float lo = index.level(0), hi = index.top_level(), span = hi - lo;
    std::uniform_real_distribution<float> uni(lo - 0.3f * span, hi + 0.3f * span);
    std::uniform_int_distribution<int> pick(0, index.n_levels() - 2);
    for (int trial = 0; trial < 2000; ++trial) {
      float t[IqGridIndex::kMaxDims];
      for (int j = 0; j < index.dims(); ++j) {
        const int l = pick(rng);  // every fourth coordinate exactly on a midpoint
        t[j] = trial % 4 == j % 4 ? 0.5f * (index.level(l) + index.level(l + 1)) : uni(rng);
      }
      int want = 0;
      for (int j = index.dims() - 1; j >= 0; --j) {
        int nearest = 0;
        for (int l = 1; l < index.n_levels(); ++l) {
          if (std::fabs(t[j] - index.level(l)) < std::fabs(t[j] - index.level(nearest))) nearest = l;
        }
        want = want * index.n_levels() + nearest;
      }
      ASSERT_EQ(index.key_of(t), want) << "grid " << int(g) << " trial " << trial;
    }
  }
}

// Encoder speed, one thread, per type (run with --gtest_also_run_disabled_tests): fresh
// Gaussian rows as above, half with an importance vector, timed by the thread's CPU
// clock after a warm-up that builds the search tables. Also Q2_K (the q2 recipe's down
// projections) and what V4-Flash's q2 experts would take on 16 threads at these rates
// (43 layers x 256 experts x 2048 x 4096: gate/up IQ2_XXS, down Q2_K; linear scaling).
TEST(IqQuantize, DISABLED_EncodeSpeed) {
  std::mt19937 rng(std::random_device{}());
  constexpr int64_t kRowLen = 4096;
  std::vector<std::vector<float>> rows, imps;
  for (int i = 0; i < 64; ++i) {
    rows.push_back(random_row(rng, kRowLen));
    imps.push_back(random_importance(rng, kRowLen));
  }
  auto thread_seconds = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  };
  std::map<GgmlType, double> rate;  // weights per second
  for (const GgmlType type : {GgmlType::kIQ2_XXS, GgmlType::kIQ2_XS, GgmlType::kIQ3_XXS, GgmlType::kIQ1_S,
                              GgmlType::kIQ1_M, GgmlType::kQ2_K}) {
    quantize(type, rows[0], nullptr);  // builds the tables
    double seconds = 0;
    int64_t weights = 0;
    while (seconds < 1.0) {
      const double t0 = thread_seconds();
      for (size_t i = 0; i < rows.size(); ++i) quantize(type, rows[i], i % 2 ? &imps[i] : nullptr);
      seconds += thread_seconds() - t0;
      weights += int64_t(rows.size()) * kRowLen;
    }
    rate[type] = double(weights) / seconds;
    std::printf("  %-7s %6.2f M weights/s per thread\n", std::string(ggml_type_name(type)).c_str(), rate[type] / 1e6);
  }
  const double expert_weights = 43.0 * 256 * 2048 * 4096;
  const double hours = (2 * expert_weights / rate[GgmlType::kIQ2_XXS] + expert_weights / rate[GgmlType::kQ2_K]) / 16 / 3600;
  std::printf("  V4-Flash q2 experts on 16 threads: %.2f h\n", hours);
}

TEST(IqQuantize, TablesAreIdenticalWhenBuiltConcurrently) {
  // The first use of a table may race with another thread's; static initialisation makes
  // one of them build it. Both must see the same, complete table.
  std::vector<int> seen(4, -1);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] { seen[size_t(i)] = IqGridIndex::get(IqGrid::kIq1s).n_entries(); });
  }
  for (auto& t : threads) t.join();
  for (int v : seen) EXPECT_EQ(v, 2048);
}

}  // namespace
}  // namespace aff::quant
