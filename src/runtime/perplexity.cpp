#include "runtime/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>

#include <fmt/format.h>

#include "model/dsv4/mtp.h"

namespace aff::runtime {
namespace {

// -log softmax(row)[target] in double (the sum over a long text must not lose
// digits), and the row's argmax (lowest id on ties). row: [vocab].
struct RowScore {
  double nll;
  int32_t argmax;
};

RowScore score_row(const float* row, int64_t vocab, int32_t target) {
  int32_t best = 0;
  for (int64_t v = 1; v < vocab; ++v)
    if (row[v] > row[best]) best = int32_t(v);
  const double m = row[best];
  double sum = 0.0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - m);
  return {m + std::log(sum) - double(row[target]), best};
}

int32_t argmax_row(const float* row, int64_t vocab) {
  return int32_t(std::max_element(row, row + vocab) - row);  // first maximum = lowest id
}

void add(HeadStats& s, const RowScore& r, int32_t target) {
  ++s.predictions;
  s.nll_sum += r.nll;
  s.top1_hits += r.argmax == target ? 1 : 0;
}

// Runs one chunk from fresh states and adds its statistics to rep.
//   state: main-model state; mtp_state: null when the MTP head is not scored.
Status run_chunk(const dsv4::LoadedModel& model, const TextChunk& chunk, const PerplexityOptions& opts,
                 int64_t stream_pos0, dsv4::State& state, dsv4::State* mtp_state, PerplexityReport& rep) {
  const dsv4::ModelConfig& cfg = model.config;
  const int64_t V = cfg.vocab_size;
  const int64_t row_values = int64_t(cfg.hc_mult) * cfg.hidden_size;
  const std::span<const int32_t> ids(chunk.ids);
  const int64_t n = int64_t(ids.size());
  dsv4::state_reset(state);
  if (mtp_state != nullptr) dsv4::state_reset(*mtp_state);

  // The observer sees positions of the whole evaluated stream.
  dsv4::RouteObserver shifted;
  dsv4::ForwardOptions fo;
  fo.max_layers = opts.max_layers;
  fo.no_routed_experts = opts.no_routed_experts;
  if (opts.route_observer != nullptr) {
    shifted = [&](int layer, int64_t pos0, const dsv4::Routing& r) { (*opts.route_observer)(layer, stream_pos0 + pos0, r); };
    fo.route_observer = &shifted;
  }
  std::vector<float> hidden, logits, mtp_logits;
  if (mtp_state != nullptr) fo.hidden_out = &hidden;
  std::vector<int32_t> main_argmax(size_t(n), -1), mtp_argmax(size_t(n), -1);
  std::vector<float> pending;   // streams of rows [mtp_done, b) not yet through the MTP block
  int64_t mtp_done = 0;
  const int64_t step = opts.batch > 0 ? opts.batch : n;

  for (int64_t a = 0; a < n; a += step) {
    const int64_t b = std::min(n, a + step);
    AFF_RETURN_IF_ERROR(dsv4::forward(model, state, ids.subspan(size_t(a), size_t(b - a)), opts.score, logits, fo));
    rep.positions += b - a;
    if (!opts.score) continue;
    for (int64_t i = a; i < b; ++i) {
      const float* row = logits.data() + (i - a) * V;
      if (i + 1 < n) {
        const RowScore s = score_row(row, V, ids[size_t(i + 1)]);
        add(rep.main, s, ids[size_t(i + 1)]);
        main_argmax[size_t(i)] = s.argmax;
      } else {
        main_argmax[size_t(i)] = argmax_row(row, V);
      }
    }
    if (mtp_state == nullptr) continue;
    // MTP row t needs the token at t+1 and is scored against t+2, so rows up
    // to n-3 run; a row whose next token lies in the next piece waits for it.
    pending.insert(pending.end(), hidden.begin(), hidden.end());
    const int64_t rows_end = std::min(b, n - 2);
    if (rows_end <= mtp_done) continue;
    const int64_t cnt = rows_end - mtp_done;
    AFF_RETURN_IF_ERROR(dsv4::mtp_forward(model, *mtp_state,
                                          std::span<const float>(pending.data(), size_t(cnt * row_values)),
                                          ids.subspan(size_t(mtp_done + 1), size_t(cnt)), true, mtp_logits,
                                          /*block=*/0, fo.route_observer));
    for (int64_t j = 0; j < cnt; ++j) {
      const int64_t t = mtp_done + j;
      const RowScore s = score_row(mtp_logits.data() + j * V, V, ids[size_t(t + 2)]);
      add(rep.mtp, s, ids[size_t(t + 2)]);
      mtp_argmax[size_t(t)] = s.argmax;
    }
    pending.erase(pending.begin(), pending.begin() + cnt * row_values);
    mtp_done = rows_end;
  }
  // Draft acceptance: the MTP's guess for t+2 against the main model's
  // prediction of t+2 (made at t+1, after the true token t+1).
  if (mtp_state != nullptr) {
    for (int64_t t = 0; t + 2 < n; ++t) {
      ++rep.draft_rows;
      rep.draft_agree += mtp_argmax[size_t(t)] == main_argmax[size_t(t + 1)] ? 1 : 0;
    }
  }
  return Status::ok();
}

double ratio(int64_t a, int64_t b) { return b > 0 ? double(a) / double(b) : std::numeric_limits<double>::quiet_NaN(); }

}  // namespace

double HeadStats::mean_nll() const {
  return predictions > 0 ? nll_sum / double(predictions) : std::numeric_limits<double>::quiet_NaN();
}
double HeadStats::perplexity() const { return std::exp(mean_nll()); }
double HeadStats::top1() const { return ratio(top1_hits, predictions); }
double PerplexityReport::draft_acceptance() const { return ratio(draft_agree, draft_rows); }

std::vector<TextChunk> split_into_chunks(std::span<const int32_t> text, int64_t context, bool bos_each_chunk,
                                         int32_t bos_id) {
  std::vector<TextChunk> out;
  const int64_t n = int64_t(text.size());
  int64_t i = 0;
  while (i < n) {
    TextChunk c;
    c.text_begin = i;
    c.inserted_bos = bos_each_chunk && text[size_t(i)] != bos_id;
    const int64_t take = std::min(n - i, c.inserted_bos ? context - 1 : context);
    c.text_tokens = take;
    if (c.inserted_bos) c.ids.push_back(bos_id);
    c.ids.insert(c.ids.end(), text.begin() + i, text.begin() + i + take);
    i += take;
    if (c.ids.size() >= 2) out.push_back(std::move(c));
  }
  return out;
}

Result<PerplexityReport> evaluate_perplexity(const dsv4::LoadedModel& model, std::span<const int32_t> text,
                                             const PerplexityOptions& opts) {
  if (opts.context < 2) return invalid_argument(fmt::format("perplexity context {} is below 2 positions", opts.context));
  for (size_t i = 0; i < text.size(); ++i)
    if (text[i] < 0 || text[i] >= model.config.vocab_size)
      return invalid_argument(fmt::format("token id {} at text position {} is outside the vocabulary [0, {})", text[i],
                                          i, model.config.vocab_size));
  const std::vector<TextChunk> chunks = split_into_chunks(text, opts.context, opts.bos_each_chunk, opts.bos_id);
  if (chunks.empty()) return invalid_argument(fmt::format("the text has {} token(s): nothing to predict", text.size()));

  PerplexityReport rep;
  rep.text_tokens = int64_t(text.size());
  rep.chunks = int64_t(chunks.size());
  rep.context = opts.context;
  rep.bos_each_chunk = opts.bos_each_chunk;
  rep.has_mtp = opts.score && opts.mtp && !model.weights.mtp.empty() && opts.max_layers < 0;
  std::unique_ptr<dsv4::State> state = dsv4::make_state(model, opts.context);
  std::unique_ptr<dsv4::State> mtp_state;
  if (rep.has_mtp) {
    AFF_ASSIGN_OR_RETURN(mtp_state, dsv4::make_mtp_state(model, opts.context));
  }

  const auto t0 = std::chrono::steady_clock::now();
  int64_t stream_pos = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    AFF_RETURN_IF_ERROR(run_chunk(model, chunks[c], opts, stream_pos, *state, mtp_state.get(), rep));
    stream_pos += int64_t(chunks[c].ids.size());
    if (opts.progress) opts.progress(int64_t(c + 1), int64_t(chunks.size()));
  }
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

std::string perplexity_table(const PerplexityReport& r) {
  std::string out = fmt::format("{} text tokens in {} chunks of at most {} positions ({})\n", r.text_tokens, r.chunks,
                                r.context, r.bos_each_chunk ? "BOS at each chunk start" : "no BOS inserted");
  out += fmt::format("{:<22} {:>11} {:>10} {:>11} {:>8}\n", "head", "predictions", "mean NLL", "perplexity", "top-1");
  auto row = [&](const char* name, const HeadStats& s) {
    out += fmt::format("{:<22} {:>11} {:>10.5f} {:>11.4f} {:>7.2f}%\n", name, s.predictions, s.mean_nll(),
                       s.perplexity(), 100.0 * s.top1());
  };
  row("main (token i+1)", r.main);
  if (r.has_mtp) {
    row("MTP (token i+2)", r.mtp);
    out += fmt::format("MTP draft = main model's greedy token: {:.2f}% of {} rows\n", 100.0 * r.draft_acceptance(),
                       r.draft_rows);
  }
  return out;
}

nlohmann::json perplexity_json(const PerplexityReport& r) {
  auto head = [](const HeadStats& s) {
    return nlohmann::json{{"predictions", s.predictions}, {"mean_nll", s.mean_nll()}, {"perplexity", s.perplexity()},
                          {"top1", s.top1()}};
  };
  nlohmann::json j{{"text_tokens", r.text_tokens}, {"chunks", r.chunks},     {"context", r.context},
                   {"bos_each_chunk", r.bos_each_chunk}, {"positions", r.positions}, {"seconds", r.seconds},
                   {"main", head(r.main)}};
  if (r.has_mtp) {
    j["mtp"] = head(r.mtp);
    j["mtp_draft_acceptance"] = r.draft_acceptance();
    j["mtp_draft_rows"] = r.draft_rows;
  }
  return j;
}

}  // namespace aff::runtime
