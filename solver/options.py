"""The options of one solve, validated once: :class:`SolveOptions`.

``pesto.solve`` builds one from its keyword arguments (its signature is the
user's); :func:`solver.recipes.solve`, :func:`solver.recipes.improve`,
:func:`solver.recipes.solve_fine` and the benchmarks pass one down to the
passes, which read it and never re-check it.

Examples
--------
>>> o = SolveOptions(time_limit=20)
>>> o.pass_seconds("full")
{'exact': 4.0, 'lns': 8.0, 'local search': 6.0, 'status': 1.0}
>>> SolveOptions(time_limit=-1)
Traceback (most recent call last):
ValueError: time_limit must be a positive number of seconds, got -1
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

import coarsen
from pesto.errors import MicroBatchError
from pesto.graph import OpGraph
from pesto.plan import Plan

from .registry import PLACERS, heuristic_placers

__all__ = ["SolveOptions", "SHARES", "PAPER_EXACT_SHARE", "RECIPE_NAMES", "pass_shares", "check_int",
           "divisors_of"]


def divisors_of(n: int) -> list[int]:
    """The divisors of ``n`` >= 1, in increasing order.

    >>> divisors_of(12), divisors_of(1)
    ([1, 2, 3, 4, 6, 12], [1])
    """
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


#: The largest ``time_limit`` (seconds, about 30 years): the solvers take it in
#: int64 milliseconds or microseconds, which infinity or 1e300 overflow.
MAX_TIME_LIMIT = 1e9

#: The full recipe's split of ``time_limit``: exact solver, LNS, local search
#: (the rest goes to the heuristics, re-ordering and the bound); see benchmarks/results/lns.md.
SHARES = (0.2, 0.4, 0.3)
#: The paper recipe's exact solve; the rest: heuristics and the bound.
PAPER_EXACT_SHARE = 0.9
RECIPE_NAMES = ("full", "paper")
#: The search passes whose time is a share of ``time_limit``, and their SolveOptions fields.
TIMED = {"exact": "exact_time", "lns": "lns_time", "local search": "search_time"}


def check_int(name: str, value, *, low: int, optional: bool = False) -> None:
    """TypeError unless ``value`` is an int (None too with ``optional``),
    ValueError if it is below ``low``; both name the option.

    >>> check_int("workers", 0, low=1)
    Traceback (most recent call last):
    ValueError: workers must be >= 1, got 0
    """
    if value is None and optional:
        return
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")


def _check_seconds(name: str, value, *, optional: bool = True, positive: bool = False) -> None:
    if value is None and optional:
        return
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and value == value  # not nan
    if not ok or value < 0 or (positive and value == 0) or math.isinf(value):
        raise ValueError(f"{name} must be a finite {'positive' if positive else 'non-negative'} number of seconds, "
                         f"got {value!r}")


def pass_shares(passes: Sequence[str]) -> dict[str, float]:
    """Search pass -> its share of a budget for the search passes in
    ``passes`` (:data:`SHARES`, renormalised over those present), so a recipe
    without a pass gives its time to the others (the ablation).

    >>> pass_shares(["reschedule", "local search", "status"])
    {'exact': 0.0, 'lns': 0.0, 'local search': 1.0}
    """
    weights = dict(zip(TIMED, SHARES))
    total = sum(w for k, w in weights.items() if k in passes)
    return {k: (w / total if k in passes and total else 0.0) for k, w in weights.items()}


@dataclass(frozen=True)
class SolveOptions:
    """Every option of one solve (see :func:`pesto.api.solve` for the user's view).

    time_limit : seconds for the whole run, every pass included (one
        :class:`~pesto.deadline.Deadline`); None: no overall limit (then a
        search pass without an explicit time below gets none)
    target_vertices : coarsen graphs above this many ops
    backend : the exact pass's placer ("cpsat", "mip", or any placer name)
    hint : "best-heuristic", None, a placer name (the only heuristic), or a
        Plan (of the graph: a start; of the solved graph: the exact solver's hint)
    workers, seed : for CP-SAT and the searches
    coarsen_options : options of :func:`coarsen.coarsen` (e.g. ``{"method": "height"}``)
    recipe : "full", "paper" or None (full for CP-SAT, paper otherwise)
    verbose : True (1): print a progress line at each pass's start and end
        (the pass, the incumbent's step, the bound, the gap; ms); 2: CP-SAT's log too
    deterministic : budgets counted in charged work (CP-SAT's deterministic
        time, a fixed cost per simulated move) instead of wall seconds, so the
        same input, seed and limit give the same plan on any load
    progress : called with each progress line (the CLI prints them on stderr)
    started : ``time.perf_counter()`` when the user's call began (the
        deadline counts from it, so pre-checks are inside ``time_limit``)
    heuristics : the heuristics to run (default: every registered one,
        :func:`solver.registry.heuristic_placers`)
    exact_time, lns_time, search_time : seconds for the exact solver, LNS
        and local search; None: their share of ``time_limit``
        (:meth:`pass_seconds`)
    heuristic_time : the ``time_limit`` the heuristics get (m-SCT's LP gets
        15 %); None: ``time_limit`` (60 s without one)
    bound_time : seconds for the communication-aware lower bound in the
        status pass; None: ``min(10, 0.1 * (exact + local search))``; 0:
        the simple bound only
    partitions : the best start placements the coarsening keeps representable
    max_starts : plans the reschedule pass re-orders
    micro_batches : 1 (the step as given), an int ``M`` > 1 (the step in
        ``M`` slices: :mod:`solver.parallel.search`) or ``"auto"``
    batch_size : the step's batch size, if known: ``M`` must divide it, and
        ``"auto"`` tries its divisors up to 16

    Raises
    ------
    TypeError, ValueError
        An option of the wrong type or out of range (``micro_batches`` and
        ``batch_size``: :class:`~pesto.errors.MicroBatchError`), an unknown placer
        (backend, hint or heuristic) or recipe, or an unsupported
        combination (``recipe="full"`` with another backend than CP-SAT).
    """

    time_limit: float | None = 60.0
    target_vertices: int = 200
    backend: str = "cpsat"
    hint: Any = "best-heuristic"
    workers: int | None = None
    seed: int = 0
    coarsen_options: Mapping = field(default_factory=lambda: {"method": "height"})
    recipe: str | None = None
    verbose: bool | int = False
    deterministic: bool = False
    progress: Callable[[str], None] | None = None
    started: float | None = None
    heuristics: tuple | None = None
    exact_time: float | None = None
    lns_time: float | None = None
    search_time: float | None = None
    heuristic_time: float | None = None
    bound_time: float | None = None
    partitions: int = 1
    max_starts: int = 4
    micro_batches: int | str = 1
    batch_size: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "coarsen_options", MappingProxyType(dict(self.coarsen_options)))
        object.__setattr__(self, "deterministic", bool(self.deterministic))
        if self.heuristics is not None:
            object.__setattr__(self, "heuristics", tuple(self.heuristics))
        self._check_numbers()
        self._check_names()
        self._check_micro_batches()

    def _check_micro_batches(self) -> None:
        m, b = self.micro_batches, self.batch_size
        if b is not None and (not isinstance(b, numbers.Integral) or isinstance(b, bool) or b < 1):
            raise MicroBatchError(f"batch_size must be an integer >= 1, got {b!r}", culprit=b)
        if m == "auto":
            return
        if not isinstance(m, numbers.Integral) or isinstance(m, bool):
            near = isinstance(m, str) and difflib.get_close_matches(m.strip().lower(), ["auto"], cutoff=0.5)
            hint = " (did you mean 'auto'?)" if near else ""
            raise MicroBatchError(f"micro_batches must be an integer >= 1 or 'auto', got {m!r} "
                                  f"({type(m).__name__}){hint}", culprit=m)
        if m < 1:
            raise MicroBatchError(f"micro_batches must be an integer >= 1 or 'auto', got {m}", culprit=m)
        if b is not None and b % m:
            divisors = ", ".join(map(str, divisors_of(b)))
            raise MicroBatchError(f"micro_batches={m} does not divide batch_size={b} (its divisors: {divisors})",
                                  culprit=m)

    def _check_numbers(self) -> None:
        t = self.time_limit
        if t is not None and (isinstance(t, bool) or not isinstance(t, numbers.Real)):
            raise TypeError(f"time_limit must be a number of seconds or None, got {t!r} ({type(t).__name__})")
        if t is not None and not t > 0:  # also rejects nan
            raise ValueError(f"time_limit must be a positive number of seconds, got {t!r}")
        if t is not None and not t <= MAX_TIME_LIMIT:  # the solvers take int64 ms or µs: inf or 1e300 overflow
            raise ValueError(f"time_limit must be a finite number of seconds up to {MAX_TIME_LIMIT:g}, got {t!r}; "
                             "for a long solve give a large one (e.g. 3600) and stop it with Ctrl-C")
        check_int("target_vertices", self.target_vertices, low=1)
        check_int("workers", self.workers, low=1, optional=True)
        check_int("seed", self.seed, low=0)
        check_int("partitions", self.partitions, low=1)
        check_int("max_starts", self.max_starts, low=1)
        for name in ("exact_time", "lns_time", "search_time", "heuristic_time", "bound_time"):
            _check_seconds(name, getattr(self, name))

    def _check_names(self) -> None:
        if self.recipe not in (None, *RECIPE_NAMES):
            raise ValueError(f"recipe must be 'full' or 'paper', got {self.recipe!r}")
        if self.backend not in PLACERS:
            raise ValueError(f"unknown placer {self.backend!r} (backend); known: {sorted(PLACERS)}")
        if isinstance(self.hint, str) and self.hint != "best-heuristic" and self.hint not in PLACERS:
            # a misspelt hint must not silently mean "no hint"
            raise ValueError(f"unknown placer {self.hint!r} (hint); known: {sorted(PLACERS)}")
        if not (self.hint is None or isinstance(self.hint, (str, Plan))):
            raise ValueError(f"hint must be 'best-heuristic', None, a placer name or a Plan, got {self.hint!r}")
        unknown = [h for h in self.heuristics or () if h not in PLACERS]
        if unknown:
            raise ValueError(f"unknown placer {unknown[0]!r} (heuristics); known: {sorted(PLACERS)}")
        if self.coarsen_options.get("method", "height") not in coarsen.METHODS:
            raise ValueError(f"unknown coarsening method {self.coarsen_options['method']!r}; "
                             f"choose one of {coarsen.METHODS}")
        if self.recipe == "full" and self.backend != "cpsat":
            raise ValueError(f"recipe='full' runs CP-SAT only; backend={self.backend!r} needs recipe='paper'")

    def replace(self, **changes) -> "SolveOptions":
        """A copy with some options changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def recipe_for(self, graph: OpGraph) -> str:
        """The recipe to run on ``graph``: ``recipe``, or full for
        CP-SAT and paper otherwise; paper for a graph of at most
        ``target_vertices`` ops (solved exactly, nothing to coarsen).

        Raises
        ------
        ValueError
            ``hint=None`` with the full recipe (it starts from the heuristics' plans).
        """
        name = self.recipe or ("full" if self.backend == "cpsat" else "paper")
        if graph.num_ops <= self.target_vertices:
            return "paper"
        if name == "full" and self.hint is None:
            raise ValueError("hint=None: recipe='full' starts from the heuristics' plans; "
                             "use recipe='paper' to solve without a hint")
        return name

    def pass_seconds(self, recipe: str) -> dict[str, float]:
        """Seconds each search pass wants, and the status pass's bound time:
        the explicit ``*_time`` options, else the ``recipe``'s share of
        ``time_limit`` (:data:`SHARES` for "full", :data:`PAPER_EXACT_SHARE`
        to the exact solver for the others; 0 without a ``time_limit``)."""
        shares = dict(zip(TIMED, SHARES if recipe == "full" else (PAPER_EXACT_SHARE, 0.0, 0.0)))
        out = {}
        for pass_name, name in TIMED.items():
            given = getattr(self, name)
            out[pass_name] = given if given is not None else shares[pass_name] * (self.time_limit or 0.0)
        bound = self.bound_time
        out["status"] = min(10.0, 0.1 * (out["exact"] + out["local search"])) if bound is None else bound
        return out

    def heuristic_names(self, as_starts: bool) -> list[str]:
        """The heuristics to run: every heuristic, or the one named by
        ``hint``; none for ``hint=None`` or a Plan, unless they are the
        starts of a recipe that reschedules."""
        if isinstance(self.hint, str) and self.hint != "best-heuristic":
            return [self.hint]
        if self.hint is None or (isinstance(self.hint, Plan) and not as_starts):
            return []
        return list(self.heuristics if self.heuristics is not None else heuristic_placers())

    @property
    def heuristic_seconds(self) -> float:
        """The ``time_limit`` the heuristics get."""
        if self.heuristic_time is not None:
            return self.heuristic_time
        return self.time_limit if self.time_limit is not None else 60.0
