"""solver.parallel.placed: R replicas of one free (one-step) placement, and its place in the step search."""
from __future__ import annotations

import pytest

import pesto
from pesto.cluster import gpus
from mb_strategies import step_builder
from pesto.graph import OpGraph
from pesto.plan import check_plan
from pesto.step import replicate
from pesto.step.replication import replica_name
from solver.parallel.hybrid import replica_groups
from solver.parallel.kinds import KINDS
from solver.parallel.pipelines import data_parallel_plan
from solver.parallel.placed import placed_plan, replica_step
from solver.parallel.realise import realise
from solver.parallel.search import with_marks
from solver.parallel.strategy import Strategy

# Two towers (a forward op of 1 ms, a weight gradient of 2 ms each) joined at the loss, each
# with a 30 MB weight (a bucket of its own), on 4 GPUs linked at 40 GB/s (0.75 ms per weight).
# One step placed on 4 GPUs uses two of them, a tower each: ~3 ms. Data parallelism's
# ring over 4 replicas moves 1.5 x 60 MB through each GPU's link after a 1.5 ms step (~3.6 ms).
# Two replicas of the towers placed on two GPUs each: 1.5 ms, then each GPU all-reduces its
# tower's gradient with its twin in the other group (30 MB, ~0.8 ms): ~2.3 ms.
SLOW = (5.0, 2.5e-5)


def two_towers(*, t: float = 1000.0, weight: int = 30_000_000, act: int = 1000) -> OpGraph:
    """Two towers of one forward op and one weight gradient, each with its variable and update."""
    ops, ts, es, add, edge = step_builder()
    add("x", 0.5, act, True, "forward")
    for b in range(2):
        p = f"tower_{b}"
        add(f"{p}/w", 0.0, 0, False, "forward", persistent_bytes=weight, colocation_group=p)
        add(f"{p}/read", 0.0, 0, False, "forward", colocation_group=p)
        add(f"{p}/a", t, act, True, "forward")
        for u, v in [(f"{p}/w", f"{p}/read"), ("x", f"{p}/a"), (f"{p}/read", f"{p}/a"), (f"{p}/a", "loss")]:
            edge(u, v)
    add("loss", 1.0, 4, True, "forward")
    add("gradients/loss_grad", 1.0, act, True, "input-grad", "loss")
    edge("loss", "gradients/loss_grad")
    for b in range(2):
        p, q = f"tower_{b}", f"gradients/tower_{b}"
        add(f"{q}/a_grad/dw", 2 * t, weight, True, "weight-grad", f"{p}/a")
        add(f"train/update_{b}", 1.0, 0, False, "update", colocation_group=p)
        for u, v in [("gradients/loss_grad", f"{q}/a_grad/dw"), ("x", f"{q}/a_grad/dw"),
                     (f"{q}/a_grad/dw", f"train/update_{b}"), (f"{p}/w", f"train/update_{b}")]:
            edge(u, v)
    return OpGraph(ops, es, ts, name="two_towers")


def one_step(seconds: float = 2.0):
    """The one-step placer as the search gives it (here through the facade, deterministic)."""
    return lambda graph, cluster: pesto.solve(graph, cluster=cluster, time_limit=seconds, deterministic=True,
                                              workers=1)


@pytest.fixture(scope="module")
def towers():
    return with_marks(two_towers())


@pytest.fixture(scope="module")
def slow():
    return gpus(4, beta=SLOW)


def test_a_replica_step_is_what_replica_zero_holds(towers):
    rep = replicate(towers, 2)
    one = replica_step(rep)
    assert one.names == towers.names and [e for e in one.edges] == list(towers.edges)
    for op in one.ops:
        copy = rep.graph.op(replica_name(op.name, 0))
        assert (op.compute, op.output_bytes, op.persistent_bytes) == (copy.compute, copy.output_bytes,
                                                                      copy.persistent_bytes)
        assert (op.colocation_group, op.anchor, op.phase) == (towers.op(op.name).colocation_group,
                                                              towers.op(op.name).anchor, towers.op(op.name).phase)
    assert one.op("tower_0/a").compute["GPU"] == 500.0            # half the batch
    assert one.op("gradients/tower_0/a_grad/dw").output_bytes == 30_000_000   # a weight's gradient: whole


def test_replicas_of_a_two_gpu_placement_beat_data_parallelism_and_the_one_step_solve(towers, slow):
    r = realise(towers, slow, Strategy(replicas=2, stages=2, schedule="free"), place=one_step())
    assert check_plan(r.graph, slow, r.plan).ok
    assert r.graph.names == pesto.step_graph(towers, 1, "replicated", 2).names
    assert r.strategy == Strategy(replicas=2, stages=2, schedule="free") and r.graph_kind == "replicated"
    dp = data_parallel_plan(towers, slow).plan
    alone = pesto.solve(towers, cluster=slow, time_limit=2, deterministic=True, workers=1)
    assert r.plan.makespan < 0.8 * min(dp.makespan, alone.makespan), (r.plan.makespan, dp.makespan, alone.makespan)
    # replica r's copy of an op sits at the same position in group r; each ring runs between twins
    groups = replica_groups(slow, 2)
    at = {d: (g, k) for g, group in enumerate(groups) for k, d in enumerate(group)}
    for name, dev in r.plan.placement.items():
        o = r.transformed.origin[name]
        assert at[dev][0] == o.replica, name
        if o.role in ("copy", "step"):
            twin = r.plan.placement[replica_name(o.op, 0)]
            assert at[dev][1] == at[twin][1], name
    assert len({r.plan.placement[f"gradients/tower_{b}/a_grad/dw@r0"] for b in range(2)}) == 2


def test_the_plan_follows_the_placed_order_and_is_the_same_for_the_same_placement(towers, slow):
    a = placed_plan(towers, slow, replicas=2, place=one_step())
    b = placed_plan(towers, slow, replicas=2, place=one_step())
    assert a.plan.placement == b.plan.placement and a.plan.order == b.plan.order
    assert a.plan.makespan == b.plan.makespan and (a.replicas, a.stages, a.schedule) == (2, 2, "free")


def test_realise_needs_the_one_step_placer(towers, slow):
    with pytest.raises(ValueError, match="need the one-step placer"):
        realise(towers, slow, Strategy(replicas=2, stages=2, schedule="free"))
    with pytest.raises(ValueError, match="one slice"):
        realise(towers, slow, Strategy(replicas=2, stages=2, micro_batches=2, schedule="free"), place=one_step())


def test_the_kind_offers_every_divisor_between_one_and_all_gpus_at_one_slice(towers):
    kind = KINDS["placed"]
    assert [s.name for s in kind.candidates(towers, gpus(8), 1)] == ["hybrid R=2 K=4 free", "hybrid R=4 K=2 free"]
    assert kind.candidates(towers, gpus(4), 2) == [] and kind.candidates(towers, gpus(2), 1) == []
    assert kind.label(Strategy(replicas=2, stages=2, schedule="free")) == "placed R=2"


def test_the_search_screens_it_and_is_deterministic(slow):
    runs = [pesto.solve(two_towers(), cluster=slow, micro_batches="auto", batch_size=4, time_limit=4,
                        deterministic=True, workers=1) for _ in range(2)]
    a, b = runs
    assert "placed R=2" in a.log.steps
    assert a.log.steps == b.log.steps and a.placement == b.placement and a.makespan == b.makespan
    assert a.makespan <= a.log.steps["placed R=2"] < a.log.steps["data-parallel"]
    graph = pesto.step_graph(two_towers(), a.log.micro_batches, a.log.graph_kind, a.log.replicas,
                             joined=a.log.joined, in_place=a.log.in_place)
    assert check_plan(graph, slow, a).ok


def test_the_search_skips_it_where_the_best_plan_is_near_the_work_over_the_gpus():
    """Small weights on fast links: data parallelism runs at about the work over the GPUs,
    which no plan beats; the one-step solve is not worth its share of the time."""
    p = pesto.solve(two_towers(weight=1000), cluster=gpus(4), micro_batches="auto", batch_size=4, time_limit=3,
                    deterministic=True, workers=1)
    assert "placed R=2" not in p.log.steps
    assert p.log.skipped["placed R=2"].startswith("not built: the best plan so far")


def test_a_placed_plan_over_memory_is_marked_so_and_does_not_win(towers):
    """64 MB GPUs: a replica's tower holds its 30 MB weight, its 30 MB gradient and the ring's
    chunks on one GPU; the plan is simulated as every plan (over memory: ``"infeasible"``) and
    the search returns one that fits."""
    small = gpus(4, beta=SLOW, memory=64_000_000)
    r = realise(towers, small, Strategy(replicas=2, stages=2, schedule="free"), place=one_step())
    assert r.plan.status == "infeasible" and max(r.plan.peak_memory.values()) > 64_000_000
    p = pesto.solve(two_towers(), cluster=small, micro_batches="auto", batch_size=4, time_limit=3,
                    deterministic=True, workers=1)
    assert "placed R=2" in p.log.steps and p.status != "infeasible" and p.log.graph_kind == "step"
