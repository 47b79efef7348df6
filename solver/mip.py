"""The Pesto paper's 0-1 ILP for two devices (reference solver).

A big-M disjunctive mixed-integer program on OR-Tools' ``pywraplp`` (SCIP by
default; CBC or HiGHS if SCIP is missing), faithful to the paper's description:

* **Augmented graph.** Every tensor with bytes > 0 becomes a communication
  vertex between its producer and its consumers, with start ``T_t``, active
  (``y_t = 1``) when some consumer is on the other device. (The paper puts one
  comm vertex per edge; here it is one per tensor, because TensorFlow sends a
  tensor once per destination device. With two devices that is exactly one per
  (tensor, destination).)
* **Placement.** One binary ``x_v`` per op (1 = device 1), fixed when the op's
  kind allows one device only; colocation equalities ``x_u = x_v``. The
  duration is linear in ``x_v``: ``p_v = p_v0 + (p_v1 - p_v0) x_v``.
* **XOR for transfers.** ``w_tc >= |x_c - x_u|`` linearised (two inequalities);
  ``S_c >= T_t + tau - M (1 - w_tc)`` (two big-M forms when the two
  directions cost differently), ``T_t >= S_u + p_u``, ``y_t >= w_tc``.
* **Device non-overlap.** For every pair of ops not ordered by the DAG, an
  order binary ``o`` and ``d <= XOR(x_u, x_v)`` (``d <= x_u + x_v``,
  ``d <= 2 - x_u - x_v``): ``S_u + p_u <= S_v + M (1 - o) + M d`` and
  ``S_v + p_v <= S_u + M o + M d``.
* **Link non-overlap** (unless contention free): for every pair of comm
  vertices, an order binary and ``e <= XOR`` of their producers' placements
  (dropped when both directions share a link), relaxed by ``M (2 - y_1 - y_2)``
  when either is inactive.
* **Memory**: the same static bound as the CP-SAT model (persistent + allocated output
  bytes, received tensors, largest temporary) per device.
* Objective: minimise the makespan ``C >= S_v + p_v``; ``M`` is the sum of all
  op and transfer times (no left-shifted schedule is longer).

The model has O(n^2) binaries: it is the reference for small graphs, not the
production solver.

Code: :class:`PaperMip` builds the program in pieces from the problem arrays
(:meth:`pesto.problem.Problem.of`); :func:`place_mip` solves it and reads the
placement and a start order (:func:`solver.common.order_by_key`).
"""
from __future__ import annotations

import dataclasses
import time

from ortools.linear_solver import pywraplp

from pesto.cluster import Cluster
from pesto.dag import reachability
from pesto.errors import InvalidClusterError
from pesto.finalize import finalize
from pesto.graph import OpGraph
from pesto.memory import check_feasible, static_bytes
from pesto.outcome import MipInfo
from pesto.plan import Plan, check_plan
from pesto.problem import Problem
from pesto.simulate import simulate

from .bounds import greedy_plan, lower_bound
from .common import order_by_key

__all__ = ["place_mip", "PaperMip"]

INF = float("inf")
BACKENDS = ("SCIP", "CBC", "HIGHS")


def _solver(name: str | None):
    for n in ([name] if name else BACKENDS):
        s = pywraplp.Solver.CreateSolver(n)
        if s is not None:
            return s, n
    raise RuntimeError(f"no OR-Tools MIP solver available (tried {', '.join([name] if name else BACKENDS)})")


def comm_bundles(problem: Problem) -> tuple[list, dict]:
    """Communication vertices: tensors of one producer with the same remote
    consumers travel together, as one vertex lasting as long as its tensors
    sent back to back. (A coarse graph's vertex often sends hundreds of fine
    tensors; one vertex each made the pairwise link disjunctions explode.)

    Returns ``(name, producer, bytes, consumers)`` per bundle and, per bundle
    name, its transfer time from device 0 to 1 and from 1 to 0.
    """
    p = problem
    bundles: dict[tuple, list] = {}
    for name, u, b, cons in p.tensors:
        cs = [c for c in sorted(set(cons) - {u}) if p.unit[c] != p.unit[u]]  # colocated: never remote
        if b > 0 and cs:
            bundles.setdefault((u, tuple(cs)), []).append((name, b))
    tensors, tau = [], {}
    for (u, cs), ts in bundles.items():
        name = ts[0][0] if len(ts) == 1 else f"{ts[0][0]}+{len(ts) - 1}"
        tensors.append((name, u, sum(b for _, b in ts), list(cs)))
        tau[name] = tuple(sum(p.comm(a, 1 - a, b) for _, b in ts) for a in (0, 1))
    return tensors, tau


class PaperMip:
    """The paper's big-M program of a 2-device (graph, cluster) on ``solver``.

    Attributes: ``x`` (device of each op), ``S`` (starts), ``C`` (makespan),
    ``T``/``Y`` (comm vertex start / active), ``M``, and the counts
    ``device_pairs``, ``link_pairs``, ``memory_active``.
    """

    def __init__(self, solver, graph: OpGraph, cluster: Cluster):
        self.s, self.p = solver, Problem.of(graph, cluster)
        p = self.p
        self.own = [[d for d in (0, 1) if p.dur[i][d] != INF] for i in range(p.n)]  # the op's own kinds
        self.lb = lower_bound(graph, cluster)
        self.tensors, self.tau = comm_bundles(p)
        self.M = max(1.0, sum(max(p.dur[i][d] for d in self.own[i]) for i in range(p.n))
                     + sum(max(self.tau[nm]) for nm, *_ in self.tensors) + 1.0)
        self._placement()
        self._ops()
        self._comm_vertices()
        self.device_pairs = self._device_pairs()
        self.link_pairs = self._link_pairs()
        self.memory_active = self._memory()
        solver.Minimize(self.C)

    def duration(self, i: int):
        """Compute time of op ``i``, linear in its placement binary."""
        d = self.p.dur[i]
        p0, p1 = (d[0], d[1]) if len(self.own[i]) == 2 else (d[self.own[i][0]],) * 2
        return p0 + (p1 - p0) * self.x[i]

    def _placement(self) -> None:
        """``x_v`` (1 = device 1), fixed for a one-device op; colocation equalities."""
        s, p = self.s, self.p
        self.x = []
        for i in range(p.n):
            lo, hi = (0, 1) if len(self.own[i]) == 2 else (self.own[i][0],) * 2
            self.x.append(s.IntVar(lo, hi, f"x{i}"))
        for i in range(p.n):
            first = p.members[p.unit[i]][0]  # members are in index order
            if first != i:
                s.Add(self.x[i] == self.x[first])

    def _ops(self) -> None:
        s, p = self.s, self.p
        self.S = [s.NumVar(0, self.M, f"S{i}") for i in range(p.n)]
        self.C = s.NumVar(self.lb, self.M, "C")
        for i in range(p.n):
            s.Add(self.C >= self.S[i] + self.duration(i))
        for u in range(p.n):
            for c in p.succ[u]:
                s.Add(self.S[c] >= self.S[u] + self.duration(u))

    def _comm_vertices(self) -> None:
        """``T_t >= S_u + p_u``; per consumer ``w >= |x_c - x_u|``, ``y_t >= w``
        and ``S_c >= T_t + tau - M (1 - w)`` (per direction when they differ)."""
        s, x, S, M = self.s, self.x, self.S, self.M
        self.T, self.Y = {}, {}
        for name, u, b, cs in self.tensors:
            T = self.T[name] = s.NumVar(0, M, f"T{name}")
            Y = self.Y[name] = s.NumVar(0, 1, f"y{name}")
            s.Add(T >= S[u] + self.duration(u))
            t01, t10 = self.tau[name]
            for c in cs:
                w = s.NumVar(0, 1, f"w{name}_{c}")
                s.Add(w >= x[c] - x[u])
                s.Add(w >= x[u] - x[c])
                s.Add(Y >= w)
                # (not S_c >= T + tau * w: with w = 0 that would still tie a local
                # consumer to the transfer's start)
                if abs(t01 - t10) < 1e-12:
                    s.Add(S[c] >= T + t01 - M * (1 - w))
                else:
                    s.Add(S[c] >= T + t01 - M * (1 - w) - M * x[u])
                    s.Add(S[c] >= T + t10 - M * (1 - w) - M * (1 - x[u]))

    def _xor_upper(self, a: int, b: int, label: str):
        """A variable that must be 0 when ops ``a`` and ``b`` share a device."""
        s, x = self.s, self.x
        d = s.NumVar(0, 1, label)
        s.Add(d <= x[a] + x[b])
        s.Add(d <= 2 - x[a] - x[b])
        return d

    def _device_pairs(self) -> int:
        """Order binaries for every pair of ops the DAG leaves unordered."""
        s, p, S, M = self.s, self.p, self.S, self.M
        reach = reachability(p.succ, p.topo)
        pairs = 0
        for u in range(p.n):
            for v in range(u + 1, p.n):
                if (reach[u] >> v) & 1 or (reach[v] >> u) & 1:
                    continue
                if len(self.own[u]) == 1 and len(self.own[v]) == 1 and self.own[u] != self.own[v]:
                    continue
                o = s.IntVar(0, 1, f"o{u}_{v}")
                d = 0 if p.unit[u] == p.unit[v] else self._xor_upper(u, v, f"d{u}_{v}")
                s.Add(S[u] + self.duration(u) <= S[v] + M * (1 - o) + M * d)
                s.Add(S[v] + self.duration(v) <= S[u] + M * o + M * d)
                pairs += 1
        return pairs

    def _link_pairs(self) -> int:
        """Order binaries for every pair of comm vertices that may share a link."""
        s, p, x, M, T, Y, tau = self.s, self.p, self.x, self.M, self.T, self.Y, self.tau
        l01, l10 = set(p.links[0][1]), set(p.links[1][0])
        if not self.tensors or not (l01 or l10):
            return 0
        shared = bool(l01 & l10)
        pairs = 0
        for a, (na, ua, _, _) in enumerate(self.tensors):
            for b in range(a + 1, len(self.tensors)):
                nb, ub, _, _ = self.tensors[b]
                q = s.IntVar(0, 1, f"q{a}_{b}")
                e = 0 if (shared or p.unit[ua] == p.unit[ub]) else self._xor_upper(ua, ub, f"e{a}_{b}")
                ta = tau[na][0] + (tau[na][1] - tau[na][0]) * x[ua]
                tb = tau[nb][0] + (tau[nb][1] - tau[nb][0]) * x[ub]
                off = M * (2 - Y[na] - Y[nb]) + M * e
                s.Add(T[na] + ta <= T[nb] + M * (1 - q) + off)
                s.Add(T[nb] + tb <= T[na] + M * q + off)
                pairs += 1
        return pairs

    def _memory(self) -> bool:
        """The static bound of :func:`pesto.memory.static_peak` per device:
        :func:`~pesto.memory.static_bytes` of its ops + the bundles it receives
        + its largest temporary <= capacity; only when it can bind."""
        s, p, x = self.s, self.p, self.x
        ops = p.graph.ops
        held = [static_bytes(op) for op in ops]
        total = sum(held) + sum(b for _, _, b, _ in self.tensors) + max(p.temp, default=0)
        if total <= min(p.cap):
            return False
        for k in (0, 1):
            on = [(1 - x[i]) if k == 0 else x[i] for i in range(p.n)]
            expr = sum(held[i] * on[i] for i in range(p.n))
            for name, u, b, cs in self.tensors:
                r = s.NumVar(0, 1, f"r{k}{name}")
                s.Add(r >= self.Y[name] - on[u])  # sent and producer elsewhere: received here
                expr = expr + b * r
            temps = [(p.temp[i], on[i]) for i in range(p.n) if p.temp[i]]
            if temps:
                tm = s.NumVar(0, max(t for t, _ in temps), f"tmax{k}")
                for t, o in temps:
                    s.Add(tm >= t * o)
                expr = expr + tm
            s.Add(expr <= p.cap[k])
        return True


def place_mip(graph: OpGraph, cluster: Cluster, *, time_limit: float = 60, workers: int | None = None,
              seed: int = 0, hint: Plan | None = None, backend: str | None = None) -> Plan:
    """Solve the paper's big-M ILP for a 2-device cluster.

    Parameters
    ----------
    graph, cluster : exactly two devices
    time_limit : float
    workers : int, optional
        Threads, where the backend supports them.
    seed : int
        SCIP's random seed shift (the other backends have none).
    hint : Plan, optional
        Its placement is passed as a solution hint; also the fallback plan.
    backend : str, optional
        "SCIP" (default), "CBC" or "HIGHS".

    Returns
    -------
    Plan
        Simulated replay of the MIP's placement and order; ``lower_bound`` =
        max(the solver's best bound, explicit bound).

    Raises
    ------
    InvalidClusterError
        The cluster does not have exactly two devices.
    TypeError
        An unknown option.

    Examples
    --------
    >>> from pesto.graph import OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph.from_edges({"a": 2, "b": 3, "c": 4}, [("a", "b", 10), ("a", "c", 10)])
    >>> p = place_mip(g, gpus(2, beta=(1.0, 0.0)), time_limit=10)
    >>> p.status, p.makespan
    ('optimal', 6.0)
    """
    t0 = time.perf_counter()
    if len(cluster.devices) != 2:
        raise InvalidClusterError(f"the paper's MIP handles exactly 2 devices, cluster {cluster.name!r} has "
                                  f"{len(cluster.devices)}; use the 'cpsat' placer")
    check_feasible(graph, cluster)
    if hint is not None and not check_plan(graph, cluster, hint, check_memory=False).ok:
        hint = None  # not a valid plan of this graph: solve without it
    s, sname = _solver(backend)
    mip = PaperMip(s, graph, cluster)
    code = _run(s, sname, mip, time_limit=time_limit, workers=workers, seed=seed, hint=hint)
    info = MipInfo(backend=sname, status_code=code, big_m=mip.M, device_pairs=mip.device_pairs,
                   link_pairs=mip.link_pairs, num_variables=s.NumVariables(), num_constraints=s.NumConstraints(),
                   explicit_lower_bound=mip.lb, memory_constraints=mip.memory_active)
    if code in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        return _read_plan(s, mip, code, info, t0)
    base = hint if hint is not None else greedy_plan(graph, cluster)
    if not base.has_times:
        base = simulate(graph, cluster, base).to_plan(placer=base.placer)
    infeasible = code == pywraplp.Solver.INFEASIBLE
    info = dataclasses.replace(info, fallback="model proved infeasible" if infeasible
                               else "no solution within the time limit")
    return base.replace(placer="mip", status="infeasible" if infeasible else base.status,
                        lower_bound=mip.lb, wall_time=time.perf_counter() - t0, info=base.info + (info,))


def _run(s, sname: str, mip: PaperMip, *, time_limit, workers, seed, hint) -> int:
    """Set the limits, threads, seed and hint; solve; return the status code."""
    p = mip.p
    s.SetTimeLimit(int(max(0.001, time_limit) * 1000))
    if workers:
        s.SetNumThreads(int(workers))
    if seed and sname == "SCIP":
        s.SetSolverSpecificParametersAsString(f"randomization/randomseedshift = {int(seed)}\n")
    if hint is not None and set(hint.placement) == set(p.names):
        s.SetHint(mip.x, [1.0 if hint.placement[nm] == p.dev_names[1] else 0.0 for nm in p.names])
    params = pywraplp.MPSolverParameters()
    params.SetDoubleParam(params.RELATIVE_MIP_GAP, 1e-9)
    return s.Solve(params)


def _read_plan(s, mip: PaperMip, code: int, info: MipInfo, t0: float) -> Plan:
    """The simulated replay of the MIP's placement, ops in start order."""
    p = mip.p
    status = "optimal" if code == pywraplp.Solver.OPTIMAL else "feasible"
    try:
        bound = s.Objective().BestBound()
    except Exception:  # pragma: no cover - backend without a bound
        bound = mip.lb
    obj = s.Objective().Value()
    if status == "optimal":
        bound = max(bound, obj - 1e-6 * max(1.0, obj))  # SCIP's bound within its tolerance
    placement = {nm: p.dev_names[1 if mip.x[i].solution_value() > 0.5 else 0] for i, nm in enumerate(p.names)}
    # SCIP's start times meet precedence only within its tolerance: take them
    # in a topological order so a sub-µs op never lands before its producer
    order = order_by_key(p.graph, [S.solution_value() for S in mip.S])
    info = dataclasses.replace(info, model_makespan=obj, best_bound=bound)
    plan = finalize(p.graph, p.cluster, placement, order=order, placer="mip", t0=t0, status=status,
                    lower_bound=max(mip.lb, min(bound, obj)))
    if plan.status != "infeasible" and plan.makespan > obj + 1e-6 * max(1.0, obj):
        info = dataclasses.replace(info, simulated_above_model=True)
        plan = plan.replace(status="feasible")
    return plan.replace(info=plan.info + (info,))
