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

from bisect import bisect_right
from functools import cached_property
from typing import Callable, Sequence

import numpy as np
from numba import njit

from .errors import InvalidPlanError
from .cluster import gpus
from .graph import OpGraph
from .kernels import FlatArrays, compiled, csr, kernel, placed_ranks
from .problem import Problem

__all__ = ["ReplayResult", "replay", "Timeline", "POLICIES", "LINK_MODELS", "INSERTION_SCAN"]

POLICIES = ("order", "fifo", "priority")
LINK_MODELS = ("fcfs", "free")
INSERTION_SCAN = 256  # idle gaps examined per insertion before appending (keeps HEFT ~O(V log V))
EPS = 1e-9


class ReplayResult:
    """What :func:`replay` returns (times in µs).

    The engine fills numpy arrays; the list views below are built on first
    read (a search that only needs ``makespan`` or the arrays never pays for
    them).

    Attributes
    ----------
    start, finish : list, per op
    ran : list, per device, the ops in the order they ran
    xfers : list, per transfer ``(producer, tensor, bytes, dst device, start,
        finish, consumers on dst)``, in the order they were requested
    finished : list, ops in the order their finish was processed (the order
        transfers were requested in)
    makespan : float, when the last op or transfer ends
    start_array, finish_array : the same times as float64 arrays
    """

    def __init__(self, arrays: "_Arrays", send: tuple, out: tuple):
        (self.start_array, self.finish_array, ran, self._ran_ptr, self._fin,
         self._xk, self._xs, self._xf, makespan) = out
        self._ran = ran
        self._arrays, self._send = arrays, send
        self.makespan = float(makespan)

    @cached_property
    def start(self) -> list:
        return self.start_array.tolist()

    @cached_property
    def finish(self) -> list:
        return self.finish_array.tolist()

    @cached_property
    def ran(self) -> list:
        ran, ptr = self._ran.tolist(), self._ran_ptr.tolist()
        return [ran[a:b] for a, b in zip(ptr, ptr[1:])]

    @cached_property
    def finished(self) -> list:
        return self._fin.tolist()

    @cached_property
    def xfers(self) -> list:
        ptr, t, dst, jptr, js = (a.tolist() for a in self._send[:5])
        del ptr
        nbytes = self._arrays.tbytes
        return [(self._arrays.producer[t[k]], t[k], nbytes[t[k]], dst[k], s, f, js[jptr[k]:jptr[k + 1]])
                for k, s, f in zip(self._xk.tolist(), self._xs.tolist(), self._xf.tolist())]


class _Arrays:
    """A Problem's graph as flat arrays for the compiled engine (built once
    per Problem and link model, cached on the Problem).

    On top of :class:`~pesto.kernels.FlatArrays` (adjacency, durations, comm
    fits), CSR tables: per producer its tensors that cost a
    transfer (positive bytes, some consumer; ascending tensor id); consumers
    per tensor; the links of each (src, dst) route under the link model.
    """

    def __init__(self, prob: Problem, links: str | None):
        self.n, self.nd = prob.n, prob.nd
        self.flat = flat = FlatArrays.of(prob)
        self.dur, self.succ_ptr, self.succ_idx, self.npred = flat.dur, flat.succ_ptr, flat.succ_idx, flat.npred
        self.b0, self.b1 = flat.b0, flat.b1
        tens = prob.tensors
        self.producer = [i for _, i, _, _ in tens]
        self.tbytes = [b for _, _, b, _ in tens]
        self.tbytes_f = np.array(self.tbytes, dtype=np.float64)
        self.cons_ptr, self.cons_idx = csr([c for _, _, _, c in tens])
        by_prod: list[list[int]] = [[] for _ in range(prob.n)]
        for t, (_, i, b, cons) in enumerate(tens):
            if b > 0 and cons:
                by_prod[i].append(t)
        self.tp_ptr, self.tp_idx = csr(by_prod)
        route = _route_links(prob, links)
        self.route = route
        self.r_ptr, self.r_idx = csr([route[a][b] for a in range(prob.nd) for b in range(prob.nd)])
        self.n_links = prob.n_links

    @staticmethod
    def of(prob: Problem, links: str | None) -> "_Arrays":
        cache = prob.__dict__.setdefault("_engine_arrays", {})
        hit = cache.get(links)
        if hit is None:
            hit = cache[links] = _Arrays(prob, links)
        return hit

    def sends(self, dev: np.ndarray) -> tuple:
        """The compiled :func:`_group_sends` tables of placement ``dev``."""
        return kernel(_group_sends, dev.shape[0])(dev, self.nd, self.tp_ptr, self.tp_idx,
                                                  self.tbytes_f, self.cons_ptr, self.cons_idx,
                                                  self.b0, self.b1)


def _route_links(prob: Problem, links: str | None):
    """Per (src, dst) device pair, the link indices a transfer holds."""
    if links is None:
        return prob.links
    if links == "fcfs":
        return prob.route_links
    if links == "free":
        return [[()] * prob.nd for _ in range(prob.nd)]
    raise ValueError(f"links must be one of {LINK_MODELS} or None, got {links!r}")


def _dev_array(prob: Problem, dev) -> np.ndarray:
    d = np.asarray(dev, dtype=np.int64)
    if d.shape != (prob.n,):
        raise ValueError(f"placement has {d.size} devices for {prob.n} ops")
    if prob.n and (d.min() < 0 or d.max() >= prob.nd):
        raise ValueError(f"placement names a device index outside 0..{prob.nd - 1}")
    return d


@njit(cache=True)
def _group_sends(dev, nd, tp_ptr, tp_idx, tbytes, cons_ptr, cons_idx, b0, b1):
    """What each producer sends where, once per (tensor, remote device), in
    request order (tensor order, then devices in the order their first
    consumer is listed). Returns CSR tables: ``ptr`` (per producer, its
    transfers), per transfer ``tensor, dst, jptr`` (its consumers
    ``js[jptr[k]:jptr[k + 1]]``, listed order) and ``length`` (route time)."""
    n = dev.shape[0]
    cap = cons_idx.shape[0]
    ptr = np.zeros(n + 1, dtype=np.int64)
    ten = np.empty(cap, dtype=np.int64)
    dst = np.empty(cap, dtype=np.int64)
    length = np.empty(cap, dtype=np.float64)
    jptr = np.zeros(cap + 1, dtype=np.int64)
    js = np.empty(cap, dtype=np.int64)
    mark = np.full(nd, -1, dtype=np.int64)
    seen = np.empty(nd, dtype=np.int64)
    k = 0
    m = 0
    for i in range(n):
        di = dev[i]
        for a in range(tp_ptr[i], tp_ptr[i + 1]):
            t = tp_idx[a]
            found = 0
            for b in range(cons_ptr[t], cons_ptr[t + 1]):
                dj = dev[cons_idx[b]]
                if dj != di and mark[dj] != t:
                    mark[dj] = t
                    seen[found] = dj
                    found += 1
            for q in range(found):
                dj = seen[q]
                ten[k] = t
                dst[k] = dj
                length[k] = b0[di, dj] + b1[di, dj] * tbytes[t]
                for b in range(cons_ptr[t], cons_ptr[t + 1]):
                    if dev[cons_idx[b]] == dj:
                        js[m] = cons_idx[b]
                        m += 1
                k += 1
                jptr[k] = m
        ptr[i + 1] = k
    return ptr, ten[:k], dst[:k], jptr[:k + 1], js[:m], length[:k]


def sends(prob: Problem, dev: Sequence[int], links: str | None = None) -> list:
    """What each producer sends where under placement ``dev``, once per
    (tensor, remote device): ``sends[i]`` is None or a list of ``(tensor,
    bytes, dst, consumers there, duration, link indices)`` in request order
    (tensor order, then the order consumers are listed)."""
    ar = _Arrays.of(prob, links)
    ptr, ten, dst, jptr, js, length = (a.tolist() for a in ar.sends(_dev_array(prob, dev)))
    out: list = [None] * prob.n
    for i in range(prob.n):
        if ptr[i] < ptr[i + 1]:
            out[i] = [(ten[k], ar.tbytes[ten[k]], dst[k], js[jptr[k]:jptr[k + 1]], length[k],
                       ar.route[dev[i]][dst[k]]) for k in range(ptr[i], ptr[i + 1])]
    return out


def replay(prob: Problem, dev: Sequence[int], *, policy: str = "fifo",
           order: Sequence[Sequence[int]] | None = None, priority: Sequence[float] | None = None,
           links: str | None = None) -> ReplayResult:
    """Replay one step of ``prob`` under placement ``dev`` (device index per op).

    The event loop is compiled (numba; ``NUMBA_DISABLE_JIT=1`` runs it as
    plain Python); the problem's flat arrays are built on the first call and
    cached on the Problem.

    Parameters
    ----------
    dev : sequence or int array, device index per op
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
        The order does not list every op exactly once on its own device, or
        deadlocks.

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
    n, nd = prob.n, prob.nd
    ar = _Arrays.of(prob, links)
    d = _dev_array(prob, dev)
    q_ptr = np.zeros(nd + 1, dtype=np.int64)
    np.cumsum(np.bincount(d, minlength=nd), out=q_ptr[1:])
    if policy == "order":
        q_idx = _order_array(order, d, q_ptr, n, nd)
    else:
        q_idx = np.empty(n, dtype=np.int64)
    if policy == "priority":
        prio = -np.asarray(priority, dtype=np.float64)
        if prio.shape != (n,):
            raise ValueError(f"priority has {prio.size} values for {n} ops")
    else:
        prio = np.empty(0, dtype=np.float64)
    send = ar.sends(d)
    out = kernel(_run, n)(POLICIES.index(policy), d, ar.dur[np.arange(n), d], ar.succ_ptr,
                          ar.succ_idx, ar.npred, send[0], send[2], send[5], send[3], send[4],
                          ar.r_ptr, ar.r_idx, ar.n_links, q_ptr, q_idx, prio)
    nfin, qhead = out[-2], out[-1]
    if nfin < n:
        names = prob.names
        stuck = [f"{prob.dev_names[k]}: {names[q_idx[q_ptr[k] + qhead[k]]]}" for k in range(nd)
                 if policy == "order" and q_ptr[k] + qhead[k] < q_ptr[k + 1]]
        raise InvalidPlanError([f"the order deadlocks (it contradicts the graph); waiting heads: {stuck[:4]}"])
    return ReplayResult(ar, send, out[:-2])


def warm_up() -> None:
    """Compile every kernel once and write numba's on-disk cache (what
    ``make install`` runs), so that no later solve pays the compile inside its
    time limit."""
    g = OpGraph.from_edges({"a": 1, "b": 2, "c": 3}, [("a", "b", 8), ("a", "c", 8)])
    prob = Problem.of(g, gpus(2))
    with compiled():
        for links in ("fcfs", "free"):
            replay(prob, [0, 0, 1], links=links)
        replay(prob, [0, 1, 1], policy="priority", priority=placed_ranks(prob, [0, 1, 1]))
        replay(prob, [0, 0, 1], policy="order", order=[[0, 1], [2]])


def _order_array(order, d: np.ndarray, q_ptr: np.ndarray, n: int, nd: int) -> np.ndarray:
    """The per-device order flattened (device 0's ops, then device 1's ...),
    checked: every op exactly once, in its own device's list."""
    queues = [np.asarray(q, dtype=np.int64).ravel() for q in order]
    bad = InvalidPlanError(["the plan's order does not list every op exactly once"])
    if len(queues) > nd or sum(q.size for q in queues) != n:
        raise bad
    q_idx = np.concatenate(queues + [np.empty(0, dtype=np.int64)])
    if n and (q_idx.min() < 0 or q_idx.max() >= n or np.bincount(q_idx, minlength=n).max() > 1):
        raise bad
    owner = np.repeat(np.arange(len(queues)), [q.size for q in queues])
    if not np.array_equal(d[q_idx], owner):
        raise InvalidPlanError(["the plan's order lists an op on another device than its own"])
    return q_idx


@njit(cache=True, inline="always")
def _before(k, s, i, k2, s2, i2) -> bool:
    """``(k, s, i) < (k2, s2, i2)`` as Python compares tuples (the heap order)."""
    return k < k2 or (k == k2 and (s < s2 or (s == s2 and i < i2)))


@njit(cache=True)
def _hpush(hk, hs, hi, base, size, k, s, i):
    """Push ``(k, s, i)`` on the binary heap ``h*[base:base + size]`` (the
    order of Python tuples); returns the new size."""
    pos = size
    while pos > 0:
        up = (pos - 1) >> 1
        pk, ps, pi = hk[base + up], hs[base + up], hi[base + up]
        if _before(k, s, i, pk, ps, pi):
            hk[base + pos], hs[base + pos], hi[base + pos] = pk, ps, pi
            pos = up
        else:
            break
    hk[base + pos], hs[base + pos], hi[base + pos] = k, s, i
    return size + 1


@njit(cache=True)
def _hpop(hk, hs, hi, base, size):
    """Drop the smallest entry (read it at ``h*[base]`` first); returns the new size."""
    size -= 1
    k, s, i = hk[base + size], hs[base + size], hi[base + size]
    pos = 0
    while True:
        c = 2 * pos + 1
        if c >= size:
            break
        r = c + 1
        if r < size and _before(hk[base + r], hs[base + r], hi[base + r],
                                hk[base + c], hs[base + c], hi[base + c]):
            c = r
        ck, cs, ci = hk[base + c], hs[base + c], hi[base + c]
        if _before(ck, cs, ci, k, s, i):
            hk[base + pos], hs[base + pos], hi[base + pos] = ck, cs, ci
            pos = c
        else:
            break
    if size > 0:
        hk[base + pos], hs[base + pos], hi[base + pos] = k, s, i
    return size


@njit(cache=True)
def _run(policy, dev, dur, succ_ptr, succ_idx, npred, s_ptr, s_dst, s_len, s_jptr, s_js,
         r_ptr, r_idx, n_links, q_ptr, q_idx, prio):
    # The hot loop of the simulator, kept in one compiled function (about 120
    # lines): every per-event step inlined on flat arrays is what makes a 40k-op
    # replay take milliseconds. policy: 0 order, 1 fifo, 2 priority.
    # Device k's segment q_ptr[k]:q_ptr[k + 1] of q_idx is its order (policy 0)
    # or its FIFO queue (1); of the pk/ps/pi arrays, its heap of ready ops (2).
    n = dev.shape[0]
    nd = q_ptr.shape[0] - 1
    qhead = np.zeros(nd, dtype=np.int64)  # order: position; fifo: queue head
    qtail = np.zeros(nd, dtype=np.int64)  # fifo: queue tail; priority: heap size
    pk = np.empty(n if policy == 2 else 0, dtype=np.float64)
    ps = np.empty(pk.shape[0], dtype=np.int64)
    pi = np.empty(pk.shape[0], dtype=np.int64)
    seq_no = 0
    is_ready = np.zeros(n, dtype=np.bool_)
    dev_free = np.ones(nd, dtype=np.bool_)
    start = np.zeros(n, dtype=np.float64)
    finish = np.zeros(n, dtype=np.float64)
    ran = np.empty(n, dtype=np.int64)
    nran = q_ptr[:-1].copy()  # next free slot of device k's run list
    fin = np.empty(n, dtype=np.int64)
    nfin = 0
    nx_cap = s_dst.shape[0]
    xk = np.empty(nx_cap, dtype=np.int64)
    xs = np.empty(nx_cap, dtype=np.float64)
    xf = np.empty(nx_cap, dtype=np.float64)
    nx = 0
    waiting = npred.copy()
    arrive = np.zeros(n, dtype=np.float64)  # latest remote input arrival per op
    link_free = np.zeros(n_links, dtype=np.float64)
    # events (time, kind, op); kind 0 = finish, 1 = ready, 2 = a device picks
    # (priority policy): at equal times finishes come first, so a freed device
    # sees every op ready by then, and picks after every op ready then is queued
    cap = 4 * n + nd + 1
    ek = np.empty(cap, dtype=np.float64)
    es = np.empty(cap, dtype=np.int64)
    ei = np.empty(cap, dtype=np.int64)
    ne = 0
    for i in range(n):
        if waiting[i] == 0:
            ne = _hpush(ek, es, ei, 0, ne, 0.0, 1, i)

    while ne > 0:
        now, kind, i = ek[0], es[0], ei[0]
        ne = _hpop(ek, es, ei, 0, ne)
        j = -1  # the op device d starts now, if any
        if kind == 2:  # priority: device i picks its best ready op
            d = i
            if dev_free[d] and qtail[d] > 0:
                j = pi[q_ptr[d]]
                qtail[d] = _hpop(pk, ps, pi, q_ptr[d], qtail[d])
        elif kind == 1:
            d = dev[i]
            if policy == 2:
                qtail[d] = _hpush(pk, ps, pi, q_ptr[d], qtail[d], prio[i], seq_no, i)
                seq_no += 1
                if dev_free[d]:
                    ne = _hpush(ek, es, ei, 0, ne, now, 2, d)
            elif policy == 0:
                is_ready[i] = True
                if dev_free[d] and q_idx[q_ptr[d] + qhead[d]] == i:
                    qhead[d] += 1
                    j = i
            elif dev_free[d]:
                j = i
            else:
                q_idx[q_ptr[d] + qtail[d]] = i
                qtail[d] += 1
        else:
            fin[nfin] = i
            nfin += 1
            d = dev[i]
            for k in range(s_ptr[i], s_ptr[i + 1]):
                dd = s_dst[k]
                s = now
                for m in range(r_ptr[d * nd + dd], r_ptr[d * nd + dd + 1]):
                    if link_free[r_idx[m]] > s:
                        s = link_free[r_idx[m]]
                f = s + s_len[k]
                for m in range(r_ptr[d * nd + dd], r_ptr[d * nd + dd + 1]):
                    link_free[r_idx[m]] = f
                xk[nx], xs[nx], xf[nx] = k, s, f
                nx += 1
                for m in range(s_jptr[k], s_jptr[k + 1]):
                    if f > arrive[s_js[m]]:
                        arrive[s_js[m]] = f
            for m in range(succ_ptr[i], succ_ptr[i + 1]):
                c = succ_idx[m]
                waiting[c] -= 1
                if waiting[c] == 0:
                    ne = _hpush(ek, es, ei, 0, ne, max(arrive[c], now), 1, c)
            # the device is free: start the next op it may run
            dev_free[d] = True
            if policy == 0:
                p = q_ptr[d] + qhead[d]
                if p < q_ptr[d + 1] and is_ready[q_idx[p]]:
                    j = q_idx[p]
                    qhead[d] += 1
            elif policy == 2:
                if qtail[d] > 0:
                    ne = _hpush(ek, es, ei, 0, ne, now, 2, d)
            elif qhead[d] < qtail[d]:
                j = q_idx[q_ptr[d] + qhead[d]]
                qhead[d] += 1
        if j >= 0:
            dev_free[d] = False
            start[j] = now
            finish[j] = now + dur[j]
            ran[nran[d]] = j
            nran[d] += 1
            ne = _hpush(ek, es, ei, 0, ne, finish[j], 0, j)

    makespan = 0.0
    for i in range(n):
        makespan = max(makespan, finish[i])
    for k in range(nx):
        makespan = max(makespan, xf[k])
    return start, finish, ran, q_ptr, fin[:nfin], xk[:nx], xs[:nx], xf[:nx], makespan, nfin, qhead


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
