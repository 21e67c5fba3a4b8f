#include "tokenizer/bpe_model.h"

#include <algorithm>

#include "tokenizer/byte_level.h"

namespace aff::tokenizer {

BpeModel::BpeModel(BpeModel&& o) noexcept
    : vocab_(std::move(o.vocab_)),
      byte_id_(o.byte_id_),
      merges_(std::move(o.merges_)),
      merge_mask_(o.merge_mask_),
      options_(o.options_),
      cache_(std::move(o.cache_)) {}

namespace {
uint64_t mix64(uint64_t x) {
  // splitmix64 finaliser: ids are small and dense, so spread them out.
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}
}  // namespace

void BpeModel::merge_insert(int32_t left, int32_t right, int32_t rank, int32_t merged_id) {
  const uint64_t key = merge_key(left, right);
  for (uint64_t i = mix64(key) & merge_mask_;; i = (i + 1) & merge_mask_) {
    MergeSlot& s = merges_[i];
    if (s.key == kEmptyKey || s.key == key) {
      // A repeated pair keeps its last rank, as HF's map building does.
      s = {key, rank, merged_id};
      return;
    }
  }
}

const BpeModel::MergeSlot* BpeModel::merge_find(int32_t left, int32_t right) const {
  const uint64_t key = merge_key(left, right);
  for (uint64_t i = mix64(key) & merge_mask_;; i = (i + 1) & merge_mask_) {
    const MergeSlot& s = merges_[i];
    if (s.key == key) return &s;
    if (s.key == kEmptyKey) return nullptr;
  }
}

Result<BpeModel> BpeModel::build(std::unordered_map<std::string, int32_t> vocab,
                                 const std::vector<std::pair<std::string, std::string>>& merges,
                                 const BpeOptions& options, const std::string& where) {
  BpeModel m;
  m.options_ = options;
  for (int b = 0; b < 256; ++b) {
    auto it = vocab.find(byte_to_unicode_utf8(uint8_t(b)));
    m.byte_id_[size_t(b)] = it == vocab.end() ? -1 : it->second;
  }
  size_t cap = 16;
  while (cap < merges.size() * 2) cap <<= 1;
  m.merges_.assign(cap, MergeSlot{});
  m.merge_mask_ = cap - 1;
  std::string joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    auto ia = vocab.find(a);
    auto ib = vocab.find(b);
    joined.assign(a).append(b);
    auto ij = vocab.find(joined);
    if (ia == vocab.end() || ib == vocab.end() || ij == vocab.end()) {
      const std::string& missing = ia == vocab.end() ? a : ib == vocab.end() ? b : joined;
      return corrupt(where + ": model.merges[" + std::to_string(rank) + "] (\"" + a + " " + b +
                     "\") uses \"" + missing + "\", which is not in model.vocab");
    }
    m.merge_insert(ia->second, ib->second, int32_t(rank), ij->second);
  }
  m.vocab_ = std::move(vocab);
  return m;
}

int32_t BpeModel::token_id(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  return it == vocab_.end() ? -1 : it->second;
}

void BpeModel::encode_piece(std::string_view bytes, std::vector<int32_t>& out) const {
  if (bytes.size() == 1 && byte_id_[static_cast<uint8_t>(bytes[0])] >= 0) {
    out.push_back(byte_id_[static_cast<uint8_t>(bytes[0])]);
    return;
  }
  const bool cacheable = bytes.size() <= kCacheMaxPieceBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto it = cache_.find(std::string(bytes));
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  merge_piece(bytes, out);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() < kCacheMaxEntries) {
      cache_.emplace(std::string(bytes), std::vector<int32_t>(out.begin() + long(first), out.end()));
    }
  }
}

void BpeModel::merge_piece(std::string_view bytes, std::vector<int32_t>& out) const {
  if (options_.ignore_merges) {
    std::string word;
    for (char c : bytes) word += byte_to_unicode_utf8(static_cast<uint8_t>(c));
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Doubly linked symbols over the piece; a merged-away symbol gets len 0.
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    int32_t len;
  };
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t merged_id;
  };
  thread_local std::vector<Symbol> syms;
  thread_local std::vector<Candidate> heap;
  syms.clear();
  heap.clear();
  for (char c : bytes) {
    const int32_t id = byte_id_[static_cast<uint8_t>(c)];
    if (id >= 0) {
      syms.push_back({id, 0, 0, 1});
    } else if (options_.unk_id >= 0) {
      if (options_.fuse_unk && !syms.empty() && syms.back().id == options_.unk_id) {
        syms.back().len += 1;
      } else {
        syms.push_back({options_.unk_id, 0, 0, 1});
      }
    }  // else: HF drops a byte it has no token for
  }
  const int32_t n = int32_t(syms.size());
  for (int32_t i = 0; i < n; ++i) {
    syms[size_t(i)].prev = i - 1;
    syms[size_t(i)].next = i + 1 < n ? i + 1 : -1;
  }
  // Min-heap on (rank, pos): std heap functions build a max-heap, so invert.
  auto later = [](const Candidate& x, const Candidate& y) {
    return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos;
  };
  auto push = [&](int32_t pos) {
    const Symbol& l = syms[size_t(pos)];
    if (l.next < 0) return;
    if (const MergeSlot* m = merge_find(l.id, syms[size_t(l.next)].id)) {
      heap.push_back({m->rank, pos, m->merged_id});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = syms[size_t(top.pos)];
    if (left.len == 0 || left.next < 0) continue;
    const Symbol right = syms[size_t(left.next)];
    // Stale candidate: the pair at this position changed since it was queued.
    const MergeSlot* now = merge_find(left.id, right.id);
    if (!now || now->merged_id != top.merged_id) continue;
    syms[size_t(left.next)].len = 0;
    left.id = top.merged_id;
    left.len += right.len;
    left.next = right.next;
    if (right.next >= 0) syms[size_t(right.next)].prev = top.pos;
    if (left.prev >= 0) push(left.prev);
    push(top.pos);
  }
  for (const Symbol& s : syms) {
    if (s.len > 0) out.push_back(s.id);
  }
}

}  // namespace aff::tokenizer
