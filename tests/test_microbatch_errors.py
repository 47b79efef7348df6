"""Bad input to micro-batching gets a named error (issue 24, "done when"), and
the plan of a transformed step carries a valid bound of the graph it places."""
from __future__ import annotations

import pytest

import pesto
from mb_strategies import layered_step
from pesto.cluster import gpus
from pesto.errors import BatchMarkError, InfeasibleError, MicroBatchError, MicroBatchMemoryError
from pesto.graph import Edge, Op, OpGraph, Tensor
from pesto.step import replicate, split
from solver.parallel.bound import pipeline_bound, sample_bound
from solver.parallel.pipelines import pipeline_plan
from solver.parallel.realise import realise
from solver.parallel.search import winner_bound
from solver.parallel.strategy import Solved, Strategy

GIB = 2 ** 30


@pytest.fixture(scope="module")
def step():
    return layered_step(2, act=1000, weight=400, t=1000.0)


def _solve(graph, **kw):
    return pesto.solve(graph, gpus=2, time_limit=1, workers=1, **kw)


def test_m_not_dividing_the_batch_names_both_and_the_divisors(step):
    with pytest.raises(MicroBatchError) as exc:
        _solve(step, micro_batches=3, batch_size=8)
    assert "micro_batches=3 does not divide batch_size=8" in str(exc.value)
    assert "divisors: 1, 2, 4, 8" in str(exc.value) and exc.value.culprit == 3


@pytest.mark.parametrize("m", [0, -2])
def test_m_below_one(step, m):
    with pytest.raises(MicroBatchError, match=f"integer >= 1 or 'auto', got {m}$"):
        _solve(step, micro_batches=m)


@pytest.mark.parametrize("m, kind", [(2.0, "float"), ("4", "str"), (True, "bool"), (None, "NoneType")])
def test_m_not_an_int(step, m, kind):
    with pytest.raises(MicroBatchError, match=f"got {m!r} \\({kind}\\)"):
        _solve(step, micro_batches=m)


@pytest.mark.parametrize("m", ["Auto", "atuo", " auto"])
def test_auto_misspelt_suggests_auto(step, m):
    with pytest.raises(MicroBatchError, match="did you mean 'auto'"):
        _solve(step, micro_batches=m)


def test_split_of_an_unmarked_graph_names_the_ops():
    g = pesto.OpGraph.from_edges({"a": 1.0, "b": 2.0, "c": 1.0}, [("a", "b", 8), ("b", "c", 8)])
    with pytest.raises(BatchMarkError, match="no batch mark") as exc:
        split(g, 2)
    assert exc.value.ops == ["a", "b", "c"] and "'a', 'b', 'c'" in str(exc.value)


def _big_gradient_step(weight: int = GIB) -> OpGraph:
    """A weight gradient of ``weight`` bytes: summing two slices' gradients
    holds three of them on one device; the un-split update holds one."""
    ops = [Op("v", {"GPU": 1.0}, persistent_bytes=weight // 16, output_bytes=8, batch=False, colocation_group="v"),
           Op("x", {"GPU": 10.0}, output_bytes=4096, batch=True),
           Op("dw", {"GPU": 500.0}, output_bytes=weight, batch=True),
           Op("apply", {"GPU": 50.0}, batch=False, colocation_group="v")]
    edges = [Edge("x", "dw", "x:0"), Edge("v", "dw", "v:0"), Edge("dw", "apply", "dw:0"), Edge("v", "apply", "v:0")]
    tensors = [Tensor("x:0", "x", 4096), Tensor("v:0", "v", 8), Tensor("dw:0", "dw", weight)]
    return OpGraph(ops, edges, tensors, name="bigdw")


def test_fixed_m_whose_slices_fit_no_device_raises_by_name():
    cluster = gpus(2, memory=2 * GIB)
    assert _solve(_big_gradient_step(), cluster=cluster).status != "infeasible"   # M=1 fits
    with pytest.raises(MicroBatchMemoryError) as exc:
        _solve(_big_gradient_step(), cluster=cluster, micro_batches=2)
    e = exc.value
    assert isinstance(e, InfeasibleError) and (e.micro_batches, e.need, e.largest) == (2, 3 * GIB, 2 * GIB)
    assert str(e) == ("M=2: in-flight slices need 3.00 GiB on one device (op 'dw:0@acc1'), "
                      "the largest device has 2.00 GiB")


def test_auto_skips_an_m_whose_slices_fit_no_device_and_says_why():
    plan = _solve(_big_gradient_step(), cluster=gpus(2, memory=2 * GIB), micro_batches="auto", batch_size=4)
    skipped = plan.log.skipped
    assert skipped["M=2"].startswith("M=2: in-flight slices need 3.00 GiB") and "M=4" in skipped
    assert not any(name.endswith(("M=2", "M=4")) for name in plan.log.steps)
    assert "M=1" in plan.log.steps and plan.status != "infeasible"


def test_a_baseline_winner_carries_the_per_sample_bound(step, monkeypatch):
    # only M=1 (batch 2, AUTO_MAX 1): data parallelism halves every layer and no
    # plan of the un-split step goes below its critical path: the baseline wins
    import solver.parallel.search as ss
    monkeypatch.setattr(ss, "AUTO_MAX", 1)
    r = pesto.solve_step(step, cluster=pesto.v100x2_nvlink(), time_limit=2, workers=1, micro_batches="auto",
                         batch_size=2)
    log = r.plan.log
    assert r.graph_kind == "replicated" and log.winner == "data-parallel"
    assert log.bound_source.startswith("per-sample bound")
    assert 0 < log.bound == r.plan.lower_bound <= r.plan.makespan
    assert r.plan.makespan < pesto.solve(step, cluster=pesto.v100x2_nvlink(), time_limit=1).lower_bound


def test_winner_bound_of_a_pipeline_baseline_is_its_split_steps(step):
    c = pesto.v100x2_nvlink()
    sp = pipeline_plan(step, c, schedule="gpipe", micro_batches=4)
    b = winner_bound(c, Solved(sp.plan, sp.graph, Strategy(stages=sp.stages, micro_batches=4, schedule="gpipe"),
                               sp.transformed), batch=8)
    plain, pipe = sample_bound(split(step, 4), c, batch=8), pipeline_bound(split(step, 4), c)
    assert b.step == max(plain.step, pipe.step) and b.memory == plain.memory   # fill and drain charged
    assert b.source == ("pipeline" if pipe.step > plain.step else plain.source)
    assert 0 < b.step <= sp.plan.makespan and b.per_sample == b.step / 8
    assert winner_bound(c, Solved(sp.plan, sp.graph, Strategy(stages=sp.stages, micro_batches=4))) is None


def test_winner_bound_of_a_replicated_plan_is_its_split_replicated_steps(step):
    # the kept transform (replicate, then split, composed) bounds as the split of the replicated step
    c = pesto.v100x2_nvlink()
    for m in (1, 2):
        dp = realise(step, c, Strategy(replicas=2, micro_batches=m))
        assert winner_bound(c, dp) == sample_bound(split(replicate(step, 2).graph, m), c)
