// The BPE model of a byte-level tokenizer.json: vocab + ranked merges, applied
// to one pre-tokenized piece at a time. Merging follows HF tokenizers' Word
// merge loop exactly (lowest rank first, leftmost on ties, via a heap), so
// pieces whose merge order is ambiguous still give HF's ids.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "affinity/status.h"

namespace aff::tokenizer {

struct BpeOptions {
  bool ignore_merges = false;  // a piece that is itself in the vocab becomes one token
  int32_t unk_id = -1;         // id for bytes missing from the vocab; -1: drop them (HF)
  bool fuse_unk = false;       // consecutive unknown bytes give one unk token
};

class BpeModel {
 public:
  // vocab: byte-level token string (GPT-2 unicode form) -> id.
  // merges: (left, right) token strings, best rank first. `where` names the
  // file in error messages.
  static Result<BpeModel> build(std::unordered_map<std::string, int32_t> vocab,
                                const std::vector<std::pair<std::string, std::string>>& merges,
                                const BpeOptions& options, const std::string& where);
  BpeModel(BpeModel&& o) noexcept;
  BpeModel& operator=(BpeModel&&) = delete;

  // Appends the ids of one piece, given as raw bytes (not yet byte-level mapped).
  void encode_piece(std::string_view bytes, std::vector<int32_t>& out) const;

  int32_t token_id(std::string_view token) const;  // -1 if not in the vocab
  const std::unordered_map<std::string, int32_t>& vocab() const { return vocab_; }

 private:
  BpeModel() = default;
  void merge_piece(std::string_view bytes, std::vector<int32_t>& out) const;

  // Open-addressing map (left id, right id) -> (rank, merged id). The merge
  // lookup is the innermost operation of encoding, so it avoids std::unordered_map.
  struct MergeSlot {
    uint64_t key = kEmptyKey;
    int32_t rank = 0;
    int32_t merged_id = 0;
  };
  static constexpr uint64_t kEmptyKey = ~uint64_t(0);
  static uint64_t merge_key(int32_t left, int32_t right) {
    return uint64_t(uint32_t(left)) << 32 | uint32_t(right);
  }
  void merge_insert(int32_t left, int32_t right, int32_t rank, int32_t merged_id);
  const MergeSlot* merge_find(int32_t left, int32_t right) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::array<int32_t, 256> byte_id_{};  // id of each single byte's token, -1 if absent
  std::vector<MergeSlot> merges_;       // size is a power of two
  uint64_t merge_mask_ = 0;
  BpeOptions options_;

  // Piece -> ids. Prompts repeat words a lot; bounded so a hostile prompt of
  // unique pieces cannot grow memory without limit.
  static constexpr size_t kCacheMaxEntries = 1 << 16;
  static constexpr size_t kCacheMaxPieceBytes = 64;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace aff::tokenizer
