#!/usr/bin/env python3
"""One decode step's kernel timeline from an AFF_CUDA_TRACE file.

    AFF_CUDA_TRACE=trace.csv affinity-bench ... --decode-steps 4 --runs 1
    scripts/gpu/trace-step.py trace.csv [--launch ID] [--window START_US LEN_US] [--layer N]

A step is the kernels of one graph launch (the CSV's `launch` column); the
default is the last launch with the most kernels. Prints:
  - the step's span; per kernel name, launches and mean and total duration
    (programmatic dependents start before their producer ends, so a
    duration includes that wait);
  - per layer (the decode step's mHC sites, `hc_fused_small`, mark the
    layers: two per layer, the attention's and the MoE's), the time from one
    site's end to the next: the attention sublayer (first site's end to the
    second's) and the MoE (second site's end to the next layer's first);
  - per kind of layer (CSA: with an indexer top-k; the others), what each
    kernel added (its end minus the latest end before it, in end order),
    averaged over the layers of that kind. A proxy for the critical path: a
    side-stream kernel that ends between two critical ones takes part of the
    later one's share (the L2 prefetch often does), and kernels whose order
    changes between layers share their times;
  - with --layer N, that layer's kernels in end order: end and the time since
    the previous end (on the critical path, what that kernel added);
  - otherwise the kernels overlapping a window of the step (default: 300 us
    from the middle), in start order, with start, end and stream (a graph runs
    its branches on streams of its own: the ids are the graph's, not ours).
"""
import argparse
import csv
import statistics
from collections import defaultdict


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--launch", type=int)
    ap.add_argument("--window", type=float, nargs=2, metavar=("START_US", "LEN_US"))
    ap.add_argument("--layer", type=int)
    args = ap.parse_args()

    by_launch = defaultdict(list)
    with open(args.trace, newline="") as f:
        for r in csv.DictReader(f):
            by_launch[int(r["launch"])].append(
                (int(r["start_ns"]), int(r["end_ns"]), int(r["stream"]), r["name"], int(r["grid"]), int(r["block"])))
    if not by_launch:
        print("no kernels in the trace")
        return 1
    if args.launch is None:
        most = max(len(v) for v in by_launch.values())
        args.launch = max(k for k, v in by_launch.items() if len(v) == most)
    ks = sorted(by_launch[args.launch])
    t0 = min(k[0] for k in ks)
    span = max(k[1] for k in ks) - t0
    print(f"launch {args.launch}: {len(ks)} kernels over {span / 1e3:.1f} us")

    by_name = defaultdict(list)
    for st, en, s, name, *_ in ks:
        by_name[name].append(en - st)
    print("\nper kernel name (us): launches, mean duration, total duration")
    for name, v in sorted(by_name.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {name:40s} {len(v):5d} {statistics.mean(v) / 1e3:8.2f} {sum(v) / 1e3:9.1f}")

    sites = sorted((k for k in ks if k[3] == "hc_fused_small_f32_sm90"), key=lambda k: k[1])
    n_layers = (len(sites) - 1) // 2  # the last site is the head's
    if n_layers > 0:
        att = [(sites[2 * l + 1][1] - sites[2 * l][1]) / 1e3 for l in range(n_layers)]
        moe = [(sites[2 * l + 2][1] - sites[2 * l + 1][1]) / 1e3 for l in range(n_layers)]
        print(f"\nper layer (us, site end to site end; {n_layers} layers, the last MoE runs to the head's site):")
        print(f"  attention: mean {statistics.mean(att):.1f}, sum {sum(att):.0f}: " + " ".join(f"{v:.0f}" for v in att))
        print(f"  MoE:       mean {statistics.mean(moe):.1f}, sum {sum(moe):.0f}: " + " ".join(f"{v:.0f}" for v in moe))
    def layer_rows(l):
        """Layer l's kernels in end order: (start, end, added) in ns from its first site's start, and the kernel."""
        a, b, t_l = sites[2 * l][1], sites[2 * l + 2][1], sites[2 * l][0]
        rows, prev = [], t_l
        for st, en, s, name, grid, block in sorted(ks, key=lambda k: k[1]):
            if a <= en <= b or (st <= a and en >= a):
                rows.append((st - t_l, en - t_l, max(0, en - prev), name, grid, block))
                prev = max(prev, en)
        return rows

    if args.layer is not None:
        if not 0 <= args.layer < n_layers:
            print(f"--layer: the step has {n_layers} layers")
            return 1
        print(f"\nlayer {args.layer} in end order, from its first site's start: start, end, added (us), grid x block, name")
        for st, en, added, name, grid, block in layer_rows(args.layer):
            print(f"  {st / 1e3:9.2f} {en / 1e3:9.2f} {added / 1e3:7.2f} {grid:5d}x{block:<4d} {name}")
        return 0

    # What each kernel adds, averaged over the layers of a kind (CSA: the ones
    # with an indexer top-k). A kernel is told from others of its name by its
    # shape and its rank among them in the layer (wo_a and wo_b are both
    # 256x256 GEMVs).
    kinds = defaultdict(list)
    for l in range(n_layers):
        rows = layer_rows(l)
        kinds["CSA" if any(r[3].startswith("indexer_topk") for r in rows) else "other"].append(rows)
    for kind, layers in sorted(kinds.items()):
        added, order = defaultdict(list), []
        for rows in layers:
            seen = defaultdict(int)
            for st, en, add, name, grid, block in rows:
                key = (name, grid, block, seen[(name, grid, block)])
                seen[(name, grid, block)] += 1
                if key not in added:
                    order.append(key)
                added[key].append(add)
        total = sum(statistics.mean(v) for v in added.values())
        print(f"\n{kind} layers ({len(layers)}), mean added per kernel in end order (us; from the first site's "
              f"start to the next layer's first site's end: {total / 1e3:.1f}):")
        for key in order:
            name, grid, block, _ = key
            print(f"  {statistics.mean(added[key]) / 1e3:7.2f} {grid:5d}x{block:<4d} {name}")

    w0, wl = args.window if args.window else (span / 2e3, 300.0)
    lo, hi = t0 + w0 * 1e3, t0 + (w0 + wl) * 1e3
    print(f"\nwindow {w0:.1f} .. {w0 + wl:.1f} us: start, end, duration (us), stream, grid x block, name")
    for st, en, s, name, grid, block in ks:
        if en >= lo and st <= hi:
            print(f"  {(st - t0) / 1e3:9.2f} {(en - t0) / 1e3:9.2f} {(en - st) / 1e3:7.2f} {s:<4d} "
                  f"{grid:5d}x{block:<4d} {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
