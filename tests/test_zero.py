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


@pytest.mark.parametrize("bad", [4, -1, True, "2"])
def test_bad_shard_optimizer_named(bad):
    with pytest.raises(MicroBatchError, match="shard_optimizer must be one of"):
        replicate(deep_step(2), 2, shard_optimizer=bad)


# ZeRO-3: the parameters sharded, gathered for their forward and backward readers
BIG = 2**25   # > the 25 MiB bucket: one parameter per bucket


def _moved(rep, R):
    pl = rep.placement([f"/GPU:{r}" for r in range(R)])
    return sum(rep.graph.tensor(t).bytes for e in rep.graph.edges if pl[e.src] != pl[e.dst] for t in e.tensors)


@pytest.mark.parametrize("R", [2, 4])
def test_zero3_moves_two_gathers_and_a_reduce_scatter(R):
    g = deep_step(3, weight=W)
    z = replicate(g, R, bucket_bytes=None, shard_optimizer=3)
    params = 3 * W
    # per replica: forward all-gather + backward all-gather + gradient reduce-scatter, (R-1)/R each
    assert _moved(z, R) == R * 3 * (R - 1) * params // R
    assert _moved(replicate(g, R, bucket_bytes=None, shard_optimizer=2), R) == R * 2 * (R - 1) * params // R
    # every reader of a weight reads a gathered copy: forward its forward gather, backward its backward one
    assert set(z.graph.predecessors("layer_1/a@r0")) == {"layer_1/w@fwgather@r0", "layer_0/c@r0"}
    assert "layer_1/w@bwgather@r0" in z.graph.predecessors("gradients/layer_1/a_grad/dx@r0")
    assert z.graph.op("layer_1/w@fwgather@r0").output_bytes == W
    # no all-gather of the updated parameters, no gradient all-gather: the update reads its shard
    assert not any("@allgather@" in n or "@allreduce@" in n for n in z.origin)


@pytest.mark.parametrize("R", [2, 4])
def test_zero3_shards_weights_and_state(R):
    g = deep_step(2, weight=W)
    z = replicate(g, R, shard_optimizer=3)
    devs = [f"/GPU:{r}" for r in range(R)]
    # by hand: 2 weights of W and 4 slots of W, all sharded R ways
    assert _held(z.graph, z.placement(devs), devs[0]) == 6 * W // R
    z2 = replicate(g, R, shard_optimizer=2)
    assert _held(z2.graph, z2.placement(devs), devs[0]) == 2 * W + 4 * W // R


def test_zero3_peak_below_zero2_on_two_layers():
    """Two layers of one ``BIG`` weight each (slots m, v of ``BIG``), 4 replicas, a fast link.

    By hand, per replica: ZeRO-2 holds 2 weights + 4 slots / 4 = 3 BIG persistent, ZeRO-3
    2 / 4 + 4 / 4 = 1.5 BIG. ZeRO-3's transient bytes are ZeRO-2's plus the gathered copies:
    at most two buckets at once (the one read and the one prefetched), 2 BIG."""
    g = deep_step(2, weight=BIG, act=1000)
    cluster = gpus(4, memory=10**12, beta=(1.0, 1e-6))
    sp = {z: data_parallel_plan(g, cluster, shard_optimizer=z) for z in (2, 3)}
    persistent = {z: _held(s.graph, s.plan.placement, "/GPU:0") for z, s in sp.items()}
    assert persistent == {2: 3 * BIG, 3: 3 * BIG // 2}
    peak = {z: s.plan.peak_memory["/GPU:0"] for z, s in sp.items()}
    assert check_plan(sp[3].graph, cluster, sp[3].plan).ok
    assert peak[3] < peak[2]
    assert peak[3] - persistent[3] <= peak[2] - persistent[2] + 2 * BIG
    # prefetch: layer 1's forward gather starts once the ring is free, not after layer 0's compute
    p3 = sp[3].plan
    assert p3.start["layer_1/w@fsend@r0"] <= p3.start["layer_0/a@r0"]
    # and a backward gather does not start before its layer's forward readers are done
    assert p3.start["layer_1/w@bsend@r0"] >= p3.finish["layer_1/a@r0"]


def test_zero3_composes_with_split_and_is_valid():
    g = deep_step(3, weight=W, act=200_000)
    cluster = gpus(2, memory=10**12)
    sp = data_parallel_plan(g, cluster, micro_batches=2, shard_optimizer=3)
    assert check_plan(sp.graph, cluster, sp.plan).ok
    o = sp.transformed.origin["layer_0/w@fwgather@r1"]
    members = ("layer_0/w",)   # one bucket per layer block (gather_units), not one 25 MiB bucket of the three
    assert (o.op, o.replica, o.role, o.members) == ("layer_0/w", 1, "gather", members)

