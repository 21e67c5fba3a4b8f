#include "format/gguf_value.h"

#include <cstring>
#include <limits>

namespace aff::format {

std::string_view gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::kU8: return "u8";
    case GgufType::kI8: return "i8";
    case GgufType::kU16: return "u16";
    case GgufType::kI16: return "i16";
    case GgufType::kU32: return "u32";
    case GgufType::kI32: return "i32";
    case GgufType::kF32: return "f32";
    case GgufType::kBool: return "bool";
    case GgufType::kString: return "string";
    case GgufType::kArray: return "array";
    case GgufType::kU64: return "u64";
    case GgufType::kI64: return "i64";
    case GgufType::kF64: return "f64";
  }
  return "?";
}

size_t gguf_scalar_size(GgufType t) {
  switch (t) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kBool: return 1;
    case GgufType::kU16: case GgufType::kI16: return 2;
    case GgufType::kU32: case GgufType::kI32: case GgufType::kF32: return 4;
    case GgufType::kU64: case GgufType::kI64: case GgufType::kF64: return 8;
    case GgufType::kString: case GgufType::kArray: return 0;
  }
  return 0;
}

bool gguf_type_known(uint32_t id) { return id <= uint32_t(GgufType::kF64); }

GgufValue GgufValue::f32(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return scalar(GgufType::kF32, u);
}

GgufValue GgufValue::f64(double v) {
  uint64_t u;
  std::memcpy(&u, &v, 8);
  return scalar(GgufType::kF64, u);
}

GgufValue GgufValue::string(std::string v) {
  GgufValue g;
  g.type_ = GgufType::kString;
  g.str_ = std::move(v);
  return g;
}

GgufValue GgufValue::array_raw(GgufType elem_type, std::vector<uint8_t> raw) {
  GgufValue g;
  g.type_ = GgufType::kArray;
  g.elem_type_ = elem_type;
  g.raw_ = std::move(raw);
  return g;
}

GgufValue GgufValue::array_strings(std::vector<std::string> values) {
  GgufValue g;
  g.type_ = GgufType::kArray;
  g.elem_type_ = GgufType::kString;
  g.strings_ = std::move(values);
  return g;
}

GgufValue GgufValue::array_arrays(std::vector<GgufValue> values) {
  GgufValue g;
  g.type_ = GgufType::kArray;
  g.elem_type_ = GgufType::kArray;
  g.nested_ = std::move(values);
  return g;
}

size_t GgufValue::array_size() const {
  if (type_ != GgufType::kArray) return 0;
  if (elem_type_ == GgufType::kString) return strings_.size();
  if (elem_type_ == GgufType::kArray) return nested_.size();
  const size_t s = gguf_scalar_size(elem_type_);
  return s ? raw_.size() / s : 0;
}

// Raw scalars are stored sign-extended for signed types, so the widening helpers only
// need the type to interpret the 64 bits.
std::optional<uint64_t> GgufValue::uint_of(GgufType t, uint64_t bits) {
  switch (t) {
    case GgufType::kU8: case GgufType::kU16: case GgufType::kU32: case GgufType::kU64:
    case GgufType::kBool:
      return bits;
    case GgufType::kI8: case GgufType::kI16: case GgufType::kI32: case GgufType::kI64:
      if (int64_t(bits) < 0) return std::nullopt;
      return bits;
    default: return std::nullopt;
  }
}

std::optional<int64_t> GgufValue::int_of(GgufType t, uint64_t bits) {
  switch (t) {
    case GgufType::kU64:
      if (bits > uint64_t(std::numeric_limits<int64_t>::max())) return std::nullopt;
      return int64_t(bits);
    case GgufType::kU8: case GgufType::kU16: case GgufType::kU32: case GgufType::kBool:
    case GgufType::kI8: case GgufType::kI16: case GgufType::kI32: case GgufType::kI64:
      return int64_t(bits);
    default: return std::nullopt;
  }
}

std::optional<double> GgufValue::float_of(GgufType t, uint64_t bits) {
  if (t == GgufType::kF32) {
    float f;
    const uint32_t u = uint32_t(bits);
    std::memcpy(&f, &u, 4);
    return double(f);
  }
  if (t == GgufType::kF64) {
    double d;
    std::memcpy(&d, &bits, 8);
    return d;
  }
  if (t == GgufType::kU64) return double(bits);
  if (auto i = int_of(t, bits)) return double(*i);
  return std::nullopt;
}

std::optional<uint64_t> GgufValue::as_uint() const { return uint_of(type_, bits_); }
std::optional<int64_t> GgufValue::as_int() const { return int_of(type_, bits_); }
std::optional<double> GgufValue::as_float() const { return float_of(type_, bits_); }
std::optional<bool> GgufValue::as_bool() const {
  if (type_ != GgufType::kBool) return std::nullopt;
  return bits_ != 0;
}
std::optional<std::string_view> GgufValue::as_string() const {
  if (type_ != GgufType::kString) return std::nullopt;
  return std::string_view(str_);
}

uint64_t GgufValue::raw_element(size_t i) const {
  const size_t s = gguf_scalar_size(elem_type_);
  uint64_t u = 0;
  std::memcpy(&u, raw_.data() + i * s, s);
  // Sign-extend signed element types to match the scalar representation.
  switch (elem_type_) {
    case GgufType::kI8: return uint64_t(int64_t(int8_t(u)));
    case GgufType::kI16: return uint64_t(int64_t(int16_t(u)));
    case GgufType::kI32: return uint64_t(int64_t(int32_t(u)));
    default: return u;
  }
}

std::optional<int64_t> GgufValue::array_int(size_t i) const {
  if (type_ != GgufType::kArray || i >= array_size() || gguf_scalar_size(elem_type_) == 0) {
    return std::nullopt;
  }
  return int_of(elem_type_, raw_element(i));
}

std::optional<double> GgufValue::array_float(size_t i) const {
  if (type_ != GgufType::kArray || i >= array_size() || gguf_scalar_size(elem_type_) == 0) {
    return std::nullopt;
  }
  return float_of(elem_type_, raw_element(i));
}

uint64_t GgufValue::encoded_size() const {
  switch (type_) {
    case GgufType::kString: return 8 + str_.size();
    case GgufType::kArray: {
      uint64_t n = 4 + 8;  // element type, count
      if (elem_type_ == GgufType::kString) {
        for (const auto& s : strings_) n += 8 + s.size();
      } else if (elem_type_ == GgufType::kArray) {
        for (const auto& v : nested_) n += v.encoded_size();  // an inner array: type, count, items
      } else {
        n += raw_.size();
      }
      return n;
    }
    default: return gguf_scalar_size(type_);
  }
}

bool GgufValue::operator==(const GgufValue& o) const {
  return type_ == o.type_ && elem_type_ == o.elem_type_ && bits_ == o.bits_ && str_ == o.str_ &&
         raw_ == o.raw_ && strings_ == o.strings_ && nested_ == o.nested_;
}

}  // namespace aff::format
