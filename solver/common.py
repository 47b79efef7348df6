"""Helpers the placers share (a placement becomes a Plan in :mod:`pesto.finalize`)."""
from __future__ import annotations

from typing import Sequence

from pesto.dag import priority_order
from pesto.graph import OpGraph
from pesto.plan import Plan

__all__ = ["order_by_key", "rank"]


def order_by_key(graph: OpGraph, key: Sequence[float]) -> list[str]:
    """A topological order of ``graph`` taking, among ready ops, the smallest
    ``key[i]`` first (:func:`pesto.dag.priority_order`, by name).

    Examples
    --------
    >>> g = OpGraph.from_edges({"a": 1, "b": 0, "c": 1}, [("a", "b"), ("b", "c")])
    >>> order_by_key(g, [1.0, 0.9999999, 0.5])   # b "starts" before a: kept after it
    ['a', 'b', 'c']
    """
    return [graph.names[i] for i in priority_order(graph.succ_idx(), graph.pred_idx(), key)]


def rank(plan: Plan) -> tuple:
    """The one plan-ranking rule: a plan that fits memory before one that does
    not, then the shorter step (smaller is better; no makespan ranks last).

    >>> rank(Plan({}, {}, makespan=5.0)) < rank(Plan({}, {}, makespan=4.0, status="infeasible"))
    True
    """
    return (plan.status == "infeasible", plan.makespan if plan.makespan is not None else float("inf"))
