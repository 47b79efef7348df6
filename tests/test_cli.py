"""The ``pesto`` command line: happy paths and helpful errors with exit codes."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pesto import OpGraph, Plan, check_plan, v100x4_pcie
from pesto.cli import EXIT_INFEASIBLE, EXIT_INPUT, EXIT_OK, main
from benchmarks.generators import layered_dag


@pytest.fixture
def graph_json(tmp_path):
    g = layered_dag(60, width=6, seed=3)
    path = tmp_path / "g.json"
    g.to_json(str(path))
    return g, path


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_place_heuristic_then_simulate_and_check(tmp_path, capsys, graph_json):
    g, gpath = graph_json
    plan_path = tmp_path / "plan.json"
    rc, out, _ = run(capsys, "place", gpath, "--gpus", 2, "--placer", "m-etf", "-o", plan_path)
    assert rc == EXIT_OK
    assert "/GPU:0" in out and "ms" in out
    plan = Plan.from_json(str(plan_path))
    assert set(plan.placement) == set(g.names)
    saved = json.loads(plan_path.read_text())
    assert saved["cluster"]["format"] == "pesto.cluster"  # saved for `simulate`
    assert plan.log is None  # a heuristic's plan: no solve log
    trace, gantt = tmp_path / "t.json", tmp_path / "g.png"
    rc, out, _ = run(capsys, "simulate", gpath, plan_path, "--trace", trace, "--gantt", gantt)
    assert rc == EXIT_OK
    # the replay reproduces the placer's step time
    assert f"step {plan.makespan / 1000:.3f} ms" in out
    assert json.loads(trace.read_text())["traceEvents"]
    assert gantt.stat().st_size > 1000
    rc, out, _ = run(capsys, "check", gpath, plan_path)
    assert rc == EXIT_OK and "plan is valid" in out


def test_place_cpsat_on_a_preset_cluster_file(tmp_path, capsys, graph_json):
    g, gpath = graph_json
    cpath = tmp_path / "c.json"
    v100x4_pcie(with_cpu=False).to_json(str(cpath))
    plan_path = tmp_path / "plan.json"
    rc, out, err = run(capsys, "place", gpath, "--cluster", cpath, "--time-limit", 2,
                       "--target-vertices", 20, "-o", plan_path)
    assert rc == EXIT_OK, err
    plan = Plan.from_json(str(plan_path))
    cluster = v100x4_pcie(with_cpu=False)
    assert check_plan(g, cluster, plan).ok
    assert set(plan.placement.values()) <= set(cluster.names)
    assert "cpsat" in err  # progress names the pass
    assert plan.log is not None and plan.log.winner in plan.log.candidates  # the solve log, saved
    assert f"plan from {plan.log.winner}" in out


@pytest.mark.parametrize("option, value", [("--target-vertices", 0), ("--target-vertices", -1),
                                           ("--time-limit", -5), ("--time-limit", "nan"),
                                           ("--time-limit", "abc"), ("--gpus", 0)])
def test_place_rejects_a_bad_option_naming_it(capsys, graph_json, option, value):
    _, gpath = graph_json
    with pytest.raises(SystemExit) as exc:
        main(["place", str(gpath), option, str(value)])
    err = capsys.readouterr().err
    assert exc.value.code == EXIT_INPUT and f"argument {option}" in err and str(value) in err


def test_gpus_and_cluster_that_disagree_are_refused(capsys, graph_json):
    _, gpath = graph_json
    rc, _, err = run(capsys, "place", gpath, "--gpus", 3, "--cluster", "v100x4_pcie", "--placer", "single")
    assert rc == EXIT_INPUT and "--gpus 3" in err and "4 GPUs" in err
    rc, out, _ = run(capsys, "place", gpath, "--gpus", 4, "--cluster", "v100x4_pcie", "--placer", "single")
    assert rc == EXIT_OK and "single" in out


def test_check_rejects_negative_max_violations(tmp_path, capsys):
    g = OpGraph.from_edges({"a": 1, "b": 1}, [("a", "b", 8)])
    gpath, ppath = tmp_path / "g.json", tmp_path / "p.json"
    g.to_json(str(gpath))
    Plan({"a": "/GPU:0", "b": "/GPU:0"}, {"/GPU:0": ["b", "a"]}).to_json(str(ppath))
    with pytest.raises(SystemExit) as exc:
        main(["check", str(gpath), str(ppath), "--max-violations", "-1"])
    assert exc.value.code == EXIT_INPUT and "--max-violations" in capsys.readouterr().err


def test_check_reports_a_broken_plan(tmp_path, capsys):
    g = OpGraph.from_edges({"a": 1, "b": 1}, [("a", "b", 8)])
    gpath, ppath = tmp_path / "g.json", tmp_path / "p.json"
    g.to_json(str(gpath))
    Plan({"a": "/GPU:0", "b": "/GPU:0"}, {"/GPU:0": ["b", "a"]}).to_json(str(ppath))
    rc, out, _ = run(capsys, "check", gpath, ppath)
    assert rc == EXIT_INFEASIBLE
    assert "INVALID" in out and "cycle" in out and "a" in out


def test_simulate_infers_cluster_from_devices(tmp_path, capsys):
    g = OpGraph.from_edges({"a": 10, "b": 20, "c": 30}, [("a", "b", 8), ("a", "c", 8)])
    gpath, ppath = tmp_path / "g.json", tmp_path / "p.json"
    g.to_json(str(gpath))
    Plan.from_placement(g, {"a": "/GPU:0", "b": "/GPU:0", "c": "/GPU:1"}).to_json(str(ppath))
    rc, out, _ = run(capsys, "simulate", gpath, ppath)
    assert rc == EXIT_OK
    assert "/GPU:1" in out and "step 0." in out


def test_missing_graph_file_names_it(tmp_path, capsys):
    missing = tmp_path / "nope.json"
    rc, _, err = run(capsys, "place", missing)
    assert rc == EXIT_INPUT
    assert err.startswith("pesto: error:") and "nope.json" in err and "not found" in err


def test_cyclic_graph_names_the_cycle(tmp_path, capsys):
    d = OpGraph.from_edges({"x": 1, "y": 1}, [("x", "y", 4)]).to_dict()
    d["edges"].append({"src": "y", "dst": "x", "tensors": []})
    path = tmp_path / "cyc.json"
    path.write_text(json.dumps(d))
    rc, _, err = run(capsys, "place", path, "--placer", "m-etf")
    assert rc == EXIT_INPUT
    assert "cyc.json" in err and "cycle" in err and "x" in err and "y" in err


def test_malformed_json(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    rc, _, err = run(capsys, "simulate", path, path)
    assert rc == EXIT_INPUT and "bad.json" in err and "JSON" in err


def test_unknown_placer(capsys, graph_json):
    _, gpath = graph_json
    rc, _, err = run(capsys, "place", gpath, "--placer", "magic")
    assert rc == EXIT_INPUT and "'magic'" in err and "m-etf" in err


def test_unknown_preset(capsys, graph_json):
    _, gpath = graph_json
    rc, _, err = run(capsys, "place", gpath, "--cluster", "dgx9000")
    assert rc == EXIT_INPUT and "dgx9000" in err and "v100x2_nvlink" in err


def test_unknown_model(capsys):
    rc, _, err = run(capsys, "place", "resnet5000")
    assert rc == EXIT_INPUT and "resnet5000" in err and "rnnlm" in err


def test_infeasible_memory_exit_code(tmp_path, capsys):
    g = OpGraph([__import__("pesto").Op("huge", {"GPU": 1.0}, persistent_bytes=1 << 40)], [], name="huge")
    gpath = tmp_path / "g.json"
    g.to_json(str(gpath))
    rc, _, err = run(capsys, "place", gpath, "--time-limit", 1)
    assert rc == EXIT_INFEASIBLE and "huge" in err


def test_placers_lists_the_registry(capsys):
    from solver import PLACERS
    rc, out, _ = run(capsys, "placers")
    assert rc == EXIT_OK
    for name in PLACERS:
        assert name in out
    assert "not available" not in out


def test_no_command_is_a_usage_error(capsys):
    rc, _, err = run(capsys)
    assert rc == EXIT_INPUT and "usage" in err


def test_python_m_pesto_help_documents_exit_codes():
    r = subprocess.run([sys.executable, "-m", "pesto", "place", "--help"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0
    assert "exit codes" in r.stdout and "infeasible" in r.stdout and "--time-limit" in r.stdout


@pytest.mark.tf
def test_profile_small_model(tmp_path, capsys):
    pytest.importorskip("tensorflow")
    tf_patch = pytest.importorskip("tf_patch")
    if not hasattr(tf_patch, "opgraph_for"):
        pytest.skip("tf_patch.opgraph_for not available")
    out = tmp_path / "rnnlm.json"
    rc, text, err = run(capsys, "profile", "rnnlm", "--preset", "small", "-o", out)
    assert rc == EXIT_OK, err
    g = OpGraph.from_json(str(out))
    assert g.num_ops > 10 and g.total_work("GPU") > 0
    assert str(g.num_ops) in text


def test_bench_passes_options_to_run_all(monkeypatch, capsys, tmp_path):
    from benchmarks import run_all
    seen = []
    monkeypatch.setattr(run_all, "main", lambda argv: seen.append(argv) or 0)
    rc, _, _ = run(capsys, "bench", "--quick", "--out", tmp_path)
    assert rc == EXIT_OK and seen == [["--quick", "--out", str(tmp_path)]]


def test_place_compare_prints_a_table(capsys, graph_json):
    _, gpath = graph_json
    rc, out, _ = run(capsys, "place", gpath, "--placer", "expert", "--compare", "m-etf,single")
    assert rc == EXIT_OK
    table = out.split("placer        step (ms)")[1].splitlines()[1:]
    assert [l.split()[0] for l in table] == ["expert", "m-etf", "single"]
    assert table[0].endswith("1.000x")


# -- findings: output paths are checked before any work (no solve lost at the end) --
def test_output_into_a_missing_directory_is_refused_first(tmp_path, capsys, graph_json):
    _, gpath = graph_json
    rc, out, err = run(capsys, "place", gpath, "--placer", "m-etf", "-o", tmp_path / "nodir" / "p.json")
    assert rc == EXIT_INPUT and "does not exist" in err
    assert "/GPU:0" not in out  # refused before placing


@pytest.mark.parametrize("flag, name, why", [
    ("--gantt", "x.xyz", "unknown file type"),
    ("--gantt", "nodir/x.png", "does not exist"),
    ("--trace", "nodir/t.json", "does not exist"),
])
def test_simulate_outputs_are_checked(tmp_path, capsys, graph_json, flag, name, why):
    _, gpath = graph_json
    plan_path = tmp_path / "plan.json"
    assert run(capsys, "place", gpath, "--placer", "m-etf", "-o", plan_path)[0] == EXIT_OK
    rc, out, err = run(capsys, "simulate", gpath, plan_path, flag, tmp_path / name)
    assert rc == EXIT_INPUT and why in err and "step" not in out


def _bin_packing_graph():
    # 31 weights of 1 GiB + 1 MiB output on 2 x 16 GiB: they fit all devices together (so no
    # pre-check refuses them) but at most 15 fit one device. OR-Tools 9.15's presolve raised
    # IndexError on this model; it must be an InfeasibleError naming the device.
    Op = __import__("pesto").Op
    return OpGraph([Op(f"w{i}", {"GPU": 10.0}, persistent_bytes=1 << 30, output_bytes=1 << 20)
                    for i in range(31)], [], name="bins")


def test_memory_infeasible_solve_names_device_bytes_and_ops(tmp_path, capsys):
    import pesto
    from pesto.errors import InfeasibleError
    g = _bin_packing_graph()
    with pytest.raises(InfeasibleError) as exc:
        pesto.solve(g, gpus=2, time_limit=5, workers=1)
    msg = str(exc.value)
    assert exc.value.culprit in ("/GPU:0", "/GPU:1") and exc.value.plan is not None
    assert "MiB over)" in msg and "op 'w" in msg and exc.value.culprit in msg
    gpath, ppath = tmp_path / "g.json", tmp_path / "p.json"
    g.to_json(str(gpath))
    for placer in ("cpsat", "single"):
        rc, _, err = run(capsys, "place", gpath, "--placer", placer, "--time-limit", 5, "-o", ppath)
        assert rc == EXIT_INFEASIBLE and "B over); largest there: op" in err and "no plan written" in err, placer
        assert not ppath.exists()


def test_placers_prints_one_plain_sentence_each(capsys):
    rc, out, _ = run(capsys, "placers")
    assert rc == EXIT_OK
    for line in out.splitlines():
        assert "``" not in line and ":func:" not in line, line
        assert line.rstrip().endswith((".", ")")) or "not available" in line, line


def test_summary_never_shows_a_nonzero_gap_as_zero():
    p = Plan({"a": "/GPU:0"}, {"/GPU:0": ["a"]}, makespan=1512.2, lower_bound=1512.0, status="feasible")
    assert "gap 0.0%" not in p.summary() and "gap 0.013%" in p.summary()


def test_evaluate_scores_a_placement_file(tmp_path, capsys, graph_json):
    g, gpath = graph_json
    placement = {op: f"/job:localhost/replica:0/task:0/device:GPU:{i % 2}" for i, op in enumerate(g.names)}
    ppath, out_path = tmp_path / "mine.json", tmp_path / "scored.json"
    ppath.write_text(json.dumps(placement))
    rc, out, _ = run(capsys, "evaluate", gpath, ppath, "-o", out_path)
    assert rc == EXIT_OK and "given" in out
    plan = Plan.from_json(str(out_path))
    assert set(plan.placement.values()) == {"/GPU:0", "/GPU:1"}
    ppath.write_text(json.dumps({g.names[0]: "/GPU:0"}))
    rc, _, err = run(capsys, "evaluate", gpath, ppath)
    assert rc == EXIT_INPUT and "have no device" in err  # a placement file that misses ops: bad input


def test_place_shows_progress_on_stderr_in_ms_unless_quiet(tmp_path, capsys):
    gpath = tmp_path / "chain.json"
    OpGraph.from_edges({"a": 20, "b": 30, "c": 40}, [("a", "b", 10 ** 8), ("b", "c", 10 ** 8)]).to_json(str(gpath))
    rc, out, err = run(capsys, "place", gpath, "--time-limit", 30)
    assert rc == EXIT_OK
    assert "] heuristics: done in " in err and "| incumbent 0.090 ms, bound 0.090 ms, gap 0.0%" in err
    assert "exact: skipped: stopped early: incumbent within 1e-06 of the lower bound" in err
    assert "µs" not in err and "[pesto" not in out
    rc, out, err = run(capsys, "place", gpath, "--time-limit", 30, "--quiet")
    assert rc == EXIT_OK and "[pesto" not in err
