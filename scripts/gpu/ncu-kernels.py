#!/usr/bin/env python3
"""Sums an `ncu --csv --metrics gpu__time_duration.sum` log per kernel name.

    ncu --csv --metrics gpu__time_duration.sum --graph-profiling node BIN ARGS > log.csv
    scripts/gpu/ncu-kernels.py log.csv [--steps N]

Prints, per kernel (template arguments dropped), launches, mean and total
microseconds, and the share of the total, largest first. --steps divides the
totals by N (e.g. decode steps profiled) to give time per step.
"""
import csv
import re
import sys
from collections import defaultdict


def main() -> int:
    path = sys.argv[1]
    steps = 1
    if "--steps" in sys.argv:
        steps = int(sys.argv[sys.argv.index("--steps") + 1])
    total = defaultdict(float)
    count = defaultdict(int)
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        # Anonymous namespaces print as "<unnamed>::" or "(anonymous namespace)::";
        # drop them before cutting template arguments and parameters.
        name = re.sub(r"<unnamed>::|\(anonymous namespace\)::", "", row["Kernel Name"])
        name = re.sub(r"<.*", "", name).replace("void ", "")
        name = re.sub(r"\(.*", "", name).split("::")[-1]
        unit = row.get("Metric Unit", "ns")
        v = float(row["Metric Value"].replace(",", ""))
        v *= {"ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(unit, 1e-3)
        total[name] += v
        count[name] += 1
    all_us = sum(total.values())
    print(f"{'kernel':44s} {'launches':>9s} {'mean us':>9s} {'us/step':>10s} {'share':>6s}")
    for name, us in sorted(total.items(), key=lambda kv: -kv[1]):
        print(f"{name[:44]:44s} {count[name] / steps:9.1f} {us / count[name]:9.2f} {us / steps:10.1f} "
              f"{100 * us / all_us:5.1f}%")
    print(f"{'all':44s} {sum(count.values()) / steps:9.1f} {'':9s} {all_us / steps:10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
