"""ZeRO-1/2: pesto.step.replicate(shard_optimizer=1|2) (issue 30, item 4)."""
from __future__ import annotations

import pytest

from mb_strategies import deep_step
from pesto.cluster import gpus
from pesto.errors import MicroBatchError
from pesto.plan import check_plan
from pesto.step import compose, replicate, split
from pesto.step.replication import optimizer_state
from solver.parallel.pipelines import data_parallel_plan

W = 4_000_000


def _held(graph, placement, dev):
    return sum(op.persistent_bytes for op in graph.ops if placement[op.name] == dev)


def test_optimizer_state_is_the_slots():
    g = deep_step(3, weight=W)
    assert optimizer_state(g) == {f"layer_{l}/w/{s}" for l in range(3) for s in "mv"}


@pytest.mark.parametrize("R", [2, 4])
@pytest.mark.parametrize("zero", [1, 2])
def test_persistent_bytes_drop_by_the_state_s_share(R, zero):
    g = deep_step(4, weight=W)
    plain, sharded = replicate(g, R), replicate(g, R, shard_optimizer=zero)
    devs = [f"/GPU:{r}" for r in range(R)]
    state = sum(g.op(n).persistent_bytes for n in optimizer_state(g))
    for r in range(R):
        before = _held(plain.graph, plain.placement(devs), devs[r])
        after = _held(sharded.graph, sharded.placement(devs), devs[r])
        assert before - after == state * (R - 1) // R


def test_reduce_scatter_then_parameter_all_gather_same_bytes_as_all_reduce():
    g = deep_step(4, weight=W)
    R = 4
    plain, z = replicate(g, R, bucket_bytes=None), replicate(g, R, bucket_bytes=None, shard_optimizer=2)
    moved = {}
    for name, rep in (("plain", plain), ("zero", z)):
        pl = rep.placement([f"/GPU:{r}" for r in range(R)])
        moved[name] = sum(rep.graph.tensor(t).bytes for e in rep.graph.edges if pl[e.src] != pl[e.dst]
                          for t in e.tensors)
    assert moved["zero"] == moved["plain"] > 0   # every transfer is a ring step of ceil(B / R) bytes
    # the update reads the shard, no gradient all-gather; the updated parameters are gathered
    update = "train/update_2@r1"
    shard = [p for p in z.graph.predecessors(update) if z.origin[p].role == "reduce-scatter"]
    assert len(shard) == 1 and z.graph.op(shard[0]).output_bytes == -(-W // R)
    assert not any(o.role == "gather" and "@allreduce@" in n for n, o in z.origin.items())
    assert update in z.graph.predecessors(next(n for n, o in z.origin.items()
                                               if o.role == "gather" and n.endswith("@r1")
                                               and update in z.graph.predecessors(n)))
    assert z.graph.op(update).compute["GPU"] == pytest.approx(g.op("train/update_2").compute["GPU"] / R)
    # ZeRO-1 keeps the whole gradient buffer until the update
    z1 = replicate(g, R, bucket_bytes=None, shard_optimizer=1)
    assert z1.graph.op(shard[0]).output_bytes == W


@pytest.mark.parametrize("m", [1, 2])
def test_zero_plans_are_valid_and_lower_peak_than_data_parallel(m):
    g = deep_step(4, weight=W, act=200_000)
    cluster = gpus(2, memory=10**12)
    plain = data_parallel_plan(g, cluster, micro_batches=m)
    peaks = {}
    for zero in (1, 2):
        sp = data_parallel_plan(g, cluster, micro_batches=m, shard_optimizer=zero)
        assert check_plan(sp.graph, cluster, sp.plan).ok
        peaks[zero] = max(sp.plan.peak_memory.values())
    assert peaks[2] <= peaks[1] < max(plain.plan.peak_memory.values())


def test_composes_with_split():
    g = deep_step(3, weight=W)
    rep = replicate(g, 2, shard_optimizer=2)
    both = compose(split(rep.graph, 2), rep)
    o = both.origin["layer_0/a@r1@mb1"]
    assert (o.op, o.replica, o.slice) == ("layer_0/a", 1, 1)
    assert {o.role for o in both.origin.values()} >= {"reduce-scatter", "all-gather", "gather", "accumulate"}


@pytest.mark.parametrize("bad", [3, -1, True, "2"])
def test_bad_shard_optimizer_named(bad):
    with pytest.raises(MicroBatchError, match="shard_optimizer must be one of"):
        replicate(deep_step(2), 2, shard_optimizer=bad)
