"""Trains a tiny byte-level BPE tokenizer in DeepSeek-V4's shape.

usage: $PYTHON make_tiny_tokenizer.py OUT_JSON

Same normalizer (empty Sequence), the same three ordered Split regexes +
ByteLevel(use_regex=false), ByteLevel decoder, V4's special/role tokens, and a
few extra added tokens exercising lstrip / rstrip / single_word / normalized.
Run with an interpreter that has `tokenizers`; deterministic for a given
tokenizers version. The vocabulary is small (~1000) so tiny models can use it.
"""

import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, trainers

import corpus

# DeepSeek V3/V4 pre-tokenizer regexes (tokenizer.json, in this order).
SPLITS = [
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]

TRAIN_TEXT = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "def main():\n    for i in range(10):\n        print(i, i * i)\n    return 0\n",
    "int main(int argc, char** argv) {\n  return argc > 1 ? 0 : 1;\n}\n",
    "我们今天去公园散步，天气非常好。日本語のテキストとカタカナ。",
    "مرحبا بالعالم، كيف حالك اليوم؟",
    "Numbers like 1234567 and 3.14159 and 2024-05-01 appear in text.",
    "She said: \"don't worry\", and we'll go tomorrow; it's fine!",
]


def main():
    out = sys.argv[1]
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([])
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in SPLITS]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[AddedToken(t, special=True, normalized=False)
                        for t in ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"]])
    texts = TRAIN_TEXT * 20 + corpus.corpus(random_count=100, seed=5)
    tok.train_from_iterator(texts, trainer)

    # V4 marks role/thinking tokens special=false, normalized=true.
    tok.add_tokens([AddedToken(t, special=False, normalized=True) for t in
                    ["<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜",
                     "<｜latest_reminder｜>"]])
    tok.add_special_tokens([AddedToken("<raw>", special=True, normalized=False)])
    tok.add_tokens([
        AddedToken("<lstrip>", lstrip=True, normalized=True),
        AddedToken("<rstrip>", rstrip=True, normalized=False),
        AddedToken("<both>", lstrip=True, rstrip=True, special=True, normalized=False),
        AddedToken("mask", single_word=True, normalized=True),
        AddedToken("<long>", normalized=True),
        AddedToken("<longer>", normalized=True),
    ])
    tok.save(out, pretty=True)


if __name__ == "__main__":
    main()
