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
* **Memory**: the same static bound as the CP-SAT model (persistent + output
  bytes, received tensors, largest temporary) per device.
* Objective: minimise the makespan ``C >= S_v + p_v``; ``M`` is the sum of all
  op and transfer times (no left-shifted schedule is longer).

The model has O(n^2) binaries: it is the reference for small graphs, not the
production solver.
"""
from __future__ import annotations

import time

from ortools.linear_solver import pywraplp

from pesto.cluster import Cluster
from pesto.errors import InvalidClusterError
from pesto.graph import OpGraph
from pesto.plan import Plan, check_plan
from pesto.simulate import simulate

from pesto.memory import check_feasible, static_bytes

from .bounds import durations, greedy_plan, lower_bound
from .common import finalize, order_by_key

__all__ = ["place_mip"]


def _solver(name: str | None):
    for n in ([name] if name else ["SCIP", "CBC", "HIGHS"]):
        s = pywraplp.Solver.CreateSolver(n)
        if s is not None:
            return s, n
    raise RuntimeError("no OR-Tools MIP solver available (tried SCIP, CBC, HiGHS)")


def place_mip(graph: OpGraph, cluster: Cluster, *, time_limit: float = 60, workers: int | None = None,
              seed: int = 0, hint: Plan | None = None, backend: str | None = None, **_ignored) -> Plan:
    """Solve the paper's big-M ILP for a 2-device cluster.

    Parameters
    ----------
    graph, cluster : exactly two devices
    time_limit : float
    workers : int, optional
        Threads, where the backend supports them.
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
    n = graph.num_ops
    ops, names = graph.ops, graph.names
    devs = cluster.devices
    dur = durations(graph, cluster)
    lb = lower_bound(graph, cluster, dur)
    index = graph.index
    inf = s.infinity()

    # tensors to send: (name, producer, bytes, consumers)
    cons = graph.consumers()
    group = [op.colocation_group for op in ops]
    # Tensors of one producer with the same consumers travel together: one comm
    # vertex for the bundle, lasting as long as its tensors sent back to back.
    # (A coarse graph's vertex often sends hundreds of fine tensors; one vertex
    # each made the pairwise link disjunctions explode.)
    bundles: dict[tuple, list] = {}
    for t in graph.tensors:
        u = index[t.src]
        cs = sorted({index[c] for c in cons[t.name]} - {u})
        cs = [c for c in cs if group[c] is None or group[c] != group[u]]
        if t.bytes > 0 and cs:
            bundles.setdefault((u, tuple(cs)), []).append(t)
    tensors, tau = [], {}
    for (u, cs), ts in bundles.items():
        name = ts[0].name if len(ts) == 1 else f"{ts[0].name}+{len(ts) - 1}"
        tensors.append((name, u, sum(t.bytes for t in ts), list(cs)))
        tau[name] = tuple(sum(cluster.transfer_time(devs[a].name, devs[1 - a].name, t.bytes) for t in ts)
                          for a in (0, 1))
    M = sum(max(d.values()) for d in dur) + sum(max(tau[nm]) for nm, *_ in tensors) + 1.0
    M = max(M, 1.0)

    x = []
    for i in range(n):
        al = dur[i]
        lo, hi = (0, 1) if len(al) == 2 else ((1, 1) if 1 in al else (0, 0))
        x.append(s.IntVar(lo, hi, f"x{i}"))
    first: dict[str, int] = {}
    for i, gname in enumerate(group):
        if gname is not None:
            if gname in first:
                s.Add(x[i] == x[first[gname]])
            else:
                first[gname] = i

    def p(i):
        d = dur[i]
        p0, p1 = d.get(0, d.get(1)), d.get(1, d.get(0))
        return p0 + (p1 - p0) * x[i]

    S = [s.NumVar(0, M, f"S{i}") for i in range(n)]
    C = s.NumVar(lb, M, "C")
    for i in range(n):
        s.Add(C >= S[i] + p(i))
    succ = graph.succ_idx()
    for u in range(n):
        for c in succ[u]:
            s.Add(S[c] >= S[u] + p(u))

    # comm vertices
    T, Y = {}, {}
    for name, u, b, cs in tensors:
        T[name] = s.NumVar(0, M, f"T{name}")
        Y[name] = s.NumVar(0, 1, f"y{name}")
        s.Add(T[name] >= S[u] + p(u))
        t01, t10 = tau[name]
        for c in cs:
            w = s.NumVar(0, 1, f"w{name}_{c}")
            s.Add(w >= x[c] - x[u])
            s.Add(w >= x[u] - x[c])
            s.Add(Y[name] >= w)
            # (not S_c >= T + tau * w: with w = 0 that would still tie a local
            # consumer to the transfer's start)
            if abs(t01 - t10) < 1e-12:
                s.Add(S[c] >= T[name] + t01 - M * (1 - w))
            else:
                s.Add(S[c] >= T[name] + t01 - M * (1 - w) - M * x[u])
                s.Add(S[c] >= T[name] + t10 - M * (1 - w) - M * (1 - x[u]))

    def xor_upper(a, b, label):
        d = s.NumVar(0, 1, label)
        s.Add(d <= x[a] + x[b])
        s.Add(d <= 2 - x[a] - x[b])
        return d

    # device non-overlap for pairs not ordered by the DAG
    reach = [0] * n
    for i in reversed(graph.topo_idx()):
        r = 0
        for j in succ[i]:
            r |= reach[j] | (1 << j)
        reach[i] = r
    pairs = 0
    for u in range(n):
        for v in range(u + 1, n):
            if (reach[u] >> v) & 1 or (reach[v] >> u) & 1:
                continue
            if len(dur[u]) == 1 and len(dur[v]) == 1 and set(dur[u]) != set(dur[v]):
                continue
            o = s.IntVar(0, 1, f"o{u}_{v}")
            same_group = group[u] is not None and group[u] == group[v]
            d = 0 if same_group else xor_upper(u, v, f"d{u}_{v}")
            s.Add(S[u] + p(u) <= S[v] + M * (1 - o) + M * d)
            s.Add(S[v] + p(v) <= S[u] + M * o + M * d)
            pairs += 1

    # link non-overlap
    link_pairs = 0
    if not cluster.contention_free and tensors:
        l01 = set(cluster.route(devs[0].name, devs[1].name).links)
        l10 = set(cluster.route(devs[1].name, devs[0].name).links)
        shared = bool(l01 & l10)
        if l01 or l10:
            for a in range(len(tensors)):
                na, ua, _, _ = tensors[a]
                for b in range(a + 1, len(tensors)):
                    nb, ub, _, _ = tensors[b]
                    q = s.IntVar(0, 1, f"q{a}_{b}")
                    same = ua == ub or (group[ua] is not None and group[ua] == group[ub])
                    e = 0 if (shared or same) else xor_upper(ua, ub, f"e{a}_{b}")
                    ta = tau[na][0] + (tau[na][1] - tau[na][0]) * x[ua]
                    tb = tau[nb][0] + (tau[nb][1] - tau[nb][0]) * x[ub]
                    off = M * (2 - Y[na] - Y[nb]) + M * e
                    s.Add(T[na] + ta <= T[nb] + M * (1 - q) + off)
                    s.Add(T[nb] + tb <= T[na] + M * q + off)
                    link_pairs += 1

    # memory (static, as in the CP-SAT model)
    recv_total = sum(b for _, _, b, _ in tensors)
    total = sum(static_bytes(op) for op in ops) + recv_total + max((op.temporary_bytes for op in ops), default=0)
    memory_active = total > min(d.memory for d in devs)
    if memory_active:
        for k in (0, 1):
            on = [(1 - x[i]) if k == 0 else x[i] for i in range(n)]
            expr = sum(static_bytes(ops[i]) * on[i] for i in range(n))
            for name, u, b, cs in tensors:
                r = s.NumVar(0, 1, f"r{k}{name}")
                s.Add(r >= Y[name] - on[u])  # sent and producer elsewhere: received here
                expr = expr + b * r
            temps = [(ops[i].temporary_bytes, on[i]) for i in range(n) if ops[i].temporary_bytes]
            if temps:
                tm = s.NumVar(0, max(t for t, _ in temps), f"tmax{k}")
                for t, o in temps:
                    s.Add(tm >= t * o)
                expr = expr + tm
            s.Add(expr <= devs[k].memory)

    s.Minimize(C)
    s.SetTimeLimit(int(max(0.001, time_limit) * 1000))
    if workers:
        s.SetNumThreads(int(workers))
    if hint is not None and set(hint.placement) == set(names):
        s.SetHint(x, [1.0 if hint.placement[nm] == devs[1].name else 0.0 for nm in names])
    params = pywraplp.MPSolverParameters()
    params.SetDoubleParam(params.RELATIVE_MIP_GAP, 1e-9)
    code = s.Solve(params)
    stats = {"mip_backend": sname, "mip_status": code, "big_m": M, "device_pairs": pairs, "link_pairs": link_pairs,
             "num_variables": s.NumVariables(), "num_constraints": s.NumConstraints(),
             "explicit_lower_bound": lb, "memory_constraints": memory_active}
    if code in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        status = "optimal" if code == pywraplp.Solver.OPTIMAL else "feasible"
        try:
            bound = s.Objective().BestBound()
        except Exception:  # pragma: no cover - backend without a bound
            bound = lb
        obj = s.Objective().Value()
        if status == "optimal":
            bound = max(bound, obj - 1e-6 * max(1.0, obj))  # SCIP's bound within its tolerance
        placement = {names[i]: devs[1 if x[i].solution_value() > 0.5 else 0].name for i in range(n)}
        # SCIP's start times meet precedence only within its tolerance: take them
        # in a topological order so a sub-µs op never lands before its producer
        order = order_by_key(graph, [S[i].solution_value() for i in range(n)])
        stats.update(model_makespan=obj, best_bound=bound)
        plan = finalize(graph, cluster, placement, order=order, placer="mip", t0=t0, status=status,
                        lower_bound=max(lb, min(bound, obj)), stats=stats)
        if plan.status != "infeasible" and plan.makespan > obj + 1e-6 * max(1.0, obj):
            plan = plan.replace(status="feasible", stats={**plan.stats, "simulated_above_model": True})
        return plan
    base = hint if hint is not None else greedy_plan(graph, cluster)
    if not base.has_times:
        base = simulate(graph, cluster, base).to_plan(placer=base.placer)
    stats["fallback"] = "model proved infeasible" if code == pywraplp.Solver.INFEASIBLE else \
        "no solution within the time limit"
    return base.replace(placer="mip", status="infeasible" if code == pywraplp.Solver.INFEASIBLE else base.status,
                        lower_bound=lb, wall_time=time.perf_counter() - t0, stats={**dict(base.stats), **stats})
