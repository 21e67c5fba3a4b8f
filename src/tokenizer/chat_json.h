// JSON text exactly as Python's json.dumps(value, ensure_ascii=False) writes
// it. The official V4 encoder serialises tool schemas and non-string tool
// arguments this way, so a prompt only matches the model's training
// distribution (and other servers' prompt caches) if we do too.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace aff::tokenizer {

// Key order matters (schemas are echoed in the order the client sent them).
using Json = nlohmann::ordered_json;

// Separators ", " and ": ", non-ASCII kept raw, control characters escaped.
std::string python_json_dumps(const Json& value);

// Body of a JSON string literal (no surrounding quotes), same escaping rules.
// Safe to apply piecewise: escaping is per character, so concatenated escaped
// fragments equal the escaped concatenation (for complete UTF-8 fragments).
std::string json_escape(std::string_view text);

}  // namespace aff::tokenizer
