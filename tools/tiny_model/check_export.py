#!/usr/bin/env python3
"""Load an exported tiny model (official layout, dequantised) in PyTorch and report held-out
statistics and a few greedy generations.

    python check_export.py --model models/tiny-v4 [--eval FILE] [--chunks N] [--generate]
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export  # noqa: E402
import model as tm  # noqa: E402

PROMPTS = [
    "<｜begin▁of▁sentence｜>In the beginning",
    "<｜begin▁of▁sentence｜>The meaning of life is",
    "<｜begin▁of▁sentence｜><｜User｜>What does the word \"river\" mean?<｜Assistant｜></think>",
    "<｜begin▁of▁sentence｜><｜User｜>What is 17 plus 25?<｜Assistant｜></think>",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--eval", default=None, help="held-out text (default: tests/data/tiny-v4/heldout.txt)")
    ap.add_argument("--chunks", type=int, default=0, help="evaluate only the first N chunks of 1024")
    ap.add_argument("--generate", action="store_true")
    ap.add_argument("--tokens", type=int, default=40)
    args = ap.parse_args()
    tm.M.DeepseekV4Experts.forward = tm.dense_experts_forward   # same math, fewer ops
    with open(os.path.join(args.model, "config.json")) as f:
        conf = json.load(f)
    cfg = tm.tiny_config(conf["vocab_size"])
    m = export.load_export(args.model, cfg)
    tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    here = os.path.dirname(os.path.abspath(__file__))
    path = args.eval or os.path.join(here, "..", "..", "tests", "data", "tiny-v4", "heldout.txt")
    with open(path, encoding="utf-8") as f:
        ids = torch.tensor(tok.encode(f.read(), add_special_tokens=False).ids)
    torch.set_grad_enabled(False)
    if args.chunks >= 0:
        print(json.dumps(tm.evaluate(m, ids, 1024, max_chunks=args.chunks or None, batch=1)), flush=True)
    if args.generate:
        for p in PROMPTS:
            x = torch.tensor([tok.encode(p, add_special_tokens=False).ids])
            for _ in range(args.tokens):
                logits, _ = m(x, with_mtp=False)
                nxt = int(logits[0, -1].argmax())
                x = torch.cat([x, torch.tensor([[nxt]])], 1)
                if nxt == 1:
                    break
            print(repr(tok.decode(x[0].tolist(), skip_special_tokens=False)), flush=True)


if __name__ == "__main__":
    main()
