"""pesto.step.replicate: data parallelism as a graph with a ring all-reduce (issue 24)."""
from __future__ import annotations

import hashlib
import math
import re
from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from mb_strategies import marked_dags
from pesto.cluster import gpus, hosts, v100x4_pcie
from pesto.errors import BatchMarkError, MicroBatchError
from pesto.graph import Edge, Op, OpGraph, Tensor
from pesto.plan import check_plan
from pesto.step import compose, replicate, split
from pesto.step.slicing import FLOOR_US, fixed_ops, partial_tensors
from pesto.step.replication import BUCKET_BYTES, RESERVED, gradient_buckets, pack_buckets
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
    s = split(rep.graph, 3)
    accs = [n for n in s.graph.names if "@acc" in n]
    assert len(accs) == 2 * 2 * 2   # 2 replicas x 2 chunk tensors x (3 - 1) adds
    assert all(s.graph.successors(a)[0].startswith(("dw:0@rs", "dw:0@r")) for a in accs)
    c = v100x4_pcie(with_cpu=False)
    placement = {n: c.names[rep.origin[o.op].replica] for n, o in s.origin.items()}
    check_plan(s.graph, c, simulate(s.graph, c, placement).to_plan()).raise_if_invalid()


@SETTINGS
@given(marked_dags(max_ops=9), st.integers(1, 4), st.sampled_from([None, 0, 1, 64, BUCKET_BYTES]))
def test_property_every_replica_is_the_step(g, n, bucket):
    rep = replicate(g, n, bucket_bytes=bucket)
    out = rep.graph
    first = {t: m[0] for m in gradient_buckets(g, bucket) for t in m}
    assert len(out.topological_order()) == out.num_ops
    parts = partial_tensors(g)
    fixed = fixed_ops(g, parts)
    for e in g.edges:
        crosses = g.op(e.src).batch and not g.op(e.dst).batch and e.tensors
        for r in range(n):
            if crosses and n > 1:   # the step reads the all-reduced gradient from its bucket's ring
                assert all(f"{t}@allreduce@r{r}" in out.edge(f"{first[t]}@allreduce@r{r}", f"{e.dst}@r{r}").tensors
                           for t in e.tensors)
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
    assert set(first) == step
    assert len(ring) == (n * (n - 1) * len(set(first.values())) if n > 1 else 0)


@pytest.mark.parametrize("bad", [0, 1.5, "2"])
def test_bad_replica_counts_are_named(bad):
    with pytest.raises(MicroBatchError, match="replicas must be an integer >= 1"):
        replicate(_step(), bad)


def test_unmarked_graph_and_too_few_devices_are_refused():
    with pytest.raises(BatchMarkError, match="no batch mark"):
        replicate(OpGraph([Op("a", {"GPU": 1.0})]), 2)
    with pytest.raises(MicroBatchError, match="3 replicas need as many devices"):
        replicate(_step(), 3).placement(["/GPU:0", "/GPU:1"])
    assert split(replicate(_step(), 2).graph, 1).graph.num_ops == replicate(_step(), 2).graph.num_ops


# -- gradient buckets ------------------------------------------------------------

def _grads(sizes):
    """A chain of ``len(sizes)`` layers, layer ``i`` with a gradient ``g{i}:1`` of ``sizes[i]`` bytes."""
    ops = [Op("x", {"GPU": 1.0}, output_bytes=1000, batch=True)]
    ts, es, prev = [Tensor("x:0", "x", 1000)], [], "x"
    for i, b in enumerate(sizes):
        ops += [Op(f"w{i}", {"GPU": 0.0}, persistent_bytes=b, output_bytes=b, batch=False, colocation_group=f"w{i}"),
                Op(f"g{i}", {"GPU": 30.0}, output_bytes=1000 + b, batch=True),
                Op(f"apply{i}", {"GPU": 2.0}, batch=False, colocation_group=f"w{i}")]
        ts += [Tensor(f"w{i}:0", f"w{i}", b), Tensor(f"g{i}:0", f"g{i}", 1000), Tensor(f"g{i}:1", f"g{i}", b)]
        es += [Edge(prev, f"g{i}", f"{prev}:0"), Edge(f"w{i}", f"g{i}", f"w{i}:0"),
               Edge(f"g{i}", f"apply{i}", f"g{i}:1"), Edge(f"w{i}", f"apply{i}", f"w{i}:0")]
        prev = f"g{i}"
    return OpGraph(ops, es, ts, name="grads")


def _fingerprint(g):
    text = repr(([(o.name, sorted(o.compute.items()), o.output_bytes, o.persistent_bytes, o.colocation_group,
                   o.type, o.batch) for o in g.ops],
                 sorted((e.src, e.dst, e.tensors) for e in g.edges), [(t.name, t.src, t.bytes) for t in g.tensors]))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@pytest.mark.parametrize("bucket", [None, 0, 1])
@pytest.mark.parametrize("n, old", [(2, "2ee9640a85516828"), (3, "739a22d32774376a")])
def test_no_buckets_is_the_old_graph_op_for_op(n, old, bucket):
    # fingerprints of the one-ring-per-tensor graph before buckets existed
    assert _fingerprint(replicate(_grads([4000, 96, 2500]), n, bucket_bytes=bucket).graph) == old


@SETTINGS
@given(st.lists(st.integers(0, 100), max_size=30), st.one_of(st.none(), st.integers(0, 150)))
def test_property_buckets_pack_in_order_within_the_size(sizes, cap):
    out = pack_buckets(sizes, cap)
    assert [i for b in out for i in b] == list(range(len(sizes)))       # each once, order kept
    for k, b in enumerate(out):
        total = sum(sizes[i] for i in b)
        assert len(b) == 1 or (cap and total <= cap)
        if cap and k + 1 < len(out):                                    # closed only when the next overflows
            assert total + sizes[out[k + 1][0]] > cap


def test_buckets_follow_the_backward_pass_and_name_the_first_member():
    g = _grads([4000, 96, 2500])
    assert gradient_buckets(g, 4100) == [("g0:1", "g1:1"), ("g2:1",)]   # g0 is finished first
    rep = replicate(g, 2, bucket_bytes=4100)
    assert rep.origin["g0:1@rs0@r1"].members == ("g0:1", "g1:1") and rep.origin["g0:1@rs0@r1"].op == "g0"
    assert rep.graph.tensor("g0:1@r0/chunk1").bytes == math.ceil(4096 / 2)
    assert set(rep.graph.predecessors("g0:1@rs0@r1")) == {"g0@r0", "g1@r0", "g0@r1", "g1@r1"}
    for r in range(2):
        for i in (0, 1):   # every member's consumer reads its slice of the bucket's gather
            assert rep.graph.edge(f"g0:1@allreduce@r{r}", f"apply{i}@r{r}").tensors == (f"g{i}:1@allreduce@r{r}",)
    assert rep.graph.op("g0:1@allreduce@r0").output_bytes == 4096
    assert not any(n.startswith("g1:1@") for n in rep.graph.names)   # no ring of its own
    assert RESERVED.search("g1:1@rs0@r1") and RESERVED.search("g0:1@allreduce@r0")


@pytest.mark.parametrize("n", [2, 4])
def test_bucket_ring_sums_every_chunk_over_every_replica(n):
    rep = replicate(_grads([300, 200, 100]), n, bucket_bytes=10**6)
    val = _ring_values(rep)
    for r in range(n):
        assert val[f"g0:1@allreduce@r{r}"] == {j: set(range(n)) for j in range(n)}


def test_buckets_shorten_the_data_parallel_step_of_many_small_gradients():
    from solver.parallel.pipelines import data_parallel_plan
    g = _grads([4096] * 40)
    c = hosts(4, 2, "ib_hdr")
    fused = replicate(g, 8)
    alone = replicate(g, 8, bucket_bytes=None)
    assert len([o for o in fused.origin.values() if o.role == "gather"]) == 8
    sims = [simulate(r.graph, c, r.placement(c.names)) for r in (fused, alone)]
    assert sims[0].makespan < sims[1].makespan
    plan = data_parallel_plan(g, c).plan
    check_plan(fused.graph, c, plan).raise_if_invalid()
    assert plan.makespan < sims[1].makespan


def test_a_gradient_produced_after_the_open_buckets_all_reduce_starts_a_new_bucket():
    # dw0 is all-reduced and read by the once-per-step `mid`, which feeds the batched
    # dw1: fusing dw0 and dw1 would make the ring wait for itself (hypothesis found it)
    from pesto.graph import Edge, Op, OpGraph, Tensor
    ops = [Op("dw0", {"GPU": 1.0}, batch=True), Op("mid", {"GPU": 1.0}, batch=False),
           Op("dw1", {"GPU": 1.0}, batch=True), Op("apply", {"GPU": 1.0}, batch=False)]
    g = OpGraph(ops, [Edge("dw0", "mid", "dw0:0"), Edge("mid", "dw1", "mid:0"), Edge("dw1", "apply", "dw1:0")],
                [Tensor("dw0:0", "dw0", 0), Tensor("mid:0", "mid", 0), Tensor("dw1:0", "dw1", 0)])
    assert gradient_buckets(g, 1 << 20) == [("dw0:0",), ("dw1:0",)]
    rep = replicate(g, 2, bucket_bytes=1 << 20)   # builds: no cycle
    assert rep.graph.num_ops > g.num_ops


# -- one Transformed, compose -----------------------------------------------------

@pytest.mark.parametrize("n,m", [(2, 3), (3, 2), (1, 2)])
def test_compose_maps_a_split_replicated_step_to_the_step(n, m):
    step = _step()
    rep = replicate(step, n)
    inner = split(rep.graph, m)
    both = compose(inner, rep)
    assert both.graph is inner.graph and both.source is step
    assert (both.replicas, both.micro_batches) == (n, m)
    for name, o in both.origin.items():
        i = inner.origin[name]
        r = rep.origin[i.op]
        assert o.op == r.op and o.replica == r.replica and o.slice == i.slice   # straight to the step's op
        assert o.role == (i.role if i.role not in ("copy", "step") else r.role)
        if o.tensor is not None:
            assert step.has_tensor(o.tensor) and all(step.has_tensor(t) for t in o.members)
    batched = [op.name for op in step.ops if op.batch]
    for op in batched:   # every batched op: one copy per replica and slice
        copies = both.copies(op)
        assert sorted((both.origin[c].replica, both.origin[c].slice) for c in copies) == \
            [(r, s) for r in range(n) for s in range(m)]
    acc = [o for o in both.origin.values() if o.role == "accumulate"]
    assert acc and all(o.tensor == "dw:0" and o.op == "dw" and 0 < o.slice < m for o in acc)
    assert {o.replica for o in acc} == set(range(n)) and both.partials == {"dw:0"}


def test_compose_refuses_a_transform_of_another_graph():
    rep = replicate(_step(), 2)
    with pytest.raises(ValueError, match="made from"):
        compose(split(_step(), 2), rep)


def test_anchor_marks_follow_the_copies():
    g = _step()
    g = OpGraph([replace(op, anchor="h", phase="weight-grad") if op.name == "dw" else op for op in g.ops],
                g.edges, g.tensors, name=g.name)
    s = split(g, 2).graph
    assert s.op("dw@mb1").anchor == "h@mb1" and s.op("dw@mb1").phase == "weight-grad"
    r = replicate(g, 2).graph
    assert r.op("dw@r1").anchor == "h@r1"
    both = split(r, 2).graph
    assert both.op("dw@r1@mb0").anchor == "h@r1@mb0"
