"""Baechi's safe fusion rule, for comparison.

Merge an edge (u, v) when out-degree(u) = 1 or in-degree(v) = 1. Such a pair
can never be entered at v and left from u, so merging any matching of them in
one round cannot close a cycle (every path through the merged graph still
goes up in height). Rounds, caps, device kinds and colocation constraints are
the same as :mod:`coarsen.height`; only the merge condition differs, so
Baechi often stalls above the target on graphs with many fan-in/fan-out ops
(that is the point of the comparison). Sibling merges are off by default.
"""
from __future__ import annotations

from pesto.graph import OpGraph

from .height import coarsen_height

__all__ = ["coarsen_baechi"]


def coarsen_baechi(graph: OpGraph, target_vertices: int = 200, **options):
    """Coarsen with Baechi's rule; options as :func:`coarsen.height.coarsen_height`.

    Examples
    --------
    >>> g = OpGraph.from_edges({"a": 1, "b": 1, "c": 1}, [("a", "b", 8), ("b", "c", 8)])
    >>> coarsen_baechi(g, 1).graph.num_ops
    1
    """
    options.setdefault("siblings", False)
    return coarsen_height(graph, target_vertices, rule="baechi", **options)
