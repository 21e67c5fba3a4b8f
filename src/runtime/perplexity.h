// Teacher-forced quality statistics of a text on the CPU reference model:
// negative log-likelihood, perplexity and top-1 accuracy of the main head
// (token i+1 from position i) and of the MTP head (token i+2 from position i),
// plus how often the MTP head's greedy draft equals the main model's own greedy
// choice for the same token (the acceptance rate of a one-token speculative
// draft). The text is cut into consecutive chunks; each chunk is scored from a
// fresh state, so its first token has no history.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "affinity/status.h"
#include "model/dsv4/forward.h"
#include "model/dsv4/loaded_model.h"

namespace aff::runtime {

// One chunk: the ids fed to the model (a BOS in front when one was inserted)
// and where its text tokens start in the whole text.
struct TextChunk {
  int64_t text_begin = 0;
  int64_t text_tokens = 0;      // text tokens it covers
  bool inserted_bos = false;
  std::vector<int32_t> ids;     // [positions]: (BOS) + text[text_begin, text_begin + text_tokens)
};

// Consecutive chunks of at most `context` positions over `text`. With
// bos_each_chunk, a chunk whose first text token is not BOS gets BOS in front
// (and takes context - 1 text tokens); without it, chunks are plain slices of
// `context` tokens. Chunks of one position (nothing to predict) are dropped.
std::vector<TextChunk> split_into_chunks(std::span<const int32_t> text, int64_t context, bool bos_each_chunk,
                                         int32_t bos_id);

struct PerplexityOptions {
  int64_t context = 1024;        // positions per chunk (BOS included)
  bool bos_each_chunk = true;
  int32_t bos_id = 0;
  int64_t batch = 0;             // positions per forward call inside a chunk; 0 = the whole chunk
  bool score = true;             // false: only run the model (for route_observer); no head, no MTP
  bool mtp = true;               // also score the MTP head when the model has one
  int max_layers = -1;           // debug options passed to the forward pass
  bool no_routed_experts = false;
  // Sees every MoE layer's routing (the MTP block's too, as layer num_layers,
  // when it is scored); positions count all chunks' positions in order (BOS
  // insertions included), so they grow across the whole text.
  const dsv4::RouteObserver* route_observer = nullptr;
  // Called after each chunk with the totals so far (progress display).
  std::function<void(int64_t chunks_done, int64_t chunks_total)> progress;
};

// Predictions of one head.
struct HeadStats {
  int64_t predictions = 0;
  double nll_sum = 0.0;         // sum of -log p(target), natural log
  int64_t top1_hits = 0;        // argmax (lowest id on ties) == target
  double mean_nll() const;
  double perplexity() const;    // exp(mean_nll)
  double top1() const;          // fraction
};

struct PerplexityReport {
  int64_t text_tokens = 0;      // tokens of the text
  int64_t chunks = 0;
  int64_t positions = 0;        // positions run through the main model
  int64_t context = 0;
  bool bos_each_chunk = true;
  HeadStats main;
  bool has_mtp = false;
  HeadStats mtp;                // token i+2 from position i (rows with i+2 inside the chunk)
  int64_t draft_rows = 0;       // MTP rows compared with the main model's argmax at i+1
  int64_t draft_agree = 0;
  double seconds = 0.0;         // wall time of the model runs
  double draft_acceptance() const;
};

// Scores `text` (token ids, no BOS added by the caller unless wanted).
Result<PerplexityReport> evaluate_perplexity(const dsv4::LoadedModel& model, std::span<const int32_t> text,
                                             const PerplexityOptions& opts);

// A small fixed-width table (one row per head) for stdout.
std::string perplexity_table(const PerplexityReport& r);
nlohmann::json perplexity_json(const PerplexityReport& r);

}  // namespace aff::runtime
