// The safetensors reader against good files (our writer's and the reference
// Python library's) and against every kind of malformed file we know of.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "format/mapped_file.h"
#include "format/safetensors.h"
#include "format/safetensors_writer.h"

namespace aff::format {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> random_bytes(std::mt19937_64& rng, size_t n) {
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = uint8_t(rng());
  return b;
}

// An image from a raw header (padded to 8) and `data_bytes` of data.
std::vector<uint8_t> raw_image(std::string header, size_t data_bytes) {
  while (header.size() % 8) header.push_back(' ');
  const uint64_t n = header.size();
  std::vector<uint8_t> out(8 + header.size() + data_bytes);
  for (int i = 0; i < 8; ++i) out[size_t(i)] = uint8_t(n >> (8 * i));
  std::memcpy(out.data() + 8, header.data(), header.size());
  for (size_t i = 0; i < data_bytes; ++i) out[8 + header.size() + i] = uint8_t(i * 13 + 1);
  return out;
}

Status parse_status(const std::vector<uint8_t>& img, const std::string& file = "hostile.safetensors") {
  return parse_safetensors(img.data(), img.size(), file).status();
}

void expect_error(const Status& s, std::initializer_list<const char*> needles) {
  ASSERT_FALSE(s.is_ok());
  for (const char* n : needles) EXPECT_NE(s.message().find(n), std::string::npos) << s.message() << "\n  lacks: " << n;
}

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("aff_format_" + std::to_string(std::random_device{}()) + "_" +
                                         std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

TEST(Safetensors, WriterRoundTripsOddShapesAndEveryDtype) {
  std::mt19937_64 rng(std::random_device{}());
  struct T {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
  };
  const std::vector<T> specs = {
      {"a.f32", DType::kF32, {17, 3}},  {"b.bf16", DType::kBF16, {97}},     {"c.fp8", DType::kF8E4M3, {5, 7}},
      {"c.scale", DType::kF8E8M0, {1, 1}}, {"d.i8", DType::kI8, {3, 16}},   {"e.i64", DType::kI64, {1}},
      {"f.i32", DType::kI32, {4095}},   {"g.f16", DType::kF16, {2, 1, 3}}, {"h.bool", DType::kBool, {1}},
      {"i.u8", DType::kU8, {0, 9}},     {"j.scalar", DType::kF32, {}}};
  SafetensorsWriter w;
  std::map<std::string, std::vector<uint8_t>> want;
  for (const T& s : specs) {
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    auto bytes = random_bytes(rng, size_t(n) * size_t(dtype_size(s.dtype)));
    want[s.name] = bytes;
    w.add(s.name, s.dtype, s.shape, bytes);
  }
  w.set_metadata("origin", "test");
  auto img = w.serialize();
  ASSERT_TRUE(img.is_ok()) << img.status().message();
  auto f = parse_safetensors(img->data(), img->size(), "mem.safetensors");
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  EXPECT_EQ(f->metadata.at("origin"), "test");
  EXPECT_EQ(f->metadata.at("format"), "pt");
  ASSERT_EQ(f->tensors.size(), specs.size());
  for (const T& s : specs) {
    const TensorView* v = f->find(s.name);
    ASSERT_NE(v, nullptr) << s.name;
    EXPECT_EQ(v->dtype, s.dtype);
    EXPECT_EQ(v->shape, s.shape);
    EXPECT_EQ(v->file, "mem.safetensors");
    ASSERT_EQ(v->nbytes, want[s.name].size());
    EXPECT_EQ(0, v->nbytes == 0 ? 0 : std::memcmp(v->data, want[s.name].data(), v->nbytes)) << s.name;
    // The writer orders by element size so every view is naturally aligned.
    EXPECT_EQ((v->data - img->data()) % dtype_size(s.dtype), 0) << s.name;
  }
  EXPECT_EQ(f->find("absent"), nullptr);
}

TEST(Safetensors, ReadsFileWrittenByReferencePythonLibrary) {
  auto f = open_safetensors(std::string(AFFINITY_TEST_DATA) + "/loader/python_written.safetensors");
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  const SafetensorsFile& st = **f;
  EXPECT_EQ(st.metadata.at("writer"), "python-safetensors");
  ASSERT_EQ(st.tensors.size(), 12u);

  const TensorView* f32 = st.find("f32.odd");
  ASSERT_NE(f32, nullptr);
  EXPECT_EQ(f32->shape, (std::vector<int64_t>{17, 3}));
  for (int i = 0; i < 51; ++i) EXPECT_EQ(f32->as<float>()[i], float(i) * 0.25f - 3.0f);

  const TensorView* bf = st.find("bf16.row");
  ASSERT_EQ(bf->dtype, DType::kBF16);
  for (int i = 0; i < 97; ++i) {
    uint16_t h;
    std::memcpy(&h, bf->data + 2 * i, 2);
    EXPECT_EQ(bf16_to_f32(h), float(i % 17 - 8));
  }
  const TensorView* f16 = st.find("f16.vec");
  for (int i = 0; i < 5; ++i) {
    uint16_t h;
    std::memcpy(&h, f16->data + 2 * i, 2);
    EXPECT_EQ(f16_to_f32(h), float(i) / 8.0f);
  }
  const TensorView* fp8 = st.find("fp8.w");
  ASSERT_EQ(fp8->dtype, DType::kF8E4M3);
  EXPECT_EQ(fp8->shape, (std::vector<int64_t>{4, 7}));
  for (int i = 0; i < 28; ++i) EXPECT_EQ(fp8->data[i], uint8_t((i * 7) % 126));
  const TensorView* sc = st.find("fp8.scale");
  ASSERT_EQ(sc->dtype, DType::kF8E8M0);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(sc->data[i], uint8_t(120 + i % 10));
  const TensorView* i8 = st.find("fp4.packed");
  ASSERT_EQ(i8->dtype, DType::kI8);
  for (int i = 0; i < 48; ++i) EXPECT_EQ(int8_t(i8->data[i]), int8_t((i * 5) % 256 - 128));
  const TensorView* i64 = st.find("ids.i64");
  for (int i = 0; i < 9; ++i) EXPECT_EQ(i64->as<int64_t>()[i], int64_t(i) * 1000003 - 5);
  const TensorView* i32 = st.find("ids.i32");
  for (int i = 0; i < 4; ++i) EXPECT_EQ(i32->as<int32_t>()[i], -7 * i);
  const TensorView* bo = st.find("mask.bool");
  ASSERT_EQ(bo->dtype, DType::kBool);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(bo->data[i], i % 3 == 0 ? 1 : 0);
  const TensorView* u8 = st.find("bytes.u8");
  for (int i = 0; i < 11; ++i) EXPECT_EQ(u8->data[i], uint8_t(i * 23 % 256));
  const TensorView* scalar = st.find("scalar.f32");
  EXPECT_TRUE(scalar->shape.empty());
  EXPECT_EQ(scalar->as<float>()[0], 2.5f);
  const TensorView* empty = st.find("empty.f32");
  EXPECT_EQ(empty->numel(), 0);
  EXPECT_EQ(empty->nbytes, 0u);
}

TEST(SafetensorsHostile, TooSmallForHeaderLength) {
  std::vector<uint8_t> img = {1, 2, 3};
  expect_error(parse_status(img), {"hostile.safetensors", "too small"});
}

TEST(SafetensorsHostile, HeaderLengthBeyondFile) {
  auto img = raw_image(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4);
  const uint64_t bogus = img.size();  // more than what follows the length field
  for (int i = 0; i < 8; ++i) img[size_t(i)] = uint8_t(bogus >> (8 * i));
  expect_error(parse_status(img), {"hostile.safetensors", "header length", "past the end"});
}

TEST(SafetensorsHostile, AbsurdHeaderLength) {
  auto img = raw_image(R"({})", 0);
  const uint64_t bogus = uint64_t(1) << 62;
  for (int i = 0; i < 8; ++i) img[size_t(i)] = uint8_t(bogus >> (8 * i));
  expect_error(parse_status(img), {"hostile.safetensors", "exceeds"});
}

TEST(SafetensorsHostile, BadJsonHeader) {
  expect_error(parse_status(raw_image(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4])", 4)),
               {"hostile.safetensors", "not valid JSON"});
  expect_error(parse_status(raw_image(R"([1, 2, 3])", 0)), {"hostile.safetensors", "JSON object"});
}

TEST(SafetensorsHostile, OverlappingRangesNameBothTensors) {
  auto img = raw_image(R"({"first":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("second":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12);
  expect_error(parse_status(img), {"hostile.safetensors", "'second'", "overlap", "'first'"});
}

TEST(SafetensorsHostile, HoleAndTrailingBytes) {
  expect_error(parse_status(raw_image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})", 20)),
               {"hostile.safetensors", "'b'", "hole"});
  expect_error(parse_status(raw_image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 13)),
               {"hostile.safetensors", "data section is 13 bytes"});
}

TEST(SafetensorsHostile, OffsetsEndBeforeBegin) {
  expect_error(parse_status(raw_image(R"({"z":{"dtype":"U8","shape":[0],"data_offsets":[5,3]}})", 8)),
               {"hostile.safetensors", "'z'", "end before"});
}

TEST(SafetensorsHostile, UnknownDtype) {
  expect_error(parse_status(raw_image(R"({"w":{"dtype":"F4_E2M1","shape":[2],"data_offsets":[0,1]}})", 1)),
               {"hostile.safetensors", "'w'", "unknown dtype 'F4_E2M1'"});
}

TEST(SafetensorsHostile, ByteCountDisagreesWithShape) {
  expect_error(parse_status(raw_image(R"({"w":{"dtype":"BF16","shape":[3, 5],"data_offsets":[0,28]}})", 28)),
               {"hostile.safetensors", "'w'", "holds 28 bytes", "needs 30"});
}

TEST(SafetensorsHostile, BadShapesAndOffsets) {
  expect_error(parse_status(raw_image(R"({"n":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4)),
               {"'n'", "non-negative"});
  expect_error(parse_status(raw_image(R"({"n":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4)),
               {"'n'", "non-negative integers"});
  expect_error(parse_status(raw_image(
                   R"({"n":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,4]}})", 4)),
               {"'n'", "absurdly large"});
  expect_error(parse_status(raw_image(R"({"n":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4)),
               {"'n'", "data_offsets"});
  expect_error(parse_status(raw_image(R"({"n":{"dtype":"F32","shape":[1]}})", 4)), {"'n'", "data_offsets"});
  expect_error(parse_status(raw_image(R"({"n":{"shape":[1],"data_offsets":[0,4]}})", 4)), {"'n'", "dtype"});
  expect_error(parse_status(raw_image(R"({"n":7})", 0)), {"'n'", "not a JSON object"});
  expect_error(parse_status(raw_image(R"({"__metadata__":{"k":3}})", 0)), {"__metadata__", "'k'"});
}

TEST(SafetensorsHostile, TensorRunningPastTruncatedData) {
  SafetensorsWriter w;
  std::mt19937_64 rng(std::random_device{}());
  w.add("big", DType::kBF16, {33, 7}, random_bytes(rng, 33 * 7 * 2));
  w.add("small", DType::kF32, {3}, random_bytes(rng, 12));
  auto img = w.serialize();
  ASSERT_TRUE(img.is_ok());
  img->resize(img->size() - 5);
  expect_error(parse_status(*img, "cut.safetensors"), {"cut.safetensors", "'big'", "truncated"});
}

TEST(SafetensorsFiles, TruncatedFileOnDiskAndMissingFile) {
  TempDir dir;
  SafetensorsWriter w;
  std::mt19937_64 rng(std::random_device{}());
  w.add("layer.w", DType::kF8E4M3, {19, 5}, random_bytes(rng, 95));
  const std::string path = dir.file("shard.safetensors");
  ASSERT_TRUE(w.write(path).is_ok());
  auto ok = open_safetensors(path);
  ASSERT_TRUE(ok.is_ok()) << ok.status().message();
  EXPECT_EQ((*ok)->mapping->path(), path);
  fs::resize_file(path, fs::file_size(path) - 1);
  expect_error(open_safetensors(path).status(), {"shard.safetensors", "'layer.w'"});

  auto missing = open_safetensors(dir.file("nope.safetensors"));
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.safetensors"), std::string::npos);

  auto not_file = MappedFile::open(dir.path().string());
  ASSERT_FALSE(not_file.is_ok());
  EXPECT_NE(not_file.status().message().find("not a regular file"), std::string::npos);

  std::ofstream(dir.file("empty.safetensors")).close();
  expect_error(open_safetensors(dir.file("empty.safetensors")).status(), {"empty.safetensors", "too small"});
}

TEST(SafetensorsWriter, RejectsByteCountThatDisagreesWithShape) {
  SafetensorsWriter w;
  w.add("x", DType::kF32, {2, 3}, std::vector<uint8_t>(23));
  auto img = w.serialize();
  ASSERT_FALSE(img.is_ok());
  EXPECT_NE(img.status().message().find("'x'"), std::string::npos);
}

}  // namespace
}  // namespace aff::format
