#!/usr/bin/env python3
"""Train the tiny model's byte-level BPE tokenizer in the shape of V4's tokenizer.json.

Same pre-tokenizer as DeepSeek-V4 (three ordered Split regexes, then ByteLevel without its own
regex), no normalizer, ByteLevel decoder; BOS/EOS/pad at ids 0/1/2 and V4's chat/tool added
tokens (v4chat.TAIL_TOKENS) after the BPE vocabulary.  Trained on the training split only.

    python train_tokenizer.py --corpus work/corpus --out work/tokenizer.json [--vocab 8192]
"""
import argparse
import json

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

import v4chat

# The three pre-tokenizer regexes of DeepSeek-V3/V4's tokenizer.json (format facts).
V4_SPLIT_REGEXES = [
    r"\p{N}{1,3}",
    "[一-龥\u3040-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]


def texts(path, specials):
    """Training documents with the special-token strings removed (they are added tokens, not BPE)."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            t = json.loads(line)["text"]
            for s in specials:
                t = t.replace(s, "\n")
            yield t


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", type=int, default=8192)
    args = ap.parse_args()

    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in V4_SPLIT_REGEXES]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    head = [t for t, _, _ in v4chat.HEAD_TOKENS]
    tail = [t for t, _, _ in v4chat.TAIL_TOKENS]
    trainer = trainers.BpeTrainer(vocab_size=args.vocab - len(tail), special_tokens=head,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts(f"{args.corpus}/train.jsonl", head + tail), trainer=trainer)
    tok.add_tokens(tail)
    j = json.loads(tok.to_str())
    j["normalizer"] = {"type": "Sequence", "normalizers": []}
    flags = {t: (sp, norm) for t, sp, norm in v4chat.HEAD_TOKENS + v4chat.TAIL_TOKENS}
    for at in j["added_tokens"]:
        at["special"], at["normalized"] = flags[at["content"]]
    ids = {at["content"]: at["id"] for at in j["added_tokens"]}
    assert [ids[t] for t in head] == [0, 1, 2], ids
    n = len(j["model"]["vocab"]) + len(tail)
    assert n == args.vocab and max(ids.values()) == args.vocab - 1, (n, ids)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
        f.write("\n")
    print(f"vocab {n}: BPE {len(j['model']['vocab'])} + {len(tail)} tail added tokens; merges {len(j['model']['merges'])}")


if __name__ == "__main__":
    main()
