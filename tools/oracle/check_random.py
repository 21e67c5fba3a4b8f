"""Compare affinity against transformers on fresh random V4 configurations (never the committed
fixtures), and optionally on the committed fixtures too.

    $PYTHON tools/oracle/check_random.py [--n 4] [--seed 12345] [--affinity build/bin/affinity]
        [--max-rel-rms 5e-3] [--min-top1 0.99] [--fixtures tests/data/golden] [--keep DIR]
        [-- EXTRA AFFINITY ARGS, e.g. --prefill-chunk-size 64]

For each case: draw a random config that satisfies the official shape constraints (mixes of
sliding / CSA / HCA layers, hash layers, MTP 0/1, several head and expert shapes), pick a weight
seed without near-ties in router/indexer top-k, write the checkpoint in the official layout, run
`affinity -m DIR --tokens ... --logits-out F.npy EXTRA`, and compare with transformers (float32,
eager) on the same dequantised weights. Reports relative RMS error
(||engine - ref|| / ||ref|| over all positions and vocab) and top-1 agreement; exits 1 if any
case exceeds the bounds, 2 if the engine could not be run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden as mg  # noqa: E402
import v4ckpt as vc  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def random_config(rng: np.random.Generator) -> tuple:
    """-> (V4Config, n_tokens). Every FP8-linear input dim is a multiple of 128, MXFP4 input dims
    of 32, head_dim - rope_dim of 64 (the official reference's constraints, v4-model-math §9.3)."""
    hidden = int(rng.choice([128, 256]))
    heads = int(rng.choice([1, 2, 4]))
    head_dim = int(rng.choice([128, 192, 256]))
    groups = [g for g in (1, 2, 4) if heads % g == 0 and (heads * head_dim // g) % 128 == 0]
    o_groups = int(rng.choice(groups))
    o_lora = int(rng.choice([l for l in (64, 128, 192) if (o_groups * l) % 128 == 0]))
    n_layers = int(rng.integers(2, 6))
    hca = int(rng.choice([8, 16, 32, 128]))
    while True:
        ratios = [int(rng.choice([0, 4, hca], p=[0.25, 0.45, 0.30])) for _ in range(n_layers)]
        if 4 in ratios:
            break
    n_experts = int(rng.integers(3, 9))
    top_k = int(rng.integers(2, min(4, n_experts - 1) + 1))
    mtp = int(rng.integers(0, 2))
    T = int(rng.integers(2 * hca + 20, 2 * hca + 160)) if hca == 128 else int(rng.integers(180, 400))
    index_topk = int(rng.integers(4, max(5, min(32, T // 8))))
    kw = dict(
        vocab_size=int(rng.integers(300, 1025)), hidden_size=hidden, num_hidden_layers=n_layers,
        num_attention_heads=heads, head_dim=head_dim, qk_rope_head_dim=64,
        q_lora_rank=int(rng.choice([128, 256])), o_groups=o_groups, o_lora_rank=o_lora,
        sliding_window=int(rng.integers(16, min(129, T - 32))), compress_ratios=ratios,
        index_n_heads=int(rng.choice([8, 12, 16])), index_head_dim=128,
        index_topk=index_topk, n_routed_experts=n_experts, num_experts_per_tok=top_k,
        moe_intermediate_size=int(rng.choice([128, 256])), num_hash_layers=int(rng.integers(0, min(3, n_layers) + 1)),
        num_nextn_predict_layers=mtp,
    )
    return mg.make_config(kw), T


def describe(cfg: vc.V4Config, T: int) -> str:
    r = cfg.compress_ratios[:cfg.num_hidden_layers]
    types = ",".join("S" if x == 0 else "C" if x == 4 else f"H{x}" for x in r)
    return (f"D{cfg.hidden_size} L[{types}] hash{cfg.num_hash_layers} H{cfg.num_attention_heads}x{cfg.head_dim} "
            f"g{cfg.o_groups} E{cfg.num_experts_per_tok}/{cfg.n_routed_experts} win{cfg.sliding_window} "
            f"topk{cfg.index_topk} V{cfg.vocab_size} mtp{cfg.num_nextn_predict_layers} T{T}")


def compare(engine: np.ndarray, ref: np.ndarray) -> dict:
    if engine.shape != ref.shape:
        return {"error": f"shape {engine.shape} != reference {ref.shape}"}
    if not np.isfinite(engine).all():
        return {"error": "non-finite logits"}
    diff = engine.astype(np.float64) - ref.astype(np.float64)
    rel_rms = float(np.sqrt((diff ** 2).sum() / (ref.astype(np.float64) ** 2).sum()))
    top1 = float((engine.argmax(-1) == ref.argmax(-1)).mean())
    worst_pos = int(np.abs(diff).max(-1).argmax())
    return {"rel_rms": rel_rms, "top1": top1, "max_abs": float(np.abs(diff).max()), "worst_position": worst_pos}


def run_engine(affinity: str, ckpt: str, tokens: list, extra: list, out_npy: str, timeout: int) -> tuple:
    # -c: size the session for this sequence (the default context reserves far more memory)
    cmd = [affinity, "-m", ckpt, "-c", str(len(tokens)), "--tokens", ",".join(map(str, tokens)),
           "--logits-out", out_npy] + extra
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    dt = time.time() - t0
    if p.returncode != 0 or not os.path.exists(out_npy):
        return None, dt, f"exit {p.returncode}: {(p.stderr or p.stdout).strip()[-2000:]}"
    return np.load(out_npy, allow_pickle=False), dt, ""


def main() -> int:
    ap = argparse.ArgumentParser(description="affinity vs transformers on fresh random V4 checkpoints")
    ap.add_argument("--n", type=int, default=4, help="number of random configurations")
    ap.add_argument("--seed", type=int, default=None, help="config seed (default: from the clock; printed)")
    ap.add_argument("--affinity", default=os.path.join(REPO, "build", "bin", "affinity"))
    ap.add_argument("--max-rel-rms", type=float, default=5e-3)
    ap.add_argument("--min-top1", type=float, default=0.99)
    ap.add_argument("--fixtures", default=None, help="also compare against every fixture under this dir")
    ap.add_argument("--keep", default=None, help="keep the generated checkpoints under this dir")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per engine run")
    ap.add_argument("--torch-device", default="cpu", help="device for the transformers reference (cpu, cuda)")
    ap.add_argument("extra", nargs="*", help="extra affinity arguments (put them after --)")
    args = ap.parse_args()

    if not os.access(args.affinity, os.X_OK):
        print(f"error: {args.affinity} is not an executable (build it first, or pass --affinity)", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000
    print(f"check_random: config seed {seed}, {args.n} cases, engine {args.affinity} {' '.join(args.extra)}")
    work = args.keep or tempfile.mkdtemp(prefix="aff-oracle-")
    os.makedirs(work, exist_ok=True)
    failures, rows = 0, []

    cases = []
    if args.fixtures:
        for name in sorted(os.listdir(args.fixtures)):
            d = os.path.join(args.fixtures, name)
            if os.path.exists(os.path.join(d, "logits.npy")):
                cases.append(("fixture", name, d))
    cases += [("random", i, None) for i in range(args.n)]

    rng = np.random.default_rng(seed)
    for kind, ident, d in cases:
        if kind == "fixture":
            tokens = json.load(open(os.path.join(d, "tokens.json")))
            ref = np.load(os.path.join(d, "logits.npy"))
            label = f"fixture {ident}"
            ckpt = d
        else:
            cfg, T = random_config(rng)
            label = f"random {ident}: {describe(cfg, T)}"
            wseed0 = int(rng.integers(10_000_000, 20_000_000))  # disjoint from the fixtures' seeds
            try:
                rejected = []
                wseed, stored, tokens, ref, stats = mg.find_case(cfg, wseed0, T, max_tries=60, log=rejected.append,
                                                                 device=args.torch_device)
            except RuntimeError as e:
                print(f"  {label}: skipped ({e})")
                continue
            ckpt = os.path.join(work, f"case{ident}")
            vc.save_checkpoint(ckpt, cfg, stored, n_shards=int(rng.integers(2, 4)), tokenizer=True)
            label += f" wseed{wseed}"
        out = os.path.join(work, f"logits_{kind}_{ident}.npy")
        try:
            got, dt, err = run_engine(args.affinity, ckpt, tokens, args.extra, out, args.timeout)
        except subprocess.TimeoutExpired:
            got, dt, err = None, args.timeout, "timed out"
        if got is None:
            print(f"FAIL {label}\n     engine error: {err}")
            failures += 1
            continue
        r = compare(got, ref)
        if "error" in r:
            print(f"FAIL {label}\n     {r['error']}")
            failures += 1
            continue
        ok = r["rel_rms"] <= args.max_rel_rms and r["top1"] >= args.min_top1
        failures += not ok
        rows.append(r)
        print(f"{'ok  ' if ok else 'FAIL'} {label}\n     rel_rms {r['rel_rms']:.3e}  top1 {r['top1'] * 100:.2f}%  "
              f"max_abs {r['max_abs']:.3e} (position {r['worst_position']})  engine {dt:.1f}s", flush=True)

    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    if rows:
        print(f"summary: {len(rows)} compared, worst rel_rms {max(r['rel_rms'] for r in rows):.3e}, "
              f"worst top1 {min(r['top1'] for r in rows) * 100:.2f}%, failures {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
