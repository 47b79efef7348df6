"""``make bench``: run every benchmark and leave the results in ``benchmarks/results/``.

Runs :mod:`benchmarks.placement` (the placement comparison) and then, when
present, the area benchmarks ``bench_simulate``, ``bench_coarsen``,
``bench_heuristics``, ``bench_exact``, ``bench_tf``, ``bench_bound``, ... and
``bench_microbatch`` (issue 24's table, ``microbatch.md``), ``bench_parallel`` (issue 30's
table against the baselines a user would pick, ``parallel.md``) and ``bench_regression``
(the one-step placement against its recorded reference, ``regression.md``) and ``bench_schedules``
(the pipeline schedules on uniform stages, ``schedules.md``) (each a module with a
``main()``; :data:`AREA_BENCHMARKS`). ``--quick`` runs only a small placement run,
``bench_microbatch --quick`` and ``bench_parallel --quick`` into temporary directories: a CI check of the
code path, not of the figures. A full placement
run also rewrites the results table in docs/results.md (:mod:`benchmarks.readme`).

Run ``python -m benchmarks.run_all [--quick] [--out DIR]``.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import sys
import tempfile
import time

AREA_BENCHMARKS = ("bench_simulate", "bench_coarsen", "bench_heuristics", "bench_exact", "bench_tf", "bench_bound",
                   "bench_ablation", "bench_scale", "bench_expert", "bench_keras", "bench_hosts", "bench_microbatch",
                   "bench_parallel", "bench_regression", "bench_schedules")
#: The area benchmarks ``--quick`` runs too, with their arguments (a temporary
#: directory is appended as ``--out``).
QUICK = {"bench_microbatch": ["--quick"], "bench_parallel": ["--quick"]}


def _call_main(module_name: str, args: list[str] | None = None) -> int:
    """Import ``benchmarks.<module_name>`` and call its ``main`` with ``args``
    (default none; ``sys.argv`` reset so its own parser sees none of ours)."""
    mod = importlib.import_module(f"benchmarks.{module_name}")
    saved = sys.argv
    sys.argv = [f"benchmarks.{module_name}"]
    try:
        fn = mod.main
        params = inspect.signature(fn).parameters
        rc = fn(list(args or [])) if params else fn()
    except SystemExit as exc:  # scripts that call sys.exit inside main
        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved
    return int(rc or 0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="only a small placement run, into a temp dir")
    ap.add_argument("--out", help="results directory for the placement benchmark")
    ap.add_argument("--placement", nargs="*", default=[], metavar="WORKLOAD=FILE",
                    help="your placement of a workload ({op: device} JSON): a 'yours' column in expert.md")
    ap.add_argument("--only", help="comma-separated benchmarks to run (placement and/or " + ",".join(AREA_BENCHMARKS) + ")")
    a = ap.parse_args(argv)

    from . import placement

    todo = ["placement", *QUICK] if a.quick else ["placement", *AREA_BENCHMARKS]
    if a.only:
        todo = [b for b in a.only.split(",") if b]
    summary = []
    for name in todo:
        t0 = time.perf_counter()
        print(f"### {name}", flush=True)
        if name == "placement":
            pargs = (["--quick"] if a.quick else []) + (["--out", a.out] if a.out else [])
            try:
                rc = placement.main(pargs)
            except Exception as exc:
                print(f"placement failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                rc = 1
            if rc == 0 and not a.quick and not a.out:
                from pathlib import Path

                from .readme import update_readme
                root = Path(__file__).resolve().parent
                if update_readme(root / "results", root.parent / "docs" / "results.md"):
                    print("docs/results.md results table updated")
        elif importlib.util.find_spec(f"benchmarks.{name}") is None:
            summary.append((name, "absent", 0.0))
            continue
        else:
            try:
                extra = ["--placement", *a.placement] if name == "bench_expert" and a.placement else []
                if a.quick and name in QUICK:
                    extra = [*QUICK[name], "--out", a.out or tempfile.mkdtemp(prefix=f"pesto-{name}-")]
                rc = _call_main(name, extra)
            except Exception as exc:  # one broken benchmark must not stop the others
                print(f"{name} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                rc = 1
        summary.append((name, "ok" if rc == 0 else f"failed (rc={rc})", time.perf_counter() - t0))
    print("\n### summary")
    for name, status, dt in summary:
        print(f"{name:<16} {status:<16} {dt:7.1f} s")
    return 1 if any(s.startswith("failed") for _, s, _ in summary) else 0


if __name__ == "__main__":
    sys.exit(main())
