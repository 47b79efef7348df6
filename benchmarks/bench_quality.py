"""Plan-quality benchmark: fine-level rescheduling, partition-aware coarsening
and refinement against Expert and the current ``pesto.solve``.

For each TF model graph in ``benchmarks/graphs/`` (grappler V100 costs) on
``v100x2_nvlink()`` it records the simulated step time of

* the full-graph heuristics (Expert, METIS, m-ETF, HEFT, Celeritas, Single),
  as they come (TF FIFO or their own order) and ``reschedule``-d;
* ``pesto.solve`` as it is now (coarsen, heuristics on the coarse graph, CP-SAT);
* ``solver.recipes.improve``: best rescheduled heuristic -> partition-aware
  coarsening (its placement as partition) -> CP-SAT hinted with the projected
  plan -> expand -> reschedule -> refine, with the time of every pass.

Ratios compare with Expert (TF FIFO, the paper's baseline) and with the best
baseline of ``benchmarks/results/placement.csv`` (which includes m-SCT and
m-TOPO). Writes ``benchmarks/results/quality.csv`` and ``quality.md`` (after
every graph, so a cut run leaves its rows).

Run ``python -m benchmarks.bench_quality [--cpsat-time 20] [--refine-time 20]
[--solve-time 30] [--workers 2] [--graphs nmt_2x1024 ...] [--no-solve]``.
"""
from __future__ import annotations

import argparse
import csv
import os
import platform
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

import pesto
from pesto.cluster import v100x2_nvlink
from pesto.plan import check_plan
from solver import accepted_options, get_placer
from solver.options import SHARES
from solver.recipes import improve, solve_fine
from solver.search import reschedule

HERE = Path(__file__).resolve().parent
GRAPHS = ["rnnlm_2x2048", "nmt_2x1024", "rnnlm_4x2048", "nmt_4x1024", "transformer_6", "nasnet_b16",
          "rnnlm_16x1024"]
VARIANTS = ["expert", "metis", "m-etf", "heft", "celeritas", "single"]  # baselines shown as rows
FIELDS = ["workload", "ops", "variant", "step_ms", "vs_expert", "vs_best_baseline", "best_baseline",
          "wall_s", "status", "valid", "detail"]


def best_baselines(path: Path) -> dict:
    """workload -> (placer, step ms) of the best memory-feasible baseline in placement.csv."""
    out: dict = {}
    if not path.exists():
        return out
    with open(path) as f:
        for r in csv.DictReader(f):
            if r.get("cluster") != "v100x2_nvlink" or r.get("placer") in ("cpsat", "mip", "pesto"):
                continue
            if r.get("oom") == "True" or not r.get("step_ms"):
                continue
            try:
                v = float(r["step_ms"])
            except ValueError:
                continue
            w = r["workload"]
            if w not in out or v < out[w][1]:
                out[w] = (r["placer"], v)
    return out


def run_graph(name: str, args, base: dict) -> list[dict]:
    cl = v100x2_nvlink()
    g = pesto.OpGraph.from_json(str(HERE / "graphs" / f"{name}.json.gz"))
    rows = []
    ref = base.get(name)

    def add(variant, plan, wall, detail=""):
        ok = check_plan(g, cl, plan, check_memory=plan.status != "infeasible").ok
        step = plan.makespan / 1e3
        rows.append({"workload": name, "ops": g.num_ops, "variant": variant, "step_ms": round(step, 3),
                     "vs_expert": None, "vs_best_baseline": round(step / ref[1] - 1, 4) if ref else None,
                     "best_baseline": f"{ref[0]} {ref[1]:.2f}" if ref else "", "wall_s": round(wall, 2),
                     "status": plan.status, "valid": ok, "detail": detail})
        print(f"  {name:14s} {variant:28s} {step:9.2f} ms  {wall:6.1f} s  {detail}", flush=True)

    starts = []
    for h in VARIANTS:
        t = time.perf_counter()
        try:
            fn = get_placer(h)
            p = fn(g, cl, **accepted_options(fn, {"time_limit": args.solve_time, "seed": 0}))
        except Exception as exc:  # a baseline failing is reported, not fatal
            print(f"  {name} {h} failed: {exc}", flush=True)
            continue
        add(h, p, time.perf_counter() - t)
        t = time.perf_counter()
        r = reschedule(g, cl, p)
        add(f"{h}+reschedule", r, time.perf_counter() - t + p.wall_time, f"order={r.stats['schedule']}")
        starts.append(p)
    if args.solve_fine:
        t = time.perf_counter()
        p = solve_fine(g, cl, time_limit=args.solve_fine, workers=args.workers, seed=0)
        lg = p.log
        add(f"solve_fine({args.solve_fine:g} s)", p, time.perf_counter() - t,
            f"cpsat->{lg.candidates.get('cpsat', float('nan')) / 1e3:.2f}; "
            f"refined {lg.candidates.get('refine', float('nan')) / 1e3:.2f}; winner={lg.winner}")
        if args.only_fine:
            ex = next((r["step_ms"] for r in rows if r["variant"] == "expert"), None)
            for r in rows:
                r["vs_expert"] = round(r["step_ms"] / ex - 1, 4) if ex else None
            return rows
    if not args.no_solve:
        t = time.perf_counter()
        try:
            p = pesto.solve(g, cluster=cl, time_limit=args.solve_time, workers=args.workers, seed=0)
            add("pesto.solve (current)", p, time.perf_counter() - t, f"winner={p.log.winner}")
        except Exception as exc:
            print(f"  {name} pesto.solve failed: {type(exc).__name__}: {exc}", flush=True)
    t = time.perf_counter()
    p = improve(g, cl, starts, cpsat_time=args.cpsat_time, refine_time=args.refine_time,
                workers=args.workers, seed=0)
    stages = "; ".join(f"{st.name} {st.seconds:.1f}s" + (f" -> {st.makespan / 1e3:.2f}" if st.makespan else "")
                       + (f" ({st.note})" if st.note else "") for st in p.log.passes) + f"; winner={p.log.winner}"
    add("improve (full recipe)", p, time.perf_counter() - t, stages)
    ex = next((r["step_ms"] for r in rows if r["variant"] == "expert"), None)
    for r in rows:
        r["vs_expert"] = round(r["step_ms"] / ex - 1, 4) if ex else None
    return rows


def _shares() -> str:
    """The full recipe's split of a time limit, as the code has it (:data:`solver.options.SHARES`)."""
    return ", ".join(f"{s:.0%} {name}" for s, name in zip(SHARES, ("CP-SAT", "LNS", "refine")))


def write(rows, args, started):
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"quality_{args.tag}" if args.tag else "quality"
    with open(out / f"{stem}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["# Plan quality: fine-level reschedule, partition-aware coarsening, refinement", "",
             f"Generated by `python -m benchmarks.bench_quality` on {now} (run started {started}).  ",
             f"Machine: {os.cpu_count()} CPU cores ({platform.machine()}), shared with other jobs; no GPU: "
             "step times are **simulated** (`pesto.simulate`, fixed per-device order) with the graphs' "
             "grappler V100 costs, cluster `v100x2_nvlink()`.  ",
             f"Settings: CP-SAT {args.cpsat_time:g} s on the coarse graph (200 vertices, {args.workers} workers), "
             f"refine {args.refine_time:g} s, `pesto.solve` time_limit {args.solve_time:g} s"
             + (f"; `solve_fine` time_limit {args.solve_fine:g} s ({_shares()})" if args.solve_fine
                else "") + ".", "",
             "Variants: a heuristic as it comes (TF FIFO for Expert/METIS/Single, their list order for the "
             "others); `+reschedule` = same placement, best order of FIFO / upward-rank list schedule / "
             "given order (`solver.search.reschedule`); `improve` = `solver.recipes.improve` (best rescheduled "
             "heuristic -> coarsen with its placement as partition -> CP-SAT hinted with the projected plan "
             "-> expand -> reschedule -> refine). *vs Expert* compares with Expert under TF FIFO; "
             "*vs best baseline* with the best memory-feasible baseline of placement.csv.", "",
             "| workload | ops | Expert | Expert+resched | best heuristic+resched | pesto.solve (current) | "
             "improve | improve vs Expert | improve vs best baseline | improve wall (s) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    by: dict = {}
    for r in rows:
        by.setdefault(r["workload"], {})[r["variant"]] = r
    for wl, vs in by.items():
        def ms(v):
            return f"{vs[v]['step_ms']:.2f}" if v in vs else "-"
        rs = [r for k, r in vs.items() if k.endswith("+reschedule")]
        bh = min(rs, key=lambda r: r["step_ms"]) if rs else None
        imp = vs.get("improve (full recipe)")
        lines.append(f"| {wl} | {next(iter(vs.values()))['ops']} | {ms('expert')} | {ms('expert+reschedule')} | "
                     + (f"{bh['step_ms']:.2f} ({bh['variant'].split('+')[0]})" if bh else "-")
                     + f" | {ms('pesto.solve (current)')} | {ms('improve (full recipe)')} | "
                     + (f"{imp['vs_expert']:+.1%} | {imp['vs_best_baseline']:+.1%} ({imp['best_baseline']})"
                        if imp and imp["vs_best_baseline"] is not None else
                        (f"{imp['vs_expert']:+.1%} | -" if imp else "- | -"))
                     + f" | {imp['wall_s'] if imp else '-'} |")
    lines += ["", "## Passes of `improve`", "", "| workload | passes |", "|---|---|"]
    for wl, vs in by.items():
        imp = vs.get("improve (full recipe)")
        if imp:
            lines.append(f"| {wl} | {imp['detail']} |")
    fine = [r for r in rows if r["variant"].startswith("solve_fine")]
    if fine:
        lines += ["", "## `solver.recipes.solve_fine` (full-graph heuristics + improve, what `pesto.solve` would run)",
                  "", "| workload | variant | step (ms) | vs Expert | vs best baseline | wall (s) | passes |",
                  "|---|---|---:|---:|---|---:|---|"]
        for r in fine:
            vb = (f"{r['vs_best_baseline']:+.1%} ({r['best_baseline']})" if r["vs_best_baseline"] is not None
                  else "-")
            lines.append(f"| {r['workload']} | {r['variant']} | {r['step_ms']:.2f} | {r['vs_expert']:+.1%} | {vb} | "
                         f"{r['wall_s']} | {r['detail']} |")
    lines += ["", "## Every variant", "", "| workload | variant | step (ms) | vs Expert | wall (s) | status | valid |",
              "|---|---|---:|---:|---:|---|---|"]
    for r in rows:
        ve = f"{r['vs_expert']:+.1%}" if r["vs_expert"] is not None else "-"
        lines.append(f"| {r['workload']} | {r['variant']} | {r['step_ms']:.2f} | {ve} | {r['wall_s']} | "
                     f"{r['status']} | {r['valid']} |")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", nargs="*", default=GRAPHS)
    ap.add_argument("--cpsat-time", type=float, default=20)
    ap.add_argument("--refine-time", type=float, default=20)
    ap.add_argument("--solve-time", type=float, default=30)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-solve", action="store_true", help="skip the current pesto.solve")
    ap.add_argument("--solve-fine", type=float, default=0,
                    help="also run solver.recipes.solve_fine with this time_limit (what pesto.solve would call)")
    ap.add_argument("--only-fine", action="store_true", help="with --solve-fine: skip pesto.solve and improve")
    ap.add_argument("--tag", default="", help="write quality_<tag>.csv/.md")
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args(argv)
    started = datetime.now(timezone.utc).strftime("%H:%M UTC")
    base = best_baselines(HERE / "results" / "placement.csv")
    rows: list = []
    for name in args.graphs:
        t = time.perf_counter()
        try:
            rows += run_graph(name, args, base)
        except Exception:
            traceback.print_exc()
        print(f"{name}: {time.perf_counter() - t:.0f} s", flush=True)
        write(rows, args, started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
