"""The problem arrays: one integer-indexed view of a (graph, cluster) pair.

Every placer, the scheduling engine, the memory model, CP-SAT and the bounds
read these arrays instead of building their own. :meth:`Problem.of` builds them
once per (graph, cluster) and caches them on the (immutable) graph.

Indices: op ``i`` is ``graph.names[i]``, device ``d`` is ``cluster.devices[d]``,
tensor ``t`` is ``graph.tensors[t]``, link ``l`` is ``cluster.links[l]``.

Examples
--------
>>> from pesto.graph import OpGraph
>>> from pesto.cluster import gpus
>>> g = OpGraph.from_edges({"a": 2, "b": 3}, [("a", "b", 100)])
>>> p = Problem.of(g, gpus(2, beta=(1.0, 0.01)))
>>> p.n, p.nd, p.dur[1], p.comm(0, 1, 100)
(2, 2, [3.0, 3.0], 2.0)
>>> Problem.of(g, p.cluster) is p
True
"""
from __future__ import annotations

from .cluster import Cluster
from .dag import bottom_levels
from .errors import InfeasibleError
from .graph import OpGraph

__all__ = ["Problem"]

INF = float("inf")


class Problem:
    """Arrays of a (graph, cluster) pair, built once (O(ops + edges + devices²)).

    Attributes
    ----------
    graph, cluster : what the arrays describe
    n, nd, n_links : number of ops, devices and link resources
    names, index : op names and name -> index (the graph's)
    dev_names, dev_index, cap : device names, name -> index, memory capacity
    unit, members : colocation units (a group, or an op alone): ``unit[i]`` is
        the unit of op ``i``, ``members[u]`` its ops
    allowed : per op, the devices it may run on (a kind every member of its
        unit allows)
    dur : ``dur[i][d]`` compute time of op ``i`` on device ``d`` (µs; inf if not allowed)
    persistent, out, temp : per-op memory (bytes); ``unit_persistent`` per unit
    tensor_bytes : per tensor
    tensors : per tensor ``(name, producer, bytes, consumers)`` (distinct consumers)
    ins : per op, ``(pred, ((tensor, bytes), ...))`` for every in-edge
    outs : per op, ``(succ, bytes on the edge)`` for every out-edge
    succ, pred, topo : adjacency lists and a topological order (the graph's)
    beta0, beta1 : per (src, dst) device pair, the route's comm fit (0 on the diagonal)
    links : per (src, dst), the link indices a transfer holds (empty when the
        cluster is contention free)
    route_links : per (src, dst), the route's link indices whatever the contention model

    Raises
    ------
    InfeasibleError
        An op or colocation group can run on no device of the cluster.
    """

    def __init__(self, graph: OpGraph, cluster: Cluster):
        self.graph, self.cluster = graph, cluster
        self.n = graph.num_ops
        self.names, self.index = graph.names, graph.index
        devs = cluster.devices
        self.nd = len(devs)
        self.dev_names = [d.name for d in devs]
        self.dev_index = dict(cluster.index)
        self.cap = [d.memory for d in devs]
        self.succ, self.pred = graph.succ_idx(), graph.pred_idx()
        self.topo = graph.topo_idx()
        self._units(graph, cluster)
        self._compute(graph, cluster)
        self._tensors(graph)
        self._routes(cluster)

    @classmethod
    def of(cls, graph: OpGraph, cluster: Cluster) -> "Problem":
        """The cached Problem of ``(graph, cluster)`` (built on first use).

        The cache lives on the graph and is keyed by the cluster object, so two
        equal clusters built separately get separate (equal) arrays.
        """
        cache = graph.__dict__.setdefault("_problem_cache", {})
        hit = cache.get(id(cluster))
        if hit is not None and hit.cluster is cluster:
            return hit
        if len(cache) > 8:  # placers hand around a few clusters at most
            cache.clear()
        prob = cache[id(cluster)] = cls(graph, cluster)
        return prob

    # -- construction ------------------------------------------------------------
    def _units(self, graph: OpGraph, cluster: Cluster) -> None:
        ops, index, devs = graph.ops, graph.index, cluster.devices
        self.unit = [-1] * self.n
        self.members: list[list[int]] = []
        for members in graph.colocation_groups().values():
            u = len(self.members)
            self.members.append([index[m] for m in members])
            for m in members:
                self.unit[index[m]] = u
        for i in range(self.n):
            if self.unit[i] < 0:
                self.unit[i] = len(self.members)
                self.members.append([i])
        unit_allowed = []
        for mem in self.members:
            kinds = frozenset.intersection(*(ops[i].kinds for i in mem))
            ok = [d for d in range(self.nd) if devs[d].kind in kinds]
            if not ok:
                _no_device(ops, mem, kinds, devs)
            unit_allowed.append(ok)
        self.allowed = [unit_allowed[self.unit[i]] for i in range(self.n)]

    def _compute(self, graph: OpGraph, cluster: Cluster) -> None:
        devs = cluster.devices
        self.dur = [[(op.compute[d.kind] / d.speed) if d.kind in op.kinds else INF for d in devs]
                    for op in graph.ops]
        self.persistent = [op.persistent_bytes for op in graph.ops]
        self.out = [op.output_bytes for op in graph.ops]
        self.temp = [op.temporary_bytes for op in graph.ops]
        self.unit_persistent = [sum(self.persistent[i] for i in mem) for mem in self.members]

    def _tensors(self, graph: OpGraph) -> None:
        index = graph.index
        tid = {t.name: k for k, t in enumerate(graph.tensors)}
        self.tensor_bytes = [t.bytes for t in graph.tensors]
        self.tensors = graph.tensor_table()
        self.ins: list[list] = [[] for _ in range(self.n)]
        self.outs: list[list] = [[] for _ in range(self.n)]
        for e in graph.edges:
            ts = tuple((tid[t], self.tensor_bytes[tid[t]]) for t in e.tensors)
            self.ins[index[e.dst]].append((index[e.src], ts))
            self.outs[index[e.src]].append((index[e.dst], sum(b for _, b in ts)))

    def _routes(self, cluster: Cluster) -> None:
        nd = self.nd
        link_id = {l: k for k, l in enumerate(cluster.links)}
        self.n_links = len(link_id)
        self.beta0 = [[0.0] * nd for _ in range(nd)]
        self.beta1 = [[0.0] * nd for _ in range(nd)]
        self.route_links: list[list[tuple]] = [[()] * nd for _ in range(nd)]
        for a in range(nd):
            for b in range(nd):
                if a != b:
                    r = cluster.route(self.dev_names[a], self.dev_names[b])
                    self.beta0[a][b], self.beta1[a][b] = r.beta0, r.beta1
                    self.route_links[a][b] = tuple(link_id[l] for l in r.links)
        self.links = ([[()] * nd for _ in range(nd)] if cluster.contention_free else self.route_links)

    # -- queries -----------------------------------------------------------------
    def comm(self, a: int, b: int, nbytes: int) -> float:
        """Transfer time from device ``a`` to ``b`` (0 on one device or for 0 bytes)."""
        if a == b or nbytes <= 0:
            return 0.0
        return self.beta0[a][b] + self.beta1[a][b] * nbytes

    def fastest(self, i: int) -> float:
        """Compute time of op ``i`` on its fastest allowed device."""
        return min(self.dur[i][d] for d in self.allowed[i])

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

    def placement_index(self, placement) -> list[int]:
        """Device index per op of a name -> device-name mapping."""
        di = self.dev_index
        return [di[placement[nm]] for nm in self.names]

    def mean_bottom_levels(self, comm_devices=None) -> list[float]:
        """Longest path (mean compute + expected mean comm) from each op's start
        to a sink: HEFT's upward rank, placement-free."""
        ds = list(range(self.nd)) if comm_devices is None else list(comm_devices)
        pairs = [(a, b) for a in ds for b in ds if a != b]
        b0 = sum(self.beta0[a][b] for a, b in pairs) / len(pairs) if pairs else 0.0
        b1 = sum(self.beta1[a][b] for a, b in pairs) / len(pairs) if pairs else 0.0
        frac = (1.0 - 1.0 / len(ds)) if ds else 0.0  # chance the two ends differ
        outs = self.outs
        out_bytes = [dict() for _ in range(self.n)]
        for i in range(self.n):
            for j, nb in outs[i]:
                out_bytes[i][j] = nb
        def edge(i, j):
            nb = out_bytes[i][j]
            return frac * (b0 + b1 * nb) if nb > 0 else 0.0
        return bottom_levels(self.succ, [self.mean_dur(i) for i in range(self.n)],
                             edge=edge, order=self.topo)

    def placed_bottom_levels(self, dev) -> list[float]:
        """Longest path from each op's start to a sink under placement ``dev``
        (device index per op): compute on its device, a transfer on every edge
        whose ends differ (``beta0 + beta1 * bytes``, no queueing)."""
        dur, b0, b1, outs = self.dur, self.beta0, self.beta1, self.outs
        rank = [0.0] * self.n
        for i in reversed(self.topo):
            best = 0.0
            a = dev[i]
            for j, nb in outs[i]:
                v = rank[j]
                b = dev[j]
                if a != b and nb > 0:
                    v += b0[a][b] + b1[a][b] * nb
                if v > best:
                    best = v
            rank[i] = dur[i][a] + best
        return rank


def _no_device(ops, mem, kinds, devs):
    first = ops[mem[0]]
    if len(mem) == 1:
        raise InfeasibleError(
            f"op {first.name!r} may run on kinds {sorted(first.kinds)} but the cluster has "
            f"only {sorted({d.kind for d in devs})}", culprit=first.name)
    raise InfeasibleError(
        f"colocation group {first.colocation_group!r} has no device kind allowed for all "
        f"its ops ({len(mem)} ops, kinds {sorted(kinds)})", culprit=first.colocation_group)
