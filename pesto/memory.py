"""Memory: one module for every accounting of device memory.

* :func:`memory_profile` / :func:`timed_peak` -- the liveness peak of a timed
  schedule (the checker's and the simulator's verdict);
* :func:`static_peak` -- the schedule-free upper bound of that peak for a
  placement: persistent + outputs + each tensor received once + the largest
  temporary;
* :class:`MemoryTracker` -- Baechi's incremental accounting while ops are
  placed one by one (placers use it to choose devices);
* :func:`static_repair` / :func:`peak_repair` -- move colocation units off
  devices over capacity in the static model / in a simulated schedule;
* :func:`check_feasible` -- refuse, before any solving, a problem no plan can fit.

Every one of them holds an op's :attr:`~pesto.graph.Op.allocated_bytes` on its
device (``output_bytes`` less ``view_bytes``: a variable's read shares the
variable's buffer, held as the variable's persistent bytes) through the
``out`` arrays of :class:`~pesto.problem.Problem` and
:class:`~pesto.problem.GraphArrays` or :func:`static_bytes`; a tensor received
by another device counts its full bytes there.

The three agree in one direction, which tests check on random graphs: for any
placement, the tracker's final peak and the timed peak of any schedule are at
most the static peak.

Memory-infeasible behaviour (the same for every heuristic placer)
----------------------------------------------------------------
A placer never raises because memory is short and never hides it. When an op
(or its colocation group) fits on no allowed device, it goes to the allowed
device with the most free memory (best effort). The placement is then
simulated by :func:`pesto.finalize.finalize`, whose liveness-based peak memory
is the same as :func:`pesto.plan.check_plan`'s, and while a device is over
capacity whole colocation units are moved off it (:func:`peak_repair`) and the
placement simulated again (:func:`pesto.finalize.fit_memory`). Only if no repair
fits is the plan returned over capacity: its status is ``"infeasible"``, and
its :class:`~pesto.outcome.MemoryInfo` gives the peak bytes per over-full
device (``over``) and the ops placed best effort (``forced``). So a plan labelled
anything but ``"infeasible"`` passes ``check_plan`` including memory.

:class:`~pesto.errors.InfeasibleError` is raised only when no plan can exist
for reasons other than memory: an op (or a colocation group) whose allowed
kinds match no device of the cluster; the error names it.

Baechi's accounting (:class:`MemoryTracker`), in placement order: persistent
bytes stay for the whole step (a colocation group's persistent bytes are
reserved on its device when its first member is placed, which must also leave
room for the group's largest output + temporary, and a device takes
persistent bytes only up to its share of the graph's plus half of what that
share leaves free, so weights do not crowd out activations); an op's output stays
on its device, and a copy on every remote device that consumes it, until every
consumer of the op has been placed; temporary bytes count only while the op
is being placed.

Examples
--------
>>> from pesto.graph import Op, OpGraph
>>> from pesto.cluster import gpus
>>> g = OpGraph([Op("w", {"GPU": 1.0}, persistent_bytes=60)])
>>> t = MemoryTracker(Problem.of(g, gpus(2, memory=100)))
>>> t.fits(0, 0), t.commit(0, 0), t.used
(True, None, [60, 0])
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .cluster import Cluster
from .dag import closure
from .errors import InfeasibleError, InvalidPlanError
from .graph import OpGraph
from .problem import GraphArrays, Problem

__all__ = ["memory_profile", "timed_peak", "static_peak", "MemoryTracker", "static_repair", "peak_repair",
           "check_feasible", "live_across", "step_activations", "Activations", "static_bytes", "overrun_message",
           "fmt_bytes", "MEMORY_NOTE"]

MEMORY_NOTE = ("memory does not fit: ops in memory_forced were put on the device with the most free "
               "memory; memory_over gives the simulated peak per over-full device")


def memory_profile(graph: OpGraph, cluster: Cluster, placement: Mapping[str, str],
                   start: Mapping[str, float] | None = None, finish: Mapping[str, float] | None = None,
                   transfers=None) -> dict[str, int]:
    """Peak bytes per device.

    With times (``start``, ``finish`` and the ``transfers``):

    * an op's ``persistent_bytes`` are held all step;
    * its :attr:`~pesto.graph.Op.allocated_bytes` (``output_bytes`` less
      ``view_bytes``) from its start until its last consumer *on the same
      device* through a data edge finishes, or its last outgoing transfer
      ends, whichever is later (at least until it finishes);
    * its ``temporary_bytes`` while it runs;
    * a received tensor's bytes on the receiving device from the start of its
      transfer until the transfer ends or its last consumer there finishes.

    An interval ``[s, e)`` is live at ``s`` but not at ``e``, so back-to-back
    ops do not add up; a zero-length interval counts at its instant only
    (ops starting together are taken shortest first).

    Without times: the conservative static sum persistent + allocated outputs +
    each tensor received (once per device) + the largest temporary, an upper
    bound of the timed peak for any schedule of that placement.

    Examples
    --------
    >>> from pesto.graph import Op, Tensor, Edge, OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph([Op("a", {"GPU": 2}, persistent_bytes=10, output_bytes=100),
    ...              Op("b", {"GPU": 3}, temporary_bytes=50)],
    ...             [Edge("a", "b", ("a:0",))], [Tensor("a:0", "a", 100)])
    >>> pl = {"a": "/GPU:0", "b": "/GPU:0"}
    >>> memory_profile(g, gpus(1), pl, {"a": 0, "b": 2}, {"a": 2, "b": 5}, [])
    {'/GPU:0': 160}
    >>> memory_profile(g, gpus(1), pl)
    {'/GPU:0': 160}

    A read of a variable (its output a view of the variable's buffer) adds
    nothing on its own device; a remote consumer receives a copy:

    >>> v = OpGraph([Op("w", {"GPU": 1}, persistent_bytes=64), Op("r", {"GPU": 1}, output_bytes=64, view_bytes=64),
    ...              Op("c", {"GPU": 1})], [Edge("w", "r"), Edge("r", "c", ("r:0",))], [Tensor("r:0", "r", 64)])
    >>> memory_profile(v, gpus(2), {"w": "/GPU:0", "r": "/GPU:0", "c": "/GPU:0"})
    {'/GPU:0': 64, '/GPU:1': 0}
    >>> memory_profile(v, gpus(2), {"w": "/GPU:0", "r": "/GPU:0", "c": "/GPU:1"})
    {'/GPU:0': 64, '/GPU:1': 64}
    """
    cidx = cluster.index
    try:
        dev = [cidx[placement[nm]] for nm in graph.names]
    except KeyError as exc:
        raise InvalidPlanError([f"memory_profile: op or device {exc.args[0]!r} is not placed or unknown"]) from None
    table = {t[0]: t for t in graph.tensor_table()}
    xfers = []
    for t in transfers or ():
        info = table.get(t.tensor)
        dd = cidx.get(t.dst)
        if info is None or dd is None or t.src == t.dst:
            continue  # check_plan reports these
        _, src, nbytes, cons = info
        xfers.append((src, nbytes, dd, t.start, t.finish, [j for j in cons if dev[j] == dd]))
    if start is None or finish is None:
        return static_peak(graph, cluster, dev)
    names = graph.names
    st = [start[nm] for nm in names]
    fi = [finish[nm] for nm in names]
    return timed_peak(graph, cluster, dev, st, fi, xfers)


def static_peak(graph: OpGraph, cluster: Cluster, dev: list[int]) -> dict[str, int]:
    nd = len(cluster.devices)
    held = [0] * nd
    temp = [0] * nd
    for op, d in zip(graph.ops, dev):
        held[d] += static_bytes(op)
        if op.temporary_bytes > temp[d]:
            temp[d] = op.temporary_bytes
    for _, src, nbytes, cons in graph.tensor_table():
        for d in {dev[j] for j in cons if dev[j] != dev[src]}:
            held[d] += nbytes
    return {dv.name: held[k] + temp[k] for k, dv in enumerate(cluster.devices)}


def timed_peak(graph: OpGraph, cluster: Cluster, dev, start, finish, xfers) -> dict[str, int]:
    """Liveness peak from index arrays. ``xfers``: (producer idx, bytes,
    destination device idx, start, finish, consumer idx on that device)."""
    import numpy as np

    arr = GraphArrays.of(graph)
    nd = len(cluster.devices)
    dev = np.asarray(dev, dtype=np.int64)
    st = np.asarray(start, dtype=float)
    fi = np.asarray(finish, dtype=float)
    last = fi.copy()
    es, ed = arr.data_src, arr.data_dst
    if len(es):
        same = dev[es] == dev[ed]
        np.maximum.at(last, es[same], fi[ed[same]])
    t_s, t_e, t_b, t_d = [], [], [], []
    for src, nbytes, dd, s, f, js in xfers:
        if f > last[src]:
            last[src] = f
        if nbytes > 0:
            end = f
            for j in js:
                if fi[j] > end:
                    end = fi[j]
            t_s.append(s)
            t_e.append(end)
            t_b.append(nbytes)
            t_d.append(dd)
    out, tmp = arr.out, arr.temp
    o = np.nonzero(out)[0]
    m = np.nonzero(tmp)[0]
    # rank of each op among ops starting at the same time (ties: shorter first),
    # so that a zero-length op is over before the next op on its device starts
    rank = np.empty(len(st), dtype=np.int64)
    rank[np.lexsort((fi, st))] = np.arange(len(st))
    nt = len(t_s)
    a_t = np.concatenate([st[o], st[m], np.asarray(t_s, dtype=float)])
    f_t = np.concatenate([last[o], fi[m], np.asarray(t_e, dtype=float)])
    r = np.concatenate([rank[o], rank[m], np.full(nt, -1, dtype=np.int64)])
    b = np.concatenate([out[o], tmp[m], np.asarray(t_b, dtype=np.int64)])
    d = np.concatenate([dev[o], dev[m], np.asarray(t_d, dtype=np.int64)])
    times = np.concatenate([a_t, f_t])
    # at one instant: frees of intervals that end then (flag 0) come first; then,
    # by rank, each allocation (flag 1), and right after it the free of a
    # zero-length interval (it counts at its instant only)
    zero = f_t <= a_t
    flag = np.concatenate([np.ones(len(a_t), dtype=np.int8), np.where(zero, 1, 0).astype(np.int8)])
    sub = np.concatenate([2 * r, np.where(zero, 2 * r + 1, 0)])
    delta = np.concatenate([b, -b])
    devs = np.concatenate([d, d])
    pers = arr.pers
    base = [int(pers[dev == k].sum()) for k in range(nd)]
    peak = {}
    for k, dv in enumerate(cluster.devices):
        sel = devs == k
        best = 0
        if sel.any():
            order = np.lexsort((sub[sel], flag[sel], times[sel]))
            best = max(0, int(np.cumsum(delta[sel][order]).max()))
        peak[dv.name] = base[k] + best
    return peak


def static_bytes(op) -> int:
    """Bytes an op holds all step on its device in the static model: persistent
    + allocated outputs (:attr:`~pesto.graph.Op.allocated_bytes`: a view takes none)."""
    return op.persistent_bytes + op.allocated_bytes


def check_feasible(graph: OpGraph, cluster: Cluster) -> None:
    """Raise :class:`InfeasibleError` if no plan can fit; return None otherwise.

    Checks that every op and colocation group has a device kind it may use
    (:class:`Problem` raises that), that each fits the largest such device on
    its own, and that the persistent bytes fit all devices together.

    Raises
    ------
    InfeasibleError
        With ``culprit`` set to the op, colocation group or ``"total"``.

    Examples
    --------
    >>> from pesto.graph import OpGraph, Op
    >>> from pesto.cluster import gpus
    >>> g = OpGraph([Op("big", {"GPU": 1.0}, persistent_bytes=2**40)])
    >>> try:
    ...     check_feasible(g, gpus(2))
    ... except InfeasibleError as e:
    ...     print(e.culprit)
    big
    """
    p = Problem.of(graph, cluster)
    ops = graph.ops
    for i, op in enumerate(ops):
        need = op.memory_bytes
        cap = max(p.cap[d] for d in p.allowed[i])
        if need > cap:
            raise InfeasibleError(
                f"op {op.name!r} needs {fmt_bytes(need)} (persistent + output + temporary) but the largest "
                f"device it may use has {fmt_bytes(cap)} ({fmt_bytes(need - cap)} over)", culprit=op.name)
    for mem in p.members:
        if len(mem) < 2:
            continue
        need = sum(p.persistent[i] for i in mem) + max(p.out[i] + p.temp[i] for i in mem)
        cap = max(p.cap[d] for d in p.allowed[mem[0]])
        if need > cap:
            group = ops[mem[0]].colocation_group
            raise InfeasibleError(
                f"colocation group {group!r} ({len(mem)} ops) needs at least {fmt_bytes(need)} "
                f"but the largest device it may use has {fmt_bytes(cap)} ({fmt_bytes(need - cap)} over)", culprit=group)
    total = sum(p.persistent)
    if total > sum(p.cap):
        raise InfeasibleError(
            f"persistent bytes of the graph ({fmt_bytes(total)}) exceed the memory of all devices "
            f"together ({fmt_bytes(sum(p.cap))})", culprit="total")


def live_across(graph: OpGraph, name: str) -> int:
    """Bytes of the tensors live when op ``name`` ends, in every plan: those
    produced by ``name`` or one of its ancestors and read by one of its
    descendants (produced before it ends, read after), less the bytes of them
    that are views (:attr:`~pesto.graph.Op.view_bytes`: a variable's read,
    held as the variable's persistent bytes where its consumers run with it).
    With the persistent bytes, a floor on what all devices together hold at
    that moment; for the loss of a training step, the activations its backward
    pass reads.

    Examples
    --------
    >>> from pesto.graph import OpGraph, Op, Edge, Tensor
    >>> g = OpGraph([Op(n, {"GPU": 1.0}) for n in ("f", "loss", "b")],
    ...             [Edge("f", "loss", "f:0"), Edge("f", "b", "f:0"), Edge("loss", "b", "loss:0")],
    ...             [Tensor("f:0", "f", 100), Tensor("loss:0", "loss", 4)])
    >>> live_across(g, "loss"), live_across(g, "f")
    (104, 100)
    """
    return sum(b for _, b in _live_tensors(graph, graph.index[name]))


def _live_tensors(graph: OpGraph, i: int) -> list[tuple[int, int]]:
    """``(producer, bytes less views)`` of the tensors live when op ``i`` ends (:func:`live_across`)."""
    before = closure(graph.pred_idx(), [i])
    after = closure(graph.succ_idx(), [i]) - {i}
    view = GraphArrays.of(graph).tview
    return [(src, b - int(view[k])) for k, (_, src, b, cons) in enumerate(graph.tensor_table())
            if src in before and any(c in after for c in cons)]


@dataclass(frozen=True)
class Activations:
    """What every plan of a training step holds when its forward pass ends
    (:func:`step_activations`): ``op``, the forward op the backward pass first
    reads (the loss); of the bytes live across it (:func:`live_across`),
    ``batched`` come from batched ops (a slice holds ``batched / M`` of them),
    ``shared`` from once-per-step ops (weight reads: every slice shares them)."""

    op: str
    batched: int
    shared: int

    def per_slice(self, micro_batches: int) -> int:
        """Bytes live across one slice's loss: ``batched / M`` (rounded up) plus ``shared``."""
        return -(-self.batched // max(1, micro_batches)) + self.shared


def step_activations(graph: OpGraph) -> Activations | None:
    """:class:`Activations` of a marked step: the loss is the latest (in
    topological order) batched forward op read by the first backward op (by
    :attr:`~pesto.graph.Op.phase`) that reads a batched forward op; None when
    no backward op reads one (no phase marks). In any plan of the step split
    into ``M`` slices, when a slice's loss ends the devices together hold the
    persistent bytes and at least :meth:`Activations.per_slice` bytes
    (a floor; :mod:`solver.parallel.search` skips strategies it rules out).

    >>> from pesto.graph import Op, Edge, Tensor
    >>> ops = [Op("w", {"GPU": 0.0}, output_bytes=8, batch=False, phase="forward"),
    ...        Op("f", {"GPU": 1.0}, output_bytes=100, batch=True, phase="forward"),
    ...        Op("loss", {"GPU": 1.0}, output_bytes=4, batch=True, phase="forward"),
    ...        Op("df", {"GPU": 1.0}, output_bytes=100, batch=True, phase="input-grad")]
    >>> es = [Edge("w", "f", "w:0"), Edge("f", "loss", "f:0"), Edge("loss", "df", "loss:0"),
    ...       Edge("f", "df", "f:0"), Edge("w", "df", "w:0")]
    >>> a = step_activations(OpGraph(ops, es, [Tensor(f"{n}:0", n, o.output_bytes) for n, o in
    ...                                         zip("w f loss".split(), ops)]))
    >>> a, a.per_slice(4)
    (Activations(op='loss', batched=104, shared=8), 34)
    """
    ops, topo, pred = graph.ops, graph.topo_idx(), graph.pred_idx()
    pos = {i: k for k, i in enumerate(topo)}
    backward = ("input-grad", "weight-grad")
    for i in topo:
        if ops[i].phase in backward:
            fwd = [p for p in pred[i] if ops[p].batch and ops[p].phase == "forward"]
            if fwd:
                loss = max(fwd, key=pos.get)
                break
    else:
        return None
    live = _live_tensors(graph, loss)
    batched = sum(b for src, b in live if ops[src].batch)
    return Activations(graph.names[loss], batched, sum(b for _, b in live) - batched)


def fmt_bytes(n) -> str:
    """Bytes for people: ``fmt_bytes(38654705664) == '36.00 GiB'``; None is ``'?'``.

    >>> fmt_bytes(512), fmt_bytes(3 * 2**20), fmt_bytes(None)
    ('512 B', '3.00 MiB', '?')
    """
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def overrun_message(graph: OpGraph, cluster: Cluster, placement: Mapping[str, str],
                    peak: Mapping[str, int], *, top: int = 5) -> str | None:
    """Why a plan does not fit: per over-full device its peak, capacity and
    bytes over, and the largest holders there (a colocation group counted as
    one, persistent + output bytes); None if every device fits.

    Examples
    --------
    >>> from pesto.graph import Op, OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph([Op("w", {"GPU": 1.0}, persistent_bytes=150), Op("v", {"GPU": 1.0}, persistent_bytes=10)])
    >>> print(overrun_message(g, gpus(2, memory=100), {"w": "/GPU:0", "v": "/GPU:0"}, {"/GPU:0": 160}))
    /GPU:0 peaks at 160 B of 100 B (60 B over); largest there: op 'w' 150 B, op 'v' 10 B
    """
    lines = []
    for d in cluster.devices:
        used = peak.get(d.name, 0)
        if used <= d.memory:
            continue
        held: dict[str, int] = {}
        for op in graph.ops:
            if placement.get(op.name) == d.name:
                key = f"group {op.colocation_group!r}" if op.colocation_group else f"op {op.name!r}"
                held[key] = held.get(key, 0) + static_bytes(op)
        big = sorted(held.items(), key=lambda kv: -kv[1])[:top]
        more = f" and {len(held) - top} more" if len(held) > top else ""
        lines.append(f"{d.name} peaks at {fmt_bytes(used)} of {fmt_bytes(d.memory)} "
                     f"({fmt_bytes(used - d.memory)} over); largest there: "
                     + ", ".join(f"{k} {fmt_bytes(b)}" for k, b in big) + more)
    return "\n".join(lines) or None


class MemoryTracker:
    """Baechi-style memory accounting while ops are placed one by one.

    ``fits(i, d)`` says whether op ``i`` can go on device ``d`` now (for the
    first member of a colocation unit: whether ``d`` holds the unit's
    persistent bytes plus its largest member's output + temporary, since the
    whole unit is pinned there, and whether ``d``'s persistent bytes stay
    within ``pers_limit[d]``: its share of the graph's persistent bytes plus
    half of the memory that share leaves free); ``commit(i, d)`` records it.
    Placers fall back to :meth:`best_effort` when no device fits. ``used[d]`` is the bytes held on ``d``,
    ``peak[d]`` the most ever held (temporaries included), ``forced`` the ops
    committed although they did not fit.
    """

    def __init__(self, problem: Problem):
        p = self.p = problem
        self.used = [0] * p.nd
        self.peak = [0] * p.nd
        self.place = [-1] * p.n
        self.unit_dev = [-1] * len(p.members)
        self.remaining = [len(s) for s in p.succ]
        self.copies: list = [None] * p.n
        self.sent: set = set()
        self.forced: list[int] = []
        # pinning a unit pins all its members: its first member must leave room
        # for the unit's persistent bytes and for its largest member's output + temporary
        self.unit_peak = [max(p.out[i] + p.temp[i] for i in mem) for mem in p.members]
        # persistent bytes per device are capped at the device's share of all
        # persistent bytes plus half of what that share leaves free: greedy
        # placers (m-ETF places every zero-time variable first) otherwise fill
        # one device with weights and leave no room for activations there
        share = min(1.0, sum(p.persistent) / max(1, sum(p.cap)))
        self.pers_limit = [c * (1 + share) / 2 for c in p.cap]
        self.pers_used = [0] * p.nd

    def need(self, i: int, d: int) -> int:
        """Bytes ``d`` must hold at once to place op ``i`` there now."""
        p = self.p
        u = p.unit[i]
        if self.unit_dev[u] < 0:
            extra = p.unit_persistent[u] + self.unit_peak[u]
        else:
            extra = p.out[i] + p.temp[i]
        sent, place = self.sent, self.place
        for q, ts in p.ins[i]:
            if place[q] != d:
                for t, b in ts:
                    if b and (t, d) not in sent:
                        extra += b
        return extra

    def fits(self, i: int, d: int) -> bool:
        u = self.p.unit[i]
        if self.unit_dev[u] < 0 and self.pers_used[d] + self.p.unit_persistent[u] > self.pers_limit[d]:
            return False
        return self.used[d] + self.need(i, d) <= self.p.cap[d]

    def free_bytes(self, d: int) -> int:
        return self.p.cap[d] - self.used[d]

    def best_effort(self, i: int, candidates) -> int:
        """Among ``candidates``, the device left with the most free memory after ``i``."""
        return max(candidates, key=lambda d: (self.p.cap[d] - self.used[d] - self.need(i, d), -d))

    def commit(self, i: int, d: int) -> None:
        p = self.p
        used = self.used
        if used[d] + self.need(i, d) > p.cap[d]:
            self.forced.append(i)
        u = p.unit[i]
        if self.unit_dev[u] < 0:
            self.unit_dev[u] = d
            used[d] += p.unit_persistent[u]
            self.pers_used[d] += p.unit_persistent[u]
        self.place[i] = d
        used[d] += p.out[i]
        for q, ts in p.ins[i]:
            if self.place[q] != d:
                for t, b in ts:
                    if b and (t, d) not in self.sent:
                        self.sent.add((t, d))
                        used[d] += b
                        if self.copies[q] is None:
                            self.copies[q] = []
                        self.copies[q].append((d, b))
        if used[d] + p.temp[i] > self.peak[d]:
            self.peak[d] = used[d] + p.temp[i]
        for q, _ in p.ins[i]:
            self.remaining[q] -= 1
            if self.remaining[q] == 0:
                self._release(q)
        if self.remaining[i] == 0:
            self._release(i)

    def _release(self, q: int) -> None:
        self.used[self.place[q]] -= self.p.out[q]
        for d, b in self.copies[q] or ():
            self.used[d] -= b
        self.copies[q] = None

    def forced_names(self) -> list[str]:
        names = self.p.graph.names
        return [names[i] for i in self.forced]


def static_repair(problem: Problem, place: list[int]) -> list[int]:
    """Move whole colocation units off devices whose static footprint
    (persistent + outputs + largest temporary, as :func:`pesto.plan.memory_profile`
    without times) exceeds capacity, to allowed devices with room. Best effort:
    returns the op indices of units that could not be moved anywhere with room.
    ``place`` is modified in place.
    """
    p = problem
    held = [0] * p.nd
    temp = [0] * p.nd
    for i in range(p.n):
        d = place[i]
        held[d] += p.persistent[i] + p.out[i]
        temp[d] = max(temp[d], p.temp[i])
    over = [d for d in range(p.nd) if held[d] + temp[d] > p.cap[d]]
    if not over:
        return []
    stuck = []
    foot = [sum(p.persistent[i] + p.out[i] for i in mem) for mem in p.members]
    tmax = [max(p.temp[i] for i in mem) for mem in p.members]
    for d in over:
        units = sorted({p.unit[i] for i in range(p.n) if place[i] == d}, key=lambda u: -foot[u])
        for u in units:
            if held[d] + temp[d] <= p.cap[d]:
                break
            if foot[u] == 0:
                continue
            targets = [e for e in p.allowed[p.members[u][0]]
                       if e != d and held[e] + foot[u] + max(temp[e], tmax[u]) <= p.cap[e]]
            if not targets:
                stuck.extend(p.members[u])
                continue
            e = max(targets, key=lambda e: p.cap[e] - held[e])
            for i in p.members[u]:
                place[i] = e
            held[d] -= foot[u]
            held[e] += foot[u]
            temp[e] = max(temp[e], tmax[u])
            # temp[d] is left as is: conservative, and avoids an O(n) rescan per move
    return stuck


def peak_repair(problem: Problem, place: list[int], peak: Mapping[str, int], *,
                max_moves: int | None = None, skip=frozenset()) -> int:
    """Move whole colocation units off devices whose simulated ``peak``
    exceeds capacity, to allowed devices with headroom; returns how many
    units moved (0: no move can help). ``place`` is modified in place.

    A move of unit ``u`` from ``d`` to ``e`` is priced in the static model
    (persistent bytes + each tensor once on every device that produces or
    consumes it): what it frees on ``d`` (its persistent bytes, its outputs,
    the copies it alone received there, less the copies of its outputs that
    ``d`` must now receive) and what it costs ``e`` likewise. From each
    over-full device, moves are taken while it is over, cheapest first among
    those freeing the whole overrun, then those freeing most, each priced
    again when its turn comes and made if its target has the headroom
    (capacity minus simulated peak, less what it took this round). When no
    target has room, moves that free more on their device than they cost
    their target are made instead, largest saving first. At most ``max_moves`` moves; units in
    ``skip`` stay. Callers simulate again and repeat while the plan is over
    capacity and units still move (a timed peak can move against the static
    estimate, so they keep the best placement seen).

    Examples
    --------
    >>> from pesto.graph import Op, OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph([Op(x, {"GPU": 1.0}, persistent_bytes=40) for x in "abc"])
    >>> prob = Problem.of(g, gpus(2, memory=100))
    >>> place = [0, 0, 0]
    >>> peak_repair(prob, place, {"/GPU:0": 120, "/GPU:1": 0}), place
    (1, [1, 0, 0])
    """
    p = problem
    room = [p.cap[d] - int(peak.get(p.dev_names[d], 0)) for d in range(p.nd)]
    over = [d for d in range(p.nd) if room[d] < 0]
    if not over:
        return 0
    touch: list[list[int]] = [[] for _ in range(p.n)]  # tensors each op produces or reads
    for t, (_, q, nbytes, cons) in enumerate(p.tensors):
        if nbytes:
            for i in {q, *cons}:
                touch[i].append(t)
    units_on: list[list[int]] = [[] for _ in range(p.nd)]
    for u, mem in enumerate(p.members):
        if u not in skip:
            units_on[place[mem[0]]].append(u)
    moved = 0
    for d in sorted(over, key=lambda d: room[d]):
        cands = []
        for u in units_on[d]:
            for e in p.allowed[p.members[u][0]]:
                if e != d and room[e] > 0:
                    gain, cost = _move_delta(p, place, touch, u, d, e)
                    if gain > 0 and cost <= room[e]:
                        key = (0, cost) if gain >= -room[d] else (1, -gain)
                        cands.append((key, u, e))
        # one pass in that order, each move priced again when its turn comes
        for _, u, e in sorted(cands):
            if room[d] >= 0 or (max_moves is not None and moved >= max_moves):
                break
            if place[p.members[u][0]] != d:
                continue
            gain, cost = _move_delta(p, place, touch, u, d, e)
            if gain <= 0 or cost > room[e]:
                continue
            for i in p.members[u]:
                place[i] = e
            room[d] += gain
            room[e] -= cost
            moved += 1
    if not moved:  # no target has room: moves that shrink the total, by how much
        moved = _shrink(p, place, touch, units_on, over, max_moves)
    return moved


def _shrink(p: Problem, place, touch, units_on, over, max_moves) -> int:
    """Moves off over-full devices freeing there more than they cost their
    target (e.g. an op next to the big tensor it was reading remotely),
    largest net saving first, each priced again when its turn comes."""
    cands = []
    for d in over:
        for u in units_on[d]:
            for e in p.allowed[p.members[u][0]]:
                if e != d:
                    gain, cost = _move_delta(p, place, touch, u, d, e)
                    if gain > cost:
                        cands.append((cost - gain, u, d, e))
    moved = 0
    frozen: set = set()  # ops sharing a tensor with a moved unit: their prices changed
    for _, u, d, e in sorted(cands):
        if max_moves is not None and moved >= max_moves:
            break
        if place[p.members[u][0]] != d or frozen.intersection(p.members[u]):
            continue
        gain, cost = _move_delta(p, place, touch, u, d, e)
        if gain > cost:
            for i in p.members[u]:
                place[i] = e
                for t in touch[i]:
                    _, q, _, cons = p.tensors[t]
                    frozen.update((q, *cons))
            moved += 1
    return moved


def _move_delta(p: Problem, place: list[int], touch, u: int, d: int, e: int) -> tuple[int, int]:
    """Static bytes freed on ``d`` and added on ``e`` by moving unit ``u`` from ``d`` to ``e``
    (a tensor's view bytes are none on its producer's device)."""
    members = set(p.members[u])
    gain = cost = p.unit_persistent[u]
    seen = set()
    for i in members:
        for t in touch[i]:
            if t in seen:
                continue
            seen.add(t)
            _, q, nbytes, cons = p.tensors[t]
            ends = [q, *cons]
            before = {place[j] for j in ends}
            after = {e if j in members else place[j] for j in ends}
            view = p.tensor_view[t]
            src_before, src_after = place[q], e if q in members else place[q]
            gain += _held(d, before, src_before, nbytes, view) - _held(d, after, src_after, nbytes, view)
            cost += _held(e, after, src_after, nbytes, view) - _held(e, before, src_before, nbytes, view)
    return gain, cost


def _held(dev: int, where: set, src: int, nbytes: int, view: int) -> int:
    """Bytes of a tensor on ``dev`` when the devices ``where`` hold it, its producer on ``src``."""
    return 0 if dev not in where else nbytes - view if dev == src else nbytes
