#!/usr/bin/env python3
"""Train the tiny V4 model (main model + MTP block) on the tokenized corpus.

Time-budgeted: the learning-rate schedule (linear warm-up, cosine decay to 10%) runs on the
fraction of --minutes elapsed, so the run finishes on time whatever the step rate.  The last
--qat-frac of the time trains with straight-through fake quantisation of every weight in its
exported format (FP8 blocks, MXFP4 experts, BF16 rest).  Losses: next-token CE + --mtp-weight x
next-next-token CE of the MTP block + --idx-weight x the lightning-indexer KL.  Expert load is
balanced without an auxiliary loss: after every step each gate's selection bias moves by
--bias-rate towards the mean load (DeepSeek's aux-loss-free balancing).

At the end: held-out statistics of the float32 master weights and of the quantised weights,
the official-layout export (export.py), and the float32 master weights of all but the routed
experts.

    python train.py --data work/data --tokenizer work/tokenizer.json --out work/run --minutes 10
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as tm  # noqa: E402


def log(msg, f=None):
    line = f"[{time.strftime('%H:%M:%S')}] {msg}"
    print(line, flush=True)
    if f:
        f.write(line + "\n")
        f.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--max-steps", type=int, default=0, help="stop after N steps (debugging)")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=float, default=0.03)
    ap.add_argument("--qat-frac", type=float, default=0.15)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--idx-weight", type=float, default=1.0)
    ap.add_argument("--bias-rate", type=float, default=2e-3)
    ap.add_argument("--eval-every", type=float, default=90.0, help="seconds between held-out probes")
    ap.add_argument("--eval-chunks", type=int, default=0, help="limit the final evaluation (debugging)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()

    t0 = time.time()
    os.makedirs(args.out, exist_ok=True)
    lf = open(os.path.join(args.out, "train.log"), "a")
    dev = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    log(f"args {vars(args)} torch {torch.__version__} device {dev}", lf)

    train = torch.from_numpy(np.fromfile(os.path.join(args.data, "train.u16"), dtype=np.uint16).astype(np.int64))
    evals = torch.from_numpy(np.fromfile(os.path.join(args.data, "eval.u16"), dtype=np.uint16).astype(np.int64))
    cfg = tm.tiny_config()
    model = tm.TinyV4(cfg, seed=args.seed).to(dev)
    csa = tm.install_training_patches(model)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"train {len(train)} tokens, eval {len(evals)} tokens, params {n_params}", lf)

    loads = {}

    def count(mod, inp, out):
        loads[mod] = loads.get(mod, 0) + torch.bincount(out[2].flatten(), minlength=mod.num_experts)

    for r in model.routers():
        r.register_forward_hook(count)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    budget = args.minutes * 60.0
    gen = torch.Generator().manual_seed(args.seed)
    step, qat, t_train, last_eval = 0, False, time.time(), time.time()
    hist = []
    while True:
        frac = (time.time() - t_train) / budget
        if args.max_steps:
            frac = step / args.max_steps
        if frac >= 1.0:
            break
        if not qat and frac >= 1.0 - args.qat_frac:
            tm.enable_fake_quant(model)
            qat = True
            log(f"step {step}: quantisation-aware phase starts", lf)
        lr = args.lr * (min(1.0, frac / args.warmup) if frac < args.warmup else
                        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (frac - args.warmup) / (1 - args.warmup))))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(train) - args.ctx - 1, (args.batch,), generator=gen)
        ids = torch.stack([train[s:s + args.ctx] for s in starts]).to(dev, non_blocking=True)
        logits, mlog = model(ids)
        v = logits.shape[-1]
        l_main = F.cross_entropy(logits[:, :-1].reshape(-1, v).float(), ids[:, 1:].reshape(-1))
        l_mtp = F.cross_entropy(mlog[:, :-1].reshape(-1, v).float(), ids[:, 2:].reshape(-1))
        l_idx = sum(tm.indexer_kl(a, args.ctx) for a in csa) / max(1, len(csa))
        for a in csa:
            a.last_probs = None
        loss = l_main + args.mtp_weight * l_mtp + args.idx_weight * l_idx
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            for r, c in loads.items():
                c = c.float()
                r.e_score_correction_bias += args.bias_rate * torch.sign(c.mean() - c)
        if step % 50 == 0:
            imb = max((c.max().item() / max(c.float().mean().item(), 1e-9)) for c in loads.values())
            hist.append({"step": step, "t": round(time.time() - t_train, 1), "loss": l_main.item(),
                         "mtp": l_mtp.item(), "idx": l_idx.item(), "lr": lr})
            log(f"step {step} t {time.time() - t_train:6.1f}s lr {lr:.2e} main {l_main.item():.4f} "
                f"mtp {l_mtp.item():.4f} idx {float(l_idx):.4f} gnorm {gn.item():.2f} max-load/mean {imb:.2f} "
                f"mem {torch.cuda.max_memory_allocated() / 2**30 if dev.type == 'cuda' else 0:.1f}G", lf)
        loads.clear()
        if time.time() - last_eval > args.eval_every:
            model.eval()
            st = tm.evaluate(model, evals, args.ctx, max_chunks=24, batch=8)
            model.train()
            last_eval = time.time()
            log(f"step {step} held-out probe: ppl {st['ppl']:.3f} top1 {st['top1']:.4f} mtp-top1 {st['mtp_top1']:.4f}", lf)
        step += 1
    log(f"training done: {step} steps, {step * args.batch * args.ctx / 1e6:.1f}M tokens, "
        f"{time.time() - t_train:.0f}s", lf)

    # ---------------------------------------------------------------- final statistics + export
    model.eval()
    if not qat:
        tm.enable_fake_quant(model)
    res = {"steps": step, "tokens_seen": step * args.batch * args.ctx, "train_seconds": time.time() - t_train,
           "params": n_params, "history": hist}
    mc = args.eval_chunks or None
    res["quantised"] = tm.evaluate(model, evals, args.ctx, max_chunks=mc)
    log(f"held-out, quantised weights: {res['quantised']}", lf)
    tm.disable_fake_quant(model, keep_quantized=False)
    res["float32"] = tm.evaluate(model, evals, args.ctx, max_chunks=mc)
    log(f"held-out, float32 master weights: {res['float32']}", lf)
    master = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    tm.enable_fake_quant(model)
    tm.disable_fake_quant(model, keep_quantized=True)
    model = model.cpu()
    import export
    exp_dir = os.path.join(args.out, "export")
    export.export(model, args.tokenizer, exp_dir)
    # master weights of everything but the routed experts (whose trained values are exactly the
    # exported MXFP4 ones after the quantisation-aware phase), float32, in 2 files below 16 MB
    keep = [(k, v) for k, v in master.items() if ".experts.gate_up_proj" not in k and ".experts.down_proj" not in k]
    parts, sizes = [{}, {}], [0, 0]
    for k, v in sorted(keep, key=lambda kv: -kv[1].numel() * kv[1].element_size()):
        i = sizes.index(min(sizes))
        parts[i][k] = v
        sizes[i] += v.numel() * v.element_size()
    for i, p in enumerate(parts):
        torch.save({"cfg": cfg, "part": i, "parts": len(parts), "state": p}, os.path.join(args.out, f"master-{i}.pt"))
    res["total_seconds"] = time.time() - t0
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(res, f, indent=1)
    log(f"wrote export and {len(parts)} master parts in {time.time() - t0:.0f}s total", lf)


if __name__ == "__main__":
    main()
