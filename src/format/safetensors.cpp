#include "format/safetensors.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace aff::format {

using nlohmann::json;

const TensorView* SafetensorsFile::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &tensors[it->second];
}

namespace {

// A JSON value that is a non-negative integer fitting in int64 (dims and
// offsets); floats such as 3.0 are not accepted — the format writes integers.
bool as_u63(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max())) return false;
    *out = u;
    return true;
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < 0) return false;
    *out = uint64_t(i);
    return true;
  }
  return false;
}

Status tensor_error(const std::string& file, const std::string& name, const std::string& what) {
  return corrupt(fmt::format("{}: tensor '{}': {}", file, name, what));
}

}  // namespace

Result<SafetensorsFile> parse_safetensors(const uint8_t* bytes, size_t size, const std::string& file) {
  if (size < 8) {
    return corrupt(fmt::format("{}: file is {} bytes, too small for the 8-byte safetensors header length "
                               "(truncated or not a safetensors file)", file, size));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > kSafetensorsMaxHeaderBytes) {
    return corrupt(fmt::format("{}: header length {} exceeds the {} byte limit (corrupt or not a "
                               "safetensors file)", file, header_len, kSafetensorsMaxHeaderBytes));
  }
  if (header_len > size - 8) {
    return corrupt(fmt::format("{}: header length {} runs past the end of the {}-byte file (truncated?)",
                               file, header_len, size));
  }
  if (header_len < 2 || bytes[8] != '{') {
    return corrupt(fmt::format("{}: header does not start with a JSON object", file));
  }

  json header;
  try {
    header = json::parse(bytes + 8, bytes + 8 + header_len);
  } catch (const json::exception& e) {
    return corrupt(fmt::format("{}: header is not valid JSON: {}", file, e.what()));
  }
  if (!header.is_object()) return corrupt(fmt::format("{}: header is not a JSON object", file));

  SafetensorsFile out;
  out.path = file;
  out.data_offset = 8 + header_len;
  const uint64_t data_size = size - out.data_offset;
  const uint8_t* data = bytes + out.data_offset;

  struct Range {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<Range> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) return corrupt(fmt::format("{}: __metadata__ is not a JSON object", file));
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string()) {
          return corrupt(fmt::format("{}: __metadata__ value for '{}' is not a string", file, m.key()));
        }
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!entry.is_object()) return tensor_error(file, name, "header entry is not a JSON object");
    auto dt = entry.find("dtype");
    auto sh = entry.find("shape");
    auto off = entry.find("data_offsets");
    if (dt == entry.end() || !dt->is_string()) return tensor_error(file, name, "missing or non-string 'dtype'");
    if (sh == entry.end() || !sh->is_array()) return tensor_error(file, name, "missing or non-array 'shape'");
    if (off == entry.end() || !off->is_array() || off->size() != 2) {
      return tensor_error(file, name, "'data_offsets' must be an array [begin, end]");
    }
    const std::string dtype_str = dt->get<std::string>();
    const auto dtype = dtype_from_safetensors(dtype_str);
    if (!dtype) return tensor_error(file, name, fmt::format("unknown dtype '{}'", dtype_str));

    TensorView v;
    v.name = name;
    v.file = file;
    v.dtype = *dtype;
    // numel in unsigned 128-bit so a hostile shape cannot overflow the check.
    unsigned __int128 numel = 1;
    for (const json& d : *sh) {
      uint64_t dim = 0;
      if (!as_u63(d, &dim)) return tensor_error(file, name, "shape entries must be non-negative integers");
      v.shape.push_back(int64_t(dim));
      numel *= dim;
      if (numel > (unsigned __int128)(uint64_t(1) << 62)) {
        return tensor_error(file, name, fmt::format("shape {} is absurdly large", sh->dump()));
      }
    }
    uint64_t begin = 0, end = 0;
    if (!as_u63((*off)[0], &begin) || !as_u63((*off)[1], &end)) {
      return tensor_error(file, name, "data_offsets must be non-negative integers");
    }
    if (end < begin) {
      return tensor_error(file, name, fmt::format("data_offsets [{}, {}] end before they begin", begin, end));
    }
    if (end > data_size) {
      return tensor_error(file, name, fmt::format("data_offsets [{}, {}] run past the {}-byte data section "
                                                  "(file truncated?)", begin, end, data_size));
    }
    const unsigned __int128 want = numel * (unsigned __int128)dtype_size(*dtype);
    if (want != end - begin) {
      return tensor_error(file, name, fmt::format("holds {} bytes but {} {} needs {}", end - begin,
                                                  dtype_name(*dtype), shape_string(v.shape),
                                                  uint64_t(want)));
    }
    v.data = data + begin;
    v.nbytes = end - begin;
    ranges.push_back({begin, end, out.tensors.size()});
    out.tensors.push_back(std::move(v));
  }

  // The data section must be tiled exactly by the tensors (as the reference
  // library requires): an overlap means two tensors share bytes, a hole or
  // trailing bytes mean the header and data disagree.
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const Range& r = ranges[i];
    const std::string& name = out.tensors[r.index].name;
    if (r.begin < cursor) {
      return tensor_error(file, name, fmt::format("data_offsets [{}, {}] overlap tensor '{}' (ends at {})",
                                                  r.begin, r.end, out.tensors[ranges[i - 1].index].name,
                                                  cursor));
    }
    if (r.begin > cursor) {
      return tensor_error(file, name, fmt::format("data_offsets [{}, {}] leave a {}-byte hole before them",
                                                  r.begin, r.end, r.begin - cursor));
    }
    cursor = r.end;
  }
  if (cursor != data_size) {
    return corrupt(fmt::format("{}: data section is {} bytes but the tensors cover {}", file, data_size,
                               cursor));
  }

  // Keep views in data order: sequential readers then walk the file forwards.
  std::vector<TensorView> ordered;
  ordered.reserve(out.tensors.size());
  for (const Range& r : ranges) ordered.push_back(std::move(out.tensors[r.index]));
  out.tensors = std::move(ordered);
  for (size_t i = 0; i < out.tensors.size(); ++i) out.by_name_[out.tensors[i].name] = i;
  return out;
}

Result<std::shared_ptr<const SafetensorsFile>> open_safetensors(const std::string& path) {
  AFF_ASSIGN_OR_RETURN(std::shared_ptr<MappedFile> map, MappedFile::open(path));
  AFF_ASSIGN_OR_RETURN(SafetensorsFile f, parse_safetensors(map->data(), map->size(), path));
  f.mapping = std::move(map);
  return std::shared_ptr<const SafetensorsFile>(std::make_shared<SafetensorsFile>(std::move(f)));
}

}  // namespace aff::format
