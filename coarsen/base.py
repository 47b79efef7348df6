"""Shared machinery of the coarseners: integer arrays of the fine graph, the
:class:`CoarseGraph` result, aggregation, expansion of a coarse plan and the
report.

Every coarsener works on :class:`~pesto.problem.GraphArrays` (the graph's
integer-indexed numpy arrays, cached on the :class:`~pesto.graph.OpGraph`) and
ends with a labelling
``label[i] = coarse vertex of fine op i``; :func:`build_coarse` turns that into
a validated coarse :class:`~pesto.graph.OpGraph` exactly once.

Aggregation rules (one coarse vertex = its members):

* compute per kind = sum over members, for the kinds every member allows
  (kinds = intersection, never empty);
* persistent bytes summed, temporary bytes = max, output bytes = bytes of the
  distinct fine tensors leaving the vertex;
* coarse edges carry the distinct *fine* tensors (same names, ``src`` = the
  coarse vertex) so a tensor read by two vertices on one remote device is
  still sent once; internal edges vanish; a control edge between two vertices
  survives only where no tensor edge joins them;
* colocation groups are constraints, not merged blindly: every coarse vertex
  holding members of a group gets that group's name; if a vertex holds
  members of several groups, those groups are united (union-find) so each
  vertex has one well-defined group.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

from pesto.dag import UnionFind, find_cycle, priority_order
from pesto.errors import CycleError, InfeasibleError, InvalidPlanError
from pesto.graph import Edge, Op, OpGraph, Tensor
from pesto.plan import Plan
from pesto.problem import GraphArrays

__all__ = ["CoarseGraph", "CoarsenReport", "build_coarse", "coarse_edges", "ccr", "DEFAULT_BETA",
           "kahn_heights", "path_levels", "critical_path"]

# NVLink V100 fit of the Pesto paper (µs, µs/byte), used when no cluster is given.
DEFAULT_BETA = (40.77, 2.0757e-5)


def coarse_edges(ga: GraphArrays, label: np.ndarray, m: int):
    """Edges between distinct coarse vertices of the partition ``label``.

    Returns ``(eu, ev, ebytes)``: unique pairs, bytes = distinct fine tensors
    on that pair (control-only pairs have 0 bytes).
    """
    cu, cv = label[ga.pu], label[ga.pv]
    keep = cu != cv
    T = max(ga.T, 1)
    key = uniq((cu[keep] * m + cv[keep]) * T + ga.pt[keep])
    pair = key // T
    tb = ga.tbytes[key % T] if len(key) else np.zeros(0, dtype=np.int64)
    cs, cd = label[ga.esrc[ga.ectrl]], label[ga.edst[ga.ectrl]]
    ck = cs != cd
    allpairs = np.concatenate([pair, cs[ck] * m + cd[ck]])
    allbytes = np.concatenate([tb, np.zeros(int(ck.sum()), dtype=np.int64)])
    o = np.argsort(allpairs, kind="stable")
    sp = allpairs[o]
    first = np.r_[True, sp[1:] != sp[:-1]] if len(sp) else np.zeros(0, dtype=bool)
    up = sp[first]
    eb = np.add.reduceat(allbytes[o], np.flatnonzero(first)).astype(float) if len(up) else np.zeros(0)
    return up // m, up % m, eb


def uniq(a: np.ndarray) -> np.ndarray:
    """Sorted distinct values (sort-based: numpy 2's hash-based ``np.unique`` is
    ~100x slower on 1e5 int64 keys)."""
    a = np.sort(a)
    return a[np.r_[True, a[1:] != a[:-1]]] if len(a) else a


def kahn_heights(m: int, eu: np.ndarray, ev: np.ndarray, times=None):
    """Heights by Kahn's pass removing all sources at once (roots have height 1).

    Returns ``(H, succ_flat, succ_off)`` with ``H`` a list, or raises
    :class:`CycleError` (with coarse vertex ids) if the edges close a cycle.
    H(v) = 1 + max H(pred): every edge goes strictly up in height. With
    ``times`` (compute per vertex) it also returns the top and bottom levels
    (as :func:`path_levels`), from the same pass: ``(H, flat, off, top, bottom)``.

    Kahn's pass and the longest path (in edges) in one loop over flat CSR
    arrays: it runs once per merge round on a fresh coarse edge list, where
    :func:`pesto.dag.toposort` plus :func:`pesto.dag.top_levels` would need
    per-vertex lists and two passes. Only the cycle report is shared
    (:func:`pesto.dag.find_cycle`).
    """
    order = np.argsort(eu, kind="stable")
    flat = ev[order].tolist()
    off = np.searchsorted(eu[order], np.arange(m + 1)).tolist()
    indeg = np.bincount(ev, minlength=m).tolist()
    H = [1] * m
    t = [0.0] * m if times is None else np.asarray(times, dtype=float).tolist()
    top = [0.0] * m
    queue = [i for i in range(m) if indeg[i] == 0]
    for u in queue:  # the list grows while we walk it
        hu, fu = H[u] + 1, top[u] + t[u]
        for w in flat[off[u]:off[u + 1]]:
            if H[w] < hu:
                H[w] = hu
            if top[w] < fu:
                top[w] = fu
            indeg[w] -= 1
            if indeg[w] == 0:
                queue.append(w)
    if len(queue) < m:
        succ = [flat[off[i]:off[i + 1]] for i in range(m)]
        cycle = find_cycle(succ, {i for i in range(m) if indeg[i] > 0})
        raise CycleError([f"v{k}" for k in cycle], what="coarse graph")
    if times is None:
        return H, flat, off
    return H, flat, off, np.array(top), np.array(_bottom(queue, flat, off, t))


def path_levels(m, flat, off, H, t):
    """Top level (earliest start) and bottom level (longest compute path from the
    vertex's start to a sink) of every vertex, compute only."""
    order = np.argsort(np.asarray(H), kind="stable").tolist()  # edges go up in H
    top = [0.0] * m
    for u in order:
        fu = top[u] + t[u]
        for w in flat[off[u]:off[u + 1]]:
            if top[w] < fu:
                top[w] = fu
    return np.array(top), np.array(_bottom(order, flat, off, t))


def _bottom(order, flat, off, t) -> list[float]:
    """Longest compute path from each vertex's start to a sink, given a
    topological ``order`` of the CSR graph ``flat``/``off``."""
    bottom = [0.0] * len(order)
    for u in reversed(order):
        b = 0.0
        for w in flat[off[u]:off[u + 1]]:
            if bottom[w] > b:
                b = bottom[w]
        bottom[u] = t[u] + b
    return bottom


def critical_path(ga: GraphArrays, label: np.ndarray, m: int, times=None) -> float:
    """Longest compute-only path of the partition ``label`` (vertex time = sum of
    its members' fastest-kind compute, or ``times`` per vertex); raises
    :class:`CycleError` if the quotient graph has a cycle."""
    eu, ev, _ = coarse_edges(ga, label, m)
    if times is None:
        times = np.bincount(label, weights=ga.time, minlength=m)
    _, _, _, top, bottom = kahn_heights(m, eu, ev, times)
    return float((top + bottom).max(initial=0.0))


def ccr(ga: GraphArrays, label: np.ndarray, m: int, beta=DEFAULT_BETA) -> float:
    """Communication-to-computation ratio of the partition ``label``.

    Numerator: one transfer ``beta0 + beta1 * bytes`` per distinct (fine
    tensor, consumer vertex other than its producer's) with bytes > 0 — the
    transfers if every vertex sat on its own device. Denominator: total compute
    (fastest allowed kind), which coarsening conserves.
    """
    cu, cv = label[ga.pu], label[ga.pv]
    keep = cu != cv
    key = uniq(cv[keep] * max(ga.T, 1) + ga.pt[keep])
    b = ga.tbytes[key % max(ga.T, 1)]
    b = b[b > 0]
    comm = len(b) * beta[0] + beta[1] * float(b.sum())
    work = float(ga.time.sum())
    return comm / work if work > 0 else float("inf") if comm else 0.0


def beta_of(cluster) -> tuple:
    """(beta0, beta1) of the first GPU-to-GPU route of ``cluster`` (or any route)."""
    if cluster is None:
        return DEFAULT_BETA
    routes = list(cluster.routes)
    gpu = [r for r in routes if cluster.device(r.src).kind == "GPU" and cluster.device(r.dst).kind == "GPU"]
    r = (gpu or routes or [None])[0]
    return DEFAULT_BETA if r is None else (r.beta0, r.beta1)


@dataclass
class CoarsenReport:
    """What a coarsening run did.

    ``rounds`` is a list of dicts (``round``, ``vertices``, ``edges``,
    ``merged``, ``seconds``, plus method-specific keys such as caps).
    ``work``, ``cp_before``, ``cp_after``: total compute and the compute-only
    critical paths of the fine and the coarse graph (fastest kind; a coarse
    vertex on its members' common fastest kind), from which
    ``parallelism_before/after/kept``. ``keep`` and ``kept_at`` (method
    "parallel"; None otherwise): the parallelism fraction aimed at and the
    smallest vertex count at which the run still kept it.
    """

    method: str
    target: int
    vertices_before: int
    edges_before: int
    vertices: int = 0
    edges: int = 0
    seconds: float = 0.0
    ccr_before: float = 0.0
    ccr_after: float = 0.0
    reached: bool = False
    rounds: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    work: float = 0.0
    cp_before: float = 0.0
    cp_after: float = 0.0
    keep: float | None = None
    kept_at: int | None = None

    @property
    def parallelism_before(self) -> float:
        """Work / critical path of the fine graph (compute only, fastest kind)."""
        return self.work / self.cp_before if self.cp_before > 0 else 1.0

    @property
    def parallelism_after(self) -> float:
        """Work / critical path of the coarse graph (compute only, fastest kind)."""
        return self.work / self.cp_after if self.cp_after > 0 else 1.0

    @property
    def parallelism_kept(self) -> float:
        """``parallelism_after / parallelism_before`` (= fine / coarse critical path)."""
        return self.cp_before / self.cp_after if self.cp_after > 0 else 1.0

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d.update(parallelism_before=self.parallelism_before, parallelism_after=self.parallelism_after,
                 parallelism_kept=self.parallelism_kept)
        return d

    def __str__(self):
        return (f"coarsen[{self.method}]: {self.vertices_before} ops/{self.edges_before} edges -> "
                f"{self.vertices} vertices/{self.edges} edges (target {self.target}"
                f"{'' if self.reached else ', not reached'}) in {len(self.rounds)} rounds, "
                f"{self.seconds:.3f} s; CCR {self.ccr_before:.3f} -> {self.ccr_after:.3f}; parallelism "
                f"{self.parallelism_before:.2f} -> {self.parallelism_after:.2f} "
                f"({self.parallelism_kept:.0%} kept)")


class CoarseGraph:
    """A coarse OpGraph plus the map back to the fine ops.

    Attributes
    ----------
    graph : OpGraph
        The coarse graph (one op per vertex).
    original : OpGraph
        The fine graph.
    members : dict vertex -> list of fine op names, in a topological order.
    vertex_of : dict fine op -> vertex.
    report : CoarsenReport
    """

    def __init__(self, graph: OpGraph, original: OpGraph, members: dict, report: CoarsenReport):
        self.graph = graph
        self.original = original
        self.members = members
        self.vertex_of = {op: v for v, ms in members.items() for op in ms}
        self.report = report

    def __repr__(self):
        return f"CoarseGraph({self.original.num_ops} ops -> {self.graph.num_ops} vertices, {self.report.method})"

    def expand(self, coarse_plan: Plan) -> Plan:
        """A plan for every fine op: each op on its vertex's device; per device,
        the coarse order with every vertex replaced by its members in their
        internal topological order. No times (simulate it for those).

        Raises
        ------
        InvalidPlanError
            The coarse plan misses a vertex.
        """
        placement, order = {}, {}
        seen = set()
        for dev, seq in coarse_plan.order.items():
            out = order.setdefault(dev, [])
            for v in seq:
                ms = self.members.get(v)
                if ms is None:
                    raise InvalidPlanError([f"coarse plan orders unknown vertex {v!r} on {dev}"])
                seen.add(v)
                out.extend(ms)
                for op in ms:
                    placement[op] = dev
        missing = [v for v in self.members if v not in seen]
        if missing:
            raise InvalidPlanError([f"coarse plan does not order vertex {v!r}" for v in missing[:20]])
        stats = dict(coarse_plan.stats)
        stats.update(coarse_vertices=self.graph.num_ops, coarse_makespan=coarse_plan.makespan,
                     coarse_lower_bound=coarse_plan.lower_bound)
        return Plan(placement, order, status=coarse_plan.status, placer=coarse_plan.placer,
                    wall_time=coarse_plan.wall_time, stats=stats)


    def project(self, plan: Plan, cluster=None) -> Plan:
        """The coarse plan closest to a plan of the fine graph.

        Each vertex goes to the device holding most of its members' compute
        (a unique device when the coarsening was made with
        ``partition=plan.placement``); vertices sharing a colocation group vote
        together, and with ``cluster`` only devices of a kind the vertex allows
        are chosen. The order is a topological order of the coarse graph by
        the earliest start of each vertex's members (their position in their
        device's order if the plan has no times), so it never deadlocks. No
        times: simulate it (or give it to CP-SAT as a hint).

        Examples
        --------
        >>> import coarsen
        >>> from pesto.graph import OpGraph
        >>> g = OpGraph.from_edges({"a": 1, "b": 1, "c": 1, "d": 1}, [("a", "b"), ("c", "d")])
        >>> fine = Plan.from_placement(g, {"a": "/GPU:0", "b": "/GPU:0", "c": "/GPU:1", "d": "/GPU:1"})
        >>> cg = coarsen.coarsen(g, 2, partition=fine.placement)
        >>> cg.expand(cg.project(fine)).placement == fine.placement
        True
        """
        fine, coarse = self.original, self.graph
        missing = [op for op in fine.names if op not in plan.placement]
        if missing:
            raise InvalidPlanError([f"the plan does not place op {op!r}" for op in missing[:20]])
        if plan.start is not None:
            when = plan.start
        else:
            when = {op: float(k) for seq in plan.order.values() for k, op in enumerate(seq)}
        # votes per colocation unit of the coarse graph (a group, or a vertex alone)
        unit = {v: coarse.op(v).colocation_group or ("vertex", v) for v in coarse.names}
        votes: dict = {}
        for v, ms in self.members.items():
            box = votes.setdefault(unit[v], {})
            for op in ms:
                o = fine.op(op)
                w = 1e-6 + min(o.compute.values(), default=0.0)
                d = plan.placement[op]
                box[d] = box.get(d, 0.0) + w
        allowed: dict = {}
        if cluster is not None:
            for v in coarse.names:
                ks = coarse.op(v).kinds
                ok = {d.name for d in cluster.devices if d.kind in ks}
                allowed[unit[v]] = allowed.get(unit[v], ok) & ok
        choice = {}
        for u, box in votes.items():
            ok = allowed.get(u)
            cand = {d: w for d, w in box.items() if ok is None or d in ok}
            if cand:
                choice[u] = max(sorted(cand), key=lambda d: cand[d])
            elif ok:
                choice[u] = sorted(ok)[0]
            else:
                raise InvalidPlanError([f"no device of the cluster suits coarse unit {u!r}"])
        placement = {v: choice[unit[v]] for v in coarse.names}
        key = {v: min(when.get(op, float("inf")) for op in ms) for v, ms in self.members.items()}
        names = coarse.names
        order: dict = {}
        for i in priority_order(coarse.succ_idx(), coarse.pred_idx(), [key[v] for v in names]):
            order.setdefault(placement[names[i]], []).append(names[i])
        return Plan(placement, {d: tuple(s) for d, s in order.items()}, status=plan.status,
                    placer=plan.placer, stats={"projected_from": plan.placer})


def _members(ga: GraphArrays, label: np.ndarray, m: int) -> list[list[int]]:
    """Fine op indices of every coarse vertex, in the fine topological order."""
    tl = label[ga.topo]
    srt = np.argsort(tl, kind="stable")
    ordered = ga.topo[srt]
    bounds = np.searchsorted(tl[srt], np.arange(m + 1)).tolist()
    members = [ordered[bounds[c]:bounds[c + 1]].tolist() for c in range(m)]
    if any(not ms for ms in members):
        raise ValueError("labels must be 0..m-1 with every vertex non-empty")
    return members


def _group_labels(ga: GraphArrays, label: np.ndarray, m: int):
    """Per coarse vertex: union-find root of its groups (or -1), and the group names."""
    uf = UnionFind(len(ga.group_mask), masks=ga.group_mask)
    vg = np.full(m, -1, dtype=np.int64)
    for i in np.flatnonzero(ga.group >= 0).tolist():
        c, g = int(label[i]), int(ga.group[i])
        if vg[c] < 0:
            vg[c] = g
        else:
            uf.union(int(vg[c]), g)
    return uf, vg


def _aggregate(ga: GraphArrays, label: np.ndarray, m: int, members: list[list[int]]):
    """Per coarse vertex: compute per kind (sum), kind mask (AND), persistent
    bytes (sum), temporary bytes (max) and colocation group name (or absent).

    Raises
    ------
    InfeasibleError
        A vertex, or a colocation group united by coarsening, has no common kind.
    """
    names = ga.names
    comp = np.zeros((m, ga.K))
    np.add.at(comp, label, ga.comp)
    mask = np.full(m, -1, dtype=np.int64)
    np.bitwise_and.at(mask, label, ga.mask)
    pers = np.bincount(label, weights=ga.pers, minlength=m)
    temp = np.zeros(m, dtype=np.int64)
    np.maximum.at(temp, label, ga.temp)
    uf, vg = _group_labels(ga, label, m)
    bad = np.flatnonzero(mask == 0)
    if len(bad):
        c = int(bad[0])
        raise InfeasibleError(f"coarse vertex with ops {[names[i] for i in members[c][:5]]} has no "
                              "common device kind", culprit=names[members[c][0]])
    gname = {}
    for c in np.flatnonzero(vg >= 0).tolist():
        r = uf.find(int(vg[c]))
        uf.mask[r] &= int(mask[c])
        gname[c] = ga.group_names[r]
    for c, g in gname.items():
        if uf.mask[uf.find(int(vg[c]))] == 0:
            raise InfeasibleError(f"colocation group {g!r} (united with others by coarsening) has no common "
                                  "device kind", culprit=g)
    return comp, mask, pers, temp, gname


def first_op(vertex: str) -> str:
    """The op a coarse vertex is named after (:func:`_vertex_names`): the
    name without its primes and ``+k`` tail, so a plan of a coarse graph can
    be told from a plan of another graph.

    >>> first_op("dense/MatMul+3''"), first_op("a")
    ('dense/MatMul', 'a')
    """
    base = vertex.rstrip("'")
    head, plus, tail = base.rpartition("+")
    return head if plus and tail.isdigit() else base


def _vertex_names(names, members: list[list[int]]) -> list[str]:
    """A lone op keeps its name, a merged vertex is called ``first+k`` (primes if taken)."""
    used = set()
    vnames = []
    for ms in members:
        nm = names[ms[0]] if len(ms) == 1 else f"{names[ms[0]]}+{len(ms) - 1}"
        while nm in used:
            nm += "'"
        used.add(nm)
        vnames.append(nm)
    return vnames


def _coarse_flow(ga: GraphArrays, label: np.ndarray, m: int, vnames: list[str]):
    """The coarse tensors (fine tensors leaving their vertex), the output bytes
    per vertex and the view bytes among them (:attr:`~pesto.graph.Op.view_bytes`
    of those tensors: ``GraphArrays.tview``), and the coarse edges (tensor
    edges, then control-only ones)."""
    cu, cv = label[ga.pu], label[ga.pv]
    keep = cu != cv
    T = max(ga.T, 1)
    key = uniq((cu[keep] * m + cv[keep]) * T + ga.pt[keep])
    pair, tid = key // T, key % T
    out_t = uniq(tid)
    out_bytes = np.bincount(label[ga.tsrc[out_t]], weights=ga.tbytes[out_t], minlength=m)
    view_bytes = np.bincount(label[ga.tsrc[out_t]], weights=ga.tview[out_t], minlength=m)
    tnames = ga.tnames
    tensors = [Tensor(tnames[t], vnames[label[ga.tsrc[t]]], int(ga.tbytes[t])) for t in out_t.tolist()]
    edges = []
    have = set()
    if len(pair):
        starts = np.flatnonzero(np.r_[True, pair[1:] != pair[:-1]]).tolist() + [len(pair)]
        pl, tl = pair.tolist(), tid.tolist()
        for a, b in zip(starts[:-1], starts[1:]):
            p = pl[a]
            have.add(p)
            edges.append(Edge(vnames[p // m], vnames[p % m], tuple(tnames[t] for t in tl[a:b])))
    cs, cd = label[ga.esrc[ga.ectrl]], label[ga.edst[ga.ectrl]]
    for p in uniq(cs[cs != cd] * m + cd[cs != cd]).tolist():
        if p not in have:
            edges.append(Edge(vnames[p // m], vnames[p % m], ()))
    return tensors, (out_bytes, view_bytes), edges


def _coarse_ops(ga: GraphArrays, members, vnames, aggregates, flow_bytes) -> list[Op]:
    """One Op per coarse vertex (``flow_bytes``: its output and view bytes,
    :func:`_coarse_flow`); a merged vertex's scope is its members' common scope."""
    comp, mask, pers, temp, gname = aggregates
    kinds, K = ga.kinds, ga.K
    fops = ga.graph.ops  # a new tuple per call: take it once
    out_bytes, view_bytes = flow_bytes
    ops = []
    for c, ms in enumerate(members):
        bits = int(mask[c])
        compute = {kinds[k]: float(comp[c, k]) for k in range(K) if bits >> k & 1}
        if len(ms) == 1:
            o = fops[ms[0]]
            scope, typ = o.scope, o.type
        else:
            scopes = {fops[i].scope for i in ms}
            scope = scopes.pop() if len(scopes) == 1 else os.path.commonpath(
                ["/" + s for s in scopes]).lstrip("/") if all(scopes) else ""
            typ = "Coarse"
        out = int(out_bytes[c])
        ops.append(Op(vnames[c], compute, persistent_bytes=int(pers[c]), output_bytes=out,
                      view_bytes=min(out, int(view_bytes[c])),
                      temporary_bytes=int(temp[c]), colocation_group=gname.get(c), scope=scope, type=typ))
    return ops


def build_coarse(ga: GraphArrays, label: np.ndarray, report: CoarsenReport, *, beta=DEFAULT_BETA,
                 t0: float | None = None, name: str | None = None) -> CoarseGraph:
    """Build the coarse OpGraph for the partition ``label`` (values 0..m-1).

    Raises
    ------
    CycleError
        The partition's quotient graph has a cycle (never for the shipped
        coarseners; OpGraph construction checks it).
    InfeasibleError
        A united colocation group would have no common device kind.
    """
    graph = ga.graph
    label = np.asarray(label, dtype=np.int64)
    m = int(label.max()) + 1 if ga.n else 0
    members = _members(ga, label, m)
    aggregates = _aggregate(ga, label, m, members)
    vnames = _vertex_names(ga.names, members)
    tensors, flow_bytes, edges = _coarse_flow(ga, label, m, vnames)
    ops = _coarse_ops(ga, members, vnames, aggregates, flow_bytes)
    cg = OpGraph(ops, edges, tensors, name=name or f"{graph.name}/coarse")
    names = ga.names
    report.vertices = cg.num_ops
    report.edges = cg.num_edges
    report.reached = cg.num_ops <= report.target
    report.ccr_before = ccr(ga, np.arange(ga.n), ga.n, beta)
    report.ccr_after = ccr(ga, label, m, beta)
    report.work = float(ga.time.sum())
    if not report.cp_before:
        report.cp_before = critical_path(ga, np.arange(ga.n), ga.n)
    # a vertex runs on its members' common fastest kind (>= the sum of their fastest)
    comp, mask = aggregates[0], aggregates[1]
    allowed = (mask[:, None] >> np.arange(ga.K)[None, :]) & 1 == 1
    vtime = np.where(allowed, comp, np.inf).min(axis=1, initial=np.inf) if ga.K else np.zeros(m)
    report.cp_after = critical_path(ga, label, m, times=vtime)
    if t0 is not None:
        report.seconds = time.perf_counter() - t0
    return CoarseGraph(cg, graph, {vnames[c]: [names[i] for i in ms] for c, ms in enumerate(members)},
                       report)
