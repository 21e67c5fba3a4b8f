#!/usr/bin/env python3
"""Writes tests/data/gguf_model/gguf_py_deepseek4.gguf: a tiny DeepSeek-V4
model written by the independent `gguf` Python package (GGUFWriter) with
llama.cpp's deepseek4 tensor names and metadata keys and a mix of llama.cpp
weight types, plus gguf_py_deepseek4.json: rows of some weights as gguf-py's
own dequantiser decodes them (the loader test checks ours reads the same
numbers at the same tensor/expert/row).

Types: dense attention/shared-expert/head Q8_0 (gguf-py's quantiser), embedding
and router/indexer/compressor/mHC fn F16, norms/sinks/bias/ape F32, tid2eid I32;
routed experts per layer:
  layer 0: gate Q4_K, up IQ2_XXS, down MXFP4 (gguf-py's quantiser)
  layer 1: gate Q2_K, up Q3_K,    down Q8_0
  layer 2: gate IQ4_XS, up Q6_K,  down MXFP4
gguf-py cannot quantise K/IQ types, so those tensors are random blocks with
sane f16 scales — every byte pattern is a valid block, and the decoded values
are whatever gguf-py says they are.

Usage: PYTHON tools/gguf_model/make_gguf_py_fixture.py [--out-dir DIR] [--seed N]
"""
import argparse
import json
import os

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

ARCH = "deepseek4"
# A small config with every V4 feature (see synthetic_tiny_config): SWA, CSA
# (indexer), HCA layers, hash routing, shared expert. Row lengths are multiples
# of 256 wherever a K/IQ type is used.
CFG = dict(vocab=300, D=256, layers=3, heads=4, head_dim=64, rope_dim=16, q_lora=64, o_groups=2, o_lora=32,
           window=16, ratios=[0, 4, 8], E=4, K=2, inter=64, hash_layers=1, hc=4, sinkhorn=20,
           idx_heads=4, idx_dim=32, idx_topk=5)

# f16 scale field offsets per block for the random-block types: (block bytes, [offsets of f16 scales]).
RANDOM_BLOCKS = {
    Q.Q4_K: (144, [0, 2]),
    Q.IQ2_XXS: (66, [0]),
    Q.Q2_K: (84, [80, 82]),
    Q.Q3_K: (110, [108]),
    Q.IQ4_XS: (136, [0]),
    Q.Q6_K: (210, [208]),
}
EXPERT_TYPES = [
    (Q.Q4_K, Q.IQ2_XXS, Q.MXFP4),
    (Q.Q2_K, Q.Q3_K, Q.Q8_0),
    (Q.IQ4_XS, Q.Q6_K, Q.MXFP4),
]


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out-dir", default=os.path.join(here, "..", "..", "tests", "data", "gguf_model"))
    ap.add_argument("--seed", type=int, default=20240917)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    c = CFG
    D, E, H, Dh = c["D"], c["E"], c["heads"], c["head_dim"]
    path = os.path.join(args.out_dir, "gguf_py_deepseek4.gguf")
    w = gguf.GGUFWriter(path, ARCH)
    k = ARCH + "."
    w.add_uint32(k + "block_count", c["layers"])
    w.add_uint32(k + "context_length", 4096)
    w.add_uint32(k + "embedding_length", D)
    w.add_uint32(k + "vocab_size", c["vocab"])
    w.add_uint32(k + "attention.head_count", H)
    w.add_uint32(k + "attention.head_count_kv", 1)
    w.add_uint32(k + "attention.key_length", Dh)
    w.add_uint32(k + "attention.value_length", Dh)
    w.add_uint32(k + "rope.dimension_count", c["rope_dim"])
    w.add_uint32(k + "attention.q_lora_rank", c["q_lora"])
    w.add_uint32(k + "attention.output_lora_rank", c["o_lora"])
    w.add_uint32(k + "attention.output_group_count", c["o_groups"])
    w.add_array(k + "attention.compress_ratios", c["ratios"])
    w.add_float32(k + "attention.compress_rope_freq_base", 160000.0)
    w.add_uint32(k + "attention.sliding_window", c["window"])
    w.add_uint32(k + "attention.indexer.head_count", c["idx_heads"])
    w.add_uint32(k + "attention.indexer.key_length", c["idx_dim"])
    w.add_uint32(k + "attention.indexer.top_k", c["idx_topk"])
    w.add_float32(k + "attention.layer_norm_rms_epsilon", 1e-6)
    w.add_uint32(k + "expert_count", E)
    w.add_uint32(k + "expert_used_count", c["K"])
    w.add_uint32(k + "expert_shared_count", 1)
    w.add_uint32(k + "expert_feed_forward_length", c["inter"])
    w.add_float32(k + "expert_weights_scale", 1.5)
    w.add_bool(k + "expert_weights_norm", True)
    w.add_uint32(k + "expert_group_count", 0)
    w.add_uint32(k + "expert_group_used_count", 0)
    w.add_uint32(k + "hash_layer_count", c["hash_layers"])
    w.add_uint32(k + "hyper_connection.count", c["hc"])
    w.add_uint32(k + "hyper_connection.sinkhorn_iterations", c["sinkhorn"])
    w.add_float32(k + "hyper_connection.epsilon", 1e-6)
    w.add_array(k + "swiglu_clamp_exp", [10.0] * c["layers"])
    w.add_float32(k + "rope.freq_base", 10000.0)
    w.add_string(k + "rope.scaling.type", "yarn")
    w.add_float32(k + "rope.scaling.factor", 4.0)
    w.add_uint32(k + "rope.scaling.original_context_length", 64)
    w.add_float32(k + "rope.scaling.yarn_beta_fast", 32.0)
    w.add_float32(k + "rope.scaling.yarn_beta_slow", 1.0)
    w.add_uint32("tokenizer.ggml.bos_token_id", 0)
    w.add_uint32("tokenizer.ggml.eos_token_id", 1)

    spots = []  # rows decoded by gguf-py, for the test

    def f32(name, shape, scale=0.1, offset=0.0):
        w.add_tensor(name, (offset + scale * rng.standard_normal(shape)).astype(np.float32))

    def f16(name, shape, scale=0.05):
        w.add_tensor(name, (scale * rng.standard_normal(shape)).astype(np.float16))

    def quantised(name, shape, qtype, scale=0.05, spot=None):
        """shape in numpy order: [out, in] or [E, out, in]."""
        if qtype in RANDOM_BLOCKS:
            bb, offs = RANDOM_BLOCKS[qtype]
            nblk = shape[-1] // 256
            raw = rng.integers(0, 256, size=tuple(shape[:-1]) + (nblk, bb), dtype=np.uint8)
            for o in offs:
                d = rng.uniform(0.002, 0.02, size=raw.shape[:-1]).astype(np.float16)
                raw[..., o:o + 2] = d.view(np.uint8).reshape(raw.shape[:-1] + (2,))
            data = raw.reshape(tuple(shape[:-1]) + (nblk * bb,))
        else:
            data = gguf.quants.quantize((scale * rng.standard_normal(shape)).astype(np.float32), qtype)
        w.add_tensor(name, data, raw_dtype=qtype)
        if spot:
            rows = gguf.quants.dequantize(data, qtype)  # numpy order, like `shape`
            for idx in spot:
                spots.append({"tensor": name, "index": list(idx),
                              "values": [float(v) for v in rows[tuple(idx)].astype(np.float32)]})

    f16("token_embd.weight", (c["vocab"], D), 0.5)
    quantised("output.weight", (c["vocab"], D), Q.Q8_0, spot=[(c["vocab"] - 1,)])
    f32("output_norm.weight", (D,), 0.1, 1.0)
    hc = c["hc"]
    f16("output_hc_fn.weight", (hc, hc * D), 0.02)
    f32("output_hc_base.weight", (hc,), 0.1)
    f32("output_hc_scale.weight", (1,), 0.1, 1.0)
    mix = (2 + hc) * hc
    for l in range(c["layers"]):
        p = f"blk.{l}."
        ratio = c["ratios"][l]
        for site in ("hc_attn", "hc_ffn"):
            f16(p + site + "_fn.weight", (mix, hc * D), 0.02)
            f32(p + site + "_base.weight", (mix,), 0.1)
            f32(p + site + "_scale.weight", (3,), 0.1, 1.0)
        f32(p + "attn_norm.weight", (D,), 0.1, 1.0)
        f32(p + "ffn_norm.weight", (D,), 0.1, 1.0)
        quantised(p + "attn_q_a.weight", (c["q_lora"], D), Q.Q8_0)
        f32(p + "attn_q_a_norm.weight", (c["q_lora"],), 0.1, 1.0)
        quantised(p + "attn_q_b.weight", (H * Dh, c["q_lora"]), Q.Q8_0, spot=[(H * Dh - 1,)] if l == 1 else None)
        quantised(p + "attn_kv.weight", (Dh, D), Q.Q8_0)
        f32(p + "attn_kv_a_norm.weight", (Dh,), 0.1, 1.0)
        quantised(p + "attn_output_a.weight", (c["o_groups"] * c["o_lora"], (H // c["o_groups"]) * Dh), Q.Q8_0)
        quantised(p + "attn_output_b.weight", (D, c["o_groups"] * c["o_lora"]), Q.Q8_0)
        f32(p + "attn_sinks.weight", (H,), 0.5)
        if ratio:
            cd = (2 if ratio == 4 else 1) * Dh
            f32(p + "attn_compressor_ape.weight", (ratio, cd), 0.1)
            f16(p + "attn_compressor_kv.weight", (cd, D))
            f16(p + "attn_compressor_gate.weight", (cd, D))
            f32(p + "attn_compressor_norm.weight", (Dh,), 0.1, 1.0)
        if ratio == 4:
            f16(p + "indexer.attn_q_b.weight", (c["idx_heads"] * c["idx_dim"], c["q_lora"]))
            f16(p + "indexer.proj.weight", (c["idx_heads"], D))
            icd = 2 * c["idx_dim"]
            f32(p + "indexer_compressor_ape.weight", (4, icd), 0.1)
            f16(p + "indexer_compressor_kv.weight", (icd, D))
            f16(p + "indexer_compressor_gate.weight", (icd, D))
            f32(p + "indexer_compressor_norm.weight", (c["idx_dim"],), 0.1, 1.0)
        f16(p + "ffn_gate_inp.weight", (E, D), 0.2)
        if l < c["hash_layers"]:
            w.add_tensor(p + "ffn_gate_tid2eid.weight",
                         rng.integers(0, E, size=(c["vocab"], c["K"])).astype(np.int32))
        else:
            f32(p + "exp_probs_b.bias", (E,), 0.1)
        g_t, u_t, d_t = EXPERT_TYPES[l]
        inter = c["inter"]
        # Spots: the last row of the last expert (slicing offset) and row 3 of expert 1.
        quantised(p + "ffn_gate_exps.weight", (E, inter, D), g_t, spot=[(E - 1, inter - 1), (1, 3)])
        quantised(p + "ffn_up_exps.weight", (E, inter, D), u_t, spot=[(E - 1, inter - 1), (1, 3)])
        quantised(p + "ffn_down_exps.weight", (E, D, inter), d_t, spot=[(E - 1, D - 1), (1, 3)])
        quantised(p + "ffn_gate_shexp.weight", (inter, D), Q.Q8_0)
        quantised(p + "ffn_up_shexp.weight", (inter, D), Q.Q8_0)
        quantised(p + "ffn_down_shexp.weight", (D, inter), Q.Q8_0)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(os.path.join(args.out_dir, "gguf_py_deepseek4.json"), "w") as f:
        json.dump({"generator": "tools/gguf_model/make_gguf_py_fixture.py", "seed": args.seed,
                   "gguf_py_version": getattr(gguf, "__version__", "unknown"), "spots": spots}, f)
    print(path, os.path.getsize(path), "bytes;", len(spots), "spot rows")


if __name__ == "__main__":
    main()
