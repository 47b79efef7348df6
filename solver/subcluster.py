"""Candidates that use one group of GPUs only (one host of a multi-host cluster).

On hosts joined by a slow network the best step often keeps every op on one
host, yet a heuristic given all GPUs spreads work across the network and a
time-limited search rarely walks all the way back (NMT-2x1024 on 2 hosts x 2
GPUs over 25 GbE: 86.6 ms from the full cluster against 63.1 ms on one host).
So the pipeline also runs the fast heuristics on each *kind* of GPU group
alone, plus the devices of other kinds (the CPUs ops may need), and lets the
results compete as ordinary starts.

A GPU group is one of :meth:`pesto.cluster.Cluster.identical_groups`; groups
with the same size, memory and speed are taken as equivalent (the hosts of
``hosts()``), so only the first of them is tried.

Examples
--------
>>> from pesto.cluster import hosts, v100x2_nvlink
>>> [len(g) for g in gpu_groups(hosts(2, 2, "25gbe"))]
[2]
>>> gpu_groups(v100x2_nvlink())
[]
"""
from __future__ import annotations

import time

from pesto.cluster import Cluster
from pesto.graph import OpGraph

from .common import finalize
from .registry import run_placers

__all__ = ["gpu_groups", "place_on_groups", "GROUP_PLACERS"]

#: The heuristics tried on each group: fast, and between them the best of the
#: baselines on most of the zoo.
GROUP_PLACERS = ("m-etf", "m-sct")


def gpu_groups(cluster: Cluster) -> list[list[str]]:
    """One GPU group per distinct (size, memory, speed), when the cluster's
    GPUs form two or more groups (else ``[]``: the whole cluster is the group)."""
    groups = [g for g in cluster.identical_groups() if cluster.device(g[0]).kind == "GPU"]
    if len(groups) < 2:
        return []
    seen, out = set(), []
    for g in groups:
        d = cluster.device(g[0])
        key = (len(g), d.memory, d.speed)
        if key not in seen:
            seen.add(key)
            out.append(g)
    return out


def place_on_groups(graph: OpGraph, cluster: Cluster, *, names=GROUP_PLACERS, **options) -> tuple[dict, dict]:
    """The ``names`` heuristics on each of :func:`gpu_groups` (with the
    cluster's non-GPU devices), as plans on the full ``cluster``: keys
    ``"NAME@GROUP"`` (``GROUP`` the group's first device). ``options`` go to
    :func:`solver.registry.run_placers`. Returns ``(plans, errors)``."""
    others = [d.name for d in cluster.devices if d.kind != "GPU"]
    plans, errors = {}, {}
    for group in gpu_groups(cluster):
        sub = cluster.subset(group + others)
        got, failed = run_placers(graph, sub, names, **options)
        for name, p in got.items():
            t0 = time.perf_counter() - p.wall_time
            plans[f"{name}@{group[0]}"] = finalize(graph, cluster, p.placement, order=p.order,
                                                   placer=f"{name}@{group[0]}", t0=t0)
        errors.update({f"{name}@{group[0]}": why for name, why in failed.items()})
    return plans, errors
