"""pesto.solve(micro_batches=...), pesto.solve_step and the CLI's --micro-batches (issue 24, items 2, 4, 7)."""
from __future__ import annotations

import json

import pytest

import pesto
from mb_strategies import layered_step
from pesto.cli import main
from pesto.errors import BatchMarkError, MicroBatchError
from solver.parallel.pipelines import data_parallel_plan, pipeline_plan
from solver.parallel.search import micro_batch_counts

EPS = 1e-6


@pytest.fixture(scope="module")
def step():
    """A 4-layer step whose layers (1 ms forward) dwarf their activations: pipelines pay off."""
    return layered_step(4, act=100_000, t=1000.0)


@pytest.fixture(scope="module")
def cluster():
    return pesto.v100x2_nvlink()


def _baselines(graph, cluster, m, auto=True):
    """The baselines the search compares: of ``m`` slices, and the un-split data-parallel plan with ``auto``."""
    out = {"data-parallel": data_parallel_plan(graph, cluster).plan.makespan} if auto else {}
    if m > 1:
        out.update({f"{s} M={m}": pipeline_plan(graph, cluster, schedule=s, micro_batches=m).plan.makespan
                    for s in ("gpipe", "1f1b")})
        out[f"data-parallel M={m}"] = data_parallel_plan(graph, cluster, micro_batches=m).plan.makespan
    return out


def test_default_solve_is_the_plain_step(step, cluster):
    plan = pesto.solve(step, cluster=cluster, time_limit=2, workers=1, deterministic=True)
    same = pesto.solve(step, cluster=cluster, time_limit=2, workers=1, deterministic=True, micro_batches=1)
    assert set(plan.placement) == set(step.names)
    assert plan.log.graph_kind == "step" and plan.log.micro_batches == 1
    assert not {"micro_batches", "graph_kind", "steps"} & set(plan.log.to_dict())
    assert (dict(plan.placement), plan.makespan) == (dict(same.placement), same.makespan)


def test_fixed_m_never_slower_than_its_baselines(step, cluster):
    r = pesto.solve_step(step, cluster=cluster, time_limit=3, workers=1, micro_batches=4)
    assert r.micro_batches == 4 and r.strategy.micro_batches == 4   # a fixed M is honoured
    for name, ms in _baselines(step, cluster, 4, auto=False).items():
        assert r.plan.makespan <= ms + EPS, name
        assert r.steps[name] == pytest.approx(ms)
    assert r.graph_kind in ("micro-batched", "replicated")
    assert set(r.plan.placement) == set(r.graph.names)
    pesto.check_plan(r.graph, cluster, r.plan).raise_if_invalid()
    assert pesto.simulate(r.graph, cluster, r.plan).makespan == pytest.approx(r.plan.makespan)
    log = r.plan.log
    assert pesto.step_graph(step, log=log).names == r.graph.names
    assert pesto.Plan.from_json(r.plan.to_json()).log.graph_kind == r.graph_kind


def test_solve_returns_the_step_search_plan(step, cluster):
    plan = pesto.solve(step, cluster=cluster, time_limit=2, workers=1, micro_batches=2)
    assert plan.log.micro_batches in (1, 2) and plan.log.graph_kind != "step"
    assert plan.makespan <= min(plan.log.steps.values()) + EPS


def test_auto_tries_each_divisor_logs_it_and_keeps_the_best(step, cluster):
    lines = []
    r = pesto.solve_step(step, cluster=cluster, time_limit=4, workers=1, micro_batches="auto", batch_size=4,
                         progress=lines.append)
    assert {"M=1", "M=2", "M=4"} <= set(r.steps)
    assert r.plan.makespan == pytest.approx(min(r.steps.values()))
    for m in (1, 2, 4):
        assert any(line.startswith(f"micro-batches {m}: step") for line in lines)
    plain = pesto.solve(step, cluster=cluster, time_limit=2, workers=1)
    assert r.plan.makespan <= plain.makespan + EPS  # never slower than Pesto with M=1 ...
    for m in (2, 4):  # ... nor than any baseline
        for name, ms in _baselines(step, cluster, m).items():
            assert r.plan.makespan <= ms + EPS, name
    pesto.check_plan(r.graph, cluster, r.plan).raise_if_invalid()


def test_auto_counts():
    assert micro_batch_counts("auto", 32) == [1, 2, 4, 8, 16]
    assert micro_batch_counts("auto", 6) == [1, 2, 3, 6]
    assert micro_batch_counts("auto") == [1, 2, 4, 8, 16]


@pytest.mark.parametrize("kw, words", [
    ({"micro_batches": 0}, ">= 1"), ({"micro_batches": 2.0}, "float"), ({"micro_batches": "x"}, "'auto'"),
    ({"micro_batches": True}, "bool"), ({"micro_batches": 3, "batch_size": 8}, "does not divide batch_size=8"),
    ({"micro_batches": 2, "batch_size": 0}, "batch_size")])
def test_bad_micro_batches_named(step, kw, words):
    with pytest.raises(MicroBatchError, match="micro_batches|batch_size") as exc:
        pesto.solve(step, time_limit=1, **kw)
    assert words in str(exc.value)


def test_unmarked_graph_without_rule_named():
    g = pesto.OpGraph.from_edges({"a": 1.0, "b": 2.0}, [("a", "b", 8)])
    with pytest.raises(BatchMarkError, match="no rule infers"):
        pesto.solve(g, time_limit=1, micro_batches=2)


def _run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_place_check_simulate_micro_batches(tmp_path, capsys, step):
    gpath, ppath = tmp_path / "step.json", tmp_path / "plan.json"
    step.to_json(str(gpath))
    rc, out, _ = _run(capsys, "place", gpath, "--micro-batches", "2", "--time-limit", "2", "-o", ppath,
                      "--compare", "gpipe,1f1b,data-parallel")
    assert rc == 0, out
    graph_file = tmp_path / "plan.graph.json.gz"
    assert graph_file.exists() and f"pesto check {graph_file} {ppath}" in out
    assert "steps compared:" in out and "gpipe" in out
    saved = json.loads(ppath.read_text())
    assert saved["log"]["graph_kind"] in ("micro-batched", "replicated")
    rc, out, _ = _run(capsys, "check", graph_file, ppath)
    assert rc == 0 and "plan is valid" in out
    rc, out, _ = _run(capsys, "simulate", graph_file, ppath)
    assert rc == 0 and f"step {saved['makespan'] / 1000:.3f} ms" in out
    rc, out, _ = _run(capsys, "check", gpath, ppath)  # the plan is not one of the step as given
    assert rc == 1


@pytest.mark.parametrize("placer", ["gpipe", "1f1b", "data-parallel"])
def test_cli_micro_batch_placers_round_trip(tmp_path, capsys, step, placer):
    gpath, ppath = tmp_path / "step.json", tmp_path / "p.json"
    step.to_json(str(gpath))
    rc, out, _ = _run(capsys, "place", gpath, "--placer", placer, "--micro-batches", "2", "-o", ppath)
    assert rc == 0, out
    rc, out, _ = _run(capsys, "check", tmp_path / "p.graph.json.gz", ppath)
    assert rc == 0 and "plan is valid" in out


@pytest.mark.parametrize("value", ["0", "two"])
def test_cli_bad_micro_batches(tmp_path, capsys, step, value):
    gpath = tmp_path / "step.json"
    step.to_json(str(gpath))
    with pytest.raises(SystemExit) as exc:
        main(["place", str(gpath), "--micro-batches", value])
    assert exc.value.code == 2
    assert "--micro-batches" in capsys.readouterr().err


def test_a_deterministic_search_charges_its_candidates_to_the_work_clock():
    """Deterministic mode: each candidate built is charged its predicted seconds
    (``DETERMINISTIC_SECONDS_PER_OP`` per simulated op), so a small limit skips
    candidates for time, the same ones on every run (it had built every
    candidate: Transformer-6 at 10 s took 124 s of wall time)."""
    step, c = layered_step(100, act=100_000, t=1000.0), pesto.gpus(4)
    runs = [pesto.solve(step, cluster=c, micro_batches="auto", batch_size=16, time_limit=1.0, workers=1,
                        deterministic=True) for _ in range(2)]
    skipped = dict(runs[0].log.skipped)
    assert any(v.startswith("not built") for v in skipped.values()), skipped
    assert dict(runs[1].log.skipped) == skipped
    assert (dict(runs[0].placement), runs[0].makespan) == (dict(runs[1].placement), runs[1].makespan)
