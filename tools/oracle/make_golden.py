"""Build the golden fixtures: tiny random DeepSeek-V4 checkpoints in the official layout plus
reference logits from transformers (float32, eager) on the same dequantised weights.

    $PYTHON tools/oracle/make_golden.py [--out tests/data/golden] [--only NAME] [--sizes]

Per fixture directory `<out>/<name>/`: config.json, model.safetensors.index.json, shards,
tokens.json, logits.npy (float32 [T, vocab], .npy v1), meta.json. See tests/data/golden/README.md.

Seeds whose router or indexer top-k has a near-tie anywhere (any layer, any position) are
rejected and the next seed is tried, so that an engine computing in float32 with a different
summation order selects exactly the same experts / compressed entries.

The functions here are shared with check_random.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import v4ckpt as vc  # noqa: E402

# Relative margin (gap between the k-th and (k+1)-th candidate divided by the RMS of the
# candidates' scores) below which a selection counts as a near-tie. The float32 rounding noise
# of these scores (float32 vs float64 torch, recorded per fixture as
# selection_score_f32_rel_noise) is ~1e-6, and an engine's float32 noise is of the same order,
# so 2e-4 leaves a factor of ~25 over the worst pairwise error.
MIN_REL_MARGIN = 2e-4

# ----------------------------------------------------------------------------- fixture configs

MAX_FIXTURE_BYTES = 3_000_000   # per fixture directory (the repository carries them)

_COMMON = dict(vocab_size=512, hidden_size=128, qk_rope_head_dim=64, q_lora_rank=128, swiglu_limit=10.0,
               routed_scaling_factor=1.5, hc_mult=4, hc_sinkhorn_iters=20, moe_intermediate_size=128)

# name -> (config kwargs, number of tokens, first seed). Each covers a different mix; see the README.
FIXTURES = {
    # SWA + CSA + HCA (ratio 16), hash routing on a SWA and a CSA layer, ring wraps (window 64 < T).
    "mix_swa_csa_hca16": (dict(num_hidden_layers=4, compress_ratios=[0, 4, 16, 4], num_hash_layers=2,
                               num_attention_heads=2, head_dim=128, o_groups=2, o_lora_rank=64,
                               sliding_window=64, index_n_heads=8, index_head_dim=128, index_topk=16,
                               n_routed_experts=3, num_experts_per_tok=2, num_nextn_predict_layers=0,
                               vocab_size=448),
                          270, 1000),
    # The real HCA ratio 128 (T > 2*128 so two entries become visible), head_dim 192, one output
    # group, and an MTP block (loaded, not checked: transformers has no MTP).
    "hca128_mtp": (dict(num_hidden_layers=3, compress_ratios=[0, 4, 128, 0], num_hash_layers=1,
                        num_attention_heads=2, head_dim=192, o_groups=1, o_lora_rank=128,
                        sliding_window=32, index_n_heads=6, index_head_dim=128, index_topk=8,
                        n_routed_experts=3, num_experts_per_tok=2, num_nextn_predict_layers=1,
                        vocab_size=400),
                   290, 2000),
    # Compressed layers only, HCA (ratio 8) first like V4-Pro's HCA bootstrap and hash-routed,
    # 2 heads per output group, top-3 of 5 experts, index_head_dim 128 with 6 index heads, window 48.
    "csa_heavy_top3": (dict(num_hidden_layers=3, compress_ratios=[8, 4, 4], num_hash_layers=1,
                            num_attention_heads=4, head_dim=128, o_groups=2, o_lora_rank=64,
                            sliding_window=48, index_n_heads=6, index_head_dim=128, index_topk=6,
                            n_routed_experts=5, num_experts_per_tok=3, num_nextn_predict_layers=0),
                       260, 3000),
}


def make_config(kw: dict) -> vc.V4Config:
    d = dict(_COMMON)
    d.update(kw)
    n = d["num_hidden_layers"]
    mtp = d.get("num_nextn_predict_layers", 0)
    d["compress_ratios"] = list(d["compress_ratios"][:n]) + [0] * mtp
    cfg = vc.V4Config(**d)
    cfg.check()
    return cfg


# ----------------------------------------------------------------------------- random weights

def random_weights(cfg: vc.V4Config, rng: np.random.Generator) -> dict:
    """Float32 master weights (official names) scaled so that activations stay O(1), attention
    and routing are far from uniform, and logits have a std of ~2.5 (non-degenerate softmax)."""
    D = cfg.hidden_size
    # A direction shared by every token embedding (like the dominant mean direction of a trained
    # model's hidden states), which the indexer's weights_proj rows lean on: the per-head index
    # weights then are mostly positive, so index scores are not riddled with exact-zero ties
    # (all-ReLU-zero entries) at the top-k boundary.
    common = rng.normal(0, 1, D)
    common /= np.linalg.norm(common)
    out = {}
    for name, kind, shape in vc.tensor_specs(cfg):
        leaf = name.rsplit(".", 1)[-1] if not name.endswith(".weight") else name.rsplit(".", 2)[-2]
        if kind == "i64":  # tid2eid: distinct expert ids per row
            keys = rng.random((shape[0], cfg.n_routed_experts))
            out[name] = np.argsort(keys, axis=1)[:, :shape[1]].astype(np.int64)
            continue
        if name.endswith("_fn"):          # mHC mixing projections: pre-activation std ~1
            w = rng.normal(0, 1.0 / np.sqrt(shape[1]), shape)
        elif name.endswith("_base"):
            w = rng.normal(0, 0.7, shape)
        elif name.endswith("_scale") and kind == "f32":
            w = rng.uniform(0.4, 1.2, shape)
        elif leaf in ("attn_norm", "ffn_norm", "q_norm", "kv_norm", "norm", "enorm", "hnorm"):
            w = 1.0 + rng.normal(0, 0.15, shape)
        elif name.endswith("attn_sink"):
            w = rng.normal(0, 1.0, shape)
        elif name.endswith(".ape"):
            w = rng.normal(0, 0.5, shape)
        elif name.endswith("gate.bias"):
            w = rng.normal(0, 0.3, shape)
        elif name == "embed.weight":
            w = rng.normal(0, 1.0, shape)
        elif name == "head.weight":
            w = rng.normal(0, 2.5 / np.sqrt(D), shape)
        elif name.endswith("ffn.gate.weight"):
            w = rng.normal(0, 1.5 / np.sqrt(shape[1]), shape)
        elif name.endswith("wgate.weight"):
            w = rng.normal(0, 1.5 / np.sqrt(shape[1]), shape)
        elif name.endswith("kv_norm.weight") or len(shape) == 1:
            w = 1.0 + rng.normal(0, 0.15, shape)
        else:                             # projections [out, in]
            w = rng.normal(0, 1.0 / np.sqrt(shape[1]), shape)
        if name == "embed.weight":
            w = w + 6.0 * common
        elif name.endswith("indexer.weights_proj.weight"):
            w = w + 0.5 * common
        out[name] = w.astype(np.float32)
    return out


# ----------------------------------------------------------------------------- oracle + margins

def _rel_margin(sorted_desc, k: int, rms) -> np.ndarray:
    return (sorted_desc[..., k - 1] - sorted_desc[..., k]) / np.maximum(rms, 1e-30)


def oracle_logits(cfg: vc.V4Config, deq: dict, tokens: list, check_f64: bool = True, device: str = "cpu") -> tuple:
    """Run transformers on the dequantised weights. Returns (logits float32 [T, V], stats dict).
    stats: min relative margins of router and indexer top-k selections, top-1 logit gap,
    and (check_f64) the float32-vs-float64 logit difference and whether selections agree."""
    import torch
    import torch.nn.functional as F

    if device.startswith("cuda"):  # TF32 would make the "float32" reference ~1e-3 accurate
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    model = vc.build_hf_model(cfg, deq, torch.float32).to(device)
    ids = torch.tensor([tokens], dtype=torch.long, device=device)
    T = len(tokens)
    rec = {"router": [], "indexer": []}
    hooks = []

    def router_hook(mod, args, output):
        x = args[0].reshape(-1, mod.hidden_dim).double()
        s = F.softplus(F.linear(x, mod.weight.double())).sqrt() + mod.e_score_correction_bias.double()
        s = s.cpu()
        srt = torch.sort(s, dim=-1, descending=True).values.numpy()
        rms = np.sqrt((srt ** 2).mean(-1))
        rec["router"].append((_rel_margin(srt, mod.top_k, rms), output[2].cpu().numpy(), s.numpy()))

    def scorer_hook(mod, args, output):
        sc = output[0].double().cpu().numpy()                # [S, n_entries]
        n_vis = (np.arange(T) + 1) // 4
        margins = np.full(T, np.inf)
        k = cfg.index_topk
        for p in range(T):
            v = n_vis[p]
            if v > k:
                srt = np.sort(sc[p, :v])[::-1]
                margins[p] = _rel_margin(srt, k, np.sqrt((srt ** 2).mean()))
        sel = []
        for p in range(T):
            v = n_vis[p]
            top = np.argsort(-sc[p, :v], kind="stable")[:k] if v else np.zeros(0, np.int64)
            sel.append(np.sort(top))
        rec["indexer"].append((margins, sel, sc))

    for mod in model.modules():
        tn = type(mod).__name__
        if tn == "DeepseekV4TopKRouter":
            hooks.append(mod.register_forward_hook(router_hook))
        elif tn == "DeepseekV4IndexerScorer":
            hooks.append(mod.register_forward_hook(scorer_hook))
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0].float().cpu().numpy()
    for h in hooks:
        h.remove()

    stats = {
        "router_min_rel_margin": float(min((m.min() for m, *_ in rec["router"]), default=np.inf)),
        "indexer_min_rel_margin": float(min((m.min() for m, *_ in rec["indexer"]), default=np.inf)),
        "indexer_selecting_queries": int(sum(np.isfinite(m).sum() for m, *_ in rec["indexer"])),
    }
    top2 = np.sort(logits, axis=-1)[:, -2:]
    stats["top1_min_gap"] = float((top2[:, 1] - top2[:, 0]).min())
    stats["logit_std"] = float(logits.std())

    if check_f64:
        f32_rec = rec
        rec = {"router": [], "indexer": []}
        del model
        model64 = vc.build_hf_model(cfg, deq, torch.float64).to(device)
        hooks = []
        for mod in model64.modules():
            tn = type(mod).__name__
            if tn == "DeepseekV4TopKRouter":
                hooks.append(mod.register_forward_hook(router_hook))
            elif tn == "DeepseekV4IndexerScorer":
                hooks.append(mod.register_forward_hook(scorer_hook))
        with torch.no_grad():
            l64 = model64(input_ids=ids, use_cache=False).logits[0].cpu().numpy()
        for h in hooks:
            h.remove()
        stats["f32_vs_f64_rel_rms"] = float(np.sqrt(((logits - l64) ** 2).mean() / (l64 ** 2).mean()))
        same = all(np.array_equal(np.sort(a[1], -1), np.sort(b[1], -1))
                   for a, b in zip(f32_rec["router"], rec["router"]))
        same &= all(all(np.array_equal(x, y) for x, y in zip(a[1], b[1]))
                    for a, b in zip(f32_rec["indexer"], rec["indexer"]))
        stats["f32_f64_selections_agree"] = bool(same)
        # float32 rounding noise of the selection scores, relative to their RMS: the margin
        # threshold must dwarf this
        noise = 0.0
        for a, b in zip(f32_rec["router"] + f32_rec["indexer"], rec["router"] + rec["indexer"]):
            noise = max(noise, float(np.abs(a[2] - b[2]).max() / np.sqrt((b[2] ** 2).mean())))
        stats["selection_score_f32_rel_noise"] = noise
    return logits, stats


def acceptable(stats: dict) -> bool:
    ok = stats["router_min_rel_margin"] >= MIN_REL_MARGIN and stats["indexer_min_rel_margin"] >= MIN_REL_MARGIN
    return ok and stats.get("f32_f64_selections_agree", True)


def build_case(cfg: vc.V4Config, seed: int, T: int, check_f64: bool = True, device: str = "cpu") -> tuple:
    """-> (stored tensors, dequantised tensors, tokens, logits, stats) for one seed."""
    rng = np.random.default_rng(seed)
    master = random_weights(cfg, rng)
    stored = vc.quantize_official(cfg, master)
    deq = vc.dequantize_official(cfg, stored)
    tokens = [int(t) for t in rng.integers(0, cfg.vocab_size, T)]
    logits, stats = oracle_logits(cfg, deq, tokens, check_f64, device)
    return stored, deq, tokens, logits, stats


def find_case(cfg: vc.V4Config, first_seed: int, T: int, max_tries: int = 50, log=print,
              device: str = "cpu") -> tuple:
    for seed in range(first_seed, first_seed + max_tries):
        stored, deq, tokens, logits, stats = build_case(cfg, seed, T, device=device)
        if acceptable(stats):
            return seed, stored, tokens, logits, stats
        log(f"  seed {seed} rejected: router margin {stats['router_min_rel_margin']:.2e}, "
            f"indexer margin {stats['indexer_min_rel_margin']:.2e}, "
            f"f32/f64 selections agree {stats.get('f32_f64_selections_agree')}")
    raise RuntimeError(f"no acceptable seed in [{first_seed}, {first_seed + max_tries})")


def versions() -> dict:
    import torch
    import transformers
    return {"torch": torch.__version__, "transformers": transformers.__version__, "numpy": np.__version__}


def write_fixture(out_dir: str, name: str, cfg: vc.V4Config, seed: int, stored: dict, tokens: list,
                  logits: np.ndarray, stats: dict) -> None:
    d = os.path.join(out_dir, name)
    if os.path.isdir(d):
        for f in os.listdir(d):
            os.remove(os.path.join(d, f))
    vc.save_checkpoint(d, cfg, stored, n_shards=2, tokenizer=True)
    with open(os.path.join(d, "tokens.json"), "w") as f:
        json.dump(tokens, f)
        f.write("\n")
    np.save(os.path.join(d, "logits.npy"), np.ascontiguousarray(logits, dtype=np.float32), allow_pickle=False)
    ratios = cfg.compress_ratios[:cfg.num_hidden_layers]
    meta = {
        "name": name, "seed": seed, "n_tokens": len(tokens), "vocab_size": cfg.vocab_size,
        "layer_types": ["sliding" if r == 0 else "csa" if r == 4 else f"hca{r}" for r in ratios],
        "hash_layers": list(range(cfg.num_hash_layers)),
        "num_nextn_predict_layers": cfg.num_nextn_predict_layers,
        "sliding_window": cfg.sliding_window, "index_topk": cfg.index_topk,
        "experts": f"{cfg.num_experts_per_tok} of {cfg.n_routed_experts} + 1 shared",
        "reference": "transformers DeepseekV4ForCausalLM, float32, eager attention, use_cache=False, "
                     "dequantised weights; logits for every position",
        "min_rel_margin_required": MIN_REL_MARGIN,
        "stats": stats, "versions": versions(),
    }
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")


def dir_bytes(d: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "golden"))
    ap.add_argument("--only", action="append", help="build only this fixture (repeatable)")
    ap.add_argument("--sizes", action="store_true", help="print the expected sizes and exit")
    args = ap.parse_args()
    names = args.only or list(FIXTURES)
    for name in names:
        kw, T, seed0 = FIXTURES[name]
        cfg = make_config(kw)
        if args.sizes:
            st = vc.quantize_official(cfg, random_weights(cfg, np.random.default_rng(0)))
            b = sum(a.nbytes for _, a in st.values()) + T * cfg.vocab_size * 4
            print(f"{name}: ~{b / 1e6:.2f} MB")
            continue
        print(f"{name}: building (T={T})", flush=True)
        seed, stored, tokens, logits, stats = find_case(cfg, seed0, T)
        write_fixture(args.out, name, cfg, seed, stored, tokens, logits, stats)
        d = os.path.join(args.out, name)
        print(f"{name}: seed {seed}, {dir_bytes(d) / 1e6:.2f} MB, stats {json.dumps(stats)}", flush=True)
        if dir_bytes(d) > MAX_FIXTURE_BYTES:
            print(f"error: {d} is {dir_bytes(d)} bytes, over the {MAX_FIXTURE_BYTES} budget", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
