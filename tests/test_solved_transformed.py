"""Every Solved keeps the transform that maps its graph back to the step (issue 29)."""
from __future__ import annotations

import pytest

import pesto
from mb_strategies import layered_step
from pesto.cluster import hosts
from pesto.graph import Op, OpGraph
from pesto.step import identity, replicate, split
from solver.parallel import hybrid
from solver.parallel.realise import realise
from solver.parallel.search import _Pool
from solver.parallel.strategy import Solved, Strategy


@pytest.fixture(scope="module")
def step():
    return layered_step(2, act=100_000, weight=1_500_000, t=1000.0)


@pytest.fixture(scope="module")
def cluster():
    return hosts(2, 2, "10gbe")


def _maps_back(r: Solved, step: OpGraph) -> None:
    """``r.transformed`` is the transform of ``step`` whose graph ``r`` places, every op mapped to a step op."""
    t = r.transformed
    assert t is not None, r.strategy.name
    assert t.graph.names == r.graph.names and set(t.origin) == set(r.graph.names), r.strategy.name
    assert t.source.names == step.names
    assert all(o.op in step for o in t.origin.values()), r.strategy.name
    assert (t.replicas, t.micro_batches) == (r.replicas, r.micro_batches), r.strategy.name
    for name, o in t.origin.items():
        assert r.origin_of(name) == o
        if o.role == "copy":   # a copy runs a batched op of the step, in a slice of its replica
            assert step.op(o.op).batch and (o.slice is None or 0 <= o.slice < r.micro_batches), name
            assert (o.replica is None) == (r.replicas == 1), name
    assert sum(t.copies(op.name) != () for op in step.ops) == step.num_ops   # every step op runs


@pytest.mark.parametrize("strategy", [
    Strategy(replicas=4), Strategy(replicas=4, micro_batches=2),
    Strategy(stages=4, micro_batches=2, schedule="gpipe"), Strategy(stages=4, micro_batches=3, schedule="1f1b"),
    Strategy(replicas=2, stages=2, micro_batches=1, schedule="1f1b"),
    Strategy(replicas=2, stages=2, micro_batches=2, schedule="1f1b"),
    Strategy(micro_batches=2, schedule="slice")], ids=lambda s: s.name)
def test_every_realiser_keeps_its_transform(step, cluster, strategy):
    r = realise(step, cluster, strategy, time_limit=2, workers=1)
    _maps_back(r, step)


def test_the_hybrid_fakes_no_split(step):
    # one slice is split(g, 1), the step itself (tests/test_hybrid.py checks the composed transform)
    assert not hasattr(hybrid, "_unsplit")
    assert split(replicate(step, 2).graph, 1).origin == identity(replicate(step, 2).graph).origin


def test_every_candidate_of_the_search_keeps_its_transform(step, cluster, monkeypatch):
    offered = []
    keep = _Pool.offer_solved

    def offer_solved(self, name, r):
        offered.append(r)
        keep(self, name, r)

    monkeypatch.setattr(_Pool, "offer_solved", offer_solved)
    r = pesto.solve_step(step, cluster=cluster, micro_batches="auto", batch_size=8, time_limit=6, workers=1,
                         deterministic=True)
    kinds = {(o.strategy.schedule, o.strategy.kind) for o in offered}
    assert {("none", "replicated"), ("1f1b", "replicated"), ("gpipe", "micro-batched"),
            ("free", "micro-batched"), ("none", "step")} <= kinds
    for o in offered + [r]:
        _maps_back(o, step)


def test_the_plain_step_is_its_own_transform(step, cluster):
    r = pesto.solve_step(step, cluster=cluster, micro_batches=1, time_limit=2, workers=1, deterministic=True)
    assert r.transformed.graph is r.graph and r.origin_of("layer_0/w").role == "step"
    unmarked = OpGraph([Op("a", {"GPU": 1.0})])
    assert Solved(None, unmarked).origin_of("a").op == "a"   # no marks: every op once per step


def test_a_transform_of_another_graph_is_refused(step):
    s = split(step, 2)
    with pytest.raises(ValueError, match="is not the graph placed"):
        Solved(None, step, Strategy(micro_batches=2, schedule="free"), s)
    with pytest.raises(ValueError, match="kept no transform"):
        Solved(None, s.graph, Strategy(micro_batches=2, schedule="free")).origin_of("x")
    assert Solved(None, step).transformed.origin == identity(step).origin


@pytest.mark.parametrize("strategy", [Strategy(stages=4, micro_batches=2, schedule="1f1b", recompute=True),
                                      Strategy(replicas=4, micro_batches=2, recompute=True)], ids=lambda s: s.name)
def test_a_recomputed_plan_maps_back_to_the_step_not_the_recomputed_one(step, cluster, strategy):
    r = realise(step, cluster, strategy)
    _maps_back(r, step)
    assert any(o.role == "recompute" for o in r.transformed.origin.values())
