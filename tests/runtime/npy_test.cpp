#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "format/npy.h"

namespace aff::format {
namespace {

namespace fs = std::filesystem;

std::string temp_path(const std::string& name) {
  static std::mt19937_64 rng(std::random_device{}());
  return (fs::temp_directory_path() / ("aff_npy_" + std::to_string(rng()) + "_" + name)).string();
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

TEST(Npy, RoundTripsOddShapes) {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> nd;
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{5}, {3, 17}, {2, 3, 97}, {1, 1}, {0, 7}, {}}) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> data(static_cast<size_t>(n));
    for (float& x : data) x = nd(rng);
    const std::string path = temp_path("rt.npy");
    ASSERT_TRUE(write_npy_f32(path, shape, data).is_ok());
    const std::string bytes = slurp(path);
    // Format 1.0: the data starts on a 64-byte boundary after a '\n'-terminated header.
    const size_t header_len = size_t(uint8_t(bytes[8])) | size_t(uint8_t(bytes[9])) << 8;
    EXPECT_EQ((10 + header_len) % 64, 0u);
    EXPECT_EQ(bytes[10 + header_len - 1], '\n');
    auto r = read_npy_f32(path);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_EQ(r.value().shape, shape);
    EXPECT_EQ(r.value().data, data);
    fs::remove(path);
  }
}

TEST(Npy, WritesTheHeaderNumpyWrites) {
  const std::string path = temp_path("hdr.npy");
  const std::vector<float> data(6, 1.5f);
  const int64_t shape2[2] = {2, 3};
  ASSERT_TRUE(write_npy_f32(path, shape2, data).is_ok());
  EXPECT_NE(slurp(path).find("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"), std::string::npos);
  const int64_t shape1[1] = {6};
  ASSERT_TRUE(write_npy_f32(path, shape1, data).is_ok());
  EXPECT_NE(slurp(path).find("'shape': (6,), }"), std::string::npos);
  EXPECT_FALSE(write_npy_f32(path, shape2, std::vector<float>(5)).is_ok());
  fs::remove(path);
}

std::string npy_bytes(int major, const std::string& dict, size_t n_floats) {
  std::string header = dict;
  const size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64) header += ' ';
  header += '\n';
  std::string b = "\x93NUMPY";
  b += char(major);
  b += char(0);
  b += char(header.size() & 0xff);
  b += char(header.size() >> 8);
  if (major != 1) b += std::string(2, '\0');
  b += header;
  b += std::string(n_floats * 4, '\x01');
  return b;
}

TEST(Npy, ReadsVersionTwoHeaders) {
  const std::string path = temp_path("v2.npy");
  spit(path, npy_bytes(2, "{'descr':'<f4','fortran_order':False,'shape':(4,5)}", 20));
  auto r = read_npy_f32(path);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r.value().shape, (std::vector<int64_t>{4, 5}));
  fs::remove(path);
}

TEST(Npy, RejectsWhatItCannotRead) {
  struct Case {
    std::string bytes;
    std::string must_contain;
  };
  const std::string good = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  const std::vector<Case> cases = {
      {"not an npy file at all", "bad magic"},
      {npy_bytes(1, good, 5), "needs 24 data bytes but the file has 20"},
      {npy_bytes(1, good, 7), "needs 24 data bytes but the file has 28"},
      {npy_bytes(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }", 12), "'<f8'"},
      {npy_bytes(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 6), "Fortran"},
      {npy_bytes(1, "{'descr': '<f4', 'shape': (2, 3), }", 6), "lacks"},
      {npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }", 6), "malformed shape"},
      {npy_bytes(1, "['descr']", 6), "not a dict"},
      {npy_bytes(9, good, 6), "version 9"},
      {npy_bytes(1, good, 6).substr(0, 40), "header runs past the end"},
  };
  for (const Case& c : cases) {
    const std::string path = temp_path("bad.npy");
    spit(path, c.bytes);
    auto r = read_npy_f32(path);
    ASSERT_FALSE(r.is_ok()) << c.must_contain;
    EXPECT_NE(r.status().message().find(c.must_contain), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().message();
    fs::remove(path);
  }
  EXPECT_EQ(read_npy_f32(temp_path("missing.npy")).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace aff::format
