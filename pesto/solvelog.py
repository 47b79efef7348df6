"""The typed log of one ``pesto.solve`` run: what each pass did and who won.

A *recipe* is the list of passes a solve runs (:data:`solver.recipes.RECIPES`:
``"full"``, ``"paper"``); a *pass* is one step of it (heuristics, coarsen,
exact, lns, local search, status...). Plan files written before the rename
(keys ``"pipeline"`` and ``"stages"``) still load.

A :class:`SolveLog` travels with the returned :class:`~pesto.plan.Plan` as
``plan.log`` and is saved in the plan JSON. Read it instead of ``plan.stats``
(which holds free-form placer diagnostics for humans).

Examples
--------
>>> log = SolveLog(recipe="paper", passes=(PassLog("exact", 1.5, 90.0, "optimal"),),
...                candidates={"cpsat": 90.0, "m-etf": 95.0}, winner="cpsat",
...                bound=90.0, bound_source="cpsat", vertices=3)
>>> log.pass_named("exact").makespan, log.pass_named("expand") is None
(90.0, True)
>>> SolveLog.from_dict(log.to_dict()) == log
True
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from .step.replication import BUCKET_BYTES

__all__ = ["PassLog", "SolveLog", "OLD_KEYS", "OLD_PASSES"]

#: JSON keys of plan files written before the rename -> their names now.
OLD_KEYS = {"pipeline": "recipe", "stages": "passes"}
#: Pass names of those files -> their names now.
OLD_PASSES = {"baselines": "heuristics"}


@dataclass(frozen=True)
class PassLog:
    """One pass of a solve: its name, seconds, the step time it reached (µs, the
    best plan so far or the pass's own result; None if it makes no plan) and a
    short note (e.g. ``"200 vertices"``, ``"optimal"``)."""

    name: str
    seconds: float
    makespan: float | None = None
    note: str = ""


def _frozen(m: Mapping | None) -> Mapping:
    return MappingProxyType(dict(m or {}))


@dataclass(frozen=True)
class SolveLog:
    """What one solve did, pass by pass.

    Attributes
    ----------
    recipe : str
        The recipe (list of passes) that ran: ``"full"`` or ``"paper"``
        (``"step search"`` for a micro-batched or replicated step).
    passes : tuple of PassLog
        In the order they ran.
    candidates : mapping name -> µs
        The simulated step time of every plan of the full graph that was
        compared at the end (the heuristics, the exact solver's expanded plan,
        the local search's).
    winner : str
        The candidate returned.
    bound : float, optional
        Lower bound on the optimal step time of the full graph.
    bound_source : str
        ``"critical path / work"``, or the exact solver's name when its bound
        was higher (only when it solved the full graph, not a coarse one);
        ``"per-sample bound (<term>)"`` for a micro-batched or replicated
        step's plan (``solver.parallel.bound.sample_bound``).
    vertices : int, optional
        Vertices of the graph the exact solver saw (ops when not coarsened).
    coarse : mapping, optional
        The exact solve on the coarse graph: ``status``, ``makespan``,
        ``lower_bound`` (valid for the coarse graph only).
    hint : str
        What the exact solver started from (a placer name), or why none.
    stopped : str
        Why the run ended before its passes' budgets: ``"time limit"``,
        ``"SIGINT"``, ``"SIGTERM"``, ``"stopped early: incumbent within 1e-06
        of the lower bound (<its source>)"``; empty if it did not.
    stopped_early : bool
        The search passes left were skipped because the incumbent was proven
        optimal (within :data:`solver.bounds.TOLERANCE` of a lower bound).
    deterministic : bool
        Budgets were counted in charged work, not wall seconds.
    skipped : mapping name -> str
        Placers that failed or whose plan was invalid, and why.
    micro_batches : int
        Slices the step was split into (``pesto.solve(micro_batches=...)``; 1: not split).
    graph_kind : str
        The graph the plan places: ``"step"`` (the graph given),
        ``"micro-batched"`` (:func:`pesto.step.split` of it) or
        ``"replicated"`` (:func:`pesto.step.replicate`, one replica per
        GPU, split into ``micro_batches`` when above 1).
    replicas : int
        Data-parallel replicas (1 unless ``graph_kind == "replicated"``).
    savers : str
        The memory savers of the plan's strategy
        (:attr:`solver.parallel.strategy.Strategy.savers`: ``"ZeRO-2"``,
        ``"recompute"``, ``"ZeRO-2 recompute"``); empty for none (then
        omitted from JSON).
    joined : tuple of str
        The step's weight-gradient ops the plan's split runs once over every
        slice (:func:`pesto.step.split`'s ``weight_grads="whole"``, the others
        ``"separate"`` or :attr:`in_place`: :attr:`solver.parallel.strategy.Strategy.joined`);
        empty for none (then omitted from JSON).
    in_place : tuple of str
        The step's weight-gradient ops the plan's split sums in place
        (``weight_grads="accumulate"``, Megatron-LM's GEMM with ``beta = 1``:
        :attr:`solver.parallel.strategy.Strategy.in_place`; a replicated
        plan's rule is one for all: its step's weight-gradient ops); empty
        for none (then omitted from JSON). :attr:`split_rule` gives both as
        :func:`pesto.step.split`'s mapping.
    bucket_bytes : int or None
        A replicated plan's gradient bucket size
        (:func:`pesto.step.replicate`'s ``bucket_bytes``; default
        :data:`pesto.step.replication.BUCKET_BYTES`, DDP's 25 MiB, then
        omitted from JSON).
    steps : mapping name -> µs
        With ``micro_batches`` "auto" or above 1: the step time of each plan
        compared across graphs (``"M=4"``: Pesto's best with 4 slices,
        ``"gpipe M=4"``, ``"1f1b M=4"``, ``"data-parallel"``).
    one_device : float or None
        The step (µs) of the whole step on one device (the ``single``
        heuristic, simulated on the solved graph), when it was made: what
        the speed-up in :meth:`pesto.plan.Plan.summary` is over.
    """

    recipe: str
    passes: tuple = ()
    candidates: Mapping[str, float] = field(default_factory=dict)
    winner: str = ""
    bound: float | None = None
    bound_source: str = ""
    vertices: int | None = None
    coarse: Mapping[str, Any] = field(default_factory=dict)
    hint: str = ""
    skipped: Mapping[str, str] = field(default_factory=dict)
    stopped: str = ""
    stopped_early: bool = False
    deterministic: bool = False
    micro_batches: int = 1
    graph_kind: str = "step"
    replicas: int = 1
    savers: str = ""
    joined: tuple = ()
    in_place: tuple = ()
    bucket_bytes: int | None = BUCKET_BYTES
    steps: Mapping[str, float] = field(default_factory=dict)
    one_device: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "passes", tuple(self.passes))
        object.__setattr__(self, "joined", tuple(self.joined))
        object.__setattr__(self, "in_place", tuple(self.in_place))
        for key in ("candidates", "coarse", "skipped", "steps"):
            object.__setattr__(self, key, _frozen(getattr(self, key)))

    @property
    def split_rule(self) -> dict:
        """The weight-gradient rules of the plan's split (:func:`pesto.step.split`'s
        mapping: :attr:`joined` ``"whole"``, :attr:`in_place` ``"accumulate"``, the
        others ``"separate"``).

        >>> SolveLog("x", joined=("a",), in_place=("b",)).split_rule
        {'a': 'whole', 'b': 'accumulate'}
        """
        return {**dict.fromkeys(self.joined, "whole"), **dict.fromkeys(self.in_place, "accumulate")}

    @property
    def step_choices(self) -> tuple[str, ...]:
        """The step's choices beyond its kind, in words: memory savers, a
        bucket size other than DDP's, weight gradients run whole or summed in
        place (the one text the CLI and the benchmarks print).

        >>> SolveLog("x", savers="ZeRO-1", bucket_bytes=25 * 2**19, joined=("a",)).step_choices
        ('ZeRO-1', 'buckets 12.5 MiB', '1 weight gradient(s) run whole')
        >>> SolveLog("x").step_choices
        ()
        """
        return tuple(c for c in (
            self.savers,
            f"buckets {self.bucket_bytes / 2**20:g} MiB" if self.bucket_bytes not in (None, BUCKET_BYTES) else "",
            f"{len(self.joined)} weight gradient(s) run whole" if self.joined else "",
            f"{len(self.in_place)} summed in place" if self.in_place else "") if c)

    def pass_named(self, name: str) -> PassLog | None:
        """The last pass called ``name``, or None if it did not run."""
        return next((s for s in reversed(self.passes) if s.name == name), None)

    def to_dict(self) -> dict:
        return {"recipe": self.recipe, "passes": [s.__dict__.copy() for s in self.passes],
                "candidates": dict(self.candidates), "winner": self.winner, "bound": self.bound,
                "bound_source": self.bound_source, "vertices": self.vertices,
                "coarse": dict(self.coarse), "hint": self.hint, "skipped": dict(self.skipped),
                "stopped": self.stopped, "deterministic": self.deterministic,
                **({"stopped_early": True} if self.stopped_early else {}),
                **({"one_device": self.one_device} if self.one_device is not None else {}),
                **self._step_dict()}

    def _step_dict(self) -> dict:
        """The micro-batch fields, only when the plan is not of the graph as
        given (so an un-split solve's JSON is what it always was)."""
        if self.graph_kind == "step" and self.micro_batches == 1 and not self.steps:
            return {}
        return {"micro_batches": self.micro_batches, "graph_kind": self.graph_kind, "replicas": self.replicas,
                **({"savers": self.savers} if self.savers else {}),
                **({"joined": list(self.joined)} if self.joined else {}),
                **({"in_place": list(self.in_place)} if self.in_place else {}),
                **({"bucket_bytes": self.bucket_bytes} if self.bucket_bytes != BUCKET_BYTES else {}),
                "steps": dict(self.steps)}

    @classmethod
    def from_dict(cls, d: Mapping) -> "SolveLog":
        """The log of :meth:`to_dict`; a file written before the rename
        (``"pipeline"``, ``"stages"``, pass ``"baselines"``) reads the same.

        >>> old = {"pipeline": "paper", "stages": [{"name": "baselines", "seconds": 0.1}]}
        >>> log = SolveLog.from_dict(old)
        >>> log.recipe, log.passes[0].name
        ('paper', 'heuristics')
        """
        d = dict(d)
        for old, new in OLD_KEYS.items():
            if old in d:
                d.setdefault(new, d.pop(old))
        passes = (dict(s) for s in d.get("passes", ()))
        d["passes"] = tuple(PassLog(**{**s, **({"name": OLD_PASSES.get(s["name"], s["name"])} if "name" in s else {})})
                            for s in passes)
        return cls(**d)
