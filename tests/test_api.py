"""pesto.solve: inputs, default cluster, pre-checks, coarsening, candidates."""
from __future__ import annotations

import networkx as nx
import pytest

import pesto
from pesto.api import default_cluster, load_graph, load_placement
from pesto.cluster import gpus
from pesto.errors import InfeasibleError, InvalidGraphError, InvalidPlanError
from pesto.graph import Edge, Op, OpGraph
from pesto.plan import check_plan
from benchmarks.generators import layered_dag
from solver.bounds import chain_bound, lower_bound


def small():
    return OpGraph.from_edges({"a": 20, "b": 30, "c": 40, "d": 10},
                              [("a", "b", 1000), ("a", "c", 1000), ("b", "d", 10), ("c", "d", 10)])


def test_solve_opgraph_networkx_and_json(tmp_path):
    g = small()
    p1 = pesto.solve(g, time_limit=5, workers=1)
    path = tmp_path / "g.json"
    g.to_json(str(path))
    p2 = pesto.solve(str(path), time_limit=5, workers=1)
    nxg = nx.DiGraph()
    for n, t in {"a": 20, "b": 30, "c": 40, "d": 10}.items():
        nxg.add_node(n, time=t)
    for u, v, b in [("a", "b", 1000), ("a", "c", 1000), ("b", "d", 10), ("c", "d", 10)]:
        nxg.add_edge(u, v, bytes=b)
    p3 = pesto.solve(nxg, time_limit=5, workers=1)
    assert p1.makespan == pytest.approx(p2.makespan) == pytest.approx(p3.makespan)
    assert p1.status == "optimal" and p1.placer == "pesto"
    assert set(p1.placement) == set(g.names)
    with pytest.raises(InvalidGraphError):
        load_graph(42)


def test_default_cluster_adds_cpu_only_when_needed():
    assert default_cluster(small(), 2).names == ["/GPU:0", "/GPU:1"]
    ops = [Op("cpu_op", {"CPU": 5.0}), Op("g", {"GPU": 1.0})]
    g = OpGraph(ops, [Edge("cpu_op", "g", ())])
    assert "/CPU:0" in default_cluster(g, 2).names
    assert default_cluster(small(), 4).names == [f"/GPU:{i}" for i in range(4)]
    p = pesto.solve(g, time_limit=5, workers=1)
    assert p.placement["cpu_op"] == "/CPU:0"


def test_solve_reports_candidates_and_winner():
    g = layered_dag(40, width=6, seed=2)
    c = gpus(2)
    p = pesto.solve(g, cluster=c, time_limit=3, workers=1)
    assert p.log.winner in p.log.candidates
    assert "cpsat" in p.log.candidates
    assert p.makespan == pytest.approx(min(p.log.candidates.values()))
    assert p.log.bound == p.lower_bound and p.log.bound_source
    assert [s.name for s in p.log.passes] == ["coarsen", "heuristics", "exact", "expand", "status"]
    assert p.lower_bound <= p.makespan + 1e-6
    assert p.lower_bound >= lower_bound(g, c) - 1e-9
    check_plan(g, c, p).raise_if_invalid()


def test_solve_coarsens_and_expands():
    g = layered_dag(400, width=10, seed=4)
    c = gpus(2)
    p = pesto.solve(g, cluster=c, time_limit=3, target_vertices=60, workers=1, recipe="paper")
    assert set(p.placement) == set(g.names)
    assert p.log.recipe == "paper"
    assert p.log.vertices < 400 and "vertices" in p.log.pass_named("coarsen").note
    assert p.status != "optimal"  # optimality on the coarse graph is not claimed for the fine one
    assert "lower_bound" in p.log.coarse  # the coarse graph's, not claimed for the fine one:
    assert p.log.bound_source in ("critical path / work", "critical-path phases")
    assert p.lower_bound == pytest.approx(max(lower_bound(g, c), chain_bound(g, c)))
    check_plan(g, c, p).raise_if_invalid()


def test_full_recipe_never_loses_to_its_starts_and_uses_a_full_graph_hint():
    g = layered_dag(400, width=10, seed=4)
    c = gpus(2)
    paper = pesto.solve(g, cluster=c, time_limit=2, target_vertices=60, workers=1, recipe="paper")
    p = pesto.solve(g, cluster=c, time_limit=3, target_vertices=60, workers=1, hint=paper)
    assert p.log.recipe == "full"
    assert [s.name for s in p.log.passes] == ["heuristics", "reschedule", "coarsen", "exact", "expand",
                                              "lns", "local search", "status"]
    starts = p.log.candidates  # the rescheduled starts, cpsat and refine
    assert p.makespan <= min(starts.values()) + 1e-6
    assert p.makespan <= paper.makespan + 1e-6
    again = pesto.solve(g, cluster=c, time_limit=2, target_vertices=60, workers=1, hint=p)
    assert "pesto" in again.log.candidates  # the given full-graph plan joined the starts
    assert again.makespan <= p.makespan + 1e-6
    assert p.status in ("feasible", "optimal")
    assert p.lower_bound == pytest.approx(lower_bound(g, c))
    check_plan(g, c, p).raise_if_invalid()
    with pytest.raises(ValueError, match="recipe"):
        pesto.solve(g, cluster=c, recipe="fast")


def test_unsupported_combinations_raise():
    g = layered_dag(400, width=10, seed=4)
    c = gpus(2)
    with pytest.raises(ValueError, match="recipe='full'.*backend='mip'"):
        pesto.solve(g, cluster=c, backend="mip", recipe="full")
    with pytest.raises(ValueError, match="hint=None"):
        pesto.solve(g, cluster=c, hint=None, target_vertices=60)
    with pytest.raises(ValueError, match="unknown placer"):
        pesto.solve(g, cluster=c, backend="nope")
    with pytest.raises(ValueError, match="unknown placer 'bogus'"):
        pesto.solve(small(), hint="bogus")
    with pytest.raises(ValueError, match="target_vertices"):
        pesto.solve(small(), target_vertices=0)
    for bad in (-5, float("nan")):
        with pytest.raises(ValueError, match="time_limit"):
            pesto.solve(small(), time_limit=bad)


@pytest.mark.parametrize("option", ["time_limit", "target_vertices"])
@pytest.mark.parametrize("bad", [True, False, "10"])
def test_solve_rejects_non_numbers_naming_the_option(option, bad):
    with pytest.raises(TypeError, match=rf"^{option} must be .*got {bad!r} \({type(bad).__name__}\)"):
        pesto.solve(small(), **{option: bad})


def test_solve_mip_backend_and_hint_none():
    g = small()
    p = pesto.solve(g, cluster=gpus(2, beta=(1.0, 0.01)), backend="mip", hint=None, time_limit=10)
    q = pesto.solve(g, cluster=gpus(2, beta=(1.0, 0.01)), backend="cpsat", hint=None, time_limit=10, workers=1)
    assert p.makespan == pytest.approx(q.makespan)
    assert p.log.winner == "mip" and q.log.winner == "cpsat"
    assert p.log.recipe == q.log.recipe == "paper"


def test_solve_with_plan_hint():
    g = small()
    c = gpus(2, beta=(1.0, 0.01))
    first = pesto.solve(g, cluster=c, time_limit=5, workers=1, hint=None)
    again = pesto.solve(g, cluster=c, time_limit=5, workers=1, hint=first)
    assert again.log.hint in ("pesto", "plan")
    assert again.makespan == pytest.approx(first.makespan)


def test_infeasible_before_solving():
    big = OpGraph([Op("embedding", {"GPU": 1.0}, persistent_bytes=40 * 2 ** 30), Op("x", {"GPU": 1.0})])
    with pytest.raises(InfeasibleError, match="embedding") as e:
        pesto.solve(big, gpus=2, time_limit=5)
    assert e.value.culprit == "embedding"
    ops = [Op(f"w{i}", {"GPU": 1.0}, persistent_bytes=10 * 2 ** 30, colocation_group="vars") for i in range(2)]
    with pytest.raises(InfeasibleError, match="vars"):
        pesto.solve(OpGraph(ops), gpus=2, time_limit=5)
    ops = [Op(f"w{i}", {"GPU": 1.0}, persistent_bytes=12 * 2 ** 30) for i in range(3)]
    with pytest.raises(InfeasibleError, match="total|exceed"):
        pesto.solve(OpGraph(ops), gpus=2, time_limit=5)
    with pytest.raises(InfeasibleError, match="tpu_op"):
        pesto.solve(OpGraph([Op("tpu_op", {"TPU": 1.0})]), gpus=2, time_limit=5)


def test_broken_or_missing_heuristics_do_not_break_solve_but_bugs_propagate(monkeypatch):
    import dataclasses

    import solver.registry as registry
    from pesto.plan import Plan

    def broken(graph, cluster, **kw):  # returns an order that contradicts the graph, claiming 1 µs
        d = cluster.names[0]
        return Plan({n: d for n in graph.names}, {d: list(reversed(graph.topological_order()))},
                    makespan=1.0, placer="m-etf")

    def missing(graph, cluster, **kw):  # its optional module is not installed
        raise ModuleNotFoundError("No module named 'not_installed'", name="not_installed")

    def buggy(graph, cluster, **kw):
        raise ZeroDivisionError("a bug")

    def swap(name, **changes):
        monkeypatch.setitem(registry.PLACERS, name, dataclasses.replace(registry.PLACERS[name], **changes))

    swap("m-etf", fn=broken)
    swap("m-topo", fn=missing, needs="not_installed")
    g = small()
    p = pesto.solve(g, time_limit=5, workers=1)
    assert "invalid plan" in p.log.skipped["m-etf"]
    assert p.log.skipped["m-topo"].startswith("unavailable")
    assert p.log.winner != "m-etf" and p.makespan > 1.0
    check_plan(g, default_cluster(g), p).raise_if_invalid()
    swap("heft", fn=buggy)  # a bug is a bug: not a line in log.skipped
    with pytest.raises(ZeroDivisionError, match="a bug"):
        pesto.solve(g, time_limit=5, workers=1)
    swap("metis", fn=missing)  # an ImportError of a module the placer does not declare is a bug too
    swap("heft", fn=registry.place_heft)
    with pytest.raises(ModuleNotFoundError):
        pesto.solve(g, time_limit=5, workers=1)


def test_solve_log_round_trips_through_plan_json(tmp_path):
    g = small()
    p = pesto.solve(g, time_limit=5, workers=1)
    back = pesto.Plan.from_json(p.to_json())
    assert back.log == p.log and back.log.pass_named("exact").note.startswith("cpsat")
    old = p.to_dict()
    del old["log"]  # a plan file written before the log existed
    assert pesto.Plan.from_dict(old).log is None
    bad = p.to_dict()
    bad["log"] = {"pipeline": "full", "stages": [{"nom": 1}]}
    with pytest.raises(pesto.SchemaError):
        pesto.Plan.from_dict(bad)


def test_import_order_does_not_matter():
    import subprocess
    import sys
    for first in ("pesto", "solver", "coarsen", "solver.recipes", "pesto.cli", "tf_patch"):
        code = f"import {first}; import pesto, solver; print(pesto.solve.__module__)"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and out.stdout.strip() == "pesto.api", (first, out.stderr[-800:])


# -- findings: bad arguments are named errors, a preset name is a cluster --
@pytest.mark.parametrize("kw, exc, words", [
    ({"gpus": 2.5}, TypeError, "gpus must be an int"),
    ({"gpus": "2"}, TypeError, "gpus must be an int"),
    ({"gpus": None}, TypeError, "gpus must be an int"),
    ({"gpus": 0}, ValueError, "gpus must be >= 1"),
    ({"cluster": 3}, TypeError, "cluster must be a Cluster"),
    ({"cluster": "nope"}, pesto.InvalidClusterError, "unknown cluster preset 'nope'"),
    ({"workers": -2}, ValueError, "workers must be >= 1"),
    ({"seed": "x"}, TypeError, "seed must be an int"),
])
def test_bad_arguments_are_named(kw, exc, words):
    with pytest.raises(exc, match=words):
        pesto.solve(layered_dag(20, seed=0), time_limit=1, **kw)


def test_cluster_may_be_a_preset_name():
    g = layered_dag(20, seed=0)
    plan = pesto.solve(g, cluster="v100x4_pcie", time_limit=2, workers=1)
    assert set(plan.placement.values()) <= set(pesto.v100x4_pcie().names)
    assert check_plan(g, pesto.v100x4_pcie(), plan).ok


def test_evaluate_scores_a_given_placement_like_the_simulator():
    import pesto
    from pesto.errors import InvalidPlanError
    g = OpGraph.from_edges({"a": 10.0, "b": 20.0, "c": 30.0}, [("a", "b", 1000), ("a", "c", 1000)])
    tf_names = {"a": "/job:localhost/replica:0/task:0/device:GPU:0", "b": "GPU:0", "c": "/GPU:1"}
    plan = pesto.evaluate(g, tf_names)
    assert plan.placement == {"a": "/GPU:0", "b": "/GPU:0", "c": "/GPU:1"} and plan.placer == "given"
    sim = pesto.simulate(g, pesto.v100x2_nvlink(), plan.placement)
    assert plan.makespan == sim.makespan and pesto.check_plan(g, pesto.v100x2_nvlink(), plan).ok
    ordered = pesto.evaluate(g, plan.placement, order={"/GPU:0": ["a", "b"], "/GPU:1": ["c"]})
    assert list(ordered.order["/GPU:0"]) == ["a", "b"]
    for bad, culprit in (({"a": "/GPU:0", "b": "/GPU:0"}, "1 ops have no device"),
                         ({**plan.placement, "zz": "/GPU:0"}, "'zz'"),
                         ({**plan.placement, "c": "/GPU:5"}, "'/GPU:5'")):
        with pytest.raises(InvalidPlanError, match=culprit):
            pesto.evaluate(g, bad)


def test_solve_takes_a_placement_as_hint_and_is_never_slower():
    import pesto
    from benchmarks.generators import layered_dag
    g = layered_dag(400, width=8, seed=5)
    mine = {op: f"/job:localhost/replica:0/task:0/device:GPU:{i % 2}" for i, op in enumerate(g.names)}
    given = pesto.evaluate(g, mine)
    plan = pesto.solve(g, gpus=2, hint=mine, time_limit=3, workers=1, target_vertices=50)
    assert plan.makespan <= given.makespan + 1e-6


def test_verbose_prints_a_progress_line_per_pass_start_and_end(capfd):
    g = OpGraph.from_edges({"a": 20, "b": 30, "c": 40}, [("a", "b", 1000), ("a", "c", 1000)])
    plan = pesto.solve(g, gpus=2, time_limit=5, workers=1, verbose=True)
    out = capfd.readouterr().out  # capfd: CP-SAT logs to the file descriptor
    for s in plan.log.passes:
        assert f"] {s.name}: start" in out and f"] {s.name}: done in " in out
    assert "exact: done in " in out and "cpsat optimal on 3 vertices | incumbent 0.090 ms, bound 0.090 ms" in out
    assert "CpSolverResponse" not in out  # CP-SAT's own log only with verbose=2
    pesto.solve(g, gpus=2, time_limit=5, workers=1)
    assert capfd.readouterr().out == ""  # quiet by default


@pytest.mark.parametrize("load", ["evaluate", "load_placement"])
def test_a_device_of_another_task_is_not_a_local_gpu(load):
    g = small()
    theirs = {op: "/job:worker/task:3/device:GPU:1" for op in g.names}
    with pytest.raises(InvalidPlanError, match=r"'/job:worker/task:3/device:GPU:1', task 3 of a multi-host job"):
        pesto.evaluate(g, theirs) if load == "evaluate" else load_placement(theirs, g, gpus(2))
    task0 = {op: "/job:worker/replica:0/task:0/device:GPU:1" for op in g.names}
    assert set(load_placement(task0, g, gpus(2)).values()) == {"/GPU:1"}


def test_a_device_that_is_not_a_string_is_named():
    g = small()
    with pytest.raises(InvalidPlanError, match=r"placed on \"\['/GPU:0'\]\", not a device of"):
        load_placement({op: ["/GPU:0"] for op in g.names}, g, gpus(2))


def test_a_preset_by_name_has_a_cpu_only_when_an_op_needs_one():
    from pesto.api import resolve_cluster
    assert "/CPU:0" not in resolve_cluster(small(), 2, "v100x4_pcie").names
    cpu_op = OpGraph([Op("x", {"GPU": 1.0, "CPU": 5.0}, kinds={"CPU"}), Op("y", {"GPU": 1.0})], [])
    assert "/CPU:0" in resolve_cluster(cpu_op, 2, "v100x4_pcie").names
    plan = pesto.solve(small(), cluster="v100x4_pcie", time_limit=3, workers=1)
    assert set(plan.placement.values()) <= {f"/GPU:{i}" for i in range(4)}
