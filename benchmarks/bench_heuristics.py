"""Placement time and simulated step time of every heuristic placer on ~40k-op graphs.

Run: ``python -m benchmarks.bench_heuristics [--quick] [--sct-limit SECONDS]``.
Writes ``benchmarks/results/heuristics.csv`` and ``heuristics.md``.

Target (issue 5): every heuristic places a 40,000-op graph in <= 10 s; m-SCT's
favourite-child LP may take longer, so it runs with an LP time limit
(``--sct-limit``, default 600 s; on time-out it falls back to heavy-edge
favourite children, see ``lp_status``) and is also timed on smaller graphs
to show how the LP scales.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import os
import platform
import time

from pesto.cluster import v100x2_nvlink
from benchmarks.generators import layered_dag, lstm_grid, transformer_like
from solver import get_placer

FAST = ["single", "expert", "metis", "m-topo", "m-etf", "celeritas", "heft"]
OUT = os.path.join(os.path.dirname(__file__), "results")


def graphs(quick: bool):
    if quick:
        return {"layered_dag(4000)": layered_dag(4000), "lstm_grid(10,20)": lstm_grid(10, 20),
                "transformer_like(33)": transformer_like(33)}
    return {"layered_dag(40000)": layered_dag(40000), "lstm_grid(20,100)": lstm_grid(20, 100),
            "transformer_like(328)": transformer_like(328)}


def run(name, gname, g, cluster, **kw):
    t = time.perf_counter()
    plan = get_placer(name)(g, cluster, **kw)
    sec = time.perf_counter() - t
    st = plan.stats
    row = {"placer": name, "graph": gname, "ops": g.num_ops, "seconds": round(sec, 2),
           "makespan_us": round(plan.makespan, 1), "status": plan.status,
           "estimated_us": round(st["estimated_makespan"], 1) if "estimated_makespan" in st else "",
           "lp_seconds": st.get("lp_seconds", ""), "lp_status": st.get("lp_status", "")}
    print(row, flush=True)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="4k-op graphs (smoke run)")
    ap.add_argument("--sct-limit", type=float, default=600.0, help="m-SCT LP time limit on 40k graphs (s)")
    args = ap.parse_args(argv)
    cluster = v100x2_nvlink()
    rows = []
    gs = graphs(args.quick)
    for gname, g in gs.items():
        for name in FAST:
            rows.append(run(name, gname, g, cluster))
    # m-SCT: LP scaling on smaller layered graphs, then the 40k graphs under a limit
    for n in ((1000, 2000) if args.quick else (2500, 5000, 10000)):
        rows.append(run("m-sct", f"layered_dag({n})", layered_dag(n), cluster))
    for gname, g in gs.items():
        rows.append(run("m-sct", gname, g, cluster, time_limit=args.sct_limit))
    os.makedirs(OUT, exist_ok=True)
    suffix = "_quick" if args.quick else ""
    with open(os.path.join(OUT, f"heuristics{suffix}.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# Heuristic placers: placement time and simulated step time", "",
             f"{now}; {os.cpu_count()} cores, Python {platform.python_version()}, one process; "
             f"cluster `v100x2_nvlink` (2 V100 NVLink + CPU); makespan = simulated step time (µs, "
             f"link contention on); estimated = the placer's own estimate (links booked in placement order); "
             f"the machine may be shared with other jobs, so times are upper bounds. "
             f"Target: <= 10 s per heuristic on ~40k ops (m-SCT's LP exempt; LP limit "
             f"{args.sct_limit:g} s on the 40k graphs, fallback to heavy-edge favourite children on time-out).", "",
             "| placer | graph | ops | seconds | makespan (µs) | status | estimated (µs) | LP s | LP status |",
             "|---|---|---:|---:|---:|---|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['placer']} | {r['graph']} | {r['ops']} | {r['seconds']} | {r['makespan_us']} | "
                     f"{r['status']} | {r['estimated_us']} | {r['lp_seconds']} | {r['lp_status']} |")
    slow = [r for r in rows if r["placer"] != "m-sct" and r["ops"] >= 40000 and r["seconds"] > 10]
    lines += ["", "All heuristics within 10 s on the 40k graphs." if not slow and not args.quick else
              ("Over 10 s: " + ", ".join(f"{r['placer']} on {r['graph']}" for r in slow) if slow else "")]
    with open(os.path.join(OUT, f"heuristics{suffix}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
