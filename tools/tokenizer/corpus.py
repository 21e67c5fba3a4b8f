"""Texts the tokenizer parity tests run through both HF tokenizers and affinity.

Fixed strings aim at the known traps of the DeepSeek pre-tokenizer (three
ordered Split regexes) and of added-token matching; seeded random strings mix
scripts, whitespace and special-token strings so that boundaries land in odd
places. Deterministic: the same list every run.
"""

import random

V4_SPECIALS = [
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
    "<think>", "</think>", "｜DSML｜", "<｜latest_reminder｜>", "<｜▁pad▁｜>",
]

FIXED = [
    "",
    " ",
    "Hello, world!",
    "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ",
    "    int x = 0;\n\tif (x > 1) {\n\t\treturn x;\n\t}\n",
    "def f(a, b):\n    return a ** 2 + b  # comment\n\n\nprint(f(1, 2))\r\n",
    "for (int i=0;i<n;++i){sum+=a[i]*b[i];}>;\n",
    "x  ~  y ~z  ~~ \" ~\"",
    "don't won't it's I'm we'll they've she'd O'Neil",
    "trailing spaces   ",
    "   leading spaces",
    "tabs\t\t\tand\tmore\t",
    "lines\n\n\nand\r\n\r\nCRLF\r\rCR only\n",
    "spaces then newline    \n    next",
    "nbsp\u00a0\u00a0between\u00a0words and ideographic\u3000\u3000space",
    "other spaces:\u2000\u2001\u2002\u2009\u200a\u202f\u205f|\u2028|\u2029|\u0085|\u200b|\ufeff",
    "1234567890 12 123 1234 12345 3.14159 1,000,000 0x7fff 1e-9",
    "digits ２０２４年 ١٢٣٤٥ ४२ ² ½ Ⅻ ⑦",
    "我们今天去公园散步，天气非常好。",
    "日本語のテキストとカタカナ、ひらがな。東京タワー",
    "한국어 텍스트도 있습니다.",
    "مرحبا بالعالم! هذا نص عربي مع أرقام ١٢٣",
    "שלום עולם",
    "हिन्दी में पाठ, संयुक्ताक्षर क्ष त्र ज्ञ",
    "ภาษาไทยไม่มีช่องว่าง",
    "Ελληνικά και Русский текст, ёлка",
    "emoji 😀😃😄 👩‍👩‍👧‍👦 👍🏽 🇫🇷🇯🇵 ❤️ ✔︎",
    "combining: e\u0301 a\u0308 n\u0303 \u0301alone",
    "unicode 15 letters: \U0001E4D0\U0001E4D1 \U00011F04 \U00031350",
    "math ∑∫√∞ ≤≥≠ → ⇒ ∀x∃y",
    "URL https://example.com/a/b?c=d&e=f#g and email a.b@c.de",
    "{\"key\": [1, 2, {\"nested\": null}], \"s\": \"v\\n\"}",
    "<｜User｜>Hello<｜Assistant｜><think>reasoning</think>answer<｜end▁of▁sentence｜>",
    "<｜begin▁of▁sentence｜><｜begin▁of▁sentence｜>x",
    "partial <｜User and <think and </thin and ｜DSM",
    "<<think>> <think><think> </think></think> <｜User｜><｜User｜>",
    "text<｜latest_reminder｜>more ｜DSML｜tool_calls ｜DSML｜invoke name=\"f\"",
    " <think> spaced </think> ",
    "\n<｜Assistant｜>\n",
    "a" * 300,
    " " * 257,
    "\n" * 40 + "\t" * 17,
    "ab" * 150 + "\r\n" * 10,
    "9" * 101,
    "🙂" * 33,
]

POOLS = {
    "ascii": list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"),
    "digit": list("0123456789") + ["１", "٣", "४"],
    "punct": list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["。", "、", "「", "」", "…", "—", "«", "»"],
    "space": [" ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2009", "\u2028", "\u0085"],
    "cjk": list("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会"),
    "kana": list("あいうえおかきくけこアイウエオカキクケコンー"),
    "hangul": list("가나다라마바사아자차카타파하"),
    "arabic": list("ابتثجحخدذرزسشصضطظعغفقكلمنهوي"),
    "devanagari": ["क", "ख", "ग", "ि", "ी", "्", "ं", "ा"],
    "emoji": ["😀", "👍", "🏽", "\u200d", "👩", "🚀", "🇯", "🇵", "❤", "\ufe0f"],
    "marks": ["\u0301", "\u0308", "\u0323", "\u064b", "\u093c"],
    "latin1": list("àéîõüçñßøåæÀÉÎÕÜÇÑ"),
    "special": V4_SPECIALS,
}


def random_texts(count, seed, specials):
    rng = random.Random(seed)
    pools = dict(POOLS, special=list(specials))
    names = sorted(pools)
    out = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 60)):
            pool = pools[rng.choice(names)]
            run = rng.choice([1, 1, 1, 2, 3, 5, 8])
            parts.append("".join(rng.choice(pool) for _ in range(run)))
            if rng.random() < 0.3:
                parts.append(" ")
        out.append("".join(parts))
    return out


def corpus(extra=(), specials=V4_SPECIALS, random_count=200, seed=1234):
    """FIXED + `extra`, then random mixes that embed `specials`."""
    return FIXED + list(extra) + random_texts(random_count, seed, specials)
