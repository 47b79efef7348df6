"""pesto.replicate: data parallelism as a graph with a ring all-reduce (issue 24)."""
from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings, strategies as st

from mb_strategies import marked_dags
from pesto.cluster import gpus, v100x4_pcie
from pesto.errors import BatchMarkError, MicroBatchError
from pesto.graph import Edge, Op, OpGraph, Tensor
from pesto.microbatch import FLOOR_US, fixed_ops, microbatch, partial_tensors, split_step
from pesto.plan import check_plan
from pesto.replicate import replicate
from pesto.simulate import simulate

SETTINGS = settings(max_examples=50, deadline=None)


def _step(grad_bytes=4000):
    ops = [Op("x", {"GPU": 1.0}, output_bytes=1000, batch=True),
           Op("w", {"GPU": 0.0}, persistent_bytes=grad_bytes, output_bytes=grad_bytes, batch=False,
              colocation_group="w"),
           Op("h", {"GPU": 40.0}, output_bytes=2000, batch=True),
           Op("dw", {"GPU": 60.0}, output_bytes=grad_bytes, batch=True),
           Op("apply", {"GPU": 5.0}, batch=False, colocation_group="w")]
    ts = [Tensor("x:0", "x", 1000), Tensor("w:0", "w", grad_bytes), Tensor("h:0", "h", 2000),
          Tensor("dw:0", "dw", grad_bytes)]
    es = [Edge("x", "h", "x:0"), Edge("w", "h", "w:0"), Edge("h", "dw", "h:0"), Edge("x", "dw", "x:0"),
          Edge("dw", "apply", "dw:0"), Edge("w", "apply", "w:0")]
    return OpGraph(ops, es, ts, name="step")


def _ring_values(rep):
    """Evaluate the all-reduce symbolically: each value maps chunk -> replicas summed in it."""
    g = rep.graph
    val = {}
    for name in g.topological_order():
        o = rep.origin[name]
        if o.role not in ("reduce-scatter", "all-gather", "gather"):
            continue
        ins = []
        for p in g.predecessors(name):
            for t in g.edge(p, name).tensors:
                m = re.fullmatch(r".*@r(\d+)/chunk(\d+)", t)
                ins.append({int(m.group(2)): {int(m.group(1))}} if m else val[p])
        if o.role == "reduce-scatter":
            (a,), (b,) = (x.keys() for x in ins)
            assert a == b, f"{name} adds chunk {a} to chunk {b}"
            val[name] = {a: ins[0][a] | ins[1][a]}
        else:
            merged = {}
            for x in ins:
                assert not set(x) & set(merged), f"{name} gathers a chunk twice"
                merged.update(x)
            val[name] = merged
    return val


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ring_sums_every_chunk_over_every_replica(n):
    rep = replicate(_step(), n)
    val = _ring_values(rep)
    for r in range(n):
        assert val[f"dw:0@allreduce@r{r}"] == {j: set(range(n)) for j in range(n)}
        assert sorted(rep.graph.predecessors(f"apply@r{r}")) == [f"dw:0@allreduce@r{r}", f"w@r{r}"]


@pytest.mark.parametrize("n", [2, 4])
def test_data_parallel_plan_sends_2_n_minus_1_chunks_per_replica(n):
    b = 4000
    rep = replicate(_step(b), n)
    c = gpus(n, beta=(1.0, 0.001))
    sched = simulate(rep.graph, c, rep.placement(c.names))
    ring = [t for t in sched.transfers if "dw:0" in t.tensor]
    assert len(ring) == 2 * (n - 1) * n
    assert all(rep.graph.tensor(t.tensor).bytes == math.ceil(b / n) for t in ring)
    assert all(int(t.dst[-1]) == (int(t.src[-1]) + 1) % n for t in ring)   # neighbours on the ring
    assert not [t for t in sched.transfers if "dw:0" not in t.tensor]       # nothing else crosses
    check_plan(rep.graph, c, sched.to_plan()).raise_if_invalid()


def test_replica_halves_the_batch_and_keeps_its_variables():
    rep = replicate(_step(), 2)
    g = rep.graph
    assert g.op("h@r1").compute["GPU"] == 20.0 and g.tensor("h:0@r1").bytes == 1000
    assert g.op("w@r0").persistent_bytes == g.op("w@r1").persistent_bytes == 4000
    assert g.colocation_groups()["w@r1"] == ["w@r1", "apply@r1"]
    assert g.op("dw:0@ag0@r1").compute["GPU"] == 0.0 and g.op("dw:0@allreduce@r0").output_bytes == 4000
    assert g.op("dw:0@rs0@r0").compute["GPU"] == max(FLOOR_US, 3 * 2000 / 900e3)


def test_one_replica_is_the_step():
    g = _step()
    rep = replicate(g, 1)
    assert (rep.graph.num_ops, rep.graph.num_edges, rep.graph.total_work()) == (g.num_ops, g.num_edges, g.total_work())


def test_data_parallel_beats_one_device_when_links_are_fast():
    g = _step()
    c = gpus(2, beta=(1.0, 1e-6))
    one = simulate(g, c, {n: "/GPU:0" for n in g.names}).makespan
    rep = replicate(g, 2)
    assert simulate(rep.graph, c, rep.placement(c.names)).makespan < one


def test_replicas_then_micro_batches_accumulate_before_the_all_reduce():
    rep = replicate(_step(), 2)
    s = split_step(rep.graph, 3)
    accs = [n for n in s.graph.names if "@acc" in n]
    assert len(accs) == 2 * 2 * 2   # 2 replicas x 2 chunk tensors x (3 - 1) adds
    assert all(s.graph.successors(a)[0].startswith(("dw:0@rs", "dw:0@r")) for a in accs)
    c = v100x4_pcie(with_cpu=False)
    placement = {n: c.names[rep.origin[o.op].replica] for n, o in s.origin.items()}
    check_plan(s.graph, c, simulate(s.graph, c, placement).to_plan()).raise_if_invalid()


@SETTINGS
@given(marked_dags(max_ops=9), st.integers(1, 4))
def test_property_every_replica_is_the_step(g, n):
    rep = replicate(g, n)
    out = rep.graph
    assert len(out.topological_order()) == out.num_ops
    parts = partial_tensors(g)
    fixed = fixed_ops(g, parts)
    for e in g.edges:
        crosses = g.op(e.src).batch and not g.op(e.dst).batch and e.tensors
        for r in range(n):
            if crosses and n > 1:   # the step reads the all-reduced gradient
                assert all(out.has_edge(f"{t}@allreduce@r{r}", f"{e.dst}@r{r}") for t in e.tensors)
            else:
                assert out.has_edge(f"{e.src}@r{r}", f"{e.dst}@r{r}")
    for op in g.ops:
        for r in range(n):
            got = out.op(f"{op.name}@r{r}")
            if not op.batch or op.name in fixed:
                assert dict(got.compute) == dict(op.compute)
            else:
                assert all(got.compute[k] == max(t / n, min(t, FLOOR_US)) for k, t in op.compute.items())
    ring = [o for o in rep.origin.values() if o.role == "reduce-scatter"]
    step = {t for t in parts if any(not g.op(c).batch for c in g.consumers()[t])}
    assert len(ring) == (n * (n - 1) * len(step) if n > 1 else 0)


@pytest.mark.parametrize("bad", [0, 1.5, "2"])
def test_bad_replica_counts_are_named(bad):
    with pytest.raises(MicroBatchError, match="replicas must be an integer >= 1"):
        replicate(_step(), bad)


def test_unmarked_graph_and_too_few_devices_are_refused():
    with pytest.raises(BatchMarkError, match="no batch mark"):
        replicate(OpGraph([Op("a", {"GPU": 1.0})]), 2)
    with pytest.raises(MicroBatchError, match="3 replicas need as many devices"):
        replicate(_step(), 3).placement(["/GPU:0", "/GPU:1"])
    assert microbatch(replicate(_step(), 2).graph, 1).num_ops == replicate(_step(), 2).graph.num_ops
