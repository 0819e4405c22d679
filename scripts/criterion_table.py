#!/usr/bin/env python3
"""Prints a Markdown table of criterion medians for one benchmark group prefix.

    python3 scripts/criterion_table.py direct

Reads target/criterion/<group>/<bench>/new/estimates.json (criterion's own output) and prints
the median and its 95% confidence interval in ns, and each bench's ratio to the group's floor.
"""
import json
import pathlib
import sys

root = pathlib.Path("target/criterion")
prefix = sys.argv[1] if len(sys.argv) > 1 else ""
rows = {}
for est in sorted(root.glob("**/new/estimates.json")):
    bench = json.loads((est.parent / "benchmark.json").read_text())
    group, name = bench["group_id"], bench["function_id"] or bench["value_str"]
    if not group.startswith(prefix):
        continue
    med = json.loads(est.read_text())["median"]
    rows.setdefault(group, []).append((name, med["point_estimate"], med["confidence_interval"]))

for group, benches in rows.items():
    floor = next((m for n, m, _ in benches if n == "floor"), None)
    print(f"\n**{group}**\n")
    print("| bench | median ns | 95% CI | × floor |")
    print("|---|---:|---:|---:|")
    for name, med, ci in benches:
        ratio = f"{med / floor:.2f}" if floor else "—"
        print(f"| {name} | {med:.1f} | {ci['lower_bound']:.1f}–{ci['upper_bound']:.1f} | {ratio} |")
