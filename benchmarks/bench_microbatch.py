"""Micro-batches and data parallelism on the zoo graphs (issue 24, the graph layer).

Run: ``python -m benchmarks.bench_microbatch [--quick] [--time-limit S] [--graphs a,b]
[--clusters a,b] [--micro 2,4,8] [--pesto-micro 2,4]``.
Writes ``benchmarks/results/microbatch.csv`` and ``microbatch.md``.

For each cached zoo graph (``benchmarks/graphs``, grappler's V100 costs) and
cluster (``v100x2_nvlink``, ``v100x4_pcie``, GPUs only), every plan is scored
by the same simulator (``pesto.simulate``, link contention):

* ``single``: the step on one GPU; ``pesto M=1``: ``pesto.solve`` on the step;
* ``data-parallel``: one replica per GPU, ring all-reduce (``pesto.replicate``);
* ``gpipe`` / ``1f1b`` with ``M`` micro-batches (``solver.pipeline_baselines``);
* ``pesto M=k``: ``pesto.solve`` on the micro-batched graph itself (an OpGraph
  like any other; the joint model of issue 24 step 3 is not built yet).

The zoo graphs carry no batch marks: they are marked by
:func:`pesto.training.infer_batch_marks` (a stated name/type rule) and split by
:func:`pesto.microbatch.microbatch` (its stated cost rule: compute / M with a
2 µs floor, not grappler at the micro-batch size). Every plan processes the
same batch, so the speed-up over one GPU is the throughput gain and the time
per sample is the step over the batch size. The bound is
:func:`solver.microbatch_bound.sample_bound` of the row's own graph (the
split step, or the replicated one for data parallelism).
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import platform
import subprocess
import time
from dataclasses import dataclass, fields
from pathlib import Path

import pesto
from pesto.cluster import GiB, v100x2_nvlink, v100x4_pcie
from pesto.microbatch import split_step
from pesto.replicate import replicate
from pesto.training import infer_batch_marks
from solver.baselines import place_single
from solver.microbatch_bound import sample_bound
from solver.pipeline_baselines import data_parallel_plan, pipeline_plan

HERE = Path(__file__).resolve().parent
OUT = HERE / "results"
GRAPHS = ("keras_resnet50", "transformer_6", "rnnlm_4x2048", "nmt_4x1024")
CLUSTERS = {"v100x2_nvlink": lambda: v100x2_nvlink(with_cpu=False),
            "v100x4_pcie": lambda: v100x4_pcie(with_cpu=False)}
#: Batch size of each cached graph: the zoo presets (tf_patch/zoo/*.py PRESETS) and
#: the manifest's overrides (benchmarks/graphs/manifest.json).
BATCH = {"keras_resnet50": 32, "keras_mobilenetv2": 32, "transformer_6": 64, "rnnlm_2x2048": 128,
         "rnnlm_4x2048": 128, "rnnlm_16x1024": 128, "nmt_2x1024": 128, "nmt_4x1024": 128, "nasnet_b16": 16}


NOTES = [
    "Reading the figures:",
    "",
    "- The split's cost rule divides an op's time by M (floor 2 µs) but keeps the time of an op that only "
    "sums weight-shaped partials (an RNN's AddN over time steps of a 134 MB weight gradient: ~3 ms per slice), "
    "and adds M - 1 accumulations per gradient (3 x bytes / 900 GB/s each). RNNs with large weights therefore "
    "lose with M (rnnlm_4x2048: work 215 -> 270 ms at M = 4), as naive gradient accumulation does in TensorFlow.",
    "- GPipe and 1F1B are the best of the 8 stage splits of smallest estimate (contiguous blocks of a layer or "
    "topological order); 1F1B takes about the step of GPipe or more here and needs less memory (peak columns).",
    "- \"pesto\" on the split graph is `pesto.solve` with no knowledge of slices: it coarsens the M-times larger "
    "graph to ~200 vertices and has the same time limit; the joint slice-aware model is the next step.",
    "- The bound is valid for any placement and order of the row's graph but leaves communication out, so "
    "gaps of pipelines over slow links (PCIe) are mostly transfer time it does not see.",
]


@dataclass
class Row:
    """One plan of one workload on one cluster (a CSV line)."""

    workload: str
    cluster: str
    plan: str
    micro_batches: int
    graph_ops: int
    step_ms: float
    per_sample_us: float
    speedup: float
    peak_gib: str
    bound_ms: float
    gap: float
    status: str
    wall_s: float
    note: str = ""


def _peak(plan) -> str:
    return " / ".join(f"{v / GiB:.2f}" for _, v in sorted((plan.peak_memory or {}).items()))


def _row(name, cluster_name, label, m, graph, plan, bound, single_ms, wall, note="") -> Row:
    step = plan.makespan / 1e3
    gap = max(0.0, (plan.makespan - bound.step) / plan.makespan)
    return Row(name, cluster_name, label, m, graph.num_ops, step, plan.makespan / BATCH.get(name, 1),
               single_ms / step if step else 0.0, _peak(plan), bound.step / 1e3, gap, plan.status, wall, note)


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def rows_for(name: str, graph, cluster_name: str, a) -> list[Row]:
    """Every plan of one workload on one cluster (module doc)."""
    c = CLUSTERS[cluster_name]()
    batch = BATCH.get(name)
    one = split_step(graph, 1)
    single, wall = _timed(lambda: place_single(graph, c))
    single_ms = single.makespan / 1e3
    out = [_row(name, cluster_name, "single", 1, graph, single, sample_bound(one, c, batch=batch), single_ms, wall)]
    say = print if a.verbose else (lambda *x, **k: None)
    say(f"{name} {cluster_name}: single {single_ms:.1f} ms", flush=True)
    plan, wall = _timed(lambda: pesto.solve(graph, cluster=c, time_limit=a.time_limit, workers=1, seed=0))
    out.append(_row(name, cluster_name, "pesto", 1, graph, plan, sample_bound(one, c, batch=batch), single_ms, wall))
    dp, wall = _timed(lambda: data_parallel_plan(graph, c))
    rep = split_step(replicate(graph, dp.stages).graph, 1)
    out.append(_row(name, cluster_name, "data-parallel", 1, dp.graph, dp.plan, sample_bound(rep, c, batch=batch),
                    single_ms, wall, dp.blocking))
    for m in a.micro:
        split = split_step(graph, m)
        bound = sample_bound(split, c, batch=batch)
        for schedule in ("gpipe", "1f1b"):
            r, wall = _timed(lambda: pipeline_plan(graph, c, schedule=schedule, micro_batches=m))
            out.append(_row(name, cluster_name, schedule, m, r.graph, r.plan, bound, single_ms, wall,
                            f"{r.stages} stages, {r.blocking}"))
            say(f"  {schedule} M={m}: x{out[-1].speedup:.2f}", flush=True)
        if m in a.pesto_micro:
            plan, wall = _timed(lambda: pesto.solve(split.graph, cluster=c, time_limit=a.time_limit, workers=1,
                                                    seed=0))
            out.append(_row(name, cluster_name, "pesto", m, split.graph, plan, bound, single_ms, wall,
                            f"winner {plan.log.winner}" if plan.log else ""))
            say(f"  pesto M={m}: x{out[-1].speedup:.2f}", flush=True)
    return out


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                              text=True).stdout.strip()
    except OSError:
        return "?"


def write(rows: list[Row], out: Path, settings: str) -> None:
    """``microbatch.csv`` (every row) and ``microbatch.md`` (tables and a summary)."""
    out.mkdir(parents=True, exist_ok=True)
    names = [f.name for f in fields(Row)]
    with open(out / "microbatch.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=names)
        w.writeheader()
        for r in rows:
            w.writerow({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.__dict__.items()})
    (out / "microbatch.md").write_text("\n".join(_markdown(rows, settings)) + "\n")


def _markdown(rows: list[Row], settings: str) -> list[str]:
    lines = ["# Micro-batches and data parallelism: time per sample", "", __doc__.split("\n\n", 2)[2].strip(), "",
             f"Settings: {settings}. Machine: {platform.machine()}, Python {platform.python_version()}, "
             f"commit {_commit()}, {datetime.date.today().isoformat()}.", "", "## Best plan per workload", "",
             "| workload | cluster | 1 GPU ms | best plan | M | step ms | µs / sample | speed-up | gap to its bound |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|"]
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        groups.setdefault((r.workload, r.cluster), []).append(r)
    for (w, c), rs in groups.items():
        single = next(r for r in rs if r.plan == "single")
        best = min((r for r in rs if r.status != "infeasible"), key=lambda r: r.step_ms, default=single)
        lines.append(f"| {w} | {c} | {single.step_ms:.1f} | {best.plan} | {best.micro_batches} | {best.step_ms:.1f} "
                     f"| {best.per_sample_us:.1f} | {best.speedup:.2f}x | {100 * best.gap:.1f} % |")
    lines += _speedups(groups) + ["", *NOTES]
    for (w, c), rs in groups.items():
        lines += ["", f"## {w} on {c}", "",
                  "| plan | M | ops | step ms | µs / sample | speed-up | peak GiB per device | bound ms | gap "
                  "| status | wall s | note |", "|---|---:|---:|---:|---:|---:|---|---:|---:|---|---:|---|"]
        for r in rs:
            lines.append(f"| {r.plan} | {r.micro_batches} | {r.graph_ops} | {r.step_ms:.1f} | {r.per_sample_us:.1f} "
                         f"| {r.speedup:.2f}x | {r.peak_gib} | {r.bound_ms:.1f} | {100 * r.gap:.1f} % | {r.status} "
                         f"| {r.wall_s:.1f} | {r.note} |")
    return lines


def _speedups(groups: dict) -> list[str]:
    """Speed-up over one GPU per kind of plan (the best M of each; M in brackets)."""
    kinds = [("pesto", (1,)), ("data-parallel", (1,)), ("gpipe", None), ("1f1b", None), ("pesto", None)]
    lines = ["", "## Speed-up over one GPU (best M of each kind; M in brackets)", "",
             "| workload | cluster | Pesto M=1 | data-parallel | GPipe | 1F1B | Pesto on the split graph |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for (w, c), rs in groups.items():
        cells = []
        for plan, ms in kinds:
            mine = [r for r in rs if r.plan == plan and (r.micro_batches in ms if ms else r.micro_batches > 1)]
            best = max(mine, key=lambda r: r.speedup, default=None)
            cells.append("-" if best is None else f"{best.speedup:.2f}x" + ("" if ms else f" [{best.micro_batches}]"))
        lines.append(f"| {w} | {c} | " + " | ".join(cells) + " |")
    return lines


def read(path: Path) -> list[Row]:
    """The rows of a ``microbatch.csv``."""
    types = {f.name: f.type for f in fields(Row)}
    conv = {"int": int, "float": float, "str": str}
    with open(path) as f:
        return [Row(**{k: conv[types[k]](v) for k, v in d.items()}) for d in csv.DictReader(f)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", default=",".join(GRAPHS))
    ap.add_argument("--clusters", default=",".join(CLUSTERS))
    ap.add_argument("--micro", default="2,4,8", help="micro-batch counts for GPipe and 1F1B")
    ap.add_argument("--pesto-micro", default="2,4", help="micro-batch counts pesto.solve is run on")
    ap.add_argument("--time-limit", type=float, default=15.0, help="seconds per pesto.solve")
    ap.add_argument("--quick", action="store_true", help="transformer_6 on v100x2_nvlink, M=2, 5 s")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--from-csv", help="rewrite microbatch.md from this microbatch.csv (no run)")
    ap.add_argument("--settings", default="", help="with --from-csv: the settings line of the run")
    a = ap.parse_args(argv)
    if a.from_csv:
        write(read(Path(a.from_csv)), Path(a.out), a.settings)
        return 0
    if a.quick:
        a.graphs, a.clusters, a.micro, a.pesto_micro, a.time_limit = "transformer_6", "v100x2_nvlink", "2", "2", 5.0
    a.micro = [int(x) for x in str(a.micro).split(",") if x]
    a.pesto_micro = [int(x) for x in str(a.pesto_micro).split(",") if x]
    rows = []
    for name in a.graphs.split(","):
        graph = infer_batch_marks(pesto.OpGraph.from_json(HERE / "graphs" / f"{name}.json.gz"))
        for cluster_name in a.clusters.split(","):
            rows += rows_for(name, graph, cluster_name, a)
            write(rows, Path(a.out), _settings(a))
    print(json.dumps({"rows": len(rows), "out": str(Path(a.out) / "microbatch.md")}))
    return 0


def _settings(a) -> str:
    return (f"pesto.solve time_limit={a.time_limit:g} s, workers=1, seed=0; GPipe/1F1B M in {a.micro} "
            f"(8 stage splits simulated per call), pesto on the split graph for M in {a.pesto_micro}; "
            f"batch marks by pesto.training.infer_batch_marks")


if __name__ == "__main__":
    raise SystemExit(main())
