"""GPU groups of a multi-host cluster: what the recipe's "one group" pass
solves alone.

On hosts joined by a slow network the best step often keeps every op on one
host, yet a search among all GPUs rarely walks all the way back there (see
:func:`solver.recipes.one_group`). A GPU group is one of
:meth:`pesto.cluster.Cluster.identical_groups`; groups with the same size,
memory and speed are taken as equivalent (the hosts of ``hosts()``), so only
the first of each kind is listed.

Examples
--------
>>> from pesto.cluster import hosts, v100x2_nvlink
>>> [len(g) for g in gpu_groups(hosts(2, 2, "25gbe"))]
[2]
>>> gpu_groups(v100x2_nvlink())
[]
"""
from __future__ import annotations

from pesto.cluster import Cluster

__all__ = ["gpu_groups"]


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
