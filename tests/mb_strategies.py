"""Hypothesis strategies for the micro-batch tests: random DAGs with batch marks.

    from mb_strategies import marked_dags
"""
from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from pesto.graph import OpGraph
from benchmarks.generators import training_step
from strategies import dags

__all__ = ["marked_dags", "mark", "layered_step"]


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
