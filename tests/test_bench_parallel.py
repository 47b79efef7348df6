"""benchmarks.bench_parallel: the quick mode, resuming by case, the targets."""
from __future__ import annotations

from dataclasses import replace

from benchmarks import bench_parallel as bp


def test_quick_mode_writes_the_table_and_resumes_by_case(tmp_path):
    assert bp.main(["--quick", "--out", str(tmp_path), "--only", "uniform-m4-1x"]) == 0
    rows = bp.read(tmp_path)
    assert [r.key for r in rows] == ["uniform-m4-1x"]
    r = rows[0]
    assert r.gpus == 2 and r.micro == "4" and r.pesto_ms > 0 and r.megatron_ms > 0 and r.best_pipeline_ms > 0
    assert r.bound_ms <= r.pesto_ms + 1e-6 and r.zb_h1_ms > r.ideal_ms > 0 and r.t_w_ms == 0.5
    assert r.zero_dp_ms > 0 or r.zero_dp_config.startswith("skipped: zero-dp")
    assert r.tried.startswith("megatron: ") and "; best-pipeline: gpipe M=4" in r.tried
    # a second run of the other case keeps the first row; --skip records a case not run
    assert bp.main(["--quick", "--out", str(tmp_path), "--only", "uniform-m4-2x"]) == 0
    assert [r.key for r in bp.read(tmp_path)] == ["uniform-m4-1x", "uniform-m4-2x"]
    md = (tmp_path / "parallel.md").read_text()
    assert "## Targets (computed from the rows above)" in md and "Settings: pesto.solve time_limit=3 s" in md
    for t in bp.targets(bp.read(tmp_path), 3.0):
        assert f"| {t.target} | {t.key} | {t.figure} |" in md
    assert bp.main(["--quick", "--out", str(tmp_path), "--only", "", "--skip", "uniform-m4-2x=too slow"]) == 0
    assert "not run (too slow)" in (tmp_path / "parallel.md").read_text()


def _row(**kw):
    base = bp.Row("gpt_1.3b-v100x8", "gpt_1.3b", "v100x8_nvlink", 8, 16, "auto", single_ms=900.0,
                  megatron_ms=120.0, megatron_fits="yes", megatron_config="1f1b PP=8 M=16 DP=1",
                  best_pipeline_ms=110.0, best_pipeline_fits="yes", pesto_ms=100.0, pesto_fits="yes",
                  wall_s=61.0, bound_ms=95.0, gap=0.05)
    return replace(base, **kw)


def test_targets_judge_the_issue_figures():
    ts = {t.target: t for t in bp.targets([_row()], 60.0)}
    assert ts["a plan that fits memory"].met
    assert ts[">= 1.15x the best Megatron-style configuration"].met and \
        ts[">= 1.15x the best Megatron-style configuration"].figure == "1.20x"
    assert ts["gap <= 10%"].met and ts["never slower than a baseline"].met and ts["wall within the limit"].met
    slow = {t.target: t for t in bp.targets([_row(pesto_ms=115.0)], 60.0)}
    assert not slow["never slower than a baseline"].met
    assert "best-pipeline" in slow["never slower than a baseline"].figure
    failed = {t.target: t for t in bp.targets([_row(pesto_ms=0.0, pesto_config="InfeasibleError after 108 s")], 60.0)}
    assert failed["a plan that fits memory"].met is False
    assert failed["a plan that fits memory"].figure.startswith("InfeasibleError")
    assert "gap <= 10%" not in failed


def test_a_case_is_saved_after_each_column():
    notes = []
    row = bp.run_case(bp.QUICK["uniform-m4-1x"], 1.0, say=lambda *a, **k: None,
                      save=lambda r: notes.append((r.note, r.pesto_ms > 0)))
    assert [n.split("incomplete: ")[1] for n, _ in notes] == [
        "stopped before megatron, zero-dp, best-pipeline ended", "stopped before zero-dp, best-pipeline ended",
        "stopped before best-pipeline ended"]
    assert all(ran for _, ran in notes) and "incomplete" not in row.note


def test_keep_baselines_runs_pesto_alone(tmp_path, monkeypatch):
    assert bp.main(["--quick", "--out", str(tmp_path), "--only", "uniform-m4-1x"]) == 0
    before = bp.read(tmp_path)[0]
    ran = []
    monkeypatch.setitem(bp.PLANS, "megatron", lambda *a, **k: ran.append("megatron"))
    assert bp.main(["--quick", "--out", str(tmp_path), "--only", "uniform-m4-1x", "--keep-baselines"]) == 0
    after = bp.read(tmp_path)[0]
    assert not ran and after.pesto_ms > 0
    assert all(getattr(after, f) == getattr(before, f) for f in bp.BASELINE_FIELDS)
    assert after.speedup > 0


def test_the_uniform_targets_name_the_least_pipeline_with_transfers():
    """A missed ZB-H1 or bubble target names the row's own least contiguous-stage
    pipeline step (``pipeline_ms``: the bound with transfers) and the bubble it forces."""
    row = replace(_row(), key="uniform-m8-1x", workload="uniform", note="GPU memory 9.00 GiB (1x: module doc)",
                  pesto_ms=89.5, ideal_ms=72.0, zb_h1_ms=81.0, pipeline_ms=89.4, pipeline_free_ms=81.0, t_w_ms=3.0)
    ts = {t.target: t for t in bp.targets([row], 60.0)}
    why = ts["step <= ZB-H1 at 1F1B's memory"].why
    assert "below 89.4 ms with transfers, so none with a bubble under 19.5 %" in why
    assert "(81.0 ms with free links" in why and "not such a pipeline" not in why
    faster = {t.target: t for t in bp.targets([replace(row, note="(2x", pesto_ms=80.0)], 60.0)}
    assert "pesto's plan, below it, is not such a pipeline" in faster["bubble <= 1% at twice that memory"].why
    assert "the pipeline bound" in {t.target: t for t in bp.targets([replace(row, bound_source="pipeline")], 60.0)}[
        "gap <= 10%"].why
    other = {t.target: t for t in bp.targets([replace(row, pesto_ms=100.0, bound_ms=80.0)], 60.0)}["gap <= 10%"]
    assert "below 89.4 ms with transfers (pesto's plan, not one, is 11.9% above it)" in other.why


def test_the_gap_charges_the_pipeline_bound_only_where_the_plan_is_such_a_pipeline(tmp_path):
    assert bp.main(["--quick", "--out", str(tmp_path), "--only", "uniform-m4-1x", "--keep-baselines"]) == 0
    r = bp.read(tmp_path)[0]
    assert r.pipeline_free_ms <= r.pipeline_ms and r.pipeline_ms > 0
    if r.bound_source == "pipeline":
        assert r.bound_ms >= r.pipeline_ms - 1e-4
    else:   # a plan of another kind: the pipeline bound may be above it, and is left out
        assert r.bound_ms <= r.pesto_ms + 1e-6
