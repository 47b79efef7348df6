"""Hypothesis strategies for the micro-batch tests: random DAGs with batch marks.

    from mb_strategies import marked_dags
"""
from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from pesto.graph import OpGraph
from benchmarks.generators import training_step
from strategies import dags

__all__ = ["marked_dags", "mark", "layered_step", "deep_step", "step_builder"]


def mark(graph: OpGraph, batched) -> OpGraph:
    """``graph`` with ops in ``batched`` marked True (their persistent bytes
    dropped: weights belong to unbatched ops), the rest False."""
    ops = [replace(op, batch=True, persistent_bytes=0) if op.name in batched else replace(op, batch=False)
           for op in graph.ops]
    return OpGraph(ops, graph.edges, graph.tensors, name=graph.name)


@st.composite
def marked_dags(draw, max_ops: int = 10, **kw) -> OpGraph:
    """A random DAG (``strategies.dags``) with random marks, at least one op batched."""
    g = draw(dags(max_ops=max_ops, **kw))
    flags = draw(st.lists(st.booleans(), min_size=g.num_ops, max_size=g.num_ops))
    flags[draw(st.integers(0, g.num_ops - 1))] = True
    return mark(g, {n for n, f in zip(g.names, flags) if f})


def layered_step(layers: int = 4, *, act: int = 1_000_000, weight: int = 4000, t: float = 10.0) -> OpGraph:
    """:func:`benchmarks.generators.training_step` with backward ops taking ``2 t``."""
    return training_step(layers, act=act, weight=weight, t=t, back=2.0)


def step_builder():
    """``(ops, tensors, edges, add, edge)``: lists a marked step is built in, ``add(name, time, out,
    batch, phase, anchor=None, **op_fields)`` an op of ``time`` µs on a GPU with one output tensor
    ``name:0`` of ``out`` bytes, ``edge(u, v)`` that tensor read by ``v``."""
    from pesto.graph import Edge, Op, Tensor

    ops, ts, es = [], [], []

    def add(name, time, out, batch, phase, anchor=None, **kw):
        ops.append(Op(name, {"GPU": time}, output_bytes=out, batch=batch, scope=name.rpartition("/")[0],
                      phase=phase, anchor=anchor, **kw))
        ts.append(Tensor(f"{name}:0", name, out))

    def edge(u, v):
        es.append(Edge(u, v, (f"{u}:0",)))

    return ops, ts, es, add, edge


def deep_step(layers: int = 6, *, act: int = 1_000_000, weight=4000, t: float = 10.0,
              slots: int = 1) -> OpGraph:
    """A step of ``layers`` three-op layers with explicit marks (no front end):
    input ``x``; per layer ``l`` a variable ``layer_l/w`` (``weight`` bytes,
    read by ``layer_l/read``, a handle of no bytes) and, with ``slots``, two optimizer slots
    ``layer_l/w/m``, ``layer_l/w/v`` (``slots x weight`` bytes each, read only by the
    update), one colocation group; forward ``layer_l/a`` (``t`` µs, reads the
    layer's input and weight), ``layer_l/b`` and ``layer_l/c`` (``t / 2``
    each), each ``act`` bytes out; backward ``gradients/layer_l/c_grad``
    (reads ``b``), ``b_grad`` (reads ``a``), ``a_grad/dx`` and the weight
    gradient ``a_grad/dw`` (reads the layer's input), ``2 t`` each; the
    update ``train/update_l``. A loss ``loss`` and its gradient close it.
    ``weight``: bytes of every layer's weight, or a list of them per layer.
    """
    ops, ts, es, add, edge = step_builder()
    weights = [weight] * layers if isinstance(weight, int) else list(weight)
    add("x", 0.5, act, True, "forward")
    h = "x"
    for l in range(layers):
        p, weight = f"layer_{l}", weights[l]
        add(f"{p}/w", 0.0, 0, False, "forward", persistent_bytes=weight, colocation_group=p)
        add(f"{p}/read", 0.0, 0, False, "forward", colocation_group=p)   # a handle: no bytes
        edge(f"{p}/w", f"{p}/read")
        if slots:
            for s in ("m", "v"):
                add(f"{p}/w/{s}", 0.0, 0, False, "forward", persistent_bytes=slots * weight, colocation_group=p)
        add(f"{p}/a", t, act, True, "forward")
        add(f"{p}/b", t / 2, act, True, "forward")
        add(f"{p}/c", t / 2, act, True, "forward")
        for u, v in [(h, f"{p}/a"), (f"{p}/read", f"{p}/a"), (f"{p}/a", f"{p}/b"), (f"{p}/b", f"{p}/c")]:
            edge(u, v)
        h = f"{p}/c"
    add("loss", 1.0, 4, True, "forward")
    edge(h, "loss")
    add("gradients/loss_grad", 1.0, act, True, "input-grad", "loss")
    edge("loss", "gradients/loss_grad")
    g = "gradients/loss_grad"
    for l in reversed(range(layers)):
        p, q, weight = f"layer_{l}", f"gradients/layer_{l}", weights[l]
        below = f"layer_{l - 1}/c" if l else "x"
        add(f"{q}/c_grad", 2 * t, act, True, "input-grad", f"{p}/c")
        add(f"{q}/b_grad", 2 * t, act, True, "input-grad", f"{p}/b")
        add(f"{q}/a_grad/dx", 2 * t, act, True, "input-grad", f"{p}/a")
        add(f"{q}/a_grad/dw", 2 * t, weight, True, "weight-grad", f"{p}/a")
        add(f"train/update_{l}", 1.0, 0, False, "update", colocation_group=p)
        for u, v in [(g, f"{q}/c_grad"), (f"{p}/b", f"{q}/c_grad"), (f"{q}/c_grad", f"{q}/b_grad"),
                     (f"{p}/a", f"{q}/b_grad"), (f"{q}/b_grad", f"{q}/a_grad/dx"), (f"{p}/read", f"{q}/a_grad/dx"),
                     (f"{q}/b_grad", f"{q}/a_grad/dw"), (below, f"{q}/a_grad/dw"),
                     (f"{q}/a_grad/dw", f"train/update_{l}"), (f"{p}/w", f"train/update_{l}")]:
            edge(u, v)
        if slots:
            for s in ("m", "v"):
                edge(f"{p}/w/{s}", f"train/update_{l}")
        g = f"{q}/a_grad/dx"
    return OpGraph(ops, es, ts, name=f"deep{layers}")
