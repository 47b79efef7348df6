"""Typed outcomes: what a placer or a search found out, as fields.

Every placer returns a :class:`~pesto.plan.Plan`; what it found out on the
way (CP-SAT's own status, a fallback, the LNS windows kept, a re-ordering cut
short...) travels in ``plan.info``, a tuple of the frozen dataclasses below,
oldest first (a CP-SAT plan re-ordered carries a :class:`CpsatInfo`, then a
:class:`RescheduleInfo`). Code reads these fields (:meth:`Plan.info_of
<pesto.plan.Plan.info_of>`); ``plan.stats`` is their flat dict view for
people and JSON (:meth:`Outcome.view`), with the key names it always had.

============================  ====================================================
:class:`MemoryInfo`           the simulated peak over capacity, the repair
:class:`HeuristicInfo`        a heuristic's own estimate and figures
:class:`ExpertInfo`           which Expert rule and split won
:class:`CpsatInfo`            CP-SAT's status, fallback, memory model, model size
:class:`MipInfo`              the paper MIP's status and model size
:class:`LnsInfo`              CP-SAT windows tried and kept
:class:`RefineInfo`           local-search moves tried and kept
:class:`RescheduleInfo`       the orders compared, the winner, a cut
============================  ====================================================

Examples
--------
>>> info = RescheduleInfo(candidates={"given": 12.0, "rank": 10.0}, schedule="rank")
>>> info.view()
{'reschedule': {'given': 12.0, 'rank': 10.0}, 'schedule': 'rank'}
>>> outcome_from_dict(info.to_dict()) == info
True
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any, ClassVar, Mapping

__all__ = ["Outcome", "MemoryInfo", "HeuristicInfo", "ExpertInfo", "CpsatInfo", "MipInfo", "LnsInfo",
           "RefineInfo", "RescheduleInfo", "OUTCOMES", "outcome_from_dict"]


def _freeze(x):
    """Mappings read-only, sequences tuples (all the way down): equal after a JSON round trip."""
    if isinstance(x, Mapping):
        return MappingProxyType({k: _freeze(v) for k, v in x.items()})
    if isinstance(x, (list, tuple)):
        return tuple(_freeze(v) for v in x)
    return x


def _plain(x):
    """Dicts and lists again, for people and JSON."""
    if isinstance(x, Mapping):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


@dataclass(frozen=True)
class Outcome:
    """One step's outcome. Subclasses set :attr:`kind` (its name in JSON),
    optionally :attr:`nest` (the view goes under that one key) and
    :attr:`keys` (field -> stats key, where they differ). A field that is
    None is absent from the view."""

    kind: ClassVar[str] = ""
    nest: ClassVar[str | None] = None
    keys: ClassVar[Mapping[str, str]] = MappingProxyType({})

    def __post_init__(self):
        for f in fields(self):
            object.__setattr__(self, f.name, _freeze(getattr(self, f.name)))

    def view(self) -> dict:
        """The ``plan.stats`` entries of this outcome."""
        d = {self.keys.get(f.name, f.name): _plain(getattr(self, f.name)) for f in fields(self)
             if getattr(self, f.name) is not None}
        return {self.nest: d} if self.nest else d

    @classmethod
    def view_keys(cls) -> set[str]:
        """The ``plan.stats`` keys this kind of outcome may set."""
        if cls.nest:
            return {cls.nest}
        return {cls.keys.get(f.name, f.name) for f in fields(cls)}

    def to_dict(self) -> dict:
        """``{"kind": ..., field: value}`` (see :func:`outcome_from_dict`)."""
        return {"kind": self.kind, **{f.name: _plain(getattr(self, f.name)) for f in fields(self)}}


@dataclass(frozen=True)
class MemoryInfo(Outcome):
    """A plan over device memory, and the repair (:func:`pesto.finalize.fit_memory`).

    over : device -> simulated peak bytes, for each over-full device
    forced : ops placed best effort by the placer (at most 50 named)
    forced_count : how many ops were placed best effort
    note : what the best-effort placement means
    moved_units : colocation units the repair moved
    repair_cut : why the repair stopped early ("time limit", "SIGINT")
    """

    kind: ClassVar[str] = "memory"
    keys: ClassVar[Mapping[str, str]] = MappingProxyType({
        "over": "memory_over", "forced": "memory_forced", "forced_count": "memory_forced_count",
        "note": "memory_note", "moved_units": "memory_moved_units", "repair_cut": "memory_repair_cut"})
    over: Mapping[str, int] | None = None
    forced: tuple | None = None
    forced_count: int | None = None
    note: str | None = None
    moved_units: int | None = None
    repair_cut: str | None = None


@dataclass(frozen=True)
class HeuristicInfo(Outcome):
    """A heuristic's own figures (each set only by the placer that has it).

    estimated_makespan : the list scheduler's own estimate (µs)
    moved : ops Celeritas moved off their first device
    device : the device of the single-device plan
    edge_cut : METIS's edge cut
    lp_status : m-SCT's LP: "optimal", "feasible", "time_limit" or "failed"
    lp : m-SCT's other LP figures (seconds, size, favourite pairs)
    """

    kind: ClassVar[str] = "heuristic"
    estimated_makespan: float | None = None
    moved: int | None = None
    device: str | None = None
    edge_cut: int | None = None
    lp_status: str | None = None
    lp: Mapping[str, Any] | None = None

    def view(self) -> dict:
        d = super().view()
        d.update(d.pop("lp", {}))
        return d


@dataclass(frozen=True)
class ExpertInfo(Outcome):
    """Which Expert rule made the plan (``"mapping"``, ``"layers"``,
    ``"scopes"``, ``"paper"``), its number of stages, the simulated step of
    each split timed, and why timing stopped early."""

    kind: ClassVar[str] = "expert"
    keys: ClassVar[Mapping[str, str]] = MappingProxyType({
        "rule": "expert_rule", "stages": "expert_stages", "candidates": "expert_candidates", "cut": "expert_cut"})
    rule: str | None = None
    stages: int | None = None
    candidates: Mapping[str, float] | None = None
    cut: str | None = None


@dataclass(frozen=True)
class CpsatInfo(Outcome):
    """What CP-SAT did (:func:`solver.cpsat.place_cpsat`).

    model_status : CP-SAT's word on its model: "optimal", "feasible",
        "infeasible" or "unknown" (the plan's ``status`` is the simulator's:
        a restricted or relaxed model can differ)
    fallback : why the hint's plan was returned instead of a solution
        ("model proved infeasible", "no solution within the time limit",
        "not searched: <reason>"); None when CP-SAT found one
    fallback_placer : the placer of that hint
    memory_model : the memory constraint that held ("static", "persistent",
        "persistent (static model infeasible)")
    phases : the aggregated model's and the exact model's step and status,
        when the exact model continued from the aggregated one
    simulated_above_model : the simulator's FCFS links made the plan slower
        than the model's schedule (the status is then "feasible")
    The other fields are model figures (sizes, scale, bound, times).
    """

    kind: ClassVar[str] = "cpsat"
    model_status: str = "unknown"
    fallback: str | None = None
    fallback_placer: str | None = None
    stopped: str | None = None
    memory_model: str | None = None
    phases: Mapping[str, Any] | None = None
    simulated_above_model: bool | None = None
    restricted_model: str | None = None
    hint_used: str | None = None
    hint_rejected: str | None = None
    cpsat_status: str | None = None
    model_makespan: float | None = None
    best_bound_units: float | None = None
    scale: float | None = None
    exact_units: bool | None = None
    horizon_units: int | None = None
    rounding_error_us: float | None = None
    explicit_lower_bound: float | None = None
    workers: int | None = None
    contended_model: bool | None = None
    pure_cumulative: bool | None = None
    aggregated_transfers: bool | None = None
    memory_constraints: bool | None = None
    symmetric_groups: tuple | None = None
    num_variables: int | None = None
    num_constraints: int | None = None
    solve_time: float | None = None
    build_time: float | None = None

    @property
    def proved_infeasible(self) -> bool:
        """CP-SAT proved its model has no solution."""
        return self.model_status == "infeasible"

    @property
    def solved(self) -> bool:
        """CP-SAT found a solution (the plan is not the hint's fallback)."""
        return self.fallback is None


@dataclass(frozen=True)
class MipInfo(Outcome):
    """What the paper's MIP did (:func:`solver.mip.place_mip`): backend,
    status code, model size, objective and bound; ``fallback`` as in
    :class:`CpsatInfo`."""

    kind: ClassVar[str] = "mip"
    keys: ClassVar[Mapping[str, str]] = MappingProxyType({"backend": "mip_backend", "status_code": "mip_status"})
    backend: str | None = None
    status_code: int | None = None
    fallback: str | None = None
    model_makespan: float | None = None
    best_bound: float | None = None
    simulated_above_model: bool | None = None
    big_m: float | None = None
    device_pairs: int | None = None
    link_pairs: int | None = None
    num_variables: int | None = None
    num_constraints: int | None = None
    explicit_lower_bound: float | None = None
    memory_constraints: bool | None = None


@dataclass(frozen=True)
class LnsInfo(Outcome):
    """The CP-SAT windows of :func:`solver.lns.lns`: tried, kept (the
    simulator confirmed a shorter step), the step before and after, per
    window kind (tried, kept, gain) and per CP-SAT status."""

    kind: ClassVar[str] = "lns"
    nest: ClassVar[str | None] = "lns"
    windows: int = 0
    kept: int = 0
    start_makespan: float | None = None
    makespan: float | None = None
    by_kind: Mapping[str, Any] | None = None
    cpsat: Mapping[str, int] | None = None
    window: int | None = None
    seconds: float | None = None


@dataclass(frozen=True)
class RefineInfo(Outcome):
    """The moves of :func:`solver.search.refine`: placements scored, moves
    kept, the step before and after, the levels (units per level, moves kept
    per level), kicks, and seconds (``search_seconds``: moving units only)."""

    kind: ClassVar[str] = "refine"
    nest: ClassVar[str | None] = "refine"
    evaluations: int = 0
    accepted: int = 0
    start_makespan: float | None = None
    makespan: float | None = None
    levels: tuple | None = None
    accepted_per_level: Any = None
    kicks: int | None = None
    seconds: float | None = None
    search_seconds: float | None = None


@dataclass(frozen=True)
class RescheduleInfo(Outcome):
    """The orders :func:`solver.search.reschedule` compared (name -> step),
    the one that won, and why it stopped before trying them all (None: it
    did not)."""

    kind: ClassVar[str] = "reschedule"
    keys: ClassVar[Mapping[str, str]] = MappingProxyType({"candidates": "reschedule", "cut": "reschedule_cut"})
    candidates: Mapping[str, float] | None = None
    schedule: str | None = None
    cut: str | None = None


#: kind -> class, for reading plan files.
OUTCOMES: Mapping[str, type] = MappingProxyType({c.kind: c for c in (
    MemoryInfo, HeuristicInfo, ExpertInfo, CpsatInfo, MipInfo, LnsInfo, RefineInfo, RescheduleInfo)})


def outcome_from_dict(d: Mapping) -> Outcome | None:
    """The outcome :meth:`Outcome.to_dict` wrote; None for a kind this
    version does not know (a newer file: its ``stats`` still say it).

    Raises
    ------
    TypeError
        A field the kind does not have.
    """
    cls = OUTCOMES.get(d.get("kind"))
    if cls is None:
        return None
    return cls(**{k: v for k, v in d.items() if k != "kind"})
