#!/usr/bin/env python3
"""Reference main-head and MTP-head logits of the committed tiny model for the quality tests.

Runs models/tiny-v4 (dequantised, float32) through the PyTorch model that trained it
(tools/tiny_model: transformers' DeepseekV4ForCausalLM plus our MTP block) on the first
--tokens tokens of tests/data/tiny-v4/heldout.txt, and writes a small JSON fixture:

  tokens            [T] the ids (the text's own BOS first; nothing added)
  main.ids/values   [T, K] logits of K vocabulary ids per row (argmax, the target, random ids)
  main.lse          [T] logsumexp of each row
  mtp.*             the same for the MTP head's T-1 rows (row t: streams at t + token t+1,
                    predicting token t+2)
  stats             mean NLL / top-1 of both heads over the sequence (as tools/tiny_model's
                    evaluate() counts them)

    $PYTHON tests/quality/make_mtp_fixture.py [--tokens 300] [--out tests/quality/fixtures/tiny_v4_mtp.json]

Needs torch, transformers >= 5.17, tokenizers, safetensors, numpy (not available in CI; the
JSON is committed).
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "tiny_model"))
import export  # noqa: E402
import model as tm  # noqa: E402


def rows(logits, targets, k, rng):
    """Per row: K ids (argmax, target if any, then distinct random ids), their logits, logsumexp."""
    out_ids, out_vals = [], []
    v = logits.shape[-1]
    for r in range(logits.shape[0]):
        ids = [int(logits[r].argmax())]
        if r < len(targets) and int(targets[r]) not in ids:
            ids.append(int(targets[r]))
        while len(ids) < k:
            c = int(rng.integers(v))
            if c not in ids:
                ids.append(c)
        out_ids.append(ids)
        out_vals.append([float(logits[r, i]) for i in ids])
    lse = torch.logsumexp(logits.double(), -1).tolist()
    return {"ids": out_ids, "values": out_vals, "lse": lse}


def head_stats(logits, targets):
    lp = torch.log_softmax(logits.double(), -1)
    nll = -lp.gather(-1, targets[:, None]).squeeze(-1)
    return {"mean_nll": float(nll.mean()), "top1": float((lp.argmax(-1) == targets).double().mean()),
            "predictions": int(targets.numel())}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "tiny-v4"))
    ap.add_argument("--text", default=os.path.join(ROOT, "tests", "data", "tiny-v4", "heldout.txt"))
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default=os.path.join(HERE, "fixtures", "tiny_v4_mtp.json"))
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    tm.M.DeepseekV4Experts.forward = tm.dense_experts_forward  # same math as the per-expert loop
    with open(os.path.join(args.model, "config.json")) as f:
        conf = json.load(f)
    m = export.load_export(args.model, tm.tiny_config(conf["vocab_size"])).eval()
    tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    with open(args.text, encoding="utf-8") as f:
        ids = tok.encode(f.read(), add_special_tokens=False).ids[:args.tokens]
    x = torch.tensor([ids])
    logits, mlog = m(x)
    logits, mlog = logits[0].float(), mlog[0].float()          # [T, V], [T-1, V]
    t = torch.tensor(ids)
    rng = np.random.default_rng(args.seed)
    fixture = {
        "model": "models/tiny-v4",
        "text": "tests/data/tiny-v4/heldout.txt",
        "tokens": ids,
        "main": rows(logits, t[1:], args.k, rng),
        "mtp": rows(mlog, t[2:], args.k, rng),
        "stats": {"main": head_stats(logits[:-1], t[1:]), "mtp": head_stats(mlog[:-1], t[2:])},
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
    }
    with open(args.out, "w") as f:
        json.dump(fixture, f, separators=(",", ":"))
        f.write("\n")
    print(json.dumps(fixture["stats"]))


if __name__ == "__main__":
    main()
