"""The CP-SAT model of one (graph, cluster), built in named pieces.

:class:`CpsatModel` reads the problem arrays (:meth:`pesto.problem.Problem.of`)
and adds one family of variables and constraints per method, in this order
(the order is part of the model: CP-SAT's search depends on it):

=====================  ===========================================================
:meth:`add_placement`  ``on[op@dev]``: one literal per (unit, allowed device)
:meth:`add_ops`        ``start[op]``, ``end[op]``, ``run[op@dev]`` intervals, no-overlap,
                       loads, a redundant cumulative, precedences, ``makespan``
:meth:`add_links`      ``send[tensor->dev]`` and transfer intervals on link
                       resources (contended), or ``same_dev[u->c]`` delays
:meth:`add_cuts`       redundant energy cuts with communication
:meth:`add_memory`     static memory bound per device (``max_temp[dev]``)
:meth:`add_symmetry`   value precedence over interchangeable devices
=====================  ===========================================================

What each family means is described in :mod:`solver.cpsat`. Hints live in
:mod:`solver.cpsat_hint`, the search and the reading of a solution in
:mod:`solver.cpsat_solve`.

Examples
--------
>>> from pesto.graph import OpGraph
>>> from pesto.cluster import gpus
>>> g = OpGraph.from_edges({"a": 2, "b": 3, "c": 4}, [("a", "b", 1), ("a", "c", 1)])
>>> m = CpsatModel(g, gpus(2, beta=(1.0, 0.0)))
>>> m.x[1][1].name                          # b's device: one boolean for two GPUs
'on[b@/GPU:1]'
>>> m.start[2].name, m.exact, m.pure
('start[c]', True, False)
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from pesto.cluster import Cluster
from pesto.dag import reachability
from pesto.deadline import Deadline
from pesto.graph import OpGraph
from pesto.memory import check_feasible, static_bytes
from pesto.plan import Plan
from pesto.problem import Problem

from . import cpsat_hint, cpsat_solve
from .bounds import lower_bound

__all__ = ["CpsatModel", "TimeUnits", "TransferUnit", "symmetric_groups", "memory_terms"]

INF = float("inf")
MEMORY_MODES = (True, False, "static", "persistent")
AGGREGATE_ABOVE = 400  # transfer candidates above which transfers are aggregated by default
CUT_BUDGET = 150_000  # terms the per-device energy cuts may add


def symmetric_groups(cluster: Cluster) -> list[list[int]]:
    """Groups of device indices that any permutation maps onto the same problem.

    Starts from :meth:`Cluster.identical_groups` and keeps a group only if swapping
    two consecutive members (transpositions generate every permutation) keeps
    every route cost and maps the set of links used by each route onto the set
    of another link (same sharing structure). Otherwise the group is dropped.

    Examples
    --------
    >>> from pesto.cluster import gpus
    >>> symmetric_groups(gpus(3)), symmetric_groups(gpus(2, speeds=[1.0, 0.5]))
    ([[0, 1, 2]], [])
    """
    return [[cluster.index[n] for n in group] for group in cluster.identical_groups()
            if len(group) >= 2 and all(cluster.swap_keeps(a, b) for a, b in zip(group, group[1:]))]


def memory_terms(problem: Problem, mode: str) -> tuple[list[int], list[int], bool]:
    """Per op, the bytes the model's memory bound holds all step and the bytes
    held only while it runs (of which a device counts the largest), and whether
    received tensors count.

    ``"static"`` is :func:`pesto.memory.static_peak`: :func:`~pesto.memory.static_bytes`
    (persistent + allocated output) held, the temporary at peak, received tensors counted;
    an upper bound of the liveness peak of any schedule. ``"persistent"`` holds
    the persistent bytes and counts the largest output + temporary of one op:
    weaker, so the simulated liveness peak decides.
    """
    ops = problem.graph.ops
    if mode == "static":
        return [static_bytes(op) for op in ops], list(problem.temp), True
    return list(problem.persistent), [o + t for o, t in zip(problem.out, problem.temp)], False


def _is_int(x: float) -> bool:
    return abs(x - round(x)) < 1e-9


@dataclass(frozen=True)
class TimeUnits:
    """The model's time unit: µs -> integer units (a callable).

    For integer data (every compute and transfer time integral, the horizon
    below 1e8) one unit is one µs (``exact``). Otherwise times are scaled and
    rounded *up*, so a model schedule is feasible for the true times.
    """

    scale: float
    exact: bool
    horizon: int

    def __call__(self, x: float) -> int:
        if self.exact:
            return int(round(x))
        return int(math.ceil(x * self.scale - 1e-9))

    @classmethod
    def choose(cls, problem: Problem, tensors, allowed, lb: float, check=None) -> "TimeUnits":
        """Units for ``problem``: ``tensors`` are the remote-capable ones,
        ``allowed`` the devices per op (of its unit); ``lb`` a makespan bound;
        ``check()`` is called per tensor (it raises when the solve must stop)."""
        p = problem
        own = [[t for t in p.dur[i] if t != INF] for i in range(p.n)]  # the op's own kinds
        values = [t for ts in own for t in ts]
        comm_max = []
        for (_, u, b, cs) in tensors:
            if check is not None:
                check()
            dests = set().union(*(allowed[c] for c in cs))
            times = [p.comm(a, e, b) for a in allowed[u] for e in dests if a != e]
            values.extend(times)
            comm_max.append(max(times, default=0.0) * min(len(dests), len(cs)))
        safe = sum(max(ts) for ts in own) + sum(comm_max)  # no left-shifted schedule is longer
        integral = all(_is_int(x) for x in values)
        if integral and safe <= 1e8:
            scale = 1.0
        else:
            scale = min(1e6 / max(lb, 1e-9), 1e8 / max(safe, 1e-9))
        probe = cls(scale, integral and scale == 1.0, 0)
        return cls(scale, probe.exact, max(1, probe(safe) + len(values) + 1))


@dataclass
class TransferUnit:
    """What one transfer interval carries: one tensor (``tensors`` of length 1)
    or, aggregated, every tensor of producer ``u`` bound for device ``e``."""

    key: tuple          # (tensor name, e), or (u, e) when aggregated
    u: int
    e: int
    sent: object        # literal: the unit is sent (some of its tensors is)
    own_sent: bool      # ``sent`` is a literal of its own (several tensors)
    start: object
    end: object
    sources: list       # (literal "sent from device a", a)
    fixed_size: object  # the size when every source gives the same one, else None
    size_vars: list = field(default_factory=list)  # (size variable, coefficient per tensor)
    tensors: list = field(default_factory=list)    # (name, bytes, consumers)


class CpsatModel:
    """The CP-SAT model of one (graph, cluster); build once, solve with hints.

    Parameters
    ----------
    graph, cluster
    contention : bool
        Model link congestion (ignored when the cluster is contention free).
    memory_balance : float, optional
        Bound each device's static held bytes by ``(1 + memory_balance) * mean``.
    symmetry : bool
        Break symmetries between interchangeable devices.
    memory : {True, "static", "persistent", False}
        Memory constraints (added only when they can bind); see :func:`memory_terms`.
        ``"static"`` (True) never accepts a plan that runs out of memory but
        can reject every plan of a graph whose activations do not all fit at once.
    aggregate : bool, optional
        One transfer interval per (producer, destination) instead of per
        (tensor, destination); default: only when the per-tensor model would
        have more than 400 transfer candidates.
    cuts : bool
        Add the redundant energy cuts with communication (:meth:`add_cuts`).

    Raises
    ------
    ValueError
        ``memory`` is not one of the modes above.
    InfeasibleError
        From :func:`pesto.memory.check_feasible`.

    Examples
    --------
    >>> from pesto.graph import OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph.from_edges({"a": 2, "b": 3, "c": 4}, [("a", "b", 1), ("a", "c", 1)])
    >>> m = CpsatModel(g, gpus(2, beta=(1.0, 0.0)))
    >>> m.solve(time_limit=10, workers=1).makespan
    6.0
    """

    def __init__(self, graph: OpGraph, cluster: Cluster, *, contention: bool = True,
                 memory_balance: float | None = None, symmetry: bool = True, memory: bool | str = True,
                 aggregate: bool | None = None, cuts: bool = True, deadline: Deadline | None = None):
        if memory not in MEMORY_MODES:
            raise ValueError(f"memory must be True/'static', 'persistent' or False, got {memory!r}")
        check_feasible(graph, cluster)
        t0 = time.perf_counter()
        self.graph, self.cluster = graph, cluster
        self.deadline = deadline  # building checks it: on 64 GPUs a model takes seconds to build
        self.problem = p = Problem.of(graph, cluster)
        self.aggregate, self.cuts = aggregate, cuts
        self.memory_mode = "static" if memory is True else memory
        self.memory_balance = memory_balance
        self.contended = contention and not cluster.contention_free and bool(cluster.links)
        self._prepare()
        self.sym_groups = symmetric_groups(cluster)
        self._check_time()
        self.pure = self._is_pure(memory_balance, memory)
        if self.pure:
            self.add_pure_ops()
        else:
            if not symmetry:
                self.sym_groups = []
            self.add_placement()
            self.add_ops()
            self.add_links()
            if p.nd > 1 and cuts:
                self.add_cuts()
            if memory:
                self.add_memory(memory_balance)
            if self.sym_groups:
                self.add_symmetry()
        self.model.minimize(self.makespan)
        self.build_time = time.perf_counter() - t0

    # -- data ------------------------------------------------------------------
    def _prepare(self) -> None:
        """Items, remote-capable tensors, time units and empty containers."""
        p = self.problem
        self.lb = lower_bound(self.graph, self.cluster)
        # an item is a colocation unit, named by its first op (members share literals)
        first = [min(mem) for mem in p.members]
        self.item_of = [first[p.unit[i]] for i in range(p.n)]
        self.items = sorted(first)
        # tensors with bytes that some consumer outside the producer's unit reads
        self.tensors = [(name, u, b, cs) for name, u, b, cons in p.tensors if b > 0
                        for cs in [[c for c in sorted(set(cons) - {u}) if self.item_of[c] != self.item_of[u]]]
                        if cs]
        self.edge_bytes = {(u, c): [b for _, b in ts if b > 0] for c in range(p.n) for u, ts in p.ins[c]}
        self.units = TimeUnits.choose(p, self.tensors, p.allowed, self.lb, self._check_time)
        self.scale, self.exact, self.horizon = self.units.scale, self.units.exact, self.units.horizon
        # every item on a chain is rounded up by < 1 unit
        self.rounding_units = 0 if self.exact else p.n + len(self.tensors) * max(1, p.nd - 1)
        self.ms_min = min(self.horizon, int(math.ceil(self.lb * self.scale - 1e-6)))
        self.model = cp_model.CpModel()
        self.transfer_vars, self.same_vars, self.item_hint_vars = {}, [], {}
        self.recv, self.recv_info, self.units_info = {}, {}, []
        self.sym_aux: list = []
        self.aggregated = self.memory_active = self.static_cuts = False

    def _is_pure(self, memory_balance, memory) -> bool:
        """No communication, identical devices, no memory, no colocation: a
        cumulative of capacity ``nd`` is exact (interval graphs colour greedily)."""
        p = self.problem
        held = sum(static_bytes(op) for op in self.graph.ops)
        mem_free = memory_balance is None and (
            not memory or held + max((o + t for o, t in zip(p.out, p.temp)), default=0) <= min(p.cap))
        return (p.nd > 1 and not self.tensors and mem_free and len(p.members) == p.n
                and all(len(al) == p.nd for al in p.allowed)
                and any(len(grp) == p.nd for grp in self.sym_groups))

    def _check_time(self) -> None:
        """Raise :class:`~pesto.deadline.Stopped` once the solve's deadline
        passed or it was interrupted (called per item, transfer and cut)."""
        if self.deadline is not None:
            self.deadline.check()

    def _item_label(self, it: int) -> str:
        op = self.graph.ops[it]
        return op.colocation_group if len(self.problem.members[self.problem.unit[it]]) > 1 else op.name

    # -- families ----------------------------------------------------------------
    def add_placement(self) -> None:
        """``on[item@dev]``: exactly one device per item, among its allowed ones
        (one boolean for two devices, a constant for one)."""
        m, p = self.model, self.problem
        dn = p.dev_names
        self.item_lits = {}
        for it in self.items:
            self._check_time()
            al, label = p.allowed[it], self._item_label(it)
            if len(al) == 1:
                lits, hint_vars = {al[0]: m.new_constant(1)}, []
            elif len(al) == 2:
                b = m.new_bool_var(f"on[{label}@{dn[al[1]]}]")
                lits, hint_vars = {al[0]: b.Not(), al[1]: b}, [(b, al[1])]
            else:
                lits = {k: m.new_bool_var(f"on[{label}@{dn[k]}]") for k in al}
                m.add_exactly_one(lits.values())
                hint_vars = [(v, k) for k, v in lits.items()]
            self.item_hint_vars[it] = hint_vars
            self.item_lits[it] = lits
        self.x = [self.item_lits[self.item_of[i]] for i in range(p.n)]

    def add_ops(self) -> None:
        """``start``/``end`` per op, a ``run`` interval per allowed device,
        no-overlap and a load bound per device, a cumulative of the fastest
        sizes, the precedences and ``makespan >= end``."""
        m, p, H = self.model, self.problem, self.horizon
        self.start = [m.new_int_var(0, H, f"start[{nm}]") for nm in p.names]
        self.end = [m.new_int_var(0, H, f"end[{nm}]") for nm in p.names]
        self.makespan = m.new_int_var(self.ms_min, H, "makespan")
        self.size = [{k: self.units(p.dur[i][k]) for k in self.x[i]} for i in range(p.n)]
        per_dev, load, fastest = self._run_intervals()
        for k in range(p.nd):
            if len(per_dev[k]) > 1:
                m.add_no_overlap(per_dev[k])
            if load[k]:
                m.add(self.makespan >= sum(load[k]))
        if p.nd > 1 and p.n > p.nd:
            m.add_cumulative(fastest, [1] * p.n, p.nd)
        for i in range(p.n):
            m.add(self.makespan >= self.end[i])
        self._add_precedences()

    def _run_intervals(self):
        """Per device its intervals and loads; per op an interval at its fastest size."""
        m, p = self.model, self.problem
        start, end, size = self.start, self.end, self.size
        per_dev: list[list] = [[] for _ in range(p.nd)]
        load: list[list] = [[] for _ in range(p.nd)]
        fastest = []
        for i, nm in enumerate(p.names):
            if len(self.x[i]) == 1:
                (k,) = self.x[i]
                iv = m.new_interval_var(start[i], size[i][k], end[i], f"run[{nm}]")
                per_dev[k].append(iv)
                load[k].append(size[i][k])
                fastest.append(iv)
                continue
            sizes = set(size[i].values())
            if len(sizes) == 1:
                m.add(end[i] == start[i] + next(iter(sizes)))
            for k, lit in self.x[i].items():
                iv = m.new_optional_interval_var(start[i], size[i][k], end[i], lit, f"run[{nm}@{p.dev_names[k]}]")
                per_dev[k].append(iv)
                load[k].append(size[i][k] * lit)
            mn = min(sizes)
            fastest.append(m.new_interval_var(start[i], mn, start[i] + mn, f"run_fastest[{nm}]"))
        return per_dev, load, fastest

    def _add_precedences(self) -> None:
        m, start, end = self.model, self.start, self.end
        for u, succ in enumerate(self.problem.succ):
            for c in succ:
                m.add(start[c] >= end[u])

    def add_pure_ops(self) -> None:
        """The pure model: one cumulative of capacity ``nd``, precedences, makespan."""
        m, p, H = self.model, self.problem, self.horizon
        self.x = [dict.fromkeys(range(p.nd)) for _ in range(p.n)]
        self.item_lits = {}
        self.size = [{k: self.units(t) for k, t in enumerate(p.dur[i])} for i in range(p.n)]
        self.makespan = m.new_int_var(self.ms_min, H, "makespan")
        self.start = [m.new_int_var(0, H, f"start[{nm}]") for nm in p.names]
        self.end = [m.new_int_var(0, H, f"end[{nm}]") for nm in p.names]
        ivs = [m.new_interval_var(self.start[i], self.size[i][0], self.end[i], f"run[{nm}]")
               for i, nm in enumerate(p.names)]
        m.add_cumulative(ivs, [1] * p.n, p.nd)
        self._add_precedences()
        for i in range(p.n):
            m.add(self.makespan >= self.end[i])

    def add_links(self) -> None:
        """Communication: transfer intervals on link resources when contended,
        else a delay per data edge whose ends are apart."""
        if self.contended:
            self._add_transfers()
        else:
            self._add_delays()

    def add_cuts(self) -> None:
        """Redundant energy cuts with communication (valid for every plan).

        After ``u`` ends, its descendants need ``W`` units of work; on the
        ``nd - 1`` devices other than ``u``'s none of them can start before
        ``end_u + delta_u`` (a child elsewhere waits for its transfer, a child
        on ``u``'s device runs first), so
        ``nd * makespan >= nd * end_u + W + (nd - 1) * delta_u``; symmetrically
        for the ancestors of ``v`` before ``start_v``. Cumulative reasoning
        alone does not see the transfer gap. Per device, the descendants
        (ancestors) of ``u`` placed there run one after another after ``end_u``
        (before ``start_u``), plus the gap when ``u`` is elsewhere.
        """
        p = self.problem
        desc = reachability(p.succ, p.topo)
        anc = reachability(p.pred, p.topo[::-1])
        minsize = [min(sz.values()) for sz in self.size]
        after = [min((min(self._least_delay(u, c), minsize[c]) for c in p.succ[u]), default=0) for u in range(p.n)]
        before = [min((min(self._least_delay(q, u), minsize[q]) for q in p.pred[u]), default=0) for u in range(p.n)]
        budget = CUT_BUDGET
        order = sorted(range(p.n), key=lambda u: -(bin(desc[u]).count("1") + bin(anc[u]).count("1")))
        for u in order:
            self._check_time()
            for mask, is_after, gap in ((desc[u], True, after[u]), (anc[u], False, before[u])):
                if mask and budget > 0:
                    budget = self._device_cuts(u, _bits(mask), is_after, gap, budget)
        work = lambda mask: sum(minsize[k] for k in _bits(mask))  # noqa: E731
        nd, m = p.nd, self.model
        for u in range(p.n):
            if p.succ[u]:
                w = work(desc[u])
                if w and (after[u] or w > minsize[u]):
                    m.add(nd * self.makespan >= nd * self.end[u] + w + (nd - 1) * after[u])
            if p.pred[u]:
                w = work(anc[u])
                if w:
                    m.add(nd * self.start[u] >= w + (nd - 1) * before[u])

    def _least_delay(self, u: int, c: int):
        """Least transfer delay (units) of edge ``u -> c`` between distinct devices."""
        if self.item_of[u] == self.item_of[c]:
            return math.inf  # always on one device
        bs = self.edge_bytes[(u, c)]
        if not bs:
            return 0
        comm, x = self.problem.comm, self.x
        return min((max(self.units(comm(a, k, b)) for b in bs) for a in x[u] for k in x[c] if a != k),
                   default=math.inf)

    def _device_cuts(self, u: int, members: list[int], is_after: bool, gap, budget: int) -> int:
        """Per device ``k``: the ``members`` (descendants or ancestors of ``u``)
        placed on ``k`` run back to back after ``u`` ends (before it starts),
        ``gap`` later (earlier) when ``u`` is not on ``k``. Returns the budget left."""
        m, x, size = self.model, self.x, self.size
        end, start, ms = self.end[u], self.start[u], self.makespan
        for k, lit in x[u].items():
            terms = [size[d][k] * x[d][k] for d in members if k in x[d]]
            if not terms:
                continue
            budget -= 2 * len(terms)
            load = sum(terms)
            if is_after:
                m.add(ms >= end + load).only_enforce_if(lit)
                if len(x[u]) > 1 and gap:
                    m.add(ms >= end + gap + load).only_enforce_if(lit.Not())
            else:
                m.add(start >= load).only_enforce_if(lit)
                if len(x[u]) > 1 and gap:
                    m.add(start >= gap + load).only_enforce_if(lit.Not())
        # devices u cannot use: its descendants/ancestors there always pay the gap
        for k in range(self.problem.nd):
            if k in x[u] or not gap:
                continue
            terms = [size[d][k] * x[d][k] for d in members if k in x[d]]
            if terms:
                budget -= len(terms)
                if is_after:
                    m.add(ms >= end + gap + sum(terms))
                else:
                    m.add(start >= gap + sum(terms))
        return budget

    def _static_cuts(self, held: list[int], recv_total: int, unit: int) -> bool:
        """Whether the static terms may reject a placement whose liveness
        peak fits (then the model is a restriction: its bound and "optimal"
        do not hold for the graph). They count at most ``extra`` bytes more
        than a device's persistent load ``P`` (outputs and received tensors
        held all step, rounding to ``memory_unit``), and the liveness peak is
        at least ``P``: a cut needs ``cap - extra < P <= cap`` for some sum
        ``P`` of colocation units' persistent bytes. False when no such sum
        exists (e.g. memory held by variables alone); True when there are
        too many sums to tell."""
        p = self.problem
        extra = sum(held) - sum(p.persistent) + recv_total + (p.n + 1) * unit
        loads, top = {0}, max(p.cap)
        for members in p.members:
            w = sum(p.persistent[i] for i in members)
            if w:
                loads |= {s + w for s in loads if s + w <= top}
            if len(loads) > 4096:
                return True
        return any(cap - extra < load <= cap for cap in set(p.cap) for load in loads)

    def add_memory(self, balance: float | None = None) -> None:
        """Per device: held bytes of its ops (+ received tensors) + the largest
        peak term <= capacity (:func:`memory_terms`), in units of
        ``memory_unit`` bytes rounded up (so the bound stays conservative).
        Skipped when no placement can exceed the smallest device.
        ``balance``: each device's held bytes <= ``(1 + balance)`` x mean."""
        m, p, x = self.model, self.problem, self.x
        held, peak, recv = memory_terms(p, self.memory_mode)
        recv_total = sum(b * min(len(cs), p.nd - 1) for (_, _, b, cs) in self.tensors) if recv else 0
        if sum(held) + recv_total + max(peak, default=0) <= min(p.cap) and balance is None:
            return
        self.memory_active = True
        unit = self.memory_unit = max(1, max(p.cap) >> 30)  # keep coefficients below ~2^30
        self.static_cuts = self.memory_mode == "static" and self._static_cuts(held, recv_total, unit)
        up = lambda b: -(-b // unit)  # noqa: E731
        terms: list[list] = [[] for _ in range(p.nd)]
        for i in range(p.n):
            if up(held[i]):
                for k, lit in x[i].items():
                    terms[k].append(up(held[i]) * lit)
        held_terms = [list(t) for t in terms]
        for (name, u, b, cs) in (self.tensors if recv else ()):
            for e in sorted(set().union(*(set(x[c]) for c in cs))):
                if sorted(x[u]) != [e]:
                    terms[e].append(up(b) * self._recv(name, u, e, cs))
        for k in range(p.nd):
            temps = [(up(peak[i]), x[i][k]) for i in range(p.n) if peak[i] and k in x[i]]
            if temps:
                tmax = m.new_int_var(0, max(t for t, _ in temps), f"max_temp[{p.dev_names[k]}]")
                for t, lit in temps:
                    m.add(tmax >= t).only_enforce_if(lit)
                terms[k].append(tmax)
            if terms[k]:
                m.add(sum(terms[k]) <= p.cap[k] // unit)
        if balance is not None:
            bound = int(math.floor((1.0 + balance) * sum(up(h) for h in held) / p.nd))
            for k in range(p.nd):
                if held_terms[k]:
                    m.add(sum(held_terms[k]) <= bound)

    def add_symmetry(self) -> None:
        """Value precedence per group of interchangeable devices: taking items in
        topological order, the first item on ``g_j`` comes after some item on
        ``g_{j-1}``. ``used_before[item@dev]`` says some item up to this one is on ``dev``."""
        m, p = self.model, self.problem
        topo_pos = {i: r for r, i in enumerate(p.topo)}
        first: dict[int, int] = {}
        for i in range(p.n):
            it = self.item_of[i]
            first[it] = min(first.get(it, topo_pos[i]), topo_pos[i])
        items = sorted(self.item_lits, key=lambda it: first[it])
        for grp in self.sym_groups:
            self._check_time()
            mine = [it for it in items if all(k in self.item_lits[it] for k in grp)]
            prev = None  # prev[j]: some earlier item is on grp[j]
            for r, it in enumerate(mine):
                lits, cur = self.item_lits[it], []
                for j, k in enumerate(grp):
                    if j > 0:
                        if prev is None:
                            m.add_bool_or([lits[k].Not()])
                        else:
                            m.add_implication(lits[k], prev[j - 1])
                    if r == len(mine) - 1:
                        continue
                    if prev is None:
                        cur.append(lits[k])
                    else:
                        v = m.new_bool_var(f"used_before[{self._item_label(it)}@{p.dev_names[k]}]")
                        m.add_bool_or([v.Not(), prev[j], lits[k]])
                        m.add_implication(prev[j], v)
                        m.add_implication(lits[k], v)
                        cur.append(v)
                        self.sym_aux.append((v, mine[:r + 1], k))
                prev = cur

    # -- communication -------------------------------------------------------------
    def _recv(self, name, u, e, cs):
        """The (cached) literal ``send[name->e]``: tensor ``name`` is sent to
        device ``e`` iff its producer is not on ``e`` and some consumer is."""
        y = self.recv.get((name, e))
        if y is not None:
            return y
        m, x = self.model, self.x
        y = self.recv[(name, e)] = m.new_bool_var(f"send[{name}->{self.problem.dev_names[e]}]")
        self.recv_info[(name, e)] = (u, cs)
        xu = x[u].get(e)
        cons_lits = [x[c][e] for c in cs if e in x[c]]
        for lc in cons_lits:
            m.add_bool_or([lc.Not(), y] + ([xu] if xu is not None else []))
        if xu is not None:
            m.add_implication(y, xu.Not())
        m.add_bool_or([y.Not()] + cons_lits)
        return y

    def _add_transfers(self) -> None:
        """Transfer intervals on link resources, one per :class:`TransferUnit`:
        one tensor, or (aggregated) all tensors of one producer bound for one
        device, sent back to back as the simulator does (they are requested at
        the same instant); a consumer then waits for the whole unit."""
        x = self.x
        candidates = sum(len(set().union(*(set(x[c]) for c in cs)) - ({next(iter(x[u]))} if len(x[u]) == 1
                                                                       else set()))
                         for (_, u, _, cs) in self.tensors)
        agg = self.aggregated = self.aggregate if self.aggregate is not None else candidates > AGGREGATE_ABOVE
        if agg:
            by_producer: dict[int, list] = {}
            for t in self.tensors:
                by_producer.setdefault(t[1], []).append(t)
            groups = list(by_producer.items())
        else:
            groups = [(t[1], [t]) for t in self.tensors]
        link_ivs: dict[int, list] = {}
        for u, tens in groups:
            srcs = sorted(x[u])
            for e in sorted(set().union(*(set(x[c]) for (_, _, _, cs) in tens for c in cs))):
                if srcs != [e]:
                    mine = [(name, b, cs) for (name, _, b, cs) in tens if any(e in x[c] for c in cs)]
                    self._add_transfer_unit(u, e, mine, agg, link_ivs)
        for ivs in link_ivs.values():
            if len(ivs) > 1:
                self.model.add_no_overlap(ivs)

    def _add_transfer_unit(self, u: int, e: int, mine: list, agg: bool, link_ivs: dict) -> None:
        """Literal, start/end, an interval per source device (on its route's
        links) and the consumers' waits of the unit of ``mine`` from ``u`` to ``e``."""
        self._check_time()
        m, x, dn = self.model, self.x, self.problem.dev_names
        ys = [(self._recv(name, u, e, cs), name, b, cs) for (name, b, cs) in mine]
        key = (u, e) if agg else (mine[0][0], e)
        label = f"{self.problem.names[u]}:*->{dn[e]}" if agg else f"{mine[0][0]}->{dn[e]}"
        if len(ys) == 1:
            sent = ys[0][0]
        else:
            sent = m.new_bool_var(f"send[{label}]")
            for y, *_ in ys:
                m.add_implication(y, sent)
            m.add_bool_or([sent.Not()] + [y for y, *_ in ys])
        ts = m.new_int_var(0, self.horizon, f"send_start[{label}]")
        te = m.new_int_var(0, self.horizon, f"send_end[{label}]")
        m.add(ts >= self.end[u])
        unit = TransferUnit(key=key, u=u, e=e, sent=sent, own_sent=len(ys) > 1, start=ts, end=te, sources=[],
                            fixed_size=None, tensors=[(name, b, cs) for _, name, b, cs in ys])
        sizes = self._transfer_intervals(unit, ys, label, link_ivs)
        if len({id(v) if not isinstance(v, int) else v for v in sizes.values()}) == 1:
            unit.fixed_size = next(iter(sizes.values()))
            m.add(te == ts + unit.fixed_size)
        done = set()
        for y, name, b, cs in ys:
            for c in cs:
                if e in x[c] and c not in done:
                    done.add(c)
                    m.add(self.start[c] >= te).only_enforce_if([x[c][e], y])
        self.transfer_vars[key] = (sent, ts, te)
        self.units_info.append(unit)

    def _transfer_intervals(self, unit: TransferUnit, ys: list, label: str, link_ivs: dict) -> dict:
        """One optional interval per source device ``a`` of the unit, present
        iff the producer is on ``a`` and the unit is sent; its size is the sum
        over the tensors actually sent. Returns the size per source."""
        m, p, x = self.model, self.problem, self.x
        u, e, sent = unit.u, unit.e, unit.sent
        srcs = sorted(x[u])
        sizes, size_exprs = {}, {}
        for a in srcs:
            if a == e:
                continue
            coeffs = tuple(self.units(p.comm(a, e, b)) for (_, _, b, _) in ys)
            if len(ys) == 1:
                size = coeffs[0]
            elif coeffs in size_exprs:
                size = size_exprs[coeffs][0]
            else:
                size = m.new_int_var(0, sum(coeffs), f"send_size[{label} from {p.dev_names[a]}]")
                m.add(size == sum(cf * y for cf, (y, *_) in zip(coeffs, ys)))
                size_exprs[coeffs] = (size, coeffs)
            sizes[a] = size
            if len(srcs) == 1 or (len(srcs) == 2 and e in srcs):
                z = sent
            else:
                z = m.new_bool_var(f"send_from[{label} from {p.dev_names[a]}]")
                m.add_implication(z, sent)
                m.add_implication(z, x[u][a])
                m.add_bool_or([z, sent.Not(), x[u][a].Not()])
            unit.sources.append((z, a))
            iv = m.new_optional_interval_var(unit.start, size, unit.end, z, f"xfer[{label} from {p.dev_names[a]}]")
            for l in p.links[a][e]:
                link_ivs.setdefault(l, []).append(iv)
        unit.size_vars = list(size_exprs.values())
        return sizes

    def _add_delays(self) -> None:
        """Contention free: per data edge ``u -> c`` with delay ``D`` (slowest
        tensor), ``same_dev[u->c]`` (implies one device) and
        ``start(c) >= end(u) + D * (1 - same)``; with delays that differ between
        device pairs, one enforced precedence per pair instead."""
        m, p, x = self.model, self.problem, self.x
        for edge in self.graph.edges:  # the graph's edge order
            u, c = p.index[edge.src], p.index[edge.dst]
            bs = self.edge_bytes[(u, c)]
            if self.item_of[u] == self.item_of[c] or not bs:
                continue
            pairs = {(a, k): self.units(max(p.comm(a, k, b) for b in bs)) for a in x[u] for k in x[c] if a != k}
            delays = set(pairs.values())
            if len(delays) == 1:
                D = delays.pop()
                if D == 0:
                    continue
                same = m.new_bool_var(f"same_dev[{edge.src}->{edge.dst}]")
                for a, la in x[u].items():
                    lc = x[c].get(a)
                    m.add_bool_or([same.Not(), la.Not()] + ([lc] if lc is not None else []))
                m.add(self.start[c] - self.end[u] + D * same >= D)
                self.same_vars.append((same, u, c))
            else:
                for (a, k), D in pairs.items():
                    if D > 0:
                        m.add(self.start[c] >= self.end[u] + D).only_enforce_if([x[u][a], x[c][k]])

    # -- hints and solving ---------------------------------------------------------
    def canonical(self, placement) -> dict[str, str]:
        """Relabel devices inside each symmetric group in first-use order
        (:func:`solver.cpsat_hint.canonical`)."""
        return cpsat_hint.canonical(self, placement)

    def set_hint(self, plan: Plan) -> bool:
        """Replace the model's hints by ``plan`` (placement, order, and times
        recomputed in model units). Returns False if the plan does not fit."""
        return cpsat_hint.set_hint(self, plan)

    def solve(self, *, time_limit: float = 60, workers: int | None = None, seed: int = 0,
              hint: Plan | None = None, log: bool = False, deadline=None) -> Plan:
        """Solve (again) and return the Plan; see :func:`solver.cpsat.place_cpsat`."""
        return cpsat_solve.solve(self, time_limit=time_limit, workers=workers, seed=seed, hint=hint, log=log,
                                 deadline=deadline)


def _bits(mask: int) -> list[int]:
    """The set bits of ``mask``, ascending."""
    out, k = [], 0
    while mask:
        if mask & 1:
            out.append(k)
        mask >>= 1
        k += 1
    return out
