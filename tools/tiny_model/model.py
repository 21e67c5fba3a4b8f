"""The tiny DeepSeek-V4 model: transformers' DeepseekV4ForCausalLM plus our MTP block.

Architecture (all sizes from `tiny_config()`): every V4-Flash feature at small size — sliding,
CSA (with lightning indexer) and HCA layers, hash-routed first layers (tid2eid), mHC with 4
streams, 32 routed experts top-4 plus a shared expert, per-head sinks, grouped low-rank output
projection, YaRN on compressed layers, and one MTP block (v4-model-math.md §8.1).

Training-only patches (they do not change the forward math):
  * the routed experts run densely over all experts with the routing weights as a mask
    (identical result to the per-expert loop, far fewer kernel launches on a GPU);
  * the indexer sees detached inputs and its pre-top-k scores are kept, so it can be trained
    with a KL loss against the main attention (as DeepSeek trains its lightning indexer);
  * CSA attention probabilities are kept for that loss.
"""
import torch
import torch.nn.functional as F
from torch import nn
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as M

import quant

# ---------------------------------------------------------------------------------------------
# Configuration


def tiny_config(vocab_size=8192):
    """The tiny V4 geometry.  Dims obey v4-model-math.md §9.3: head_dim-rope divisible by 64,
    every FP8 input dim divisible by 128, index_head_dim a power of two, heads % o_groups == 0."""
    return dict(
        vocab_size=vocab_size,
        hidden_size=256,
        num_hidden_layers=5,
        compress_ratios=[0, 0, 4, 128, 4, 0],      # 5 layers + the MTP block (last entry)
        num_hash_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=128,
        qk_rope_head_dim=64,
        q_lora_rank=128,
        o_groups=2,
        o_lora_rank=128,
        sliding_window=128,
        index_n_heads=4,
        index_head_dim=128,
        index_topk=64,
        n_routed_experts=32,
        num_experts_per_tok=4,
        n_shared_experts=1,
        moe_intermediate_size=128,
        scoring_func="sqrtsoftplus",
        norm_topk_prob=True,
        routed_scaling_factor=1.5,
        swiglu_limit=10.0,
        hc_mult=4,
        hc_sinkhorn_iters=20,
        hc_eps=1e-6,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        compress_rope_theta=160000.0,
        rope_scaling={"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536,
                      "beta_fast": 32, "beta_slow": 1},
        max_position_embeddings=65536,
        num_nextn_predict_layers=1,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,
    )


def hf_config(cfg):
    """transformers config from the official-key dict (the HF class folds the legacy keys)."""
    c = dict(cfg)
    c["rope_parameters"] = dict(c.pop("rope_scaling"), rope_theta=c["compress_rope_theta"])
    c["rope_parameters"]["rope_type"] = c["rope_parameters"].pop("type")
    c["compress_ratios"] = c["compress_ratios"][:c["num_hidden_layers"]]
    hc = DeepseekV4Config(**c)
    hc._attn_implementation = "eager"
    return hc


def mtp_hf_config(cfg):
    """Config for the MTP block's single decoder layer: a sliding layer with a biased gate."""
    c = dict(cfg, num_hidden_layers=1, compress_ratios=[0], num_hash_layers=0)
    return hf_config(c)


def make_tid2eid(vocab, n_experts, k, seed):
    """Frozen token -> k distinct experts table, balanced: each expert gets vocab*k/n rows."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.stack([torch.randperm(n_experts, generator=g)[:k] for _ in range(vocab)])
    return rows.long()


# ---------------------------------------------------------------------------------------------
# MTP block (ours; v4-model-math.md §8.1)


class MTPBlock(nn.Module):
    """Predicts token t+2 from the main model's hidden streams at t and the embedding of t+1.

    h [B, T, hc, D] main-model streams before its hc_head; ids [B, T] the next tokens.
    e = enorm(embed(ids)); x = e_proj(e) (broadcast to streams) + h_proj(hnorm(h));
    x = one sliding decoder layer (mHC, attention, biased-gate MoE); y = norm(hc_head(x))."""

    def __init__(self, cfg):
        super().__init__()
        hc = mtp_hf_config(cfg)
        d = cfg["hidden_size"]
        self.e_proj = nn.Linear(d, d, bias=False)
        self.h_proj = nn.Linear(d, d, bias=False)
        self.enorm = M.DeepseekV4RMSNorm(d, eps=cfg["rms_norm_eps"])
        self.hnorm = M.DeepseekV4RMSNorm(d, eps=cfg["rms_norm_eps"])
        self.layer = M.DeepseekV4DecoderLayer(hc, 0)
        self.hc_head = M.DeepseekV4HyperHead(hc)
        self.norm = M.DeepseekV4RMSNorm(d, eps=cfg["rms_norm_eps"])
        self.rotary = M.DeepseekV4RotaryEmbedding(hc)
        self.window = cfg["sliding_window"]
        std = 0.02
        for lin in (self.e_proj, self.h_proj):
            nn.init.normal_(lin.weight, std=std)
        for mod in self.layer.modules():
            _init_module(mod, std)
        nn.init.normal_(self.hc_head.hc_fn, std=std)
        nn.init.zeros_(self.hc_head.hc_base)
        nn.init.ones_(self.hc_head.hc_scale)

    def forward(self, h, ids, embed):
        b, t = ids.shape
        e = self.enorm(embed(ids))
        x = self.e_proj(e).unsqueeze(2) + self.h_proj(self.hnorm(h))
        pos = torch.arange(t, device=ids.device).unsqueeze(0)
        pe = {"main": self.rotary(x, pos, layer_type="main")}
        x = self.layer(x, position_embeddings=pe, position_ids=pos, attention_mask=window_mask(t, self.window, x),
                       input_ids=ids)
        return self.norm(self.hc_head(x))


def window_mask(t, window, like):
    """Additive [1, 1, t, t] mask: query p sees keys max(0, p-window+1) .. p."""
    i = torch.arange(t, device=like.device)
    ok = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window)
    return torch.zeros(t, t, device=like.device, dtype=torch.float32).masked_fill(~ok, float("-inf"))[None, None]


def _init_module(mod, std):
    """The transformers initialisation of V4 modules, for modules built outside PreTrainedModel."""
    if isinstance(mod, nn.Linear):
        nn.init.normal_(mod.weight, std=std)
    elif isinstance(mod, M.DeepseekV4RMSNorm):
        nn.init.ones_(mod.weight)
    elif isinstance(mod, M.DeepseekV4TopKRouter):
        nn.init.normal_(mod.weight, std=std)
        nn.init.zeros_(mod.e_score_correction_bias)
    elif isinstance(mod, M.DeepseekV4Experts):
        nn.init.normal_(mod.gate_up_proj, std=std)
        nn.init.normal_(mod.down_proj, std=std)
    elif isinstance(mod, M.DeepseekV4Attention):
        nn.init.zeros_(mod.sinks)
    elif isinstance(mod, M.DeepseekV4HyperConnection):
        nn.init.normal_(mod.fn, std=std)
        nn.init.zeros_(mod.base)
        nn.init.ones_(mod.scale)


# ---------------------------------------------------------------------------------------------
# Whole model


class TinyV4(nn.Module):
    def __init__(self, cfg, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.cfg = cfg
        self.lm = DeepseekV4ForCausalLM(hf_config(cfg))
        self.mtp = MTPBlock(cfg)
        for i in range(cfg["num_hash_layers"]):
            self.lm.model.layers[i].mlp.gate.tid2eid.copy_(
                make_tid2eid(cfg["vocab_size"], cfg["n_routed_experts"], cfg["num_experts_per_tok"], seed + 101 + i))
        self._streams = None
        self.lm.model.hc_head.register_forward_pre_hook(self._keep_streams)

    def _keep_streams(self, module, args):
        self._streams = args[0]

    def forward(self, ids, with_mtp=True):
        """ids [B, T] -> (main logits [B, T, V], mtp logits [B, T-1, V] for targets ids[:, 2:]...)."""
        out = self.lm(input_ids=ids, use_cache=False)
        logits = out.logits
        if not with_mtp:
            return logits, None
        h = self._streams[:, :-1]
        y = self.mtp(h, ids[:, 1:], self.lm.model.embed_tokens)
        return logits, self.lm.lm_head(y)

    def routers(self):
        rs = [l.mlp.gate for l in self.lm.model.layers if isinstance(l.mlp.gate, M.DeepseekV4TopKRouter)]
        return rs + [self.mtp.layer.mlp.gate]


# ---------------------------------------------------------------------------------------------
# Formats of the exported weights: which tensors are FP8 and which MXFP4


def quantized_params(model):
    """[(module, attr, kind)] for every weight stored quantised in the export."""
    out = []
    layers = list(model.lm.model.layers) + [model.mtp.layer]
    for layer in layers:
        a = layer.self_attn
        for lin in (a.q_a_proj, a.q_b_proj, a.kv_proj, a.o_a_proj, a.o_b_proj):
            out.append((lin, "weight", "fp8"))
        if isinstance(a.compressor, M.DeepseekV4CSACompressor):
            out.append((a.compressor.indexer.q_b_proj, "weight", "fp8"))
        s = layer.mlp.shared_experts
        for lin in (s.gate_proj, s.up_proj, s.down_proj):
            out.append((lin, "weight", "fp8"))
        out.append((layer.mlp.experts, "gate_up_proj", "fp4"))
        out.append((layer.mlp.experts, "down_proj", "fp4"))
    out.append((model.mtp.e_proj, "weight", "fp8"))
    out.append((model.mtp.h_proj, "weight", "fp8"))
    # tensors stored as BF16 (everything else is F32/I64 and exported exactly)
    bf = [model.lm.model.embed_tokens, model.lm.lm_head, model.lm.model.norm,
          model.mtp.enorm, model.mtp.hnorm, model.mtp.norm]
    for layer in layers:
        a = layer.self_attn
        bf += [layer.input_layernorm, layer.post_attention_layernorm, a.q_a_norm, a.kv_norm, layer.mlp.gate]
        if a.compressor is not None:
            c = a.compressor
            bf += [c.kv_proj, c.gate_proj, c.kv_norm]
            if isinstance(c, M.DeepseekV4CSACompressor):
                bf += [c.indexer.kv_proj, c.indexer.gate_proj, c.indexer.kv_norm, c.indexer.scorer.weights_proj]
    out += [(mod, "weight", "bf16") for mod in bf]
    return out


class _FakeQuant(nn.Module):
    """Straight-through fake quantisation: forward sees the stored format, backward is identity."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind

    def forward(self, w):
        if self.kind == "fp8":
            q = quant.fake_fp8(w)
        elif self.kind == "bf16":
            q = w.detach().to(torch.bfloat16).to(w.dtype)
        else:
            q = quant.fake_mxfp4(w)
        return w + (q - w).detach()


def enable_fake_quant(model):
    from torch.nn.utils import parametrize
    for mod, attr, kind in quantized_params(model):
        parametrize.register_parametrization(mod, attr, _FakeQuant(kind))


def disable_fake_quant(model, keep_quantized=False):
    """Remove the parametrisations; keep_quantized=True bakes the quantised values in."""
    from torch.nn.utils import parametrize
    for mod, attr, _ in quantized_params(model):
        if parametrize.is_parametrized(mod, attr):
            parametrize.remove_parametrizations(mod, attr, leave_parametrized=keep_quantized)


# ---------------------------------------------------------------------------------------------
# Training patches


def dense_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """All experts on all tokens, masked by the routing weights (same math as the loop)."""
    n = hidden_states.shape[0]
    comb = hidden_states.new_zeros(n, self.num_experts).scatter_add_(1, top_k_index, top_k_weights.to(hidden_states.dtype))
    gu = torch.einsum("nd,efd->enf", hidden_states, self.gate_up_proj)
    act = self._apply_gate(gu) * comb.t().unsqueeze(-1)
    return torch.einsum("eni,edi->nd", act, self.down_proj)


_orig_indexer_forward = M.DeepseekV4Indexer.forward
_orig_scorer_forward = M.DeepseekV4IndexerScorer.forward


def _indexer_forward(self, hidden_states, q_residual, position_ids, cache, layer_idx):
    return _orig_indexer_forward(self, hidden_states.detach(), q_residual.detach(), position_ids, cache, layer_idx)


def _scorer_forward(self, q, compressed_kv, hidden_states):
    scores = _orig_scorer_forward(self, q, compressed_kv, hidden_states)
    self.last_scores = scores
    return scores


def install_training_patches(model):
    M.DeepseekV4Experts.forward = dense_experts_forward
    M.DeepseekV4Indexer.forward = _indexer_forward
    M.DeepseekV4IndexerScorer.forward = _scorer_forward
    csa = [l.self_attn for l in model.lm.model.layers if isinstance(l.self_attn.compressor, M.DeepseekV4CSACompressor)]

    def keep_probs(mod, args, out):
        mod.last_probs = out[1]

    for a in csa:
        a.register_forward_hook(keep_probs)
    return csa


def indexer_kl(attn, seq_len):
    """KL(main attention over the selected compressed entries || indexer softmax over them)."""
    ind = attn.compressor.indexer
    s = ind.scorer.last_scores                                   # [B, T, C]
    p = attn.last_probs[..., seq_len:].detach().float().sum(1)   # [B, T, C]
    c = s.shape[-1]
    if c == 0:
        return s.new_zeros(())
    pos = torch.arange(seq_len, device=s.device)
    thr = (pos + 1) // ind.compress_rate
    fut = torch.arange(c, device=s.device)[None, :] >= thr[:, None]
    sm = s.masked_fill(fut, float("-inf"))
    k = min(ind.index_topk, c)
    idx = sm.detach().topk(k, dim=-1).indices
    valid = idx < thr[None, :, None]
    tgt = p.gather(-1, idx) * valid
    tot = tgt.sum(-1, keepdim=True)
    rows = tot.squeeze(-1) > 0
    tgt = tgt / tot.clamp_min(1e-20)
    logq = torch.log_softmax(s.gather(-1, idx).masked_fill(~valid, float("-inf")), dim=-1)
    kl = (tgt * (torch.log(tgt.clamp_min(1e-20)) - logq.masked_fill(~valid, 0.0))).sum(-1)
    return (kl * rows).sum() / rows.sum().clamp_min(1)


# ---------------------------------------------------------------------------------------------
# Evaluation


@torch.no_grad()
def evaluate(model, tokens, ctx, max_chunks=None, batch=8):
    """Teacher-forced statistics over `tokens` (1-D LongTensor) cut into consecutive chunks of
    `ctx` tokens (the last chunk may be shorter).  Main: NLL/top-1 of token i+1 at positions i of
    each chunk.  MTP: top-1 of token i+2 from position i.  Returns a dict."""
    dev = next(model.parameters()).device
    chunks = [tokens[i:i + ctx] for i in range(0, len(tokens), ctx)]
    chunks = [c for c in chunks if len(c) >= 3]
    if max_chunks:
        chunks = chunks[:max_chunks]
    nll = n = hit = mhit = mn = mnll = 0.0
    for i in range(0, len(chunks), batch):
        group = chunks[i:i + batch]
        for c in group if len({len(g) for g in group}) > 1 else [torch.stack(group)]:
            ids = (c if c.dim() == 2 else c[None]).to(dev)
            logits, mlog = model(ids)
            lp = torch.log_softmax(logits[:, :-1].float(), -1)
            tgt = ids[:, 1:]
            nll += -lp.gather(-1, tgt[..., None]).sum().item()
            hit += (lp.argmax(-1) == tgt).sum().item()
            n += tgt.numel()
            mlp = torch.log_softmax(mlog[:, :-1].float(), -1)
            mt = ids[:, 2:]
            mnll += -mlp.gather(-1, mt[..., None]).sum().item()
            mhit += (mlp.argmax(-1) == mt).sum().item()
            mn += mt.numel()
    import math
    return {"tokens": int(n), "nll": nll / n, "ppl": math.exp(nll / n), "top1": hit / n,
            "mtp_nll": mnll / mn, "mtp_ppl": math.exp(mnll / mn), "mtp_top1": mhit / mn}
