"""Writes the expected ids/decodes of a corpus according to HF `tokenizers`.

usage: $PYTHON make_expected.py TOKENIZER_JSON OUT_JSON [--tiny]

Run with an interpreter that has `tokenizers` installed. For each text it
records HF's ids with added tokens recognised (encode(text,
add_special_tokens=False)), the ids with no added token recognised (the same
tokenizer with its added_tokens list emptied: affinity's parse_special=false),
and HF's decode of those ids with and without skip_special_tokens. It also
records HF's decode of random id sequences, which cut multi-byte characters.
"""

import json
import random
import sys

from tokenizers import Tokenizer

import corpus


def main():
    src, dst = sys.argv[1], sys.argv[2]
    tiny = "--tiny" in sys.argv[3:]
    with open(src, encoding="utf-8") as f:
        spec = json.load(f)
    tok = Tokenizer.from_str(json.dumps(spec))
    plain_spec = dict(spec, added_tokens=[])
    plain = Tokenizer.from_str(json.dumps(plain_spec))

    if tiny:
        specials = [t["content"] for t in spec["added_tokens"]]
        texts = corpus.corpus(extra=TINY_EXTRA, specials=specials, random_count=120, seed=99)
    else:
        texts = corpus.corpus()

    cases = []
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False).ids
        cases.append({
            "text": text,
            "ids": ids,
            "ids_plain": plain.encode(text, add_special_tokens=False).ids,
            "decoded": tok.decode(ids, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
        })

    if tiny:
        # Same texts under model.ignore_merges=true (a piece found in the vocab is
        # one token without merging); the C++ test flips the flag the same way.
        im_spec = json.loads(json.dumps(spec))
        im_spec["model"]["ignore_merges"] = True
        im = Tokenizer.from_str(json.dumps(im_spec))
        for case in cases:
            case["ids_ignore_merges"] = im.encode(case["text"], add_special_tokens=False).ids

    rng = random.Random(7)
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    decode_cases = []
    for _ in range(60):
        ids = [rng.randrange(vocab_size) for _ in range(rng.randint(1, 12))]
        decode_cases.append({
            "ids": ids,
            "text": tok.decode(ids, skip_special_tokens=False),
            "text_skip_special": tok.decode(ids, skip_special_tokens=True),
        })

    # One case per line keeps the file small and its diffs readable.
    def rows(items):
        return ",\n".join(json.dumps(x, ensure_ascii=False, separators=(",", ":")) for x in items)

    with open(dst, "w", encoding="utf-8") as f:
        f.write('{"vocab_size":%d,\n"cases":[\n%s],\n"decode_cases":[\n%s]}\n'
                % (vocab_size, rows(cases), rows(decode_cases)))


# Strings for the added tokens of the tiny tokenizer (see make_tiny_tokenizer.py),
# which carry lstrip / rstrip / single_word / normalized flags.
TINY_EXTRA = [
    "a <lstrip> b",
    "a\t\u00a0 <lstrip>b",
    "x<rstrip>   y",
    "x <both>\n\n z",
    "word maskword mask word-mask mask_x mask, (mask) mask",
    "mask",
    "é mask ümask mask9 9mask",
    "<raw><raw> <raw>x",
    "<rstrip> <lstrip>",
    "<rstrip><lstrip>",
    "  <both>  <both>  ",
    "<｜User｜>hi<｜Assistant｜>",
    "ab<long>c <longer> <long",
]


if __name__ == "__main__":
    main()
