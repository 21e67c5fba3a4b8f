#include "tokenizer/chat_encoding.h"

#include <algorithm>
#include <map>
#include <optional>
#include <vector>

#include <fmt/format.h>

namespace aff::tokenizer {
namespace {

// The official Tools preamble, with the DSML and think tokens substituted.
// It must stay byte-identical to what the model was trained on.
constexpr std::string_view kToolsPreambleHead =
    "## Tools\n"
    "\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by "
    "writing a \"<｜DSML｜tool_calls>\" block like the following:\n"
    "\n"
    "<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME\">\n"
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>\n"
    "\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types "
    "(numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n"
    "\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n"
    "\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n"
    "\n"
    "### Available Tool Schemas\n"
    "\n";
constexpr std::string_view kToolsPreambleTail =
    "\n"
    "\n"
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

constexpr std::string_view kResponseFormatHead =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

constexpr std::string_view kEffortAbsoluteMax =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the "
    "root cause, rigorously stress-testing your logic against all potential paths, edge cases, and "
    "adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n";
constexpr std::string_view kEffortBeyondMax =
    "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively "
    "decompose the problem into its most fundamental components, trace every causal chain to its root, "
    "and resolve the underlying cause rather than any surface symptom.\n"
    "Do not stop reasoning until you have independently verified the solution from multiple angles and "
    "are certain that no assumption remains unchecked and no error remains undiscovered.\n\n";

enum class Role { kSystem, kUser, kAssistant, kTool, kLatestReminder };

struct Block {
  bool is_tool_result = false;
  std::string text;          // text, or the tool result body
  std::string tool_call_id;  // tool results only
};

struct ToolCall {
  std::string id;
  std::string name;
  Json arguments;  // a string (as sent) or an object
};

struct Message {
  Role role = Role::kUser;
  std::string content;
  std::vector<Block> blocks;  // users only, after merging (always set for users)
  Json tools;                 // system only: array of function objects, or null
  Json response_format;       // system only
  std::vector<ToolCall> tool_calls;
  std::string reasoning;
  bool wo_eos = false;
};

Result<std::string> text_of_content(const Json& content, const std::string& where) {
  if (content.is_null()) return std::string();
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return invalid_argument(where + " must be a string, null or an array of parts");
  std::vector<std::string> parts;
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& part = content[i];
    const std::string at = fmt::format("{}[{}]", where, i);
    if (part.is_string()) {
      parts.push_back(part.get<std::string>());
      continue;
    }
    if (!part.is_object()) return invalid_argument(at + " must be an object");
    auto type = part.find("type");
    if (type == part.end() || !type->is_string()) return invalid_argument(at + ".type must be a string");
    if (*type != "text") {
      return invalid_argument(fmt::format("{}.type '{}' is not supported (text only)", at, type->get<std::string>()));
    }
    auto text = part.find("text");
    if (text == part.end() || !text->is_string()) return invalid_argument(at + ".text must be a string");
    parts.push_back(text->get<std::string>());
  }
  std::string joined;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) joined += "\n\n";
    joined += parts[i];
  }
  return joined;
}

// Tool results keep only their text parts; anything else becomes a marker,
// as the official encoder does.
Result<std::string> text_of_tool_result(const Json& content, const std::string& where) {
  if (!content.is_array()) return text_of_content(content, where);
  std::string joined;
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& part = content[i];
    if (i) joined += "\n\n";
    if (part.is_object() && part.value("type", "") == "text" && part.contains("text") && part["text"].is_string()) {
      joined += part["text"].get<std::string>();
    } else if (part.is_string()) {
      joined += part.get<std::string>();
    } else {
      joined += fmt::format("[Unsupported {}]", part.is_object() ? part.value("type", "") : "part");
    }
  }
  return joined;
}

Result<std::vector<ToolCall>> parse_tool_calls(const Json& calls, const std::string& where) {
  std::vector<ToolCall> out;
  if (calls.is_null()) return out;
  if (!calls.is_array()) return invalid_argument(where + " must be an array");
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string at = fmt::format("{}[{}]", where, i);
    const Json& c = calls[i];
    if (!c.is_object()) return invalid_argument(at + " must be an object");
    ToolCall tc;
    if (auto id = c.find("id"); id != c.end() && id->is_string()) tc.id = id->get<std::string>();
    auto fn = c.find("function");
    if (fn == c.end() || !fn->is_object()) return invalid_argument(at + ".function must be an object");
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string()) return invalid_argument(at + ".function.name must be a string");
    tc.name = name->get<std::string>();
    auto args = fn->find("arguments");
    if (args == fn->end() || args->is_null()) {
      tc.arguments = Json::object();
    } else if (args->is_string() || args->is_object()) {
      tc.arguments = *args;
    } else {
      return invalid_argument(at + ".function.arguments must be a JSON string or an object");
    }
    out.push_back(std::move(tc));
  }
  return out;
}

Result<Json> functions_of_tools(const Json& tools) {
  Json fns = Json::array();
  if (tools.is_null()) return fns;
  if (!tools.is_array()) return invalid_argument("tools must be an array");
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    const std::string at = fmt::format("tools[{}]", i);
    if (!t.is_object()) return invalid_argument(at + " must be an object");
    if (t.contains("type") && t["type"] != "function") return invalid_argument(at + ".type must be \"function\"");
    auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object()) return invalid_argument(at + ".function must be an object");
    if (!fn->contains("name") || !(*fn)["name"].is_string()) return invalid_argument(at + ".function.name must be a string");
    fns.push_back(*fn);
  }
  return fns;
}

std::string render_tools(const Json& functions) {
  std::string out(kToolsPreambleHead);
  for (size_t i = 0; i < functions.size(); ++i) {
    if (i) out += '\n';
    out += python_json_dumps(functions[i]);
  }
  out += kToolsPreambleTail;
  return out;
}

std::string render_arguments(const ToolCall& tc) {
  Json args = tc.arguments;
  if (args.is_string()) {
    const std::string& raw = tc.arguments.get_ref<const std::string&>();
    args = Json::parse(raw, nullptr, /*allow_exceptions=*/false);
    // Not an object: pass the text through as one string parameter rather
    // than refusing a conversation a client already holds.
    if (!args.is_object()) args = Json{{"arguments", raw}};
  }
  std::string out;
  bool first = true;
  for (auto it = args.begin(); it != args.end(); ++it) {
    if (!first) out += '\n';
    first = false;
    const bool is_str = it.value().is_string();
    out += fmt::format("<｜DSML｜parameter name=\"{}\" string=\"{}\">", it.key(), is_str ? "true" : "false");
    out += is_str ? it.value().get<std::string>() : python_json_dumps(it.value());
    out += "</｜DSML｜parameter>";
  }
  return out;
}

// Reads and validates the client's messages into our internal form, with
// tool messages merged into user turns (the official merge_tool_messages).
Result<std::vector<Message>> read_messages(const Json& messages, const ChatEncodeOptions& opts) {
  if (!messages.is_array()) return invalid_argument("messages must be an array");
  if (messages.empty()) return invalid_argument("messages must not be empty");
  std::vector<Message> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    const std::string at = fmt::format("messages[{}]", i);
    if (!m.is_object()) return invalid_argument(at + " must be an object");
    auto role_it = m.find("role");
    if (role_it == m.end() || !role_it->is_string()) return invalid_argument(at + ".role must be a string");
    const std::string role = role_it->get<std::string>();
    const Json content = m.contains("content") ? m["content"] : Json();

    if (role == "tool") {
      Block b;
      b.is_tool_result = true;
      if (auto id = m.find("tool_call_id"); id != m.end() && id->is_string()) b.tool_call_id = id->get<std::string>();
      AFF_ASSIGN_OR_RETURN(b.text, text_of_tool_result(content, at + ".content"));
      if (!out.empty() && out.back().role == Role::kUser) {
        out.back().blocks.push_back(std::move(b));
      } else {
        Message u;
        u.role = Role::kUser;
        u.blocks.push_back(std::move(b));
        out.push_back(std::move(u));
      }
      continue;
    }
    Message msg;
    AFF_ASSIGN_OR_RETURN(msg.content, text_of_content(content, at + ".content"));
    if (role == "user") {
      // Consecutive user turns (and a user turn after tool results) merge
      // into one, exactly as the official preprocessing does.
      Block b;
      b.text = msg.content;
      if (!out.empty() && out.back().role == Role::kUser) {
        out.back().blocks.push_back(std::move(b));
        continue;
      }
      msg.role = Role::kUser;
      msg.blocks.push_back(std::move(b));
    } else if (role == "system" || role == "developer") {
      // V4's public format has no developer role (the official encoder's
      // developer is an internal search-agent turn); OpenAI clients use it
      // as a system prompt, so it is rendered as one.
      msg.role = Role::kSystem;
    } else if (role == "assistant") {
      msg.role = Role::kAssistant;
      AFF_ASSIGN_OR_RETURN(msg.tool_calls, parse_tool_calls(m.contains("tool_calls") ? m["tool_calls"] : Json(),
                                                            at + ".tool_calls"));
      for (const char* key : {"reasoning_content", "reasoning"}) {
        auto r = m.find(key);
        if (r == m.end() || r->is_null()) continue;
        if (!r->is_string()) return invalid_argument(fmt::format("{}.{} must be a string", at, key));
        msg.reasoning = r->get<std::string>();
        break;
      }
      msg.wo_eos = opts.continue_final_message && i + 1 == messages.size();
    } else if (role == "latest_reminder") {
      msg.role = Role::kLatestReminder;
    } else {
      return invalid_argument(fmt::format("{}.role '{}' is not one of system, developer, user, assistant, tool", at, role));
    }
    out.push_back(std::move(msg));
  }
  return out;
}

// Official sort_tool_results_by_call_order: tool results inside a user turn
// follow the order of the calls in the latest assistant turn that made calls.
void sort_tool_results(std::vector<Message>& msgs) {
  std::map<std::string, size_t> order;
  for (Message& m : msgs) {
    if (m.role == Role::kAssistant && !m.tool_calls.empty()) {
      order.clear();
      for (size_t i = 0; i < m.tool_calls.size(); ++i) {
        if (!m.tool_calls[i].id.empty()) order[m.tool_calls[i].id] = i;
      }
    } else if (m.role == Role::kUser && !order.empty()) {
      std::vector<Block> results;
      for (const Block& b : m.blocks) if (b.is_tool_result) results.push_back(b);
      if (results.size() < 2) continue;
      auto rank = [&](const Block& b) {
        auto it = order.find(b.tool_call_id);
        return it == order.end() ? size_t{0} : it->second;
      };
      std::stable_sort(results.begin(), results.end(),
                       [&](const Block& a, const Block& b) { return rank(a) < rank(b); });
      size_t next = 0;
      for (Block& b : m.blocks) if (b.is_tool_result) b = results[next++];
    }
  }
}

int last_user_index(const std::vector<Message>& msgs) {
  for (int i = static_cast<int>(msgs.size()) - 1; i >= 0; --i) {
    if (msgs[i].role == Role::kUser) return i;
  }
  return -1;
}

}  // namespace

Result<ChatVariant> parse_chat_variant(std::string_view name) {
  if (name == "v4") return ChatVariant::kV4;
  if (name == "v4-0731") return ChatVariant::kV4_0731;
  return invalid_argument(fmt::format("chat variant '{}' is not one of v4, v4-0731", name));
}

std::string_view chat_variant_name(ChatVariant variant) {
  return variant == ChatVariant::kV4 ? "v4" : "v4-0731";
}

Result<std::string> reasoning_effort_prefix(ChatVariant variant, std::string_view level) {
  if (variant == ChatVariant::kV4) {
    if (level.empty() || level == "high") return std::string();
    if (level == "max") return std::string(kEffortAbsoluteMax);
    return invalid_argument(fmt::format("reasoning effort '{}' is not one of high, max for v4", level));
  }
  if (level.empty() || level == "low") return std::string();
  if (level == "high") return std::string(kEffortAbsoluteMax);
  if (level == "max") return std::string(kEffortBeyondMax);
  return invalid_argument(fmt::format("reasoning effort '{}' is not one of low, high, max for v4-0731", level));
}

Result<EffortChoice> resolve_reasoning_effort(ChatVariant variant, std::string_view req) {
  // Aliases follow DeepSeek's hosted API: minimal/low -> low,
  // medium/high/xhigh -> high, max/ultra -> max; "none" turns thinking off.
  if (req == "none") return EffortChoice{false, ""};
  std::string level;
  if (req == "minimal" || req == "low") {
    level = "low";
  } else if (req == "medium" || req == "high" || req == "xhigh") {
    level = "high";
  } else if (req == "max" || req == "ultra") {
    level = "max";
  } else {
    return invalid_argument(fmt::format(
        "reasoning_effort '{}' is not one of none, minimal, low, medium, high, xhigh, max", req));
  }
  // The preview checkpoint has no "low": its default is "high".
  if (variant == ChatVariant::kV4 && level == "low") level = "high";
  return EffortChoice{true, level};
}

Result<std::string> encode_chat(const Json& messages, const Json& tools, const Json& response_format,
                                const ChatEncodeOptions& opts) {
  AFF_ASSIGN_OR_RETURN(std::string effort_prefix, reasoning_effort_prefix(opts.variant, opts.reasoning_effort));
  AFF_ASSIGN_OR_RETURN(std::vector<Message> msgs, read_messages(messages, opts));
  AFF_ASSIGN_OR_RETURN(Json functions, functions_of_tools(tools));
  if (!response_format.is_null() && !response_format.is_object()) {
    return invalid_argument("response_format must be an object");
  }

  // Request-level tools (and response_format) attach to the first system
  // message; a bare one is inserted when the conversation has none.
  const bool has_tools = !functions.empty();
  const bool has_format = response_format.is_object() && response_format.value("type", "") != "text";
  if (has_tools || has_format) {
    auto sys = std::find_if(msgs.begin(), msgs.end(), [](const Message& m) { return m.role == Role::kSystem; });
    if (sys == msgs.end()) {
      Message s;
      s.role = Role::kSystem;
      sys = msgs.insert(msgs.begin(), std::move(s));
    }
    if (has_tools) sys->tools = functions;
    if (has_format) sys->response_format = response_format;
  }
  sort_tool_results(msgs);

  const bool thinking = opts.thinking;
  const bool drop = opts.drop_thinking && !has_tools;
  if (thinking && drop) {
    // Reasoning of turns before the last user turn is not part of the prompt.
    const int last_user = last_user_index(msgs);
    for (int i = 0; i < last_user; ++i) {
      if (msgs[i].role == Role::kAssistant) msgs[i].reasoning.clear();
    }
  }
  const int last_user = last_user_index(msgs);

  std::string prompt = opts.add_bos ? std::string(kBosText) : std::string();
  for (int idx = 0; idx < static_cast<int>(msgs.size()); ++idx) {
    const Message& m = msgs[idx];
    if (idx == 0 && thinking) prompt += effort_prefix;
    switch (m.role) {
      case Role::kSystem:
        prompt += m.content;
        if (!m.tools.is_null() && !m.tools.empty()) prompt += "\n\n" + render_tools(m.tools);
        if (!m.response_format.is_null()) {
          prompt += "\n\n";
          prompt += kResponseFormatHead;
          prompt += python_json_dumps(m.response_format);
        }
        break;
      case Role::kUser: {
        prompt += kUserText;
        for (size_t b = 0; b < m.blocks.size(); ++b) {
          if (b) prompt += "\n\n";
          if (m.blocks[b].is_tool_result) {
            prompt += "<tool_result>" + m.blocks[b].text + "</tool_result>";
          } else {
            prompt += m.blocks[b].text;
          }
        }
        break;
      }
      case Role::kLatestReminder:
        prompt += kLatestReminderText;
        prompt += m.content;
        break;
      case Role::kTool:
        break;  // merged into user turns by read_messages
      case Role::kAssistant: {
        if (thinking && (!drop || idx > last_user)) {
          prompt += m.reasoning;
          prompt += kThinkEndText;
        }
        prompt += m.content;
        if (!m.tool_calls.empty()) {
          prompt += "\n\n<｜DSML｜tool_calls>\n";
          for (size_t c = 0; c < m.tool_calls.size(); ++c) {
            if (c) prompt += '\n';
            prompt += fmt::format("<｜DSML｜invoke name=\"{}\">\n", m.tool_calls[c].name);
            prompt += render_arguments(m.tool_calls[c]);
            prompt += "\n</｜DSML｜invoke>";
          }
          prompt += "\n</｜DSML｜tool_calls>";
        }
        if (!m.wo_eos) prompt += kEosText;
        break;
      }
    }

    // Generation header: only where the next turn is the assistant's (or a
    // latest_reminder, which the official encoder treats the same way).
    const bool is_last = idx + 1 == static_cast<int>(msgs.size());
    if (!is_last && msgs[idx + 1].role != Role::kAssistant && msgs[idx + 1].role != Role::kLatestReminder) {
      continue;
    }
    const bool opens = m.role == Role::kUser ||
                       (m.role == Role::kSystem && (is_last || msgs[idx + 1].role == Role::kAssistant));
    if (!opens) continue;
    prompt += kAssistantText;
    if (thinking && (!drop || idx >= last_user)) {
      prompt += kThinkStartText;
    } else {
      prompt += kThinkEndText;
    }
  }
  return prompt;
}

}  // namespace aff::tokenizer
