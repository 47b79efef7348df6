"""What every placer shares: turning a placement (+ order) into a checked Plan.

Every placer, heuristic or exact, ends with :func:`finalize`, so all plans are
comparable: the makespan is the simulator's (fixed order) and peak memory the
liveness-based one from :func:`pesto.plan.memory_profile`.
"""
from __future__ import annotations

import time
from typing import Mapping, Sequence

from pesto.cluster import Cluster
from pesto.graph import OpGraph
from pesto.plan import Plan
from pesto.simulate import simulate


def finalize(graph: OpGraph, cluster: Cluster, placement: Mapping[str, str], *,
             order: Mapping[str, Sequence[str]] | Sequence[str] | None = None,
             placer: str, t0: float, status: str = "heuristic", mode: str | None = None,
             **fields) -> Plan:
    """Simulate ``placement`` and return the Plan with times.

    Parameters
    ----------
    order : per-device mapping, or one global op sequence, or None
        None runs TF's default FIFO; a global sequence is split per device.
    t0 : float
        ``time.perf_counter()`` when the placer started (for ``wall_time``).
    status : str
        Becomes ``"infeasible"`` if the simulated peak memory exceeds a
        device's capacity (the plan is still returned, honestly flagged).
    fields : further Plan fields (lower_bound, stats...).

    Examples
    --------
    >>> import time
    >>> from pesto.graph import OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph.from_edges({"a": 2, "b": 3}, [("a", "b", 100)])
    >>> c = gpus(2, beta=(1.0, 0.01))   # 100 bytes: 2 µs
    >>> p = finalize(g, c, {"a": "/GPU:0", "b": "/GPU:1"}, placer="demo", t0=time.perf_counter())
    >>> p.makespan, p.status, p.placer
    (7.0, 'heuristic', 'demo')
    >>> finalize(g, c.with_memory(50), {"a": "/GPU:0", "b": "/GPU:1"}, placer="demo",
    ...          t0=time.perf_counter()).status
    'infeasible'
    """
    if order is None:
        sched = simulate(graph, cluster, dict(placement), mode="fifo")
    else:
        if not isinstance(order, Mapping):
            per: dict[str, list[str]] = {}
            for op in order:
                per.setdefault(placement[op], []).append(op)
            order = per
        sched = simulate(graph, cluster, Plan(placement, order), mode=mode or "order")
    over = {d.name: sched.peak_memory[d.name] for d in cluster.devices
            if sched.peak_memory[d.name] > d.memory}
    stats = dict(fields.pop("stats", {}) or {})
    if over:
        status = "infeasible"
        stats["memory_over"] = over
    return sched.to_plan(placer=placer, status=status, wall_time=time.perf_counter() - t0,
                         stats=stats, **fields)


def order_by_key(graph: OpGraph, key: Sequence[float]) -> list[str]:
    """A topological order of ``graph`` that takes, among the ops whose
    predecessors are all taken, the one with the smallest ``key[i]`` first.

    Sorting by a solver's start times alone can contradict the graph when the
    times carry a float tolerance (an LP/MIP solution); this cannot.

    Examples
    --------
    >>> g = OpGraph.from_edges({"a": 1, "b": 0, "c": 1}, [("a", "b"), ("b", "c")])
    >>> order_by_key(g, [1.0, 0.9999999, 0.5])   # b "starts" before a: kept after it
    ['a', 'b', 'c']
    """
    import heapq

    pred, succ = graph.pred_idx(), graph.succ_idx()
    left = [len(p) for p in pred]
    heap = [(key[i], i) for i in range(graph.num_ops) if left[i] == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        _, i = heapq.heappop(heap)
        out.append(graph.names[i])
        for j in succ[i]:
            left[j] -= 1
            if left[j] == 0:
                heapq.heappush(heap, (key[j], j))
    return out
