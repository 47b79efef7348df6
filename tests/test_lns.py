"""CP-SAT large-neighbourhood search (solver.lns) and its window model (solver.lns_model)."""
import pytest
from strategies import random_fifo_plan

import solver.lns

from benchmarks.generators import layered_dag
from pesto import OpGraph, check_plan, gpus
from pesto.graph import Edge, Op, Tensor
from pesto.problem import Problem
from pesto.simulate import simulate
from solver.lns import KINDS, lns
from solver.lns_model import solve_window
from solver.recipes import solve_fine
from solver.search import reschedule


def _chains(k=6, coloc=False):
    """Two independent chains of ``k`` ops; chain b a colocation group with ``coloc``."""
    ops, edges = [], []
    for c in "ab":
        for i in range(k):
            group = "grp" if coloc and c == "b" else None
            ops.append(Op(f"{c}{i}", {"GPU": 10.0 + i}, output_bytes=1000, colocation_group=group))
            if i:
                edges.append(Edge(f"{c}{i - 1}", f"{c}{i}", (f"{c}{i - 1}:0",)))
    tensors = [Tensor(f"{o.name}:0", o.name, 1000) for o in ops]
    return OpGraph(ops, edges, tensors)


@pytest.mark.parametrize("seed, links", [(0, True), (1, False), (2, "alternate")])
def test_never_worse_than_its_start_and_valid(seed, links):
    g = layered_dag(250, seed=seed, coloc_prob=0.1)
    cl = gpus(2, beta=(20.0, 2e-5), with_cpu=True)
    start = random_fifo_plan(g, cl, seed)
    assert not cl.contention_free  # links=True: transfers hold their links in the window model
    out = lns(g, cl, start, time_limit=600, window=60, window_time=0.2, max_windows=6, seed=seed, links=links)
    again = simulate(g, cl, start, mode="order").makespan
    assert out.makespan <= again + 1e-9
    assert out.placer == "lns"
    check_plan(g, cl, out).raise_if_invalid()
    st = out.stats["lns"]
    assert st["windows"] == 6 and st["start_makespan"] == pytest.approx(again)
    assert set(st["by_kind"]) == set(KINDS)  # three devices: the pair kind runs too
    assert st["makespan"] == pytest.approx(out.makespan)


def test_finds_the_parallel_plan_from_everything_on_one_gpu():
    g = _chains()
    cl = gpus(2, beta=(1.0, 0.0))
    start = reschedule(g, cl, {op: "/GPU:0" for op in g.names})
    assert start.makespan == pytest.approx(2 * sum(10.0 + i for i in range(6)))
    out = lns(g, cl, start, time_limit=30, max_windows=3)
    # one chain per GPU; the chains never exchange a tensor
    assert out.makespan == pytest.approx(sum(10.0 + i for i in range(6)))
    assert {out.placement["a0"], out.placement["b0"]} == {"/GPU:0", "/GPU:1"}
    check_plan(g, cl, out).raise_if_invalid()


def test_a_window_moves_a_colocation_group_whole():
    g = _chains(coloc=True)
    cl = gpus(2, beta=(1.0, 0.0))
    start = reschedule(g, cl, {op: "/GPU:0" for op in g.names})
    out = lns(g, cl, start, time_limit=30, max_windows=3)
    assert out.makespan < start.makespan
    assert len({out.placement[f"b{i}"] for i in range(6)}) == 1
    check_plan(g, cl, out).raise_if_invalid()


def test_a_unit_partly_outside_the_window_keeps_its_device():
    g = _chains(coloc=True)
    cl = gpus(2, beta=(1.0, 0.0))
    prob = Problem.of(g, cl)
    sched = simulate(g, cl, reschedule(g, cl, {op: "/GPU:0" for op in g.names}), mode="order")
    st = [sched.start[n] for n in g.names]
    fi = [sched.finish[n] for n in g.names]
    tail = [sched.makespan - s for s in st]
    window = [g.index[n] for n in ("a0", "a1", "b0", "b1")]  # b2..b5 stay out
    res = solve_window(prob, [0] * prob.n, st, fi, tail, window, time_limit=5, workers=1)
    assert res.dev[g.index["b0"]] == res.dev[g.index["b1"]] == 0
    assert res.objective_us <= res.incumbent_us + 1e-6


def test_deterministic_for_a_fixed_seed(monkeypatch):
    # CP-SAT stops on its deterministic time; lift the wall-clock safety net,
    # which a loaded test machine could reach first
    monkeypatch.setattr(solver.lns, "WALL_FACTOR", 1000)
    g = layered_dag(300, seed=5)
    cl = gpus(2, beta=(20.0, 2e-5))
    start = random_fifo_plan(g, cl, 5)
    runs = [lns(g, cl, start, time_limit=600, window=50, window_time=0.05, max_windows=4, seed=3)
            for _ in range(2)]
    a, b = runs
    assert a.makespan == b.makespan
    assert dict(a.placement) == dict(b.placement) and dict(a.order) == dict(b.order)


def test_bad_options_raise():
    g = _chains(2)
    cl = gpus(2)
    start = reschedule(g, cl, {op: "/GPU:0" for op in g.names})
    with pytest.raises(ValueError, match="window kinds"):
        lns(g, cl, start, time_limit=1, kinds=("nope",))
    with pytest.raises(ValueError, match="window"):
        lns(g, cl, start, time_limit=1, window=0)
    with pytest.raises(ValueError, match="links"):
        lns(g, cl, start, time_limit=1, links="sometimes")


def test_the_full_recipe_runs_the_lns_pass():
    g = layered_dag(300, seed=2)
    cl = gpus(2)
    p = solve_fine(g, cl, time_limit=3, target_vertices=40, workers=1)
    names = [s.name for s in p.log.passes]
    assert names.index("expand") < names.index("lns") < names.index("local search")
    assert "lns" in p.log.candidates
    assert p.makespan <= p.log.candidates["lns"] + 1e-9
    check_plan(g, cl, p).raise_if_invalid()
