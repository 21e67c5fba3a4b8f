#include "tokenizer/unicode_classes.h"

#include <fmt/format.h>

namespace aff::tokenizer {

namespace {

const std::vector<CodeRange>* additions_for(std::string_view property) {
  if (property == "L") return &kUnicode16LetterAdditions;
  if (property == "M") return &kUnicode16MarkAdditions;
  if (property == "N") return &kUnicode16NumberAdditions;
  if (property == "P") return &kUnicode16PunctuationAdditions;
  if (property == "S") return &kUnicode16SymbolAdditions;
  return nullptr;
}

std::string class_items(std::string_view property, const std::vector<CodeRange>& extra) {
  std::string s = fmt::format("\\p{{{}}}", property);
  for (const CodeRange& r : extra) {
    s += r.lo == r.hi ? fmt::format("\\x{{{:X}}}", uint32_t(r.lo))
                      : fmt::format("\\x{{{:X}}}-\\x{{{:X}}}", uint32_t(r.lo), uint32_t(r.hi));
  }
  return s;
}

}  // namespace

std::string widen_unicode_classes(std::string_view p) {
  std::string out;
  out.reserve(p.size() * 2);
  bool in_class = false;
  size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char next = p[i + 1];
      if (next == 'Q') {  // \Q...\E quotes everything up to \E verbatim
        const size_t end = p.find("\\E", i + 2);
        const size_t stop = end == std::string_view::npos ? p.size() : end + 2;
        out.append(p.substr(i, stop - i));
        i = stop;
        continue;
      }
      if (next == 'p' && i + 2 < p.size() && p[i + 2] == '{') {
        const size_t close = p.find('}', i + 3);
        if (close != std::string_view::npos) {
          const std::string_view property = p.substr(i + 3, close - (i + 3));
          if (const std::vector<CodeRange>* extra = additions_for(property)) {
            const std::string items = class_items(property, *extra);
            out += in_class ? items : "[" + items + "]";
            i = close + 1;
            continue;
          }
        }
      }
      if (next == 's' || next == 'S') {
        // PCRE2's \s also takes U+180E (a space before Unicode 6.3); Oniguruma's
        // is exactly the White_Space property.
        out += next == 's' ? "\\p{White_Space}" : "\\P{White_Space}";
        i += 2;
        continue;
      }
      out.append(p.substr(i, 2));  // any other escape (brackets, backslash, \r ...)
      i += 2;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      ++i;
      if (i < p.size() && p[i] == '^') out += p[i++];
      if (i < p.size() && p[i] == ']') out += p[i++];  // a leading ] is literal
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:]
      const size_t end = p.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out.append(p.substr(i, end + 2 - i));
        i = end + 2;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
    ++i;
  }
  return out;
}

}  // namespace aff::tokenizer
