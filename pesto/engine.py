"""The scheduling engine: one event replay and one incremental timeline.

Both work on the index arrays of :class:`~pesto.problem.Problem` and share one
model of a training step:

* an op runs on one device, one op at a time per device, for ``dur[i][d]``;
* a tensor goes once per (tensor, remote device), however many consumers it
  has there; tensors of zero bytes and control edges cost no transfer;
* link model ``"fcfs"``: each link resource carries one transfer at a time,
  first come first served, and a transfer holds every link of its route;
  ``"free"``: transfers never queue (the default follows
  ``cluster.contention_free``).

:func:`replay` is the discrete-event simulator (what :func:`pesto.simulate.simulate`
wraps): transfers are requested when their producer ends and a device picks
its next op by a policy -- ``"order"`` (a fixed per-device order),
``"fifo"`` (TensorFlow's default: in the order ops became ready) or
``"priority"`` (a list scheduler: the ready op of largest priority, chosen
only after every op ready at that instant is queued).

:class:`Timeline` is the incremental schedule a list-scheduling placer builds
op by op: ``ready(i, d)`` prices op ``i`` on device ``d`` against what is
committed so far, ``earliest(i, d, insert=False)`` adds the device's
availability (or HEFT's idle-gap insertion), ``commit(i, d, start)`` books it.

Examples
--------
>>> from pesto.graph import OpGraph
>>> from pesto.cluster import gpus
>>> from pesto.problem import Problem
>>> g = OpGraph.from_edges({"a": 2, "b": 3, "c": 4}, [("a", "b", 100), ("a", "c", 100)])
>>> p = Problem.of(g, gpus(2, beta=(1.0, 0.01)))     # 100 bytes: 2 µs
>>> run = replay(p, [0, 0, 1])
>>> run.start, run.finish, run.makespan
([0.0, 2.0, 4.0], [2.0, 5.0, 8.0], 8.0)
>>> tl = Timeline(p)
>>> for i, d in ((0, 0), (1, 0), (2, 1)):
...     tl.commit(i, d, tl.earliest(i, d))
>>> tl.start, tl.makespan()
([0.0, 2.0, 4.0], 8.0)
"""
from __future__ import annotations

import heapq
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

from .errors import InvalidPlanError
from .problem import Problem

__all__ = ["Run", "replay", "Timeline", "POLICIES", "LINK_MODELS", "INSERTION_SCAN"]

POLICIES = ("order", "fifo", "priority")
LINK_MODELS = ("fcfs", "free")
INSERTION_SCAN = 256  # idle gaps examined per insertion before appending (keeps HEFT ~O(V log V))
EPS = 1e-9


@dataclass
class Run:
    """What :func:`replay` returns (index arrays; times in µs).

    Attributes
    ----------
    start, finish : per op
    ran : per device, the ops in the order they ran
    xfers : per transfer ``(producer, tensor, bytes, dst device, start, finish,
        consumers on dst)``, in the order they were requested
    finished : ops in the order their finish was processed (the order
        transfers were requested in)
    makespan : when the last op or transfer ends
    """

    start: list
    finish: list
    ran: list
    xfers: list
    finished: list
    makespan: float


def _route_links(prob: Problem, links: str | None):
    """Per (src, dst) device pair, the link indices a transfer holds."""
    if links is None:
        return prob.links
    if links == "fcfs":
        return prob.route_links
    if links == "free":
        return [[()] * prob.nd for _ in range(prob.nd)]
    raise ValueError(f"links must be one of {LINK_MODELS} or None, got {links!r}")


def sends(prob: Problem, dev: Sequence[int], links: str | None = None) -> list:
    """What each producer sends where under placement ``dev``, once per
    (tensor, remote device): ``sends[i]`` is None or a list of ``(tensor,
    bytes, dst, consumers there, duration, link indices)`` in request order
    (tensor order, then the order consumers are listed)."""
    route = _route_links(prob, links)
    b0, b1 = prob.beta0, prob.beta1
    out: list = [None] * prob.n
    for t, (_, i, nbytes, cons) in enumerate(prob.tensors):
        if nbytes <= 0 or not cons:
            continue
        di = dev[i]
        by_dev: dict[int, list[int]] = {}
        for j in cons:
            dj = dev[j]
            if dj != di:
                lst = by_dev.get(dj)
                if lst is None:
                    by_dev[dj] = [j]
                else:
                    lst.append(j)
        if by_dev:
            lst = out[i]
            if lst is None:
                lst = out[i] = []
            for dj, js in by_dev.items():
                lst.append((t, nbytes, dj, js, b0[di][dj] + b1[di][dj] * nbytes, route[di][dj]))
    return out


def replay(prob: Problem, dev: Sequence[int], *, policy: str = "fifo",
           order: Sequence[Sequence[int]] | None = None, priority: Sequence[float] | None = None,
           links: str | None = None) -> Run:
    """Replay one step of ``prob`` under placement ``dev`` (device index per op).

    Parameters
    ----------
    policy : {"order", "fifo", "priority"}
        How a free device picks its next op (see the module docstring).
    order : per device, op indices (``policy="order"``): each op exactly once,
        on its own device.
    priority : per op, larger runs first (``policy="priority"``; ties: the op
        ready first).
    links : {"fcfs", "free"}, optional
        Link model; default: the cluster's.

    Raises
    ------
    InvalidPlanError
        The order does not list every op exactly once, or deadlocks.

    Examples
    --------
    >>> from pesto.graph import OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph.from_edges({"a": 1, "b": 2, "c": 3}, [])
    >>> p = Problem.of(g, gpus(1))
    >>> replay(p, [0, 0, 0], policy="order", order=[[2, 0, 1]]).start
    [3.0, 4.0, 0.0]
    >>> replay(p, [0, 0, 0], policy="priority", priority=[0, 5, 1]).start
    [5.0, 0.0, 2.0]
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    if (order is not None) != (policy == "order"):
        raise ValueError("order= goes with policy='order' (and only with it)")
    if (priority is not None) != (policy == "priority"):
        raise ValueError("priority= goes with policy='priority' (and only with it)")
    n = prob.n
    dur = [row[d] for row, d in zip(prob.dur, dev)]
    if policy == "order":
        queues = [list(q) for q in order]
        if sum(map(len, queues)) != n or len({j for q in queues for j in q}) != n:
            raise InvalidPlanError(["the plan's order does not list every op exactly once"])
    elif policy == "fifo":
        queues = [deque() for _ in range(prob.nd)]
    else:
        if len(priority) != n:
            raise ValueError(f"priority has {len(priority)} values for {n} ops")
        queues = [[] for _ in range(prob.nd)]
    prio = None if priority is None else [-float(x) for x in priority]
    return _run(prob, dev, dur, sends(prob, dev, links), policy, queues, prio)


def _run(prob: Problem, dev, dur, send, policy, queues, prio) -> Run:
    # The hot loop of the simulator, kept in one function (about 110 lines):
    # 40k-op graphs replay in well under a second only with every per-event
    # step inlined and every array bound to a local.
    n, nd = prob.n, prob.nd
    by_order = policy == "order"
    if by_order:
        qpos = [0] * nd
        qlen = [len(q) for q in queues]
    seq_no = 0
    is_ready = [False] * n
    dev_free = [True] * nd
    start = [0.0] * n
    finish = [0.0] * n
    ran: list[list[int]] = [[] for _ in range(nd)]
    xfers: list = []
    fin: list = []
    succ = prob.succ
    waiting = [len(p) for p in prob.pred]
    arrive = [0.0] * n  # latest remote input arrival per op
    link_free = [0.0] * prob.n_links
    # events: (time, kind, op); kind 0 = finish, 1 = ready, 2 = a device picks
    # (priority policy): at equal times finishes come first, so a freed device
    # sees every op ready by then, and picks after every op ready then is queued
    push, pop = heapq.heappush, heapq.heappop
    events: list = [(0.0, 1, i) for i in range(n) if waiting[i] == 0]
    heapq.heapify(events)
    append_fin = fin.append

    while events:
        now, kind, i = pop(events)
        if kind == 2:  # priority: device i picks its best ready op
            q = queues[i]
            if dev_free[i] and q:
                j = pop(q)[2]
                dev_free[i] = False
                start[j] = now
                f = now + dur[j]
                finish[j] = f
                ran[i].append(j)
                push(events, (f, 0, j))
            continue
        if kind:
            d = dev[i]
            if prio is not None:
                push(queues[d], (prio[i], seq_no, i))
                seq_no += 1
                if dev_free[d]:
                    push(events, (now, 2, d))
                continue
            if by_order:
                is_ready[i] = True
                if not dev_free[d] or queues[d][qpos[d]] != i:
                    continue
                qpos[d] += 1
            elif not dev_free[d]:
                queues[d].append(i)
                continue
            dev_free[d] = False
            start[i] = now
            f = now + dur[i]
            finish[i] = f
            ran[d].append(i)
            push(events, (f, 0, i))
            continue
        append_fin(i)
        d = dev[i]
        lst = send[i]
        if lst is not None:
            for t, nbytes, dd, js, length, route in lst:
                s = now
                for l in route:
                    if link_free[l] > s:
                        s = link_free[l]
                f = s + length
                for l in route:
                    link_free[l] = f
                xfers.append((i, t, nbytes, dd, s, f, js))
                for j in js:
                    if f > arrive[j]:
                        arrive[j] = f
        for j in succ[i]:
            w = waiting[j] - 1
            waiting[j] = w
            if w == 0:
                a = arrive[j]
                push(events, (a if a > now else now, 1, j))
        # the device is free: start the next op it may run
        if by_order:
            p = qpos[d]
            if p < qlen[d] and is_ready[queues[d][p]]:
                j = queues[d][p]
                qpos[d] = p + 1
            else:
                dev_free[d] = True
                continue
        elif prio is not None:
            dev_free[d] = True
            if queues[d]:
                push(events, (now, 2, d))
            continue
        else:
            q = queues[d]
            if not q:
                dev_free[d] = True
                continue
            j = q.popleft()
        start[j] = now
        f = now + dur[j]
        finish[j] = f
        ran[d].append(j)
        push(events, (f, 0, j))

    if len(fin) < n:
        names = prob.names
        stuck = [f"{prob.dev_names[d]}: {names[queues[d][qpos[d]]]}" for d in range(nd)
                 if by_order and qpos[d] < qlen[d]]
        raise InvalidPlanError([f"the order deadlocks (it contradicts the graph); waiting heads: {stuck[:4]}"])
    makespan = max(finish, default=0.0)
    for x in xfers:
        if x[5] > makespan:
            makespan = x[5]
    return Run(start, finish, ran, xfers, fin, makespan)


class Timeline:
    """An incremental schedule for list-scheduling placers.

    Ops are committed one at a time (``commit(i, d, start)``), predecessors
    first. A transfer is booked on its route's links when the first consumer
    on its destination is committed (FCFS in commit order, like the
    simulator's queue when commits follow time); ``ready`` prices a transfer
    not yet booked behind the links' current bookings.

    Parameters
    ----------
    problem : the arrays
    dur : ``dur[i][d]`` overriding the problem's durations (e.g. integer model units)
    comm : ``comm(a, b, nbytes) -> time`` overriding the routes' ``beta0 + beta1 * bytes``
        (called for tensors of positive bytes only)
    links : {"fcfs", "free"}, optional; default: the cluster's link model
    placement : device per op, optional: the final placement when it is known
        in advance. Transfers are then booked when their *producer* is
        committed, in the simulator's request order (committing ops in the
        order a replay finished them reproduces the replay's times).
    bundle : bool
        With ``placement``: one transfer per (producer, remote device) carrying
        all the producer's tensors consumed there, taking the sum of their
        times (CP-SAT's transfer model).

    Attributes
    ----------
    start, finish, place : per op (``place[i] == -1`` until committed)
    avail : per device, when its last committed op ends

    Examples
    --------
    >>> from pesto.graph import OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph.from_edges({"a": 2, "b": 1, "c": 1}, [("a", "c", 100)])
    >>> tl = Timeline(Problem.of(g, gpus(2, beta=(1.0, 0.01))))
    >>> tl.commit(0, 0, 0.0); tl.commit(1, 1, tl.earliest(1, 1))
    >>> tl.ready(2, 1), tl.earliest(2, 0), tl.earliest(2, 1)   # c on GPU:1 waits 2 µs for a's tensor
    (4.0, 2.0, 4.0)
    """

    def __init__(self, problem: Problem, *, dur=None, comm: Callable | None = None,
                 links: str | None = None, placement: Sequence[int] | None = None,
                 bundle: bool = False):
        p = self.p = problem
        if bundle and placement is None:
            raise ValueError("bundle=True needs placement= (the destinations of every bundle)")
        self.dur = p.dur if dur is None else dur
        self.start = [0.0] * p.n
        self.finish = [0.0] * p.n
        self.place = [-1] * p.n
        self.avail = [0.0] * p.nd
        self.arrive: dict = {}  # (tensor, device) -> arrival; (producer, device) when bundled
        self.link_free = [0.0] * p.n_links
        self.route = _route_links(p, links)
        self._comm = comm
        self.bundle = bundle
        self.sends = None if placement is None else self._plan_sends(placement)
        self._starts: list[list[float]] = [[] for _ in range(p.nd)]
        self._ends: list[list[float]] = [[] for _ in range(p.nd)]
        self._gap: dict = {}  # d -> (op, start, position) of the last insertion scan

    def comm(self, a: int, b: int, nbytes: int) -> float:
        """Transfer time of ``nbytes`` from ``a`` to ``b`` (0 on one device or for 0 bytes)."""
        if a == b or nbytes <= 0:
            return 0.0
        return self._comm(a, b, nbytes) if self._comm is not None else self.p.comm(a, b, nbytes)

    def _plan_sends(self, placement) -> list:
        """Per producer, ``(key, dst, duration)`` of each transfer it will send."""
        out: list = [[] for _ in range(self.p.n)]
        for i, lst in enumerate(sends(self.p, placement)):
            for t, nbytes, dj, _, _, _ in lst or ():
                key = (i, dj) if self.bundle else (t, dj)
                c = self.comm(placement[i], dj, nbytes)
                if self.bundle and out[i] and any(k == key for k, _, _ in out[i]):
                    out[i] = [(k, e, x + c if k == key else x) for k, e, x in out[i]]
                else:
                    out[i].append((key, dj, c))
        return out

    def ready(self, i: int, d: int) -> float:
        """When every input of op ``i`` is on device ``d`` (its predecessors committed)."""
        p = self.p
        place, finish, arrive, lf, route = self.place, self.finish, self.arrive, self.link_free, self.route
        fixed = self._comm is None and self.sends is None
        b0, b1 = p.beta0, p.beta1
        r = 0.0
        for q, ts in p.ins[i]:
            t = finish[q]
            qd = place[q]
            if qd != d:
                for tid, b in ts:
                    if b:
                        a = arrive.get((q, d) if self.bundle else (tid, d))
                        if a is None:
                            # queued on links: behind the producer's earlier tensors
                            # (t); contention free: from the producer's end
                            rl = route[qd][d]
                            s = t if rl else finish[q]
                            for l in rl:
                                if lf[l] > s:
                                    s = lf[l]
                            # (s + beta0) + beta1 * b: the placers' estimate bit for bit
                            # (the rounding decides ties; commit books s + (beta0 + beta1 * b))
                            a = s + b0[qd][d] + b1[qd][d] * b if fixed else s + self.comm(qd, d, b)
                        if a > t:
                            t = a
            if t > r:
                r = t
        return r

    def earliest(self, i: int, d: int, insert: bool = False) -> float:
        """Earliest start of op ``i`` on ``d``: after its inputs arrive and,
        by default, after the device's last committed op; with ``insert``, in
        the first idle gap long enough (HEFT's insertion policy; at most
        ``INSERTION_SCAN`` gaps are examined, then it goes last)."""
        r = self.ready(i, d)
        if not insert:
            a = self.avail[d]
            return a if a > r else r
        st, en = self._starts[d], self._ends[d]
        w = self.dur[i][d]
        k = bisect_right(en, r)
        t = r
        stop = min(len(st), k + INSERTION_SCAN)
        for m in range(k, stop):
            if st[m] - t >= w - EPS:
                self._gap[d] = (i, t, m)
                return t
            if en[m] > t:
                t = en[m]
        if stop < len(st):
            t = max(t, en[-1])
        self._gap[d] = (i, t, len(st))
        return t

    def commit(self, i: int, d: int, start: float) -> None:
        """Run op ``i`` on device ``d`` from ``start``; book its transfers."""
        p = self.p
        self.place[i] = d
        self.start[i] = start
        f = self.finish[i] = start + self.dur[i][d]
        if f > self.avail[d]:
            self.avail[d] = f
        self._record(i, d, start, f)
        if self.sends is not None:
            for key, dj, c in self.sends[i]:
                self._book(key, d, dj, f, c)
            return
        for q, ts in p.ins[i]:
            qd = self.place[q]
            if qd != d:
                for tid, b in ts:
                    if b and (tid, d) not in self.arrive:
                        self._book((tid, d), qd, d, self.finish[q], self.comm(qd, d, b))

    def _book(self, key, a: int, b: int, t: float, length: float) -> None:
        lf = self.link_free
        route = self.route[a][b]
        for l in route:
            if lf[l] > t:
                t = lf[l]
        f = self.arrive[key] = t + length
        for l in route:
            lf[l] = f

    def _record(self, i: int, d: int, s: float, f: float) -> None:
        st, en = self._starts[d], self._ends[d]
        gap = self._gap.pop(d, None)
        if gap is not None and gap[0] == i and gap[1] == s:
            pos = gap[2]
        elif not en or s >= en[-1]:
            pos = len(st)
        else:
            pos = bisect_right(st, s)
        st.insert(pos, s)
        en.insert(pos, f)

    def makespan(self) -> float:
        """When the last committed op ends (transfers to nobody do not count)."""
        return max(self.finish, default=0.0)
