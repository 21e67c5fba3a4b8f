#!/usr/bin/env python3
"""Tokenize the corpus into flat uint16 token streams for training.

train.u16: every training document (BOS included in its text), in a fixed shuffled order.
eval.u16:  heldout.txt tokenized as one string (identical to the documents concatenated,
           because every document starts with the BOS added token).

    python tokenize_corpus.py --corpus work/corpus --tokenizer work/tokenizer.json --out work/data
"""
import argparse
import json
import os
import random

import numpy as np
from tokenizers import Tokenizer


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    tok = Tokenizer.from_file(args.tokenizer)
    with open(f"{args.corpus}/train.jsonl", encoding="utf-8") as f:
        docs = [json.loads(l)["text"] for l in f]
    random.Random(args.seed).shuffle(docs)
    ids = []
    for i in range(0, len(docs), 2000):
        for e in tok.encode_batch(docs[i:i + 2000], add_special_tokens=False):
            ids.extend(e.ids)
    np.asarray(ids, dtype=np.uint16).tofile(f"{args.out}/train.u16")
    with open(f"{args.corpus}/heldout.txt", encoding="utf-8") as f:
        ev = tok.encode(f.read(), add_special_tokens=False).ids
    np.asarray(ev, dtype=np.uint16).tofile(f"{args.out}/eval.u16")
    print(f"train {len(ids)} tokens, eval {len(ev)} tokens")


if __name__ == "__main__":
    main()
