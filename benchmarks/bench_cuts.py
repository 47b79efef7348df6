"""Exact stage cuts and the fill/drain bound: ResNet-50 1F1B, before and after.

Run: ``python -m benchmarks.bench_cuts [--before REV] [--out DIR]``; writes
``cuts.md`` in ``--out`` (default ``benchmarks/results``).

For ``keras_resnet50`` (``benchmarks/graphs``, grappler's V100 costs, marks by
:func:`tf_patch.marks.mark_step` as :mod:`benchmarks.bench_microbatch` does)
on ``v100x4_pcie`` (GPUs only), 1F1B at ``M = 8`` and ``16``: the step of
:func:`solver.parallel.pipelines.pipeline_plan` and its gap to the bound the
search reports for it (:func:`solver.parallel.search.winner_bound`: the per-sample
bound, and with this change the larger of that and
:func:`solver.parallel.bound.pipeline_bound`). *Before* is the same
measurement run by the code of ``--before`` (default ``1751d64``, the
cutter on 64 equal-work blocks minimising the largest stage, the bound
without fill and drain), extracted with ``git archive`` into a temporary
folder; *after* is this tree.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
COUNTS = (8, 16)


def measure() -> list[dict]:
    """The rows of the code on ``sys.path`` (module doc)."""
    import pesto
    from pesto.cluster import v100x4_pcie
    from pesto.step import split
    from tf_patch.marks import mark_step
    from solver.parallel.bound import sample_bound
    from solver.parallel.pipelines import pipeline_plan
    try:
        from solver.parallel.bound import pipeline_bound
    except ImportError:   # the code before this change
        pipeline_bound = None
    graph = mark_step(pesto.OpGraph.from_json(HERE / "graphs" / "keras_resnet50.json.gz"))
    cluster = v100x4_pcie(with_cpu=False)
    rows = []
    for m in COUNTS:
        t0 = time.perf_counter()
        r = pipeline_plan(graph, cluster, schedule="1f1b", micro_batches=m)
        wall = time.perf_counter() - t0
        s = split(graph, m)
        plain = sample_bound(s, cluster).step
        pipe = pipeline_bound(s, cluster).step if pipeline_bound else None
        rows.append({"m": m, "step": r.plan.makespan, "stages": r.stages, "blocking": r.blocking,
                     "status": r.plan.status, "wall": wall, "sample": plain, "pipeline": pipe,
                     "bound": max(plain, pipe or 0.0)})
    return rows


def run(tree: Path) -> list[dict]:
    """:func:`measure` in a child process on the code of ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree)}   # this file run as a script: its folder, then the tree
    out = subprocess.run([sys.executable, __file__, "--measure"], env=env, cwd=tree, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def markdown(before: list[dict], after: list[dict], rev: str) -> str:
    lines = ["# Exact stage cuts and the fill/drain bound (`python -m benchmarks.bench_cuts`)", "",
             __doc__.split("\n\n", 2)[2].strip(), "",
             f"Before: `{rev}`. Times in ms; gap = step / bound - 1; one run on a shared 2-core machine.", "",
             "| M | code | step | stages | blocks | per-sample bound | pipeline bound | gap | plan wall (s) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for b, a in zip(before, after):
        for label, r in (("before", b), ("after", a)):
            pipe = f"{r['pipeline'] / 1e3:.2f}" if r["pipeline"] else "-"
            lines.append(f"| {r['m']} | {label} | {r['step'] / 1e3:.2f} | {r['stages']} | {r['blocking']} | "
                         f"{r['sample'] / 1e3:.2f} | {pipe} | {r['step'] / r['bound'] - 1:.1%} | {r['wall']:.1f} |")
        lines.append(f"| {a['m']} | after / before | {a['step'] / b['step']:.3f}x | | | | | | |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="1751d64", help="the revision measured as 'before'")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.measure:
        print(json.dumps(measure()))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(HERE.parent), "archive", a.before], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        before = run(Path(tmp))
    after = run(HERE.parent)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "cuts.md").write_text(markdown(before, after, a.before))
    print((a.out / "cuts.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
