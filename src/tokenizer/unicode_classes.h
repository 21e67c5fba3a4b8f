// Unicode-version alignment of regex classes with HF tokenizers.
//
// HF matches pre-tokenizer regexes with Oniguruma carrying Unicode 16 tables;
// Debian's PCRE2 10.42 carries Unicode 14. Letters such as U+1E4D0 (Nag
// Mundari, Unicode 15) would be \p{L} for HF and unassigned for PCRE2, and a
// word containing one would split differently. Before compiling a tokenizer
// regex we therefore add the newer members to \p{L}, \p{M}, \p{N}, \p{P} and
// \p{S}. The tables come from probing HF itself
// (tools/tokenizer/make_unicode_tables.py); a test checks every code point.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace aff::tokenizer {

struct CodeRange {
  char32_t lo;
  char32_t hi;  // inclusive
};

extern const std::vector<CodeRange> kUnicode16LetterAdditions;
extern const std::vector<CodeRange> kUnicode16MarkAdditions;
extern const std::vector<CodeRange> kUnicode16NumberAdditions;
extern const std::vector<CodeRange> kUnicode16PunctuationAdditions;
extern const std::vector<CodeRange> kUnicode16SymbolAdditions;

// `pattern` with each \p{L}, \p{M}, \p{N}, \p{P}, \p{S} widened by the code
// points above: inside a character class the ranges are appended to it,
// elsewhere the escape becomes a class. \s and \S become \p{White_Space} and
// \P{White_Space} (Oniguruma's definition; PCRE2's \s also matches U+180E).
// Negated forms (\P{..}, \p{^..}) and other properties are left as they are.
std::string widen_unicode_classes(std::string_view pattern);

}  // namespace aff::tokenizer
