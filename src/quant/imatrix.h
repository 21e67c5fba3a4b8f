// Importance matrices (imatrix) for importance-weighted rounding, read from either of
// llama.cpp's formats (v4-formats-and-api.md §4.5):
//   legacy .dat: i32 n_entries; per entry i32 name_len, name, i32 ncall, i32 nval,
//                f32[nval] (stored as mean-of-squares × ncall); optional trailer;
//   GGUF:        general.type = "imatrix"; per weight "<name>.in_sum2" F32 [n_cols, n_mat]
//                (raw Σx²) and "<name>.counts" F32 [1, n_mat] (tokens per matrix).
// Either way an entry yields, per matrix m (an expert of a stacked tensor, or the one
// matrix of a 2-D weight), the mean squared activation each input column met. GGUF
// files also keep per-expert token counts, which become the expert popularity profile;
// the legacy format has one count per tensor, so it carries no popularity.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "affinity/status.h"

namespace aff::quant {

struct ImatrixEntry {
  std::string name;                // GGUF weight name, "blk.3.ffn_up_exps.weight"
  std::vector<float> mean_sq;      // [n_mat * n_cols] flattened; matrix m at [m*n_cols, (m+1)*n_cols)
  std::vector<float> counts;       // GGUF: [n_mat] tokens per matrix; legacy: [1] = ncall
  int64_t n_mat = 0;               // GGUF: known; legacy: 0 (inferred from the tensor's width)
};

class Imatrix {
 public:
  enum class Format { kLegacy, kGguf };

  // Reads `path`, GGUF if it starts with the GGUF magic, else legacy.
  static Result<Imatrix> load(const std::string& path);
  // Parses a legacy .dat image; `label` names it in errors.
  static Result<Imatrix> parse_legacy(std::span<const uint8_t> bytes, const std::string& label);
  // Reads a GGUF imatrix file.
  static Result<Imatrix> load_gguf(const std::string& path);

  Format format() const { return format_; }
  const std::string& source() const { return source_; }
  size_t size() const { return entries_.size(); }
  const ImatrixEntry* find(std::string_view name) const;

  // Importance row of matrix m (of n_mat) of tensor `name`, whose rows have n_cols inputs:
  // an empty span when the file has no entry or that matrix never saw a token, an error
  // (naming the file and tensor) when the entry's size does not fit n_mat × n_cols.
  Result<std::span<const float>> importance(std::string_view name, int64_t n_cols, int64_t n_mat,
                                            int64_t m) const;

  // Per-matrix token counts of `name` when the file has them (GGUF) and n_mat matches.
  std::optional<std::vector<float>> matrix_counts(std::string_view name, int64_t n_mat) const;

 private:
  Format format_ = Format::kLegacy;
  std::string source_;
  std::vector<ImatrixEntry> entries_;
  std::unordered_map<std::string, size_t> by_name_;
  void index();
};

}  // namespace aff::quant
