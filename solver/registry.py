"""The placer registry: every placer is ``place(graph, cluster, *, options) -> Plan``.

>>> sorted(PLACERS)[:3]
['1f1b', 'celeritas', 'cpsat']
"""
from __future__ import annotations

import time

import importlib
import inspect
from typing import Callable, Mapping

from pesto.errors import PestoError

PLACERS = {
    "single": "solver.baselines:place_single",
    "expert": "solver.baselines:place_expert",
    "expert-paper": "solver.baselines:place_expert_paper",
    "m-topo": "solver.heuristics:place_m_topo",
    "m-etf": "solver.heuristics:place_m_etf",
    "m-sct": "solver.heuristics:place_m_sct",
    "celeritas": "solver.heuristics:place_celeritas",
    "metis": "solver.baselines:place_metis",
    "heft": "solver.heuristics:place_heft",
    "cpsat": "solver.cpsat:place_cpsat",
    "mip": "solver.mip:place_mip",
}

# Micro-batch baselines (issue 24): their plans place the transformed step (the
# micro-batched or replicated graph), not the graph given; see solver.pipeline_baselines.
PLACERS.update({
    "data-parallel": "solver.pipeline_baselines:place_data_parallel",
    "gpipe": "solver.pipeline_baselines:place_gpipe",
    "1f1b": "solver.pipeline_baselines:place_1f1b",
})


def get_placer(name: str):
    """The placer function registered under ``name``."""
    try:
        target = PLACERS[name]
    except KeyError:
        raise ValueError(f"unknown placer {name!r}; known: {sorted(PLACERS)}") from None
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)


def accepted_options(fn: Callable, options: Mapping) -> dict:
    """The ``options`` that ``fn``'s signature declares (all of them if it
    takes ``**kwargs``): common options such as ``seed`` or ``workers`` go
    only to the placers that use them.

    >>> def place(graph, cluster, *, seed=0): ...
    >>> accepted_options(place, {"seed": 1, "time_limit": 5})
    {'seed': 1}
    """
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return dict(options)
    names = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    return {k: v for k, v in options.items() if k in names}


def run_placers(graph, cluster, names, *, extra=None, say=None, stop=None, **options):
    """Run the placers ``names`` on ``graph``; a missing or failing one is
    skipped, never fatal (a broken baseline must not break a pipeline).

    Parameters
    ----------
    extra : mapping name -> dict, optional
        Options for one placer only (e.g. ``{"m-sct": {"lp_time_limit": 5}}``).
    say : callable, optional
        Called with a line per placer that ran.
    stop : callable, optional
        ``stop(seconds)`` is asked before each placer once one plan exists,
        with the longest time a placer took so far; when it returns True the
        placer is skipped (it would overrun a deadline, or the user
        interrupted).
    options : for every placer (``time_limit``, ``seed``...); each placer gets
        those its signature declares (:func:`accepted_options`), as it does
        the ``extra`` ones.

    Returns
    -------
    plans : dict name -> Plan
    errors : dict name -> str, why each skipped placer was skipped
    """
    plans, errors, longest = {}, {}, 0.0
    for name in names:
        if stop is not None and plans and stop(longest):
            errors[name] = "skipped: out of time"
            continue
        t = time.perf_counter()
        try:
            fn = get_placer(name)
        except (ImportError, AttributeError, ValueError) as exc:
            errors[name] = f"unavailable: {exc}"
            continue
        try:
            opts = accepted_options(fn, {**options, **(extra or {}).get(name, {})})
            plans[name] = fn(graph, cluster, **opts)
        except PestoError as exc:
            errors[name] = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # noqa: BLE001
            errors[name] = f"failed: {type(exc).__name__}: {exc}"
        else:
            longest = max(longest, time.perf_counter() - t)
            if say is not None:
                say(f"{name}: {plans[name].makespan:.1f} µs ({plans[name].status})")
    return plans, errors
