"""The benchmark harness: the quick run end to end, honest reporting, failure handling."""
from __future__ import annotations

import csv
import time

import pytest

from benchmarks import placement, run_all
from benchmarks.make_graphs import WORKLOADS, by_key, standin_graph


def _row(workload, cluster, placer, step, **kw):
    r = {"workload": workload, "label": workload.upper(), "source": "synthetic", "ops": 10, "edges": 9,
         "cluster": cluster, "placer": placer, "placer_label": placement.LABEL[placer],
         "status": "heuristic", "step_ms": step, "wall_s": 0.1, "oom": False, "valid": True}
    r.update(kw)
    return r


def test_run_all_quick_end_to_end(tmp_path):
    rc = run_all.main(["--quick", "--out", str(tmp_path)])
    assert rc == 0
    with open(tmp_path / "placement.csv") as f:
        rows = list(csv.DictReader(f))
    got = {(r["workload"], r["cluster"], r["placer"]) for r in rows}
    for w in ("quick_lstm", "quick_transformer"):
        for p, _ in placement.PLACERS:
            assert (w, "v100x2_nvlink", p) in got
            assert ((w, "v100x4_pcie", p) in got) == (p != "mip")  # the paper's MIP is 2-GPU only
    for r in rows:
        assert r["status"] not in ("error", "timeout", "unavailable"), r
        assert r["valid"] == "True", r
        assert float(r["step_ms"]) > 0
    expert = {(r["workload"], r["cluster"]): r for r in rows if r["placer"] == "expert"}
    assert all(abs(float(r["ratio_expert"]) - 1.0) < 1e-9 for r in expert.values())
    md = (tmp_path / "placement.md").read_text()
    assert "Where Pesto loses" in md and "Machine:" in md and "Pesto CP-SAT" in md
    assert (tmp_path / "placement.png").stat().st_size > 5000


def test_ratios_use_best_baseline_that_fits_memory():
    rows = [_row("w", "c", "expert", 10.0), _row("w", "c", "m-etf", 8.0),
            _row("w", "c", "single", 5.0, oom=True), _row("w", "c", "cpsat", 9.0)]
    placement.add_ratios(rows)
    c = rows[-1]
    assert c["best_baseline"] == "m-etf"  # the OOM single-device plan does not count
    assert c["ratio_best_baseline"] == pytest.approx(9.0 / 8.0)
    assert c["ratio_expert"] == pytest.approx(0.9)


def test_losses_are_reported_honestly():
    s = placement.Settings()
    rows = [_row("rnnlm_2x2048", "v100x2_nvlink", "expert", 10.0),
            _row("rnnlm_2x2048", "v100x2_nvlink", "m-etf", 8.0),
            _row("rnnlm_2x2048", "v100x2_nvlink", "cpsat", 9.0, gap=0.2),
            _row("nmt_4x1024", "v100x2_nvlink", "expert", 10.0),
            _row("nmt_4x1024", "v100x2_nvlink", "cpsat", 8.0, wall_s=75.0, oom=True, oom_devices="/GPU:1")]
    placement.add_ratios(rows)
    text = "\n".join(placement.losses(rows, s))
    assert "12.5% slower than the best baseline (m-ETF)" in text
    assert "only 10.0% faster than Expert" in text
    assert "gap to the lower bound 20.0%" in text
    assert "the solve took 75 s" in text
    assert "exceeds device memory (/GPU:1)" in text
    md = placement.markdown(rows, s, 60.0)
    assert "| RNNLM_2X2048 |" in md and "+12.5% (m-ETF)" in md


def test_no_loss_says_so():
    rows = [_row("w", "c", "expert", 10.0), _row("w", "c", "cpsat", 8.0)]
    placement.add_ratios(rows)
    assert placement.losses(rows, placement.Settings())[0].startswith("nowhere")


def test_failing_and_hanging_placers_are_recorded(monkeypatch):
    from pesto import v100x2_nvlink
    from benchmarks import generators as rg

    g, c = rg.random_dag(8, seed=1), v100x2_nvlink(with_cpu=False)

    def boom(*a, **k):
        raise RuntimeError("kaput")
    monkeypatch.setattr(placement, "_place", boom)  # the forked child inherits the patch
    r = placement.run_instance(g, c, "m-etf", placement.Settings(), 1.0, timeout=30)
    assert r["status"] == "error" and "kaput" in r["error"]

    monkeypatch.setattr(placement, "_place", lambda *a, **k: time.sleep(60))
    t0 = time.perf_counter()
    r = placement.run_instance(g, c, "m-etf", placement.Settings(), 1.0, timeout=1.5)
    assert r["status"] == "timeout"
    assert time.perf_counter() - t0 < 30


def test_workloads_cover_the_paper_models_and_standins_build():
    keys = {w.key for w in WORKLOADS}
    assert {"rnnlm_2x2048", "rnnlm_4x2048", "rnnlm_16x1024", "nmt_2x1024", "nmt_4x1024"} <= keys
    assert any(w.model == "transformer" for w in WORKLOADS) and any(w.model == "nasnet" for w in WORKLOADS)
    g = standin_graph(by_key("transformer_6"))
    assert g.num_ops > 100 and g.name == "transformer_6-standin"
    with pytest.raises(KeyError, match="bogus"):
        by_key("bogus")


def test_csv_round_trip_rebuilds_the_same_report(tmp_path):
    s = placement.Settings()
    rows = [_row("nmt_2x1024", "v100x2_nvlink", "expert", 10.0, gap=None),
            _row("nmt_2x1024", "v100x2_nvlink", "cpsat", 9.5, gap=0.3, bound_ms=6.65, winner="cpsat"),
            _row("nmt_2x1024", "v100x2_nvlink", "mip", None, status="timeout", error="no result\nwithin 5 s")]
    placement.add_ratios(rows)
    placement.write_csv(rows, tmp_path / "placement.csv")
    back = placement.rows_from_csv(tmp_path / "placement.csv")
    assert placement.markdown(back, s, 1.0) == placement.markdown(rows, s, 1.0)
    assert "no result within 5 s" in placement.markdown(back, s, 1.0)  # one line, no raw newline
    assert placement.main(["--from-csv", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "placement.png").exists()


def test_readme_table_is_rewritten_between_markers(tmp_path):
    from benchmarks.readme import END, START, update_readme

    rows = [
        ("expert", "Expert", "100.0", "False"), ("m-etf", "m-ETF", "90.0", "False"),
        ("single", "Single", "50.0", "True"),  # OOM: never the best baseline
        ("cpsat", "Pesto CP-SAT", "81.0", "False"),
    ]
    head = "workload,label,ops,cluster,placer,placer_label,step_ms,oom,valid,bound_ms,gap,wall_s\n"
    body = "".join(f"w,W-1,10,c2,{p},{l},{ms},{oom},True,80.0,0.0123,3.5\n" for p, l, ms, oom in rows)
    (tmp_path / "placement.csv").write_text(head + body)
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{START}\nold table\n{END}\nafter\n")
    assert update_readme(tmp_path, readme)
    text = readme.read_text()
    assert "old table" not in text and text.startswith("intro\n") and text.endswith("after\n")
    line = next(l for l in text.splitlines() if l.startswith("| W-1"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3:8] == ["100.00", "90.00 (m-ETF)", "81.00", "-19.0%", "-10.0%"]
    assert cells[8] == "80.00 / 1.2%"
    readme.write_text("no markers")
    assert not update_readme(tmp_path, readme) and readme.read_text() == "no markers"


def test_expert_bench_shows_the_rule_and_your_placement(tmp_path):
    """``make bench PLACEMENT=workload=file.json``: expert.md gets a 'yours'
    column, scored by pesto.evaluate, beside Expert's rule."""
    import json

    import pesto
    from benchmarks import bench_expert
    from benchmarks.make_graphs import load
    from pesto.cluster import preset

    w = by_key("transformer_6")
    if not w.path.exists():
        pytest.skip("cached graph missing")
    graph, _ = load(w)
    mine = {name: "/job:localhost/replica:0/task:0/device:GPU:1" for name in graph.names}  # TF device strings
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(mine))
    r = bench_expert.row(w.key, graph, "v100x2_nvlink", str(path))
    assert r["rule"] in ("layers", "scopes", "paper")
    assert r["yours_ms"] == round(pesto.evaluate(graph, mine, cluster=preset("v100x2_nvlink")).makespan / 1e3, 2)
    bench_expert.write([r], tmp_path)
    md = (tmp_path / "expert.md").read_text()
    assert "| yours |" in md and f"| {r['rule']} |" in md and f" {r['yours_ms']} |" in md
    bench_expert.write([dict(r, yours_ms=None)], tmp_path)
    assert "yours" not in (tmp_path / "expert.md").read_text()  # no column when none is given


def test_run_all_passes_your_placement_to_the_expert_bench(monkeypatch):
    calls = []
    monkeypatch.setattr(run_all, "_call_main", lambda name, args=None: calls.append((name, args)) or 0)
    assert run_all.main(["--only", "bench_expert,bench_bound", "--placement", "nmt_2x1024=mine.json"]) == 0
    assert calls == [("bench_expert", ["--placement", "nmt_2x1024=mine.json"]), ("bench_bound", [])]


def test_readme_table_names_experts_rule():
    from benchmarks.readme import table

    rows = [_row("w", "c", "expert", "10.0", rule="scopes"), _row("w", "c", "cpsat", "8.0")]
    assert "| 10.00 (scopes) |" in table(rows)
    assert "(scopes)" in placement._cell(dict(rows[0], step_ms=10.0))


def test_tf_bench_summary_reports_the_factor_and_both_error_counts():
    import argparse

    from benchmarks import bench_tf

    def row(model, placement, pred, meas, err, anchored, factor):
        return dict(model=model, preset="demo", placement=placement, ops=10,
                    devices_used=1 if placement.startswith("TF") else 2, predicted_ms=pred,
                    measured_ms=meas, error_pct=err, anchored_error_pct=anchored, measured_spread_ms=0.1,
                    cores_used=1.5, busy_cores=0.0, parallel_factor=factor, transfers=40 if placement == "expert"
                    else 400, slowdown=float("nan") if placement.startswith("TF") else 1.15)

    rows = [row("rnnlm", "m-etf", 10.0, 10.5, 5.0, 0.0, 1.25), row("rnnlm", "pesto", 9.0, 10.8, 20.0, 3.0, 1.25),
            row("nmt", "m-etf", 20.0, 19.0, -5.0, 0.0, 1.1), row("nmt", "pesto", 18.0, 21.6, 20.0, 12.0, 1.1),
            row("nmt", "TF default (own threads)", float("nan"), 15.0, float("nan"), float("nan"), 1.1)]
    assert bench_tf._factors(rows) == [("rnnlm/demo", 1.25), ("nmt/demo", 1.1)]
    a = argparse.Namespace(preset="demo", rounds=3, steps=20)
    text = "\n".join(bench_tf._summary(rows, a, 0.0, 0.0))
    assert "rnnlm/demo x 1.25, nmt/demo x 1.10; in the rounds themselves m-ETF's plan ran x 1.15, x 1.15" in text
    assert "2/4 within the 10% target" in text  # the two m-ETF rows at 5 %, the two Pesto rows at 20 %
    assert "1/2 within 10%" in text  # anchored: m-ETF left out, Pesto at 3 % and 12 %
    assert "| rnnlm/demo | pesto | 10 | 2 | 400 | 9.000 | 10.800 | +20.0 | +3.0 | 1.15 |" in text
    assert "rnnlm/demo pesto x 1.15 (400 transfers, 1.50 cores)" in text
    assert "TF default (own threads) x" not in text  # one device: no slowdown to report
