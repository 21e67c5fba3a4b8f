// ref::linear for every stored weight format against an explicit
// dequantise-then-matmul in double, on fresh random data and odd sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "backend/ref/linear.h"
#include "core/dtype.h"

namespace aff::ref {
namespace {

using dsv4::Linear;
using dsv4::WeightFormat;

struct Stored {
  std::vector<uint8_t> w, s;
  Linear lin;
  std::vector<double> dense;  // [out, in] dequantised independently, in double
};

TensorView view_of(std::vector<uint8_t>& b, DType dt, std::vector<int64_t> shape) {
  TensorView t;
  t.name.assign(1, 'w');
  t.dtype = dt;
  t.shape = std::move(shape);
  t.data = b.data();
  t.nbytes = b.size();
  return t;
}

// Random codes straight in the stored format (never NaN codes), plus the
// dequantised matrix computed here from the format's definition.
Stored make(WeightFormat f, int64_t out, int64_t in, int block, std::mt19937_64& rng) {
  Stored s;
  s.lin.format = f;
  s.lin.out = out;
  s.lin.in = in;
  s.lin.block = block;
  s.dense.assign(size_t(out * in), 0.0);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<int> exp(120, 130);  // E8M0 scales 2^-7 .. 2^3
  std::normal_distribution<float> nd(0.0f, 1.0f);
  switch (f) {
    case WeightFormat::kF32: {
      s.w.resize(size_t(out * in * 4));
      float* p = reinterpret_cast<float*>(s.w.data());
      for (int64_t i = 0; i < out * in; ++i) s.dense[size_t(i)] = p[i] = nd(rng);
      s.lin.weight = view_of(s.w, DType::kF32, {out, in});
      break;
    }
    case WeightFormat::kBF16:
    case WeightFormat::kF16: {
      s.w.resize(size_t(out * in * 2));
      uint16_t* p = reinterpret_cast<uint16_t*>(s.w.data());
      const bool bf = f == WeightFormat::kBF16;
      for (int64_t i = 0; i < out * in; ++i) {
        const float v = nd(rng);
        p[i] = bf ? f32_to_bf16(v) : f32_to_f16(v);
        s.dense[size_t(i)] = bf ? bf16_to_f32(p[i]) : f16_to_f32(p[i]);
      }
      s.lin.weight = view_of(s.w, bf ? DType::kBF16 : DType::kF16, {out, in});
      break;
    }
    case WeightFormat::kFP8Block: {
      const int64_t so = (out + block - 1) / block, si = (in + block - 1) / block;
      s.w.resize(size_t(out * in));
      s.s.resize(size_t(so * si));
      for (auto& b : s.s) b = uint8_t(exp(rng));
      for (int64_t r = 0; r < out; ++r)
        for (int64_t c = 0; c < in; ++c) {
          uint8_t b;
          do b = uint8_t(byte(rng)); while ((b & 0x7f) == 0x7f);
          s.w[size_t(r * in + c)] = b;
          const double scale = std::ldexp(1.0, int(s.s[size_t((r / block) * si + c / block)]) - 127);
          s.dense[size_t(r * in + c)] = double(e4m3_to_f32(b)) * scale;
        }
      s.lin.weight = view_of(s.w, DType::kF8E4M3, {out, in});
      s.lin.scale = view_of(s.s, DType::kF8E8M0, {so, si});
      break;
    }
    case WeightFormat::kMXFP4: {
      s.w.resize(size_t(out * in / 2));
      s.s.resize(size_t(out * in / 32));
      for (auto& b : s.w) b = uint8_t(byte(rng));
      for (auto& b : s.s) b = uint8_t(exp(rng));
      const double grid[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
      for (int64_t r = 0; r < out; ++r)
        for (int64_t c = 0; c < in; ++c) {
          const uint8_t b = s.w[size_t((r * in + c) / 2)];
          const int code = (c % 2 == 0) ? (b & 0xf) : (b >> 4);
          const double v = (code & 8 ? -1.0 : 1.0) * grid[code & 7];
          s.dense[size_t(r * in + c)] =
              v * std::ldexp(1.0, int(s.s[size_t(r * (in / 32) + c / 32)]) - 127);
        }
      s.lin.weight = view_of(s.w, DType::kI8, {out, in / 2});
      s.lin.scale = view_of(s.s, DType::kF8E8M0, {out, in / 32});
      break;
    }
    case WeightFormat::kGgml:  // ggml block rows are the quant codec's to test
      ADD_FAILURE() << "make() does not generate ggml weights";
      break;
  }
  return s;
}

void check_linear(WeightFormat f, int64_t out, int64_t in, int block, int64_t T) {
  std::mt19937_64 rng(std::random_device{}());
  Stored s = make(f, out, in, block, rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(T * in));
  for (float& v : x) v = nd(rng);
  std::vector<float> y(size_t(T * out), std::nanf(""));  // poisoned
  linear(s.lin, x.data(), T, y.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t r = 0; r < out; ++r) {
      double want = 0.0, mag = 0.0;
      for (int64_t i = 0; i < in; ++i) {
        want += s.dense[size_t(r * in + i)] * x[size_t(t * in + i)];
        mag += std::fabs(s.dense[size_t(r * in + i)] * x[size_t(t * in + i)]);
      }
      ASSERT_NEAR(y[size_t(t * out + r)], want, 1e-5 * mag + 1e-30)
          << "format " << int(f) << " t " << t << " row " << r;
    }
}

TEST(RefLinear, F32) { check_linear(WeightFormat::kF32, 37, 95, 128, 3); }
TEST(RefLinear, BF16) { check_linear(WeightFormat::kBF16, 17, 301, 128, 5); }
TEST(RefLinear, F16) { check_linear(WeightFormat::kF16, 9, 33, 128, 2); }
// Ragged edges: out and in not multiples of the block.
TEST(RefLinear, FP8BlockRagged) { check_linear(WeightFormat::kFP8Block, 97, 301, 128, 4); }
TEST(RefLinear, FP8SmallBlock) { check_linear(WeightFormat::kFP8Block, 45, 70, 32, 7); }
TEST(RefLinear, MXFP4) { check_linear(WeightFormat::kMXFP4, 29, 192, 128, 3); }
TEST(RefLinear, SingleToken) { check_linear(WeightFormat::kMXFP4, 130, 64, 128, 1); }

TEST(RefLinear, RowsWithStrides) {
  std::mt19937_64 rng(std::random_device{}());
  const int64_t out = 50, in = 64, T = 3, r0 = 13, r1 = 41, ldx = 100, ldy = 35;
  Stored s = make(WeightFormat::kFP8Block, out, in, 32, rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(T * ldx));
  for (float& v : x) v = nd(rng);
  std::vector<float> y(size_t(T * ldy), -777.0f);
  linear_rows(s.lin, r0, r1, x.data(), ldx, T, y.data(), ldy);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t r = r0; r < r1; ++r) {
      double want = 0.0;
      for (int64_t i = 0; i < in; ++i) want += s.dense[size_t(r * in + i)] * x[size_t(t * ldx + i)];
      EXPECT_NEAR(y[size_t(t * ldy + r - r0)], want, 1e-4 * (1.0 + std::fabs(want)));
    }
    for (int64_t c = r1 - r0; c < ldy; ++c) EXPECT_EQ(y[size_t(t * ldy + c)], -777.0f);  // untouched
  }
}

TEST(RefLinear, DequantRowIsExact) {
  std::mt19937_64 rng(std::random_device{}());
  for (WeightFormat f : {WeightFormat::kFP8Block, WeightFormat::kMXFP4, WeightFormat::kBF16}) {
    Stored s = make(f, 33, 96, 32, rng);
    std::vector<float> row(96);
    for (int64_t r = 0; r < 33; ++r) {
      linear_dequant_row(s.lin, r, row.data());
      for (int64_t i = 0; i < 96; ++i) ASSERT_EQ(double(row[size_t(i)]), s.dense[size_t(r * 96 + i)]);
    }
  }
}

}  // namespace
}  // namespace aff::ref
