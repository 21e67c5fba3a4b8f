// Hostile GGUF files must be rejected with a Status naming the file and the key/tensor —
// never a crash, a huge allocation or an out-of-bounds read. Files are built byte by byte
// so that each field can be forged.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "format/gguf_reader.h"

namespace aff::format {
namespace {

class Bytes {
 public:
  Bytes& u32(uint32_t v) { return raw(&v, 4); }
  Bytes& u64(uint64_t v) { return raw(&v, 8); }
  Bytes& u8(uint8_t v) { return raw(&v, 1); }
  Bytes& str(const std::string& s) {
    u64(s.size());
    return raw(s.data(), s.size());
  }
  Bytes& raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    v.insert(v.end(), b, b + n);
    return *this;
  }
  Bytes& pad(size_t align) {
    while (v.size() % align) v.push_back(0);
    return *this;
  }
  std::vector<uint8_t> v;
};

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> ne;
  uint32_t type;
  uint64_t offset;
};

// A well-formed file with two F32 tensors [8] and [4, 2] plus one u32 and one string KV,
// with knobs for every field the tests forge.
struct Spec {
  uint32_t magic = kGgufMagic;
  uint32_t version = 3;
  std::optional<uint64_t> n_tensors_override, n_kv_override;
  std::vector<TensorSpec> tensors = {{"a.weight", {8}, 0, 0}, {"b.weight", {4, 2}, 0, 32}};
  uint32_t alignment = 32;
  bool write_alignment = false;
  uint64_t data_bytes = 64;
};

std::vector<uint8_t> build(const Spec& s) {
  Bytes b;
  b.u32(s.magic).u32(s.version);
  b.u64(s.n_tensors_override.value_or(s.tensors.size()));
  b.u64(s.n_kv_override.value_or(2 + (s.write_alignment ? 1 : 0)));
  b.str("general.architecture").u32(uint32_t(GgufType::kString)).str("deepseek4");
  b.str("deepseek4.block_count").u32(uint32_t(GgufType::kU32)).u32(43);
  if (s.write_alignment) b.str("general.alignment").u32(uint32_t(GgufType::kU32)).u32(s.alignment);
  for (const auto& t : s.tensors) {
    b.str(t.name).u32(uint32_t(t.ne.size()));
    for (uint64_t d : t.ne) b.u64(d);
    b.u32(t.type).u64(t.offset);
  }
  b.pad(s.alignment ? s.alignment : 32);
  for (uint64_t i = 0; i < s.data_bytes; ++i) b.u8(uint8_t(i * 13));
  return b.v;
}

Status parse(const std::vector<uint8_t>& bytes) {
  return GgufFile::parse(bytes, "hostile.gguf").status();
}

void expect_rejected(const std::vector<uint8_t>& bytes, const std::string& mentions) {
  const Status s = parse(bytes);
  ASSERT_FALSE(s.is_ok()) << "accepted a file that should mention '" << mentions << "'";
  EXPECT_NE(s.message().find("hostile.gguf"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(mentions), std::string::npos) << s.message();
}

TEST(GgufHostile, BaselineIsValid) {
  const auto bytes = build(Spec{});
  auto r = GgufFile::parse(bytes, "hostile.gguf");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->tensors().size(), 2u);
  EXPECT_EQ(r->tensor_data(r->tensors()[1]).size(), 32u);
}

TEST(GgufHostile, EveryTruncationRejected) {
  const auto full = build(Spec{});
  for (size_t n = 0; n < full.size(); ++n) {
    std::vector<uint8_t> cut(full.begin(), full.begin() + ptrdiff_t(n));
    const Status s = parse(cut);
    EXPECT_FALSE(s.is_ok()) << "accepted a file truncated to " << n << " bytes";
  }
}

TEST(GgufHostile, BadMagicAndVersion) {
  Spec s;
  s.magic = 0x46554746;
  expect_rejected(build(s), "not a GGUF");
  s = Spec{};
  s.version = 1;
  EXPECT_EQ(parse(build(s)).code(), StatusCode::kUnsupported);
  s.version = 0x03000000;  // a big-endian file
  expect_rejected(build(s), "big-endian");
}

TEST(GgufHostile, AbsurdCounts) {
  Spec s;
  s.n_tensors_override = uint64_t(1) << 60;
  expect_rejected(build(s), "tensor count");
  s = Spec{};
  s.n_kv_override = ~uint64_t(0);
  expect_rejected(build(s), "metadata count");
  s = Spec{};
  s.n_kv_override = 3;  // one more KV than present: runs into the tensor infos
  EXPECT_FALSE(parse(build(s)).is_ok());
}

TEST(GgufHostile, AbsurdStringAndArrayLengths) {
  Bytes b;
  b.u32(kGgufMagic).u32(3).u64(0).u64(1);
  b.u64(uint64_t(1) << 62);  // key length
  for (int i = 0; i < 64; ++i) b.u8('k');
  expect_rejected(b.v, "metadata key #0");

  Bytes a;
  a.u32(kGgufMagic).u32(3).u64(0).u64(1);
  a.str("tokenizer.ggml.tokens").u32(uint32_t(GgufType::kArray)).u32(uint32_t(GgufType::kString));
  a.u64(uint64_t(1) << 40);  // 2^40 strings in a few bytes
  expect_rejected(a.v, "tokenizer.ggml.tokens");

  Bytes s;
  s.u32(kGgufMagic).u32(3).u64(0).u64(1);
  s.str("general.name").u32(uint32_t(GgufType::kString)).u64(uint64_t(1) << 50).raw("abc", 3);
  expect_rejected(s.v, "general.name");

  Bytes n;  // arrays nested far deeper than any real file
  n.u32(kGgufMagic).u32(3).u64(0).u64(1);
  n.str("deep").u32(uint32_t(GgufType::kArray));
  for (int i = 0; i < 100; ++i) n.u32(uint32_t(GgufType::kArray)).u64(1);
  expect_rejected(n.v, "deep");
}

TEST(GgufHostile, WrongTypes) {
  Bytes b;  // unknown metadata value type
  b.u32(kGgufMagic).u32(3).u64(0).u64(1).str("x.key").u32(99).u32(0);
  expect_rejected(b.v, "x.key");

  Bytes al;  // alignment stored as a string
  al.u32(kGgufMagic).u32(3).u64(0).u64(1).str("general.alignment").u32(uint32_t(GgufType::kString)).str("32");
  expect_rejected(al.v, "general.alignment");

  Bytes bo;  // bool that is neither 0 nor 1
  bo.u32(kGgufMagic).u32(3).u64(0).u64(1).str("x.flag").u32(uint32_t(GgufType::kBool)).u8(7);
  expect_rejected(bo.v, "x.flag");

  Spec s;
  s.tensors[1].type = 4;  // a retired ggml type id
  expect_rejected(build(s), "b.weight");
  s.tensors[1].type = 1000;
  expect_rejected(build(s), "b.weight");
}

TEST(GgufHostile, BadAlignmentValue) {
  Spec s;
  s.write_alignment = true;
  s.alignment = 24;  // not a power of two
  expect_rejected(build(s), "general.alignment");
}

TEST(GgufHostile, BadShapes) {
  Spec s;
  s.tensors[0].ne = {1, 1, 1, 1, 1};
  expect_rejected(build(s), "a.weight");
  s = Spec{};
  s.tensors[0].ne = {};
  expect_rejected(build(s), "a.weight");
  s = Spec{};
  s.tensors[0].ne = {uint64_t(1) << 40, uint64_t(1) << 40};  // element count overflows
  expect_rejected(build(s), "a.weight");
  s = Spec{};
  s.tensors[0].ne = {~uint64_t(0)};  // negative as int64
  expect_rejected(build(s), "a.weight");
  s = Spec{};
  // A zero dimension keeps the element count at 0, but the row count still
  // overflows (found by the fuzzer).
  s.tensors[0].ne = {0, uint64_t(1) << 40, uint64_t(1) << 40};
  expect_rejected(build(s), "a.weight");
  s = Spec{};
  s.tensors[0].type = 12;  // Q4_K needs rows of 256
  expect_rejected(build(s), "a.weight");
  s = Spec{};
  s.tensors[0].name = std::string(65, 'x');
  expect_rejected(build(s), "tensor #0 name");
  s = Spec{};
  s.tensors[1].name = "a.weight";
  expect_rejected(build(s), "duplicate tensor name");
}

TEST(GgufHostile, MisalignedOverlappingAndOutOfRange) {
  Spec s;
  s.tensors[1].offset = 40;  // not a multiple of 32
  expect_rejected(build(s), "b.weight");
  s = Spec{};
  s.tensors[1].offset = 0;  // both tensors at 0
  expect_rejected(build(s), "overlap");
  s = Spec{};
  s.tensors = {{"big", {16}, 0, 0}, {"a", {4}, 0, 0 + 32}, {"c", {8}, 0, 64}};  // big [0,64) covers a
  s.data_bytes = 96;
  expect_rejected(build(s), "overlap");
  s = Spec{};
  s.tensors[1].offset = 64;  // runs past the 64 data bytes
  expect_rejected(build(s), "b.weight");
  s = Spec{};
  s.tensors[1].offset = ~uint64_t(0) - 31;  // aligned, and offset + size overflows
  expect_rejected(build(s), "b.weight");
  s = Spec{};
  s.data_bytes = 40;  // file ends inside b's data
  expect_rejected(build(s), "b.weight");
}

// Random single-byte corruptions of a valid file: every outcome is a clean Status or a
// file whose tensors all lie inside the buffer.
TEST(GgufHostile, RandomCorruptionsStayInBounds) {
  const auto base = build(Spec{});
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 3000; ++trial) {
    auto bytes = base;
    const int flips = 1 + int(rng() % 3);
    for (int k = 0; k < flips; ++k) bytes[rng() % bytes.size()] = uint8_t(rng());
    auto r = GgufFile::parse(bytes, "hostile.gguf");
    if (!r.is_ok()) {
      EXPECT_NE(r.status().message().find("hostile.gguf"), std::string::npos);
      continue;
    }
    for (const auto& t : r->tensors()) {
      const auto span = r->tensor_data(t);
      ASSERT_GE(span.data(), bytes.data());
      ASSERT_LE(span.data() + span.size(), bytes.data() + bytes.size());
    }
  }
}

}  // namespace
}  // namespace aff::format
