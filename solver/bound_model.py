"""A communication-aware makespan lower bound on the fine graph.

:func:`comm_bound` returns the best of five valid bounds, each a relaxation
of the exact problem (so never above its optimum), and says which one won:

1. :func:`solver.bounds.lower_bound`: critical path / work per device;
2. :func:`solver.bounds.chain_bound`: phases along the critical path, each
   at least its path length and its work per device;
3. :func:`solver.bounds.energetic_bound`: energetic reasoning on heads and
   tails (the longer of the longest paths and what the phases prove);
4. :func:`colocation_bound`: an edge whose longest path with its transfer
   exceeds the makespan cannot be split; ops so joined share a device, and
   must fit on it one after another;
5. CP-SAT's proven objective bound on :class:`RelaxedModel` (every op, or the
   ``max_ops`` longest on large graphs) after a short time limit.

The relaxation (5) keeps, of the exact model (:mod:`solver.cpsat_model`):

* placement: one literal per (colocation unit, allowed device), exactly one true;
* compute: per device, a no-overlap of the optional run intervals;
* precedence: ``start[j] >= end[i] + delay[i, j] * apart[i, j]`` per edge, where
  ``apart`` is forced true when the two ends are on different devices and
  ``delay`` is the least time the edge's tensors take between any two of the
  allowed devices (the largest one; their sum when the route's links are
  contended, since they then queue on the same links);
* heads and tails: ``start[i] >= head[i]`` and ``makespan >= end[i] + tail[i]``
  (communication-free longest paths at the fastest devices);
* per link (contended clusters): the transfers that must cross it fit in the
  makespan (an energy sum, not intervals): ``recv[t, b]`` is forced when a
  consumer of tensor ``t`` is on ``b`` and its producer is not.

Dropped: transfer intervals and their start times, the link queue order,
memory. Each kept constraint holds in every schedule the simulator (or the
exact model) can produce, so the relaxation's optimum is at most the true
optimum and CP-SAT's ``best_objective_bound`` (valid when stopped early) is a
lower bound. Times are scaled and rounded *down* (``floor(a) + floor(b) <=
floor(a + b)``), so the floor of every true schedule is a schedule of the
model.

On graphs above ``max_ops`` ops, the model keeps only the ``max_ops`` longest
ops (the *subset*): a dropped op's work joins an aggregate energy row
(``devices * makespan >= kept placed work + dropped fastest work``), and a
path through dropped ops between two kept ones becomes a precedence of its
communication-free length. Dropping ops and constraints only relaxes, so the
bound stays valid for the whole graph.

Examples
--------
>>> from pesto.graph import OpGraph
>>> from pesto.cluster import gpus
>>> big = 10 ** 9                                # 1000 µs to move on the link below
>>> g = OpGraph.from_edges({"a": 1, "b": 100, "c": 100, "d": 1},
...                        [("a", "b", big), ("a", "c", big), ("b", "d", big), ("c", "d", big)])
>>> c = gpus(2, beta=(1.0, 1e-6))
>>> from solver.bounds import lower_bound
>>> lower_bound(g, c)                           # the critical path: 102 µs
102.0
>>> b = comm_bound(g, c, time_limit=5)           # splitting b and c costs a transfer
>>> b.value, b.source, b.proven
(202.0, 'cp-sat relaxation (fine)', True)
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

from ortools.sat.python import cp_model

from pesto.cluster import Cluster
from pesto.deadline import Deadline
from pesto.dag import UnionFind, bottom_levels, top_levels
from pesto.graph import OpGraph
from pesto.plan import Plan
from pesto.problem import INF, Problem

from .bounds import ChainHeads, chain_heads, energetic_bound, lower_bound, stopped
from .cpsat_solve import interleave, search

__all__ = ["Bound", "RelaxedModel", "comm_bound", "colocation_bound", "edge_delay", "reduced_edges", "SIMPLE_SOURCE", "CHAIN_SOURCE",
           "ENERGY_SOURCE", "COLOCATION_SOURCE"]

SIMPLE_SOURCE = "critical path / work"
CHAIN_SOURCE = "critical-path phases"
ENERGY_SOURCE = "energetic reasoning (heads/tails)"
COLOCATION_SOURCE = "forced colocation (transfer delays)"
MAX_OPS = 400           # above: the relaxation keeps the longest ops only
HORIZON_UNITS = 10 ** 6  # the incumbent (or a safe horizon) in model units
RECV_BUDGET = 20_000     # receive literals of the link energy rows
PATHS_PER_OP = 64        # kept ancestors remembered per op in the subset's path precedences


@dataclass(frozen=True)
class Bound:
    """A makespan lower bound (µs) and where it comes from.

    value : the bound, never below ``simple``
    source : the bound that gave ``value``: "cp-sat relaxation (fine)", "cp-sat
        relaxation on N-op subset", :data:`CHAIN_SOURCE`, :data:`ENERGY_SOURCE`,
        :data:`COLOCATION_SOURCE` or :data:`SIMPLE_SOURCE`
    seconds : wall time spent
    proven : the relaxation was solved to optimality (the bound is its optimum)
    simple : :func:`solver.bounds.lower_bound`
    """

    value: float
    source: str
    seconds: float
    proven: bool
    simple: float


def edge_delay(prob: Problem, i: int, j: int, tensors) -> float:
    """Least time (µs) between the end of ``i`` and the arrival of all the
    edge's ``tensors`` at ``j`` when the two run on different devices: over
    allowed device pairs, the largest transfer (their sum where the route's
    links are contended: they queue on the same links).

    >>> from pesto.graph import OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph.from_edges({"a": 1, "b": 1}, [("a", "b", 100)])
    >>> p = Problem.of(g, gpus(2, beta=(1.0, 0.01)))
    >>> edge_delay(p, 0, 1, p.ins[1][0][1])
    2.0
    """
    best = None
    for b0, b1, contended in _pair_costs(prob, i, j):
        times = [b0 + b1 * nb for _, nb in tensors if nb > 0]  # = prob.comm(a, b, nb)
        t = sum(times) if contended else max(times, default=0.0)
        best = t if best is None or t < best else best
    return best or 0.0


def _pair_costs(prob: Problem, i: int, j: int) -> list[tuple]:
    """The distinct (beta0, beta1, contended) of the device pairs ``i`` and
    ``j`` may use apart, cached per pair of allowed sets: on 500 identical
    GPUs one triple instead of 250,000 pairs per edge."""
    cache = prob.__dict__.setdefault("_pair_costs", {})
    key = (tuple(prob.allowed[i]), tuple(prob.allowed[j]))
    if key not in cache:
        cache[key] = sorted({(prob.beta0[a][b], prob.beta1[a][b], bool(prob.links[a][b]))
                             for a in key[0] for b in key[1] if a != b})
    return cache[key]


def colocation_bound(prob: Problem, lower: float, upper: float, *, time_limit: float = 5.0,
                     max_steps: int | None = None, deadline: Deadline | None = None) -> float:
    """The largest makespan ``T`` in ``[lower, upper)`` refuted by forced
    colocation, else ``lower`` (µs).

    For a candidate ``T``: an edge ``i -> j`` whose longest path through it,
    with its transfer (:func:`edge_delay`), exceeds ``T`` (``head[i] + p[i] +
    delay + p[j] + tail[j] > T``; fastest times, communication-free heads and
    tails) cannot be split, so its ends share a device; colocation units do
    too. ``T`` is refuted when a set so joined has no device every member
    allows, cannot run its ops one after another within ``T`` (for each
    threshold ``t`` on heads: ``t + work of members with head >= t + least
    tail among them > T``; the same on tails), or when more than ``devices``
    sets each hold over half of ``T`` of work. Refutation is monotone enough
    for a bisection; every returned value was refuted. An interrupted
    ``deadline`` ends the bisection.
    """
    t0 = time.perf_counter()
    n = prob.n
    fast = [prob.fastest(i) for i in range(n)]
    head = [h - f for h, f in zip(top_levels(prob.pred, fast, order=prob.topo), fast)]
    tail = [t - f for t, f in zip(bottom_levels(prob.succ, fast, order=prob.topo), fast)]
    edges = []
    for j in range(n):
        for i, tensors in prob.ins[j]:
            if prob.unit[i] != prob.unit[j]:
                c = edge_delay(prob, i, j, tensors)
                if c > 0:
                    edges.append((head[i] + fast[i] + c + fast[j] + tail[j], i, j))
    edges.sort(reverse=True)
    masks = [sum(1 << d for d in prob.allowed[i]) for i in range(n)]
    ctx = (prob, fast, head, tail, edges, masks)
    lo, hi = lower, upper
    if hi <= lo or not _colocation_refutes(lo, *ctx):
        return lower
    steps = 0
    while hi - lo > 1e-6 * hi and time.perf_counter() - t0 < time_limit and steps != max_steps \
            and not stopped(deadline):
        steps += 1
        mid = 0.5 * (lo + hi)
        if _colocation_refutes(mid, *ctx):
            lo = mid
        else:
            hi = mid
    return lo


def _colocation_refutes(T, prob, fast, head, tail, edges, masks) -> bool:
    """Whether forced colocation shows that no schedule ends by ``T``."""
    uf = UnionFind(prob.n, masks=masks)
    for mem in prob.members:
        for i in mem[1:]:
            uf.union(mem[0], i)
    slack = 1e-9 * max(1.0, T)
    for length, i, j in edges:  # longest first: stop at the first that fits
        if length <= T + slack:
            break
        uf.union(i, j)
    groups: dict[int, list[int]] = {}
    for i in range(prob.n):
        groups.setdefault(uf.find(i), []).append(i)
    big = 0
    for root, mem in groups.items():
        if uf.mask[root] == 0:
            return True
        work = sum(fast[i] for i in mem)
        big += work > 0.5 * T + slack
        if len(mem) > 1 and work > 0.5 * T and _one_device_refutes(T + slack, mem, fast, head, tail):
            return True
    return big > prob.nd


def _one_device_refutes(T, mem, fast, head, tail) -> bool:
    """Ops ``mem`` on one device one after another cannot all fit in ``[0, T]``."""
    for first, last in ((head, tail), (tail, head)):
        order = sorted(mem, key=lambda i: first[i])
        work, least = 0.0, float("inf")
        for i in reversed(order):  # suffixes by ``first``: the set starting no earlier than first[i]
            work += fast[i]
            least = min(least, last[i])
            if first[i] + work + least > T:
                return True
    return False


def reduced_edges(prob: Problem, keep: list[bool], weight: list[int], *,
                  per_op: int = PATHS_PER_OP) -> dict[tuple[int, int], int]:
    """Precedences between kept ops through dropped ones: ``(i, j) -> L``
    where a path ``i -> ... -> j`` has only dropped ops inside, of total
    ``weight`` ``L`` (the longest such path found). Direct edges between kept
    ops are not included. Each op remembers at most ``per_op`` kept
    ancestors (the farthest-reaching); forgetting one only drops a valid
    constraint.

    >>> from pesto.graph import OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph.from_edges({"a": 1, "b": 2, "c": 1}, [("a", "b"), ("b", "c")])
    >>> reduced_edges(Problem.of(g, gpus(1)), [True, False, True], [1, 2, 1])
    {(0, 2): 2}
    """
    reach: list[dict | None] = [None] * prob.n  # dropped op -> {kept ancestor: path weight to its start}
    out: dict[tuple[int, int], int] = {}
    for v in prob.topo:
        acc: dict[int, int] = {}
        for p in prob.pred[v]:
            if keep[p]:
                continue
            for a, w in (reach[p] or {}).items():
                w += weight[p]
                if acc.get(a, -1) < w:
                    acc[a] = w
        if keep[v]:
            for a, w in acc.items():
                if out.get((a, v), -1) < w:
                    out[(a, v)] = w
            continue
        for p in prob.pred[v]:
            if keep[p] and acc.get(p, -1) < 0:
                acc[p] = 0
        if len(acc) > per_op:
            acc = dict(sorted(acc.items(), key=lambda kv: -kv[1])[:per_op])
        reach[v] = acc
    return out


class RelaxedModel:
    """The relaxation of :mod:`this module <solver.bound_model>` on the ops ``keep``.

    Parameters
    ----------
    prob : the problem arrays
    keep : per op, whether the model holds it (default: every op)
    scale : model units per µs (times are rounded down)
    lower, upper : µs; the makespan's domain (a valid lower bound, and a
        value not below the optimum, e.g. a plan's makespan)
    """

    def __init__(self, prob: Problem, *, keep: list[bool] | None = None, scale: float,
                 lower: float, upper: float):
        self.p, self.scale = prob, scale
        self._into: dict[tuple, tuple] = {}  # (allowed set, device) -> links every route shares, costs
        self.keep = keep if keep is not None else [True] * prob.n
        self.ops = [i for i in range(prob.n) if self.keep[i]]
        self.m = cp_model.CpModel()
        p = prob
        self.dur = [[self.units(t) if t != INF else None for t in row] for row in p.dur]
        fast = [min(t for t in row if t is not None) for row in self.dur]
        self.fast = fast
        self.head = [int(h) - f for h, f in zip(top_levels(p.pred, fast, order=p.topo), fast)]
        self.tail = [int(t) - f for t, f in zip(bottom_levels(p.succ, fast, order=p.topo), fast)]
        self.lo = self.units(lower)
        self.hi = max(self.units(upper), self.lo)
        self.makespan = self.m.new_int_var(self.lo, self.hi, "makespan")
        self.add_placement()
        self.add_ops()
        self.add_precedences()
        self.add_energy()
        self.add_links()
        self.m.minimize(self.makespan)

    def units(self, t: float) -> int:
        """µs -> model units, rounded down."""
        return int(math.floor(t * self.scale + 1e-9))

    def add_placement(self) -> None:
        """``x[u][d]``: unit ``u`` runs on device ``d`` (one per allowed device)."""
        p, m = self.p, self.m
        units = sorted({p.unit[i] for i in self.ops})
        self.x: dict[int, dict[int, object]] = {}
        for u in units:
            al = p.allowed[p.members[u][0]]
            if len(al) == 1:
                self.x[u] = {al[0]: m.new_constant(1)}
                continue
            lits = {d: m.new_bool_var(f"x{u}@{d}") for d in al}
            m.add_exactly_one(lits.values())
            self.x[u] = lits

    def on(self, i: int) -> dict:
        return self.x[self.p.unit[i]]

    def add_ops(self) -> None:
        """Start and end per op, optional run intervals, a no-overlap per device."""
        m, hi = self.m, self.hi
        self.start, self.end = {}, {}
        per_dev: list[list] = [[] for _ in range(self.p.nd)]
        for i in self.ops:
            s = m.new_int_var(self.head[i], max(self.head[i], hi - self.fast[i] - self.tail[i]), f"s{i}")
            e = m.new_int_var(0, hi, f"e{i}")
            lits = self.on(i)
            m.add(e == s + sum(lit * self.dur[i][d] for d, lit in lits.items()))
            for d, lit in lits.items():
                per_dev[d].append(m.new_optional_fixed_size_interval_var(s, self.dur[i][d], lit, f"r{i}@{d}"))
            m.add(self.makespan >= e + self.tail[i])
            self.start[i], self.end[i] = s, e
        for ivs in per_dev:
            if len(ivs) > 1:
                m.add_no_overlap(ivs)


    def apart(self, i: int, j: int):
        """A literal forced true when ops ``i`` and ``j`` are on different devices."""
        xi, xj = self.on(i), self.on(j)
        lit = self.m.new_bool_var(f"apart{i}_{j}")
        for d, li in xi.items():
            lj = xj.get(d)
            self.m.add_bool_or([li.Not(), lit] + ([lj] if lj is not None else []))
        return lit

    def add_precedences(self) -> None:
        """Edges between kept ops (with transfer delays), paths through dropped ones."""
        m, p = self.m, self.p
        for j in self.ops:
            for i, tensors in p.ins[j]:
                if not self.keep[i]:
                    continue
                m.add(self.start[j] >= self.end[i])
                if p.unit[i] == p.unit[j]:
                    continue
                c = self.units(edge_delay(p, i, j, tensors))
                if c > 0:
                    m.add(self.start[j] >= self.end[i] + c).only_enforce_if(self.apart(i, j))
        if len(self.ops) < p.n:
            for (i, j), w in reduced_edges(p, self.keep, self.fast).items():
                m.add(self.start[j] >= self.end[i] + w)

    def add_energy(self) -> None:
        """Per device its load fits the makespan; all work (dropped ops at
        their fastest) fits ``devices * makespan``."""
        m, p = self.m, self.p
        loads = [[] for _ in range(p.nd)]
        for i in self.ops:
            for d, lit in self.on(i).items():
                loads[d].append(lit * self.dur[i][d])
        for terms in loads:
            if terms:
                m.add(sum(terms) <= self.makespan)
        dropped = sum(self.fast[i] for i in range(p.n) if not self.keep[i])
        m.add(p.nd * self.makespan >= sum(t for ts in loads for t in ts) + dropped)

    def add_links(self) -> None:
        """Per contended link, the transfers that must cross it fit the makespan."""
        p, m = self.p, self.m
        if not any(p.links[a][b] for a in range(p.nd) for b in range(p.nd)):
            return
        cands = []
        for t, (_, u, nb, cons) in enumerate(p.tensors):
            cons = [j for j in cons if self.keep[j] and p.unit[j] != p.unit[u]]
            if nb > 0 and cons and self.keep[u]:
                cands.append((nb, t, u, cons))
        cands.sort(key=lambda c: (-c[0], c[1]))
        rows: dict[int, list] = {}
        budget = RECV_BUDGET
        for nb, t, u, cons in cands:
            for b in sorted({d for j in cons for d in self.on(j)}):
                coef = self._link_coefs(u, b, nb)
                if not coef or budget <= 0:
                    continue
                budget -= 1
                recv = m.new_bool_var(f"recv{t}@{b}")
                own = self.on(u).get(b)
                for j in cons:
                    lj = self.on(j).get(b)
                    if lj is not None:
                        m.add_bool_or([lj.Not(), recv] + ([own] if own is not None else []))
                for l, c in coef.items():
                    rows.setdefault(l, []).append(recv * c)
        for terms in rows.values():
            m.add(sum(terms) <= self.makespan)

    def _link_coefs(self, u: int, b: int, nbytes: int) -> dict[int, int]:
        """Per link, the least time a transfer of ``nbytes`` from op ``u`` to
        device ``b`` holds it, over ``u``'s devices (0: some route avoids it)."""
        p = self.p
        key = (tuple(p.allowed[u]), b)
        if key not in self._into:  # per allowed set and device, not per tensor (500 GPUs: 250k pairs)
            srcs = [a for a in p.allowed[u] if a != b]
            self._into[key] = (set.intersection(*(set(p.links[a][b]) for a in srcs)) if srcs else set(),
                               sorted({(p.beta0[a][b], p.beta1[a][b]) for a in srcs}))
        common, costs = self._into[key]
        if not costs:
            return {}
        least = self.units(min(b0 + b1 * nbytes if nbytes > 0 else 0.0 for b0, b1 in costs))
        return {l: least for l in common} if least > 0 else {}

    def hint(self, plan: Plan) -> None:
        """The plan's placement and (rounded down) start times as a hint."""
        p = self.p
        dev = p.placement_index(plan.placement)
        for u, lits in self.x.items():
            if len(lits) > 1:
                for d, lit in lits.items():
                    self.m.add_hint(lit, dev[p.members[u][0]] == d)
        if plan.start:
            for i in self.ops:
                s = plan.start.get(p.names[i])
                if s is not None:
                    self.m.add_hint(self.start[i], max(self.head[i], self.units(s)))

    def solve(self, *, time_limit: float, workers: int = 1, seed: int = 0,
              deterministic: bool = False, deadline: Deadline | None = None) -> tuple[float, bool]:
        """(proven lower bound in µs, solved to optimality); ``deterministic``:
        ``time_limit`` is CP-SAT's deterministic time (a wall limit ten times
        longer is the safety net); an interrupted ``deadline`` stops the search."""
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = max(1, workers)
        if deterministic:
            solver.parameters.max_deterministic_time = max(0.01, time_limit)
            interleave(solver.parameters)
        solver.parameters.max_time_in_seconds = max(0.01, time_limit) * (10 if deterministic else 1)
        solver.parameters.random_seed = seed
        solver.parameters.catch_sigint_signal = False  # else OR-Tools swallows Ctrl-C during and after it
        code = search(solver, self.m, deadline)  # in a worker thread: Ctrl-C reaches the solve's handler
        if code == cp_model.OPTIMAL:
            return solver.objective_value / self.scale, True
        lo = self.lo
        if code in (cp_model.FEASIBLE, cp_model.UNKNOWN) and math.isfinite(solver.best_objective_bound):
            return max(lo, solver.best_objective_bound) / self.scale, False
        return lo / self.scale, False  # infeasible cannot happen for a valid upper limit


def _subset(prob: Problem, max_ops: int) -> list[bool]:
    """The ``max_ops`` ops of longest fastest compute (ties: lower index)."""
    fast = [prob.fastest(i) for i in range(prob.n)]
    chosen = sorted(range(prob.n), key=lambda i: (-fast[i], i))[:max_ops]
    keep = [False] * prob.n
    for i in chosen:
        keep[i] = True
    return keep


DETERMINISTIC_STEPS = 24  # bisection steps of the energetic and colocation bounds in deterministic mode


def comm_bound(graph: OpGraph, cluster: Cluster, *, time_limit: float = 10.0, incumbent: Plan | None = None,
               upper: float | None = None, workers: int = 1, seed: int = 0, max_ops: int = MAX_OPS,
               deterministic: bool = False, phased: ChainHeads | None = None,
               deadline: Deadline | None = None) -> Bound:
    """A makespan lower bound that counts communication (module docstring).

    The best of: :func:`~solver.bounds.lower_bound`, :func:`~solver.bounds.chain_bound`,
    :func:`~solver.bounds.energetic_bound`
    (up to 25 % of ``time_limit``), :func:`colocation_bound` (up to 15 %) and
    CP-SAT's bound on :class:`RelaxedModel` (the rest; the model on every op
    up to ``max_ops`` ops, else on the ``max_ops`` longest), each started
    from the best before it.

    Parameters
    ----------
    time_limit : seconds in all (a large model's presolve may overrun it a little)
    incumbent : a plan of the graph: its makespan caps the model's horizon
        and its placement and starts are the hint
    upper : a makespan some plan achieves (µs), when no ``incumbent`` is given
        (default: a safe horizon)
    workers, seed : CP-SAT's
    max_ops : the most ops the CP-SAT relaxation holds
    deterministic : the same value on any machine: the bisections take a
        fixed number of steps and CP-SAT runs on deterministic time
    phased : :func:`~solver.bounds.chain_heads` of the graph when the caller has
        them (not computed again); they also tighten the energetic bound
    deadline : the solve's :class:`~pesto.deadline.Deadline`: when it is
        interrupted (Ctrl-C), every part stops and the best bound so far is returned

    Returns
    -------
    Bound
        ``value >= lower_bound(graph, cluster)``; ``source`` names the bound
        that gave ``value``.
    """
    t0 = time.perf_counter()
    simple = lower_bound(graph, cluster)
    if graph.num_ops == 0:
        return Bound(0.0, SIMPLE_SOURCE, 0.0, True, 0.0)
    prob = Problem.of(graph, cluster)
    if incumbent is not None and incumbent.makespan is not None:
        upper = incumbent.makespan
    elif upper is None:
        upper = _horizon(prob)
    best, source = simple, SIMPLE_SOURCE
    if upper > simple:
        phased = chain_heads(graph, cluster) if phased is None else phased
        if phased.value > best:
            best, source = phased.value, CHAIN_SOURCE
    if upper > best:
        steps = dict(time_limit=math.inf, max_steps=DETERMINISTIC_STEPS) if deterministic else {}
        energy = energetic_bound(graph, cluster, upper=upper, phased=phased, deadline=deadline,
                                 **({"time_limit": 0.25 * time_limit} | steps))
        if energy > best:
            best, source = energy, ENERGY_SOURCE
        coloc = colocation_bound(prob, best, upper, deadline=deadline,
                                 **({"time_limit": 0.15 * time_limit} | steps))
        if coloc > best:
            best, source = coloc, COLOCATION_SOURCE
    proven = False
    if upper > best and not stopped(deadline):
        keep = None if prob.n <= max_ops else _subset(prob, max_ops)
        scale = 1.0 if keep is None and _integral(prob, upper) else HORIZON_UNITS / upper
        model = RelaxedModel(prob, keep=keep, scale=scale, lower=best, upper=upper)
        if incumbent is not None:
            model.hint(incumbent)
        left = 0.6 * time_limit if deterministic else time_limit - (time.perf_counter() - t0)
        if left > 0:
            value, proven = model.solve(time_limit=left, workers=workers, seed=seed, deterministic=deterministic,
                                        deadline=deadline)
            proven = proven and keep is None
            if value > best:
                best = value
                source = "cp-sat relaxation (fine)" if keep is None else f"cp-sat relaxation on {max_ops}-op subset"
    return Bound(float(best), source, time.perf_counter() - t0, proven, simple)


def _horizon(prob: Problem) -> float:
    """A makespan no left-shifted schedule exceeds: every op at its slowest,
    every tensor sent to every other device one after another."""
    work = sum(max(t for t in row if t != INF) for row in prob.dur)
    comm = 0.0
    for _, u, nb, cons in prob.tensors:
        if nb > 0 and cons:
            comm += max((prob.comm(a, b, nb) for a in range(prob.nd) for b in range(prob.nd)), default=0.0) \
                * min(len(cons), prob.nd)
    return work + comm


def _integral(prob: Problem, upper: float) -> bool:
    """Every compute and transfer time is a whole µs and the horizon is
    small: the model then runs in µs and loses nothing to rounding."""
    if upper > 10 * HORIZON_UNITS:
        return False
    whole = lambda t: abs(t - round(t)) < 1e-9
    if not all(whole(t) for row in prob.dur for t in row if t != INF):
        return False
    pairs = [(a, b) for a in range(prob.nd) for b in range(prob.nd) if a != b]
    return all(whole(prob.comm(a, b, nb)) for _, _, nb, _ in prob.tensors for a, b in pairs)
