"""Placers, the local search and the pipeline of ``pesto.solve``.

Every placer is ``place(graph, cluster, *, options) -> Plan``; ``PLACERS``
(:mod:`solver.registry`) maps a name to ``"module:function"``, imported on
first use. :mod:`solver.search` holds the local search, :mod:`solver.pipeline`
the stages of ``pesto.solve``.

>>> sorted(PLACERS)[:3]
['celeritas', 'cpsat', 'expert']
"""
from __future__ import annotations

# The core first: importing any pesto module runs pesto/__init__, whose facade
# (pesto.solve) imports solver.pipeline, which needs solver.registry whole.
# Importing it here, before the registry, makes ``import solver`` first work.
import pesto.errors  # noqa: F401  (import order matters)

from .registry import PLACERS, accepted_options, get_placer, run_placers

__all__ = ["PLACERS", "get_placer", "run_placers", "accepted_options"]
