#include "core/options.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

namespace aff::core {

namespace {

// ---- Table builders: one call per flag keeps each declaration on a few lines.

OptionSpec spec(std::string_view group, std::string_view short_name, std::string_view long_name,
                std::string_view metavar, OptionKind kind, std::string_view def, std::string_view note,
                std::string_view help, std::string_view env, double min = 0, double max = 0) {
  OptionSpec s;
  s.group = group;
  s.short_name = short_name;
  s.long_name = long_name;
  s.metavar = metavar;
  s.kind = kind;
  s.default_value = def;
  s.default_note = note;
  s.help = help;
  s.env = env;
  s.min = min;
  s.max = max;
  return s;
}

OptionSpec flag(std::string_view group, std::string_view short_name, std::string_view long_name,
                bool Options::*member, std::string_view help, std::string_view env = {}) {
  OptionSpec s = spec(group, short_name, long_name, "", OptionKind::kFlag, "", "", help, env);
  s.set_int = [member](Options& o, int64_t v) { o.*member = v != 0; };
  return s;
}

template <typename T>
OptionSpec integer(std::string_view group, std::string_view short_name, std::string_view long_name,
                   std::string_view metavar, T Options::*member, std::string_view def, std::string_view note,
                   double min, double max, std::string_view help, std::string_view env = {}) {
  OptionSpec s = spec(group, short_name, long_name, metavar, OptionKind::kInt, def, note, help, env, min, max);
  s.set_int = [member](Options& o, int64_t v) { o.*member = T(v); };
  return s;
}

OptionSpec real(std::string_view group, std::string_view long_name, std::string_view metavar,
                float Options::*member, std::string_view def, std::string_view note, double min, double max,
                std::string_view help) {
  OptionSpec s = spec(group, "", long_name, metavar, OptionKind::kFloat, def, note, help, {}, min, max);
  s.set_float = [member](Options& o, double v) { o.*member = float(v); };
  return s;
}

OptionSpec text(std::string_view group, std::string_view short_name, std::string_view long_name,
                std::string_view metavar, std::string Options::*member, std::string_view note,
                std::string_view help, std::string_view env = {}, std::string_view def = {}) {
  OptionSpec s = spec(group, short_name, long_name, metavar, OptionKind::kString, def, note, help, env);
  s.set_string = [member](Options& o, const std::string& v) { o.*member = v; };
  return s;
}

OptionSpec ids(std::string_view group, std::string_view long_name, std::vector<int32_t> Options::*member,
               std::string_view help) {
  OptionSpec s = spec(group, "", long_name, "a,b,c", OptionKind::kIdList, "", "", help, {});
  s.set_ids = [member](Options& o, std::vector<int32_t> v) { o.*member = std::move(v); };
  return s;
}

constexpr std::string_view kModel = "Model";
constexpr std::string_view kGen = "Generation";
constexpr std::string_view kServer = "Serving (without a prompt, affinity serves the OpenAI API)";
constexpr std::string_view kPerf = "Performance";
constexpr std::string_view kDiag = "Diagnostics (some of these deliberately produce output that is not the model's)";
constexpr std::string_view kEval = "Evaluation (teacher-forced statistics of a text file; nothing is generated)";
constexpr std::string_view kInfo = "Information";

std::vector<OptionSpec> build_table() {
  using O = Options;
  constexpr double kI32 = 2147483647.0;
  return {
      // Model
      text(kModel, "-m", "--model", "DIR", &O::model, "the embedded default model under models/",
           "Checkpoint directory: config.json, model.safetensors.index.json and shards, tokenizer.json.",
           "AFF_MODEL"),
      text(kModel, "", "--tokenizer", "FILE", &O::tokenizer, "DIR/tokenizer.json", "HF tokenizer.json to use."),
      integer(kModel, "-t", "--threads", "N", &O::threads, "0", "0 = all cores", 0, 4096,
              "CPU threads for the forward pass.", "AFF_THREADS"),
      integer(kModel, "-c", "--ctx-size", "N", &O::ctx_size, "0", "0 = the model's maximum, capped at 65536", 0,
              1e12, "Positions one session may hold (prompt plus generated tokens)."),
      // Generation
      text(kGen, "-p", "--prompt", "TEXT", &O::prompt, "", "Prompt text. Special-token strings in it are recognised."),
      text(kGen, "", "--prompt-file", "F", &O::prompt_file, "",
           "Read the prompt from a file (long prompts hit ARG_MAX with -p \"$(cat F)\")."),
      ids(kGen, "--tokens", &O::tokens, "Prompt given as token ids instead of text (no BOS is added)."),
      integer(kGen, "-n", "--n-predict", "N", &O::n_predict, "32", "32", 0, kI32, "Tokens to generate."),
      flag(kGen, "", "--ignore-eos", &O::ignore_eos, "Keep generating past EOS."),
      flag(kGen, "", "--no-echo", &O::no_echo, "Do not echo the prompt before the generated text."),
      flag(kGen, "", "--no-bos", &O::no_bos,
           "Do not prepend BOS to a text prompt (with --perplexity: to each chunk, which are then plain slices)."),
      real(kGen, "--temp", "F", &O::temp, "0", "0, greedy", 0, 100, "Sampling temperature; 0 picks the argmax."),
      integer(kGen, "", "--top-k", "N", &O::top_k, "0", "0 = off", 0, kI32, "Keep the N most likely tokens."),
      real(kGen, "--top-p", "F", &O::top_p, "1.0", "1.0 = off", 1e-9, 1,
           "Keep the smallest set of tokens whose probability reaches F."),
      real(kGen, "--min-p", "F", &O::min_p, "0", "0 = off", 0, 1,
           "Drop tokens less likely than F times the most likely one."),
      integer(kGen, "-s", "--seed", "N", &O::seed, "-1", "-1 = from the clock, printed to stderr", -1, 9.2e18,
              "Sampler seed; the same seed, prompt and settings give the same tokens."),
      // Serving
      text(kServer, "", "--host", "ADDR", &O::host, "127.0.0.1", "Address to listen on.", {}, "127.0.0.1"),
      integer(kServer, "", "--port", "N", &O::port, "8080", "8080", 0, 65535, "Port to listen on; 0 picks a free one."),
      integer(kServer, "", "--max-tokens-floor", "N", &O::max_tokens_floor, "256000", "256000", 0, 1e12,
              "Raise a request's max_tokens to at least this. Reasoning and answer share one budget, so a small "
              "hard-coded value truncates the reasoning and returns no answer. 0 honours the caller."),
      integer(kServer, "", "--parallel", "N", &O::parallel, "1", "1", 1, 4, "Requests generated at once."),
      // Performance
      integer(kPerf, "", "--prefill-chunk-size", "N", &O::prefill_chunk_size, "1408", "1408", 1, kI32,
              "CPU: tokens per forward call while prefilling. Does not change the logits."),
      text(kPerf, "", "--gpu", "MODE", &O::gpu, "auto",
           "Where the forward pass runs: auto (the GPU when this build has CUDA and a GPU can hold the model, "
           "else the CPU), on (the GPU, or exit with an error), off (the CPU).",
           "AFF_GPU", "auto"),
      integer(kPerf, "", "--kv-size", "N", &O::kv_size, "1048576", "1048576", 1, 1e12,
              "GPU: positions of KV cache address space per session. Address space, not GPU memory; a session's "
              "context is also capped by --ctx-size."),
      integer(kPerf, "", "--gpu-chunk", "N", &O::gpu_chunk, "4096", "4096", 1, 65536,
              "GPU: most tokens per forward call; longer prefills are split. Larger chunks read each expert "
              "fewer times per prompt (8K prefill on an H200: 4,846 tok/s at 2048, 5,306 at 4096); each session's "
              "activation workspace takes about 0.9 MB per token of chunk at a 64K context (the indexer's scores "
              "grow with the context). Does not change the logits."),
      integer(kPerf, "", "--kv-commit", "N", &O::kv_commit, "8192", "8192", 1, 1e12,
              "GPU: positions of KV cache backed by GPU memory when a session starts; more is mapped as the "
              "context grows, at the same addresses."),
      integer(kPerf, "", "--cpu-lane", "N", &O::cpu_lane, "1", "1 = on", 0, 1,
              "Weights stored as ggml blocks (GGUF containers) use the CPU lane: int8-quantised activations and "
              "SIMD integer dot products. 0 dequantises them row by row in f32 (the reference path, for comparisons).",
              "AFF_CPU_LANE"),
      // Diagnostics
      flag(kDiag, "", "--dump-tokens", &O::dump_tokens, "Print the prompt's token ids (as fed, BOS included) and exit."),
      ids(kDiag, "--force-tokens", &O::force_tokens,
          "Teacher-force these ids as the generated continuation instead of sampling."),
      text(kDiag, "", "--logits-out", "F.npy", &O::logits_out, "",
           "Write float32 logits [n_positions, vocab] for every position of the prompt plus forced tokens, "
           "teacher-forced, and exit."),
      integer(kDiag, "", "--dump-logits", "K", &O::dump_logits, "0", "0 = off", 0, 1000000,
              "Print the top-K logits of every generated step to stderr."),
      integer(kDiag, "", "--max-layers", "N", &O::max_layers, "0", "0 = all", 0, 100000,
              "Run only the first N layers."),
      flag(kDiag, "", "--no-routed-experts", &O::no_routed_experts,
           "Skip the routed experts (shared expert only) to isolate the dense path."),
      // Evaluation
      text(kEval, "", "--perplexity", "F", &O::perplexity, "",
           "Score the text file F teacher-forced in chunks of --ppl-context positions, each from a fresh state "
           "with BOS at its start: NLL, perplexity and top-1 of the next token, the same for the MTP head's "
           "token after next, and how often the MTP draft equals the main model's greedy token. Prints a table "
           "and exits."),
      text(kEval, "", "--route-stats", "F", &O::route_stats, "",
           "Run the text file F (chunked as for --perplexity) and print, per MoE layer, the share of expert "
           "activations taken by the busiest 10% of experts and the reuse-distance histogram (tokens since the "
           "chosen expert was last used in the layer), then exit."),
      integer(kEval, "", "--ppl-context", "N", &O::ppl_context, "1024", "1024, the tiny model's trained context", 2,
              1e12, "Positions per chunk for --perplexity and --route-stats (BOS included)."),
      text(kEval, "", "--json-out", "F", &O::json_out, "",
           "Also write the --perplexity / --route-stats results to F as JSON."),
      // Information
      flag(kInfo, "-h", "--help", &O::help, "Print this help and exit."),
      flag(kInfo, "", "--help-md", &O::help_md, "Print this table as Markdown (docs/config.md) and exit."),
      flag(kInfo, "", "--version", &O::version, "Print the version and exit."),
  };
}

Status apply_value(const OptionSpec& s, Options& o, std::string_view value, std::string_view source) {
  auto bad = [&](std::string_view why) {
    return invalid_argument(fmt::format("{}: invalid value '{}': {}", source, value, why));
  };
  switch (s.kind) {
    case OptionKind::kFlag: {
      // Only reachable from the environment: a flag on argv takes no value.
      int64_t v = 0;
      if (value.empty() || !parse_int64(value, v) || (v != 0 && v != 1)) return bad("expected 0 or 1");
      s.set_int(o, v);
      return Status::ok();
    }
    case OptionKind::kInt: {
      int64_t v = 0;
      if (!parse_int64(value, v)) return bad("expected an integer");
      if (s.min < s.max && (double(v) < s.min || double(v) > s.max)) {
        return bad(fmt::format("must be between {} and {}", s.min, s.max));
      }
      s.set_int(o, v);
      return Status::ok();
    }
    case OptionKind::kFloat: {
      double v = 0;
      if (!parse_double(value, v)) return bad("expected a number");
      if (s.min < s.max && (v < s.min || v > s.max)) {
        return bad(fmt::format("must be between {} and {}", s.min, s.max));
      }
      s.set_float(o, v);
      return Status::ok();
    }
    case OptionKind::kString:
      s.set_string(o, std::string(value));
      return Status::ok();
    case OptionKind::kIdList: {
      std::vector<int32_t> v;
      if (!parse_id_list(value, v)) return bad("expected comma-separated non-negative token ids");
      s.set_ids(o, std::move(v));
      return Status::ok();
    }
  }
  return internal_error("unhandled option kind");
}

const OptionSpec* find_option(std::string_view name) {
  for (const OptionSpec& s : option_table()) {
    if (name == s.long_name || (!s.short_name.empty() && name == s.short_name)) return &s;
  }
  return nullptr;
}

// Flags whose meaning depends on others: reported as usage errors too.
Status check_combinations(const Options& o) {
  const int sources = int(o.was_given("--prompt")) + int(o.was_given("--prompt-file")) + int(o.was_given("--tokens"));
  if (sources > 1) return invalid_argument("give only one of --prompt, --prompt-file and --tokens");
  if (o.dump_tokens && o.was_given("--tokens")) {
    return invalid_argument("--dump-tokens prints the ids of a text prompt; it cannot be used with --tokens");
  }
  if (o.dump_tokens && sources == 0) return invalid_argument("--dump-tokens needs a prompt (-p or --prompt-file)");
  for (const char* f : {"--host", "--port", "--max-tokens-floor", "--parallel"}) {
    if (sources > 0 && o.was_given(f)) {
      return invalid_argument(fmt::format("{} configures the server, which runs only without a prompt", f));
    }
  }
  if (sources == 0) {
    for (const char* f : {"--force-tokens", "--logits-out", "--dump-logits", "--n-predict", "--ignore-eos", "--no-echo"}) {
      if (o.was_given(f)) return invalid_argument(fmt::format("{} needs a prompt (-p, --prompt-file or --tokens)", f));
    }
  }
  const bool evaluating = o.was_given("--perplexity") || o.was_given("--route-stats");
  if (evaluating && sources > 0) {
    return invalid_argument("--perplexity and --route-stats read their own text file; drop the prompt");
  }
  for (const char* f : {"--ppl-context", "--json-out"}) {
    if (!evaluating && o.was_given(f)) return invalid_argument(fmt::format("{} needs --perplexity or --route-stats", f));
  }
  if (evaluating) {
    for (const char* f : {"--host", "--port", "--max-tokens-floor", "--parallel"}) {
      if (o.was_given(f)) {
        return invalid_argument(fmt::format("{} configures the server; it cannot be used with --perplexity", f));
      }
    }
  }
  if (o.was_given("--force-tokens") && o.force_tokens.empty()) return invalid_argument("--force-tokens is empty");
  if (o.gpu != "auto" && o.gpu != "on" && o.gpu != "off") {
    return invalid_argument(fmt::format("--gpu: expected auto, on or off, got '{}'", o.gpu));
  }
  if (o.dump_logits > 0 && !o.logits_out.empty()) {
    return invalid_argument("--dump-logits prints generated steps; --logits-out does not generate");
  }
  return Status::ok();
}

void wrap_into(std::string& out, std::string_view text, size_t indent, size_t width) {
  size_t col = indent;
  bool first = true;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = text.find(' ', i);
    if (j == std::string_view::npos) j = text.size();
    std::string_view word = text.substr(i, j - i);
    if (!first && col + 1 + word.size() > width) {
      out += '\n';
      out.append(indent, ' ');
      col = indent;
      first = true;
    }
    if (!first) {
      out += ' ';
      ++col;
    }
    out += word;
    col += word.size();
    first = false;
    i = j + 1;
  }
}

std::string flag_label(const OptionSpec& s) {
  std::string label = s.short_name.empty() ? "    " : fmt::format("{}, ", s.short_name);
  label += s.long_name;
  if (!s.metavar.empty()) label += fmt::format(" {}", s.metavar);
  return label;
}

std::string default_text(const OptionSpec& s) {
  if (!s.default_note.empty()) return std::string(s.default_note);
  return std::string(s.default_value);
}

}  // namespace

bool Options::was_given(std::string_view long_name) const {
  return std::find(given.begin(), given.end(), long_name) != given.end();
}

const std::vector<OptionSpec>& option_table() {
  static const std::vector<OptionSpec> table = build_table();
  return table;
}

bool parse_int64(std::string_view s, int64_t& out) {
  if (s.empty()) return false;
  const char* b = s.data();
  const char* e = b + s.size();
  if (*b == '+') ++b;
  auto [p, ec] = std::from_chars(b, e, out);
  return ec == std::errc() && p == e;
}

bool parse_double(std::string_view s, double& out) {
  if (s.empty()) return false;
  const char* b = s.data();
  const char* e = b + s.size();
  if (*b == '+') ++b;
  auto [p, ec] = std::from_chars(b, e, out);
  return ec == std::errc() && p == e && std::isfinite(out);
}

bool parse_id_list(std::string_view s, std::vector<int32_t>& out) {
  out.clear();
  if (s.empty()) return false;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string_view::npos) j = s.size();
    std::string_view item = s.substr(i, j - i);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    int64_t v = 0;
    if (item.empty() || item.front() == '+' || !parse_int64(item, v) || v < 0 || v > 2147483647) return false;
    out.push_back(int32_t(v));
    i = j + 1;
  }
  return true;
}

Result<Options> parse_options(std::span<const std::string> args, const EnvLookup& env) {
  Options o{};
  for (const OptionSpec& s : option_table()) {
    if (s.kind == OptionKind::kFlag) {
      s.set_int(o, 0);
    } else if (s.kind == OptionKind::kIdList && s.default_value.empty()) {
      s.set_ids(o, {});  // an empty list is a valid default but not a valid value
    } else {
      AFF_RETURN_IF_ERROR(apply_value(s, o, s.default_value, fmt::format("default of {}", s.long_name)));
    }
  }
  const EnvLookup lookup = env ? env : EnvLookup([](const char* n) { return std::getenv(n); });
  for (const OptionSpec& s : option_table()) {
    if (s.env.empty()) continue;
    const char* v = lookup(std::string(s.env).c_str());
    if (v == nullptr || *v == '\0') continue;
    AFF_RETURN_IF_ERROR(apply_value(s, o, v, fmt::format("environment variable {}", s.env)));
    o.given.emplace_back(s.long_name);
  }

  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.size() < 2 || arg[0] != '-' || arg == "--") {
      return invalid_argument(fmt::format("unexpected argument '{}' (options start with '-')", arg));
    }
    std::string name = arg;
    std::string value;
    bool inline_value = false;
    if (arg.rfind("--", 0) == 0) {
      const size_t eq = arg.find('=');
      if (eq != std::string::npos) {
        name = arg.substr(0, eq);
        value = arg.substr(eq + 1);
        inline_value = true;
      }
    }
    const OptionSpec* s = find_option(name);
    if (s == nullptr) return invalid_argument(fmt::format("unknown option '{}'", name));
    if (s->kind == OptionKind::kFlag) {
      if (inline_value) return invalid_argument(fmt::format("option {} takes no value", s->long_name));
      s->set_int(o, 1);
    } else {
      if (!inline_value) {
        if (i + 1 >= args.size()) {
          return invalid_argument(fmt::format("option {} needs a value ({})", s->long_name, s->metavar));
        }
        value = args[++i];
      }
      AFF_RETURN_IF_ERROR(apply_value(*s, o, value, fmt::format("option {}", s->long_name)));
    }
    o.given.emplace_back(s->long_name);
  }
  AFF_RETURN_IF_ERROR(check_combinations(o));
  return o;
}

std::string options_help(std::string_view program) {
  constexpr size_t kLabelWidth = 30, kWidth = 100;
  std::string out = fmt::format(
      "usage: {} [options]\n\n"
      "Runs a DeepSeek-V4 checkpoint on the CPU. With a prompt (-p, --prompt-file, --tokens) it streams the\n"
      "generated text to stdout; without one it serves the OpenAI API over HTTP (--host, --port).\n"
      "Exit status: 0 success, 1 the model or an input file could not be used, 2 usage error.\n",
      program);
  std::string_view group;
  for (const OptionSpec& s : option_table()) {
    if (s.group != group) {
      group = s.group;
      out += fmt::format("\n{}\n", group);
    }
    std::string label = "  " + flag_label(s);
    out += label;
    if (label.size() + 2 > kLabelWidth) {
      out += '\n';
      out.append(kLabelWidth, ' ');
    } else {
      out.append(kLabelWidth - label.size(), ' ');
    }
    std::string help(s.help);
    const std::string def = default_text(s);
    if (!def.empty()) help += fmt::format(" [{}]", def);
    if (!s.env.empty()) help += fmt::format(" (env {})", s.env);
    wrap_into(out, help, kLabelWidth, kWidth);
    out += '\n';
  }
  return out;
}

std::string options_markdown() {
  std::string out =
      "# Configuration\n\n"
      "Generated by `affinity --help-md` from the option table in `src/core/options.cpp`; do not edit by hand.\n"
      "Values come from the defaults below, then the environment variables, then the command line.\n"
      "Exit status: 0 success, 1 the model or an input file could not be used, 2 usage error.\n";
  std::string_view group;
  for (const OptionSpec& s : option_table()) {
    if (s.group != group) {
      group = s.group;
      out += fmt::format("\n## {}\n\n| Option | Default | Environment | Meaning |\n|---|---|---|---|\n", group);
    }
    std::string label = s.short_name.empty() ? "" : fmt::format("`{}`, ", s.short_name);
    label += fmt::format("`{}{}{}`", s.long_name, s.metavar.empty() ? "" : " ", s.metavar);
    const std::string def = default_text(s);
    std::string help(s.help);
    // A literal '|' would end the table cell.
    size_t pos = 0;
    while ((pos = help.find('|', pos)) != std::string::npos) {
      help.replace(pos, 1, "\\|");
      pos += 2;
    }
    out += fmt::format("| {} | {} | {} | {} |\n", label, def.empty() ? "" : def,
                       s.env.empty() ? "" : fmt::format("`{}`", s.env), help);
  }
  return out;
}

}  // namespace aff::core
