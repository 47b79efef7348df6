"""What every placer shares: turning a placement (+ order) into a checked Plan.

Every placer, heuristic or exact, ends with :func:`finalize`, so all plans are
comparable: the makespan is the simulator's (fixed order) and peak memory the
liveness-based one from :func:`pesto.plan.memory_profile`.
"""
from __future__ import annotations

import time
from typing import Mapping, Sequence

from pesto.cluster import Cluster
from pesto.dag import priority_order
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
    """A topological order of ``graph`` taking, among ready ops, the smallest
    ``key[i]`` first (:func:`pesto.dag.priority_order`, by name).

    Examples
    --------
    >>> g = OpGraph.from_edges({"a": 1, "b": 0, "c": 1}, [("a", "b"), ("b", "c")])
    >>> order_by_key(g, [1.0, 0.9999999, 0.5])   # b "starts" before a: kept after it
    ['a', 'b', 'c']
    """
    return [graph.names[i] for i in priority_order(graph.succ_idx(), graph.pred_idx(), key)]
