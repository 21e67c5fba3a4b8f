#include "format/gguf_writer.h"

#include <cerrno>
#include <cstring>
#include <limits>

#include <fmt/format.h>
#include <unistd.h>

namespace aff::format {
namespace {

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace

GgufWriter::GgufWriter(std::string path, uint32_t alignment)
    : path_(std::move(path)), tmp_path_(path_ + ".tmp"), alignment_(alignment) {}

GgufWriter::~GgufWriter() {
  if (!finished_) abandon();
}

void GgufWriter::abandon() {
  if (out_) {
    std::fclose(out_);
    out_ = nullptr;
    std::remove(tmp_path_.c_str());
  }
}

Status GgufWriter::set(std::string key, GgufValue value) {
  if (out_ || finished_) return internal_error(fmt::format("{}: metadata '{}' set after the header was written", path_, key));
  if (key.empty() || key.size() > kGgufMaxKeyLength) {
    return invalid_argument(fmt::format("{}: metadata key '{}' is empty or too long", path_, key));
  }
  if (key == kGgufAlignmentKey) {
    return invalid_argument(fmt::format("{}: '{}' is set from the writer's alignment", path_, key));
  }
  if (!keys_.insert(key).second) return invalid_argument(fmt::format("{}: duplicate metadata key '{}'", path_, key));
  kv_.emplace_back(std::move(key), std::move(value));
  return Status::ok();
}

Status GgufWriter::add_tensor(std::string name, quant::GgmlType type, std::vector<int64_t> ne) {
  if (out_ || finished_) return internal_error(fmt::format("{}: tensor '{}' added after the header was written", path_, name));
  if (name.empty() || name.size() >= kGgufMaxTensorName) {
    return invalid_argument(fmt::format("{}: tensor name '{}' must be 1..{} bytes", path_, name, kGgufMaxTensorName - 1));
  }
  if (ne.empty() || ne.size() > size_t(kGgufMaxDims)) {
    return invalid_argument(fmt::format("{}: tensor '{}' has {} dims (1..{})", path_, name, ne.size(), kGgufMaxDims));
  }
  int64_t rows = 1;
  for (size_t i = 0; i < ne.size(); ++i) {
    if (ne[i] < 0 || (i > 0 && __builtin_mul_overflow(rows, ne[i], &rows))) {
      return invalid_argument(fmt::format("{}: tensor '{}' has a bad shape", path_, name));
    }
  }
  const auto row_bytes = quant::ggml_row_bytes(type, ne[0]);
  int64_t nbytes;
  if (!row_bytes || __builtin_mul_overflow(*row_bytes, rows, &nbytes)) {
    return invalid_argument(fmt::format("{}: tensor '{}': row length {} does not fit {} blocks of {}", path_, name,
                                        ne[0], quant::ggml_type_name(type), quant::ggml_traits(type).block_elems));
  }
  if (!names_.insert(name).second) return invalid_argument(fmt::format("{}: duplicate tensor '{}'", path_, name));
  GgufTensorInfo t;
  t.name = std::move(name);
  t.type = type;
  t.ne = std::move(ne);
  t.offset = data_size_;
  t.nbytes = uint64_t(nbytes);
  data_size_ = align_up(data_size_ + t.nbytes, alignment_);
  tensors_.push_back(std::move(t));
  return Status::ok();
}

Status GgufWriter::write_raw(const void* p, size_t n) {
  if (n && std::fwrite(p, 1, n, out_) != n) {
    return io_error(fmt::format("{}: write failed: {}", tmp_path_, std::strerror(errno)));
  }
  file_pos_ += n;
  return Status::ok();
}

Status GgufWriter::write_value(const GgufValue& v) {
  auto put_u32 = [&](uint32_t x) { return write_raw(&x, 4); };
  auto put_u64 = [&](uint64_t x) { return write_raw(&x, 8); };
  auto put_str = [&](std::string_view s) {
    AFF_RETURN_IF_ERROR(put_u64(s.size()));
    return write_raw(s.data(), s.size());
  };
  switch (v.type()) {
    case GgufType::kString: return put_str(*v.as_string());
    case GgufType::kArray: {
      AFF_RETURN_IF_ERROR(put_u32(uint32_t(v.array_type())));
      AFF_RETURN_IF_ERROR(put_u64(v.array_size()));
      if (v.array_type() == GgufType::kString) {
        for (const auto& s : v.array_strings()) AFF_RETURN_IF_ERROR(put_str(s));
      } else if (v.array_type() == GgufType::kArray) {
        for (const auto& inner : v.array_values()) AFF_RETURN_IF_ERROR(write_value(inner));
      } else {
        AFF_RETURN_IF_ERROR(write_raw(v.array_raw_bytes().data(), v.array_raw_bytes().size()));
      }
      return Status::ok();
    }
    case GgufType::kF32: {
      const float f = float(*v.as_float());
      return write_raw(&f, 4);
    }
    case GgufType::kF64: {
      const double d = *v.as_float();
      return write_raw(&d, 8);
    }
    default: {
      // Integers and bool: the low bytes of the (sign-extended) value.
      const auto u = v.as_uint();
      const uint64_t bits = u ? *u : uint64_t(*v.as_int());
      return write_raw(&bits, gguf_scalar_size(v.type()));
    }
  }
}

Status GgufWriter::pad_to_alignment(uint64_t pos) {
  static const char kZeros[64] = {};
  uint64_t pad = align_up(pos, alignment_) - pos;
  while (pad) {
    const size_t n = size_t(std::min<uint64_t>(pad, sizeof(kZeros)));
    AFF_RETURN_IF_ERROR(write_raw(kZeros, n));
    pad -= n;
  }
  return Status::ok();
}

Status GgufWriter::write_header() {
  if (out_ || finished_) return internal_error(fmt::format("{}: header written twice", path_));
  if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0) {
    return invalid_argument(fmt::format("{}: alignment {} is not a power of two", path_, alignment_));
  }
  out_ = std::fopen(tmp_path_.c_str(), "wb");
  if (!out_) return io_error(fmt::format("{}: cannot create: {}", tmp_path_, std::strerror(errno)));
  buffer_.resize(4u << 20);
  std::setvbuf(out_, buffer_.data(), _IOFBF, buffer_.size());
  const uint32_t magic = kGgufMagic, version = kGgufVersion;
  const uint64_t n_tensors = tensors_.size(), n_kv = kv_.size() + 1;
  AFF_RETURN_IF_ERROR(write_raw(&magic, 4));
  AFF_RETURN_IF_ERROR(write_raw(&version, 4));
  AFF_RETURN_IF_ERROR(write_raw(&n_tensors, 8));
  AFF_RETURN_IF_ERROR(write_raw(&n_kv, 8));
  auto put_key = [&](std::string_view k, GgufType t) {
    const uint64_t len = k.size();
    AFF_RETURN_IF_ERROR(write_raw(&len, 8));
    AFF_RETURN_IF_ERROR(write_raw(k.data(), k.size()));
    const uint32_t tid = uint32_t(t);
    return write_raw(&tid, 4);
  };
  AFF_RETURN_IF_ERROR(put_key(kGgufAlignmentKey, GgufType::kU32));
  AFF_RETURN_IF_ERROR(write_raw(&alignment_, 4));
  for (const auto& [k, v] : kv_) {
    AFF_RETURN_IF_ERROR(put_key(k, v.type()));
    AFF_RETURN_IF_ERROR(write_value(v));
  }
  for (const auto& t : tensors_) {
    const uint64_t len = t.name.size();
    AFF_RETURN_IF_ERROR(write_raw(&len, 8));
    AFF_RETURN_IF_ERROR(write_raw(t.name.data(), t.name.size()));
    const uint32_t n_dims = uint32_t(t.ne.size()), type = uint32_t(t.type);
    AFF_RETURN_IF_ERROR(write_raw(&n_dims, 4));
    for (int64_t d : t.ne) {
      const uint64_t u = uint64_t(d);
      AFF_RETURN_IF_ERROR(write_raw(&u, 8));
    }
    AFF_RETURN_IF_ERROR(write_raw(&type, 4));
    AFF_RETURN_IF_ERROR(write_raw(&t.offset, 8));
  }
  AFF_RETURN_IF_ERROR(pad_to_alignment(file_pos_));
  // Skip leading empty tensors so append() starts at the first one with bytes.
  while (cur_tensor_ < tensors_.size() && tensors_[cur_tensor_].nbytes == 0) ++cur_tensor_;
  return Status::ok();
}

Status GgufWriter::append(std::span<const uint8_t> bytes) {
  if (!out_) return internal_error(fmt::format("{}: append before write_header or after finish", path_));
  while (!bytes.empty()) {
    if (cur_tensor_ >= tensors_.size()) {
      return invalid_argument(fmt::format("{}: {} bytes of tensor data beyond the last declared tensor", path_,
                                          bytes.size()));
    }
    const GgufTensorInfo& t = tensors_[cur_tensor_];
    const uint64_t n = std::min<uint64_t>(bytes.size(), t.nbytes - cur_written_);
    AFF_RETURN_IF_ERROR(write_raw(bytes.data(), size_t(n)));
    bytes = bytes.subspan(size_t(n));
    cur_written_ += n;
    written_ += n;
    if (cur_written_ == t.nbytes) {
      AFF_RETURN_IF_ERROR(pad_to_alignment(t.nbytes));
      cur_written_ = 0;
      ++cur_tensor_;
      while (cur_tensor_ < tensors_.size() && tensors_[cur_tensor_].nbytes == 0) ++cur_tensor_;
    }
  }
  return Status::ok();
}

Status GgufWriter::write_tensor(std::string_view name, std::span<const uint8_t> bytes) {
  if (cur_tensor_ >= tensors_.size() || tensors_[cur_tensor_].name != name || cur_written_ != 0) {
    return invalid_argument(fmt::format("{}: tensor '{}' written out of declaration order", path_, name));
  }
  if (bytes.size() != tensors_[cur_tensor_].nbytes) {
    return invalid_argument(fmt::format("{}: tensor '{}' needs {} bytes, got {}", path_, name,
                                        tensors_[cur_tensor_].nbytes, bytes.size()));
  }
  return append(bytes);
}

Status GgufWriter::finish() {
  if (!out_) return internal_error(fmt::format("{}: finish before write_header", path_));
  if (cur_tensor_ < tensors_.size()) {
    const auto& t = tensors_[cur_tensor_];
    return invalid_argument(fmt::format("{}: tensor '{}' has {} of {} bytes written", path_, t.name, cur_written_,
                                        t.nbytes));
  }
  if (std::fflush(out_) != 0 || ::fsync(fileno(out_)) != 0) {
    const Status s = io_error(fmt::format("{}: flush failed: {}", tmp_path_, std::strerror(errno)));
    abandon();
    return s;
  }
  if (std::fclose(out_) != 0) {
    out_ = nullptr;
    std::remove(tmp_path_.c_str());
    return io_error(fmt::format("{}: close failed: {}", tmp_path_, std::strerror(errno)));
  }
  out_ = nullptr;
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    const Status s = io_error(fmt::format("{}: rename from {} failed: {}", path_, tmp_path_, std::strerror(errno)));
    std::remove(tmp_path_.c_str());
    return s;
  }
  finished_ = true;
  return Status::ok();
}

}  // namespace aff::format
