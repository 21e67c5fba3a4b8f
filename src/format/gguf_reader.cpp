#include "format/gguf_reader.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "format/mapped_file.h"

namespace aff::format {
namespace {

static_assert(std::endian::native == std::endian::little, "GGUF reader assumes a little-endian host");

// Caps that no real file approaches (V4-Flash has ~1.6k tensors and ~60 keys) but that
// stop a forged count before it sizes an allocation. Counts are also checked against the
// bytes left, which is the sharper bound for small files.
constexpr uint64_t kMaxTensors = 1u << 20;
constexpr uint64_t kMaxKv = 1u << 20;
constexpr int kMaxArrayDepth = 8;
constexpr uint32_t kMaxAlignment = 1u << 30;

// Bounds-checked little-endian cursor. Every read names what it was reading, so a
// truncated file says where it ran out.
class Cursor {
 public:
  Cursor(std::span<const uint8_t> bytes, const std::string& label) : b_(bytes), label_(label) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return b_.size() - pos_; }

  Status fail(const std::string& what) const {
    return corrupt(fmt::format("{}: {} (at byte {} of {})", label_, what, pos_, b_.size()));
  }

  template <typename T>
  Status read(T* out, const std::string& what) {
    if (left() < sizeof(T)) return fail(fmt::format("truncated while reading {}", what));
    std::memcpy(out, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::ok();
  }

  Status read_bytes(uint64_t n, std::span<const uint8_t>* out, const std::string& what) {
    if (left() < n) {
      return fail(fmt::format("{} claims {} bytes but only {} remain", what, n, left()));
    }
    *out = b_.subspan(pos_, n);
    pos_ += n;
    return Status::ok();
  }

  Status read_string(std::string* out, uint64_t max_len, const std::string& what) {
    uint64_t len = 0;
    AFF_RETURN_IF_ERROR(read(&len, what + " length"));
    if (len > max_len) return fail(fmt::format("{} length {} exceeds the limit {}", what, len, max_len));
    std::span<const uint8_t> s;
    AFF_RETURN_IF_ERROR(read_bytes(len, &s, what));
    out->assign(reinterpret_cast<const char*>(s.data()), s.size());
    return Status::ok();
  }

 private:
  std::span<const uint8_t> b_;
  const std::string& label_;
  uint64_t pos_ = 0;
};

uint64_t min_encoded_size(GgufType t) {
  if (t == GgufType::kString) return 8;       // length prefix
  if (t == GgufType::kArray) return 4 + 8;    // element type + count
  return gguf_scalar_size(t);
}

Status read_value(Cursor& c, GgufType type, int depth, const std::string& key, GgufValue* out);

Status read_array(Cursor& c, int depth, const std::string& key, GgufValue* out) {
  if (depth > kMaxArrayDepth) return c.fail(fmt::format("key '{}': arrays nested deeper than {}", key, kMaxArrayDepth));
  uint32_t elem_id = 0;
  uint64_t count = 0;
  AFF_RETURN_IF_ERROR(c.read(&elem_id, fmt::format("key '{}' array element type", key)));
  if (!gguf_type_known(elem_id)) return c.fail(fmt::format("key '{}': unknown array element type {}", key, elem_id));
  const auto elem = GgufType(elem_id);
  AFF_RETURN_IF_ERROR(c.read(&count, fmt::format("key '{}' array length", key)));
  // Reject before allocating: every element needs at least min_encoded_size bytes.
  if (count > c.left() / min_encoded_size(elem)) {
    return c.fail(fmt::format("key '{}': array of {} {} elements cannot fit in the {} bytes left", key,
                              count, gguf_type_name(elem), c.left()));
  }
  if (elem == GgufType::kString) {
    std::vector<std::string> v(count);
    for (uint64_t i = 0; i < count; ++i) {
      AFF_RETURN_IF_ERROR(c.read_string(&v[i], c.left(), fmt::format("key '{}' string [{}]", key, i)));
    }
    *out = GgufValue::array_strings(std::move(v));
  } else if (elem == GgufType::kArray) {
    std::vector<GgufValue> v(count);
    for (uint64_t i = 0; i < count; ++i) AFF_RETURN_IF_ERROR(read_array(c, depth + 1, key, &v[i]));
    *out = GgufValue::array_arrays(std::move(v));
  } else {
    std::span<const uint8_t> raw;
    AFF_RETURN_IF_ERROR(c.read_bytes(count * gguf_scalar_size(elem), &raw, fmt::format("key '{}' array", key)));
    if (elem == GgufType::kBool) {
      for (uint8_t b : raw) {
        if (b > 1) return c.fail(fmt::format("key '{}': bool array element {} is not 0 or 1", key, int(b)));
      }
    }
    *out = GgufValue::array_raw(elem, std::vector<uint8_t>(raw.begin(), raw.end()));
  }
  return Status::ok();
}

Status read_value(Cursor& c, GgufType type, int depth, const std::string& key, GgufValue* out) {
  const std::string what = fmt::format("key '{}' value", key);
  switch (type) {
    case GgufType::kU8: { uint8_t v = 0; AFF_RETURN_IF_ERROR(c.read(&v, what)); *out = GgufValue::u8(v); break; }
    case GgufType::kI8: { int8_t v = 0; AFF_RETURN_IF_ERROR(c.read(&v, what)); *out = GgufValue::i8(v); break; }
    case GgufType::kU16: { uint16_t v = 0; AFF_RETURN_IF_ERROR(c.read(&v, what)); *out = GgufValue::u16(v); break; }
    case GgufType::kI16: { int16_t v = 0; AFF_RETURN_IF_ERROR(c.read(&v, what)); *out = GgufValue::i16(v); break; }
    case GgufType::kU32: { uint32_t v = 0; AFF_RETURN_IF_ERROR(c.read(&v, what)); *out = GgufValue::u32(v); break; }
    case GgufType::kI32: { int32_t v = 0; AFF_RETURN_IF_ERROR(c.read(&v, what)); *out = GgufValue::i32(v); break; }
    case GgufType::kU64: { uint64_t v = 0; AFF_RETURN_IF_ERROR(c.read(&v, what)); *out = GgufValue::u64(v); break; }
    case GgufType::kI64: { int64_t v = 0; AFF_RETURN_IF_ERROR(c.read(&v, what)); *out = GgufValue::i64(v); break; }
    case GgufType::kF32: { float v = 0; AFF_RETURN_IF_ERROR(c.read(&v, what)); *out = GgufValue::f32(v); break; }
    case GgufType::kF64: { double v = 0; AFF_RETURN_IF_ERROR(c.read(&v, what)); *out = GgufValue::f64(v); break; }
    case GgufType::kBool: {
      uint8_t v = 0;
      AFF_RETURN_IF_ERROR(c.read(&v, what));
      if (v > 1) return c.fail(fmt::format("key '{}': bool value {} is not 0 or 1", key, int(v)));
      *out = GgufValue::boolean(v != 0);
      break;
    }
    case GgufType::kString: {
      std::string s;
      AFF_RETURN_IF_ERROR(c.read_string(&s, c.left(), what));
      *out = GgufValue::string(std::move(s));
      break;
    }
    case GgufType::kArray: return read_array(c, depth, key, out);
  }
  return Status::ok();
}

}  // namespace

int64_t GgufTensorInfo::n_elements() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

int64_t GgufTensorInfo::n_rows() const {
  int64_t n = 1;
  for (size_t i = 1; i < ne.size(); ++i) n *= ne[i];
  return n;
}

Result<GgufFile> GgufFile::open(const std::string& path) {
  auto mapped = MappedFile::open(path);
  if (!mapped.is_ok()) return mapped.status();
  GgufFile f;
  f.file_ = std::move(mapped).value();
  f.bytes_ = std::span<const uint8_t>(f.file_->data(), f.file_->size());
  f.label_ = path;
  AFF_RETURN_IF_ERROR(f.parse_all());
  return f;
}

Result<GgufFile> GgufFile::parse(std::span<const uint8_t> bytes, std::string label) {
  GgufFile f;
  f.bytes_ = bytes;
  f.label_ = std::move(label);
  AFF_RETURN_IF_ERROR(f.parse_all());
  return f;
}

Status GgufFile::parse_all() {
  Cursor c(bytes_, label_);
  uint32_t magic = 0;
  AFF_RETURN_IF_ERROR(c.read(&magic, "magic"));
  if (magic != kGgufMagic) return corrupt(fmt::format("{}: not a GGUF file (magic {:#010x})", label_, magic));
  AFF_RETURN_IF_ERROR(c.read(&version_, "version"));
  if (version_ == 0x02000000u || version_ == 0x03000000u) {
    return unsupported(fmt::format("{}: big-endian GGUF is not supported", label_));
  }
  if (version_ != 2 && version_ != 3) {
    return unsupported(fmt::format("{}: GGUF version {} is not supported (need 2 or 3)", label_, version_));
  }
  uint64_t n_tensors = 0, n_kv = 0;
  AFF_RETURN_IF_ERROR(c.read(&n_tensors, "tensor count"));
  AFF_RETURN_IF_ERROR(c.read(&n_kv, "metadata count"));
  // Minimum encodings: a KV is key length + 1 byte + type + 1-byte value; a tensor info is
  // name length + 1 byte + n_dims + one dim + type + offset.
  if (n_kv > kMaxKv || n_kv > c.left() / (8 + 1 + 4 + 1)) {
    return c.fail(fmt::format("metadata count {} is absurd for a file of {} bytes", n_kv, bytes_.size()));
  }
  if (n_tensors > kMaxTensors || n_tensors > c.left() / (8 + 1 + 4 + 8 + 4 + 8)) {
    return c.fail(fmt::format("tensor count {} is absurd for a file of {} bytes", n_tensors, bytes_.size()));
  }

  kv_.reserve(n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key;
    AFF_RETURN_IF_ERROR(c.read_string(&key, kGgufMaxKeyLength, fmt::format("metadata key #{}", i)));
    if (key.empty()) return c.fail(fmt::format("metadata key #{} is empty", i));
    uint32_t type_id;
    AFF_RETURN_IF_ERROR(c.read(&type_id, fmt::format("key '{}' type", key)));
    if (!gguf_type_known(type_id)) return c.fail(fmt::format("key '{}': unknown value type {}", key, type_id));
    GgufValue v;
    AFF_RETURN_IF_ERROR(read_value(c, GgufType(type_id), 0, key, &v));
    if (!kv_index_.emplace(key, kv_.size()).second) return c.fail(fmt::format("duplicate metadata key '{}'", key));
    kv_.emplace_back(std::move(key), std::move(v));
  }

  if (const GgufValue* a = find(kGgufAlignmentKey)) {
    if (a->type() != GgufType::kU32) {
      return corrupt(fmt::format("{}: key '{}' must be u32, is {}", label_, kGgufAlignmentKey, gguf_type_name(a->type())));
    }
    const uint64_t al = *a->as_uint();
    if (al == 0 || (al & (al - 1)) != 0 || al > kMaxAlignment) {
      return corrupt(fmt::format("{}: key '{}' = {} is not a power of two in [1, 2^30]", label_, kGgufAlignmentKey, al));
    }
    alignment_ = uint32_t(al);
  }

  tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    AFF_RETURN_IF_ERROR(c.read_string(&t.name, kGgufMaxTensorName, fmt::format("tensor #{} name", i)));
    if (t.name.empty()) return c.fail(fmt::format("tensor #{} has an empty name", i));
    const std::string what = fmt::format("tensor '{}'", t.name);
    uint32_t n_dims;
    AFF_RETURN_IF_ERROR(c.read(&n_dims, what + " n_dims"));
    if (n_dims == 0 || n_dims > uint32_t(kGgufMaxDims)) {
      return c.fail(fmt::format("{}: n_dims {} outside [1, {}]", what, n_dims, kGgufMaxDims));
    }
    // Both the element count and the row count (dims 1..) must fit: a zero in
    // one dimension keeps the element count at 0 however large the others are,
    // so the row product is checked on its own.
    int64_t n_elements = 1, n_rows = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t ne;
      AFF_RETURN_IF_ERROR(c.read(&ne, what + " shape"));
      if (ne > uint64_t(std::numeric_limits<int64_t>::max()) ||
          __builtin_mul_overflow(n_elements, int64_t(ne), &n_elements) ||
          (d > 0 && __builtin_mul_overflow(n_rows, int64_t(ne), &n_rows))) {
        return c.fail(fmt::format("{}: shape dimension {} = {} overflows the element count", what, d, ne));
      }
      t.ne.push_back(int64_t(ne));
    }
    uint32_t type_id;
    AFF_RETURN_IF_ERROR(c.read(&type_id, what + " type"));
    const auto traits = quant::ggml_type_traits(type_id);
    if (!traits) return c.fail(fmt::format("{}: unknown ggml type {}", what, type_id));
    t.type = traits->type;
    AFF_RETURN_IF_ERROR(c.read(&t.offset, what + " offset"));
    const auto row_bytes = quant::ggml_row_bytes(t.type, t.ne[0]);
    if (!row_bytes) {
      return c.fail(fmt::format("{}: row length {} is not a multiple of {}'s block of {}", what, t.ne[0],
                                traits->name, traits->block_elems));
    }
    const int64_t rows = t.n_rows();
    int64_t nbytes;
    if (__builtin_mul_overflow(*row_bytes, rows, &nbytes)) {
      return c.fail(fmt::format("{}: byte size overflows", what));
    }
    t.nbytes = uint64_t(nbytes);
    if (t.offset % alignment_ != 0) {
      return c.fail(fmt::format("{}: data offset {} is not a multiple of the alignment {}", what, t.offset, alignment_));
    }
    if (!tensor_index_.emplace(t.name, tensors_.size()).second) {
      return c.fail(fmt::format("duplicate tensor name '{}'", t.name));
    }
    tensors_.push_back(std::move(t));
  }

  // Data starts at the next alignment boundary after the tensor infos.
  const uint64_t end_of_infos = c.pos();
  data_offset_ = (end_of_infos + alignment_ - 1) / alignment_ * alignment_;
  if (tensors_.empty()) {
    data_offset_ = std::min<uint64_t>(data_offset_, bytes_.size());
    return Status::ok();
  }
  if (data_offset_ > bytes_.size()) {
    return corrupt(fmt::format("{}: truncated: tensor data would start at byte {} but the file has {}", label_,
                               data_offset_, bytes_.size()));
  }
  const uint64_t data_size = bytes_.size() - data_offset_;
  for (const auto& t : tensors_) {
    if (t.offset > data_size || t.nbytes > data_size - t.offset) {
      return corrupt(fmt::format("{}: tensor '{}' data [{}, +{}) runs past the end of the data section ({} bytes)",
                                 label_, t.name, t.offset, t.nbytes, data_size));
    }
  }
  std::vector<const GgufTensorInfo*> by_offset;
  by_offset.reserve(tensors_.size());
  for (const auto& t : tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const GgufTensorInfo* a, const GgufTensorInfo* b) {
    return a->offset != b->offset ? a->offset < b->offset : a->nbytes < b->nbytes;
  });
  // Compare each tensor with the furthest-reaching earlier one, so a large tensor that
  // covers several later ones is caught too. Empty tensors occupy no bytes.
  const GgufTensorInfo* reach = nullptr;
  for (const GgufTensorInfo* cur : by_offset) {
    if (cur->nbytes == 0) continue;
    if (reach && reach->offset + reach->nbytes > cur->offset) {
      return corrupt(fmt::format("{}: tensors '{}' [{}, +{}) and '{}' [{}, +{}) overlap", label_, reach->name,
                                 reach->offset, reach->nbytes, cur->name, cur->offset, cur->nbytes));
    }
    if (!reach || cur->offset + cur->nbytes > reach->offset + reach->nbytes) reach = cur;
  }
  return Status::ok();
}

const GgufValue* GgufFile::find(std::string_view key) const {
  const auto it = kv_index_.find(std::string(key));
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

template <typename T>
Result<T> typed(const GgufFile& f, std::string_view key, const char* want,
                std::optional<T> (*get)(const GgufValue&)) {
  const GgufValue* v = f.find(key);
  if (!v) return not_found(fmt::format("{}: metadata key '{}' is missing", f.label(), key));
  auto r = get(*v);
  if (!r) {
    return corrupt(fmt::format("{}: metadata key '{}' is {}, expected {}", f.label(), key,
                               gguf_type_name(v->type()), want));
  }
  return *r;
}

}  // namespace

Result<uint64_t> GgufFile::get_uint(std::string_view key) const {
  return typed<uint64_t>(*this, key, "an unsigned integer", [](const GgufValue& v) { return v.as_uint(); });
}
Result<int64_t> GgufFile::get_int(std::string_view key) const {
  return typed<int64_t>(*this, key, "an integer", [](const GgufValue& v) { return v.as_int(); });
}
Result<double> GgufFile::get_float(std::string_view key) const {
  return typed<double>(*this, key, "a number", [](const GgufValue& v) { return v.as_float(); });
}
Result<bool> GgufFile::get_bool(std::string_view key) const {
  return typed<bool>(*this, key, "a bool", [](const GgufValue& v) { return v.as_bool(); });
}
Result<std::string> GgufFile::get_string(std::string_view key) const {
  return typed<std::string>(*this, key, "a string", [](const GgufValue& v) -> std::optional<std::string> {
    if (auto s = v.as_string()) return std::string(*s);
    return std::nullopt;
  });
}

}  // namespace aff::format
