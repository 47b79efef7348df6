"""Placers, the local search and the recipes of ``pesto.solve``.

Every placer is ``place(graph, cluster, *, options) -> Plan``; ``PLACERS``
(:mod:`solver.registry`) maps a name to its :class:`~solver.registry.Placer`
record (the function, its speed, its heuristic rank). :mod:`solver.search`
holds the local search, :mod:`solver.recipes` the recipes (lists of passes) of ``pesto.solve``.

>>> sorted(PLACERS)[:3]
['1f1b', 'best-pipeline', 'celeritas']
"""
from __future__ import annotations

import pesto.deepbind  # noqa: F401  (OR-Tools' native libraries, loaded to work beside TensorFlow)

from .registry import PLACERS, Placer, accepted_options, get_placer, run_placers

__all__ = ["PLACERS", "Placer", "get_placer", "run_placers", "accepted_options"]
