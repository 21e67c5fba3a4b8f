// The option table: every command-line flag and environment variable of the
// affinity binary is declared once in options.cpp (name, value kind, default,
// help, env var). The same table parses argv, prints --help and generates
// docs/config.md (`affinity --help-md`), so the three can never disagree.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "affinity/status.h"

namespace aff::core {

// Every setting, filled from the table's defaults, then the environment, then
// argv. No member initialisers here on purpose: the table holds the defaults.
struct Options {
  // Model
  std::string model;            // checkpoint directory; "" = embedded default
  std::string tokenizer;        // tokenizer.json; "" = <model>/tokenizer.json
  int threads;                  // 0 = all cores
  int64_t ctx_size;             // 0 = model maximum (capped)
  // Generation
  std::string prompt;
  std::string prompt_file;
  std::vector<int32_t> tokens;  // prompt given as ids
  int n_predict;
  bool ignore_eos;
  bool no_echo;
  bool no_bos;
  float temp;
  int top_k;
  float top_p;
  float min_p;
  int64_t seed;                 // -1 = from the clock
  // Server (used when no prompt is given)
  std::string host;
  int port;
  int64_t max_tokens_floor;
  int parallel;
  // Performance
  int prefill_chunk_size;
  int cpu_lane;                 // 1 = SIMD quantised dot products for ggml weights
  std::string gpu;              // auto | on | off
  int64_t kv_size;              // GPU KV address space per session, positions
  int64_t kv_commit;            // GPU KV positions backed at session start
  int64_t gpu_chunk;            // GPU: most tokens per forward call
  // Diagnostics
  bool dump_tokens;
  std::vector<int32_t> force_tokens;
  std::string logits_out;
  int dump_logits;
  int max_layers;               // 0 = all
  bool no_routed_experts;
  // Evaluation
  std::string perplexity;       // text file to score
  std::string route_stats;      // text file whose expert routing is summarised
  int64_t ppl_context;
  std::string json_out;
  // Informational
  bool help;
  bool help_md;
  bool version;

  // Long names of the flags given on the command line or through the
  // environment (as opposed to defaults), e.g. "--tokens".
  std::vector<std::string> given;
  bool was_given(std::string_view long_name) const;
};

enum class OptionKind { kFlag, kInt, kFloat, kString, kIdList };

struct OptionSpec {
  std::string_view group;         // section heading in --help and docs/config.md
  std::string_view short_name;    // "-n" or ""
  std::string_view long_name;     // "--n-predict"
  std::string_view metavar;       // "N", "F", "DIR", ... ("" for flags)
  OptionKind kind = OptionKind::kFlag;
  std::string_view default_value; // parsed like a command-line value; "" = empty
  std::string_view default_note;  // what the default means, for the help ("32", "0 = off")
  std::string_view help;
  std::string_view env;           // "AFF_THREADS" or ""
  double min = 0, max = 0;        // numeric range (inclusive) when min < max
  std::function<void(Options&, const std::string&)> set_string;  // kString
  std::function<void(Options&, int64_t)> set_int;                 // kInt, kFlag (1)
  std::function<void(Options&, double)> set_float;                // kFloat
  std::function<void(Options&, std::vector<int32_t>)> set_ids;    // kIdList
};

const std::vector<OptionSpec>& option_table();

// Returns a getenv-like lookup: nullptr when unset.
using EnvLookup = std::function<const char*(const char*)>;

// Parses args (argv without argv[0]). Defaults first, then environment
// variables, then argv. Unknown flags, missing or malformed values, values out
// of range, stray positional arguments and contradictory combinations give an
// kInvalidArgument Status whose message names the flag (or variable).
Result<Options> parse_options(std::span<const std::string> args, const EnvLookup& env = {});

std::string options_help(std::string_view program);  // --help text
std::string options_markdown();                      // docs/config.md body

// Strict number parsing shared with other front ends: the whole string must be
// the number (no trailing junk, no empty string).
bool parse_int64(std::string_view s, int64_t& out);
bool parse_double(std::string_view s, double& out);
// "5,17, 3" -> {5, 17, 3}; ids must be non-negative 32-bit integers.
bool parse_id_list(std::string_view s, std::vector<int32_t>& out);

}  // namespace aff::core
