"""Per-slice constants (``pesto.step.marks.slice_constants``): a constant a
gradient builds under a control dependency (TensorFlow's layer-norm gradient)
marked once per step made every slice wait for all the others, so GPT-1.3B's
1F1B held every slice's activations (22 GiB per GPU at M=8 and at M=16)."""
from __future__ import annotations

from dataclasses import replace

import pesto
from mb_strategies import layered_step
from pesto.graph import Edge, Op, OpGraph, Tensor
from pesto.step import split
from pesto.step.marks import slice_constants
from solver.parallel.pipelines import pipeline_plan
from solver.parallel.search import with_marks


def with_barriers(layers: int = 4, **kw) -> OpGraph:
    """``layered_step`` whose every ``dx`` reads a constant ``two`` made under a
    control edge from the gradient above (marked once per step, phase update:
    what the shape-based TF marks give such a constant)."""
    g = layered_step(layers, **kw)
    ops, edges, tensors = list(g.ops), list(g.edges), list(g.tensors)
    for l in range(layers):
        dx = f"gradients/layer_{l}/f_grad/dx"
        above = next(e.src for e in g.edges if e.dst == dx and e.src != f"layer_{l}/read")
        two = f"gradients/layer_{l}/f_grad/scalar"
        ops.append(Op(two, {"GPU": 0.0}, output_bytes=4, batch=False, phase="update", type="Const",
                      scope=f"gradients/layer_{l}/f_grad"))
        tensors.append(Tensor(f"{two}:0", two, 4))
        edges += [Edge(above, two), Edge(two, dx, (f"{two}:0",))]
    return OpGraph(ops, edges, tensors, name=g.name)


def reaches(g: OpGraph, a: str, b: str) -> bool:
    succ, seen, todo = g.succ_idx(), set(), [g.index[a]]
    while todo:
        for j in succ[todo.pop()]:
            if j not in seen:
                seen.add(j)
                todo.append(j)
    return g.index[b] in seen


def test_a_constant_under_a_gradient_is_per_slice():
    g = with_barriers(2)
    h = slice_constants(g)
    two = h.op("gradients/layer_0/f_grad/scalar")
    assert two.batch is True and two.phase == "input-grad"
    assert slice_constants(h) is h and with_marks(g).op(two.name).batch is True
    # the split of the raw marks: slice 0's backward waits for slice 1's forward (the barrier)
    raw, fixed = split(g, 2).graph, split(h, 2).graph
    assert reaches(raw, "layer_1/f@mb1", "gradients/layer_0/f_grad/dx@mb0")
    assert not reaches(fixed, "layer_1/f@mb1", "gradients/layer_0/f_grad/dx@mb0")


def test_a_constant_read_by_a_step_op_stays_once_per_step():
    g = with_barriers(2)
    ops = list(g.ops) + [Op("sink", {"GPU": 1.0}, batch=False, phase="update")]
    edges = list(g.edges) + [Edge("gradients/layer_0/f_grad/scalar", "sink", ("gradients/layer_0/f_grad/scalar:0",))]
    g2 = OpGraph(ops, edges, g.tensors)
    assert slice_constants(g2).op("gradients/layer_0/f_grad/scalar").batch is False
    assert slice_constants(g2).op("gradients/layer_1/f_grad/scalar").batch is True


def test_1f1b_holds_fewer_slices_without_the_barrier():
    # stage 0 of a 1F1B pipeline holds at most K slices' activations; with the barrier it held all M
    g = with_barriers(4, act=10_000_000, t=100.0)
    cluster = pesto.cluster.gpus(4, memory=10**12)
    peak = {}
    for name, step in (("raw", g), ("fixed", slice_constants(g))):
        r = pipeline_plan(step, cluster, schedule="1f1b", micro_batches=8, stages=4, candidates=1)
        pesto.check_plan(r.graph, cluster, r.plan).raise_if_invalid()
        peak[name] = max(r.plan.peak_memory.values())
    assert peak["fixed"] < 0.75 * peak["raw"], peak
