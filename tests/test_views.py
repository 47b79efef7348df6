"""A variable's read shares the variable's buffer: Op.view_bytes in every memory accounting.

The golden case: a variable ``w`` (64 persistent bytes), its read ``r`` (64
output bytes, all a view), a forward consumer ``f`` and a late backward
consumer ``b``. On one device the read adds nothing; without the view it adds
its 64 bytes from ``r`` to ``b``. A consumer on another device receives a copy
that counts there.
"""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from coarsen import coarsen
from pesto.cluster import gpus
from pesto.errors import InfeasibleError, InvalidGraphError
from pesto.graph import Edge, Op, OpGraph, Tensor
from pesto.memory import (MemoryTracker, check_feasible, live_across, memory_profile, static_peak,
                          step_activations)
from pesto.problem import GraphArrays, Problem
from pesto.simulate import simulate
from pesto.step import replicate, split
from solver.parallel.bound import memory_floor
from tf_patch.marks import mark_step, mark_views, views

W = 64


def golden(view: int = W) -> OpGraph:
    """w -> r (the read) -> f -> b, and r -> b (the backward pass reads the weight again)."""
    ops = [Op("w", {"GPU": 0.0}, persistent_bytes=W, colocation_group="w", type="VarHandleOp"),
           Op("r", {"GPU": 0.0}, output_bytes=W, view_bytes=view, colocation_group="w", type="ReadVariableOp"),
           Op("f", {"GPU": 5.0}, output_bytes=10),
           Op("b", {"GPU": 5.0}, output_bytes=1)]
    es = [Edge("w", "r", ("w:0",)), Edge("r", "f", ("r:0",)), Edge("f", "b", ("f:0",)), Edge("r", "b", ("r:0",))]
    ts = [Tensor("w:0", "w", 0), Tensor("r:0", "r", W), Tensor("f:0", "f", 10), Tensor("b:0", "b", 1)]
    return OpGraph(ops, es, ts, name="golden")


def _peaks(g, placement, cluster):
    s = simulate(g, cluster, placement)
    timed = memory_profile(g, cluster, placement, s.start, s.finish, s.transfers)
    assert timed == s.peak_memory
    return timed, memory_profile(g, cluster, placement)


def test_a_read_on_its_variable_s_device_takes_no_memory():
    c = gpus(1)
    here = {n: "/GPU:0" for n in "wrfb"}
    (timed, static), (timed0, static0) = _peaks(golden(), here, c), _peaks(golden(view=0), here, c)
    # persistent 64 + f's 10 (until b) + b's 1; without the view the read's 64 on top
    assert timed == {"/GPU:0": W + 10 + 1} and static == {"/GPU:0": W + 10 + 1}
    assert timed0 == {"/GPU:0": 2 * W + 10 + 1} and static0 == {"/GPU:0": 2 * W + 10 + 1}


def test_a_remote_consumer_still_pays_for_its_copy():
    c = gpus(2)
    split_ = {"w": "/GPU:0", "r": "/GPU:0", "f": "/GPU:1", "b": "/GPU:1"}
    timed, static = _peaks(golden(), split_, c)
    assert timed["/GPU:0"] == W and static["/GPU:0"] == W            # the variable only
    assert timed["/GPU:1"] >= W + 10 and static["/GPU:1"] == W + 10 + 1   # the received copy + f + b


def test_tracker_feasibility_and_floor_hold_the_allocated_bytes():
    g, c = golden(), gpus(2, memory=W + 20)
    p = Problem.of(g, c)
    assert p.out == [0, 0, 10, 1] and GraphArrays.of(g).out.tolist() == [0, 0, 10, 1]
    t = MemoryTracker(p)
    for i in range(p.n):
        t.commit(i, 0)
    assert t.peak[0] <= static_peak(g, c, [0] * p.n)["/GPU:0"] == W + 11
    assert not t.forced
    check_feasible(g, c)   # fits, although persistent + read outputs (128) do not
    assert memory_floor(p) <= W + 20
    with pytest.raises(InfeasibleError):   # the read's own 64 bytes beside the variable's: over
        check_feasible(golden(view=0), gpus(1, memory=W + 20))


def test_view_bytes_round_trip_through_json_and_old_files_load_with_none():
    g = golden()
    doc = json.loads(g.to_json())
    assert [o.get("view_bytes") for o in doc["ops"]] == [None, W, None, None]   # written only when set
    assert OpGraph.from_json(json.dumps(doc)) == g
    assert OpGraph.from_json(json.dumps(doc)).op("r").view_bytes == W
    del doc["ops"][1]["view_bytes"]
    assert OpGraph.from_json(json.dumps(doc)).op("r").view_bytes == 0
    assert OpGraph.from_networkx(g.to_networkx()).op("r").view_bytes == W


def test_a_view_larger_than_the_outputs_is_refused():
    with pytest.raises(InvalidGraphError, match="view_bytes"):
        OpGraph([Op("r", {"GPU": 1.0}, output_bytes=8, view_bytes=9)])


@pytest.mark.parametrize("merge_read", [True, False])
def test_coarsening_keeps_the_view_of_outputs_that_leave_the_vertex(merge_read):
    g = golden()
    part = {"w": 0, "r": 0 if merge_read else 1, "f": 2, "b": 3}
    cg = coarsen(g, target_vertices=1, partition=part, check=True)
    holder = [op for op in cg.graph.ops if "r" in cg.members[op.name]][0]
    assert holder.view_bytes == W and holder.output_bytes >= W
    c = gpus(1)
    one = {n: "/GPU:0" for n in cg.graph.names}
    assert memory_profile(cg.graph, c, one) == {"/GPU:0": W + 10}   # the variable and f (b's output has no reader)


def test_live_across_and_step_activations_leave_views_out():
    g = golden()
    assert live_across(g, "f") == 10 and live_across(golden(view=0), "f") == 10 + W
    ops = [replace(o, batch=o.name in "fb", phase="input-grad" if o.name == "b" else "forward") for o in g.ops]
    acts = step_activations(OpGraph(ops, g.edges, g.tensors))
    assert acts.shared == 0 and acts.batched == 10


# -- the rule (tf_patch.marks.mark_views) --------------------------------------------------------

def _tf_step(sparse: bool = False, group: bool = True, ref: bool = False) -> OpGraph:
    """x -> mm (reads w's read) -> loss -> gradients -> train/apply; ``sparse``: a ResourceGather of w too."""
    g = "w" if group else None
    var = Op("w", {"GPU": 0.0}, persistent_bytes=W, type="VariableV2" if ref else "VarHandleOp", colocation_group=g)
    ops = [Op("x", {"GPU": 0.0}, output_bytes=32, type="Placeholder"), var,
           Op("w/read", {"GPU": 0.0}, output_bytes=W, type="Identity" if ref else "ReadVariableOp",
              colocation_group=g),
           Op("mm", {"GPU": 4.0}, output_bytes=32, type="MatMul", scope="dense"),
           Op("gradients/mm_grad", {"GPU": 4.0}, output_bytes=W, type="MatMul", scope="gradients/mm_grad"),
           Op("train/apply", {"GPU": 1.0}, type="ResourceApplyAdam", scope="train", colocation_group=g)]
    es = [Edge("w", "w/read", ("w:0",)), Edge("x", "mm", ("x:0",)), Edge("w/read", "mm", ("w/read:0",)),
          Edge("x", "gradients/mm_grad", ("x:0",)), Edge("mm", "gradients/mm_grad", ("mm:0",)),
          Edge("gradients/mm_grad", "train/apply", ("gradients/mm_grad:0",)), Edge("w", "train/apply", ("w:0",))]
    ts = [Tensor("x:0", "x", 32), Tensor("w:0", "w", 0), Tensor("w/read:0", "w/read", W), Tensor("mm:0", "mm", 32),
          Tensor("gradients/mm_grad:0", "gradients/mm_grad", W)]
    if sparse:
        ops.append(Op("gather", {"GPU": 1.0}, output_bytes=8, type="ResourceGather", colocation_group=g))
        es.append(Edge("w", "gather", ("w:0",)))
    return OpGraph(ops, es, ts, name="step")


def test_the_rule_marks_a_read_of_a_dense_variable():
    assert views(_tf_step()) == {"w/read": W}
    assert mark_step(_tf_step()).op("w/read").view_bytes == W
    assert views(_tf_step(ref=True)) == {"w/read": W}   # Identity of a ref variable


@pytest.mark.parametrize("case", ["sparse", "no group"])
def test_the_rule_leaves_a_copying_read(case):
    g = _tf_step(sparse=case == "sparse", group=case != "no group")
    assert views(g) == {} and mark_views(g) is g


def test_the_rule_is_idempotent_and_keeps_a_given_view():
    once = mark_views(_tf_step())
    assert mark_views(once) is once
    given = OpGraph([replace(o, view_bytes=10) if o.name == "w/read" else o for o in _tf_step().ops],
                    _tf_step().edges, _tf_step().tensors)
    assert mark_views(given).op("w/read").view_bytes == 10


def test_the_facade_marks_views_at_load():
    from pesto.api import load_graph, marked

    assert load_graph(_tf_step()).op("w/read").view_bytes == W
    assert marked(_tf_step()).op("w/read").view_bytes == W


# -- step transforms -----------------------------------------------------------------------------

def _viewed_deep(layers: int = 2, weight: int = 4000):
    from mb_strategies import deep_step

    g = deep_step(layers, weight=weight, act=1000)
    ops = [replace(o, output_bytes=weight, view_bytes=weight) if o.name.endswith("/read") else o for o in g.ops]
    ts = [Tensor(t.name, t.src, weight) if t.src.endswith("/read") else t for t in g.tensors]
    return OpGraph(ops, g.edges, ts, name=g.name)


def test_split_keeps_one_read_per_step_and_its_view():
    g = _viewed_deep()
    s = split(g, 4).graph
    reads = [o for o in s.ops if "/read" in o.name]
    assert len(reads) == 2 and all(o.view_bytes == o.output_bytes == 4000 for o in reads)


def test_zero3_reads_view_the_shard_and_gathers_allocate():
    g = _viewed_deep()
    rep = replicate(g, 2, shard_optimizer=3).graph
    reads = [o for o in rep.ops if o.name.startswith("layer_0/read@r")]
    assert reads and all(o.output_bytes == o.view_bytes == 2000 for o in reads)
    gathers = [o for o in rep.ops if "gather@" in o.name and o.output_bytes]
    assert gathers and all(o.view_bytes == 0 for o in gathers)
