"""The placer registry: one :class:`Placer` record per placer, holding the function itself.

Every placer is ``place(graph, cluster, *, options) -> Plan``. Its record
says what the recipes need to know about it: how fast it is (the
``heuristics`` pass predicts a heuristic's time from m-TOPO's), where it
stands in the tie-break order of the heuristics, whether it runs before the
others, and which optional module it needs.

Options: a placer gets the options its signature declares; the common ones
(:data:`COMMON_OPTIONS`: ``time_limit``, ``seed``...) go only to the placers
that declare them; any other option a placer does not declare raises
:class:`TypeError` (a misspelt option never vanishes). :func:`run_placers`
skips a placer that raises a :class:`~pesto.errors.PestoError` (no plan
within the deadline, memory that cannot fit...) or lacks its optional
module, and names it; any other exception is a bug and propagates.

>>> sorted(PLACERS)[:3]
['1f1b', 'best-pipeline', 'celeritas']
>>> PLACERS["m-etf"].speed, heuristic_placers()[:3]
(1.8, ('expert', 'metis', 'm-etf'))
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from pesto.errors import PestoError
from pesto.plan import Plan

from .practitioners import place_expert, place_expert_paper, place_metis, place_single
from .cpsat import place_cpsat
from .heuristics import place_celeritas, place_heft, place_m_etf, place_m_sct, place_m_topo
from .parallel.hybrid import place_hybrid
from .mip import place_mip
from .parallel.pipelines import place_1f1b, place_data_parallel, place_gpipe, schedule_placer
from .parallel.schedules import SCHEDULES
from .parallel.slice_model import place_slice_cpsat
from .parallel.user_baselines import place_best_pipeline, place_megatron, place_zero_dp

__all__ = ["Placer", "PLACERS", "COMMON_OPTIONS", "HEURISTICS", "heuristics", "run_order", "get_placer",
           "accepted_options", "run_placers"]

#: Options a caller may pass to every placer: each placer gets those it declares.
COMMON_OPTIONS = frozenset({"time_limit", "seed", "workers", "deadline", "hint", "log"})


@dataclass(frozen=True)
class Placer:
    """One placer and the facts about it.

    Attributes
    ----------
    name : the registry name (``pesto place --placer NAME``)
    fn : the function ``fn(graph, cluster, **options) -> Plan``
    speed : its run time relative to m-TOPO's on the same graph (the
        budget's cost unit; m-SCT's LP time limit comes on top); None for
        the exact placers
    rank : its place in the tie-break order of the heuristics (an earlier
        one wins a tie); None: not run by the ``heuristics`` pass
    first : it runs before the other heuristics, in this order (m-TOPO's
        plan is the one any stop returns, and its time the cost unit)
    needs : an optional module: the placer is skipped, and said, when it is
        missing
    """

    name: str
    fn: Callable[..., Plan]
    speed: float | None = None
    rank: int | None = None
    first: int | None = None
    needs: str | None = None

    def __call__(self, graph, cluster, **options) -> Plan:
        """``fn`` with the options it declares (:func:`accepted_options`)."""
        return self.fn(graph, cluster, **accepted_options(self.fn, options))

    def missing(self, exc: ImportError) -> bool:
        """``exc`` says this placer's optional module is not installed."""
        name = getattr(exc, "name", None) or ""
        return self.needs is not None and (name == self.needs or name.startswith(self.needs + "."))


#: name -> record. Add a placer here (and give it a ``rank`` to make it a heuristic).
PLACERS: dict[str, Placer] = {p.name: p for p in (
    Placer("single", place_single, speed=0.3, rank=7),
    Placer("expert", place_expert, speed=2.5, rank=0),
    Placer("expert-paper", place_expert_paper),
    Placer("m-topo", place_m_topo, speed=1.0, rank=6, first=0),
    Placer("m-etf", place_m_etf, speed=1.8, rank=2, first=1),
    Placer("m-sct", place_m_sct, speed=3.0, rank=3),
    Placer("celeritas", place_celeritas, speed=3.0, rank=5),
    Placer("metis", place_metis, speed=0.6, rank=1, needs="pymetis"),
    Placer("heft", place_heft, speed=2.4, rank=4),
    Placer("cpsat", place_cpsat),
    Placer("mip", place_mip),
    # parallelism placers: their plans place the transformed step (the micro-batched
    # or replicated graph), not the graph given, so the heuristics pass does not run them
    Placer("data-parallel", place_data_parallel),
    Placer("gpipe", place_gpipe),
    Placer("1f1b", place_1f1b),
    *(Placer(name, schedule_placer(name)) for name, s in SCHEDULES.items() if not s.plain),
    Placer("hybrid", place_hybrid),
    Placer("slice-cpsat", place_slice_cpsat),
    # the configurations a user would pick instead (solver.parallel.user_baselines), each at its best M
    Placer("megatron", place_megatron),
    Placer("zero-dp", place_zero_dp),
    Placer("best-pipeline", place_best_pipeline),
)}


def heuristic_placers() -> tuple[str, ...]:
    """The heuristics every recipe runs (its ``heuristics`` pass), in tie-break order (``rank``)."""
    return tuple(p.name for p in sorted((p for p in PLACERS.values() if p.rank is not None), key=lambda p: p.rank))


#: The heuristics at import (``pesto.api.HEURISTICS``).
HEURISTICS = heuristic_placers()


def run_order(names: Iterable[str]) -> list[str]:
    """``names`` in the order the heuristics pass runs them: those with a
    ``first`` position first, in it, then the others as given.

    >>> run_order(["expert", "m-etf", "single", "m-topo"])
    ['m-topo', 'm-etf', 'expert', 'single']
    """
    names = list(names)
    first = sorted((n for n in names if get(n).first is not None), key=lambda n: get(n).first)
    return first + [n for n in names if n not in first]


def get(name: str) -> Placer:
    """The record of placer ``name``; ValueError naming the known ones."""
    try:
        return PLACERS[name]
    except KeyError:
        raise ValueError(f"unknown placer {name!r}; known: {sorted(PLACERS)}") from None


def get_placer(name: str) -> Callable[..., Plan]:
    """The placer function registered under ``name``."""
    return get(name).fn


def accepted_options(fn: Callable, options: Mapping) -> dict:
    """The ``options`` that ``fn``'s signature declares (all of them if it
    takes ``**kwargs``). A common option (:data:`COMMON_OPTIONS`) it does not
    declare is left out; any other raises :class:`TypeError`.

    >>> def place(graph, cluster, *, seed=0): ...
    >>> accepted_options(place, {"seed": 1, "time_limit": 5})
    {'seed': 1}
    >>> accepted_options(place, {"sede": 1})
    Traceback (most recent call last):
    TypeError: place takes no option 'sede' (its options: seed)
    """
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return dict(options)
    names = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)} - {"graph", "cluster"}
    unknown = [k for k in options if k not in names and k not in COMMON_OPTIONS]
    if unknown:
        raise TypeError(f"{getattr(fn, '__name__', fn)} takes no option {', '.join(map(repr, unknown))} "
                        f"(its options: {', '.join(sorted(names)) or 'none'})")
    return {k: v for k, v in options.items() if k in names}


def run_placers(graph, cluster, names, *, extra: Mapping[str, Mapping] | None = None, say=None, **options):
    """Run the placers ``names`` on ``graph``, each skipped (never fatal) when
    it raises a :class:`~pesto.errors.PestoError` or lacks its optional
    module; any other exception propagates.

    Parameters
    ----------
    extra : mapping name -> dict, optional
        Options for one placer only (e.g. ``{"m-sct": {"lp_time_limit": 5}}``);
        checked before any placer runs: an unknown placer raises ValueError,
        an option it does not take TypeError.
    say : callable, optional
        Called with a line per placer that ran.
    options : for every placer (``time_limit``, ``seed``...): each gets those
        it declares (:func:`accepted_options`).

    Returns
    -------
    plans : dict name -> Plan
    errors : dict name -> str, why each skipped placer was skipped
    """
    records = [get(n) for n in names]
    extra = dict(extra or {})
    for name, opts in extra.items():
        accepted_options(get(name).fn, opts)
    plans, errors = {}, {}
    for rec in records:
        try:
            plans[rec.name] = rec(graph, cluster, **{**options, **extra.get(rec.name, {})})
        except PestoError as exc:
            errors[rec.name] = f"{type(exc).__name__}: {exc}"
        except ImportError as exc:
            if not rec.missing(exc):
                raise
            errors[rec.name] = f"unavailable: {exc}"
        else:
            if say is not None:
                say(f"{rec.name}: {plans[rec.name].makespan / 1000:.3f} ms ({plans[rec.name].status})")
    return plans, errors
