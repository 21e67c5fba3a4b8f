// GGUF metadata values: the 13 GGUF value types, scalars, strings and (nested) arrays.
// A GgufValue is what one metadata key holds; the reader produces them and the writer
// consumes them. Numeric arrays keep their raw little-endian bytes (a tokenizer's
// token_type array has 129k entries; they are not boxed one by one).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace aff::format {

enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

std::string_view gguf_type_name(GgufType t);
// Size in bytes of a fixed-size scalar type; 0 for string and array.
size_t gguf_scalar_size(GgufType t);
bool gguf_type_known(uint32_t id);

class GgufValue {
 public:
  GgufValue() = default;

  // Scalars.
  static GgufValue u8(uint8_t v) { return scalar(GgufType::kU8, v); }
  static GgufValue i8(int8_t v) { return scalar(GgufType::kI8, uint64_t(int64_t(v))); }
  static GgufValue u16(uint16_t v) { return scalar(GgufType::kU16, v); }
  static GgufValue i16(int16_t v) { return scalar(GgufType::kI16, uint64_t(int64_t(v))); }
  static GgufValue u32(uint32_t v) { return scalar(GgufType::kU32, v); }
  static GgufValue i32(int32_t v) { return scalar(GgufType::kI32, uint64_t(int64_t(v))); }
  static GgufValue u64(uint64_t v) { return scalar(GgufType::kU64, v); }
  static GgufValue i64(int64_t v) { return scalar(GgufType::kI64, uint64_t(v)); }
  static GgufValue f32(float v);
  static GgufValue f64(double v);
  static GgufValue boolean(bool v) { return scalar(GgufType::kBool, v ? 1 : 0); }
  static GgufValue string(std::string v);

  // Arrays. Numeric arrays are built from the element values; `raw` takes their
  // little-endian bytes directly (elem_type must be a fixed-size scalar type).
  template <typename T>
  static GgufValue array(GgufType elem_type, const std::vector<T>& values);
  static GgufValue array_raw(GgufType elem_type, std::vector<uint8_t> raw);
  static GgufValue array_strings(std::vector<std::string> values);
  static GgufValue array_arrays(std::vector<GgufValue> values);  // nested; may be empty

  GgufType type() const { return type_; }
  bool is_array() const { return type_ == GgufType::kArray; }
  GgufType array_type() const { return elem_type_; }
  size_t array_size() const;

  // Typed reads; nullopt when the stored type cannot represent the request exactly
  // (e.g. a negative i32 as uint, any integer as string).
  std::optional<uint64_t> as_uint() const;   // any integer type >= 0, or bool
  std::optional<int64_t> as_int() const;     // any integer type within int64
  std::optional<double> as_float() const;    // f32, f64 (integers too)
  std::optional<bool> as_bool() const;
  std::optional<std::string_view> as_string() const;

  // Element i of a numeric array, widened as above; nullopt if out of range / wrong type.
  std::optional<int64_t> array_int(size_t i) const;
  std::optional<double> array_float(size_t i) const;
  const std::vector<std::string>& array_strings() const { return strings_; }
  const std::vector<GgufValue>& array_values() const { return nested_; }
  const std::vector<uint8_t>& array_raw_bytes() const { return raw_; }

  // Serialised size in bytes of the value payload (without the type tag).
  uint64_t encoded_size() const;

  bool operator==(const GgufValue& o) const;

 private:
  static GgufValue scalar(GgufType t, uint64_t bits) {
    GgufValue v;
    v.type_ = t;
    v.bits_ = bits;
    return v;
  }
  // Reads element i of a fixed-size array as (type, raw bits) for the widening helpers.
  static std::optional<uint64_t> uint_of(GgufType t, uint64_t bits);
  static std::optional<int64_t> int_of(GgufType t, uint64_t bits);
  static std::optional<double> float_of(GgufType t, uint64_t bits);
  uint64_t raw_element(size_t i) const;

  GgufType type_ = GgufType::kU8;
  GgufType elem_type_ = GgufType::kU8;   // arrays only
  uint64_t bits_ = 0;                    // scalars: value bits (signed sign-extended)
  std::string str_;                      // kString
  std::vector<uint8_t> raw_;             // arrays of fixed-size scalars
  std::vector<std::string> strings_;     // arrays of strings
  std::vector<GgufValue> nested_;        // arrays of arrays
};

template <typename T>
GgufValue GgufValue::array(GgufType elem_type, const std::vector<T>& values) {
  const size_t size = gguf_scalar_size(elem_type);
  std::vector<uint8_t> raw(values.size() * size);
  for (size_t i = 0; i < values.size(); ++i) {
    uint8_t buf[8] = {};
    if (elem_type == GgufType::kF32) {
      const float f = float(values[i]);
      std::memcpy(buf, &f, 4);
    } else if (elem_type == GgufType::kF64) {
      const double d = double(values[i]);
      std::memcpy(buf, &d, 8);
    } else {
      const uint64_t u = uint64_t(int64_t(values[i]));
      std::memcpy(buf, &u, 8);  // little-endian host: low bytes first
    }
    std::memcpy(raw.data() + i * size, buf, size);
  }
  return array_raw(elem_type, std::move(raw));
}

}  // namespace aff::format
