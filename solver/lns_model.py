"""The CP-SAT model of one LNS window: a set of ops (:data:`solver.lns.WINDOW` by default) of a fixed schedule.

:func:`solve_window` frees the ops of a window (placement, start times) and
keeps every other op of the incumbent schedule as a boundary condition. With
``lo`` / ``hi`` the earliest / latest incumbent start of a window op, the
other ops split in two:

* **fixed** (incumbent start ``<= hi``): they keep their device and times. On
  every device they occupy fixed intervals in the no-overlap; a window op
  waits for a fixed predecessor (its finish + the transfer, which depends on
  the window op's device: one term per device literal) and ends in time for a
  fixed successor (a *deadline*, transfer included), so a fixed op between
  two window ops stays consistent;
* **after** (incumbent start ``> hi``): they shift with the window. Their
  effect is a *tail*: ``q[j]`` = the longest path from ``j``'s start to the
  end of the incumbent (DAG, device order, transfer delays; from
  :func:`solver.search.slack`). A window op on device ``d`` is followed by its
  after-successors (transfer included) and by the first after-op on ``d``.

The objective is ``max over window ops of end + tail`` (what the incumbent's
makespan is through the window). Inside the window: one literal per (colocation unit, allowed
device) -- a unit with a member outside the window keeps its device --,
optional intervals per device (``new_optional_interval_var``), one
``add_no_overlap`` per device, and precedence with the transfer delay of each
device pair (link queueing is left to the simulator). Window ops start no
earlier than ``lo``. Times are integers of ``unit`` µs, all rounded down
(the rounded incumbent stays feasible: it is the hint).

Examples
--------
>>> from pesto.graph import OpGraph
>>> from pesto.cluster import gpus
>>> from pesto.problem import Problem
>>> g = OpGraph.from_edges({"a": 5, "b": 5, "c": 5, "d": 5}, [("a", "b", 8), ("c", "d", 8)])
>>> p = Problem.of(g, gpus(2, beta=(1.0, 0.0)))
>>> st, fi = [0.0, 5.0, 10.0, 15.0], [5.0, 10.0, 15.0, 20.0]
>>> w = solve_window(p, [0] * 4, st, fi, [20.0, 15.0, 10.0, 5.0], [0, 1, 2, 3], time_limit=5, workers=1)
>>> w.status, sorted(set(w.dev.values())), w.objective_us
('OPTIMAL', [0, 1], 10.0)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ortools.sat.python import cp_model

from pesto.deadline import Deadline
from pesto.problem import Problem

from .cpsat_solve import interleave, search

__all__ = ["WindowResult", "solve_window", "RESOLUTION"]

RESOLUTION = 200_000  # model time units over the incumbent's span (unit = makespan / RESOLUTION)
DEADLINE_SLACK = 2  # units a deadline may be missed by (float noise in the rounding)


@dataclass
class WindowResult:
    """What :func:`solve_window` found.

    status : CP-SAT's status name
    dev : window op -> device (only when a solution was found)
    key : window op -> model start (µs, comparable with the incumbent's times)
    objective_us : the model's max(end + tail), µs (None without a solution)
    incumbent_us : the same for the incumbent (from its times)
    """

    status: str
    dev: dict
    key: dict
    objective_us: float | None
    incumbent_us: float


class _Frame:
    """µs -> model units relative to ``lo``, always rounded *down*: floor is
    superadditive (floor(a + b) >= floor(a) + floor(b)), so the incumbent's
    rounded times satisfy every rounded constraint (a relaxation; the
    simulator has the last word)."""

    def __init__(self, lo: float, span: float):
        self.lo = lo
        self.unit = max(span, 1e-6) / RESOLUTION

    def t(self, x: float) -> int:
        return math.floor((x - self.lo) / self.unit)

    def size(self, x: float) -> int:
        return math.floor(x / self.unit)

    def us(self, k: int) -> float:
        return self.lo + k * self.unit


def solve_window(prob: Problem, dev: Sequence[int], start: Sequence[float], finish: Sequence[float],
                 tail: Sequence[float], window: Sequence[int], *, devices: Sequence[int] | None = None,
                 order: Sequence[Sequence[int]] | None = None, xfers: Sequence | None = None,
                 time_limit: float = 1.0,
                 wall_limit: float | None = None, workers: int = 1, seed: int = 0,
                 log: bool = False, deadline: Deadline | None = None) -> WindowResult:
    """Place and time the ``window`` ops of an incumbent schedule exactly.

    Parameters
    ----------
    prob : the problem arrays
    dev, start, finish : the incumbent's device and times per op
    tail : per op, longest path from its start to the end of the incumbent
    window : op indices to free
    devices : the devices window ops may move to (default: all they allow)
    order : the incumbent's per-device order (default: by start time); the
        first op after the window on each device gives that device's tail
    xfers : the incumbent's transfers ``(producer, tensor, bytes, dst, start,
        finish, consumers)`` (:class:`pesto.engine.ReplayResult`); with them, and a
        cluster whose links contend, transfers hold their route's links
    time_limit : CP-SAT's deterministic time limit (about seconds; what
        makes ``workers=1`` with a fixed ``seed`` repeatable)
    wall_limit : seconds, a safety net (default ``10 * time_limit``); when it
        stops the search first, the answer may vary from run to run
    deadline : pesto.deadline.Deadline, optional
        The solve's clock: an interrupt stops the search at once, and the
        search's deterministic time is charged to it

    Returns
    -------
    WindowResult
    """
    wm = _WindowModel(prob, dev, start, finish, tail, window, devices, order, xfers)
    wall = 10 * time_limit if wall_limit is None else wall_limit
    return wm.solve(time_limit=time_limit, wall_limit=wall, workers=workers, seed=seed, log=log, deadline=deadline)


class _WindowModel:
    def __init__(self, prob, dev, start, finish, tail, window, devices, order, xfers=None):
        self.p, self.dev, self.st, self.fi, self.tail = prob, dev, start, finish, tail
        self.W = list(window)
        self.inw = set(self.W)
        self.lo = min(start[i] for i in self.W)
        self.hi = max(start[i] for i in self.W)
        span = max(max(finish), self.hi) - self.lo
        self.f = _Frame(self.lo, span + max(tail[i] for i in self.W))
        self.devset = set(range(prob.nd)) if devices is None else set(devices)
        self.m = cp_model.CpModel()
        self._choices()
        self._variables(max((x[5] for x in xfers or ()), default=0.0))
        self._devices(order)
        self._precedences()
        self.obj = self.m.new_int_var(0, 2 * self.horizon + self.f.size(max(tail)) + 10, "obj")
        self.link_hints: list = []
        if xfers is not None and prob.n_links:
            self._links(xfers)
        self._objective()

    def _choices(self) -> None:
        """Allowed devices per window op (per unit: fixed if the unit is not whole in the window)."""
        p, dev = self.p, self.dev
        self.choice: dict[int, list[int]] = {}
        for i in self.W:
            whole = all(j in self.inw for j in p.members[p.unit[i]])
            ds = [d for d in p.allowed[i] if d in self.devset] if whole else []
            self.choice[i] = ds if ds and dev[i] in ds else [dev[i]]

    def _variables(self, last_xfer: float) -> None:
        p, f, m = self.p, self.f, self.m
        self.dur = {i: {d: f.size(p.dur[i][d]) for d in self.choice[i]} for i in self.W}
        work = sum(max(ds.values()) for ds in self.dur.values())
        # room for every window op and transfer after the last fixed op or transfer
        self.horizon = f.t(max(max(self.fi), last_xfer)) + work + 2 * f.size(self._max_comm_total()) + 10
        self.x: dict[int, dict[int, object]] = {}
        unit_lits: dict[int, dict[int, object]] = {}
        self.s, self.e = {}, {}
        for i in self.W:
            u = p.unit[i]
            if len(self.choice[i]) == 1:
                self.x[i] = {self.choice[i][0]: None}  # None: the device is fixed
            else:
                if u not in unit_lits:
                    unit_lits[u] = {d: m.new_bool_var(f"on[{i}@{d}]") for d in self.choice[i]}
                    m.add_exactly_one(unit_lits[u].values())
                self.x[i] = unit_lits[u]
            self.s[i] = m.new_int_var(0, self.horizon, f"s[{i}]")
            self.e[i] = m.new_int_var(0, self.horizon, f"e[{i}]")
            m.add(self.e[i] == self.s[i] + self._pick(i, self.dur[i]))

    def _pick(self, i: int, vals: dict):
        """``vals[d]`` of window op ``i``'s device, as a constant or a linear expression."""
        x = self.x[i]
        if len(x) == 1 or len(set(vals[d] for d in x)) == 1:
            return vals[next(iter(x))]
        return sum(vals[d] * lit for d, lit in x.items())

    def _max_comm_total(self) -> float:
        p = self.p
        tot = 0.0
        for i in self.W:
            for _, ts in p.ins[i]:
                b = sum(x for _, x in ts)
                tot += max((p.comm(a, c, b) for a in range(p.nd) for c in range(p.nd)), default=0.0)
        return tot

    def _devices(self, order) -> None:
        """Optional intervals of window ops + fixed intervals of fixed ops, one no-overlap per device;
        the first after-op per device (its tail)."""
        p, f, m, st, fi = self.p, self.f, self.m, self.st, self.fi
        ivs: dict[int, list] = {d: [] for d in range(p.nd)}
        for i in self.W:
            for d, lit in self.x[i].items():
                size = self.dur[i][d]
                if lit is None:
                    ivs[d].append(m.new_interval_var(self.s[i], size, self.e[i], f"run[{i}@{d}]"))
                else:
                    ivs[d].append(m.new_optional_interval_var(self.s[i], size, self.e[i], lit, f"run[{i}@{d}]"))
        used = {d for i in self.W for d in self.x[i]}
        if order is None:
            order = [[] for _ in range(p.nd)]
            for i in sorted(range(p.n), key=lambda k: st[k]):
                order[self.dev[i]].append(i)
        self.after_tail = {}
        for d in used:
            for j in order[d]:
                if j in self.inw:
                    continue
                if st[j] > self.hi:
                    self.after_tail[d] = self.tail[j]
                    break
                if fi[j] > self.lo and fi[j] > st[j]:
                    a = max(0, f.t(st[j]))
                    b = f.t(fi[j])
                    if b > a:
                        ivs[d].append(m.new_fixed_size_interval_var(a, b - a, f"fixed[{j}]"))
        for d in used:
            if len(ivs[d]) > 1:
                m.add_no_overlap(ivs[d])

    def _precedences(self) -> None:
        """Window-window edges with the delay of each device pair; releases and deadlines from fixed ops."""
        p, f, m, dev = self.p, self.f, self.m, self.dev
        self.tail_terms: dict[int, dict[int, float]] = {i: {} for i in self.W}
        for j in self.W:
            rel = {d: 0 for d in self.x[j]}
            for i, ts in p.ins[j]:
                b = sum(x for _, x in ts)
                if i in self.inw:
                    m.add(self.s[j] >= self.e[i])
                    for a, la in self.x[i].items():
                        for c, lc in self.x[j].items():
                            c_ab = f.size(p.comm(a, c, b))
                            if a != c and c_ab > 0:
                                lits = [x for x in (la, lc) if x is not None]
                                ct = m.add(self.s[j] >= self.e[i] + c_ab)
                                if lits:
                                    ct.only_enforce_if(lits)
                else:  # a fixed predecessor (it started before the window op)
                    for c in self.x[j]:
                        rel[c] = max(rel[c], f.t(self.fi[i]) + f.size(p.comm(dev[i], c, b)))
            self._bounded(j, self.s[j], rel, lower=True)
        for i in self.W:
            dl: dict[int, int] = {}
            for j, b in p.outs[i]:
                if j in self.inw:
                    continue
                if self.st[j] <= self.hi:  # fixed: a deadline
                    for a in self.x[i]:
                        v = f.t(self.st[j]) - f.size(p.comm(a, dev[j], b)) + DEADLINE_SLACK
                        dl[a] = min(dl.get(a, v), v)
                else:  # after: a tail
                    for a in self.x[i]:
                        v = p.comm(a, dev[j], b) + self.tail[j]
                        self.tail_terms[i][a] = max(self.tail_terms[i].get(a, 0.0), v)
            if dl:
                full = {a: dl.get(a, self.horizon) for a in self.x[i]}
                self._bounded(i, self.e[i], full, lower=False)

    def _links(self, xfers) -> None:
        """Transfers on contended links: the incumbent's transfers that no window
        op sends or receives are fixed intervals; a producer with a window end
        on some out-edge gets, per device pair with a route, one optional
        interval (present when it is there and a consumer is on the other
        device) after its end and before each such consumer (a fixed consumer:
        its deadline; a later one: its tail)."""
        p, f, m, inw = self.p, self.f, self.m, self.inw
        ivs: dict[int, list] = {l: [] for l in range(p.n_links)}
        sent: dict[tuple, tuple] = {}  # (producer, dst) -> incumbent (first start, last finish)
        for i, t, nb, dd, s0, f0, js in xfers:
            a0, b0 = sent.get((i, dd), (s0, f0))
            sent[(i, dd)] = (min(a0, s0), max(b0, f0))
            if i in inw or self.st[i] > self.hi or f0 <= self.lo or any(j in inw for j in js):
                continue
            a, b = max(0, f.t(s0)), f.t(f0)
            if b > a:
                for l in p.links[self.dev[i]][dd]:
                    ivs[l].append(m.new_fixed_size_interval_var(a, b - a, f"xfer[{i}:{t}>{dd}]"))
        producers = sorted(set(self.W) | {i for j in self.W for i, _ in p.ins[j]})
        for i in producers:
            outs = [(j, b) for j, b in p.outs[i] if b > 0 and (i in inw or j in inw)]
            if outs:
                self._sends(i, outs, sent, ivs)
        for l, lst in ivs.items():
            if len(lst) > 1:
                m.add_no_overlap(lst)

    def _sends(self, i: int, outs, sent: dict, ivs: dict) -> None:
        p, f, m, inw = self.p, self.f, self.m, self.inw
        xi = self.x[i] if i in inw else {self.dev[i]: None}
        for a, la in xi.items():
            for c in range(p.nd):
                cons = [(j, (self.x[j] if j in inw else {self.dev[j]: None})[c], b) for j, b in outs
                        if c in (self.x[j] if j in inw else (self.dev[j],))]
                size = f.size(p.comm(a, c, max((b for _, _, b in cons), default=0)))
                if a == c or not cons or size <= 0 or not p.links[a][c]:
                    continue
                old = sent.get((i, c)) if a == self.dev[i] else None
                if i not in inw and old is not None:  # a fixed producer's transfer: kept, a release
                    for j, lc, _ in cons:
                        ct = m.add(self.s[j] >= f.t(old[1]))
                        if lc is not None:
                            ct.only_enforce_if(lc)
                    continue
                on = self._present(la, [lc for _, lc, _ in cons], f"send[{i}@{a}>{c}]")
                lo = 0 if i in inw else max(0, f.t(self.fi[i]))
                st = m.new_int_var(lo, self.horizon, f"xs[{i}@{a}>{c}]")
                en = m.new_int_var(lo, self.horizon + size, f"xe[{i}@{a}>{c}]")
                iv = (m.new_interval_var(st, size, en, "xfer") if on is None
                      else m.new_optional_interval_var(st, size, en, on, "xfer"))
                for l in p.links[a][c]:
                    ivs[l].append(iv)
                if i in inw:
                    self._when(m.add(st >= self.e[i]), [on])
                for j, lc, _ in cons:
                    if j in inw:
                        self._when(m.add(self.s[j] >= en), [on, lc])
                    elif self.st[j] <= self.hi:
                        self._when(m.add(en <= f.t(self.st[j]) + DEADLINE_SLACK), [on])
                    else:
                        self._when(m.add(self.obj >= en + f.size(self.tail[j])), [on])
                here = a == self.dev[i] and any(self.dev[j] == c for j, _, _ in cons)
                self.link_hints.append((on, here, st, en, size, f.t(old[0]) if here and old else None, i))

    def _present(self, la, lcs: list, name: str):
        """A literal true iff ``la`` and some of ``lcs`` (None: always true); None if always true."""
        if la is None and any(lc is None for lc in lcs):
            return None
        if la is not None and all(lc is None for lc in lcs):
            return la
        m = self.m
        on = m.new_bool_var(name)
        for lc in lcs:
            m.add_bool_or([x.Not() for x in (la, lc) if x is not None] + [on])
        if la is not None:
            m.add_implication(on, la)
        if all(lc is not None for lc in lcs):
            m.add_bool_or([on.Not()] + lcs)
        return on

    @staticmethod
    def _when(ct, lits) -> None:
        lits = [x for x in lits if x is not None]
        if lits:
            ct.only_enforce_if(lits)

    def _bounded(self, i: int, var, bound: dict, *, lower: bool) -> None:
        """``var >= / <= bound[device of i]``."""
        expr = self._pick(i, bound)
        if lower:
            self.m.add(var >= expr)
        else:
            self.m.add(var <= expr)

    def _objective(self) -> None:
        f, m = self.f, self.m
        self.tails = {}
        for i in self.W:
            tails = self.tails[i] = {}
            for d in self.x[i]:
                t = max(self.tail_terms[i].get(d, 0.0), self.after_tail.get(d, 0.0))
                tails[d] = f.size(t)
            m.add(self.obj >= self.e[i] + self._pick(i, tails))
        # max first; the sum of ends (at most n * horizon) only breaks ties
        m.minimize(self.obj)  # a tie-break on the sum of ends slowed single-worker search down
        self._hint()

    def _hint(self) -> None:
        f, m = self.f, self.m
        f, inc = self.f, 0
        hinted = set()  # a unit's literals are shared by its members
        ends: dict[int, int] = {}
        for i in self.W:
            for d, lit in self.x[i].items():
                if lit is not None and lit.index not in hinted:
                    hinted.add(lit.index)
                    m.add_hint(lit, d == self.dev[i])
            s = max(0, min(self.horizon, f.t(self.st[i])))
            m.add_hint(self.s[i], s)
            e = ends[i] = min(self.horizon, s + self.dur[i][self.dev[i]])
            m.add_hint(self.e[i], e)
            inc = max(inc, e + self.tails[i][self.dev[i]])
        for on, here, st, en, size, hint, i in self.link_hints:
            if on is not None and on.index not in hinted:
                hinted.add(on.index)
                m.add_hint(on, here)
            if hint is None:  # not sent in the incumbent: right after its producer
                hint = ends.get(i, max(0, self.f.t(self.fi[i])))
            m.add_hint(st, hint)
            m.add_hint(en, hint + size)
        m.add_hint(self.obj, inc)
        self.incumbent_us = f.us(inc)

    def solve(self, *, time_limit: float, wall_limit: float, workers: int, seed: int,
              log: bool, deadline: Deadline | None = None) -> WindowResult:
        solver = cp_model.CpSolver()
        prm = solver.parameters
        prm.max_time_in_seconds = float(wall_limit)
        prm.max_deterministic_time = float(time_limit)
        prm.num_workers = int(workers)
        prm.random_seed = int(seed)
        prm.log_search_progress = bool(log)
        prm.catch_sigint_signal = False
        if deadline is not None and deadline.deterministic:
            interleave(prm)  # several workers, one fixed schedule of them
        code = search(solver, self.m, deadline)
        if deadline is not None:
            deadline.charge(solver.deterministic_time)
        name = solver.status_name(code)
        if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return WindowResult(name, {}, {}, None, self.incumbent_us)
        dev = {i: next(d for d, lit in self.x[i].items() if lit is None or solver.boolean_value(lit))
               for i in self.W}
        key = {i: self.f.us(solver.value(self.s[i])) for i in self.W}
        return WindowResult(name, dev, key, self.f.us(solver.value(self.obj)), self.incumbent_us)
