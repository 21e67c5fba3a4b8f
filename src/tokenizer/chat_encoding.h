// DeepSeek-V4 / V4-0731 chat encoding: OpenAI-style messages -> the prompt
// text the model was trained on (official encoding/encoding_dsv4.py grammar,
// reproduced byte-exactly; golden cases in tests/data/chat/).
//
//   BOS [effort prefix] {system}[\n\n## Tools...]
//   <｜User｜>{user}<｜Assistant｜><think>            (thinking mode)
//   <｜User｜>{user}<｜Assistant｜></think>           (chat mode)
//   {reasoning}</think>{content}[\n\n<｜DSML｜tool_calls>...]<｜end▁of▁sentence｜>
//
// The rendered text contains special-token strings; tokenize it with
// parse_special = true and without adding BOS again.
#pragma once

#include <string>
#include <string_view>

#include "affinity/status.h"
#include "tokenizer/chat_json.h"

namespace aff::tokenizer {

inline constexpr std::string_view kBosText = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEosText = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kUserText = "<｜User｜>";
inline constexpr std::string_view kAssistantText = "<｜Assistant｜>";
inline constexpr std::string_view kLatestReminderText = "<｜latest_reminder｜>";
inline constexpr std::string_view kThinkStartText = "<think>";
inline constexpr std::string_view kThinkEndText = "</think>";
inline constexpr std::string_view kDsmlText = "｜DSML｜";

// Checkpoints differ only in their reasoning-effort table.
enum class ChatVariant {
  kV4,      // April preview: "high" (default, no prefix) and "max"
  kV4_0731, // GA: "low" (default, no prefix), "high", "max"
};

Result<ChatVariant> parse_chat_variant(std::string_view name);  // "v4" | "v4-0731"
std::string_view chat_variant_name(ChatVariant variant);

struct ChatEncodeOptions {
  ChatVariant variant = ChatVariant::kV4_0731;
  bool thinking = true;          // false = chat mode (an immediate </think>)
  std::string reasoning_effort;  // a level of the variant's table; "" = its default
  // Remove reasoning of assistant turns before the last user turn. Ignored
  // (kept off) whenever tools are present, as the official encoder does.
  bool drop_thinking = true;
  bool add_bos = true;
  // A trailing assistant message is a prefix for the model to continue: it
  // is rendered without its end-of-sentence token.
  bool continue_final_message = false;
};

// messages: JSON array of OpenAI chat messages (roles system, developer
//   (treated as system), user, assistant, tool, latest_reminder; content a
//   string, null or an array of {"type":"text"} parts; assistant
//   reasoning_content (or reasoning) and tool_calls).
// tools: null or an array of OpenAI tools ({"type":"function","function":{...}});
//   they attach to the first system message (one is inserted if none exists).
// response_format: null or an object; rendered as the "## Response Format"
//   block after the tools.
// Errors name the offending field, e.g. "messages[2].tool_calls[0].function.name".
Result<std::string> encode_chat(const Json& messages, const Json& tools, const Json& response_format,
                                const ChatEncodeOptions& options);

// The prefix inserted at the very start of a thinking-mode prompt; "" when
// the level is the variant's default. Errors on a level the variant lacks.
Result<std::string> reasoning_effort_prefix(ChatVariant variant, std::string_view level);

// API-level effort names (DeepSeek / OpenAI / vLLM aliases) -> this variant's
// level. "none" means chat mode: thinking = false.
struct EffortChoice {
  bool thinking = true;
  std::string level;  // "" for the default
};
Result<EffortChoice> resolve_reasoning_effort(ChatVariant variant, std::string_view requested);

}  // namespace aff::tokenizer
