"""Self-tests of v4ckpt.py against independent implementations (ml_dtypes, torch, the
`safetensors` library, transformers' own renaming table). Run:  $PYTHON tools/oracle/test_v4ckpt.py
Needs torch, transformers, safetensors, ml_dtypes; not part of CI (CI has no Python stack)."""

import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import v4ckpt as vc  # noqa: E402


def tiny_cfg(**kw):
    base = dict(vocab_size=300, hidden_size=128, num_hidden_layers=4, num_attention_heads=4, head_dim=128,
                qk_rope_head_dim=64, q_lora_rank=128, o_groups=2, o_lora_rank=64, sliding_window=32,
                compress_ratios=[0, 4, 16, 4, 0], index_n_heads=4, index_head_dim=64, index_topk=8,
                n_routed_experts=5, num_experts_per_tok=2, moe_intermediate_size=96, num_hash_layers=2,
                num_nextn_predict_layers=1)
    base.update(kw)
    return vc.V4Config(**base)


def test_e4m3():
    import ml_dtypes
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.normal(0, 50, 20000), rng.normal(0, 1e-2, 5000), rng.uniform(-500, 500, 5000),
                        vc.E4M3_VALUES[:0x7F], -vc.E4M3_VALUES[:0x7F],
                        (vc.E4M3_VALUES[1:0x7F] + vc.E4M3_VALUES[:0x7E]) / 2])  # exact ties
    x = x.astype(np.float32)
    ours = vc.e4m3_decode(vc.e4m3_encode(x))
    ref = np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert np.array_equal(ours, ref), np.flatnonzero(ours != ref)[:10]
    # the codes themselves, not just the values (ignoring the sign of zero)
    codes = vc.e4m3_encode(x)
    ref_codes = np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    nz = ref != 0
    assert np.array_equal(codes[nz], ref_codes[nz])


def test_e2m1():
    import ml_dtypes
    grid = np.array([0, .5, 1, 1.5, 2, 3, 4, 6])
    ties = (grid[1:] + grid[:-1]) / 2
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.uniform(-7, 7, 20000), ties, -ties, grid, -grid]).astype(np.float32)
    ours = vc.e2m1_decode(vc.e2m1_encode(x))
    ref = np.clip(x, -6, 6).astype(ml_dtypes.float4_e2m1fn).astype(np.float32)
    assert np.array_equal(ours, ref)
    # documented tie cases: 1.75 -> 2, 0.25 -> 0, 2.5 -> 2, 5 -> 4, -1.75 -> -2
    t = vc.e2m1_decode(vc.e2m1_encode(np.array([1.75, 0.25, 2.5, 5.0, -1.75, 0.75])))
    assert list(t) == [2.0, 0.0, 2.0, 4.0, -2.0, 1.0], t


def test_e8m0_and_blocks():
    rng = np.random.default_rng(3)
    w = (rng.normal(0, 1, (300, 260)) * np.exp(rng.normal(0, 2, (300, 1)))).astype(np.float32)
    q, s = vc.quantize_fp8_block(w, 128)
    assert q.shape == w.shape and s.shape == (3, 3)
    d = vc.dequantize_fp8_block(q, s, 128)
    for bo in range(3):
        for bi in range(3):
            blk = w[bo * 128:(bo + 1) * 128, bi * 128:(bi + 1) * 128]
            sc = 2.0 ** (int(s[bo, bi]) - 127)
            amax = np.abs(blk).max()
            assert amax / sc <= 448 and amax / sc > 224, (amax, sc)  # tightest power of two
    rel = np.abs(d - w) / (np.abs(w) + 1e-30)
    assert np.median(rel) < 0.04
    # exact inverse: re-quantising the dequantised tensor is the identity
    q2, s2 = vc.quantize_fp8_block(d, 128)
    assert np.array_equal(vc.dequantize_fp8_block(q2, s2, 128), d)
    # power-of-two amax needs no rounding up
    assert vc.e8m0_for_amax(np.array([448.0, 448.0 * 2, 449.0, 6.0]), 448.0).tolist() == [127, 128, 128, 121]


def test_mxfp4():
    rng = np.random.default_rng(4)
    w = rng.normal(0, 0.1, (70, 96)).astype(np.float32)
    p, s = vc.quantize_mxfp4(w)
    assert p.dtype == np.int8 and p.shape == (70, 48) and s.shape == (70, 3)
    d = vc.dequantize_mxfp4(p, s)
    # independent decode: nibble order and scale
    u = p.view(np.uint8)
    r, k = 5, 7
    lo, hi = u[r, k] & 15, u[r, k] >> 4
    sc = 2.0 ** (int(s[r, (2 * k) // 32]) - 127)
    assert d[r, 2 * k] == vc.E2M1_VALUES[lo] * sc and d[r, 2 * k + 1] == vc.E2M1_VALUES[hi] * sc
    blocks = np.abs(w.reshape(70, 3, 32)).max(2)
    scale = 2.0 ** (s.astype(np.int64) - 127)
    assert np.all(blocks / scale <= 6) and np.all(blocks / scale > 3)
    p2, s2 = vc.quantize_mxfp4(d)
    assert np.array_equal(vc.dequantize_mxfp4(p2, s2), d)


def test_bf16():
    import ml_dtypes
    rng = np.random.default_rng(5)
    x = rng.normal(0, 3, 10000).astype(np.float32)
    assert np.array_equal(vc.bf16_round(x), x.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_checkpoint_roundtrip_and_safetensors_lib():
    import torch
    from safetensors import safe_open
    cfg = tiny_cfg()
    rng = np.random.default_rng(6)
    weights = {}
    for name, kind, shape in vc.tensor_specs(cfg):
        if kind == "i64":
            weights[name] = np.stack([rng.permutation(cfg.n_routed_experts)[:cfg.num_experts_per_tok]
                                      for _ in range(shape[0])])
        else:
            weights[name] = rng.normal(0, 0.1, shape).astype(np.float32)
    stored = vc.quantize_official(cfg, weights)
    with tempfile.TemporaryDirectory() as d:
        vc.save_checkpoint(d, cfg, stored, n_shards=3)
        cfg2, stored2 = vc.load_checkpoint(d)
        assert cfg2 == cfg
        assert set(stored2) == set(stored)
        deq = vc.dequantize_official(cfg2, stored2)
        # the official safetensors library reads our shards with the right torch dtypes
        name = "layers.1.attn.wq_a.weight"
        import json
        fname = json.load(open(os.path.join(d, "model.safetensors.index.json")))["weight_map"][name]
        with safe_open(os.path.join(d, fname), "pt") as f:
            w = f.get_tensor(name)
            s = f.get_tensor(vc.scale_name(name))
            assert w.dtype == torch.float8_e4m3fn and s.dtype == torch.float8_e8m0fnu
            s_exp = s.float().repeat_interleave(128, 0).repeat_interleave(128, 1)[:w.shape[0], :w.shape[1]]
            assert torch.equal(w.float() * s_exp, torch.from_numpy(deq[name]))
        e = "layers.0.ffn.experts.3.w2.weight"
        fname = json.load(open(os.path.join(d, "model.safetensors.index.json")))["weight_map"][e]
        with safe_open(os.path.join(d, fname), "pt") as f:
            assert f.get_tensor(e).dtype == torch.int8
            assert f.get_tensor("layers.0.ffn.gate.tid2eid").dtype == torch.int64
            assert f.get_tensor("layers.0.attn_norm.weight").dtype == torch.bfloat16
        # quantising the dequantised values is lossless (codes may differ when a tile's amax
        # rounded down to a power of two, the values may not)
        again = vc.dequantize_official(cfg, vc.quantize_official(cfg, deq))
        for k in deq:
            assert np.array_equal(again[k], deq[k]), k


def test_transformers_mapping_and_rope():
    import torch
    cfg = tiny_cfg()
    vc.transformers_renaming_check(cfg)
    rng = np.random.default_rng(7)
    weights = {}
    for name, kind, shape in vc.tensor_specs(cfg):
        weights[name] = (np.stack([rng.permutation(cfg.n_routed_experts)[:2] for _ in range(shape[0])])
                         if kind == "i64" else rng.normal(0, 0.05, shape).astype(np.float32))
    deq = vc.dequantize_official(cfg, vc.quantize_official(cfg, weights))
    model = vc.build_hf_model(cfg, deq)
    sd = model.state_dict()
    assert torch.equal(sd["model.layers.2.mlp.experts.gate_up_proj"][3, :96],
                       torch.from_numpy(deq["layers.2.ffn.experts.3.w1.weight"]))
    assert torch.equal(sd["model.layers.2.mlp.experts.gate_up_proj"][3, 96:],
                       torch.from_numpy(deq["layers.2.ffn.experts.3.w3.weight"]))
    back = vc.hf_to_official(cfg, sd)
    for k, v in back.items():
        assert np.array_equal(v, deq[k]), k
    # YaRN sanity values of v4-model-math.md §3.2 (theta 160000, rope dim 64, factor 16)
    rot = model.model.rotary_emb
    f = rot.compress_inv_freq.numpy()
    want = {0: 1.0, 8: 5.0000001e-2, 15: 3.6355385e-3, 16: 2.2656249e-3, 20: 2.9697779e-4,
            24: 1.9531251e-5, 25: 5.3723124e-6, 31: 5.6805294e-7}
    for i, v in want.items():
        assert abs(f[i] - v) <= 2e-6 * v, (i, f[i], v)
    assert rot.compress_attention_scaling == 1.0
    m = rot.main_inv_freq.numpy()
    assert np.allclose(m, 10000.0 ** (-np.arange(32) / 32), rtol=1e-6)
    # the same config through transformers' own legacy keys (ratios 0/4/128 only) agrees
    from transformers import DeepseekV4Config
    cfg128 = tiny_cfg(compress_ratios=[0, 4, 128, 4, 0])
    legacy = DeepseekV4Config(**{k: v for k, v in cfg128.to_official_json().items()
                                 if k not in ("quantization_config", "expert_dtype", "torch_dtype")})
    mine = vc.hf_config(cfg128)
    for key in ("layer_types", "mlp_layer_types", "compress_rates", "partial_rotary_factor", "qk_rope_head_dim"):
        assert getattr(legacy, key) == getattr(mine, key), (key, getattr(legacy, key), getattr(mine, key))
    lc = legacy.rope_parameters["compress"]
    for key in ("rope_type", "rope_theta", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
                "attention_factor"):
        assert float(lc[key]) == float(mine.rope_parameters["compress"][key]) if key != "rope_type" else \
            lc[key] == mine.rope_parameters["compress"][key], key
    # a forward pass runs and is finite
    ids = torch.from_numpy(rng.integers(0, cfg.vocab_size, (1, 70)))
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=False).logits
    assert out.shape == (1, 70, cfg.vocab_size) and torch.isfinite(out).all()


def test_placeholder_tokenizer():
    from tokenizers import Tokenizer
    for V in (300, 448, 1024):
        with tempfile.TemporaryDirectory() as d:
            vc.write_tokenizer(d, V)
            tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
            assert tok.get_vocab_size() == V
            assert tok.token_to_id(vc.V4_BOS) == 0 and tok.token_to_id(vc.V4_EOS) == 1
            ids = tok.encode("the test 123 ✓").ids
            assert max(ids) < V and tok.decode(ids) == "the test 123 ✓"


if __name__ == "__main__":
    tests = [v for k, v in sorted(globals().items()) if k.startswith("test_")]
    for t in tests:
        t()
        print("ok", t.__name__)
    print(f"{len(tests)} tests passed")
