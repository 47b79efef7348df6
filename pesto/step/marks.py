"""What the ops of a training step are, read from the marks a front end set.

A front end (``tf_patch`` for TensorFlow: :func:`tf_patch.marks.mark_step`)
marks each op with data (:class:`~pesto.graph.Op`): ``batch`` (per slice or
per step), ``phase`` (``"forward"``, ``"input-grad"``, ``"weight-grad"``,
``"update"``), ``anchor`` (the forward op a backward op differentiates) and
``role`` (``"grad-sum"``, ``"joinable"``). The functions here read only those marks and the
graph's edges: no framework's op types or names.

Examples
--------
>>> from pesto.graph import Op, OpGraph
>>> g = OpGraph.from_edges({"x": 1, "l": 1, "dl": 1, "u": 1}, [("x", "l"), ("l", "dl"), ("dl", "u")])
>>> g = OpGraph([replace(o, phase=p, anchor=a) for o, p, a in
...              zip(g.ops, ["forward", "forward", "weight-grad", "update"], [None, None, "l", None])],
...             g.edges, g.tensors)
>>> sorted(forward_ops(g)), sorted(backward_ops(g)), anchors(g)
(['l', 'x'], ['dl', 'u'], {'dl': 'l'})
>>> sorted(backward_ops(g, loss="l"))   # without phase marks: every op after the loss
['dl', 'u']
"""
from __future__ import annotations

from dataclasses import replace

from ..errors import InvalidGraphError
from ..graph import OpGraph
from .slicing import weight_grad_ops, whole_ops

__all__ = ["forward_ops", "backward_ops", "anchors", "slice_constants", "joinable_ops", "shardable", "BACKWARD"]

#: The phases of the backward pass and of the update after it (``"recompute"``:
#: a forward op re-run just before its block's backward, :func:`pesto.step.recompute`).
BACKWARD = frozenset({"input-grad", "weight-grad", "update", "recompute"})


def forward_ops(graph: OpGraph) -> frozenset:
    """The ops marked ``phase="forward"``."""
    return frozenset(op.name for op in graph.ops if op.phase == "forward")


def backward_ops(graph: OpGraph, *, loss: str | None = None) -> frozenset:
    """The ops of the backward pass and of the update that follows it.

    Without ``loss``: the ops whose phase is one of :data:`BACKWARD`. With
    ``loss`` (an op name): every op after the loss op (for a graph without
    phase marks). Ops not returned are the forward pass (and what precedes it).

    Raises
    ------
    InvalidGraphError
        ``loss`` is not an op of the graph; no op is marked backward and no
        ``loss`` was given.
    """
    if loss is None:
        out = frozenset(op.name for op in graph.ops if op.phase in BACKWARD)
        if not out:
            raise InvalidGraphError(f"graph {graph.name!r}: no op is marked as backward (Op.phase "
                                    f"input-grad, weight-grad or update); mark the step (a front end does: "
                                    f"tf_patch.marks.mark_step for a TensorFlow graph) or name the loss op: "
                                    f"backward_ops(graph, loss=...)")
        return out
    if loss not in graph:
        raise InvalidGraphError(f"loss op {loss!r} is not in graph {graph.name!r}")
    succ = graph.succ_idx()
    seen: set[int] = set()
    todo = [graph.index[loss]]
    while todo:
        for j in succ[todo.pop()]:
            if j not in seen:
                seen.add(j)
                todo.append(j)
    return frozenset(graph.names[i] for i in seen)


def anchors(graph: OpGraph) -> dict[str, str]:
    """Backward op -> the forward op it differentiates, for the ops whose
    anchor mark names an op of the graph."""
    return {op.name: op.anchor for op in graph.ops if op.anchor is not None and op.anchor in graph}


def shardable(graph: OpGraph) -> bool:
    """Whether a front end can build a sharded optimizer (ZeRO,
    :func:`pesto.step.replicate`'s ``shard_optimizer``) for this step: no op
    is marked ``role="unshardable"`` (``tf_patch`` marks an elementwise update
    op that reads a weight gradient, as a Keras 3 optimizer's: not one ``ResourceApply*``). A graph without marks is shardable.

    >>> from pesto.graph import Op
    >>> shardable(OpGraph([Op("apply", {"GPU": 1.0})])), shardable(OpGraph([Op("mul", {"GPU": 1.0}, role="unshardable")]))
    (True, False)
    """
    return not any(op.role == "unshardable" for op in graph.ops)


def joinable_ops(graph: OpGraph) -> tuple[str, ...]:
    """The weight-gradient ops of a marked step that may run once over every
    slice (:func:`pesto.step.split`'s ``weight_grads="whole"``): those the
    front end marked ``role="joinable"`` (it can build them so: ``tf_patch``
    marks a Keras ``Dense`` kernel's gradient) that are weight-gradient ops
    no batched op reads (:func:`pesto.step.slicing.whole_ops`), in graph
    order. A front end that marks none joins none: the search then keeps
    every weight gradient ``"separate"``.

    >>> from pesto.graph import Op, Edge, Tensor
    >>> ops = [Op("x", {"GPU": 1.0}, output_bytes=8, batch=True),
    ...        Op("dw", {"GPU": 1.0}, output_bytes=4, batch=True, role="joinable"),
    ...        Op("db", {"GPU": 1.0}, output_bytes=4, batch=True), Op("apply", {"GPU": 1.0}, batch=False)]
    >>> g = OpGraph(ops, [Edge("x", "dw", "x:0"), Edge("x", "db", "x:0"), Edge("dw", "apply", "dw:0"),
    ...                   Edge("db", "apply", "db:0")], [Tensor("x:0", "x", 8), Tensor("dw:0", "dw", 4),
    ...                   Tensor("db:0", "db", 4)])
    >>> joinable_ops(g)
    ('dw',)
    """
    marked = [n for n in weight_grad_ops(graph) if graph.op(n).role == "joinable"]
    refused = set(whole_ops(graph, marked)[1]) if marked else set()
    return tuple(n for n in marked if n not in refused)


def slice_constants(graph: OpGraph) -> OpGraph:
    """``graph`` with every *per-slice constant* marked batched: an op marked
    once per step (``batch=False``) that reads no tensor (a constant), holds no
    persistent bytes, runs under a control edge from a batched op and feeds
    batched ops only. A gradient builds such constants under a control
    dependency on the incoming gradient (TensorFlow's ``SquaredDifference``
    gradient, in every layer norm, makes its ``2.0`` so); left once per step,
    the constant waits for every slice and every slice waits for it, a barrier
    that turns any pipeline into GPipe at the barrier (all slices' activations
    held). Copying a constant per slice keeps its value, so the mark is safe
    whatever the front end meant; its phase ``"update"`` (an unbatched op of the
    backward pass) becomes ``"input-grad"``. Returns ``graph`` itself when no
    op changes.

    >>> from pesto.graph import Op, Edge, Tensor
    >>> ops = [Op("g", {"GPU": 1.0}, output_bytes=8, batch=True, phase="input-grad"),
    ...        Op("two", {"GPU": 0.0}, output_bytes=4, batch=False, phase="update"),
    ...        Op("mul", {"GPU": 1.0}, output_bytes=8, batch=True, phase="input-grad")]
    >>> g = OpGraph(ops, [Edge("g", "two"), Edge("g", "mul", "g:0"), Edge("two", "mul", "two:0")],
    ...             [Tensor("g:0", "g", 8), Tensor("two:0", "two", 4)])
    >>> h = slice_constants(g)
    >>> h.op("two").batch, h.op("two").phase, slice_constants(h) is h
    (True, 'input-grad', True)
    """
    ops, pred, succ = graph.ops, graph.pred_idx(), graph.succ_idx()
    reads = set()
    for e in graph.edges:
        if e.tensors:
            reads.add(graph.index[e.dst])
    change = [i for i, op in enumerate(ops)
              if op.batch is False and i not in reads and not op.persistent_bytes and succ[i]
              and any(ops[j].batch for j in pred[i]) and all(ops[j].batch for j in succ[i])]
    if not change:
        return graph
    new = list(ops)
    for i in change:
        new[i] = replace(ops[i], batch=True, phase="input-grad" if ops[i].phase == "update" else ops[i].phase)
    return OpGraph(new, graph.edges, graph.tensors, name=graph.name)
