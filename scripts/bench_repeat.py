#!/usr/bin/env python3
"""Runs a criterion bench several times and reports, per benchmark, the median of the per-run
medians with the spread (min–max), and each one's ratio to the group's `floor` and `governor/*`.

    python3 scripts/bench_repeat.py --runs 5 --bench direct [--filter REGEX]

One run of criterion gives one median per benchmark; on a shared, noisy machine a single run can
move by a nanosecond, so the figures quoted in the README are medians of 5 such runs.
"""
import argparse
import json
import pathlib
import statistics
import subprocess
import time

ap = argparse.ArgumentParser()
ap.add_argument("--runs", type=int, default=5)
ap.add_argument("--bench", default="direct")
ap.add_argument("--filter", default="")
args = ap.parse_args()

root = pathlib.Path("target/criterion")
samples = {}  # (group, name) -> [median per run]
for i in range(args.runs):
    cmd = ["cargo", "bench", "--bench", args.bench, "--", "--noplot"]
    if args.filter:
        cmd.append(args.filter)
    started = time.time()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for est in root.glob("**/new/estimates.json"):
        if est.stat().st_mtime < started:
            continue  # not measured by this run (filtered out)
        bench = json.loads((est.parent / "benchmark.json").read_text())
        if not bench["group_id"].startswith(args.bench):
            continue
        key = (bench["group_id"], bench["function_id"])
        med = json.loads(est.read_text())["median"]["point_estimate"]
        samples.setdefault(key, []).append(med)
    print(f"run {i + 1}/{args.runs} done", flush=True)

groups = {}
for (group, name), meds in sorted(samples.items()):
    groups.setdefault(group, {})[name] = meds[-args.runs:]
for group, benches in groups.items():
    mid = {n: statistics.median(m) for n, m in benches.items()}
    print(f"\n**{group}** (median of {args.runs} runs' medians, ns; spread is min–max)\n")
    print("| bench | median | spread | × floor | governor (same load) ÷ this |")
    print("|---|---:|---:|---:|---:|")
    for name, meds in benches.items():
        # Names are `[workload/]impl[/load]`; the floor and governor of the same workload and
        # load are the references (`floor`, `1K-keys/floor`; `governor/allow-heavy`,
        # `1K-keys/governor/allow-heavy`).
        parts = name.split("/")
        prefix = parts[0] + "/" if parts[0][0].isdigit() else ""
        load = parts[-1] if len(parts) > len(prefix.split("/")) else ""
        floor = mid.get(f"{prefix}floor")
        gov = mid.get(f"{prefix}governor/{load}")
        is_ref = "floor" in name or "governor" in name
        r_floor = f"{mid[name] / floor:.2f}" if floor and not is_ref else "—"
        r_gov = f"{gov / mid[name]:.2f}" if gov and not is_ref else "—"
        print(f"| {name} | {mid[name]:.1f} | {min(meds):.1f}–{max(meds):.1f} | {r_floor} | {r_gov} |")
