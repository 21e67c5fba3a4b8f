#!/usr/bin/env python3
"""Export the tiny model to the official DeepSeek-V4-Flash Hugging Face layout, and load it back.

Layout and quantisers come from tools/oracle/v4ckpt.py (FP8 E4M3 with 128x128 E8M0 scales for
dense weights, MXFP4 experts, BF16/F32/I64 rest, config.json with the official keys, index +
3 shards, each below 16 MB).  This file only adds the MTP block's names, which v4ckpt's transformers mapping does
not cover, and the tokenizer / generation config next to the weights.

    python export.py --ckpt work/run/master.pt --tokenizer work/tokenizer.json --out models/tiny-v4
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "oracle"))
import v4ckpt  # noqa: E402

import model as tm  # noqa: E402

_MTP_EXTRA = [("e_proj.weight", "e_proj.weight"), ("h_proj.weight", "h_proj.weight"),
              ("enorm.weight", "enorm.weight"), ("hnorm.weight", "hnorm.weight"), ("norm.weight", "norm.weight"),
              ("hc_head_fn", "hc_head.hc_fn"), ("hc_head_base", "hc_head.hc_base"),
              ("hc_head_scale", "hc_head.hc_scale")]


def v4_config(cfg):
    keys = {f.name for f in v4ckpt.dataclasses.fields(v4ckpt.V4Config)}
    return v4ckpt.V4Config(**{k: v for k, v in dict(cfg, max_position_embeddings=1048576).items() if k in keys})


def _mtp_pairs(cfg):
    """(official name, TinyV4 state-dict name) for every MTP tensor; experts handled apart."""
    pairs = [(f"mtp.0.{a}", f"mtp.layer.{b}") for a, b in v4ckpt._LAYER_RENAMES
             if not a.startswith("attn.compressor") and not a.startswith("attn.indexer") and a != "ffn.gate.tid2eid"]
    return pairs + [(f"mtp.0.{a}", f"mtp.{b}") for a, b in _MTP_EXTRA]


def to_official(model):
    """TinyV4 (no parametrisations) -> official name -> float32 numpy (int64 for tid2eid)."""
    cfg = model.cfg
    vc = v4_config(cfg)
    out = v4ckpt.hf_to_official(vc, model.lm.state_dict())
    sd = model.state_dict()
    for off, mine in _mtp_pairs(cfg):
        out[off] = sd[mine].detach().cpu().float().numpy()
    I = cfg["moe_intermediate_size"]
    gu, dn = sd["mtp.layer.mlp.experts.gate_up_proj"].cpu().float(), sd["mtp.layer.mlp.experts.down_proj"].cpu().float()
    for e in range(cfg["n_routed_experts"]):
        out[f"mtp.0.ffn.experts.{e}.w1.weight"] = gu[e, :I].numpy()
        out[f"mtp.0.ffn.experts.{e}.w3.weight"] = gu[e, I:].numpy()
        out[f"mtp.0.ffn.experts.{e}.w2.weight"] = dn[e].numpy()
    return vc, out


def from_official(cfg, deq):
    """Dequantised official tensors -> TinyV4 with those weights (float32, eval mode)."""
    vc = v4_config(cfg)
    m = tm.TinyV4(cfg)
    sd = {"lm." + k: v for k, v in v4ckpt.official_to_hf(vc, deq).items()}
    for off, mine in _mtp_pairs(cfg):
        sd[mine] = torch.from_numpy(np.ascontiguousarray(deq[off]))
    E = cfg["n_routed_experts"]
    sd["mtp.layer.mlp.experts.gate_up_proj"] = torch.from_numpy(np.stack(
        [np.concatenate([deq[f"mtp.0.ffn.experts.{e}.w1.weight"], deq[f"mtp.0.ffn.experts.{e}.w3.weight"]]) for e in range(E)]))
    sd["mtp.layer.mlp.experts.down_proj"] = torch.from_numpy(np.stack([deq[f"mtp.0.ffn.experts.{e}.w2.weight"] for e in range(E)]))
    missing, unexpected = m.load_state_dict(sd, strict=False)
    missing = [k for k in missing if "inv_freq" not in k]
    if missing or unexpected:
        raise AssertionError(f"missing {missing[:8]} unexpected {unexpected[:8]}")
    return m.eval()


def export(model, tokenizer_path, out_dir):
    """Write the official-layout checkpoint of `model` (which must carry no parametrisations)."""
    vc, weights = to_official(model)
    stored = v4ckpt.quantize_official(vc, weights)
    extra = {"pad_token_id": model.cfg["pad_token_id"], "expert_dtype": "fp4"}
    v4ckpt.save_checkpoint(out_dir, vc, stored, n_shards=3, extra_config=extra)
    shutil.copy(tokenizer_path, os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 0, "eos_token_id": 1, "do_sample": True, "temperature": 1.0, "top_p": 1.0}, f,
                  indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>",
                   "pad_token": "<｜▁pad▁｜>", "add_bos_token": False, "add_eos_token": False,
                   "model_max_length": 1048576, "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=2)
        f.write("\n")
    return stored


def load_export(out_dir, cfg):
    vc, stored = v4ckpt.load_checkpoint(out_dir)
    return from_official(cfg, v4ckpt.dequantize_official(vc, stored))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", required=True, help="master.pt written by train.py")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    blob = torch.load(args.ckpt, map_location="cpu")
    m = tm.TinyV4(blob["cfg"])
    m.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in blob["state"].items()})
    tm.enable_fake_quant(m)
    tm.disable_fake_quant(m, keep_quantized=True)
    export(m, args.tokenizer, args.out)


if __name__ == "__main__":
    main()
