// Incremental parser for DeepSeek-V4 completions: splits the generated text
// into reasoning_content, content and DSML tool calls while it streams.
//
//   {reasoning}</think>{content}\n\n<｜DSML｜tool_calls>
//   <｜DSML｜invoke name="NAME">
//   <｜DSML｜parameter name="K" string="true|false">VALUE</｜DSML｜parameter>
//   </｜DSML｜invoke>
//   </｜DSML｜tool_calls>
//
// Pieces may split a marker anywhere (even inside a multi-byte character of
// "｜DSML｜"): text that could still become a marker is held back until it is
// decided. Malformed model output never throws or asserts; the parser does
// what a reader would (a stray </think> in content is dropped, text after the
// tool block is discarded, an unclosed parameter is closed at the end).
// Arguments are streamed as JSON text whose concatenation is the final
// arguments string: {"K": "escaped string", "N": 5}, separators ", " and ": "
// (what the official parser rebuilds). A non-string value is held until its
// closing tag and emitted raw if it is valid JSON, else as a JSON string, so
// the arguments are always valid JSON.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace aff::tokenizer {

struct ParserEvent {
  enum class Kind {
    kReasoning,          // text: reasoning_content delta
    kContent,            // text: content delta
    kToolCallStart,      // tool_index, text: function name
    kToolCallArguments,  // tool_index, text: arguments delta
    kToolCallEnd,        // tool_index
  };
  Kind kind = Kind::kContent;
  int tool_index = -1;
  std::string text;
};

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // JSON object text
};

struct ParsedMessage {
  std::string reasoning_content;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
};

class OutputParser {
 public:
  // starts_in_reasoning: the prompt ended with <think> (thinking mode).
  explicit OutputParser(bool starts_in_reasoning);

  // Feeds the next piece of generated text; returns what became certain.
  std::vector<ParserEvent> push(std::string_view piece);
  // End of generation: releases held-back text and closes open structures.
  std::vector<ParserEvent> finish();

  const ParsedMessage& message() const { return message_; }
  // True once a tool-call block has started (finish_reason "tool_calls").
  bool saw_tool_calls() const { return !message_.tool_calls.empty(); }

 private:
  enum class State { kReasoning, kContent, kToolBlock, kInvokeName, kParams, kParamHeader, kParamValue, kAfterTools };

  void run(bool final, std::vector<ParserEvent>& out);
  void emit_text(State s, std::string_view text, std::vector<ParserEvent>& out);
  void start_call(std::string name, std::vector<ParserEvent>& out);
  void open_param(std::string_view header, std::vector<ParserEvent>& out);
  void close_param(std::vector<ParserEvent>& out);
  void close_call(std::vector<ParserEvent>& out);
  void emit_args(std::string text, std::vector<ParserEvent>& out);

  State state_;
  std::string buffer_;          // undecided text
  ParsedMessage message_;
  bool call_open_ = false;
  int params_in_call_ = 0;
  bool param_is_string_ = false;
  std::string param_value_;     // non-string value collected until its close tag
};

// Whole-text convenience: push(text) then finish().
ParsedMessage parse_completion(std::string_view text, bool starts_in_reasoning);

}  // namespace aff::tokenizer
