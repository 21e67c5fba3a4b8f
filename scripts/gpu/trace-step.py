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
    if args.layer is not None:
        if not 0 <= args.layer < n_layers:
            print(f"--layer: the step has {n_layers} layers")
            return 1
        a, b = sites[2 * args.layer][1], sites[2 * args.layer + 2][1]
        print(f"\nlayer {args.layer} in end order, from its first site's start: start, end, added (us), grid x block, name")
        prev = sites[2 * args.layer][0]
        for st, en, s, name, grid, block in sorted(ks, key=lambda k: k[1]):
            if a <= en <= b or (st <= a and en >= a):
                print(f"  {(st - sites[2 * args.layer][0]) / 1e3:9.2f} "
                      f"{(en - sites[2 * args.layer][0]) / 1e3:9.2f} {max(0, en - prev) / 1e3:7.2f} {grid:5d}x{block:<4d} {name}")
                prev = max(prev, en)
        return 0

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
