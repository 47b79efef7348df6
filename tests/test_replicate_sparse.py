"""A sparse gradient (an embedding's ``IndexedSlices``) in the data-parallel step
(:func:`pesto.step.replicate`), as TensorFlow's replicated step runs it
(:mod:`tf_patch.replicastep`): every replica's rows all-gathered, not
all-reduced; under ZeRO-1/2 the update by rows and an all-gather of the whole
variable's updated rows (issue 30, item 3)."""
from __future__ import annotations

from pathlib import Path

import pytest

from pesto.api import marked
from pesto.cluster import gpus
from pesto.graph import Edge, Op, OpGraph, Tensor
from pesto.plan import check_plan
from pesto.step import compose, replicate, split
from pesto.step.replication import gradient_buckets, sparse_updates
from pesto.step.slicing import sparse_partials
from solver.parallel.pipelines import data_parallel_plan
from tf_patch.marks import mark_sparse, sparse_grads

ROWS, IDS, V, W = 800, 80, 4000, 400
T6 = Path(__file__).resolve().parent.parent / "benchmarks" / "graphs" / "transformer_6.json.gz"


def _embedding_step(role="sparse-grad"):
    """An embedding ``emb`` (Adam slot ``m``) looked up by ``x``, a dense weight ``w``; the
    embedding's gradient is rows (``rows:0``) and indices (``ids:0``), its update a v1
    optimizer's: ``Unique``, ``UnsortedSegmentSum``, the slot's dense decay, a scatter-add, the write."""
    b, u = dict(batch=True), dict(batch=False, phase="update")
    ops = [Op("x", {"GPU": 4.0}, output_bytes=IDS, type="Placeholder", phase="forward", **b),
           Op("emb", {"GPU": 0.0}, persistent_bytes=V, batch=False, type="VarHandleOp"),
           Op("w", {"GPU": 0.0}, persistent_bytes=W, batch=False, type="VarHandleOp"),
           Op("m", {"GPU": 0.0}, persistent_bytes=V, batch=False, type="VarHandleOp"),
           Op("lookup", {"GPU": 8.0}, output_bytes=ROWS, type="ResourceGather", phase="forward", **b),
           Op("mm", {"GPU": 40.0}, output_bytes=ROWS, type="MatMul", phase="forward", **b),
           Op("gmm", {"GPU": 40.0}, output_bytes=ROWS, type="MatMul", phase="input-grad", **b),
           Op("dw", {"GPU": 40.0}, output_bytes=W, type="MatMul", phase="weight-grad", **b),
           Op("rows", {"GPU": 4.0}, output_bytes=ROWS, type="Reshape", phase="weight-grad", role=role, **b),
           Op("ids", {"GPU": 4.0}, output_bytes=IDS, type="Reshape", phase="weight-grad", role=role, **b),
           Op("unique", {"GPU": 8.0}, output_bytes=IDS, type="Unique", **u),
           Op("uss", {"GPU": 8.0}, output_bytes=ROWS, type="UnsortedSegmentSum", **u),
           Op("decay", {"GPU": 40.0}, output_bytes=V, batch=False, phase="forward", type="Mul"),
           Op("scatter", {"GPU": 8.0}, type="ResourceScatterAdd", **u),
           Op("write", {"GPU": 40.0}, type="AssignSubVariableOp", **u),
           Op("apply_w", {"GPU": 20.0}, type="ResourceApplyAdam", **u),
           Op("done", {"GPU": 0.0}, type="NoOp", **u)]
    es = [Edge("x", "lookup", "x:0"), Edge("emb", "lookup", ()), Edge("lookup", "mm", "lookup:0"),
          Edge("w", "mm", ()), Edge("mm", "gmm", "mm:0"), Edge("mm", "dw", "mm:0"), Edge("lookup", "dw", "lookup:0"),
          Edge("gmm", "rows", "gmm:0"), Edge("x", "ids", "x:0"), Edge("ids", "unique", "ids:0"),
          Edge("rows", "uss", "rows:0"), Edge("unique", "uss", "unique:0"), Edge("m", "decay", ()),
          Edge("uss", "scatter", "uss:0"), Edge("decay", "scatter", "decay:0"), Edge("m", "scatter", ()),
          Edge("scatter", "write", ()), Edge("emb", "write", ()), Edge("dw", "apply_w", "dw:0"),
          Edge("w", "apply_w", ()), Edge("write", "done", ()), Edge("apply_w", "done", ())]
    ts = [Tensor(f"{n}:0", n, nb) for n, nb in [("x", IDS), ("lookup", ROWS), ("mm", ROWS), ("gmm", ROWS),
                                                ("dw", W), ("rows", ROWS), ("ids", IDS), ("unique", IDS),
                                                ("uss", ROWS), ("decay", V)]]
    return OpGraph(ops, es, ts, name="embedding")


def _received(rep, r, tensors):
    """Bytes replica ``r`` receives from other replicas for ring ops of a bucket with a member in ``tensors``."""
    g = rep.graph
    return sum(g.tensor(t).bytes for e in g.edges if rep.origin[e.dst].replica == r
               and rep.origin[e.src].replica != r and set(rep.origin[e.dst].members) & set(tensors)
               for t in e.tensors)


def test_the_rows_and_indices_of_one_variable_are_one_sparse_gradient():
    g = _embedding_step()
    assert sparse_partials(g) == {"rows:0", "ids:0"}
    assert [t for b in gradient_buckets(g) for t in b] == ["dw:0"]   # gathered, not all-reduced
    u, = sparse_updates(g)
    assert (u.tensors, u.variables, u.slots) == (("ids:0", "rows:0"), ("emb",), ("m",))
    assert set(u.ops) == {"unique", "uss", "decay", "scatter", "write"}   # not what waits for the write
    assert sparse_updates(_embedding_step(role="")) == []


def test_tf_marks_the_producers_of_a_sparse_gradient_even_in_a_graph_marked_before():
    g = _embedding_step(role="")
    assert sparse_grads(g) == {"rows", "ids"}
    assert mark_sparse(g).op("rows").role == "sparse-grad"
    assert marked(g).op("ids").role == "sparse-grad"   # the facade's loading of a graph a front end marked
    again = OpGraph.from_json(mark_sparse(g).to_json())
    assert again.op("rows").role == "sparse-grad"


@pytest.mark.parametrize("n", [2, 4])
def test_replicas_gather_their_rows_not_all_reduce_them(n):
    g = _embedding_step()
    rep = replicate(g, n)
    mine = -(-ROWS // n) + -(-IDS // n)
    for r in range(n):   # N - 1 ring steps of the replica's rows (and indices), where an all-reduce moves 2 (N - 1)
        assert _received(rep, r, {"rows:0"}) == (n - 1) * mine
        assert rep.graph.tensor(f"rows:0@r{r}").bytes == -(-ROWS // n)
    assert not any("rows:0@rs" in x or "ids:0@rs" in x for x in rep.graph.names)
    # the update reads every replica's rows, and runs whole in every replica
    assert rep.graph.edge("ids:0@allreduce@r1", "uss@r1").tensors == ("rows:0@allreduce@r1",)
    assert rep.graph.tensor("rows:0@allreduce@r1").bytes == ROWS
    assert rep.graph.op("decay@r1").compute["GPU"] == 40.0
    assert sorted(rep.graph.predecessors("ids:0@ag0@r1")) == ["ids@r0", "rows@r0"]
    c = gpus(n, memory=10**9)
    sp = data_parallel_plan(g, c)
    assert check_plan(sp.graph, c, sp.plan).ok


@pytest.mark.parametrize("zero", [1, 2])
def test_zero_updates_the_embedding_by_rows_and_gathers_the_whole_variable(zero):
    n = 4
    g = _embedding_step()
    rep = replicate(g, n, shard_optimizer=zero)
    rows = (n - 1) * (-(-ROWS // n) + -(-IDS // n))
    for r in range(n):   # the rows as without sharding, then the updated row pieces of the variable
        assert _received(rep, r, {"rows:0"}) == rows + (n - 1) * -(-V // n)
    for op in ("unique", "uss", "decay", "scatter", "write"):   # the update's ops on 1 / N of the rows
        assert rep.graph.op(f"{op}@r2").compute["GPU"] == pytest.approx(g.op(op).compute["GPU"] / n)
    assert rep.graph.op("decay@r2").output_bytes == V // n
    assert rep.graph.op("m@r2").persistent_bytes == V // n and rep.graph.op("emb@r2").persistent_bytes == V
    assert rep.graph.op("done@r2").compute["GPU"] == 0.0
    assert rep.graph.edge("write@r0", "ids:0@pg0@r1").tensors == ("ids:0@r0/param",)   # the left's updated rows
    assert set(rep.graph.predecessors("ids:0@allgather@r1")) >= {"ids:0@pg2@r1", "write@r1"}
    c = gpus(n, memory=10**9)
    sp = data_parallel_plan(g, c, shard_optimizer=zero)
    assert check_plan(sp.graph, c, sp.plan).ok


def test_zero3_gathers_the_rows_and_updates_by_rows_without_a_variable_all_gather():
    n = 4
    rep = replicate(_embedding_step(), n, shard_optimizer=3)
    assert _received(rep, 1, {"rows:0"}) == (n - 1) * (-(-ROWS // n) + -(-IDS // n))
    assert not any("@pg" in x or x.startswith("ids:0@allgather") for x in rep.graph.names)
    assert rep.graph.op("write@r1").compute["GPU"] == pytest.approx(40.0 / n)
    assert "emb@fwgather@r1" in rep.graph.names   # the lookup reads the gathered variable


def test_a_hybrid_splits_each_replica_and_maps_back_to_the_step():
    g = _embedding_step()
    rep = replicate(g, 2, shard_optimizer=1)
    s = split(rep.graph, 2)
    c = gpus(2, memory=10**9)
    placement = {x: c.names[rep.origin[o.op].replica] for x, o in s.origin.items()}
    from pesto.simulate import simulate
    check_plan(s.graph, c, simulate(s.graph, c, placement).to_plan()).raise_if_invalid()
    both = compose(s, rep)
    assert {o.op for o in both.origin.values()} == set(g.names)


@pytest.mark.skipif(not T6.exists(), reason="cached Transformer-6 graph")
def test_transformer6_embedding_moves_what_tensorflow_moves():
    """Transformer-6 on 4 replicas: its 16 MiB of rows (8192 tokens x 512 floats) and 32 KiB of indices,
    gathered: 3 x 4 MiB per lane, not the all-reduce's 2 x 3 x 4 MiB; ZeRO-1 adds 3 / 4 of the 62.5 MiB
    table's updated rows and runs the Adam ops on a quarter of its rows."""
    g = marked(OpGraph.from_json(T6))
    rows = "gradients/embed/embedding_lookup_grad/Reshape:0"
    u, = sparse_updates(g)
    assert rows in u.tensors and u.variables == ("embed/embedding",)
    table = g.op("embed/embedding").persistent_bytes
    grad = sum(-(-g.tensor(t).bytes // 4) for t in u.tensors)
    plain, zero = replicate(g, 4), replicate(g, 4, shard_optimizer=1)
    assert _received(plain, 1, {rows}) == 3 * grad and 3 * grad < 2 ** 20 * 12.1
    assert _received(zero, 1, {rows}) == 3 * grad + 3 * -(-table // 4)
    work = sum(g.op(x).compute["GPU"] for x in u.ops)
    assert sum(zero.graph.op(f"{x}@r1").compute["GPU"] for x in u.ops) == pytest.approx(work / 4)
