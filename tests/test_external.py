"""A sample of the Sinnen and STG instances: pesto.solve returns the optimum.

The full sets run in ``benchmarks/bench_exact.py``; here every 13th Sinnen row
(all four processor counts appear) and a handful of STG rows, including
rand0009 at P=4 (optimum 134, above max(critical path, work/P)) and two P=2
rows that need the stronger cumulative reasoning to be proved.
"""
from __future__ import annotations

from pathlib import Path

import pytest

import pesto
from benchmarks.external import EXTERNAL, classic_cluster, read_gxl, read_stg, sinnen_optima, stg_optima

pytestmark = pytest.mark.skipif(not (EXTERNAL / "sinnen" / "optima.tsv").exists(),
                                reason="external benchmark sets not present")

SINNEN = sinnen_optima()[::13] if (EXTERNAL / "sinnen" / "optima.tsv").exists() else []
STG_PICK = {("rand0009.stg", 4), ("rand0015.stg", 2), ("rand0018.stg", 2), ("rand0051.stg", 8),
            ("rand0000.stg", 16), ("rand0033.stg", 4)}
STG = [r for r in (stg_optima() if (EXTERNAL / "stg").exists() else [])
       if (Path(r[0]).name, r[1]) in STG_PICK]


@pytest.mark.parametrize("path,procs,opt", SINNEN, ids=[f"{Path(p).stem[:40]}-P{k}" for p, k, _ in SINNEN])
def test_sinnen_optimum(path, procs, opt):
    plan = pesto.solve(read_gxl(path), cluster=classic_cluster(procs), time_limit=10, workers=1,
                       hint=None)
    assert plan.makespan == opt
    assert plan.status == "optimal" and plan.lower_bound == opt


@pytest.mark.parametrize("path,procs,low,high", STG, ids=[f"{Path(p).stem}-P{k}" for p, k, *_ in STG])
def test_stg_optimum(path, procs, low, high):
    plan = pesto.solve(read_stg(path), cluster=classic_cluster(procs), time_limit=10, workers=1, hint=None)
    assert low <= plan.makespan <= high
    assert plan.status == "optimal"


def test_readers():
    g = read_gxl(EXTERNAL / "sinnen" / "Fork_Nodes_10_CCR_0.10_WeightType_Random.gxl")
    assert g.num_ops == 10 and g.num_edges == 9
    assert g.total_work() == 499.0  # "Total sequential time" in the file
    s = read_stg(EXTERNAL / "stg" / "50" / "rand0000.stg")
    assert s.num_ops == 50 and all(e.is_control for e in s.edges)
    assert s.critical_path() == 55.0  # "CP Length" in the footer
    assert read_stg(EXTERNAL / "stg" / "50" / "rand0000.stg", drop_dummies=False).num_ops == 52
