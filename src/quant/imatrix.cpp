#include "quant/imatrix.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

#include <fmt/format.h>

#include "format/gguf_reader.h"

namespace aff::quant {
namespace {

constexpr int32_t kMaxNameLength = 4096;

class Cursor {
 public:
  Cursor(std::span<const uint8_t> b) : b_(b) {}
  bool read_i32(int32_t* v) {
    if (b_.size() - pos_ < 4) return false;
    std::memcpy(v, b_.data() + pos_, 4);
    pos_ += 4;
    return true;
  }
  bool read_bytes(size_t n, const uint8_t** p) {
    if (b_.size() - pos_ < n) return false;
    *p = b_.data() + pos_;
    pos_ += n;
    return true;
  }
  size_t pos() const { return pos_; }
  size_t left() const { return b_.size() - pos_; }

 private:
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
};

Status check_values(const std::string& label, const std::string& name, std::span<const float> v) {
  for (float x : v) {
    if (!std::isfinite(x) || x < 0.0f) {
      return corrupt(fmt::format("{}: imatrix entry '{}' holds a negative or non-finite value", label, name));
    }
  }
  return Status::ok();
}

}  // namespace

void Imatrix::index() {
  by_name_.clear();
  for (size_t i = 0; i < entries_.size(); ++i) by_name_[entries_[i].name] = i;
}

const ImatrixEntry* Imatrix::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

Result<Imatrix> Imatrix::load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found(fmt::format("{}: cannot open imatrix file", path));
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (bytes.size() >= 4) {
    uint32_t magic;
    std::memcpy(&magic, bytes.data(), 4);
    if (magic == format::kGgufMagic) return load_gguf(path);
  }
  return parse_legacy(bytes, path);
}

Result<Imatrix> Imatrix::parse_legacy(std::span<const uint8_t> bytes, const std::string& label) {
  Cursor c(bytes);
  int32_t n_entries = 0;
  if (!c.read_i32(&n_entries)) return corrupt(fmt::format("{}: imatrix too short for its entry count", label));
  // Each entry takes at least 12 bytes, which bounds a hostile count.
  if (n_entries <= 0 || uint64_t(n_entries) * 12 > c.left()) {
    return corrupt(fmt::format("{}: imatrix entry count {} does not fit the file", label, n_entries));
  }
  Imatrix m;
  m.format_ = Format::kLegacy;
  m.source_ = label;
  for (int32_t i = 0; i < n_entries; ++i) {
    int32_t len = 0, ncall = 0, nval = 0;
    const uint8_t* p = nullptr;
    if (!c.read_i32(&len) || len <= 0 || len > kMaxNameLength || !c.read_bytes(size_t(len), &p)) {
      return corrupt(fmt::format("{}: imatrix entry {}: bad name length {} at byte {}", label, i, len, c.pos()));
    }
    ImatrixEntry e;
    e.name.assign(reinterpret_cast<const char*>(p), size_t(len));
    if (!c.read_i32(&ncall) || !c.read_i32(&nval) || nval <= 0 || uint64_t(nval) * 4 > c.left()) {
      return corrupt(fmt::format("{}: imatrix entry '{}': bad value count {}", label, e.name, nval));
    }
    if (ncall < 0) return corrupt(fmt::format("{}: imatrix entry '{}': negative call count {}", label, e.name, ncall));
    c.read_bytes(size_t(nval) * 4, &p);
    e.mean_sq.resize(size_t(nval));
    std::memcpy(e.mean_sq.data(), p, size_t(nval) * 4);
    AFF_RETURN_IF_ERROR(check_values(label, e.name, e.mean_sq));
    // Stored values are mean-of-squares × ncall.
    if (ncall > 0) {
      for (float& v : e.mean_sq) v /= float(ncall);
    }
    e.counts = {float(ncall)};
    if (m.find(e.name) != nullptr) return corrupt(fmt::format("{}: imatrix entry '{}' appears twice", label, e.name));
    m.entries_.push_back(std::move(e));
    m.index();
  }
  // The trailer (last chunk, dataset name) is optional and not needed.
  return m;
}

Result<Imatrix> Imatrix::load_gguf(const std::string& path) {
  AFF_ASSIGN_OR_RETURN(format::GgufFile g, format::GgufFile::open(path));
  if (const auto* t = g.find("general.type"); t != nullptr) {
    const auto s = t->as_string();
    if (!s || *s != "imatrix") {
      return invalid_argument(fmt::format("{}: general.type is not \"imatrix\"; not an imatrix file", path));
    }
  }
  Imatrix m;
  m.format_ = Format::kGguf;
  m.source_ = path;
  constexpr std::string_view kSum2 = ".in_sum2";
  for (const auto& t : g.tensors()) {
    if (t.name.size() <= kSum2.size() || t.name.compare(t.name.size() - kSum2.size(), kSum2.size(), kSum2) != 0) {
      continue;
    }
    const std::string base = t.name.substr(0, t.name.size() - kSum2.size());
    const auto* counts = g.find_tensor(base + ".counts");
    if (counts == nullptr) return corrupt(fmt::format("{}: '{}' has no matching '{}.counts'", path, t.name, base));
    if (t.type != GgmlType::kF32 || counts->type != GgmlType::kF32) {
      return corrupt(fmt::format("{}: imatrix tensors of '{}' must be F32", path, base));
    }
    const int64_t n_cols = t.ne[0];
    const int64_t n_mat = t.n_rows();
    if (counts->n_elements() != n_mat) {
      return corrupt(fmt::format("{}: '{}.counts' has {} entries for {} matrices", path, base,
                                 counts->n_elements(), n_mat));
    }
    ImatrixEntry e;
    e.name = base;
    e.n_mat = n_mat;
    e.mean_sq.resize(size_t(n_cols * n_mat));
    e.counts.resize(size_t(n_mat));
    std::memcpy(e.mean_sq.data(), g.tensor_data(t).data(), e.mean_sq.size() * 4);
    std::memcpy(e.counts.data(), g.tensor_data(*counts).data(), e.counts.size() * 4);
    AFF_RETURN_IF_ERROR(check_values(path, base, e.mean_sq));
    AFF_RETURN_IF_ERROR(check_values(path, base + ".counts", e.counts));
    for (int64_t mi = 0; mi < n_mat; ++mi) {
      const float cnt = e.counts[size_t(mi)];
      for (int64_t j = 0; j < n_cols; ++j) {
        float& v = e.mean_sq[size_t(mi * n_cols + j)];
        v = cnt > 0.0f ? v / cnt : 0.0f;
      }
    }
    m.entries_.push_back(std::move(e));
  }
  if (m.entries_.empty()) return corrupt(fmt::format("{}: GGUF imatrix has no '*.in_sum2' tensors", path));
  m.index();
  return m;
}

Result<std::span<const float>> Imatrix::importance(std::string_view name, int64_t n_cols, int64_t n_mat,
                                                   int64_t mi) const {
  const ImatrixEntry* e = find(name);
  if (e == nullptr) return std::span<const float>{};
  if (int64_t(e->mean_sq.size()) != n_cols * n_mat || (e->n_mat != 0 && e->n_mat != n_mat)) {
    return invalid_argument(fmt::format("{}: imatrix entry '{}' has {} values, the tensor needs {} x {}", source_,
                                        e->name, e->mean_sq.size(), n_mat, n_cols));
  }
  const float count = e->counts.size() == size_t(n_mat) ? e->counts[size_t(mi)] : e->counts[0];
  if (!(count > 0.0f)) return std::span<const float>{};
  std::span<const float> row(e->mean_sq.data() + mi * n_cols, size_t(n_cols));
  // All zeros (a matrix that met only zero inputs) would zero every weight's importance:
  // treat it as absent. Legacy files write never-hit experts as ones, which is uniform.
  bool all_zero = true;
  for (float v : row) all_zero = all_zero && v == 0.0f;
  if (all_zero) return std::span<const float>{};
  return row;
}

std::optional<std::vector<float>> Imatrix::matrix_counts(std::string_view name, int64_t n_mat) const {
  const ImatrixEntry* e = find(name);
  if (e == nullptr || format_ != Format::kGguf || e->n_mat != n_mat) return std::nullopt;
  return e->counts;
}

}  // namespace aff::quant
