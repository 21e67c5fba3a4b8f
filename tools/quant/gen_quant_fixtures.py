#!/usr/bin/env python3
"""Writes the block-format fixtures under tests/data/quant/ from the PyPI `gguf` package.

dequant_<TYPE>.bin: random blocks (random bytes with finite scales) and the values
    gguf.quants.dequantize gives for them. Layout (little-endian):
    "AFQD", u32 ggml type id, u32 n elements, row bytes, then n f32 expected values.
quant_<TYPE>.bin: random inputs and the bytes gguf.quants.quantize gives for them
    (only for the types whose quantiser the gguf package defines bit-exactly against
    ggml: Q8_0, MXFP4). Layout: "AFQQ", u32 type id, u32 n, n f32 inputs, row bytes.

Usage: python tools/quant/gen_quant_fixtures.py tests/data/quant
"""
import os
import struct
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

# Offsets of the f16 scale fields in each block (ggml-common.h), to be overwritten with
# finite values so that outputs compare bit-for-bit without NaN/inf noise.
F16_FIELDS = {
    T.Q8_0: [0], T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2],
    T.Q6_K: [208], T.IQ2_XXS: [0], T.IQ2_XS: [0], T.IQ3_XXS: [0], T.IQ1_S: [0],
    T.IQ4_NL: [0], T.IQ4_XS: [0],
}
TYPES = [T.F32, T.F16, T.BF16, T.Q8_0, T.MXFP4, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
         T.IQ2_XXS, T.IQ2_XS, T.IQ3_XXS, T.IQ1_S, T.IQ1_M, T.IQ4_NL, T.IQ4_XS]


def random_f16(rng, n):
    mag = rng.uniform(-12, 2, size=n)  # log2 magnitudes: includes f16 subnormal-ish small scales
    v = np.sign(rng.uniform(-1, 1, size=n)) * np.exp2(mag)
    return v.astype(np.float16)


def make_blocks(rng, qtype, n_blocks):
    block, size = GGML_QUANT_SIZES[qtype]
    if qtype == T.F32:
        return (rng.standard_normal(n_blocks) * 3).astype(np.float32).view(np.uint8).reshape(n_blocks, 4)
    if qtype == T.F16:
        return random_f16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    if qtype == T.BF16:
        f = (rng.standard_normal(n_blocks) * 3).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(n_blocks, 2)
    b = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in F16_FIELDS.get(qtype, []):
        b[:, off:off + 2] = random_f16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    if qtype == T.MXFP4:
        e = rng.integers(90, 160, size=n_blocks)
        e[:4] = [0, 1, 2, 254]  # the denormal and top ends of the "half" decode
        b[:, 0] = e.astype(np.uint8)
    if qtype == T.IQ1_M:
        # The f16 super-scale lives in the top nibble of the four u16 scale words.
        d = random_f16(rng, n_blocks).view(np.uint16)
        w = b[:, 48:56].copy().view(np.uint16).reshape(n_blocks, 4)
        for k in range(4):
            w[:, k] = (w[:, k] & 0x0FFF) | (((d >> (4 * k)) & 0xF) << 12)
        b[:, 48:56] = w.view(np.uint8).reshape(n_blocks, 8)
    return b


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(20240917)
    for qtype in TYPES:
        block, size = GGML_QUANT_SIZES[qtype]
        n_elems = 1024 if block > 1 else 1024  # 4 super-blocks, 32 small blocks, or 1024 scalars
        n_blocks = n_elems // block
        raw = make_blocks(rng, qtype, n_blocks).reshape(1, -1)
        expected = quants.dequantize(raw, qtype).astype(np.float32).reshape(-1)
        assert expected.size == n_elems
        with open(os.path.join(out, f"dequant_{qtype.name}.bin"), "wb") as f:
            f.write(b"AFQD" + struct.pack("<II", int(qtype), n_elems))
            f.write(raw.tobytes())
            f.write(expected.tobytes())
    for qtype in (T.Q8_0, T.MXFP4):
        n_elems = 32 * 40
        x = (rng.standard_normal(n_elems) * rng.uniform(0.01, 4.0, size=n_elems)).astype(np.float32)
        x[:32] = 0.0  # an all-zero block
        q = quants.quantize(x.reshape(1, -1), qtype).reshape(-1)
        with open(os.path.join(out, f"quant_{qtype.name}.bin"), "wb") as f:
            f.write(b"AFQQ" + struct.pack("<II", int(qtype), n_elems))
            f.write(x.tobytes())
            f.write(q.tobytes())


if __name__ == "__main__":
    main()
