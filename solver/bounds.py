"""Lower bounds and a quick greedy plan (memory pre-checks: :func:`pesto.memory.check_feasible`).

Everything here is cheap (linear or near-linear in the graph) and is used by
the exact solvers and :func:`pesto.solve` before any search.

* :func:`lower_bound` = max(critical path with each op at its fastest allowed
  device, total fastest work / number of devices, work forced onto one kind /
  number of devices of that kind). Communication is ignored, so it is valid
  for every placement and every link model.
* :func:`greedy_plan` is a small earliest-finish-time list scheduler used as a
  fallback hint when nothing better is given.

Examples
--------
>>> from pesto.graph import OpGraph
>>> from pesto.cluster import gpus
>>> g = OpGraph.from_edges({"a": 2, "b": 3, "c": 4}, [("a", "b"), ("a", "c")])
>>> lower_bound(g, gpus(2))
6.0
"""
from __future__ import annotations

import time

from pesto.cluster import Cluster
from pesto.dag import bottom_levels, priority_order, top_levels
from pesto.engine import Timeline
from pesto.graph import OpGraph
from pesto.problem import INF, Problem

from .common import finalize

__all__ = ["lower_bound", "greedy_plan"]


def lower_bound(graph: OpGraph, cluster: Cluster) -> float:
    """A makespan lower bound valid for every placement (µs)."""
    if graph.num_ops == 0:
        return 0.0
    prob = Problem.of(graph, cluster)
    # per op, the devices whose kind it allows (its own kinds, not its group's)
    allowed = [[d for d, x in enumerate(row) if x != INF] for row in prob.dur]
    fastest = [min(row[d] for d in al) if al else 0.0 for row, al in zip(prob.dur, allowed)]
    cp = max(top_levels(prob.pred, fastest, order=prob.topo))
    work = sum(fastest) / prob.nd
    # Work that can only go to devices of one kind shares those devices.
    kinds = [d.kind for d in cluster.devices]
    forced = 0.0
    for kind in set(kinds):
        mine = {k for k, kk in enumerate(kinds) if kk == kind}
        w = sum(f for f, al in zip(fastest, allowed) if al and set(al) <= mine)
        forced = max(forced, w / len(mine))
    return float(max(cp, work, forced))


def greedy_plan(graph: OpGraph, cluster: Cluster, *, placer: str = "greedy"):
    """Earliest-finish-time list scheduling (contention-free estimate), then simulated.

    Ready ops are taken by decreasing bottom level (fastest compute; ties:
    lower index) and put on the device where they finish first on a
    contention-free :class:`pesto.engine.Timeline`; colocated ops follow the
    device of the first member placed; a device is skipped when its static
    held bytes (persistent + outputs) would exceed its memory (unless no
    device fits). Returns a Plan via :func:`solver.common.finalize`.
    """
    t0 = time.perf_counter()
    prob = Problem.of(graph, cluster)
    dur = prob.dur
    fastest = [min(row) for row in dur]
    bottom = bottom_levels(prob.succ, fastest, order=prob.topo)
    tl = Timeline(prob, links="free")
    unit_dev = [-1] * len(prob.members)
    held = [0] * prob.nd
    seq = priority_order(prob.succ, prob.pred, [-b for b in bottom])  # largest bottom level first
    for i in seq:
        u = prob.unit[i]
        cands = [unit_dev[u]] if unit_dev[u] >= 0 else prob.allowed[i]
        need = prob.persistent[i] + prob.out[i]
        fits = [k for k in cands if held[k] + need <= prob.cap[k]] or cands
        best = None
        for k in fits:
            s = tl.earliest(i, k)
            if best is None or s + dur[i][k] < best[0]:
                best = (s + dur[i][k], s, k)
        _, s, k = best
        tl.commit(i, k, s)
        held[k] += need
        if unit_dev[u] < 0:
            unit_dev[u] = k
    names = graph.names
    placement = {names[i]: prob.dev_names[tl.place[i]] for i in range(prob.n)}
    pos = {i: r for r, i in enumerate(seq)}
    order = [names[i] for i in sorted(seq, key=lambda i: (tl.start[i], pos[i]))]
    return finalize(graph, cluster, placement, order=order, placer=placer, t0=t0)
