"""Where data parallelism cannot fit or scale: Pesto against the baselines a user would pick (issue 30).

Run: ``python -m benchmarks.bench_parallel [--only KEY,KEY] [--time-limit S]
[--quick] [--out DIR] [--from-csv] [--keep-baselines]``. Writes ``parallel.csv`` (one line per
case) and ``parallel.md`` in ``--out`` (default ``benchmarks/results``).
Resumable: each case is written as soon as it is done, a run merges its rows
into the CSV already there (a case run again replaces its row), and
``--only`` runs the named cases (:data:`CASES` keys) only;
``--keep-baselines`` keeps the baseline columns of a case's row already in
the CSV and runs Pesto alone (the GPT baselines simulate dozens of 100k-op
plans: 7-12 min of a 2-core machine).

Cases (:data:`CASES`): GPT-1.3B and GPT-2.7B (``benchmarks/graphs``, batch
16) on ``v100x8_nvlink`` and ``hosts(4, 2, "ib_hdr")`` (8 V100-16GB); the
4-GPU PCIe rows of ``microbatch.md`` (RNNLM-4x2048, NMT-4x1024,
Transformer-6 on ``v100x4_pcie``); and the uniform-stage workload
(:func:`benchmarks.generators.uniform_stages`: ``p = 4`` identical layers,
``T_F = T_B = T_W``, weights too large for data parallelism, batch 24) at
``M = 8`` and ``M = 24`` on 4 NVLink GPUs whose memory is 1F1B's peak at that
``M`` (``1x``: "1F1B's activation memory") or that plus the activations
once more (``2x``).

Every plan is scored by the same simulator (link contention). Columns:

* ``single``: the step on one GPU (:func:`solver.practitioners.place_single`);
* the baselines of :mod:`solver.parallel.user_baselines`, each at its best
  ``M`` (divisors of the batch up to 16; the uniform cases at their ``M``): ``megatron`` (``PP x DP``, uniform layer split, 1F1B or
  interleaved, recomputation where a configuration does not fit), ``zero-dp``
  (data parallelism with ZeRO-1 sharded optimizer state), ``best-pipeline`` (every schedule of ``SCHEDULES`` with the
  cutter's stages); step and whether it fits memory;
* ``pesto``: ``pesto.solve(graph, cluster=..., micro_batches="auto",
  batch_size=B, time_limit=60, workers=1, seed=0)`` (the uniform cases: their
  fixed ``M``), its step, memory fit, wall time, its speed-up over the best
  baseline that fits, its gap to the bound: the largest of the plan's own
  ``lower_bound``, :func:`solver.parallel.bound.sample_bound` of the split
  step it places and, when the plan is a pipeline of contiguous stages
  (:func:`solver.parallel.bound.covers`: each stage's copies on a device of
  its own), :func:`solver.parallel.bound.pipeline_bound` of that split (fill,
  drain and the transfers between stages on the fastest route; valid for
  every contiguous-stage pipeline, whatever its schedule: what the search
  computes itself when it has the time). ``pipeline_ms`` (``pipeline_free_ms``)
  is that least pipeline step with (without) transfers for every
  micro-batched plan of one replica, whatever its kind: the uniform rows'
  ZB-H1 and bubble targets name it when missed (ZB-H1's formula counts no
  transfer).

The uniform cases add ``ideal`` (the step's work over ``p``, no accumulation),
ZB-H1's step ``W/p + (p-1)(T_F + T_B - T_W)`` and the accumulation the
plan's split adds per layer (none for a weight gradient it runs whole,
``plan.log.joined``, or sums in place, ``plan.log.in_place``) against one
weight-gradient op ``T_W`` of a slice.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import platform
import subprocess
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Callable

import pesto
from pesto.api import marked
from pesto.cluster import GiB, gpus, hosts, v100x4_pcie, v100x8_nvlink
from pesto.errors import PestoError
from pesto.step import split
from solver.practitioners import place_single
from solver.parallel.bound import covers, pipeline_bound, sample_bound
from solver.parallel.pipelines import pipeline_plan
from solver.parallel.user_baselines import PLANS

from .bench_microbatch import auto_split
from .generators import uniform_stages

HERE = Path(__file__).resolve().parent
OUT = HERE / "results"
BASELINES = tuple(PLANS)
#: The issue's speed-up targets over one GPU (microbatch.md's 4-GPU PCIe rows).
SPEEDUP = {"rnnlm_4x2048": 3.2, "nmt_4x1024": 2.5, "transformer_6": 3.3}
#: Pesto's speed-up the issue asks over the best Megatron-style configuration (GPT rows).
OVER_MEGATRON = 1.15
GAP = 0.10
BUBBLE = 0.01
WALL_SLACK = 1.05


@dataclass(frozen=True)
class Case:
    """One row: ``workload`` (a ``benchmarks/graphs`` name or ``uniform``) on ``cluster``."""

    key: str
    workload: str
    cluster: str
    batch: int
    micro: int = 0          # 0: "auto"; else the fixed M (uniform cases)
    memory: int = 0         # uniform cases: GPU memory as 1F1B's peak (1) or its activations twice (2)


CLUSTERS: dict[str, Callable] = {"v100x8_nvlink": lambda: v100x8_nvlink(with_cpu=False),
                                 "hosts4x2_ib_hdr": lambda: hosts(4, 2, "ib_hdr"),
                                 "v100x4_pcie": lambda: v100x4_pcie(with_cpu=False),
                                 "gpus4_nvlink": lambda: gpus(4, memory=64 * GiB),
                                 "gpus2_nvlink": lambda: gpus(2, memory=64 * GiB)}
CASES: dict[str, Case] = {c.key: c for c in (
    *(Case(f"uniform-m{m}-{x}x", "uniform", "gpus4_nvlink", 24, m, x) for x in (1, 2) for m in (8, 24)),
    Case("rnnlm_4x2048-pcie", "rnnlm_4x2048", "v100x4_pcie", 128),
    Case("nmt_4x1024-pcie", "nmt_4x1024", "v100x4_pcie", 128),
    Case("transformer_6-pcie", "transformer_6", "v100x4_pcie", 64),
    *(Case(f"{w}-{c.split('_')[0]}", w, c, 16) for w in ("gpt_1.3b", "gpt_2.7b")
      for c in ("v100x8_nvlink", "hosts4x2_ib_hdr")),
)}
#: ``--quick``: tiny uniform steps on 2 GPUs, seconds.
QUICK = {c.key: c for c in (Case("uniform-m4-1x", "uniform-small", "gpus2_nvlink", 8, 4, 1),
                            Case("uniform-m4-2x", "uniform-small", "gpus2_nvlink", 8, 4, 2))}


@dataclass
class Row:
    """One case's figures (a CSV line; times in ms)."""

    key: str
    workload: str
    cluster: str
    gpus: int
    batch: int
    micro: str
    single_ms: float = 0.0
    megatron_ms: float = 0.0
    megatron_fits: str = ""
    megatron_config: str = ""
    zero_dp_ms: float = 0.0
    zero_dp_fits: str = ""
    zero_dp_config: str = ""
    best_pipeline_ms: float = 0.0
    best_pipeline_fits: str = ""
    best_pipeline_config: str = ""
    pesto_ms: float = 0.0
    pesto_fits: str = ""
    pesto_config: str = ""
    wall_s: float = 0.0
    speedup: float = 0.0
    bound_ms: float = 0.0
    gap: float = 0.0
    ideal_ms: float = 0.0
    zb_h1_ms: float = 0.0
    accum_ms: float = 0.0
    t_w_ms: float = 0.0
    #: the plan's split step: the least step of a contiguous-stage pipeline with transfers, and with free links
    pipeline_ms: float = 0.0
    pipeline_free_ms: float = 0.0
    #: "pipeline" when the plan is such a pipeline and the gap's bound includes ``pipeline_ms``
    bound_source: str = ""
    note: str = ""
    #: every configuration each baseline tried: "megatron: CONFIG STEP ms [OOM], ...; best-pipeline: ..."
    tried: str = ""


def _graph(case: Case):
    if case.workload.startswith("uniform"):
        small = case.workload == "uniform-small"
        return uniform_stages(2 if small else 4, t=2_000.0 if small else 24_000.0, batch=case.batch,
                              act=(1 << 26) if small else (1 << 30), params=(1 << 28) if small else 400_000_000)
    return marked(pesto.OpGraph.from_json(HERE / "graphs" / f"{case.workload}.json.gz"))


def cluster_of(case: Case, graph):
    """The case's cluster; a uniform case's GPUs get the memory of its ``memory`` rule (module doc)."""
    c = CLUSTERS[case.cluster]()
    if not case.memory:
        return c
    one = pipeline_plan(graph, c, schedule="1f1b", micro_batches=case.micro, stages=len(c.gpus)).plan
    peak = max(one.peak_memory.values())
    held = max(sum(graph.op(n).persistent_bytes for n in graph.names if one.placement.get(n) == d)
               for d in c.names)
    return c.with_memory(int(held + case.memory * (peak - held)) + (1 << 20))


def _baseline(row: Row, name: str, graph, c, case: Case, say) -> None:
    field = name.replace("-", "_")
    t0 = time.perf_counter()
    try:
        r = PLANS[name](graph, c, batch_size=case.batch, micro_batches=case.micro or None)
    except PestoError as exc:
        setattr(row, f"{field}_config", f"skipped: {' '.join(str(exc).split())}"[:300])
        say(f"  {name}: skipped ({exc})")
        return
    row.tried = "; ".join(filter(None, [row.tried, f"{name}: " + ", ".join(
        f"{t.config} {t.step / 1e3:.1f} ms{'' if t.fits else ' OOM'}" if t.step is not None else f"{t.config} -"
        for t in r.tried)]))
    setattr(row, f"{field}_ms", r.plan.makespan / 1e3)
    setattr(row, f"{field}_fits", "yes" if r.fits else "no")
    setattr(row, f"{field}_config", r.config)
    say(f"  {name}: {r.plan.makespan / 1e3:.1f} ms ({r.config}, fits {r.fits}) in {time.perf_counter() - t0:.0f} s")


def _pesto(row: Row, graph, c, case: Case, time_limit: float, say) -> tuple:
    """Pesto's columns of ``row``; its split's weight-gradient rules (``plan.log.split_rule``: the ops
    it runs whole or sums in place)."""
    t0 = time.perf_counter()
    micro = case.micro or "auto"
    try:
        plan = pesto.solve(graph, cluster=c, micro_batches=micro, batch_size=case.batch, time_limit=time_limit,
                           workers=1, seed=0)
    except PestoError as exc:
        row.wall_s = time.perf_counter() - t0
        row.pesto_config = f"{type(exc).__name__} after {row.wall_s:.0f} s: {' '.join(str(exc).split())}"[:300]
        say(f"  pesto: {row.pesto_config}")
        return {}
    row.wall_s = time.perf_counter() - t0
    log = plan.log
    row.pesto_ms, row.pesto_fits = plan.makespan / 1e3, "no" if plan.status == "infeasible" else "yes"
    row.pesto_config = "; ".join((f"M={log.micro_batches} {log.graph_kind} R={log.replicas}", log.winner,
                                  *log.step_choices))
    parts = auto_split(graph, log)
    bound = sample_bound(parts, c, batch=case.batch).step
    pb = pipeline_bound(parts, c) if log.graph_kind == "micro-batched" and log.replicas == 1 else None
    if pb is not None:
        row.pipeline_ms, row.pipeline_free_ms = pb.step / 1e3, pipeline_bound(parts, c, transfers=False).step / 1e3
        if covers(parts, plan.placement, stages=len(c.gpus)):   # the plan is a pipeline of contiguous stages
            bound = max(bound, pb.step)
            row.bound_source = "pipeline"
    row.bound_ms = max(bound, plan.lower_bound or 0.0) / 1e3
    row.gap = max(0.0, (row.pesto_ms - row.bound_ms) / row.pesto_ms) if row.pesto_ms else 0.0
    say(f"  pesto: {row.pesto_ms:.1f} ms ({row.pesto_config}) in {row.wall_s:.0f} s")
    return log.split_rule


def _uniform_facts(row: Row, graph, case: Case, rules=None) -> None:
    """ideal, ZB-H1's step and the accumulation per layer (module doc) of the
    plan's split (``rules``: its weight-gradient rules, ``plan.log.split_rule``)."""
    p, m = len([op for op in graph.ops if op.phase == "weight-grad"]), case.micro
    t = max(op.compute["GPU"] for op in graph.ops if op.phase == "forward") / m
    row.ideal_ms = graph.total_work() / p / 1e3
    row.zb_h1_ms = (graph.total_work() / p + (p - 1) * (t + t - t)) / 1e3
    parts = split(graph, m, weight_grads=rules or {}).graph
    row.accum_ms = (parts.total_work() - graph.total_work()) / p / 1e3
    row.t_w_ms = t / 1e3


#: The columns of the baselines (and ``single``), kept from the CSV by ``--keep-baselines``.
BASELINE_FIELDS = ("single_ms", *(f"{b.replace('-', '_')}_{x}" for b in BASELINES for x in ("ms", "fits", "config")),
                   "tried")


def run_case(case: Case, time_limit: float, baselines=BASELINES, say=print, save=None, kept: Row | None = None) -> Row:
    """Every column of one case (module doc); ``save(row)`` after each column
    (a run stopped part way keeps what it has, its note saying so). ``kept``:
    a row of this case whose baseline columns are taken as they are
    (:data:`BASELINE_FIELDS`; ``--keep-baselines``): Pesto alone runs."""
    graph = _graph(case)
    c = cluster_of(case, graph)
    row = Row(case.key, case.workload, case.cluster, len(c.gpus), case.batch, str(case.micro or "auto"))
    if case.memory:
        row.note = f"GPU memory {c.gpus[0].memory / GiB:.2f} GiB ({case.memory}x: module doc)"
        _uniform_facts(row, graph, case)
    say(f"{case.key}: {graph.num_ops} ops on {case.cluster}", flush=True)
    if kept is not None:
        for f in BASELINE_FIELDS:
            setattr(row, f, getattr(kept, f))
        baselines = ()
    else:
        row.single_ms = place_single(graph, c).makespan / 1e3
    rules = _pesto(row, graph, c, case, time_limit, say)   # first: its wall time is the solve's alone
    if case.memory:
        _uniform_facts(row, graph, case, rules)
    note, save = row.note, save or (lambda r: None)
    for k, name in enumerate(baselines):
        row.note = f"{note}; incomplete: stopped before {', '.join(baselines[k:])} ended".lstrip("; ")
        save(row)
        _baseline(row, name, graph, c, case, say)
    row.note = note
    best = best_baseline(row)
    row.speedup = best[1] / row.pesto_ms if best and row.pesto_ms else 0.0
    return row


def best_baseline(row: Row) -> tuple[str, float] | None:
    """The fastest baseline of ``row`` that fits memory: (name, ms)."""
    have = [(b, getattr(row, f"{b.replace('-', '_')}_ms")) for b in BASELINES
            if getattr(row, f"{b.replace('-', '_')}_fits") == "yes"]
    return min(have, key=lambda x: x[1], default=None)


def not_run(case: Case, why: str) -> Row:
    """The row of a case not run, saying why."""
    return Row(case.key, case.workload, case.cluster, 0, case.batch, str(case.micro or "auto"), note=f"not run ({why})")


@dataclass(frozen=True)
class Target:
    """One target judged on one row: ``met`` True / False, or None (no figure: not run)."""

    target: str
    key: str
    met: bool | None
    figure: str
    why: str = ""


def _fits(row: Row) -> bool:
    return row.pesto_fits == "yes"


def targets(rows: list[Row], time_limit: float) -> list[Target]:
    """Issue 30's targets (its "Targets" section) on every row that ran."""
    out = []
    for r in rows:
        if not r.pesto_ms and not r.pesto_config:
            continue
        best = best_baseline(r)
        ran = bool(r.pesto_ms)
        if r.workload.startswith("gpt"):
            out.append(Target("a plan that fits memory", r.key, ran and _fits(r),
                              "fits" if ran and _fits(r) else r.pesto_config or "does not fit"))
            mega = r.megatron_ms if r.megatron_fits == "yes" else 0.0
            out.append(Target(f">= {OVER_MEGATRON}x the best Megatron-style configuration", r.key,
                              ran and bool(mega) and mega / r.pesto_ms >= OVER_MEGATRON,
                              f"{mega / r.pesto_ms:.2f}x" if ran and mega else "no Megatron plan that fits"
                              if ran else "no Pesto plan", f"megatron: {r.megatron_config}"))
        if r.workload in SPEEDUP:
            sp = r.single_ms / r.pesto_ms if ran else 0.0
            out.append(Target(f">= {SPEEDUP[r.workload]}x one GPU", r.key, sp >= SPEEDUP[r.workload],
                              f"{sp:.2f}x", f"one GPU {r.single_ms:.1f} ms over {r.gpus}: "
                              f"{r.single_ms / max(r.gpus, 1):.1f} ms; pesto {r.pesto_ms:.1f} ms ({r.pesto_config})"))
        if r.zb_h1_ms and r.note.find("(1x") >= 0:
            out.append(Target("step <= ZB-H1 at 1F1B's memory", r.key, ran and r.pesto_ms <= r.zb_h1_ms * (1 + 1e-9),
                              f"{r.pesto_ms:.1f} ms vs ZB-H1 {r.zb_h1_ms:.1f} ms", _uniform_why(r)))
        if r.zb_h1_ms and r.note.find("(2x") >= 0:
            bubble = (r.pesto_ms - r.ideal_ms) / r.pesto_ms if ran else 1.0
            out.append(Target(f"bubble <= {BUBBLE:.0%} at twice that memory", r.key, bubble <= BUBBLE,
                              f"{100 * bubble:.1f} %", _uniform_why(r)))
        if r.zb_h1_ms:
            out.append(Target("accumulation <= one weight-gradient op per layer", r.key, r.accum_ms <= r.t_w_ms,
                              f"{r.accum_ms:.1f} ms per layer vs T_W {r.t_w_ms:.1f} ms",
                              "pesto.step.split's rule per weight gradient: M - 1 sums (separate), "
                              "none when the plan runs it whole or sums it in place"))
        if ran:
            out.append(Target(f"gap <= {GAP:.0%}", r.key, r.gap <= GAP, f"{100 * r.gap:.1f} %",
                              f"bound {r.bound_ms:.1f} ms (the per-sample bound or the plan's lower_bound" + (
                                  ", or the pipeline bound with transfers: the plan is a contiguous-stage pipeline"
                                  if r.bound_source == "pipeline" else "") + ")" + (
                                  f"; no contiguous-stage pipeline of this split below {r.pipeline_ms:.1f} ms "
                                  f"with transfers (pesto's plan, not one, is {abs(r.pesto_ms / r.pipeline_ms - 1):.1%} "
                                  f"{'above' if r.pesto_ms > r.pipeline_ms else 'below'} it)"
                                  if r.bound_source != "pipeline" and r.pipeline_ms > r.bound_ms else "")))
            out.append(Target("never slower than a baseline", r.key, best is None or r.pesto_ms <= best[1] * (1 + 1e-9),
                              f"{r.pesto_ms:.1f} ms" + (f"; best baseline {best[0]} {best[1]:.1f} ms" if best else ""),
                              _config_of(r, best[0]) if best else ""))
        out.append(Target("wall within the limit", r.key, r.wall_s <= time_limit * WALL_SLACK,
                          f"{r.wall_s:.0f} s of {time_limit:g} s"))
    return out


def _config_of(r: Row, name: str) -> str:
    return f"{name}: {getattr(r, name.replace('-', '_') + '_config')}"


def _uniform_why(r: Row) -> str:
    beats = "pesto's plan, below it, is not such a pipeline; " if r.pesto_ms and r.pesto_ms < r.pipeline_ms else ""
    least = (f"no contiguous-stage pipeline of this split below {r.pipeline_ms:.1f} ms with transfers, so none "
             f"with a bubble under {100 * (r.pipeline_ms - r.ideal_ms) / r.pipeline_ms:.1f} % "
             f"({r.pipeline_free_ms:.1f} ms with free links: ZB-H1's formula counts no transfer); {beats}"
             if r.pipeline_ms else "")
    return (f"{least}ideal (work / p) {r.ideal_ms:.1f} ms; the split adds {r.accum_ms:.1f} ms of accumulation "
            f"per layer (T_W {r.t_w_ms:.1f} ms); pesto {r.pesto_config}")


def _cell(r: Row, name: str) -> str:
    f = name.replace("-", "_")
    ms, fits, config = getattr(r, f"{f}_ms"), getattr(r, f"{f}_fits"), getattr(r, f"{f}_config")
    if not ms:
        return config.split(":")[0] if config else "-"
    return f"{ms:.1f}{'' if fits == 'yes' else ' (OOM)'}"


def markdown(rows: list[Row], settings: str, time_limit: float) -> list[str]:
    """The lines of ``parallel.md``."""
    lines = ["# Where data parallelism cannot fit or scale: issue 30's table", "",
             __doc__.split("\n\n", 2)[2].strip(), "", f"Settings: {settings}. {_where()}", "",
             "## Steps (ms; OOM: does not fit memory)", "",
             "| case | GPUs | M | one GPU | megatron | zero-dp | best-pipeline | pesto | fits | wall s "
             "| vs best baseline | bound | gap | note |", "|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|"]
    for r in rows:
        if not r.gpus:
            lines.append(f"| {r.key} | | {r.micro} | | | | | | | | | | | {r.note} |")
            continue
        pesto_cell = f"{r.pesto_ms:.1f}" if r.pesto_ms else (r.pesto_config.split(":")[0] or "-")
        lines.append(f"| {r.key} | {r.gpus} | {r.micro} | {r.single_ms:.1f} | {_cell(r, 'megatron')} "
                     f"| {_cell(r, 'zero-dp')} | {_cell(r, 'best-pipeline')} | {pesto_cell} | {r.pesto_fits or '-'} "
                     f"| {r.wall_s:.0f} | {f'{r.speedup:.2f}x' if r.speedup else '-'} | {r.bound_ms:.1f} "
                     f"| {100 * r.gap:.1f} % | {r.note} |")
    lines += ["", "Configurations chosen:", ""]
    for r in (r for r in rows if r.gpus):
        lines.append(f"- **{r.key}**: megatron {r.megatron_config or '-'}; zero-dp {r.zero_dp_config or '-'}; "
                     f"best-pipeline {r.best_pipeline_config or '-'}; pesto {r.pesto_config or '-'}")
    lines += ["", "Every configuration the baselines tried (OOM: does not fit memory):", ""]
    lines += [f"- **{r.key}**: {r.tried}" for r in rows if r.tried]
    ts = targets(rows, time_limit)
    judged = [t for t in ts if t.met is not None]
    lines += ["", "## Targets (computed from the rows above)", "", f"{sum(bool(t.met) for t in judged)} of "
              f"{len(judged)} met; cases not run are not judged.", "",
              "| target | case | figure | | the figure that explains a miss |", "|---|---|---|---|---|"]
    lines += [f"| {t.target} | {t.key} | {t.figure} | {'met' if t.met else '**not met**'} "
              f"| {'' if t.met else t.why} |" for t in ts]
    return lines


def _where() -> str:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = "?"
    return (f"Machine: {platform.machine()}, {platform.processor() or 'cpu'}, Python {platform.python_version()}, "
            f"commit {commit}, {datetime.date.today().isoformat()}.")


def write(rows: list[Row], out: Path, settings: str, time_limit: float) -> Path:
    """``parallel.csv`` and ``parallel.md`` in ``out`` (rows in :data:`CASES` order)."""
    out.mkdir(parents=True, exist_ok=True)
    order = {k: i for i, k in enumerate([*QUICK, *CASES])}
    rows = sorted(rows, key=lambda r: order.get(r.key, len(order)))
    with open(out / "parallel.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[x.name for x in fields(Row)])
        w.writeheader()
        for r in rows:
            w.writerow({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.__dict__.items()})
    md = out / "parallel.md"
    md.write_text("\n".join(markdown(rows, settings, time_limit)) + "\n")
    return md


def read(out: Path) -> list[Row]:
    """The rows of ``out/parallel.csv`` (none when it does not exist)."""
    path = out / "parallel.csv"
    if not path.exists():
        return []
    conv = {"int": int, "float": float, "str": str}
    types = {f.name: f.type for f in fields(Row)}
    with open(path) as f:
        return [Row(**{k: conv[types[k]](v) for k, v in d.items() if k in types}) for d in csv.DictReader(f)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated case keys (default every case): " + ",".join(CASES))
    ap.add_argument("--skip", default="", help="KEY=REASON;...: cases recorded as 'not run (REASON)'")
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per pesto.solve (the issue's 60)")
    ap.add_argument("--quick", action="store_true", help="two tiny uniform cases on 2 GPUs, 3 s solves")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--from-csv", action="store_true", help="rewrite parallel.md from --out's CSV (no run)")
    ap.add_argument("--keep-baselines", action="store_true",
                    help="keep the baseline columns of a case's row already in the CSV (Pesto alone runs)")
    ap.add_argument("--settings", default="", help="the settings line (default: this run's)")
    a = ap.parse_args(argv)
    cases = QUICK if a.quick else CASES
    if a.quick:
        a.time_limit = 3.0
    out = Path(a.out)
    settings = a.settings or (f"pesto.solve time_limit={a.time_limit:g} s, workers=1, seed=0; baselines at their "
                              f"best M (divisors of the batch up to 16; uniform cases at their M)")
    rows = {r.key: r for r in read(out)}
    if a.from_csv:
        write(list(rows.values()), out, settings, a.time_limit)
        return 0
    for item in filter(None, a.skip.split(";")):
        key, _, why = item.partition("=")
        if key not in cases:
            ap.error(f"--skip: unknown case {key!r}; known: {list(cases)}")
        rows[key] = not_run(cases[key], why or "skipped")
    todo = [k for k in (a.only.split(",") if a.only is not None else cases) if k]
    unknown = [k for k in todo if k not in cases]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; known: {list(cases)}")
    for key in todo:
        kept = rows.get(key) if a.keep_baselines and key in rows and rows[key].megatron_config else None
        rows[key] = run_case(cases[key], a.time_limit, kept=kept,
                             save=lambda r: write([*(x for k, x in rows.items() if k != r.key), r], out, settings,
                                                  a.time_limit))
    md = write(list(rows.values()), out, settings, a.time_limit)
    print(f"bench_parallel: {len(todo)} case(s) run, {len(rows)} rows in {md}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
