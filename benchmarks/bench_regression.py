"""Regression check of the one-step placement: ``pesto.solve(graph, micro_batches=1)``.

Issue 31 found the default recipe slower on held-out GNMT-like RNN profiles
than on commit 67e786b, and nothing had said so: refine's final re-ordering,
once its clock had run out, tried TF's FIFO order alone, not the placed-rank
order every move was scored with, so the search's gain was lost
(``benchmarks/results/regression_ab.md``). This benchmark makes such a slip
visible: it solves the same RNN-like cases in **deterministic** mode
(``deterministic=True``: budgets in charged work, so the plan does not depend
on the machine's load), seed 0, one CP-SAT worker, and compares each step with
the committed reference (``benchmarks/results/regression_reference.csv``).

Cases (:data:`CASES`): GNMT-like seq2seq (``nmt_2x1024``, ``nmt_4x1024``) and
RNNLM (``rnnlm_4x2048``) profiles from ``benchmarks/graphs`` on 4 V100 over
PCIe and 2 over NVLink, and a generated LSTM grid
(:func:`benchmarks.generators.lstm_grid`). Each row has the step, the best
re-ordered heuristic (the reschedule pass's incumbent, which the solve must
beat or equal), the bound and gap, the winner and each search pass's step.

Run ``python -m benchmarks.bench_regression [--time-limit 20] [--cases nmt_2x1024@v100x4_pcie ...]
[--report-only] [--record]``; writes ``benchmarks/results/regression.{csv,md}`` (after every
case) and exits 1 when a case is slower than its reference by more than :data:`TOLERANCE`
or does not beat or equal the heuristics (so ``make bench`` reports it failed), unless
``--report-only``; ``--record`` makes this run the
reference (after an intended change of the figures; say why in the commit).
The reference holds for the OR-Tools version and time limit it names: another
version may move a deterministic search, so compare like with like.
"""
from __future__ import annotations

import argparse
import csv
import platform
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import pesto
from pesto.api import load_graph
from pesto.cluster import preset

from .generators import lstm_grid

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
REFERENCE = RESULTS / "regression_reference.csv"
#: (workload, cluster preset): RNN seq2seq and RNNLM graphs, the held-out graphs' kinds.
CASES = (("nmt_2x1024", "v100x4_pcie"), ("nmt_2x1024", "v100x2_nvlink"), ("nmt_4x1024", "v100x4_pcie"),
         ("rnnlm_4x2048", "v100x4_pcie"), ("lstm_grid_4x24", "v100x4_pcie"))
#: Relative slow-down of a deterministic step that counts as a regression.
TOLERANCE = 1e-6


@dataclass
class Row:
    """One case's figures (times in ms)."""

    workload: str
    cluster: str
    ops: int
    time_limit: float
    step_ms: float
    heuristics_ms: float
    bound_ms: float
    gap: float
    winner: str
    passes: str
    wall_s: float
    ortools: str


def graph_of(workload: str):
    """A graph of ``benchmarks/graphs``, or ``lstm_grid_<layers>x<steps>`` generated."""
    if workload.startswith("lstm_grid_"):
        layers, steps = map(int, workload[len("lstm_grid_"):].split("x"))
        return lstm_grid(layers, steps, seed=0)
    return load_graph(str(HERE / "graphs" / f"{workload}.json.gz"))


def run_case(workload: str, cluster: str, time_limit: float) -> Row:
    """One deterministic solve (seed 0, one worker) of ``workload`` on the ``cluster`` preset."""
    import ortools

    graph = graph_of(workload)
    t = time.perf_counter()
    plan = pesto.solve(graph, cluster=preset(cluster), time_limit=time_limit, deterministic=True, seed=0,
                       workers=1)
    wall = time.perf_counter() - t
    steps = {s.name: s.makespan for s in plan.log.passes}
    heur = steps.get("reschedule") or steps.get("heuristics")
    search = ", ".join(f"{s.name} {s.makespan / 1e3:.3f}" for s in plan.log.passes
                       if s.name in ("exact", "lns", "local search") and s.makespan is not None)
    return Row(workload, cluster, graph.num_ops, time_limit, plan.makespan / 1e3, heur / 1e3,
               plan.lower_bound / 1e3, 1.0 - plan.lower_bound / plan.makespan, plan.log.winner, search,
               round(wall, 1), ortools.__version__)


def read_rows(path: Path) -> dict[tuple[str, str], dict]:
    """(workload, cluster) -> the row of a results CSV ({} when there is none)."""
    if not path.exists():
        return {}
    with open(path, newline="") as f:
        return {(r["workload"], r["cluster"]): r for r in csv.DictReader(f)}


def verdict(row: Row, ref: dict | None) -> str:
    """"ok", "slower than the reference", "worse than the heuristics", or "no reference"."""
    if row.step_ms > row.heuristics_ms * (1 + TOLERANCE):
        return "worse than the heuristics"
    if ref is None or float(ref["time_limit"]) != row.time_limit or ref["ortools"] != row.ortools:
        return "no reference"
    return "slower than the reference" if row.step_ms > float(ref["step_ms"]) * (1 + TOLERANCE) else "ok"


def write(rows: list[Row], refs: dict, out: Path) -> None:
    """``regression.csv`` (the rows) and ``regression.md`` (with the reference and the verdict)."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "regression.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
        w.writeheader()
        w.writerows(asdict(r) for r in rows)
    lines = ["# One-step placement regression check (`python -m benchmarks.bench_regression`)", "",
             f"`pesto.solve(graph, cluster=C, time_limit={rows[0].time_limit:g}, deterministic=True, seed=0, "
             f"workers=1)`; OR-Tools {rows[0].ortools}, Python {platform.python_version()}, "
             f"{datetime.now(timezone.utc):%Y-%m-%d}. Deterministic: the figures do not depend on the "
             "machine's load (wall seconds do). *heuristics*: the best re-ordered heuristic, which the "
             "solve must beat or equal; *reference*: `regression_reference.csv`.", "",
             "| workload | cluster | ops | step ms | reference ms | heuristics ms | bound ms | gap | winner "
             "| search passes (ms) | wall s | verdict |", "|---|---|---:|---:|---:|---:|---:|---:|---|---|---:|---|"]
    for r in rows:
        ref = refs.get((r.workload, r.cluster))
        ref_ms = f"{float(ref['step_ms']):.3f}" if ref else "-"
        lines.append(f"| {r.workload} | {r.cluster} | {r.ops} | {r.step_ms:.3f} | {ref_ms} | {r.heuristics_ms:.3f} "
                     f"| {r.bound_ms:.3f} | {100 * r.gap:.1f} % | {r.winner} | {r.passes} | {r.wall_s:.0f} "
                     f"| {verdict(r, ref)} |")
    (out / "regression.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--time-limit", type=float, default=20.0, help="deterministic seconds per solve (default 20)")
    ap.add_argument("--cases", nargs="*", help="WORKLOAD@CLUSTER (default: all of CASES)")
    ap.add_argument("--out", default=str(RESULTS), help="results directory")
    ap.add_argument("--report-only", action="store_true", help="exit 0 even on a regression")
    ap.add_argument("--record", action="store_true", help="make this run the reference")
    a = ap.parse_args(argv)
    cases = [tuple(c.split("@")) for c in a.cases] if a.cases else list(CASES)
    refs, rows = read_rows(REFERENCE), []
    for workload, cluster in cases:
        rows.append(run_case(workload, cluster, a.time_limit))
        r = rows[-1]
        print(f"{workload} on {cluster}: {r.step_ms:.3f} ms ({verdict(r, refs.get((workload, cluster)))}), "
              f"heuristics {r.heuristics_ms:.3f}, bound {r.bound_ms:.3f}, {r.wall_s:.0f} s", flush=True)
        write(rows, refs, Path(a.out))
    if a.record:
        keep = {k: v for k, v in refs.items() if k not in {(r.workload, r.cluster) for r in rows}}
        with open(REFERENCE, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
            w.writeheader()
            w.writerows([*keep.values(), *(asdict(r) for r in rows)])
    bad = [r for r in rows if verdict(r, refs.get((r.workload, r.cluster))) not in ("ok", "no reference")]
    return 1 if bad and not a.report_only else 0


if __name__ == "__main__":
    raise SystemExit(main())
