#include "tokenizer/output_parser.h"

#include <algorithm>
#include <array>

#include "tokenizer/chat_json.h"

namespace aff::tokenizer {
namespace {

constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kThinkEnd = "</think>";
// V4 spells the block tool_calls; V3.2 used function_calls, and models fine-
// tuned across both sometimes emit it.
constexpr std::string_view kToolsStart = "<｜DSML｜tool_calls>";
constexpr std::string_view kToolsStartAlt = "<｜DSML｜function_calls>";
constexpr std::string_view kToolsEnd = "</｜DSML｜tool_calls>";
constexpr std::string_view kToolsEndAlt = "</｜DSML｜function_calls>";
constexpr std::string_view kInvokeStart = "<｜DSML｜invoke name=\"";
constexpr std::string_view kInvokeEnd = "</｜DSML｜invoke>";
constexpr std::string_view kParamStart = "<｜DSML｜parameter";
constexpr std::string_view kParamEnd = "</｜DSML｜parameter>";

// A header ("NAME\">" or " name=... string=...>") longer than this is not a
// header: the model has wandered off, and we stop waiting for its end.
constexpr size_t kMaxHeaderBytes = 1024;

struct Found {
  size_t pos = std::string::npos;
  std::string_view marker;
};

template <size_t N>
Found find_first(const std::string& buf, const std::array<std::string_view, N>& markers) {
  Found best;
  for (std::string_view m : markers) {
    size_t p = buf.find(m);
    if (p == std::string::npos) continue;
    if (p < best.pos || (p == best.pos && m.size() > best.marker.size())) best = {p, m};
  }
  return best;
}

// Length of the longest suffix of buf that is a proper prefix of a marker:
// bytes that must wait for the next piece before they can be classified.
template <size_t N>
size_t partial_suffix(const std::string& buf, const std::array<std::string_view, N>& markers) {
  size_t best = 0;
  for (std::string_view m : markers) {
    const size_t max_len = std::min(buf.size(), m.size() - 1);
    for (size_t len = max_len; len > best; --len) {
      if (buf.compare(buf.size() - len, len, m, 0, len) == 0) {
        best = len;
        break;
      }
    }
  }
  return best;
}

constexpr std::array<std::string_view, 4> kReasoningMarkers = {kThinkEnd, kThinkStart, kToolsStart, kToolsStartAlt};
constexpr std::array<std::string_view, 5> kContentMarkers = {kThinkEnd, kThinkStart, kToolsStart, kToolsStartAlt,
                                                             kInvokeStart};
constexpr std::array<std::string_view, 3> kToolBlockMarkers = {kInvokeStart, kToolsEnd, kToolsEndAlt};
constexpr std::array<std::string_view, 4> kParamsMarkers = {kParamStart, kInvokeEnd, kToolsEnd, kToolsEndAlt};
constexpr std::array<std::string_view, 5> kValueMarkers = {kParamEnd, kInvokeEnd, kToolsEnd, kToolsEndAlt,
                                                           kParamStart};
constexpr std::array<std::string_view, 2> kAfterMarkers = {kToolsStart, kToolsStartAlt};

std::string_view trim(std::string_view s) {
  const char* ws = " \t\r\n";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

// Value of attr="..." inside a parameter header; found=false if absent.
std::string attribute(std::string_view header, std::string_view attr, bool* found) {
  std::string key = std::string(attr) + "=\"";
  size_t p = header.find(key);
  // Require a word boundary so name= does not match inside another attribute.
  while (p != std::string_view::npos && p > 0 && header[p - 1] != ' ' && header[p - 1] != '\t' &&
         header[p - 1] != '\n') {
    p = header.find(key, p + 1);
  }
  if (p == std::string_view::npos) {
    *found = false;
    return {};
  }
  p += key.size();
  size_t e = header.find('"', p);
  *found = true;
  return std::string(header.substr(p, e == std::string_view::npos ? std::string_view::npos : e - p));
}

}  // namespace

OutputParser::OutputParser(bool starts_in_reasoning)
    : state_(starts_in_reasoning ? State::kReasoning : State::kContent) {}

std::vector<ParserEvent> OutputParser::push(std::string_view piece) {
  std::vector<ParserEvent> out;
  buffer_.append(piece);
  run(false, out);
  return out;
}

std::vector<ParserEvent> OutputParser::finish() {
  std::vector<ParserEvent> out;
  run(true, out);
  if (state_ == State::kParamValue) close_param(out);
  if (call_open_) close_call(out);
  state_ = State::kAfterTools;
  return out;
}

void OutputParser::emit_args(std::string text, std::vector<ParserEvent>& out) {
  if (text.empty()) return;
  const int idx = static_cast<int>(message_.tool_calls.size()) - 1;
  message_.tool_calls.back().arguments += text;
  out.push_back({ParserEvent::Kind::kToolCallArguments, idx, std::move(text)});
}

void OutputParser::emit_text(State s, std::string_view text, std::vector<ParserEvent>& out) {
  if (text.empty()) return;
  switch (s) {
    case State::kReasoning:
      message_.reasoning_content.append(text);
      out.push_back({ParserEvent::Kind::kReasoning, -1, std::string(text)});
      break;
    case State::kContent:
      message_.content.append(text);
      out.push_back({ParserEvent::Kind::kContent, -1, std::string(text)});
      break;
    case State::kParamValue:
      if (param_is_string_) {
        emit_args(json_escape(text), out);
      } else {
        param_value_.append(text);
      }
      break;
    default:
      break;  // whitespace between DSML tags, or text the format has no place for
  }
}

void OutputParser::start_call(std::string name, std::vector<ParserEvent>& out) {
  message_.tool_calls.push_back({std::string(trim(name)), ""});
  call_open_ = true;
  params_in_call_ = 0;
  const int idx = static_cast<int>(message_.tool_calls.size()) - 1;
  out.push_back({ParserEvent::Kind::kToolCallStart, idx, message_.tool_calls.back().name});
}

void OutputParser::open_param(std::string_view header, std::vector<ParserEvent>& out) {
  bool has_name = false, has_string = false;
  std::string name = attribute(header, "name", &has_name);
  std::string is_string = attribute(header, "string", &has_string);
  // A missing string attribute is treated like string="false": JSON if it
  // parses, else text (close_param decides).
  param_is_string_ = has_string && is_string == "true";
  param_value_.clear();
  std::string text = params_in_call_ == 0 ? "{\"" : ", \"";
  text += json_escape(name);
  text += "\": ";
  if (param_is_string_) text += '"';
  ++params_in_call_;
  emit_args(std::move(text), out);
}

void OutputParser::close_param(std::vector<ParserEvent>& out) {
  if (param_is_string_) {
    emit_args("\"", out);
    return;
  }
  std::string_view v = trim(param_value_);
  if (!v.empty() && Json::accept(v)) {
    emit_args(std::string(v), out);
  } else {
    std::string quoted(1, '"');
    quoted.append(json_escape(param_value_)).push_back('"');
    emit_args(quoted, out);
  }
  param_value_.clear();
}

void OutputParser::close_call(std::vector<ParserEvent>& out) {
  emit_args(params_in_call_ == 0 ? "{}" : "}", out);
  call_open_ = false;
  const int idx = static_cast<int>(message_.tool_calls.size()) - 1;
  out.push_back({ParserEvent::Kind::kToolCallEnd, idx, ""});
}

void OutputParser::run(bool final, std::vector<ParserEvent>& out) {
  while (!buffer_.empty()) {
    if (state_ == State::kInvokeName || state_ == State::kParamHeader) {
      const std::string_view delim = state_ == State::kInvokeName ? std::string_view("\">") : std::string_view(">");
      const size_t p = buffer_.find(delim);
      if (p == std::string::npos) {
        if (!final && buffer_.size() <= kMaxHeaderBytes) return;  // wait for the rest of the header
        // Never closed: an invoke without a name is dropped; a parameter
        // header without its '>' ends the call.
        if (state_ == State::kParamHeader && call_open_) close_call(out);
        buffer_.clear();
        state_ = State::kAfterTools;
        return;
      }
      std::string header = buffer_.substr(0, p);
      buffer_.erase(0, p + delim.size());
      if (state_ == State::kInvokeName) {
        start_call(std::move(header), out);
        state_ = State::kParams;
      } else {
        open_param(header, out);
        state_ = State::kParamValue;
      }
      continue;
    }

    Found f;
    size_t hold = 0;
    switch (state_) {
      case State::kReasoning:
        f = find_first(buffer_, kReasoningMarkers);
        hold = partial_suffix(buffer_, kReasoningMarkers);
        break;
      case State::kContent:
        f = find_first(buffer_, kContentMarkers);
        hold = partial_suffix(buffer_, kContentMarkers);
        break;
      case State::kToolBlock:
        f = find_first(buffer_, kToolBlockMarkers);
        hold = partial_suffix(buffer_, kToolBlockMarkers);
        break;
      case State::kParams:
        f = find_first(buffer_, kParamsMarkers);
        hold = partial_suffix(buffer_, kParamsMarkers);
        break;
      case State::kParamValue:
        f = find_first(buffer_, kValueMarkers);
        hold = partial_suffix(buffer_, kValueMarkers);
        break;
      default:
        f = find_first(buffer_, kAfterMarkers);
        hold = partial_suffix(buffer_, kAfterMarkers);
        break;
    }

    if (f.pos == std::string::npos) {
      if (final) hold = 0;
      // The "\n\n" before a tool block belongs to the block's marker, not to
      // the content: keep trailing newlines back until we know.
      if (!final && state_ == State::kContent) {
        while (hold < buffer_.size() && buffer_[buffer_.size() - hold - 1] == '\n') ++hold;
      }
      emit_text(state_, std::string_view(buffer_).substr(0, buffer_.size() - hold), out);
      buffer_.erase(0, buffer_.size() - hold);
      return;
    }

    std::string_view before = std::string_view(buffer_).substr(0, f.pos);
    const std::string_view m = f.marker;
    const bool tools_start = m == kToolsStart || m == kToolsStartAlt;
    if (state_ == State::kContent && (tools_start || m == kInvokeStart)) {
      while (!before.empty() && (before.back() == '\n' || before.back() == '\r')) before.remove_suffix(1);
    }
    emit_text(state_, before, out);
    const std::string marker(m);
    buffer_.erase(0, f.pos + marker.size());

    switch (state_) {
      case State::kReasoning:
        if (marker == kThinkEnd) state_ = State::kContent;
        else if (tools_start) state_ = State::kToolBlock;  // tool block inside reasoning ends it
        break;  // a repeated <think> is absorbed
      case State::kContent:
        if (marker == kThinkStart) state_ = State::kReasoning;
        else if (tools_start) state_ = State::kToolBlock;
        else if (marker == kInvokeStart) state_ = State::kInvokeName;
        break;  // a stray </think> is absorbed
      case State::kToolBlock:
        state_ = marker == kInvokeStart ? State::kInvokeName : State::kAfterTools;
        break;
      case State::kParams:
        if (marker == kParamStart) {
          state_ = State::kParamHeader;
        } else {
          close_call(out);
          state_ = marker == kInvokeEnd ? State::kToolBlock : State::kAfterTools;
        }
        break;
      case State::kParamValue:
        close_param(out);
        if (marker == kParamEnd) {
          state_ = State::kParams;
        } else if (marker == kParamStart) {
          state_ = State::kParamHeader;  // previous parameter was never closed
        } else {
          close_call(out);
          state_ = marker == kInvokeEnd ? State::kToolBlock : State::kAfterTools;
        }
        break;
      default:
        state_ = State::kToolBlock;  // a second tool block
        break;
    }
  }
}

ParsedMessage parse_completion(std::string_view text, bool starts_in_reasoning) {
  OutputParser p(starts_in_reasoning);
  p.push(text);
  p.finish();
  return p.message();
}

}  // namespace aff::tokenizer
