"""Placers: every one is ``place(graph, cluster, **options) -> Plan``.

``PLACERS`` maps a name to ``"module:function"``, imported on first use so that
importing :mod:`solver` stays cheap.

>>> sorted(PLACERS)[:3]
['celeritas', 'cpsat', 'expert']
"""
from __future__ import annotations

import importlib
import inspect

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


def call_placer(fn, graph, cluster, **options):
    """``fn(graph, cluster, **options)`` with only the options ``fn`` declares
    (heuristics take no ``time_limit`` or ``seed``; passing one directly raises
    TypeError)."""
    params = inspect.signature(fn).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        options = {k: v for k, v in options.items() if k in params}
    return fn(graph, cluster, **options)


def run_placers(graph, cluster, names, *, extra=None, say=None, **options):
    """Run the placers ``names`` on ``graph``; a missing or failing one is
    skipped, never fatal (a broken baseline must not break a pipeline).

    Parameters
    ----------
    extra : mapping name -> dict, optional
        Options for one placer only (e.g. ``{"m-sct": {"lp_time_limit": 5}}``).
    say : callable, optional
        Called with a line per placer that ran.
    options : passed to every placer (``time_limit``, ``seed``...).

    Returns
    -------
    plans : dict name -> Plan
    errors : dict name -> str, why each skipped placer was skipped
    """
    from pesto.errors import PestoError

    plans, errors = {}, {}
    for name in names:
        try:
            fn = get_placer(name)
        except (ImportError, AttributeError, ValueError) as exc:
            errors[name] = f"unavailable: {exc}"
            continue
        try:
            plans[name] = call_placer(fn, graph, cluster, **options, **(extra or {}).get(name, {}))
        except PestoError as exc:
            errors[name] = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # noqa: BLE001
            errors[name] = f"failed: {type(exc).__name__}: {exc}"
        else:
            if say is not None:
                say(f"{name}: {plans[name].makespan:.1f} µs ({plans[name].status})")
    return plans, errors
