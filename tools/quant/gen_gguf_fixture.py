#!/usr/bin/env python3
"""Writes tests/data/quant/gguf_py_deepseek4.gguf with the PyPI `gguf` package's GGUFWriter:
a tiny deepseek4-named container whose metadata and tensor contents follow simple
formulas that tests/gguf/gguf_py_compat_test.cpp recomputes. It proves that a file written
by an independent GGUF implementation reads correctly with ours.

Usage: python tools/quant/gen_gguf_fixture.py tests/data/quant/gguf_py_deepseek4.gguf
"""
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T


def formula(n, scale=0.25, offset=-3.0):
    # Values exactly representable in f16: multiples of 1/4 in a small range.
    return (np.arange(n, dtype=np.float32) % 29) * scale + offset


def main():
    path = sys.argv[1]
    w = gguf.GGUFWriter(path, "deepseek4")  # writes general.architecture
    w.add_uint32("deepseek4.block_count", 2)
    w.add_uint32("deepseek4.embedding_length", 64)
    w.add_uint32("deepseek4.expert_count", 4)
    w.add_uint32("deepseek4.expert_used_count", 2)
    w.add_float32("deepseek4.expert_weights_scale", 1.5)
    w.add_bool("deepseek4.expert_weights_norm", True)
    w.add_float64("deepseek4.test.f64", -2.5)
    w.add_int64("deepseek4.test.i64", -1234567890123)
    w.add_uint64("deepseek4.test.u64", 1 << 40)
    w.add_int8("deepseek4.test.i8", -7)
    w.add_uint16("deepseek4.test.u16", 65000)
    w.add_array("deepseek4.attention.compress_ratios", [0, 4, 128])
    w.add_array("deepseek4.swiglu_clamp_exp", [10.0, 10.0])
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_array("tokenizer.ggml.tokens", ["<｜begin▁of▁sentence｜>", "a", "b", "ab"])

    # F32 norm [64]
    w.add_tensor("output_norm.weight", formula(64))
    # F16 embedding: numpy [vocab=4, 64] -> ggml ne [64, 4]
    w.add_tensor("token_embd.weight", formula(256).reshape(4, 64).astype(np.float16))
    # Q8_0 projection: [rows=3, cols=64]
    q8_src = formula(3 * 64, 0.125, -1.5).reshape(3, 64)
    w.add_tensor("blk.0.attn_q_a.weight", gguf.quants.quantize(q8_src, T.Q8_0), raw_dtype=T.Q8_0)
    # I32 hash table [tokens=4, 2]: ne [2, 4]
    w.add_tensor("blk.0.ffn_gate_tid2eid.weight", (np.arange(8, dtype=np.int32) * 3 - 5).reshape(4, 2))
    # Stacked experts as MXFP4 raw bytes: numpy [n_expert=4, rows=2, 64/32*17 bytes]
    raw = (np.arange(4 * 2 * 34, dtype=np.uint32) * 7 % 251).astype(np.uint8).reshape(4, 2, 34)
    w.add_tensor("blk.1.ffn_gate_exps.weight", raw, raw_dtype=T.MXFP4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
