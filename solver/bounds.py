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
from pesto.graph import OpGraph
from pesto.memory import static_bytes

__all__ = ["allowed_devices", "durations", "lower_bound", "greedy_plan"]


def allowed_devices(graph: OpGraph, cluster: Cluster) -> list[list[int]]:
    """Per op index, the device indices whose kind the op allows."""
    kinds = [d.kind for d in cluster.devices]
    return [[k for k, kind in enumerate(kinds) if kind in op.kinds] for op in graph.ops]


def durations(graph: OpGraph, cluster: Cluster) -> list[dict[int, float]]:
    """Per op index, {device index: µs} over its allowed devices."""
    devs = cluster.devices
    return [{k: op.compute[devs[k].kind] / devs[k].speed for k in allowed}
            for op, allowed in zip(graph.ops, allowed_devices(graph, cluster))]


def lower_bound(graph: OpGraph, cluster: Cluster, dur: list[dict[int, float]] | None = None) -> float:
    """A makespan lower bound valid for every placement (µs)."""
    if graph.num_ops == 0:
        return 0.0
    dur = dur if dur is not None else durations(graph, cluster)
    fastest = [min(d.values()) if d else 0.0 for d in dur]
    best = [0.0] * graph.num_ops
    pred = graph.pred_idx()
    for i in graph.topo_idx():
        best[i] = max((best[p] for p in pred[i]), default=0.0) + fastest[i]
    cp = max(best)
    work = sum(fastest) / len(cluster.devices)
    # Work that can only go to devices of one kind shares those devices.
    kinds = [d.kind for d in cluster.devices]
    forced = 0.0
    for kind in set(kinds):
        mine = [k for k, kk in enumerate(kinds) if kk == kind]
        w = sum(f for f, d in zip(fastest, dur) if d and set(d) <= set(mine))
        forced = max(forced, w / len(mine))
    return float(max(cp, work, forced))


def greedy_plan(graph: OpGraph, cluster: Cluster, *, placer: str = "greedy"):
    """Earliest-finish-time list scheduling (contention-free estimate), then simulated.

    Ops are taken by decreasing bottom level; colocated ops follow the device
    of the first member placed; a device is skipped when its static held bytes
    would exceed its memory (unless no device fits). Returns a Plan via
    :func:`solver.common.finalize`.
    """
    from .common import finalize

    t0 = time.perf_counter()
    n = graph.num_ops
    devs = cluster.devices
    dur = durations(graph, cluster)
    succ, pred = graph.succ_idx(), graph.pred_idx()
    ops = graph.ops
    names = graph.names
    fastest = [min(d.values()) for d in dur]
    bottom = [0.0] * n
    for i in reversed(graph.topo_idx()):
        bottom[i] = fastest[i] + max((bottom[j] for j in succ[i]), default=0.0)
    group_dev: dict[str, int] = {}
    group_ok: dict[str, set] = {}
    for i, op in enumerate(ops):
        if op.colocation_group is not None:
            g = group_ok.setdefault(op.colocation_group, set(dur[i]))
            g &= set(dur[i])
    held = [0] * len(devs)
    free = [0.0] * len(devs)
    fin = [0.0] * n
    place = [-1] * n
    waiting = [len(p) for p in pred]
    ready = [i for i in range(n) if waiting[i] == 0]
    seq = []
    while ready:
        ready.sort(key=lambda i: -bottom[i])
        i = ready.pop(0)
        op = ops[i]
        cands = list(dur[i])
        if op.colocation_group in group_dev:
            cands = [group_dev[op.colocation_group]]
        elif op.colocation_group is not None:
            cands = sorted(group_ok[op.colocation_group]) or cands
        fits = [k for k in cands if held[k] + static_bytes(op) <= devs[k].memory] or cands
        best = None
        for k in fits:
            arrive = 0.0
            for p in pred[i]:
                a = fin[p]
                if place[p] != k:
                    a += cluster.transfer_time(devs[place[p]].name, devs[k].name,
                                               graph.edge_bytes(names[p], names[i]))
                arrive = max(arrive, a)
            f = max(arrive, free[k]) + dur[i][k]
            if best is None or f < best[0]:
                best = (f, k)
        f, k = best
        place[i], fin[i], free[k] = k, f, f
        held[k] += static_bytes(op)
        if op.colocation_group is not None:
            group_dev.setdefault(op.colocation_group, k)
        seq.append(i)
        for j in succ[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                ready.append(j)
    placement = {names[i]: devs[place[i]].name for i in range(n)}
    pos = {i: r for r, i in enumerate(seq)}
    order = [names[i] for i in sorted(seq, key=lambda i: (fin[i] - dur[i][place[i]], pos[i]))]
    return finalize(graph, cluster, placement, order=order, placer=placer, t0=t0)
