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


import numpy as np

from .cluster import Cluster
from .dag import bottom_levels
from .errors import InfeasibleError
from .graph import OpGraph, gc_paused
from .kernels import placed_ranks

__all__ = ["Problem", "GraphArrays", "view_shares"]

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
    persistent, out, temp : per-op memory (bytes): persistent, the outputs' bytes the op
        allocates on its device (:attr:`~pesto.graph.Op.allocated_bytes`: a view of a
        buffer the device holds takes none) and temporary; ``unit_persistent`` per unit
    tensor_bytes, tensor_view : per tensor, its bytes and the bytes of it that are a view
        (:attr:`GraphArrays.tview`: held on its producer's device as another op's buffer)
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
        # millions of small tuples and lists, no cycle among them: without the
        # collector this takes a quarter of the time on 200k ops
        with gc_paused():
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
        by_kinds: dict = {}  # kinds -> allowed devices (one list shared by the ops of those kinds)
        for mem in self.members:
            kinds = ops[mem[0]].kinds if len(mem) == 1 else frozenset.intersection(*(ops[i].kinds for i in mem))
            ok = by_kinds.get(kinds)
            if ok is None:
                ok = by_kinds[kinds] = [d for d in range(self.nd) if devs[d].kind in kinds]
            if not ok:
                _no_device(ops, mem, kinds, devs)
            unit_allowed.append(ok)
        unit = self.unit
        self.allowed = [unit_allowed[unit[i]] for i in range(self.n)]

    def _compute(self, graph: OpGraph, cluster: Cluster) -> None:
        kinds = [(d.kind, d.speed) for d in cluster.devices]
        self.dur = [[(op.compute[k] / v) if k in op.kinds else INF for k, v in kinds] for op in graph.ops]
        self.persistent = [op.persistent_bytes for op in graph.ops]
        self.out = [op.allocated_bytes for op in graph.ops]
        self.temp = [op.temporary_bytes for op in graph.ops]
        self.unit_persistent = [sum(self.persistent[i] for i in mem) for mem in self.members]

    def _tensors(self, graph: OpGraph) -> None:
        index = graph.index
        tid = {t.name: k for k, t in enumerate(graph.tensors)}
        self.tensor_bytes = [t.bytes for t in graph.tensors]
        viewed = any(op.view_bytes for op in graph.ops)   # the tensor arrays only when some op has a view
        self.tensor_view = GraphArrays.of(graph).tview.tolist() if viewed else [0] * len(self.tensor_bytes)
        self.tensors = graph.tensor_table()
        self.ins: list[list] = [[] for _ in range(self.n)]
        self.outs: list[list] = [[] for _ in range(self.n)]
        tb = self.tensor_bytes
        one = {name: ((k, tb[k]),) for name, k in tid.items()}  # the common edge: one tensor
        ins, outs = self.ins, self.outs
        for e in graph.edges:
            names = e.tensors
            if len(names) == 1:
                ts = one[names[0]]
                nb = ts[0][1]
            else:
                ts = tuple((tid[t], tb[tid[t]]) for t in names)
                nb = sum(b for _, b in ts)
            i, j = index[e.src], index[e.dst]
            ins[j].append((i, ts))
            outs[i].append((j, nb))

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
        if nbytes <= 0:
            return 0.0
        b0, b1 = self._mean_beta(None if devices is None else tuple(devices))
        return b0 + b1 * nbytes

    def _mean_beta(self, devices: tuple | None) -> tuple[float, float]:
        """Mean ``beta0`` and ``beta1`` over ordered pairs of ``devices`` (all:
        None), cached: a transfer's time is linear in its bytes, so its mean is
        too, and m-SCT asks once per edge (O(devices^2) each on 500 GPUs)."""
        cache = self.__dict__.setdefault("_mean_beta_cache", {})
        if devices not in cache:
            ds = range(self.nd) if devices is None else devices
            pairs = [(a, b) for a in ds for b in ds if a != b]
            n = max(1, len(pairs))
            cache[devices] = (sum(self.beta0[a][b] for a, b in pairs) / n,
                              sum(self.beta1[a][b] for a, b in pairs) / n)
        return cache[devices]

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
        return placed_ranks(self, dev).tolist()  # compiled: a search calls it per move


def _no_device(ops, mem, kinds, devs):
    first = ops[mem[0]]
    if len(mem) == 1:
        raise InfeasibleError(
            f"op {first.name!r} may run on kinds {sorted(first.kinds)} but the cluster has "
            f"only {sorted({d.kind for d in devs})}", culprit=first.name)
    raise InfeasibleError(
        f"colocation group {first.colocation_group!r} has no device kind allowed for all "
        f"its ops ({len(mem)} ops, kinds {sorted(kinds)})", culprit=first.colocation_group)


class _Lazy:
    """A GraphArrays attribute built, with its siblings, by ``builder`` on first
    read (a non-data descriptor: the built value in the instance wins)."""

    def __init__(self, builder):
        self.builder = builder

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        self.builder(obj)
        return obj.__dict__[self.name]


def _frozen(obj, **arrays) -> None:
    """Set ``arrays`` on ``obj``, numpy ones read-only (they are shared through the cache)."""
    for name, a in arrays.items():
        if isinstance(a, np.ndarray):
            a.setflags(write=False)
        obj.__dict__[name] = a


def _kind_arrays(ga: "GraphArrays") -> None:
    ops, n = ga.graph.ops, ga.n
    kinds = sorted(ga.graph.kinds())
    kidx = {k: i for i, k in enumerate(kinds)}
    K = len(kinds)
    comp = np.zeros((n, K))
    mask = np.zeros(n, dtype=np.int64)
    group = np.full(n, -1, dtype=np.int64)
    gid: dict[str, int] = {}
    for i, op in enumerate(ops):
        bits = 0
        for k in op.kinds:
            comp[i, kidx[k]] = op.compute[k]
            bits |= 1 << kidx[k]
        mask[i] = bits
        if op.colocation_group is not None:
            group[i] = gid.setdefault(op.colocation_group, len(gid))
    gmask = [-1] * len(gid)  # never 0: OpGraph rejects a group with no common kind
    for i in np.flatnonzero(group >= 0).tolist():
        gmask[group[i]] &= int(mask[i])
    allowed = (mask[:, None] & (1 << np.arange(K, dtype=np.int64))[None, :]) != 0
    time = np.where(allowed, comp, np.inf).min(axis=1) if K else np.zeros(n)
    _frozen(ga, kinds=kinds, K=K, comp=comp, mask=mask, time=time, group=group,
            group_names=list(gid), group_mask=gmask)


def _edge_arrays(ga: "GraphArrays") -> None:
    graph = ga.graph
    idx = graph.index
    tensors, edges = graph.tensors, graph.edges
    tindex = {t.name: i for i, t in enumerate(tensors)}
    esrc = np.array([idx[e.src] for e in edges], dtype=np.int64)
    edst = np.array([idx[e.dst] for e in edges], dtype=np.int64)
    ntens = np.array([len(e.tensors) for e in edges], dtype=np.int64)
    tbytes = np.array([t.bytes for t in tensors], dtype=np.int64)
    tsrc = np.array([idx[t.src] for t in tensors], dtype=np.int64)
    _frozen(ga, esrc=esrc, edst=edst, ectrl=ntens == 0,
            T=len(tensors), tnames=[t.name for t in tensors], tbytes=tbytes, tsrc=tsrc,
            tview=view_shares(graph, tsrc, tbytes),
            pu=np.repeat(esrc, ntens), pv=np.repeat(edst, ntens),
            pt=np.array([tindex[t] for e in edges for t in e.tensors], dtype=np.int64),
            pe=np.repeat(np.arange(len(edges), dtype=np.int64), ntens))


def view_shares(graph: OpGraph, tsrc, tbytes) -> np.ndarray:
    """Per tensor (producer ``tsrc``, ``tbytes`` bytes), the bytes of it that are
    a view: its producer's :attr:`~pesto.graph.Op.view_bytes` shared over the
    producer's tensors in proportion to their bytes (rounded down), at most the
    tensor's bytes. A ``ReadVariableOp``'s one tensor is all view.

    >>> from pesto.graph import Op, Tensor
    >>> g = OpGraph([Op("r", {"GPU": 1.0}, output_bytes=64, view_bytes=64), Op("x", {"GPU": 1.0}, output_bytes=8)],
    ...             tensors=[Tensor("r:0", "r", 64), Tensor("x:0", "x", 8)])
    >>> view_shares(g, np.array([0, 1]), np.array([64, 8])).tolist()
    [64, 0]
    """
    ops = graph.ops
    view = np.fromiter((o.view_bytes for o in ops), dtype=np.int64, count=len(ops))
    tsrc, tbytes = np.asarray(tsrc, dtype=np.int64), np.asarray(tbytes, dtype=np.int64)
    if not view.any() or not len(tsrc):
        return np.zeros(len(tsrc), dtype=np.int64)
    made = np.bincount(tsrc, weights=tbytes, minlength=len(ops)).astype(np.int64)
    out = np.fromiter((o.output_bytes for o in ops), dtype=np.int64, count=len(ops))
    whole = np.maximum(np.maximum(made, out), 1)[tsrc]
    share = np.floor(tbytes * (view[tsrc] / whole)).astype(np.int64)   # floats: no int64 overflow
    return np.minimum(tbytes, share)


def _data_arrays(ga: "GraphArrays") -> None:
    dsucc = ga.graph.data_succ_idx()  # the simulator builds these tables anyway
    _frozen(ga, data_src=np.repeat(np.arange(ga.n, dtype=np.int64), [len(s) for s in dsucc]),
            data_dst=np.array([j for s in dsucc for j in s], dtype=np.int64))


class GraphArrays:
    """Cluster-free numpy arrays of an OpGraph, built once (O(ops + edges)).

    What the coarsener and the vectorised memory peak read; :class:`Problem`
    is the (graph, cluster) view. Get it with :meth:`GraphArrays.of` (cached
    on the graph). The arrays are read-only: copy before changing one. The
    per-op bytes and data edges are built at once; the kind and the edge /
    tensor arrays and the data edges on first read (the simulator's memory
    peak needs no kinds, the coarsener no data edges).

    Attributes
    ----------
    graph, n, names : the graph, its op count and op names
    pers, out, temp : persistent, allocated output (:attr:`~pesto.graph.Op.allocated_bytes`:
        ``output_bytes`` less ``view_bytes``) and temporary bytes per op
    data_src, data_dst : endpoints of the edges that carry a tensor, by source op
    topo : a topological order (the graph's)
    kinds, K : the device kinds (sorted) and their number; kind ``k`` is bit ``k``
    comp : ``n x K`` compute per kind (0 where the kind is not allowed)
    mask : allowed kinds per op, as bits
    time : compute on the fastest allowed kind
    group, group_names, group_mask : colocation group id per op (-1: none),
        group names by id, and the AND of the members' kind masks per group
    esrc, edst, ectrl : endpoints of every edge (the graph's order) and
        whether it is a control edge
    pu, pv, pt, pe : one row per (edge, tensor): producer, consumer, tensor
        id, edge id
    T, tnames, tbytes, tsrc : tensor count, names, bytes and producer
    tview : per tensor, the bytes of it that are a view (its producer's
        ``view_bytes`` shared over its tensors in proportion to their bytes)

    Examples
    --------
    >>> g = OpGraph.from_edges({"a": 2, "b": 3}, [("a", "b", 100)])
    >>> ga = GraphArrays.of(g)
    >>> ga.kinds, ga.time.tolist(), ga.pu.tolist(), ga.pv.tolist(), ga.tbytes.tolist()
    (['GPU'], [2.0, 3.0], [0], [1], [100])
    >>> GraphArrays.of(g) is ga
    True
    """

    kinds, K, comp, mask, time, group, group_names, group_mask = (_Lazy(_kind_arrays) for _ in range(8))
    esrc, edst, ectrl, T, tnames, tbytes, tsrc, tview, pu, pv, pt, pe = (_Lazy(_edge_arrays) for _ in range(12))
    data_src, data_dst = (_Lazy(_data_arrays) for _ in range(2))

    def __init__(self, graph: OpGraph):
        self.graph = graph
        self.n = graph.num_ops
        self.names = graph.names
        ops = graph.ops
        _frozen(self, pers=np.array([o.persistent_bytes for o in ops], dtype=np.int64),
                out=np.array([o.allocated_bytes for o in ops], dtype=np.int64),
                temp=np.array([o.temporary_bytes for o in ops], dtype=np.int64),
                topo=np.array(graph.topo_idx(), dtype=np.int64))

    @classmethod
    def of(cls, graph: OpGraph) -> "GraphArrays":
        """The cached arrays of ``graph`` (built on first use; the graph is immutable)."""
        hit = graph.__dict__.get("_graph_arrays")
        if hit is None:
            hit = graph.__dict__["_graph_arrays"] = cls(graph)
        return hit

