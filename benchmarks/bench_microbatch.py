"""Micro-batches and data parallelism on the zoo graphs: issue 24's target table.

Run: ``python -m benchmarks.bench_microbatch [--quick] [--time-limit S]
[--workloads a,b] [--clusters a,b] [--micro 2,4,8] [--out DIR]``.
Writes ``microbatch.csv`` (the rows), ``microbatch_steps.csv`` (every
candidate step ``pesto.solve(micro_batches="auto")`` logged) and
``microbatch.md`` (:mod:`benchmarks.microbatch_report`) in ``--out``
(default ``benchmarks/results``).

For each cached zoo graph (``benchmarks/graphs``, grappler's V100 costs) and
cluster (``v100x2_nvlink``, ``v100x4_pcie``, ``hosts(4, 2, "ib_hdr")``; GPUs
only), every plan is scored by the same simulator (link contention):

* ``single``: the step on one GPU; ``pesto M=1``: ``pesto.solve`` on the step;
* ``data-parallel``: one replica per GPU, ring all-reduce (``pesto.step.replicate``);
* ``gpipe`` / ``1f1b``: the best of ``M`` in ``--micro``
  (``solver.parallel.pipelines.pipeline_plan`` with its default stage
  splits; ``pesto auto`` screens with fewer, so its logged ``gpipe M=k`` steps
  are not reused); the steps of every ``M`` in the note;
* ``pesto auto``: the plan ``pesto.solve(graph, micro_batches="auto",
  batch_size=B)`` returned, as it is (its M, graph kind and replicas from its
  log); the log's ``steps`` (each candidate's step) go to the detail tables.

``B`` is the workload's batch (:func:`batch_of`). The zoo graphs carry no batch
marks: they are marked by :func:`tf_patch.marks.mark_step` (a stated
name/type rule) and split by :func:`pesto.step.split` (its stated
cost rule, compute / M with a 2 µs floor: ``slice_costs.md`` compares it with
grappler at the micro-batch size). Every plan processes the same batch, so the
speed-up over one GPU is the throughput gain and the time per sample is the
step over ``B``. The bound is :func:`solver.parallel.bound.sample_bound` of
the row's own graph (the split step, or the replicated one).
"""
from __future__ import annotations

import argparse
import csv
import json
import time
from dataclasses import dataclass, fields
from pathlib import Path

import pesto
from pesto.cluster import GiB, hosts, v100x2_nvlink, v100x4_pcie
from pesto.step import Transformed, replicate, split
from pesto.step.replication import gradient_buckets
from tf_patch.marks import mark_step
from solver.practitioners import place_single
from solver.parallel.bound import sample_bound
from solver.parallel.pipelines import data_parallel_plan, pipeline_plan
from solver.parallel.realise import with_savers
from solver.parallel.search import savers_of

from . import microbatch_report as report

HERE = Path(__file__).resolve().parent
OUT = HERE / "results"
#: The issue's workloads (the others in ``benchmarks/graphs`` can be named with --workloads).
WORKLOADS = ("keras_resnet50", "transformer_6", "rnnlm_4x2048", "nmt_4x1024")
CLUSTERS = {"v100x2_nvlink": lambda: v100x2_nvlink(with_cpu=False),
            "v100x4_pcie": lambda: v100x4_pcie(with_cpu=False),
            "hosts4x2_ib_hdr": lambda: hosts(4, 2, "ib_hdr")}
#: Batch of each zoo preset (tf_patch/zoo/*.py PRESETS) for graphs whose manifest
#: entry has no ``batch`` override (benchmarks/graphs/manifest.json).
PRESET_BATCH = {"transformer_6": 64, "rnnlm_2x2048": 128, "rnnlm_4x2048": 128, "rnnlm_16x1024": 128,
                "nmt_2x1024": 128, "nmt_4x1024": 128}
#: Seconds per op of a cached graph and GPU the rows other than the two solves
#: take (single, data-parallel, GPipe/1F1B for every M, bounds), for the
#: estimate printed up front (``pesto auto`` keeps to its limit).
SECONDS_PER_OP_GPU = 3e-3


def batch_of(name: str) -> int | None:
    """The batch of workload ``name``: its manifest override, else its zoo preset's.

    >>> batch_of("keras_resnet50"), batch_of("nmt_4x1024"), batch_of("unknown")
    (32, 128, None)
    """
    manifest = json.loads((HERE / "graphs" / "manifest.json").read_text())
    b = manifest.get(name, {}).get("overrides", {}).get("batch")
    return int(b) if b else PRESET_BATCH.get(name)


@dataclass
class Row:
    """One plan of one workload on one cluster (a CSV line)."""

    workload: str
    cluster: str
    gpus: int
    plan: str
    micro_batches: int
    kind: str
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
    #: ``pesto auto`` only: ops of the largest split step its recipe searched (the largest "M=k").
    largest_ops: int = 0


@dataclass(frozen=True)
class Step:
    """One candidate step of ``pesto auto``'s log (a line of microbatch_steps.csv)."""

    workload: str
    cluster: str
    candidate: str
    step_ms: float


@dataclass(frozen=True)
class Facts:
    """Figures of one workload on one cluster the report's readings cite (microbatch_facts.csv).

    ``grad_mb``: bytes of the weight gradients the all-reduce sums (the tensors
    batched ops hand to unbatched ones, ``pesto.step.replication.gradient_buckets``) in MB;
    ``ring_ms``: a ring all-reduce of them over the cluster's GPUs without
    contention, ``2 (N - 1)`` hops of ``1 / N`` of the bytes on the slowest
    neighbour route; ``work``: total GPU work of the step split into ``M``
    slices (:func:`pesto.step.split`'s cost rule), ``"M:ms;..."``.
    """

    workload: str
    cluster: str
    gpus: int
    grad_mb: float
    ring_ms: float
    work: str


def facts_of(name: str, cluster_name: str, cluster, one: Transformed, work: dict) -> Facts:
    """The :class:`Facts` of ``one`` (the step as a 1-slice split) on ``cluster``."""
    nbytes = sum(one.source.tensor(t).bytes for b in gradient_buckets(one.source) for t in b)
    g = [d.name for d in cluster.gpus]
    n = len(g)
    hop = max((cluster.transfer_time(g[i], g[(i + 1) % n], -(-nbytes // n)) for i in range(n)), default=0.0)
    return Facts(name, cluster_name, n, nbytes / 1e6, 2 * (n - 1) * hop / 1e3 if n > 1 else 0.0,
                 ";".join(f"{m}:{w / 1e3:.2f}" for m, w in sorted(work.items())))


def work_by_m(graph, micro) -> dict:
    """Total GPU work (µs) of ``graph`` split into each ``M`` of ``micro`` (and 1)."""
    return {1: graph.total_work(), **{m: split(graph, m).graph.total_work() for m in micro}}


def _peak(plan) -> str:
    return " / ".join(f"{v / GiB:.2f}" for _, v in sorted((plan.peak_memory or {}).items()))


@dataclass
class _Case:
    """What every row of one workload on one cluster shares."""

    name: str
    cluster_name: str
    cluster: object
    batch: int | None
    single_ms: float = 0.0

    def row(self, label, m, kind, graph, plan, parts: Transformed, wall, note="") -> Row:
        bound = sample_bound(parts, self.cluster, batch=self.batch)
        step = plan.makespan / 1e3
        gap = max(0.0, (plan.makespan - bound.step) / plan.makespan) if plan.makespan else 0.0
        return Row(self.name, self.cluster_name, len(self.cluster.gpus), label, m, kind, graph.num_ops, step,
                   plan.makespan / (self.batch or 1), self.single_ms / step if step else 0.0, _peak(plan),
                   bound.step / 1e3, gap, plan.status, wall, note)


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def auto_split(graph, log) -> Transformed:
    """The split step a ``pesto auto`` plan places, rebuilt from its log
    (``micro_batches``, ``graph_kind``, ``replicas``, ``savers``, ``joined``, ``in_place``, ``bucket_bytes``),
    for its bound: its
    ``graph`` is the plan's (:func:`pesto.step_graph`; under the copy names
    ``op@mb0`` when the plan's step is not split)."""
    saving = savers_of(log.savers or "")
    base = with_savers(graph, saving).graph
    if log.graph_kind == "replicated":   # its copies grouped per replica (the bound's rule), not composed
        return split(replicate(base, log.replicas, shard_optimizer=saving.shard_optimizer,
                               bucket_bytes=log.bucket_bytes).graph, log.micro_batches,
                     weight_grads="accumulate" if log.in_place else "separate")
    return split(base, log.micro_batches if log.graph_kind == "micro-batched" else 1, weight_grads=log.split_rule)


def rows_for(name: str, graph, cluster_name: str, a, work: dict | None = None):
    """Every plan of one workload on one cluster (module doc), auto's logged steps
    and the :class:`Facts` (``work``: :func:`work_by_m`, computed when not given)."""
    case = _Case(name, cluster_name, CLUSTERS[cluster_name](), batch_of(name))
    c, one = case.cluster, split(graph, 1)
    say = print if a.verbose else (lambda *x, **k: None)
    single, wall = _timed(lambda: place_single(graph, c))
    case.single_ms = single.makespan / 1e3
    out = [case.row("single", 1, "step", graph, single, one, wall)]
    plan, wall = _timed(lambda: pesto.solve(graph, cluster=c, time_limit=a.time_limit, workers=1, seed=0))
    out.append(case.row("pesto M=1", 1, "step", graph, plan, one, wall))
    auto, wall = _timed(lambda: pesto.solve(graph, cluster=c, time_limit=a.time_limit, workers=1, seed=0,
                                            micro_batches="auto", batch_size=case.batch))
    log = auto.log
    parts, placed = auto_split(graph, log), pesto.step_graph(graph, log=log)
    if set(placed.names) != set(auto.placement) or placed.num_ops != parts.graph.num_ops:
        raise RuntimeError(f"{name} on {cluster_name}: pesto auto's plan does not place the graph its log names "
                           f"(M={log.micro_batches}, {log.graph_kind}, replicas={log.replicas})")
    top = max(_counts(log.steps), default=1)
    same = top == log.micro_batches and log.graph_kind != "replicated"
    largest = parts.graph.num_ops if same else split(graph, top).graph.num_ops
    auto_row = case.row("pesto auto", log.micro_batches, log.graph_kind, placed, auto, parts, wall,
                        "; ".join((f"replicas {log.replicas}", f"winner {log.winner}", *log.step_choices)))
    auto_row.largest_ops = largest
    say(f"{name} {cluster_name}: single {case.single_ms:.1f} ms, auto {auto_row.step_ms:.1f} ms", flush=True)
    dp, wall = _timed(lambda: data_parallel_plan(graph, c))
    out.append(case.row("data-parallel", 1, "replicated", dp.graph, dp.plan,
                        split(replicate(graph, dp.stages).graph, 1), wall, dp.blocking))
    for schedule in ("gpipe", "1f1b"):
        out.append(_pipeline_row(case, graph, schedule, a.micro))
    steps = [Step(name, cluster_name, k, v / 1e3) for k, v in log.steps.items()]
    facts = facts_of(name, cluster_name, c, one, work if work is not None else work_by_m(graph, a.micro))
    return out + [auto_row], steps, facts


def _counts(steps) -> list[int]:
    """The slice counts of the recipe's own candidates (``"M=k"``) in a log's steps."""
    return sorted(int(k[2:]) for k in steps if k.startswith("M=") and k[2:].isdigit())


def _pipeline_row(case: _Case, graph, schedule: str, micro) -> Row:
    """GPipe or 1F1B at the best ``M`` of ``micro`` (module doc)."""
    t0 = time.perf_counter()
    step = {m: pipeline_plan(graph, case.cluster, schedule=schedule, micro_batches=m).plan.makespan
            for m in micro}
    best = min(micro, key=lambda m: step[m])
    r = pipeline_plan(graph, case.cluster, schedule=schedule, micro_batches=best)
    if r.plan.status == "infeasible":   # a step alone does not say whether it fits: pick among those that do
        for m in sorted(micro, key=lambda m: step[m]):
            other = pipeline_plan(graph, case.cluster, schedule=schedule, micro_batches=m)
            if other.plan.status != "infeasible":
                best, r = m, other
                break
    note = f"{r.stages} stages, {r.blocking}; " + ", ".join(f"M={m}: {step[m] / 1e3:.1f}" for m in micro)
    return case.row(schedule, best, "micro-batched", r.graph, r.plan, split(graph, best),
                    time.perf_counter() - t0, note)


FILES = (("microbatch.csv", Row), ("microbatch_steps.csv", Step), ("microbatch_facts.csv", Facts))


def write(rows: list[Row], steps: list[Step], facts: list[Facts], out: Path, settings: str,
          time_limit: float) -> Path:
    """The CSV files of :data:`FILES` and ``microbatch.md`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    for (fname, cls), items in zip(FILES, (rows, steps, facts)):
        with open(out / fname, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=[x.name for x in fields(cls)])
            w.writeheader()
            for r in items:
                w.writerow({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.__dict__.items()})
    md = out / "microbatch.md"
    md.write_text("\n".join(report.markdown(rows, steps, facts, settings, time_limit, __doc__)) + "\n")
    return md


def read(out: Path) -> tuple[list[Row], list[Step], list[Facts]]:
    """The rows, steps and facts of a run's CSV files in ``out``."""
    conv = {"int": int, "float": float, "str": str}

    def load(fname, cls):
        types = {f.name: f.type for f in fields(cls)}
        with open(out / fname) as f:
            return [cls(**{k: conv[types[k]](v) for k, v in d.items()}) for d in csv.DictReader(f)]
    return tuple(load(fname, cls) for fname, cls in FILES)


def estimate_s(workloads, clusters, time_limit: float) -> float:
    """Seconds a run should take: two solves per case and
    :data:`SECONDS_PER_OP_GPU` for the other rows."""
    manifest = json.loads((HERE / "graphs" / "manifest.json").read_text())
    ops = {w: manifest.get(w, {}).get("ops", 5000) for w in workloads}
    gpus = {c: len(CLUSTERS[c]().gpus) for c in clusters}
    return sum(2 * time_limit + SECONDS_PER_OP_GPU * gpus[c] * ops[w] for w in workloads for c in clusters)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--clusters", default=",".join(CLUSTERS))
    ap.add_argument("--micro", default="2,4,8", help="micro-batch counts for GPipe and 1F1B (best of them)")
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per pesto.solve (the issue's 60)")
    ap.add_argument("--quick", action="store_true", help="transformer_6 on v100x2_nvlink, M in 2,4, 3 s")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--from-csv", action="store_true", help="rewrite microbatch.md from --out's CSV files (no run)")
    ap.add_argument("--settings", default="", help="with --from-csv: the settings line of the run")
    a = ap.parse_args(argv)
    if a.quick:
        a.workloads, a.clusters, a.micro, a.time_limit = "transformer_6", "v100x2_nvlink", "2,4", 3.0
    a.micro = [int(x) for x in str(a.micro).split(",") if x]
    if a.from_csv:
        write(*read(Path(a.out)), Path(a.out), a.settings, a.time_limit)
        return 0
    workloads, clusters = a.workloads.split(","), a.clusters.split(",")
    print(f"bench_microbatch: {len(workloads)} workloads x {len(clusters)} clusters at time_limit={a.time_limit:g} s: "
          f"about {estimate_s(workloads, clusters, a.time_limit) / 60:.0f} min", flush=True)
    rows, steps, facts = [], [], []
    for name in workloads:
        graph = mark_step(pesto.OpGraph.from_json(HERE / "graphs" / f"{name}.json.gz"))
        work = work_by_m(graph, a.micro)
        for cluster_name in clusters:
            r, s, f = rows_for(name, graph, cluster_name, a, work)
            rows, steps, facts = rows + r, steps + s, facts + [f]
            md = write(rows, steps, facts, Path(a.out), _settings(a), a.time_limit)
    print(json.dumps({"rows": len(rows), "out": str(md)}))
    return 0


def _settings(a) -> str:
    return (f"pesto.solve time_limit={a.time_limit:g} s, workers=1, seed=0 (pesto M=1 and pesto auto); "
            f"GPipe/1F1B best of M in {a.micro}; "
            f"batch marks by tf_patch.marks.mark_step")


if __name__ == "__main__":
    raise SystemExit(main())
