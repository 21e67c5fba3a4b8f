#include "format/npy.h"

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string_view>

#include <fmt/format.h>

namespace aff::format {

namespace {

static_assert(std::endian::native == std::endian::little, "npy I/O assumes a little-endian host");

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
constexpr int64_t kMaxDims = 32;  // numpy's own limit

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

// Tiny cursor over the header dict: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
struct Cursor {
  std::string_view s;
  size_t i = 0;
  void skip_ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n')) ++i;
  }
  bool eat(char c) {
    skip_ws();
    if (i < s.size() && s[i] == c) {
      ++i;
      return true;
    }
    return false;
  }
  bool quoted(std::string& out) {
    skip_ws();
    if (i >= s.size() || (s[i] != '\'' && s[i] != '"')) return false;
    const char q = s[i++];
    const size_t end = s.find(q, i);
    if (end == std::string_view::npos) return false;
    out = std::string(s.substr(i, end - i));
    i = end + 1;
    return true;
  }
  bool word(std::string& out) {
    skip_ws();
    size_t j = i;
    while (j < s.size() && ((s[j] >= 'A' && s[j] <= 'Z') || (s[j] >= 'a' && s[j] <= 'z'))) ++j;
    if (j == i) return false;
    out = std::string(s.substr(i, j - i));
    i = j;
    return true;
  }
  bool integer(int64_t& out) {
    skip_ws();
    size_t j = i;
    int64_t v = 0;
    while (j < s.size() && s[j] >= '0' && s[j] <= '9') {
      if (v > (int64_t(1) << 50)) return false;  // absurd dimension
      v = v * 10 + (s[j] - '0');
      ++j;
    }
    if (j == i) return false;
    // numpy on some platforms writes "3L" (Python 2 longs).
    if (j < s.size() && s[j] == 'L') ++j;
    out = v;
    i = j;
    return true;
  }
};

Status parse_header(const std::string& path, std::string_view h, std::vector<int64_t>& shape) {
  auto bad = [&](std::string_view what) {
    return corrupt(fmt::format("{}: npy header {}: {}", path, what, h));
  };
  Cursor c{h};
  if (!c.eat('{')) return bad("is not a dict");
  bool have_descr = false, have_order = false, have_shape = false;
  while (!c.eat('}')) {
    std::string key;
    if (!c.quoted(key) || !c.eat(':')) return bad("has a malformed key");
    if (key == "descr") {
      std::string descr;
      if (!c.quoted(descr)) return bad("has a malformed descr");
      if (descr != "<f4") {
        return unsupported(fmt::format("{}: npy dtype '{}' is not supported (only '<f4', float32)", path, descr));
      }
      have_descr = true;
    } else if (key == "fortran_order") {
      std::string v;
      if (!c.word(v) || (v != "False" && v != "True")) return bad("has a malformed fortran_order");
      if (v == "True") return unsupported(fmt::format("{}: Fortran-order npy arrays are not supported", path));
      have_order = true;
    } else if (key == "shape") {
      if (!c.eat('(')) return bad("has a malformed shape");
      shape.clear();
      while (!c.eat(')')) {
        int64_t d = 0;
        if (!c.integer(d)) return bad("has a malformed shape");
        shape.push_back(d);
        if (int64_t(shape.size()) > kMaxDims) return bad("has too many dimensions");
        if (!c.eat(',')) {
          if (!c.eat(')')) return bad("has a malformed shape");
          break;
        }
      }
      have_shape = true;
    } else {
      return bad(fmt::format("has an unknown key '{}'", key));
    }
    if (!c.eat(',')) {
      if (!c.eat('}')) return bad("is not a dict");
      break;
    }
  }
  if (!have_descr || !have_order || !have_shape) return bad("lacks descr, fortran_order or shape");
  return Status::ok();
}

}  // namespace

Status write_npy_f32(const std::string& path, std::span<const int64_t> shape, std::span<const float> data) {
  int64_t numel = 1;
  std::string dims;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) return invalid_argument(fmt::format("{}: negative npy dimension {}", path, shape[i]));
    numel *= shape[i];
    dims += fmt::format("{}{}", i ? ", " : "", shape[i]);
  }
  if (shape.size() == 1) dims += ',';  // "(5,)": a one-element tuple keeps its comma
  if (numel != int64_t(data.size())) {
    return invalid_argument(fmt::format("{}: npy shape holds {} values but {} were given", path, numel, data.size()));
  }
  std::string header = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}), }}", dims);
  // magic(6) + version(2) + u16 length + header + '\n' is padded to 64 bytes.
  const size_t prefix = kMagicLen + 2 + 2;
  const size_t total = (prefix + header.size() + 1 + 63) / 64 * 64;
  header.append(total - prefix - header.size() - 1, ' ');
  header.push_back('\n');
  if (header.size() > 0xffff) return invalid_argument(fmt::format("{}: npy header too long", path));

  File f(std::fopen(path.c_str(), "wb"));
  if (!f) return io_error(fmt::format("{}: cannot open for writing: {}", path, std::strerror(errno)));
  const uint8_t version[2] = {1, 0};
  const uint8_t len[2] = {uint8_t(header.size() & 0xff), uint8_t(header.size() >> 8)};
  bool ok = std::fwrite(kMagic, 1, kMagicLen, f.get()) == kMagicLen &&
            std::fwrite(version, 1, 2, f.get()) == 2 && std::fwrite(len, 1, 2, f.get()) == 2 &&
            std::fwrite(header.data(), 1, header.size(), f.get()) == header.size() &&
            std::fwrite(data.data(), sizeof(float), data.size(), f.get()) == data.size();
  ok = (std::fclose(f.release()) == 0) && ok;
  if (!ok) return io_error(fmt::format("{}: write failed: {}", path, std::strerror(errno)));
  return Status::ok();
}

Result<NpyArray> read_npy_f32(const std::string& path) {
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) return not_found(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  if (std::fseek(f.get(), 0, SEEK_END) != 0) return io_error(fmt::format("{}: cannot seek", path));
  const long size = std::ftell(f.get());
  std::rewind(f.get());

  uint8_t pre[12];
  if (size < 10 || std::fread(pre, 1, 10, f.get()) != 10 || std::memcmp(pre, kMagic, kMagicLen) != 0) {
    return corrupt(fmt::format("{}: not an npy file (bad magic)", path));
  }
  const int major = pre[6];
  size_t header_len = 0, prefix = 10;
  if (major == 1) {
    header_len = size_t(pre[8]) | size_t(pre[9]) << 8;
  } else if (major == 2 || major == 3) {
    if (std::fread(pre + 10, 1, 2, f.get()) != 2) return corrupt(fmt::format("{}: truncated npy header", path));
    header_len = size_t(pre[8]) | size_t(pre[9]) << 8 | size_t(pre[10]) << 16 | size_t(pre[11]) << 24;
    prefix = 12;
  } else {
    return unsupported(fmt::format("{}: npy format version {}.{} is not supported", path, major, int(pre[7])));
  }
  if (prefix + header_len > size_t(size)) return corrupt(fmt::format("{}: npy header runs past the end of the file", path));
  std::string header(header_len, '\0');
  if (std::fread(header.data(), 1, header_len, f.get()) != header_len) {
    return corrupt(fmt::format("{}: truncated npy header", path));
  }

  NpyArray out;
  AFF_RETURN_IF_ERROR(parse_header(path, header, out.shape));
  int64_t numel = 1;
  for (int64_t d : out.shape) {
    if (d != 0 && numel > (int64_t(1) << 40) / d) return corrupt(fmt::format("{}: npy shape is absurdly large", path));
    numel *= d;
  }
  const uint64_t want = uint64_t(numel) * sizeof(float);
  const uint64_t have = uint64_t(size) - prefix - header_len;
  if (have != want) {
    return corrupt(fmt::format("{}: npy shape needs {} data bytes but the file has {}", path, want, have));
  }
  out.data.resize(size_t(numel));
  if (std::fread(out.data.data(), sizeof(float), out.data.size(), f.get()) != out.data.size()) {
    return io_error(fmt::format("{}: read failed", path));
  }
  return out;
}

}  // namespace aff::format
