"""DeepSeek-V4 checkpoints in the official Hugging Face layout, for any config size.

What this module owns (importable; used by make_golden.py, check_random.py and the tiny-model
export):

* `V4Config`: the official `config.json` keys (the ones the released DeepSeek-V4-Flash ships),
  with a writer/reader.
* `tensor_specs(cfg)`: every official tensor name with its storage kind and logical shape.
* Quantisers in the official formats and their exact inverses:
    - FP8 E4M3 (RNE, clamped to +-448) with E8M0 block scales over 128x128 tiles
      (`weight_block_size`), scale = 2^ceil(log2(amax/448)) per tile;
    - MXFP4 experts: E2M1 (RNE, +-6) with one E8M0 scale per 32 inputs, packed two codes per
      byte (low nibble = even element) and stored as I8 [out, in/2] + F8_E8M0 [out, in/32].
* A minimal safetensors writer/reader (exact dtype strings F8_E4M3, F8_E8M0, I8, BF16, F32, I64)
  and `save_checkpoint` / `load_checkpoint` (config.json, model.safetensors.index.json, >= 2 shards).
* `official_to_hf(...)`: dequantised official tensors -> transformers `DeepseekV4ForCausalLM`
  state dict (and `hf_to_official` for the other direction), plus `build_hf_model`, which asserts
  that every transformers parameter and persistent buffer receives a value.

All arrays are numpy; logical weights are float32 [out, in] unless stated. Nothing here knows
about the engine; nothing here runs at engine runtime.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from dataclasses import dataclass, field

import numpy as np

# ----------------------------------------------------------------------------- config

@dataclass
class V4Config:
    """Official DeepSeek-V4 `config.json` fields (names exactly as in the released file)."""

    vocab_size: int = 129280
    hidden_size: int = 4096
    num_hidden_layers: int = 43
    num_attention_heads: int = 64
    num_key_value_heads: int = 1
    head_dim: int = 512
    qk_rope_head_dim: int = 64
    q_lora_rank: int = 1024
    o_groups: int = 8
    o_lora_rank: int = 1024
    sliding_window: int = 128
    # One entry per main layer plus one per MTP layer: 0 = sliding only, 4 = CSA (overlapping
    # compressor + indexer), any other value = HCA with that ratio.
    compress_ratios: list = field(default_factory=lambda: [0, 0] + [4, 128] * 20 + [4, 0])
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    rope_scaling: dict = field(default_factory=lambda: {
        "type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
        "beta_fast": 32, "beta_slow": 1})
    max_position_embeddings: int = 1048576
    index_n_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 512
    n_routed_experts: int = 256
    n_shared_experts: int = 1
    num_experts_per_tok: int = 6
    moe_intermediate_size: int = 2048
    num_hash_layers: int = 3
    scoring_func: str = "sqrtsoftplus"
    topk_method: str = "noaux_tc"
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.5
    swiglu_limit: float = 10.0
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    num_nextn_predict_layers: int = 1
    expert_dtype: str = "fp4"          # "fp4" (MXFP4) or "fp8" (V4-Flash-Base)
    weight_block_size: int = 128       # written as quantization_config.weight_block_size [b, b]
    bos_token_id: int = 0
    eos_token_id: int = 1
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    initializer_range: float = 0.02

    # ---- derived helpers
    def layer_ratio(self, layer: int) -> int:
        return int(self.compress_ratios[layer])

    def check(self) -> None:
        """Raise ValueError if the shape constraints of the official format are violated."""
        n_entries = self.num_hidden_layers + self.num_nextn_predict_layers
        if len(self.compress_ratios) != n_entries:
            raise ValueError(f"compress_ratios has {len(self.compress_ratios)} entries, "
                             f"want num_hidden_layers + num_nextn_predict_layers = {n_entries}")
        for i in range(self.num_hidden_layers, n_entries):
            if self.compress_ratios[i] != 0:
                raise ValueError("MTP layers must be sliding-window (compress ratio 0)")
        if self.num_attention_heads % self.o_groups:
            raise ValueError("num_attention_heads must be divisible by o_groups")
        if self.qk_rope_head_dim % 2 or self.qk_rope_head_dim > self.head_dim:
            raise ValueError("qk_rope_head_dim must be even and <= head_dim")
        if self.qk_rope_head_dim > self.index_head_dim:
            raise ValueError("qk_rope_head_dim must be <= index_head_dim")
        if self.num_key_value_heads != 1 or self.n_shared_experts != 1:
            raise ValueError("V4 has exactly one KV head and one shared expert")
        if self.num_experts_per_tok > self.n_routed_experts:
            raise ValueError("num_experts_per_tok > n_routed_experts")
        if self.expert_dtype == "fp4" and (self.moe_intermediate_size % 32 or self.hidden_size % 32):
            raise ValueError("MXFP4 experts need in-dims divisible by 32")

    def to_official_json(self) -> dict:
        d = dataclasses.asdict(self)
        b = d.pop("weight_block_size")
        d["quantization_config"] = {
            "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
            "scale_fmt": "ue8m0", "weight_block_size": [b, b]}
        d["architectures"] = ["DeepseekV4ForCausalLM"]
        d["model_type"] = "deepseek_v4"
        d["torch_dtype"] = "bfloat16"
        d["use_cache"] = True
        return dict(sorted(d.items()))

    @staticmethod
    def from_official_json(d: dict) -> "V4Config":
        names = {f.name for f in dataclasses.fields(V4Config)}
        kw = {k: v for k, v in d.items() if k in names}
        qc = d.get("quantization_config") or {}
        if "weight_block_size" in qc:
            kw["weight_block_size"] = int(qc["weight_block_size"][0])
        return V4Config(**kw)


# ----------------------------------------------------------------------------- tensor catalogue

# Storage kinds: "fp8" (F8_E4M3 weight + F8_E8M0 `.scale` on 128x128 tiles), "fp4" (I8 packed
# E2M1 + F8_E8M0 `.scale` per 32 inputs), "bf16", "f32", "i64".

def _layer_specs(cfg: V4Config, prefix: str, ratio: int, hash_layer: bool) -> list:
    D, H, Dh = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
    hc = cfg.hc_mult
    n_mix = (2 + hc) * hc
    out = [
        (f"{prefix}.hc_attn_fn", "f32", (n_mix, hc * D)),
        (f"{prefix}.hc_attn_base", "f32", (n_mix,)),
        (f"{prefix}.hc_attn_scale", "f32", (3,)),
        (f"{prefix}.hc_ffn_fn", "f32", (n_mix, hc * D)),
        (f"{prefix}.hc_ffn_base", "f32", (n_mix,)),
        (f"{prefix}.hc_ffn_scale", "f32", (3,)),
        (f"{prefix}.attn_norm.weight", "bf16", (D,)),
        (f"{prefix}.ffn_norm.weight", "bf16", (D,)),
        (f"{prefix}.attn.wq_a.weight", "fp8", (cfg.q_lora_rank, D)),
        (f"{prefix}.attn.q_norm.weight", "bf16", (cfg.q_lora_rank,)),
        (f"{prefix}.attn.wq_b.weight", "fp8", (H * Dh, cfg.q_lora_rank)),
        (f"{prefix}.attn.wkv.weight", "fp8", (Dh, D)),
        (f"{prefix}.attn.kv_norm.weight", "bf16", (Dh,)),
        (f"{prefix}.attn.wo_a.weight", "fp8", (cfg.o_groups * cfg.o_lora_rank, H * Dh // cfg.o_groups)),
        (f"{prefix}.attn.wo_b.weight", "fp8", (D, cfg.o_groups * cfg.o_lora_rank)),
        (f"{prefix}.attn.attn_sink", "f32", (H,)),
    ]
    if ratio:
        c = 2 if ratio == 4 else 1
        out += [
            (f"{prefix}.attn.compressor.wkv.weight", "bf16", (c * Dh, D)),
            (f"{prefix}.attn.compressor.wgate.weight", "bf16", (c * Dh, D)),
            (f"{prefix}.attn.compressor.ape", "f32", (ratio, c * Dh)),
            (f"{prefix}.attn.compressor.norm.weight", "bf16", (Dh,)),
        ]
    if ratio == 4:
        Ih, In = cfg.index_head_dim, cfg.index_n_heads
        out += [
            (f"{prefix}.attn.indexer.wq_b.weight", "fp8", (In * Ih, cfg.q_lora_rank)),
            (f"{prefix}.attn.indexer.weights_proj.weight", "bf16", (In, D)),
            (f"{prefix}.attn.indexer.compressor.wkv.weight", "bf16", (2 * Ih, D)),
            (f"{prefix}.attn.indexer.compressor.wgate.weight", "bf16", (2 * Ih, D)),
            (f"{prefix}.attn.indexer.compressor.ape", "f32", (4, 2 * Ih)),
            (f"{prefix}.attn.indexer.compressor.norm.weight", "bf16", (Ih,)),
        ]
    E, I = cfg.n_routed_experts, cfg.moe_intermediate_size
    out.append((f"{prefix}.ffn.gate.weight", "bf16", (E, D)))
    if hash_layer:
        out.append((f"{prefix}.ffn.gate.tid2eid", "i64", (cfg.vocab_size, cfg.num_experts_per_tok)))
    else:
        out.append((f"{prefix}.ffn.gate.bias", "f32", (E,)))
    ek = "fp4" if cfg.expert_dtype == "fp4" else "fp8"
    for e in range(E):
        out += [
            (f"{prefix}.ffn.experts.{e}.w1.weight", ek, (I, D)),
            (f"{prefix}.ffn.experts.{e}.w2.weight", ek, (D, I)),
            (f"{prefix}.ffn.experts.{e}.w3.weight", ek, (I, D)),
        ]
    out += [
        (f"{prefix}.ffn.shared_experts.w1.weight", "fp8", (I, D)),
        (f"{prefix}.ffn.shared_experts.w2.weight", "fp8", (D, I)),
        (f"{prefix}.ffn.shared_experts.w3.weight", "fp8", (I, D)),
    ]
    return out


def tensor_specs(cfg: V4Config) -> list:
    """[(official name, kind, logical shape)] in a stable order: top level, layers, MTP."""
    D, V, hc = cfg.hidden_size, cfg.vocab_size, cfg.hc_mult
    specs = [
        ("embed.weight", "bf16", (V, D)),
        ("head.weight", "bf16", (V, D)),
        ("norm.weight", "bf16", (D,)),
        ("hc_head_fn", "f32", (hc, hc * D)),
        ("hc_head_base", "f32", (hc,)),
        ("hc_head_scale", "f32", (1,)),
    ]
    for L in range(cfg.num_hidden_layers):
        specs += _layer_specs(cfg, f"layers.{L}", cfg.layer_ratio(L), L < cfg.num_hash_layers)
    for m in range(cfg.num_nextn_predict_layers):
        p = f"mtp.{m}"
        specs += _layer_specs(cfg, p, 0, False)
        specs += [
            (f"{p}.e_proj.weight", "fp8", (D, D)),
            (f"{p}.h_proj.weight", "fp8", (D, D)),
            (f"{p}.enorm.weight", "bf16", (D,)),
            (f"{p}.hnorm.weight", "bf16", (D,)),
            (f"{p}.norm.weight", "bf16", (D,)),
            (f"{p}.hc_head_fn", "f32", (hc, hc * D)),
            (f"{p}.hc_head_base", "f32", (hc,)),
            (f"{p}.hc_head_scale", "f32", (1,)),
        ]
    return specs


def scale_name(weight_name: str) -> str:
    assert weight_name.endswith(".weight"), weight_name
    return weight_name[: -len(".weight")] + ".scale"


# ----------------------------------------------------------------------------- number formats

def _e4m3_table() -> np.ndarray:
    """Value of every E4M3FN code 0..255 (bias 7, no inf; 0x7F/0xFF are NaN)."""
    vals = np.zeros(256, dtype=np.float64)
    for code in range(256):
        s = -1.0 if code & 0x80 else 1.0
        e = (code >> 3) & 0xF
        m = code & 0x7
        if e == 0xF and m == 0x7:
            vals[code] = np.nan
        elif e == 0:
            vals[code] = s * (m / 8.0) * 2.0 ** -6
        else:
            vals[code] = s * (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return vals


E4M3_VALUES = _e4m3_table()
E4M3_MAX = 448.0
E2M1_VALUES = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)
E2M1_MAX = 6.0


def _rne_to_grid(x: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Index into the ascending non-negative `grid` nearest to |x|; exact ties go to the even
    index (grid index parity == code mantissa parity for E4M3 and E2M1, i.e. round-half-even)."""
    a = np.abs(x)
    hi = np.searchsorted(grid, a, side="left")          # first grid >= a
    hi = np.clip(hi, 0, len(grid) - 1)
    lo = np.clip(hi - 1, 0, len(grid) - 1)
    d_lo = a - grid[lo]
    d_hi = grid[hi] - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    return np.where(pick_hi, hi, lo)


def e4m3_encode(x: np.ndarray) -> np.ndarray:
    """float -> E4M3FN code (uint8), round-to-nearest-even, saturating at +-448."""
    x = np.clip(np.asarray(x, dtype=np.float64), -E4M3_MAX, E4M3_MAX)
    grid = E4M3_VALUES[:0x7F]                         # codes 0x00..0x7E: 0 .. 448 ascending
    idx = _rne_to_grid(x, grid).astype(np.uint8)
    sign = np.where(np.signbit(x) & (idx != 0), 0x80, 0).astype(np.uint8)
    return idx | sign


def e4m3_decode(code: np.ndarray) -> np.ndarray:
    return E4M3_VALUES[np.asarray(code, dtype=np.uint8)].astype(np.float32)


def e2m1_encode(x: np.ndarray) -> np.ndarray:
    """float -> E2M1 code 0..15 (uint8), round-to-nearest-even, saturating at +-6."""
    x = np.clip(np.asarray(x, dtype=np.float64), -E2M1_MAX, E2M1_MAX)
    idx = _rne_to_grid(x, E2M1_VALUES[:8]).astype(np.uint8)
    sign = np.where(np.signbit(x) & (idx != 0), 8, 0).astype(np.uint8)
    return idx | sign


def e2m1_decode(code: np.ndarray) -> np.ndarray:
    return E2M1_VALUES[np.asarray(code, dtype=np.uint8)].astype(np.float32)


def e8m0_for_amax(amax: np.ndarray, qmax: float) -> np.ndarray:
    """E8M0 byte of the power-of-two scale s = 2^ceil(log2(amax/qmax)), so |w/s| <= qmax.
    All-zero blocks get s = 1 (byte 127)."""
    v = np.asarray(amax, dtype=np.float64) / qmax
    mant, exp = np.frexp(v)                  # v = mant * 2^exp, mant in [0.5, 1)
    e = np.where(mant == 0.5, exp - 1, exp)  # exact powers of two need no rounding up
    e = np.where(v > 0, e, 0)
    return np.clip(e + 127, 0, 254).astype(np.uint8)


def e8m0_decode(byte: np.ndarray) -> np.ndarray:
    """E8M0 byte -> float32 2^(byte-127) (byte 0 is 2^-127, a float32 subnormal)."""
    return np.ldexp(np.float64(1.0), np.asarray(byte, dtype=np.int64) - 127).astype(np.float32)


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 -> nearest bfloat16 (RNE), returned as float32 values."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return (u.astype(np.uint32) << 16).view(np.float32)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    return (bf16_round(x).view(np.uint32) >> 16).astype(np.uint16)


def bf16_from_bits(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


# ----------------------------------------------------------------------------- quantisers

def quantize_fp8_block(w: np.ndarray, block: int = 128) -> tuple:
    """w: float [out, in] -> (E4M3 codes uint8 [out, in], E8M0 bytes uint8 [ceil(out/b), ceil(in/b)]).
    Per b x b tile: s = 2^ceil(log2(amax/448)); codes = e4m3_rne(clamp(w/s, +-448))."""
    w = np.asarray(w, dtype=np.float32)
    out_dim, in_dim = w.shape
    nb_o, nb_i = -(-out_dim // block), -(-in_dim // block)
    pad = np.zeros((nb_o * block, nb_i * block), dtype=np.float32)
    pad[:out_dim, :in_dim] = np.abs(w)
    amax = pad.reshape(nb_o, block, nb_i, block).max(axis=(1, 3))
    scale_b = e8m0_for_amax(amax, E4M3_MAX)
    s = np.repeat(np.repeat(e8m0_decode(scale_b), block, 0), block, 1)[:out_dim, :in_dim]
    codes = e4m3_encode(w.astype(np.float64) / s.astype(np.float64))
    return codes, scale_b


def dequantize_fp8_block(codes: np.ndarray, scale_b: np.ndarray, block: int = 128) -> np.ndarray:
    out_dim, in_dim = codes.shape
    s = np.repeat(np.repeat(e8m0_decode(scale_b), block, 0), block, 1)[:out_dim, :in_dim]
    return (e4m3_decode(codes) * s).astype(np.float32)


def quantize_mxfp4(w: np.ndarray) -> tuple:
    """w: float [out, in] (in % 32 == 0) -> (packed int8 [out, in/2], E8M0 uint8 [out, in/32]).
    Byte k of a row holds element 2k in the low nibble and 2k+1 in the high nibble."""
    w = np.asarray(w, dtype=np.float32)
    out_dim, in_dim = w.shape
    assert in_dim % 32 == 0, "MXFP4 needs the input dim divisible by 32"
    blocks = w.reshape(out_dim, in_dim // 32, 32)
    scale_b = e8m0_for_amax(np.abs(blocks).max(axis=2), E2M1_MAX)
    s = e8m0_decode(scale_b)[:, :, None].astype(np.float64)
    codes = e2m1_encode(blocks.astype(np.float64) / s).reshape(out_dim, in_dim)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return packed.view(np.int8), scale_b


def dequantize_mxfp4(packed: np.ndarray, scale_b: np.ndarray) -> np.ndarray:
    p = np.asarray(packed).view(np.uint8)
    out_dim = p.shape[0]
    codes = np.empty((out_dim, p.shape[1] * 2), dtype=np.uint8)
    codes[:, 0::2] = p & 0xF
    codes[:, 1::2] = p >> 4
    vals = e2m1_decode(codes).reshape(out_dim, -1, 32) * e8m0_decode(scale_b)[:, :, None]
    return vals.reshape(out_dim, -1).astype(np.float32)


# ----------------------------------------------------------------------------- safetensors

_ST_DTYPES = {  # safetensors dtype string -> (numpy storage dtype, bytes per element)
    "F32": (np.float32, 4), "BF16": (np.uint16, 2), "I64": (np.int64, 8), "I32": (np.int32, 4),
    "I8": (np.int8, 1), "U8": (np.uint8, 1), "F8_E4M3": (np.uint8, 1), "F8_E8M0": (np.uint8, 1),
}


def write_safetensors(path: str, tensors: dict, metadata: dict | None = None) -> None:
    """tensors: name -> (dtype string, numpy array holding the raw storage values).
    Data is laid out contiguously in order of decreasing element size (keeps every tensor
    naturally aligned; the header is padded to a multiple of 8 bytes)."""
    order = sorted(tensors, key=lambda n: (-_ST_DTYPES[tensors[n][0]][1], n))
    header, blobs, off = {}, [], 0
    for name in order:
        dt, arr = tensors[name]
        np_dt, _ = _ST_DTYPES[dt]
        raw = np.ascontiguousarray(arr, dtype=np.dtype(np_dt).newbyteorder("<")).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)


def read_safetensors(path: str) -> dict:
    """-> name -> (dtype string, numpy array of raw storage values)."""
    with open(path, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen])
    base = 8 + hlen
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        np_dt, _ = _ST_DTYPES[info["dtype"]]
        b, e = info["data_offsets"]
        arr = np.frombuffer(data[base + b: base + e], dtype=np.dtype(np_dt).newbyteorder("<"))
        out[name] = (info["dtype"], arr.reshape(info["shape"]).astype(np_dt))
    return out


# ----------------------------------------------------------------------------- checkpoint I/O

def quantize_official(cfg: V4Config, weights: dict) -> dict:
    """weights: official name -> float32 logical array (int array for tid2eid), covering every
    entry of tensor_specs(cfg). Returns the stored tensors: name -> (dtype string, raw array),
    including the `.scale` companions. Raises KeyError/ValueError on a missing or misshapen
    tensor."""
    out = {}
    b = cfg.weight_block_size
    for name, kind, shape in tensor_specs(cfg):
        if name not in weights:
            raise KeyError(f"missing tensor {name}")
        w = np.asarray(weights[name])
        if tuple(w.shape) != tuple(shape):
            raise ValueError(f"{name}: shape {w.shape}, want {shape}")
        if kind == "fp8":
            q, s = quantize_fp8_block(w, b)
            out[name] = ("F8_E4M3", q)
            out[scale_name(name)] = ("F8_E8M0", s)
        elif kind == "fp4":
            q, s = quantize_mxfp4(w)
            out[name] = ("I8", q)
            out[scale_name(name)] = ("F8_E8M0", s)
        elif kind == "bf16":
            out[name] = ("BF16", bf16_bits(w.astype(np.float32)))
        elif kind == "f32":
            out[name] = ("F32", w.astype(np.float32))
        elif kind == "i64":
            out[name] = ("I64", w.astype(np.int64))
        else:
            raise AssertionError(kind)
    return out


def dequantize_official(cfg: V4Config, stored: dict) -> dict:
    """Exact inverse of quantize_official: stored tensors -> official name -> float32 logical
    array (int64 for tid2eid). Validates that every expected tensor is present with the
    expected dtype and shape."""
    out = {}
    b = cfg.weight_block_size
    for name, kind, shape in tensor_specs(cfg):
        if name not in stored:
            raise KeyError(f"missing tensor {name}")
        dt, arr = stored[name]
        want = {"fp8": "F8_E4M3", "fp4": "I8", "bf16": "BF16", "f32": "F32", "i64": "I64"}[kind]
        if dt != want:
            raise ValueError(f"{name}: dtype {dt}, want {want}")
        if kind == "fp8":
            sdt, s = stored[scale_name(name)]
            assert sdt == "F8_E8M0"
            assert s.shape == (-(-shape[0] // b), -(-shape[1] // b)), (name, s.shape)
            out[name] = dequantize_fp8_block(arr, s, b)
        elif kind == "fp4":
            sdt, s = stored[scale_name(name)]
            assert sdt == "F8_E8M0" and s.shape == (shape[0], shape[1] // 32), (name, s.shape)
            assert arr.shape == (shape[0], shape[1] // 2), (name, arr.shape)
            out[name] = dequantize_mxfp4(arr, s)
        elif kind == "bf16":
            out[name] = bf16_from_bits(arr)
        elif kind == "f32":
            out[name] = arr.astype(np.float32)
        else:
            out[name] = arr.astype(np.int64)
        if kind not in ("fp4",) and tuple(out[name].shape) != tuple(shape):
            raise ValueError(f"{name}: shape {out[name].shape}, want {shape}")
    return out


def _shard_of(name: str, cfg: V4Config, n_shards: int) -> int:
    """Top-level tensors go to shard 0, layer L to a shard by layer index, MTP to the last."""
    if name.startswith("layers."):
        L = int(name.split(".")[1])
        return min(n_shards - 1, L * n_shards // max(1, cfg.num_hidden_layers))
    if name.startswith("mtp."):
        return n_shards - 1
    return 0


def save_checkpoint(out_dir: str, cfg: V4Config, stored: dict, n_shards: int = 2,
                    extra_config: dict | None = None, tokenizer: bool = False) -> None:
    """Write config.json, model.safetensors.index.json and `n_shards` (>= 2) shards named
    model-0000i-of-0000N.safetensors (the official naming); with `tokenizer`, also a placeholder
    tokenizer.json of exactly vocab_size ids (see tokenizer_json)."""
    cfg.check()
    assert n_shards >= 2
    os.makedirs(out_dir, exist_ok=True)
    conf = cfg.to_official_json()
    if extra_config:
        conf.update(extra_config)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(conf, f, indent=2)
        f.write("\n")
    shards = [dict() for _ in range(n_shards)]
    for name, t in stored.items():
        base = name[: -len(".scale")] + ".weight" if name.endswith(".scale") else name
        shards[_shard_of(base, cfg, n_shards)][name] = t
    weight_map, total = {}, 0
    for i, sh in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors"
        write_safetensors(os.path.join(out_dir, fname), sh, {"format": "pt"})
        for name, (dt, arr) in sh.items():
            weight_map[name] = fname
            total += arr.size * _ST_DTYPES[dt][1]
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")
    if tokenizer:
        write_tokenizer(out_dir, cfg.vocab_size)


def load_checkpoint(ckpt_dir: str) -> tuple:
    """-> (V4Config, stored tensors name -> (dtype string, raw array))."""
    with open(os.path.join(ckpt_dir, "config.json")) as f:
        cfg = V4Config.from_official_json(json.load(f))
    with open(os.path.join(ckpt_dir, "model.safetensors.index.json")) as f:
        index = json.load(f)
    stored = {}
    for fname in sorted(set(index["weight_map"].values())):
        stored.update(read_safetensors(os.path.join(ckpt_dir, fname)))
    missing = set(index["weight_map"]) - set(stored)
    if missing:
        raise KeyError(f"index names tensors missing from shards: {sorted(missing)[:5]}")
    return cfg, stored


# ----------------------------------------------------------------------------- transformers mapping

_LAYER_RENAMES = [  # (official suffix after "layers.L.", transformers suffix after "model.layers.L.")
    ("hc_attn_fn", "attn_hc.fn"), ("hc_attn_base", "attn_hc.base"), ("hc_attn_scale", "attn_hc.scale"),
    ("hc_ffn_fn", "ffn_hc.fn"), ("hc_ffn_base", "ffn_hc.base"), ("hc_ffn_scale", "ffn_hc.scale"),
    ("attn_norm.weight", "input_layernorm.weight"), ("ffn_norm.weight", "post_attention_layernorm.weight"),
    ("attn.wq_a.weight", "self_attn.q_a_proj.weight"), ("attn.q_norm.weight", "self_attn.q_a_norm.weight"),
    ("attn.wq_b.weight", "self_attn.q_b_proj.weight"), ("attn.wkv.weight", "self_attn.kv_proj.weight"),
    ("attn.kv_norm.weight", "self_attn.kv_norm.weight"), ("attn.wo_a.weight", "self_attn.o_a_proj.weight"),
    ("attn.wo_b.weight", "self_attn.o_b_proj.weight"), ("attn.attn_sink", "self_attn.sinks"),
    ("attn.compressor.wkv.weight", "self_attn.compressor.kv_proj.weight"),
    ("attn.compressor.wgate.weight", "self_attn.compressor.gate_proj.weight"),
    ("attn.compressor.ape", "self_attn.compressor.position_bias"),
    ("attn.compressor.norm.weight", "self_attn.compressor.kv_norm.weight"),
    ("attn.indexer.wq_b.weight", "self_attn.compressor.indexer.q_b_proj.weight"),
    ("attn.indexer.weights_proj.weight", "self_attn.compressor.indexer.scorer.weights_proj.weight"),
    ("attn.indexer.compressor.wkv.weight", "self_attn.compressor.indexer.kv_proj.weight"),
    ("attn.indexer.compressor.wgate.weight", "self_attn.compressor.indexer.gate_proj.weight"),
    ("attn.indexer.compressor.ape", "self_attn.compressor.indexer.position_bias"),
    ("attn.indexer.compressor.norm.weight", "self_attn.compressor.indexer.kv_norm.weight"),
    ("ffn.gate.weight", "mlp.gate.weight"), ("ffn.gate.bias", "mlp.gate.e_score_correction_bias"),
    ("ffn.gate.tid2eid", "mlp.gate.tid2eid"),
    ("ffn.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"),
    ("ffn.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"),
    ("ffn.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"),
]
_TOP_RENAMES = [
    ("embed.weight", "model.embed_tokens.weight"), ("head.weight", "lm_head.weight"),
    ("norm.weight", "model.norm.weight"), ("hc_head_fn", "model.hc_head.hc_fn"),
    ("hc_head_base", "model.hc_head.hc_base"), ("hc_head_scale", "model.hc_head.hc_scale"),
]


def hf_name(official: str) -> str | None:
    """Official tensor name -> transformers parameter name. Routed-expert weights map to the
    merged `mlp.experts.gate_up_proj` / `down_proj` (see official_to_hf); MTP tensors -> None
    (transformers does not implement the MTP block)."""
    for a, b in _TOP_RENAMES:
        if official == a:
            return b
    if official.startswith("mtp."):
        return None
    parts = official.split(".", 2)
    if parts[0] != "layers":
        raise KeyError(f"unknown tensor {official}")
    L, rest = parts[1], parts[2]
    if rest.startswith("ffn.experts."):
        w = rest.split(".")[3]
        return f"model.layers.{L}.mlp.experts." + ("down_proj" if w == "w2" else "gate_up_proj")
    for a, b in _LAYER_RENAMES:
        if rest == a:
            return f"model.layers.{L}.{b}"
    raise KeyError(f"no transformers name for {official}")


def official_to_hf(cfg: V4Config, deq: dict) -> dict:
    """Dequantised official tensors -> transformers state dict (torch float32; tid2eid int64).
    gate_up_proj[e] = cat(w1[e], w3[e]) along the output dim ([E, 2I, D]); down_proj [E, D, I]."""
    import torch
    sd = {}
    E = cfg.n_routed_experts
    for name, _, _ in tensor_specs(cfg):
        target = hf_name(name)
        if target is None or ".mlp.experts." in target:
            continue
        sd[target] = torch.from_numpy(np.ascontiguousarray(deq[name]))
    for L in range(cfg.num_hidden_layers):
        p = f"layers.{L}.ffn.experts"
        gu = np.stack([np.concatenate([deq[f"{p}.{e}.w1.weight"], deq[f"{p}.{e}.w3.weight"]], 0) for e in range(E)])
        dn = np.stack([deq[f"{p}.{e}.w2.weight"] for e in range(E)])
        sd[f"model.layers.{L}.mlp.experts.gate_up_proj"] = torch.from_numpy(gu)
        sd[f"model.layers.{L}.mlp.experts.down_proj"] = torch.from_numpy(dn)
    return sd


def hf_to_official(cfg: V4Config, sd: dict) -> dict:
    """transformers state dict -> official name -> float32 numpy (the inverse of official_to_hf,
    for exporting a model trained with the transformers modules). MTP tensors are not produced."""
    out = {}
    I = cfg.moe_intermediate_size
    for name, _, _ in tensor_specs(cfg):
        target = hf_name(name)
        if target is None:
            continue
        t = sd[target].detach().cpu()
        if ".mlp.experts." in target:
            e, w = int(name.split(".")[4]), name.split(".")[5]
            t = t[e]
            if w == "w1":
                t = t[:I]
            elif w == "w3":
                t = t[I:]
        out[name] = t.numpy() if name.endswith("tid2eid") else t.float().numpy()
    return out


def hf_config(cfg: V4Config):
    """transformers DeepseekV4Config equivalent to the official config. Built from explicit
    `layer_types` / `compress_rates` so that HCA ratios other than 128 work (transformers' own
    legacy `compress_ratios` parser only knows 0/4/128)."""
    from transformers import DeepseekV4Config
    n = cfg.num_hidden_layers
    ratios = [cfg.layer_ratio(i) for i in range(n)]
    hca = sorted({r for r in ratios if r not in (0, 4)})
    if len(hca) > 1:
        raise ValueError(f"transformers needs one HCA ratio per model, got {hca}")
    types = ["sliding_attention" if r == 0 else "compressed_sparse_attention" if r == 4
             else "heavily_compressed_attention" for r in ratios]
    prf = cfg.qk_rope_head_dim / cfg.head_dim
    rs = cfg.rope_scaling or {}
    compress = {"rope_type": "default", "rope_theta": cfg.compress_rope_theta, "partial_rotary_factor": prf}
    if rs.get("type", rs.get("rope_type")) == "yarn":
        compress.update(rope_type="yarn", factor=float(rs["factor"]),
                        original_max_position_embeddings=int(rs["original_max_position_embeddings"]),
                        beta_fast=float(rs.get("beta_fast", 32)), beta_slow=float(rs.get("beta_slow", 1)),
                        attention_factor=1.0)
    hc = DeepseekV4Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, moe_intermediate_size=cfg.moe_intermediate_size,
        num_hidden_layers=n, num_attention_heads=cfg.num_attention_heads, num_key_value_heads=1,
        head_dim=cfg.head_dim, q_lora_rank=cfg.q_lora_rank, num_experts_per_tok=cfg.num_experts_per_tok,
        n_routed_experts=cfg.n_routed_experts, n_shared_experts=cfg.n_shared_experts,
        scoring_func=cfg.scoring_func, norm_topk_prob=cfg.norm_topk_prob,
        routed_scaling_factor=cfg.routed_scaling_factor, max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=cfg.rope_theta, layer_types=types,
        compress_rates={"compressed_sparse_attention": 4,
                        "heavily_compressed_attention": hca[0] if hca else 128},
        compress_rope_theta=cfg.compress_rope_theta, hc_mult=cfg.hc_mult, hc_sinkhorn_iters=cfg.hc_sinkhorn_iters,
        hc_eps=cfg.hc_eps,
        mlp_layer_types=["hash_moe" if i < cfg.num_hash_layers else "moe" for i in range(n)],
        swiglu_limit=cfg.swiglu_limit, sliding_window=cfg.sliding_window, o_groups=cfg.o_groups,
        o_lora_rank=cfg.o_lora_rank, index_n_heads=cfg.index_n_heads, index_head_dim=cfg.index_head_dim,
        index_topk=cfg.index_topk, num_nextn_predict_layers=cfg.num_nextn_predict_layers,
        rms_norm_eps=cfg.rms_norm_eps, partial_rotary_factor=prf,
        rope_parameters={"main": {"rope_type": "default", "rope_theta": cfg.rope_theta,
                                  "partial_rotary_factor": prf},
                         "compress": compress},
        bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id, tie_word_embeddings=False,
        hidden_act=cfg.hidden_act,
    )
    return hc


def build_hf_model(cfg: V4Config, deq: dict, dtype=None):
    """Instantiate DeepseekV4ForCausalLM (eager attention, eager experts) and load the
    dequantised weights. Asserts that every parameter and persistent buffer gets a value and
    that no value is left unused (MTP tensors excepted: transformers has no MTP block)."""
    import torch
    from transformers import DeepseekV4ForCausalLM
    dtype = dtype or torch.float32
    hcfg = hf_config(cfg)
    hcfg._attn_implementation = "eager"
    try:
        hcfg._experts_implementation = "eager"
    except Exception:  # older transformers: attribute absent, eager is the only path
        pass
    torch.manual_seed(0)
    with torch.device("meta"):
        model = DeepseekV4ForCausalLM(hcfg)
    sd = official_to_hf(cfg, deq)
    want = set(model.state_dict().keys())
    have = set(sd.keys())
    if want - have:
        raise AssertionError(f"transformers parameters without a value: {sorted(want - have)[:10]}")
    if have - want:
        raise AssertionError(f"values with no transformers parameter: {sorted(have - want)[:10]}")
    sd = {k: (v if not v.is_floating_point() else v.to(dtype)) for k, v in sd.items()}
    model.load_state_dict(sd, strict=True, assign=True)
    model = model.to(dtype)
    # RoPE inverse frequencies are non-persistent buffers: rebuild them on a real device.
    for mod in model.modules():
        if type(mod).__name__ == "DeepseekV4RotaryEmbedding":
            for lt in mod.layer_types:
                init_fn = mod.compute_default_rope_parameters
                if mod.rope_type[lt] != "default":
                    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
                    init_fn = ROPE_INIT_FUNCTIONS[mod.rope_type[lt]]
                inv, scaling = init_fn(mod.config, torch.device("cpu"), layer_type=lt)
                setattr(mod, f"{lt}_inv_freq", inv)
                setattr(mod, f"{lt}_original_inv_freq", inv.clone())
                setattr(mod, f"{lt}_attention_scaling", scaling)
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t.is_meta:
            raise AssertionError(f"{name} is still on the meta device")
    model.eval()
    return model


def transformers_renaming_check(cfg: V4Config) -> None:
    """Cross-check hf_name() against transformers' own official-name conversion table
    (conversion_mapping.py, "deepseek_v4"). Raises AssertionError on any disagreement."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    from transformers.core_model_loading import WeightConverter, rename_source_key
    transforms = get_checkpoint_conversion_mapping("deepseek_v4")
    renamings = [t for t in transforms if not isinstance(t, WeightConverter)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    bad = []
    for name, _, _ in tensor_specs(cfg):
        mine = hf_name(name)
        if mine is None:
            continue
        theirs, _ = rename_source_key(name, renamings, converters)
        if not theirs.startswith("lm_head"):
            theirs = "model." + theirs
        if theirs != mine:
            bad.append((name, mine, theirs))
    if bad:
        raise AssertionError(f"renaming disagrees with transformers: {bad[:5]}")


# ----------------------------------------------------------------------------- tokenizer

# V4's pre-tokenizer (v4-formats-and-api.md §2): three ordered Split passes, then ByteLevel.
_V4_SPLITS = [
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]
V4_BOS, V4_EOS, V4_PAD = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"


def _byte_to_unicode() -> dict:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(keep, chars)}


def tokenizer_json(vocab_size: int) -> dict:
    """A byte-level BPE tokenizer.json in V4's shape with exactly `vocab_size` ids: BOS/EOS/pad at
    0/1/2 (as in V4), the 256 byte symbols at 3..258, then merges of letter pairs (deterministic)
    filling the rest. For tiny random checkpoints, which need a tokenizer only so that a runtime
    that insists on one can start; the ids carry no meaning."""
    assert vocab_size >= 259, "need room for 3 specials and 256 byte symbols"
    b2u = _byte_to_unicode()
    vocab = {V4_BOS: 0, V4_EOS: 1, V4_PAD: 2}
    for b in range(256):
        vocab[b2u[b]] = 3 + b
    merges = []
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    printable = [b2u[c] for c in range(33, 127)]
    pairs = ([(a, b) for a in letters for b in letters] + [(b2u[32], a) for a in letters]
             + [(a, b) for a in printable for b in printable])
    for a, b in pairs:
        if len(vocab) >= vocab_size:
            break
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
            merges.append([a, b])
    assert len(vocab) == vocab_size, "not enough merge candidates for this vocab size"
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for t, i in ((V4_BOS, 0), (V4_EOS, 1), (V4_PAD, 2))]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": []},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False} for r in _V4_SPLITS
        ] + [{"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": merges},
    }


def write_tokenizer(out_dir: str, vocab_size: int) -> None:
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_json(vocab_size), f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
