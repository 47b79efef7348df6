"""The one result type every placer returns, and the independent checker.

A :class:`Plan` says where every op runs and in which order on each device; it
may also carry the times of a schedule (op start/finish and transfers), the
predicted step time (makespan), a lower bound, and how it was found.

:func:`check_plan` verifies any plan against the problem without trusting the
placer: every op placed on a device that exists and allows its kind,
colocation groups whole, per-device order consistent with the DAG, and, when
times are given, precedence with transfer times, no overlap on a device or a
link, and memory at most capacity. It reports every violation by name.

JSON schema (``format = "pesto.plan"``, ``version = 1``)::

    {"format": "pesto.plan", "version": 1, "placer": "cpsat", "status": "optimal",
     "placement": {"op": "/GPU:0"}, "order": {"/GPU:0": ["op"]},
     "start": {"op": 0.0} | null, "finish": {"op": 3.0} | null,
     "transfers": [{"tensor": "a:0", "src": "/GPU:0", "dst": "/GPU:1",
                    "start": 3.0, "finish": 9.0}] | null,
     "makespan": 9.0, "lower_bound": 7.5, "wall_time": 0.2,
     "peak_memory": {"/GPU:0": 1024} | null, "stats": {},
     "info": [{"kind": "cpsat", "model_status": "optimal", ...}],
     "log": {"recipe": "full", "passes": [...], "winner": "refine", ...} | null}

``log`` (a :class:`~pesto.solvelog.SolveLog`, from ``pesto.solve``) and ``info``
(the typed outcomes, :mod:`pesto.outcome`; ``stats`` is their flat view) are
optional: plan files written before they existed still load. ``pesto place -o`` adds the
cluster (``"cluster"``, a ``pesto.cluster`` dict) and ``"graph"`` (its name) for
``pesto simulate``; loading a Plan ignores them.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Mapping

from .jsonio import write as _write_document
from .dag import toposort
from .errors import CycleError, InvalidPlanError, SchemaError
from .graph import OpGraph, _check_header, _field, _load_json
from .cluster import Cluster, preset
from .memory import fmt_bytes, memory_profile
from .outcome import Outcome, outcome_from_dict
from .solvelog import SolveLog

FORMAT = "pesto.plan"
VERSION = 1
STATUSES = ("optimal", "feasible", "heuristic", "infeasible", "unknown", "interrupted")
EPS = 1e-6  # µs; tolerance for float schedules

__all__ = ["Transfer", "Plan", "Report", "check_plan", "memory_profile", "percent", "STATUSES"]


@dataclass(frozen=True)
class Transfer:
    """One tensor sent from device ``src`` to device ``dst`` during [start, finish]."""

    tensor: str
    src: str
    dst: str
    start: float
    finish: float


@dataclass(frozen=True)
class Plan:
    """Placement + per-device order (+ optional schedule times) of one step.

    Parameters
    ----------
    placement : mapping op -> device name
    order : mapping device name -> tuple of ops, the order they run in
    start, finish : mapping op -> µs, optional
    transfers : tuple of Transfer, optional
    makespan : float, optional
        Predicted step time (µs).
    lower_bound : float, optional
        Proven lower bound on the optimal makespan (exact solvers).
    status : str
        One of ``optimal``, ``feasible`` (exact solver stopped early),
        ``heuristic``, ``infeasible`` (plan exists but breaks memory, or no plan),
        ``unknown``, ``interrupted`` (the best plan when a solve was stopped
        by Ctrl-C / SIGTERM).
    placer : str
    wall_time : float
        Seconds the placer took.
    peak_memory : mapping device -> bytes, optional
    stats : mapping
        Diagnostics for people and JSON: the flat view of ``info``
        (:meth:`pesto.outcome.Outcome.view`, merged over any notes given
        here); not an API: code reads ``info``.
    log : SolveLog, optional
        What ``pesto.solve`` did, pass by pass (typed; see
        :mod:`pesto.solvelog`). None for a plan from a single placer.
    info : tuple of pesto.outcome.Outcome
        What the steps that made the plan found out, oldest first (typed:
        :mod:`pesto.outcome`); read one with :meth:`info_of`.
    """

    placement: Mapping[str, str]
    order: Mapping[str, tuple]
    start: Mapping[str, float] | None = None
    finish: Mapping[str, float] | None = None
    transfers: tuple | None = None
    makespan: float | None = None
    lower_bound: float | None = None
    status: str = "heuristic"
    placer: str = ""
    wall_time: float = 0.0
    peak_memory: Mapping[str, int] | None = None
    stats: Mapping[str, Any] = field(default_factory=dict)
    log: SolveLog | None = None
    info: tuple = ()

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")
        object.__setattr__(self, "placement", MappingProxyType(dict(self.placement)))
        object.__setattr__(self, "order", MappingProxyType({d: tuple(o) for d, o in self.order.items()}))
        for key in ("start", "finish", "peak_memory"):
            v = getattr(self, key)
            if v is not None:
                object.__setattr__(self, key, MappingProxyType(dict(v)))
        if self.transfers is not None:
            object.__setattr__(self, "transfers", tuple(self.transfers))
        object.__setattr__(self, "info", tuple(self.info))
        stats = dict(self.stats)
        for outcome in self.info:
            stats.update(outcome.view())
        object.__setattr__(self, "stats", MappingProxyType(stats))

    def info_of(self, kind: type[Outcome]):
        """The last outcome of type ``kind`` in :attr:`info`, or None.

        >>> from pesto.outcome import RescheduleInfo
        >>> p = Plan({}, {}, info=(RescheduleInfo(schedule="fifo", cut="time limit"),))
        >>> p.info_of(RescheduleInfo).cut, p.stats["reschedule_cut"]
        ('time limit', 'time limit')
        """
        return next((o for o in reversed(self.info) if isinstance(o, kind)), None)

    @property
    def gap(self) -> float | None:
        """(makespan - lower_bound) / makespan, or None if either is unknown."""
        if self.makespan is None or self.lower_bound is None or self.makespan <= 0:
            return None
        return max(0.0, (self.makespan - self.lower_bound) / self.makespan)

    @property
    def has_times(self) -> bool:
        return self.start is not None and self.finish is not None

    def devices_used(self) -> list[str]:
        return sorted({d for d in self.placement.values()})

    def replace(self, **changes) -> "Plan":
        """A copy with some fields changed."""
        return replace(self, **changes)

    @classmethod
    def from_placement(cls, graph: OpGraph, placement: Mapping[str, str], order=None, **kw) -> "Plan":
        """A plan whose per-device order is ``order`` (a global op sequence) or,
        by default, the graph's topological order restricted to each device.

        Examples
        --------
        >>> from pesto.graph import OpGraph
        >>> g = OpGraph.from_edges({"a": 1, "b": 1, "c": 1}, [("a", "b"), ("a", "c")])
        >>> p = Plan.from_placement(g, {"a": "/GPU:0", "b": "/GPU:1", "c": "/GPU:0"})
        >>> dict(p.order)
        {'/GPU:0': ('a', 'c'), '/GPU:1': ('b',)}
        """
        seq = list(order) if order is not None else graph.topological_order()
        per: dict[str, list[str]] = {}
        for op in seq:
            try:
                d = placement[op]
            except KeyError:
                raise InvalidPlanError([f"op {op!r} is not placed"]) from None
            per.setdefault(d, []).append(op)
        return cls(placement, per, **kw)

    def summary(self, seconds: float | None = None) -> str:
        """One line: placer, status, step, bound and gap, the speed-up over
        one device (``log.one_device``: the ``single`` heuristic's step, when made), ops per
        device and ``seconds`` (default ``wall_time``; the CLI passes the
        whole solve's time, which a micro-batch search's winner does not hold).

        >>> Plan({"a": "/GPU:0"}, {"/GPU:0": ["a"]}, makespan=1500.0, wall_time=0.5).summary(2.0)
        "plan [heuristic]: step 1.500 ms, ops per device {'/GPU:0': 1}, 2.00 s"
        """
        ms = "?" if self.makespan is None else f"{self.makespan / 1000:.3f} ms"
        lb = "" if self.lower_bound is None else f", bound {self.lower_bound / 1000:.3f} ms, gap {percent(self.gap or 0)}"
        single = self.log.one_device if self.log is not None else None
        if single and self.makespan:
            lb += f", {single / self.makespan:.2f}x one device"
        counts = {d: len(o) for d, o in self.order.items()}
        took = self.wall_time if seconds is None else seconds
        return f"{self.placer or 'plan'} [{self.status}]: step {ms}{lb}, ops per device {counts}, {took:.2f} s"

    def __str__(self):
        return self.summary()

    # -- JSON ------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "format": FORMAT, "version": VERSION, "placer": self.placer, "status": self.status,
            "placement": dict(self.placement), "order": {d: list(o) for d, o in self.order.items()},
            "start": None if self.start is None else dict(self.start),
            "finish": None if self.finish is None else dict(self.finish),
            "transfers": None if self.transfers is None else [t.__dict__ for t in self.transfers],
            "makespan": self.makespan, "lower_bound": self.lower_bound, "wall_time": self.wall_time,
            "peak_memory": None if self.peak_memory is None else dict(self.peak_memory),
            "stats": _jsonable(self.stats),
            "info": [_jsonable(o.to_dict()) for o in self.info],
            "log": None if self.log is None else _jsonable(self.log.to_dict()),
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> "Plan":
        _check_header(d, FORMAT, VERSION)
        _check_fields(d)
        try:
            transfers = d.get("transfers")
            return cls(placement=_field(d, "placement"), order=_field(d, "order"),
                       start=d.get("start"), finish=d.get("finish"),
                       transfers=None if transfers is None else tuple(Transfer(**t) for t in transfers),
                       makespan=d.get("makespan"), lower_bound=d.get("lower_bound"),
                       status=d.get("status", "unknown"), placer=d.get("placer", ""),
                       wall_time=d.get("wall_time", 0.0), peak_memory=d.get("peak_memory"),
                       stats=d.get("stats") or {},
                       log=None if d.get("log") is None else SolveLog.from_dict(d["log"]),
                       info=_outcomes(d.get("info")))
        except (TypeError, ValueError) as exc:
            raise SchemaError(f"{FORMAT}: malformed plan ({exc})") from None

    def to_json(self, path=None, indent=None):
        """JSON text, or write it to ``path`` (gzip-compressed if it ends in
        ``.gz``; atomically: :func:`pesto.jsonio.write`)."""
        text = json.dumps(self.to_dict(), indent=indent)
        if path is None:
            return text
        _write_document(path, text)
        return None

    @classmethod
    def from_json(cls, source) -> "Plan":
        return cls.from_dict(_load_json(source))


def _outcomes(items) -> tuple:
    """The typed outcomes of a plan file (kinds this version does not know are left out)."""
    if items is None:
        return ()
    if not isinstance(items, list) or not all(isinstance(x, Mapping) for x in items):
        raise SchemaError(f"{FORMAT}: field 'info' must be a list of objects, got {items!r}")
    return tuple(o for o in map(outcome_from_dict, items) if o is not None)


def _check_fields(d: Mapping) -> None:
    """Raise SchemaError naming the first field of a plan document of the wrong type."""
    def bad(field, want, got):
        raise SchemaError(f"{FORMAT}: field {field!r} must be {want}, got {got!r}")

    for key in ("placement", "order"):
        if not isinstance(_field(d, key), Mapping):
            bad(key, "an object", type(d[key]).__name__)
    for op, dev in d["placement"].items():
        if not isinstance(dev, str):
            bad(f"placement[{op!r}]", "a device name (a string)", dev)
    if (d.get("start") is None) != (d.get("finish") is None):
        given, other = ("start", "finish") if d.get("start") is not None else ("finish", "start")
        bad(other, f"an object like {given!r} (a plan has both op start and finish times, or neither)",
            d.get(other))
    _check_transfers(d.get("transfers"), bad)
    for dev, seq in d["order"].items():
        if not isinstance(seq, (list, tuple)) or not all(isinstance(o, str) for o in seq):
            bad(f"order[{dev!r}]", "a list of op names", seq)
    for key in ("start", "finish", "peak_memory"):
        v = d.get(key)
        if v is None:
            continue
        if not isinstance(v, Mapping):
            bad(key, "an object", type(v).__name__)
        for name, x in v.items():
            if not _finite(x):
                bad(f"{key}[{name!r}]", "a finite number", x)
    for key in ("makespan", "lower_bound", "wall_time"):
        if d.get(key) is not None and not _finite(d[key]):
            bad(key, "a finite number", d[key])


def _check_transfers(transfers, bad) -> None:
    """``transfers``: null or a list of objects with a tensor name, two device
    names and finite start and finish times."""
    if transfers is None:
        return
    if not isinstance(transfers, list):
        bad("transfers", "a list", type(transfers).__name__)
    fields = {"tensor": str, "src": str, "dst": str}
    for k, t in enumerate(transfers):
        if not isinstance(t, Mapping) or set(t) != {"tensor", "src", "dst", "start", "finish"}:
            bad(f"transfers[{k}]", "an object with tensor, src, dst, start and finish", t)
        for key, typ in fields.items():
            if not isinstance(t[key], typ):
                bad(f"transfers[{k}].{key}", "a string", t[key])
        for key in ("start", "finish"):
            if not _finite(t[key]):
                bad(f"transfers[{k}].{key}", "a finite number", t[key])


def _jsonable(x):
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    try:
        return float(x)
    except (TypeError, ValueError):
        return str(x)


# -- checker -----------------------------------------------------------------------
@dataclass
class Report:
    """What :func:`check_plan` found. ``ok`` is true when nothing is violated.

    ``str(report)`` lists the violations one a line; ``to_json`` /
    ``from_json`` make it parseable.
    """

    violations: list

    @property
    def ok(self) -> bool:
        return not self.violations

    def __bool__(self):
        return self.ok

    def __str__(self):
        if self.ok:
            return "plan is valid"
        return "\n".join(self.violations)

    def raise_if_invalid(self):
        if self.violations:
            raise InvalidPlanError(self.violations)

    def to_dict(self) -> dict:
        return {"format": "pesto.report", "version": 1, "ok": self.ok, "violations": list(self.violations)}

    def to_json(self, indent=None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, source) -> "Report":
        d = _load_json(source)
        _check_header(d, "pesto.report", 1)
        return cls(list(_field(d, "violations")))


def solved_parts(graph, plan, who: str = "check_plan") -> tuple:
    """``(graph, plan)``: a solve's result (``pesto.solve_step``'s ``Solved``,
    anything with a ``graph`` and a ``plan``) given as ``graph`` with no
    ``plan`` is unpacked into the graph it places and its plan.

    Raises
    ------
    TypeError
        No plan given and ``graph`` is not such a result.
    """
    if plan is None:
        if isinstance(getattr(graph, "plan", None), Plan) and isinstance(getattr(graph, "graph", None), OpGraph):
            return graph.graph, graph.plan
        raise TypeError(f"{who}: give a plan, or a solve's result (pesto.solve_step) in place of the graph")
    return graph, plan


def _as_objects(graph, cluster, plan) -> tuple[OpGraph, Cluster, "Plan"]:
    """``check_plan``'s arguments as objects, accepting what ``pesto.solve``
    accepts: a graph or plan as a JSON path, a cluster as a preset name or
    JSON path, a solve's result in place of the graph (:func:`solved_parts`);
    anything else raises ``TypeError`` naming the argument."""
    graph, plan = solved_parts(graph, plan)
    if isinstance(graph, (str, os.PathLike)):
        graph = OpGraph.from_json(os.fspath(graph))
    if isinstance(cluster, (str, os.PathLike)):
        cluster = preset(os.fspath(cluster))
    if isinstance(plan, (str, os.PathLike)):
        plan = Plan.from_json(os.fspath(plan))
    for name, value, cls in (("graph", graph, OpGraph), ("cluster", cluster, Cluster), ("plan", plan, Plan)):
        if not isinstance(value, cls):
            raise TypeError(f"check_plan: {name} must be a {cls.__name__} or a path, got {type(value).__name__}")
    return graph, cluster, plan


def percent(x: float) -> str:
    """A ratio as a percentage that is never shown as 0 unless it is 0
    (``0.0001`` is ``'0.01%'``, not ``'0.0%'``)."""
    return f"{100 * x:.1f}%" if x == 0 or abs(x) >= 0.001 else f"{100 * x:.2g}%"


def check_plan(graph: OpGraph, cluster: Cluster, plan: Plan | None = None, *, check_memory: bool = True,
               tol: float = EPS) -> Report:
    """Verify ``plan`` for ``graph`` on ``cluster``; list every violation.
    ``check_plan(solved, cluster)`` checks a solve's result
    (:func:`pesto.solve_step`) against the graph it places.

    Checks placement (every op on an existing device that allows its kind, no
    unknown op), colocation groups not split, per-device order (each device's
    list is exactly its ops, and together with the DAG's edges it closes no
    cycle). With times: each op lasts its compute time on its device, starts
    after its inputs arrive (remote inputs through a transfer of the right
    tensor that starts after the producer ends and lasts at least the route's
    time; zero-byte tensors and control edges need no transfer), ops on one
    device do not overlap and follow the order, transfers on one link do not
    overlap (unless the cluster is contention free), the makespan is the last
    op or transfer end, and peak memory (:func:`memory_profile`) stays within
    capacity. Without times, memory is checked with the static bound.

    Examples
    --------
    >>> from pesto.graph import OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph.from_edges({"a": 1, "b": 1}, [("a", "b", 8)])
    >>> p = Plan({"a": "/GPU:0", "b": "/GPU:0"}, {"/GPU:0": ["b", "a"]})
    >>> print(check_plan(g, gpus(2), p))
    order on /GPU:0 contradicts the graph: cycle a -> b -> a
    >>> check_plan(g, gpus(2), Plan.from_placement(g, {"a": "/GPU:0", "b": "/GPU:1"})).ok
    True
    """
    graph, cluster, plan = _as_objects(graph, cluster, plan)
    v: list[str] = []
    pl = plan.placement
    ops = graph.ops
    for name in pl:
        if name not in graph:
            v.append(f"plan places unknown op {name!r}")
    for op in ops:
        d = pl.get(op.name)
        if d is None:
            v.append(f"op {op.name!r} is not placed")
        elif d not in cluster.index:
            v.append(f"op {op.name!r} is placed on unknown device {d!r} (cluster has {cluster.names})")
        elif cluster.device(d).kind not in op.kinds:
            v.append(f"op {op.name!r} is placed on {d} of kind {cluster.device(d).kind}, allowed {sorted(op.kinds)}")
    if v:
        return Report(v)
    for group, members in graph.colocation_groups().items():
        devs = sorted({pl[m] for m in members})
        if len(devs) > 1:
            v.append(f"colocation group {group!r} is split over {devs}: "
                     + ", ".join(f"{m}@{pl[m]}" for m in members[:6]))
    # order: exactly the ops of each device, and acyclic together with the DAG
    seen: dict[str, str] = {}
    for d, seq in plan.order.items():
        if d not in cluster.index:
            v.append(f"order names unknown device {d!r}")
        for name in seq:
            if name in seen:
                v.append(f"op {name!r} appears twice in the order ({seen[name]} and {d})")
            seen[name] = d
            if name not in graph:
                v.append(f"order on {d} names unknown op {name!r}")
            elif pl[name] != d:
                v.append(f"op {name!r} is ordered on {d} but placed on {pl[name]}")
    for op in ops:
        if op.name not in seen:
            v.append(f"op {op.name!r} is missing from the order of {pl[op.name]}")
    if v:
        return Report(v)
    cyc = _order_cycle(graph, plan.order)
    if cyc:
        v.append(f"order on {pl[cyc[0]]} contradicts the graph: cycle {' -> '.join(cyc)} -> {cyc[0]}")
    peak = None
    if plan.has_times:
        tv = _check_times(graph, cluster, plan, tol)
        v.extend(tv)
        complete = all(op.name in plan.start and op.name in plan.finish for op in ops)
        if check_memory and complete:
            peak = memory_profile(graph, cluster, pl, plan.start, plan.finish, plan.transfers)
        if plan.makespan is not None and complete:
            end = max(plan.finish.values(), default=0.0)
            end = max([end] + [t.finish for t in plan.transfers or ()])
            if not abs(end - plan.makespan) <= tol * max(1.0, end) + tol:
                v.append(f"makespan {plan.makespan} differs from the last finish time {end}")
    elif check_memory:
        peak = memory_profile(graph, cluster, pl)
    if plan.makespan is not None and plan.lower_bound is not None \
            and plan.lower_bound > plan.makespan + tol * max(1.0, plan.makespan) + tol:
        v.append(f"lower bound {plan.lower_bound} exceeds the makespan {plan.makespan}: "
                 "no plan can beat its own lower bound")
    if peak is not None:
        for d in cluster.devices:
            if peak[d.name] > d.memory:
                v.append(f"memory on {d.name}: peak {fmt_bytes(peak[d.name])} > capacity {fmt_bytes(d.memory)} "
                         f"({fmt_bytes(peak[d.name] - d.memory)} over)")
    return Report(v)


def _order_cycle(graph: OpGraph, order: Mapping[str, tuple]) -> list[str] | None:
    """A cycle in DAG edges + consecutive-order edges, or None."""
    idx = graph.index
    succ = [list(s) for s in graph.succ_idx()]
    for seq in order.values():
        for a, b in zip(seq, seq[1:]):
            succ[idx[a]].append(idx[b])
    try:
        toposort(succ)
    except CycleError as exc:
        return [graph.names[k] for k in exc.cycle]
    return None


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check_times(graph: OpGraph, cluster: Cluster, plan: Plan, tol: float) -> list[str]:
    v = []
    pl, st, fi = plan.placement, plan.start, plan.finish
    for op in graph.ops:
        if op.name not in st or op.name not in fi:
            v.append(f"op {op.name!r} has no start/finish time")
        elif not (_finite(st[op.name]) and _finite(fi[op.name])):
            v.append(f"op {op.name!r} has a non-finite time [{st[op.name]!r}, {fi[op.name]!r}]")
    if v:
        return v
    for op in graph.ops:
        dev = cluster.device(pl[op.name])
        need = op.time_on(dev.kind, dev.speed)
        got = fi[op.name] - st[op.name]
        if st[op.name] < -tol or abs(got - need) > tol * max(1.0, need) + tol:
            v.append(f"op {op.name!r} runs {got:g} µs from {st[op.name]:g}, needs {need:g} µs on {dev.name}")
    # transfers by (tensor, dst)
    xfer: dict[tuple, Transfer] = {}
    good: list[Transfer] = []
    for t in plan.transfers or ():
        if t.src not in cluster.index or t.dst not in cluster.index:
            v.append(f"transfer of {t.tensor!r} names unknown device ({t.src} -> {t.dst})")
            continue
        if not (_finite(t.start) and _finite(t.finish)) or t.finish < t.start:
            v.append(f"transfer of {t.tensor!r} {t.src}->{t.dst} has bad times [{t.start!r}, {t.finish!r}]")
            continue
        if (t.tensor, t.dst) in xfer:
            v.append(f"tensor {t.tensor!r} is sent to {t.dst} twice")
        xfer[(t.tensor, t.dst)] = t
        if not graph.has_tensor(t.tensor):
            v.append(f"transfer of unknown tensor {t.tensor!r}")
            continue
        tensor = graph.tensor(t.tensor)
        if pl[tensor.src] != t.src:
            v.append(f"tensor {t.tensor!r} is sent from {t.src} but produced on {pl[tensor.src]}")
        if t.src == t.dst:
            v.append(f"tensor {t.tensor!r} is sent from {t.src} to itself")
            continue
        good.append(t)
        if t.start < fi[tensor.src] - tol:
            v.append(f"tensor {t.tensor!r} leaves {t.src} at {t.start:g} before {tensor.src!r} ends at {fi[tensor.src]:g}")
        need = cluster.transfer_time(t.src, t.dst, tensor.bytes)
        if t.finish - t.start < need - tol * max(1.0, need) - tol:
            v.append(f"transfer of {t.tensor!r} {t.src}->{t.dst} takes {t.finish - t.start:g} µs, needs {need:g}")
    for e in graph.edges:
        a, b = pl[e.src], pl[e.dst]
        ready = fi[e.src]
        if a != b:
            for tname in e.tensors:
                if graph.tensor(tname).bytes == 0:
                    continue  # nothing to move: available when the producer ends
                t = xfer.get((tname, b))
                if t is None:
                    v.append(f"tensor {tname!r} needed by {e.dst!r} on {b} is never sent there")
                else:
                    ready = max(ready, t.finish)
        if st[e.dst] < ready - tol:
            v.append(f"op {e.dst!r} starts at {st[e.dst]:g} before its input from {e.src!r} is ready at {ready:g}")
    for d, seq in plan.order.items():
        for a, b in zip(seq, seq[1:]):
            if st[b] < fi[a] - tol:
                v.append(f"ops {a!r} and {b!r} overlap on {d} (or break its order)")
    if not cluster.contention_free and good:
        per_link: dict[str, list] = {}
        for t in good:
            for link in cluster.route(t.src, t.dst).links:
                per_link.setdefault(link, []).append(t)
        for link, ts in per_link.items():
            ts.sort(key=lambda t: (t.start, t.finish))
            busy = ts[0]  # the transfer holding the link longest so far
            for y in ts[1:]:
                if y.start < busy.finish - tol and y.finish > y.start + tol:
                    v.append(f"transfers of {busy.tensor!r} ({busy.src}->{busy.dst}) and {y.tensor!r} "
                             f"({y.src}->{y.dst}) overlap on link {link}")
                if y.finish > busy.finish:
                    busy = y
    return v
