"""pesto.step.split: the micro-batched step as an OpGraph (issue 24)."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from mb_strategies import mark, marked_dags
from strategies import placements
from pesto.cluster import gpus
from pesto.errors import BatchMarkError, MicroBatchError
from pesto.graph import Edge, Op, OpGraph, Tensor
from pesto.step import Origin, check_count, split
from pesto.step.slicing import BANDWIDTH, FLOOR_US, fixed_ops, parse_name, partial_tensors
from pesto.plan import check_plan
from pesto.simulate import simulate

SETTINGS = settings(max_examples=60, deadline=None)


def _step():
    """x -> h -> loss -> dh -> dw (weight gradient, a partial) -> apply; w read by h and apply."""
    ops = [Op("x", {"GPU": 0.5}, output_bytes=1000, batch=True, type="Placeholder"),
           Op("w", {"GPU": 0.0}, persistent_bytes=400, output_bytes=400, batch=False),
           Op("h", {"GPU": 40.0}, output_bytes=2000, temporary_bytes=100, batch=True),
           Op("dh", {"GPU": 80.0}, output_bytes=2000, batch=True),
           Op("dw", {"GPU": 60.0}, output_bytes=400, batch=True),
           Op("apply", {"GPU": 5.0}, batch=False, colocation_group="w"),
           Op("read", {"GPU": 0.0}, output_bytes=400, batch=False, colocation_group="w")]
    ts = [Tensor("x:0", "x", 1000), Tensor("w:0", "w", 400), Tensor("h:0", "h", 2000),
          Tensor("dh:0", "dh", 2000), Tensor("dw:0", "dw", 400), Tensor("read:0", "read", 400)]
    es = [Edge("x", "h", "x:0"), Edge("w", "read", "w:0"), Edge("read", "h", "read:0"), Edge("h", "dh", "h:0"),
          Edge("x", "dw", "x:0"), Edge("dh", "dw", "dh:0"), Edge("dw", "apply", "dw:0"),
          Edge("w", "apply", "w:0")]
    return OpGraph(ops, es, ts, name="step")


def _split_graph(graph, m, **kw):
    return split(graph, m, **kw).graph


# -- the cost rule ---------------------------------------------------------------

def test_cost_rule_of_a_copy():
    s = split(_step(), 4).graph
    h = s.op("h@mb2")
    assert h.compute["GPU"] == 10.0 and h.output_bytes == 500 and h.temporary_bytes == 25
    assert s.op("x@mb0").compute["GPU"] == 0.5          # below the floor: keeps its time
    assert s.tensor("h:0@mb3").bytes == 500 and s.tensor("x:0@mb1").bytes == 250
    assert s.tensor("dw:0@mb1").bytes == 400            # a partial is weight-shaped: whole
    assert s.op("dw@mb1").output_bytes == 400 and s.op("dw@mb1").compute["GPU"] == 15.0
    assert s.op("w").persistent_bytes == 400            # not copied
    assert _split_graph(_step(), 40).op("h@mb0").compute["GPU"] == FLOOR_US   # 40 / 40 < floor


def test_accumulate_chain_and_its_cost():
    s = split(_step(), 3)
    g = s.graph
    assert [n for n in g.names if "@acc" in n] == ["dw:0@acc1", "dw:0@acc2"]
    assert sorted(g.predecessors("dw:0@acc1")) == ["dw@mb0", "dw@mb1"]
    assert sorted(g.predecessors("dw:0@acc2")) == ["dw:0@acc1", "dw@mb2"]
    assert sorted(g.predecessors("apply")) == ["dw:0@acc2", "w"]
    acc = g.op("dw:0@acc1")
    assert acc.compute["GPU"] == max(FLOOR_US, 3 * 400 / BANDWIDTH["GPU"]) and acc.batch is False
    assert s.origin["dw:0@acc2"] == Origin("dw", slice=2, role="accumulate", tensor="dw:0")
    big = OpGraph([Op("g", {"GPU": 1.0}, output_bytes=9 * 10**6, batch=True), Op("a", {"GPU": 1.0}, batch=False)],
                  [Edge("g", "a", "g:0")], [Tensor("g:0", "g", 9 * 10**6)])
    assert _split_graph(big, 2).op("g:0@acc1").compute["GPU"] == pytest.approx(30.0)   # 3 x 9 MB / 900 GB/s


def test_sum_of_partials_keeps_its_cost_and_its_inputs_stay_whole():
    """An AddN summing a weight's per-time-step gradients works per weight element."""
    ops = [Op("x", {"GPU": 8.0}, output_bytes=800, batch=True), Op("g0", {"GPU": 8.0}, output_bytes=64, batch=True),
           Op("g1", {"GPU": 8.0}, output_bytes=64, batch=True),
           Op("sum", {"GPU": 30.0}, output_bytes=64, temporary_bytes=64, batch=True, role="grad-sum"),
           Op("apply", {"GPU": 1.0}, batch=False)]
    ts = [Tensor("x:0", "x", 800), Tensor("g0:0", "g0", 64), Tensor("g1:0", "g1", 64), Tensor("sum:0", "sum", 64)]
    es = [Edge("x", "g0", "x:0"), Edge("x", "g1", "x:0"), Edge("g0", "sum", "g0:0"), Edge("g1", "sum", "g1:0"),
          Edge("sum", "apply", "sum:0")]
    g = OpGraph(ops, es, ts)
    assert partial_tensors(g) == {"g0:0", "g1:0", "sum:0"}
    s = _split_graph(g, 4)
    assert s.op("sum@mb1").compute["GPU"] == 30.0 and s.op("sum@mb1").temporary_bytes == 64
    assert s.tensor("g0:0@mb2").bytes == 64 and s.op("g0@mb2").compute["GPU"] == 2.0
    not_a_sum = OpGraph([o if o.name != "sum" else Op("sum", {"GPU": 30.0}, output_bytes=64, batch=True,
                                                         type="Concat") for o in ops], es, ts)
    assert partial_tensors(not_a_sum) == {"sum:0"}   # a size match alone proves nothing


def test_colocation_rule():
    ops = [Op("v", {"GPU": 0.0}, persistent_bytes=8, batch=False, colocation_group="var"),
           Op("lookup", {"GPU": 4.0}, output_bytes=8, batch=True, colocation_group="var"),
           Op("a", {"GPU": 4.0}, output_bytes=8, batch=True, colocation_group="pair"),
           Op("b", {"GPU": 4.0}, batch=True, colocation_group="pair")]
    g = _split_graph(OpGraph(ops, [Edge("v", "lookup"), Edge("lookup", "a", "l:0"), Edge("a", "b", "a:0")],
                           [Tensor("l:0", "lookup", 8), Tensor("a:0", "a", 8)]), 2)
    groups = g.colocation_groups()
    assert sorted(groups["var"]) == ["lookup@mb0", "lookup@mb1", "v"]   # every slice with the variable
    assert groups["pair@mb0"] == ["a@mb0", "b@mb0"] and groups["pair@mb1"] == ["a@mb1", "b@mb1"]


# -- structure -------------------------------------------------------------------

def test_slices_pipeline_on_two_devices():
    """a -> b, a's copies on GPU 0 and b's on GPU 1: slice 1's a overlaps slice 0's b."""
    g = mark(OpGraph.from_edges({"a": 10, "b": 10}, [("a", "b", 0)]), {"a", "b"})
    s = _split_graph(g, 2)
    c = gpus(2, beta=(0.0, 0.0))
    pl = {"a@mb0": "/GPU:0", "a@mb1": "/GPU:0", "b@mb0": "/GPU:1", "b@mb1": "/GPU:1"}
    sched = simulate(s, c, pl)
    assert sched.makespan == 15.0 and sched.start["a@mb1"] == 5.0 and sched.start["b@mb0"] == 5.0
    assert simulate(g, c, {"a": "/GPU:0", "b": "/GPU:1"}).makespan == 20.0


def test_one_micro_batch_is_the_step_itself():
    g = _step()
    s = split(g, 1)
    assert s.graph is g and s.source is g and s.micro_batches == 1
    assert s.copies("h") == ("h",) and s.copies("w") == ("w",)
    assert (s.origin["h"].slice, s.origin["h"].role, s.origin["w"].role) == (0, "copy", "step")
    with pytest.raises(BatchMarkError, match="no batch mark"):   # the same checks as any split
        split(OpGraph([Op("a", {"GPU": 1.0})]), 1)


def _name(s, op: str, i: int = 0) -> str:
    return s.copies(op)[i] if s.source.op(op).batch else op


@SETTINGS
@given(marked_dags())
def test_property_m1_preserves_ops_edges_work_and_bytes(g):
    s = split(g, 1)
    assert (s.graph.num_ops, s.graph.num_edges, len(s.graph.tensors)) == (g.num_ops, g.num_edges, len(g.tensors))
    for kind in ("GPU", "CPU"):
        assert s.graph.total_work(kind) == pytest.approx(g.total_work(kind))
    for e in g.edges:
        u, v = _name(s, e.src), _name(s, e.dst)
        assert s.graph.has_edge(u, v) and s.graph.edge_bytes(u, v) == g.edge_bytes(e.src, e.dst)
    assert sum(o.output_bytes + o.temporary_bytes + o.persistent_bytes for o in s.graph.ops) == \
        sum(o.output_bytes + o.temporary_bytes + o.persistent_bytes for o in g.ops)


@SETTINGS
@given(marked_dags(), st.integers(2, 5))
def test_property_acyclic_and_every_copy_follows_the_pattern(g, m):
    s = split(g, m)
    out = s.graph
    assert len(out.topological_order()) == out.num_ops            # built, so acyclic
    reach = _descendants(out)
    for e in g.edges:
        bu, bv = g.op(e.src).batch, g.op(e.dst).batch
        for i in range(m):
            if bu and bv:
                assert out.has_edge(s.copies(e.src)[i], s.copies(e.dst)[i])
            elif bv:
                assert out.has_edge(e.src, s.copies(e.dst)[i])
            elif bu:
                assert e.dst in reach[s.copies(e.src)[i]]
            else:
                assert out.has_edge(e.src, e.dst)
    for e in out.edges:   # copies of different slices meet only through once-per-step ops
        a, b = s.origin[e.src], s.origin[e.dst]
        if a.role == "copy" and b.role == "copy":
            assert a.slice == b.slice


@SETTINGS
@given(marked_dags(), st.integers(1, 6))
def test_property_work_and_bytes_scale_as_stated(g, m):
    s = split(g, m)
    parts = s.partials
    fixed = fixed_ops(g, parts)
    for op in g.ops:
        copies = [s.graph.op(n) for n in s.copies(op.name)]
        if not op.batch:
            assert copies == [op]
            continue
        for k, t in op.compute.items():
            want = t if op.name in fixed else max(t / m, min(t, FLOOR_US))
            assert sum(c.compute[k] for c in copies) == pytest.approx(m * want)
            assert want <= t
    for t in g.tensors:
        if g.op(t.src).batch:
            want = t.bytes if t.name in parts else math.ceil(t.bytes / m)
            names = [t.name] if m == 1 else [f"{t.name}@mb{i}" for i in range(m)]   # M = 1: the step itself
            assert all(s.graph.tensor(n).bytes == want for n in names)
    step = {t for t in parts if any(not g.op(c).batch for c in g.consumers()[t])}
    assert sum(o.role == "accumulate" for o in s.origin.values()) == (m - 1) * len(step)


@SETTINGS
@given(marked_dags(max_ops=8), st.integers(1, 3), st.data())
def test_property_split_graph_simulates_and_checks(g, m, data):
    out = _split_graph(g, m)
    c = gpus(2, with_cpu=True)
    sched = simulate(out, c, data.draw(placements(out, c)))
    assert sched.makespan >= out.critical_path() - 1e-6
    check_plan(out, c, sched.to_plan()).raise_if_invalid()


def _descendants(g):
    out = {}
    for n in reversed(g.topological_order()):
        d = set()
        for s in g.successors(n):
            d |= out[s] | {s}
        out[n] = d
    return out


# -- errors ----------------------------------------------------------------------

@pytest.mark.parametrize("bad", [0, -2, 2.5, "2", True, None])
def test_bad_micro_batch_counts_are_named(bad):
    with pytest.raises(MicroBatchError, match="micro_batches must be an integer >= 1"):
        _split_graph(_step(), bad)


def test_numpy_integers_are_counts():
    np = pytest.importorskip("numpy")
    assert check_count(np.int64(3)) == 3


def test_unmarked_ops_are_named_all_of_them():
    ops = [Op(f"o{i}", {"GPU": 1.0}) for i in range(25)] + [Op("m", {"GPU": 1.0}, batch=True)]
    with pytest.raises(BatchMarkError, match=r"25 op\(s\) have no batch mark.*'o0'.*and 5 more") as err:
        _split_graph(OpGraph(ops), 2)
    assert len(err.value.ops) == 25 and err.value.culprit == "o0"


def test_a_graph_without_batched_ops_is_refused():
    with pytest.raises(BatchMarkError, match="has no batched op"):
        _split_graph(OpGraph([Op("a", {"GPU": 1.0}, batch=False)], name="flat"), 2)


def test_batched_ops_with_weights_and_reserved_names_are_refused():
    with pytest.raises(BatchMarkError, match=r"hold persistent bytes .*: 'w'"):
        _split_graph(OpGraph([Op("w", {"GPU": 1.0}, persistent_bytes=8, batch=True)]), 2)
    with pytest.raises(BatchMarkError, match="names look like the ones the split makes.*'a@mb1'"):
        _split_graph(OpGraph([Op("a@mb1", {"GPU": 1.0}, batch=True)]), 2)


def test_a_kind_without_bandwidth_is_named():
    g = OpGraph([Op("g", {"TPU": 1.0}, output_bytes=8, batch=True), Op("a", {"TPU": 1.0}, batch=False)],
                [Edge("g", "a", "g:0")], [Tensor("g:0", "g", 8)])
    with pytest.raises(MicroBatchError, match="no memory bandwidth for device kind 'TPU'.*'g:0'"):
        _split_graph(g, 2)
    assert _split_graph(g, 2, bandwidth={"TPU": 1e6}).op("g:0@acc1").compute["TPU"] == FLOOR_US


def test_names_parse_back():
    s = split(_step(), 3)
    for name, origin in s.origin.items():
        got = parse_name(name)
        assert (got.op, got.slice, got.role) == (origin.op, origin.slice, origin.role)
