"""Coarsening benchmark: the three coarseners on 40,000-op graphs.

For each graph (layered DAG, LSTM grid, Transformer-like, all about 40k ops,
a layered DAG with CPU-only ops and colocation groups, and the TF model
graphs in ``benchmarks/graphs/*.json.gz`` when present) and each method
(height = Pesto's batch merging, height with ``order="gain"``, baechi,
celeritas, parallel = parallelism-preserving acyclic matchings) it records the coarse
vertices and edges, seconds (best of ``--repeat`` runs, whole call including
building the coarse OpGraph), rounds, CCR before/after (NVLink fit) and
whether the target was reached, the parallelism kept (work / critical path,
coarse over fine) and the smallest size keeping 90% of it. The target for
"height" is <= 2 s per graph.

``--cpsat-time`` (default 10 s): the recipe's exact pass (CP-SAT, 1
worker, hinted with the best rescheduled heuristic's projection) on the
coarse graph of "height" and "parallel", with the expanded plan's step time.

It also places each coarse graph of the TF models and an LSTM grid with
``--placer`` (default m-ETF; ``cpsat`` with ``--time-limit``), expands the plan
to every op and simulates it on the fine graph (2x V100 NVLink), to compare
the coarseners by the step time they allow.

Writes ``benchmarks/results/coarsen.csv``, ``coarsen_quality.csv``, ``coarsen_exact.csv`` and ``coarsen.md``.
Run ``python -m benchmarks.bench_coarsen [--target 200] [--repeat 3] [--quick] [--placer m-etf] [--out DIR]``.
"""
from __future__ import annotations

import argparse
import csv
import os
import platform
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import coarsen
from coarsen import verify
from pesto import OpGraph, simulate, v100x2_nvlink
from benchmarks.generators import layered_dag, lstm_grid, transformer_like
from solver import accepted_options, get_placer, recipes
from solver.options import SolveOptions
from solver.passes import to_graph

RESULTS = Path(__file__).resolve().parent / "results"
# (label, method, options)
VARIANTS = [("height", "height", {}), ("height/gain", "height", {"order": "gain"}),
            ("baechi", "baechi", {}), ("celeritas", "celeritas", {}), ("parallel", "parallel", {})]
FIELDS = ["graph", "ops", "edges", "method", "target", "vertices", "coarse_edges", "seconds", "rounds",
          "ccr_before", "ccr_after", "par_before", "par_after", "kept", "kept_90_at", "reached", "notes"]
# the exact-pass comparison: the coarseners it is run with
CPSAT_METHODS = ("height", "parallel")


def zoo_graphs():
    """The TF model graphs exported into benchmarks/graphs (if present)."""
    here = Path(__file__).resolve().parent / "graphs"
    return [(f"zoo:{p.name[:-len('.json.gz')]}", lambda p=p: OpGraph.from_json(p))
            for p in sorted(here.glob("*.json.gz"))]


def graphs(quick: bool):
    if quick:
        return [("layered_2k", lambda: layered_dag(2000, seed=0)),
                ("lstm_2k", lambda: lstm_grid(4, 25)),
                ("transformer_2k", lambda: transformer_like(16))]
    return [("layered_40k", lambda: layered_dag(40000, seed=0)),
            ("lstm_grid_40k", lambda: lstm_grid(20, 100)),           # 20 layers x 100 steps x 10 ops x 2
            ("transformer_40k", lambda: transformer_like(328)),      # 122 ops per block + 2
            ("layered_40k_cpu_coloc", lambda: layered_dag(40000, seed=1, cpu_only_prob=0.002,
                                                          coloc_prob=0.02))] + zoo_graphs()


def quality(target: int, placer: str, time_limit: float, quick: bool) -> list[dict]:
    """Step time of plans found on each coarse graph, expanded to every op and
    simulated on the fine graph (2x V100 NVLink, GPUs only)."""
    cl = v100x2_nvlink(with_cpu=False)
    cases = [("lstm_grid_8x30", lambda: lstm_grid(8, 30))] + ([] if quick else zoo_graphs())
    rows = []
    for gname, make in cases:
        g = make()
        row = {"graph": gname, "ops": g.num_ops, "placer": placer,
               "single_ms": round(simulate(g, cl, {o: "/GPU:0" for o in g.names}).makespan / 1000, 3)}
        for label, base, opts in VARIANTS:
            cg = coarsen.coarsen(g, target, method=base, **opts)
            fn = get_placer(placer)
            plan = fn(cg.graph, cl, **accepted_options(fn, {"time_limit": time_limit}))
            row[f"{label}_ms"] = round(simulate(g, cl, cg.expand(plan)).makespan / 1000, 3)
        rows.append(row)
        print(row, flush=True)
    return rows


def _kept_90_at(g, target, method, report):
    """The smallest vertex count keeping 90% of the parallelism: the target if
    met; else ``report.kept_at`` (method "parallel"), or "-" for the others."""
    if report.parallelism_kept >= 0.9 - 1e-9:
        return report.vertices
    return report.kept_at if report.kept_at is not None else "-"


def exact_quality(time_limit: float = 10.0, quick: bool = False) -> list[dict]:
    """The recipe's exact pass with each coarsener (2x V100 NVLink, CP-SAT
    ``time_limit`` s, 1 worker, hinted with the projection of the best
    rescheduled heuristic, as :mod:`solver.recipes` does): the incumbent's
    step time, CP-SAT's on the coarse graph, and its plan expanded to every op
    and re-ordered (the ``expand`` pass)."""
    cl = v100x2_nvlink()
    cases = [("lstm_grid_8x30", lambda: lstm_grid(8, 30))] + ([] if quick else zoo_graphs())
    rows = []
    for gname, make in cases:
        g = make()
        for m in CPSAT_METHODS:
            options = SolveOptions(time_limit=None, exact_time=time_limit, heuristic_time=5.0, workers=1,
                                   coarsen_options={"method": m})
            run_ = recipes.new_run(g, cl, ("heuristics", "reschedule", "coarsen", "exact", "status"), options,
                                    name="bench")
            recipes.run_passes(run_, ("heuristics", "reschedule", "coarsen", "exact"))
            fine = to_graph(run_, "cpsat", run_.solved, "feasible")
            rep, incumbent = run_.coarse.report, run_.plans.incumbent
            rows.append({"graph": gname, "ops": g.num_ops, "method": m, "vertices": rep.vertices,
                         "kept": round(rep.parallelism_kept, 3), "incumbent": incumbent.placer,
                         "incumbent_ms": round(incumbent.makespan / 1000, 3),
                         "hint_ms": round(simulate(g, cl, run_.coarse.expand(run_.hint)).makespan / 1000, 3),
                         "cpsat_status": run_.solved.status,
                         "cpsat_coarse_ms": round(run_.solved.makespan / 1000, 3),
                         "expanded_ms": round(fine.makespan / 1000, 3)})
            print(rows[-1], flush=True)
    return rows


def run(target: int = 200, repeat: int = 3, quick: bool = False, out: Path = RESULTS,
        placer: str | None = "m-etf", time_limit: float = 20.0, cpsat_time: float = 10.0) -> list[dict]:
    rows, traces = [], {}
    for gname, make in graphs(quick):
        g = make()
        par_before = g.total_work() / max(g.critical_path(), 1e-9)
        for method, base, opts in VARIANTS:
            best, cg = float("inf"), None
            for _ in range(repeat):
                vars(g).pop("_graph_arrays", None)  # time the cached GraphArrays build too (cold)
                t = time.perf_counter()
                cg = coarsen.coarsen(g, target, method=base, **opts)
                best = min(best, time.perf_counter() - t)
            verify(cg)  # outside the timing
            r = cg.report
            if method == "height" and not gname.startswith("zoo:"):
                traces[gname] = r.rounds
            rows.append({"graph": gname, "ops": g.num_ops, "edges": g.num_edges, "method": method,
                         "target": target, "vertices": r.vertices, "coarse_edges": r.edges,
                         "seconds": round(best, 3), "rounds": len(r.rounds),
                         "ccr_before": round(r.ccr_before, 4), "ccr_after": round(r.ccr_after, 4),
                         "par_before": round(par_before, 3),
                         "par_after": round(cg.graph.total_work() / max(cg.graph.critical_path(), 1e-9), 3),
                         "kept": round(r.parallelism_kept, 3), "kept_90_at": _kept_90_at(g, target, base, r),
                         "reached": r.reached, "notes": "; ".join(r.notes)})
            print(f"{gname:24s} {method:10s} {r.vertices:6d} vertices {r.edges:6d} edges "
                  f"{best:7.3f} s  {len(r.rounds):4d} rounds  CCR {r.ccr_before:.3f} -> {r.ccr_after:.3f}",
                  flush=True)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "coarsen.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    qrows = quality(target, placer, time_limit, quick) if placer else []
    if qrows:
        with open(out / "coarsen_quality.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(qrows[0]))
            w.writeheader()
            w.writerows(qrows)
    erows = exact_quality(cpsat_time, quick) if cpsat_time > 0 else []
    if erows:
        with open(out / "coarsen_exact.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(erows[0]))
            w.writeheader()
            w.writerows(erows)
    (out / "coarsen.md").write_text(markdown(rows, target, repeat, traces, qrows, erows))
    return rows


def markdown(rows, target, repeat, traces=None, qrows=(), erows=()) -> str:
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [
        "# Coarsening benchmark",
        "",
        f"{when}; {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; load average {load} (machine shared with other jobs: "
        f"times are pessimistic); single-threaded; seconds = best of {repeat} runs of "
        "`coarsen.coarsen(graph, target, method)` (whole call: arrays, rounds, building the coarse "
        "OpGraph). CCR = sum of transfer times (NVLink fit 40.77 µs + 2.0757e-5 µs/byte, one per "
        "distinct tensor and consumer vertex) / total compute. Parallelism = total work / critical "
        "path (compute only; an upper bound on the speed-up any placement can get). Target: "
        f"{target} vertices; goal for `height`: <= 2 s on a 40k-op graph.",
        "",
        "| graph | ops | edges | method | vertices | coarse edges | seconds | rounds | CCR before | CCR after "
        "| parallelism before | after | kept | 90% kept down to | reached |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(f"| {r['graph']} | {r['ops']} | {r['edges']} | {r['method']} | {r['vertices']} | "
                     f"{r['coarse_edges']} | {r['seconds']:.3f} | {r['rounds']} | {r['ccr_before']:.3f} | "
                     f"{r['ccr_after']:.3f} | {r['par_before']:.2f} | {r['par_after']:.2f} | "
                     f"{r['kept']:.1%} | {r['kept_90_at']} | {'yes' if r['reached'] else 'no'} |")
    big = [r for r in rows if r["method"] == "height" and r["ops"] >= 30000]
    if big:
        worst = max(big, key=lambda r: r["seconds"])
        lines += ["", f"`height` on the {len(big)} graphs of >= 30k ops: slowest {worst['seconds']:.3f} s "
                  f"({worst['graph']}); goal <= 2 s {'met' if worst['seconds'] <= 2 else 'NOT met'}; target "
                  f"reached on {sum(r['reached'] for r in big)}/{len(big)}."]
    lines.append("")
    for m in [v[0] for v in VARIANTS]:
        rs = [r for r in rows if r["method"] == m and r["ccr_before"] > 0]
        if rs:
            ratio = sum(r["ccr_after"] / r["ccr_before"] for r in rs) / len(rs)
            lines.append(f"- {m}: mean CCR after/before {ratio:.3f} over {len(rs)} graphs; target reached on "
                         f"{sum(r['reached'] for r in rs)}/{len(rs)}.")
    for m in ("height", "parallel"):
        rs = [r for r in rows if r["method"] == m]
        if rs:
            lines.append(f"- {m}: >= 90% of the parallelism kept at the target on "
                         f"{sum(r['kept'] >= 0.9 - 1e-9 for r in rs)}/{len(rs)} graphs; slowest "
                         f"{max(r['seconds'] for r in rs):.3f} s ({max(rs, key=lambda r: r['seconds'])['graph']}).")
    notes = [f"- {r['graph']} / {r['method']}: {r['notes']}" for r in rows if r["notes"]]
    lines += ["", "Methods: `height` = Pesto batch merging (Theorem 3.5 conditions, caps 12 ms / 80 ops "
              "doubling when a round stalls, sibling merges at equal height as a last resort); `baechi` = "
              "merge (u,v) if out-degree(u)=1 or in-degree(v)=1 (same rounds and caps, max 300 rounds); "
              "`celeritas` = CPD-TOPO order + Kernighan breakpoint DP (range ceil(n/target), memory "
              "limit 2x average), then adjacent fusion down to the target; `height/gain` = `height` with "
              "candidates sorted by transfer time saved minus critical-path growth (option `order=\"gain\"`)."]
    lines += ["", "`parallel` = acyclic matchings (same no-cycle conditions as `height`) whose merges keep the "
              "compute critical path <= (1 + eps) x the fine one, eps growing from 1% to 11% (= 90% of the "
              "parallelism kept), then the vertex cap (1 to 4 x work/target), then both gently; candidates by "
              "transfer time hidden minus critical-path growth. Kept = coarse / fine parallelism (work / "
              "critical path, fastest kind). \"90% kept down to\": the smallest vertex count at which the "
              "run still kept 90% (`report.kept_at`; `strict=True` stops there); \"-\": not tracked."]
    if notes:
        lines += ["", "Notes:"] + notes
    if erows:
        lines += ["", "### Exact pass: CP-SAT on each coarse graph", "",
                  "2x V100 NVLink; the recipe's passes heuristics, reschedule, coarsen (keeping the incumbent "
                  "representable), exact (CP-SAT 1 worker, hinted with the incumbent's projection), then the "
                  "expanded plan re-ordered. Step times in ms: incumbent = best rescheduled heuristic; hint = "
                  "its projection expanded and simulated; CP-SAT = on the coarse graph; expanded = CP-SAT's "
                  "plan on every op, re-ordered. The hint is simulated in its projected order, the expanded plan is "
                  "re-ordered, so expanded < hint can be the re-ordering alone: the exact pass found something "
                  "new only where expanded < incumbent (itself re-ordered).", "",
                  "| graph | ops | method | vertices | kept | incumbent | incumbent ms | hint ms | CP-SAT status "
                  "| CP-SAT coarse ms | expanded ms |",
                  "|---|---:|---|---:|---:|---|---:|---:|---|---:|---:|"]
        found = [e for e in erows if e["expanded_ms"] < min(e["hint_ms"], e["incumbent_ms"]) - 1e-3]
        lines[-2:-2] = [f"Expanded CP-SAT plan better than both its hint and the incumbent: {len(found)}/{len(erows)} "
                        "runs" + (f" ({', '.join(e['graph'] + '/' + e['method'] for e in found)})" if found else "")
                        + "; better than its hint alone: "
                        f"{sum(e['expanded_ms'] < e['hint_ms'] - 1e-3 for e in erows)}/{len(erows)}.", ""]
        for e in erows:
            lines.append(f"| {e['graph']} | {e['ops']} | {e['method']} | {e['vertices']} | {e['kept']:.1%} | "
                         f"{e['incumbent']} | {e['incumbent_ms']:.2f} | {e['hint_ms']:.2f} | {e['cpsat_status']} | "
                         f"{e['cpsat_coarse_ms']:.2f} | {e['expanded_ms']:.2f} |")
    if qrows:
        labels = [v[0] for v in VARIANTS]
        lines += ["", f"### Plan quality: {qrows[0]['placer']} on each coarse graph, expanded and simulated",
                  "", "Step time in ms on 2x V100 NVLink (GPUs only) of the plan found on the coarse graph "
                  "and replayed on the fine graph by `pesto.simulate`; single = everything on one GPU.", "",
                  "| graph | ops | single | " + " | ".join(labels) + " |",
                  "|---|---:|---:|" + "---:|" * len(labels)]
        for q in qrows:
            lines.append(f"| {q['graph']} | {q['ops']} | {q['single_ms']:.2f} | "
                         + " | ".join(f"{q[f'{lb}_ms']:.2f}" for lb in labels) + " |")
    for gname, rounds in (traces or {}).items():
        lines += ["", f"### `height` rounds on {gname}", "",
                  "| round | kind | vertices | edges | merged | cap ms | cap ops | seconds |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|"]
        for r in rounds:
            lines.append(f"| {r['round']} | {r['kind']} | {r['vertices']} | {r['edges']} | {r['merged']} | "
                         f"{r['cap_time_us'] / 1000:g} | {r['cap_ops']} | {r['seconds']:.4f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="small graphs, results in a temp dir")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--placer", default="m-etf", help="placer for the plan-quality table ('' to skip)")
    ap.add_argument("--time-limit", type=float, default=20.0, help="for --placer cpsat/mip")
    ap.add_argument("--cpsat-time", type=float, default=10.0,
                    help="CP-SAT seconds per coarse graph in the exact-pass table (0 skips it)")
    a = ap.parse_args(argv)
    out = a.out
    if out is None:
        if a.quick:
            out = Path(tempfile.mkdtemp(prefix="bench_coarsen_"))
        else:
            out = RESULTS
    run(a.target, a.repeat, a.quick, out, a.placer or None, a.time_limit, a.cpsat_time)
    print(f"wrote {out / 'coarsen.csv'} and {out / 'coarsen.md'}")


if __name__ == "__main__":
    main()
