#include "tokenizer/chat_json.h"

#include <fmt/format.h>

namespace aff::tokenizer {

std::string json_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 8);
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", c);
        } else {
          out += ch;  // ensure_ascii=False: UTF-8 passes through untouched
        }
    }
  }
  return out;
}

namespace {

void dump_into(const Json& v, std::string& out) {
  switch (v.type()) {
    case Json::value_t::object: {
      out += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        out += '"';
        out += json_escape(it.key());
        out += "\": ";
        dump_into(it.value(), out);
      }
      out += '}';
      break;
    }
    case Json::value_t::array: {
      out += '[';
      bool first = true;
      for (const auto& e : v) {
        if (!first) out += ", ";
        first = false;
        dump_into(e, out);
      }
      out += ']';
      break;
    }
    case Json::value_t::string:
      out += '"';
      out += json_escape(v.get_ref<const std::string&>());
      out += '"';
      break;
    case Json::value_t::number_float: {
      // nlohmann prints the shortest round-trip form with a ".0" on whole
      // numbers, which is what Python's float repr does for normal ranges.
      out += v.dump();
      break;
    }
    case Json::value_t::discarded:
      out += "null";
      break;
    default:
      out += v.dump();  // null, bool, integers: identical in both
  }
}

}  // namespace

std::string python_json_dumps(const Json& value) {
  std::string out;
  dump_into(value, out);
  return out;
}

}  // namespace aff::tokenizer
