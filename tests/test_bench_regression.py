"""The one-step regression benchmark (issue 31 item 4): its verdicts, its report,
and a deterministic solve of a small RNN-like graph that beats or equals the heuristics."""
from __future__ import annotations

import csv
from dataclasses import replace

import pytest

from benchmarks import bench_regression as br


def _row(step, heur=10.0, **kw):
    r = br.Row("nmt_2x1024", "v100x4_pcie", 5108, 20.0, step, heur, 8.0, 1 - 8.0 / step, "refine",
               "lns 10.000", 1.0, "9.15")
    return replace(r, **kw)


def _ref(step, **kw):
    return {"step_ms": str(step), "time_limit": "20.0", "ortools": "9.15", **kw}


def test_verdicts():
    assert br.verdict(_row(9.0), _ref(9.0)) == "ok"
    assert br.verdict(_row(8.5), _ref(9.0)) == "ok"  # faster than the reference is no regression
    assert br.verdict(_row(9.1), _ref(9.0)) == "slower than the reference"
    assert br.verdict(_row(10.5), _ref(11.0)) == "worse than the heuristics"
    assert br.verdict(_row(9.0), None) == "no reference"
    # a reference of another time limit or OR-Tools version is not comparable
    assert br.verdict(_row(9.5), _ref(9.0, time_limit="60.0")) == "no reference"
    assert br.verdict(_row(9.5), _ref(9.0, ortools="9.8")) == "no reference"


def test_report_names_each_case_and_its_verdict(tmp_path):
    rows = [_row(9.0), _row(9.5, cluster="v100x2_nvlink")]
    refs = {("nmt_2x1024", "v100x4_pcie"): _ref(9.0), ("nmt_2x1024", "v100x2_nvlink"): _ref(9.0)}
    br.write(rows, refs, tmp_path)
    md = (tmp_path / "regression.md").read_text()
    assert "| nmt_2x1024 | v100x4_pcie |" in md and "| ok |" in md
    assert "| slower than the reference |" in md
    with open(tmp_path / "regression.csv") as f:
        got = list(csv.DictReader(f))
    assert [float(r["step_ms"]) for r in got] == [9.0, 9.5]


def test_check_fails_on_a_regression(monkeypatch, tmp_path):
    monkeypatch.setattr(br, "REFERENCE", tmp_path / "ref.csv")
    br.write([_row(9.0)], {}, tmp_path)
    (tmp_path / "regression.csv").rename(tmp_path / "ref.csv")
    monkeypatch.setattr(br, "run_case", lambda w, c, t: _row(9.2))
    args = ["--cases", "nmt_2x1024@v100x4_pcie", "--time-limit", "20", "--out", str(tmp_path / "out")]
    assert br.main(args) == 1
    assert br.main([*args, "--report-only"]) == 0
    monkeypatch.setattr(br, "run_case", lambda w, c, t: _row(9.0))
    assert br.main(args) == 0


def test_every_case_names_a_graph_and_a_preset():
    from pesto.cluster import preset
    for workload, cluster in br.CASES:
        preset(cluster)
        if not workload.startswith("lstm_grid_"):
            assert (br.HERE / "graphs" / f"{workload}.json.gz").exists(), workload


@pytest.mark.slow
def test_deterministic_solve_of_an_rnn_grid_beats_or_equals_the_heuristics():
    # 480 ops: the full recipe (above target_vertices), every pass, about 6 s of CPU
    row = br.run_case("lstm_grid_2x12", "v100x4_pcie", 1.0)
    assert row.ops == 480
    assert 0 < row.bound_ms <= row.step_ms <= row.heuristics_ms * (1 + br.TOLERANCE)
    assert br.verdict(row, None) == "no reference"
