"""What the ops of a training step are, read from the marks a front end set.

A front end (``tf_patch`` for TensorFlow: :func:`tf_patch.marks.mark_step`)
marks each op with data (:class:`~pesto.graph.Op`): ``batch`` (per slice or
per step), ``phase`` (``"forward"``, ``"input-grad"``, ``"weight-grad"``,
``"update"``), ``anchor`` (the forward op a backward op differentiates) and
``role`` (``"grad-sum"``). The functions here read only those marks and the
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

from dataclasses import replace  # noqa: F401  (the doctest's)

from ..errors import InvalidGraphError
from ..graph import OpGraph

__all__ = ["forward_ops", "backward_ops", "anchors", "BACKWARD"]

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
