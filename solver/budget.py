"""The one budget planner of a solve: which pass runs, and until when.

A solve has one clock (:class:`~pesto.deadline.Deadline`) and one
:class:`Budget` over it and its recipe. Before a pass runs, the
recipe asks ``budget.grant(name)``; the answer is the pass's own
deadline (a :meth:`~pesto.deadline.Deadline.sub` of the solve's) or a
:class:`Skip` with the reason. Passes never compute reserves themselves.

Costs are predicted in **runs**: seconds of one m-TOPO run on the graph, the
cost unit (:attr:`Budget.unit`, measured once, from the first heuristic, by
:meth:`Budget.measure`). :data:`COSTS` gives each pass's least cost
(:class:`Cost`: runs plus fixed seconds) and whether it is *optional* (a
search pass: the solve has a plan without it) or *mandatory* (heuristics,
reschedule, expand, status: needed for the plan).

The rules of :meth:`Budget.grant`:

0. once the solve is finished early (:meth:`Budget.finish`: the incumbent is
   within :data:`~solver.bounds.TOLERANCE` of a lower bound, so no search can
   improve it), every optional pass is skipped with that reason;
1. an optional pass is skipped once the deadline has passed or the solve was
   interrupted, and with the pass it depends on (``Cost.after``: the exact
   pass after coarsen);
2. with a unit on the wall clock, an optional pass with a least cost (or a
   step with a ``need``, e.g. a heuristic's predicted time) is skipped when
   that cost plus the least costs of the mandatory passes still ahead do not
   fit in the time left;
3. otherwise it gets what it wants (``want``: its share of the time limit,
   :meth:`solver.options.SolveOptions.pass_seconds`), capped so that the
   passes ahead keep their reserve (:meth:`Budget.reserve`): an optional
   pass leaves every pass ahead its least cost and the mandatory ones what
   they want (the status pass's bound time); a mandatory pass leaves the
   mandatory passes ahead their least cost.

Deterministic mode: the clock is charged work (:class:`~pesto.deadline.WorkClock`),
so a prediction from wall seconds would make the plan depend on the machine's
load: rule 2 never applies and costs in runs count as zero; a pass is still
skipped once the charged work passes the limit, or on an interrupt.

Examples
--------
>>> from pesto.deadline import Deadline
>>> b = Budget(Deadline(10.0), ["lns", "local search", "status"], {"lns": 5.0, "status": 1.0})
>>> b.measure(1.0)   # one m-TOPO run: 1 s
>>> b.reserve("lns")  # local search's least (1.5 runs), the status pass's (3.5) and its bound time
6.0
>>> 3.9 < b.grant("lns").seconds <= 4.0  # it wants 5 s; 4 are left beside the reserve
True
>>> Budget(Deadline(4.0), ["lns", "status"], unit=1.0).grant("lns")  # 1.5 + 3.5 runs do not fit
Skip(reason='time limit (needs ~5.0 s, 4.0 s left)')
>>> Budget(Deadline(4.0, deterministic=True), ["lns", "status"], unit=1.0).grant("lns").seconds
4.0
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Sequence

from pesto.deadline import Deadline

__all__ = ["Budget", "Cost", "Skip", "COSTS", "RESCHEDULE_RUNS", "CANDIDATE_RUNS", "STATUS_RUNS", "CHAIN_RUNS",
           "CHECK_RUNS", "COMM_BOUND_RUNS", "GROUP_SHARE", "GROUP_MIN_SECONDS", "HEURISTIC_COST"]

#: Re-ordering one plan (the reschedule pass: up to four candidate orders), and one candidate order.
RESCHEDULE_RUNS, CANDIDATE_RUNS = 1.0, 0.8
#: The final check of the winning plan.
CHECK_RUNS = 1.0
#: The chain bound and its heads and tails (:func:`solver.bounds.chain_heads`).
CHAIN_RUNS = 2.0
#: The status pass: the simple bound and choosing the winner (half a run), the chain bound, the final check.
STATUS_RUNS = 0.5 + CHAIN_RUNS + CHECK_RUNS
#: The communication-aware bound's model building (its time limit bounds the search only).
COMM_BOUND_RUNS = 4.0
#: The share of the time left that the "one group" pass gives its inner solve,
#: and the least it needs to be worth running.
GROUP_SHARE = 0.3
GROUP_MIN_SECONDS = 2.0
#: Work charged per heuristic run in deterministic mode, in replays of the graph.
HEURISTIC_COST = 20


@dataclass(frozen=True)
class Cost:
    """What a pass needs at least (``runs`` of m-TOPO plus ``seconds``), whether
    the solve can do without it (``optional``), the pass it is skipped with
    (``after``), and the share of the time left it wants (``share``)."""

    runs: float = 0.0
    seconds: float = 0.0
    optional: bool = True
    after: str | None = None
    share: float | None = None


#: Each pass's cost, in m-TOPO runs of the graph. A pass not named here is
#: mandatory and free. Coarsen's least also pays for expanding and re-ordering
#: the exact plan (+ 1 s of CP-SAT); LNS's and local search's for a final
#: simulation; the status pass's is :data:`STATUS_RUNS`.
COSTS: Mapping[str, Cost] = MappingProxyType({
    "heuristics": Cost(optional=False),
    "one group": Cost(share=GROUP_SHARE),
    "reschedule": Cost(runs=RESCHEDULE_RUNS, optional=False),
    "coarsen": Cost(runs=4.0, seconds=1.0),
    "exact": Cost(after="coarsen"),
    "expand": Cost(optional=False),
    "lns": Cost(runs=1.5),
    "local search": Cost(runs=1.5),
    "status": Cost(runs=STATUS_RUNS, optional=False),
})


@dataclass(frozen=True)
class Skip:
    """A pass (or step) that does not run, and why (``"time limit (needs
    ~3.1 s, 2.0 s left)"``, ``"SIGINT"``...)."""

    reason: str
    early: bool = field(default=False, repr=False)  # rule 0: the solve finished early (:meth:`Budget.finish`)

    @property
    def note(self) -> str:
        """The pass note: ``"skipped: <reason>"``."""
        return f"skipped: {self.reason}"


class Budget:
    """The time of one solve, pass by pass (see the module docstring).

    Parameters
    ----------
    deadline : the solve's clock
    passes : the recipe, in order
    wants : pass -> seconds it wants (missing: all that is left)
    costs : pass -> :class:`Cost` (default :data:`COSTS`)
    unit : seconds of one m-TOPO run, if known already (an inner solve
        reuses its outer solve's)
    """

    def __init__(self, deadline: Deadline, passes: Sequence[str], wants: Mapping[str, float] | None = None,
                 costs: Mapping[str, Cost] = COSTS, *, unit: float | None = None):
        self.deadline = deadline
        self.passes = tuple(passes)
        self.wants = dict(wants or {})
        self.costs = dict(costs)
        self.unit = unit
        self.skipped: dict[str, str] = {}  # pass -> reason, the passes this budget skipped
        self.stopped = ""  # why passes were skipped for time: "time limit", "SIGINT"...
        self.finished = ""  # why no optional pass runs any more (:meth:`finish`), e.g. the incumbent is optimal
        self.stopped_early = False  # a pass was skipped for that reason

    def measure(self, seconds_per_run: float) -> None:
        """Set the cost unit, once (a later measure is ignored)."""
        if self.unit is None:
            self.unit = float(seconds_per_run)

    @property
    def predicting(self) -> bool:
        """Costs in runs count: the unit is known and the clock is the wall's."""
        return self.unit is not None and not self.deadline.deterministic

    def runs(self, n: float) -> float:
        """Predicted seconds of ``n`` m-TOPO runs (0 when not predicting)."""
        return n * self.unit if self.predicting else 0.0

    def fits(self, n: float) -> bool:
        """``n`` runs fit in what is left (always, when not predicting)."""
        return self.left() >= self.runs(n)

    def left(self) -> float:
        return self.deadline.left()

    def cost(self, pass_name: str) -> Cost:
        return self.costs.get(pass_name, Cost(optional=False))

    def least(self, pass_name: str) -> float:
        """Seconds ``pass_name`` needs at least."""
        c = self.cost(pass_name)
        return self.runs(c.runs) + c.seconds

    def _ahead(self, pass_name: str) -> list[str]:
        k = self.passes.index(pass_name) if pass_name in self.passes else len(self.passes)
        return list(self.passes[k + 1:])

    def reserve(self, pass_name: str) -> float:
        """Seconds ``pass_name`` leaves the passes ahead of it (rule 3)."""
        optional = self.cost(pass_name).optional
        total = 0.0
        for s in self._ahead(pass_name):
            mandatory = not self.cost(s).optional
            if mandatory or optional:
                total += self.least(s)
            if mandatory and optional:
                total += self.wants.get(s, 0.0)
        return total

    def _short(self, pass_name: str, need: float) -> str:
        """Why ``pass_name`` (or a step of it needing ``need`` seconds) cannot fit (rule 2), or ""."""
        if not self.predicting:
            return ""
        need += self.least(pass_name) if self.cost(pass_name).optional else 0.0
        if need <= 0:
            return ""
        need += sum(self.least(s) for s in self._ahead(pass_name) if not self.cost(s).optional)
        left = self.left()
        return "" if need <= left else f"time limit (needs ~{need:.1f} s, {left:.1f} s left)"

    def grant(self, pass_name: str, want: float | None = None, *, need: float = 0.0) -> Deadline | Skip:
        """The deadline ``pass_name`` runs under, or why it is skipped.

        Parameters
        ----------
        want : seconds it asks for (default: ``wants[pass_name]``, else its
            ``share`` of the time left, else all that is left)
        need : predicted seconds of a step inside the pass (a heuristic),
            checked as in rule 2 (wall clock with a unit only)
        """
        cost, dl = self.cost(pass_name), self.deadline
        if self.finished and cost.optional:
            return Skip(self.finished, early=True)
        if cost.optional or need:
            why = self._why_not(pass_name, need)
            if why:
                return Skip(why)
        if want is None:
            want = self.wants.get(pass_name, cost.share * self.left() if cost.share is not None else math.inf)
        return dl.sub(max(0.0, min(want, self.left() - self.reserve(pass_name))))

    def finish(self, reason: str) -> None:
        """Stop early: from now on every optional pass is skipped for ``reason``
        (rule 0; the mandatory ones still run). The first reason stays."""
        self.finished = self.finished or reason

    def _why_not(self, pass_name: str, need: float) -> str:
        cost, dl = self.cost(pass_name), self.deadline
        if dl.interrupted:
            return dl.reason
        if cost.optional and dl.expired():
            return dl.reason or "time limit"
        if cost.after is not None and self.skipped.get(cost.after, "").startswith("time limit"):
            return f"time limit (no time to {cost.after} and expand)"
        return self._short(pass_name, need)

    def skip(self, pass_name: str, skip: Skip) -> None:
        """Record that ``pass_name`` was skipped (the passes ahead reserve nothing for it)."""
        self.skipped[pass_name] = skip.reason
        self.stopped_early = self.stopped_early or skip.early
        self.stopped = self.stopped or ("time limit" if skip.reason.startswith("time limit") else skip.reason)
