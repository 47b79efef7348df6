"""Placement constraints every baseline shares: allowed devices, colocation
units, and Baechi's memory accounting.

Memory-infeasible behaviour (the same for every baseline placer)
----------------------------------------------------------------
A placer never raises because memory is short and never hides it. When an op
(or its colocation group) fits on no allowed device, it goes to the allowed
device with the most free memory (best effort) and its name is recorded in
``plan.stats["memory_forced"]``. The returned plan is always simulated by
:func:`solver.common.finalize`, whose liveness-based peak memory is the same as
:func:`pesto.plan.check_plan`'s: if any device is over capacity the plan's
status is ``"infeasible"`` and ``stats["memory_over"]`` gives the peak bytes per
over-full device. So a plan labelled anything but ``"infeasible"`` passes
``check_plan`` including memory.

:class:`~pesto.errors.InfeasibleError` is raised only when no plan can exist
for reasons other than memory: an op (or a colocation group) whose allowed
kinds match no device of the cluster; the error names it.

Baechi's accounting (:class:`MemoryTracker`), in placement order: persistent
bytes stay for the whole step (a colocation group's persistent bytes are
reserved on its device when its first member is placed); an op's output stays
on its device, and a copy on every remote device that consumes it, until every
consumer of the op has been placed; temporary bytes count only while the op
is being placed.

Examples
--------
>>> from pesto.graph import Op, OpGraph
>>> from pesto.cluster import gpus
>>> g = OpGraph([Op("w", {"GPU": 1.0}, persistent_bytes=60)])
>>> p = Problem(g, gpus(2, memory=100))
>>> t = MemoryTracker(p)
>>> t.fits(0, 0), t.commit(0, 0), t.used
(True, None, [60, 0])
"""
from __future__ import annotations

from pesto.cluster import Cluster
from pesto.errors import InfeasibleError
from pesto.graph import OpGraph

__all__ = ["Problem", "MemoryTracker", "static_repair", "MEMORY_NOTE"]

MEMORY_NOTE = ("memory does not fit: ops in memory_forced were put on the device with the most free "
               "memory; memory_over gives the simulated peak per over-full device")


class Problem:
    """Arrays of a (graph, cluster) pair that list schedulers need.

    Attributes
    ----------
    n, nd : number of ops and devices
    allowed : list of list of int
        Per op, the devices it may run on (kind allowed by the op and every
        member of its colocation group).
    unit, members : colocation units (a group, or an op alone); ``unit[i]`` is
        the unit of op ``i`` and ``members[u]`` its ops.
    dur : list of list of float
        ``dur[i][d]`` compute time of op ``i`` on device ``d`` (inf if not allowed).
    ins : list of list of (pred, ((tensor id, bytes), ...)), deduplicated by tensor.
    beta0, beta1 : per (src, dst) device pair comm fit (0 on the diagonal).
    links : per (src, dst) the link indices a transfer holds (empty when the
        cluster is contention free).

    Raises
    ------
    InfeasibleError
        An op or colocation group can run on no device of the cluster.
    """

    def __init__(self, graph: OpGraph, cluster: Cluster):
        self.graph, self.cluster = graph, cluster
        ops = graph.ops
        self.n = n = graph.num_ops
        devs = cluster.devices
        self.nd = nd = len(devs)
        self.dev_names = [d.name for d in devs]
        self.cap = [d.memory for d in devs]
        index = graph.index
        # colocation units
        groups = graph.colocation_groups()
        self.unit = [-1] * n
        self.members: list[list[int]] = []
        for members in groups.values():
            u = len(self.members)
            self.members.append([index[m] for m in members])
            for m in members:
                self.unit[index[m]] = u
        for i in range(n):
            if self.unit[i] < 0:
                self.unit[i] = len(self.members)
                self.members.append([i])
        kinds_ok = []
        for u, mem in enumerate(self.members):
            kinds = frozenset.intersection(*(ops[i].kinds for i in mem))
            ok = [d for d in range(nd) if devs[d].kind in kinds]
            if not ok:
                first = ops[mem[0]]
                if len(mem) == 1:
                    raise InfeasibleError(
                        f"op {first.name!r} may run on kinds {sorted(first.kinds)} but the cluster has "
                        f"only {sorted({d.kind for d in devs})}", culprit=first.name)
                raise InfeasibleError(
                    f"colocation group {first.colocation_group!r} has no device kind allowed for all "
                    f"its ops ({len(mem)} ops, kinds {sorted(kinds)})", culprit=first.colocation_group)
            kinds_ok.append(ok)
        self.allowed = [kinds_ok[self.unit[i]] for i in range(n)]
        inf = float("inf")
        self.dur = [[(op.compute[devs[d].kind] / devs[d].speed) if devs[d].kind in op.kinds else inf
                     for d in range(nd)] for op in ops]
        self.persistent = [op.persistent_bytes for op in ops]
        self.out = [op.output_bytes for op in ops]
        self.temp = [op.temporary_bytes for op in ops]
        self.unit_persistent = [sum(self.persistent[i] for i in mem) for mem in self.members]
        # inputs deduplicated by tensor (a tensor goes once to each remote device)
        tid = {t.name: k for k, t in enumerate(graph.tensors)}
        tbytes = [t.bytes for t in graph.tensors]
        self.tensor_bytes = tbytes
        self.ins: list[list] = [[] for _ in range(n)]
        self.outs: list[list] = [[] for _ in range(n)]  # (consumer, bytes on the edge)
        for e in graph.edges:
            ts = tuple((tid[t], tbytes[tid[t]]) for t in e.tensors)
            self.ins[index[e.dst]].append((index[e.src], ts))
            self.outs[index[e.src]].append((index[e.dst], sum(b for _, b in ts)))
        self.succ = graph.succ_idx()
        self.pred = graph.pred_idx()
        self.beta0 = [[0.0] * nd for _ in range(nd)]
        self.beta1 = [[0.0] * nd for _ in range(nd)]
        # link resources of each route, as indices (none when contention free)
        link_id = {l: k for k, l in enumerate(cluster.links)}
        self.n_links = len(link_id)
        self.links: list[list[tuple]] = [[()] * nd for _ in range(nd)]
        for a in range(nd):
            for b in range(nd):
                if a != b:
                    r = cluster.route(self.dev_names[a], self.dev_names[b])
                    self.beta0[a][b], self.beta1[a][b] = r.beta0, r.beta1
                    if not cluster.contention_free:
                        self.links[a][b] = tuple(link_id[l] for l in r.links)

    def comm(self, a: int, b: int, nbytes: int) -> float:
        """Transfer time from device ``a`` to ``b`` (0 on one device or for 0 bytes)."""
        if a == b or nbytes <= 0:
            return 0.0
        return self.beta0[a][b] + self.beta1[a][b] * nbytes

    def mean_dur(self, i: int) -> float:
        """Average compute time of op ``i`` over its allowed devices."""
        a = self.allowed[i]
        return sum(self.dur[i][d] for d in a) / len(a)

    def mean_comm(self, nbytes: int, devices=None) -> float:
        """Average transfer time of ``nbytes`` over ordered pairs of ``devices``."""
        ds = range(self.nd) if devices is None else devices
        pairs = [(a, b) for a in ds for b in ds if a != b]
        if not pairs or nbytes <= 0:
            return 0.0
        return sum(self.comm(a, b, nbytes) for a, b in pairs) / len(pairs)

    def bottom_levels(self, comm_devices=None) -> list[float]:
        """Longest path (mean compute + mean comm) from each op to a sink."""
        n = self.n
        mean = [self.mean_dur(i) for i in range(n)]
        ds = list(range(self.nd)) if comm_devices is None else list(comm_devices)
        pairs = [(a, b) for a in ds for b in ds if a != b]
        b0 = sum(self.beta0[a][b] for a, b in pairs) / len(pairs) if pairs else 0.0
        b1 = sum(self.beta1[a][b] for a, b in pairs) / len(pairs) if pairs else 0.0
        # mean edge comm, weighted by the chance (1 - 1/D) that the ends differ
        frac = (1.0 - 1.0 / len(ds)) if ds else 0.0
        bl = [0.0] * n
        for i in reversed(self.graph.topo_idx()):
            best = 0.0
            for j, nb in self.outs[i]:
                v = bl[j]
                if nb > 0:
                    v += frac * (b0 + b1 * nb)
                if v > best:
                    best = v
            bl[i] = mean[i] + best
        return bl


class MemoryTracker:
    """Baechi-style memory accounting while ops are placed one by one.

    ``fits(i, d)`` says whether op ``i`` can go on device ``d`` now;
    ``commit(i, d)`` records it. ``used[d]`` is the bytes held on ``d``,
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

    def need(self, i: int, d: int) -> int:
        """Bytes ``d`` must hold at once to place op ``i`` there now."""
        p = self.p
        u = p.unit[i]
        extra = p.unit_persistent[u] if self.unit_dev[u] < 0 else 0
        extra += p.out[i] + p.temp[i]
        sent, place = self.sent, self.place
        for q, ts in p.ins[i]:
            if place[q] != d:
                for t, b in ts:
                    if b and (t, d) not in sent:
                        extra += b
        return extra

    def fits(self, i: int, d: int) -> bool:
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
