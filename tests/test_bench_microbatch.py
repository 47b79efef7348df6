"""benchmarks.bench_microbatch: rows, bounds and the report."""
from __future__ import annotations

import argparse
import csv

import pesto
from benchmarks import bench_microbatch as bm
from mb_strategies import layered_step
from pesto.microbatch import microbatch


def test_rows_of_a_small_step_are_sound(tmp_path):
    a = argparse.Namespace(micro=[2], pesto_micro=[2], time_limit=1.0, verbose=False)
    rows = bm.rows_for("layered", layered_step(4, t=1000.0), "v100x2_nvlink", a)
    assert [(r.plan, r.micro_batches) for r in rows] == [("single", 1), ("pesto", 1), ("data-parallel", 1),
                                                         ("gpipe", 2), ("1f1b", 2), ("pesto", 2)]
    assert rows[0].speedup == 1.0
    for r in rows:
        assert r.bound_ms <= r.step_ms + 1e-9 and 0.0 <= r.gap < 1.0, r
        assert r.per_sample_us == r.step_ms * 1e3   # no batch size known for this graph: per step
    bm.write(rows, tmp_path, "test settings")
    with open(tmp_path / "microbatch.csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    back = bm.read(tmp_path / "microbatch.csv")
    assert [(r.plan, r.micro_batches, r.status) for r in back] == [(r.plan, r.micro_batches, r.status) for r in rows]
    md = (tmp_path / "microbatch.md").read_text()
    best = min(rows, key=lambda r: r.step_ms)
    assert f"| layered | v100x2_nvlink | {rows[0].step_ms:.1f} | {best.plan} | {best.micro_batches} |" in md
    assert "Settings: test settings" in md
    gp = max((r for r in rows if r.plan == "gpipe"), key=lambda r: r.speedup)
    assert f"| {gp.speedup:.2f}x [{gp.micro_batches}] |" in md


def test_pesto_exports_microbatch():
    assert pesto.microbatch is microbatch
