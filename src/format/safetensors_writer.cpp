#include "format/safetensors_writer.h"

#include <algorithm>
#include <cstdio>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/tensor.h"

namespace aff::format {

using nlohmann::ordered_json;

void SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape,
                            std::vector<uint8_t> bytes) {
  tensors_[name] = Entry{dtype, std::move(shape), std::move(bytes)};
}

uint64_t SafetensorsWriter::data_bytes() const {
  uint64_t n = 0;
  for (const auto& [name, e] : tensors_) n += e.bytes.size();
  return n;
}

Result<std::vector<uint8_t>> SafetensorsWriter::serialize() const {
  std::vector<const std::pair<const std::string, Entry>*> order;
  for (const auto& kv : tensors_) {
    const Entry& e = kv.second;
    int64_t numel = 1;
    for (int64_t d : e.shape) {
      if (d < 0) return invalid_argument(fmt::format("safetensors writer: tensor '{}': negative dim", kv.first));
      numel *= d;
    }
    if (uint64_t(numel) * uint64_t(dtype_size(e.dtype)) != e.bytes.size()) {
      return invalid_argument(fmt::format("safetensors writer: tensor '{}': {} bytes given for {} {}", kv.first,
                                          e.bytes.size(), dtype_name(e.dtype), shape_string(e.shape)));
    }
    order.push_back(&kv);
  }
  std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return dtype_size(a->second.dtype) > dtype_size(b->second.dtype);
  });

  ordered_json header = ordered_json::object();
  if (!metadata_.empty()) {
    ordered_json meta = ordered_json::object();
    for (const auto& [k, v] : metadata_) meta[k] = v;
    header["__metadata__"] = meta;
  }
  uint64_t offset = 0;
  for (const auto* kv : order) {
    const Entry& e = kv->second;
    ordered_json t = ordered_json::object();
    t["dtype"] = std::string(dtype_name(e.dtype));
    t["shape"] = e.shape;
    t["data_offsets"] = {offset, offset + e.bytes.size()};
    header[kv->first] = t;
    offset += e.bytes.size();
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');

  std::vector<uint8_t> out;
  out.reserve(8 + text.size() + offset);
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out.push_back(uint8_t(n >> (8 * i)));
  out.insert(out.end(), text.begin(), text.end());
  for (const auto* kv : order) out.insert(out.end(), kv->second.bytes.begin(), kv->second.bytes.end());
  return out;
}

Status SafetensorsWriter::write(const std::string& path) const {
  AFF_ASSIGN_OR_RETURN(std::vector<uint8_t> image, serialize());
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!f) return io_error(path + ": cannot create");
  if (!image.empty() && std::fwrite(image.data(), 1, image.size(), f.get()) != image.size()) {
    return io_error(path + ": short write");
  }
  if (std::fflush(f.get()) != 0) return io_error(path + ": write failed");
  return Status::ok();
}

}  // namespace aff::format

