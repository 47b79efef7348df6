"""Placers: every one is ``place(graph, cluster, **options) -> Plan``.

``PLACERS`` maps a name to ``"module:function"``, imported on first use so that
importing :mod:`solver` stays cheap.

>>> sorted(PLACERS)[:3]
['celeritas', 'cpsat', 'expert']
"""
from __future__ import annotations

import importlib

PLACERS = {
    "single": "solver.baselines:place_single",
    "expert": "solver.baselines:place_expert",
    "m-topo": "solver.heuristics:place_m_topo",
    "m-etf": "solver.heuristics:place_m_etf",
    "m-sct": "solver.heuristics:place_m_sct",
    "celeritas": "solver.heuristics:place_celeritas",
    "metis": "solver.baselines:place_metis",
    "heft": "solver.heuristics:place_heft",
    "cpsat": "solver.cpsat:place_cpsat",
    "mip": "solver.mip:place_mip",
}


def get_placer(name: str):
    """The placer function registered under ``name``."""
    try:
        target = PLACERS[name]
    except KeyError:
        raise ValueError(f"unknown placer {name!r}; known: {sorted(PLACERS)}") from None
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)
