"""Coarsening: shrink a graph of thousands of ops to about 200 vertices, never a cycle.

``coarsen(graph, target_vertices=200, method="height")`` returns a
:class:`CoarseGraph`: the coarse OpGraph (``.graph``), the fine one
(``.original``), the members of every vertex in a topological order
(``.members``), ``.vertex_of``, a ``.report`` and ``.expand(coarse_plan)``
which turns a plan of the coarse graph into a plan for every op.

Methods: ``"height"`` (Pesto's batch merging, Theorem 3.5), ``"baechi"``
(Baechi's safe fusion rule), ``"celeritas"`` (CPD-TOPO order + Kernighan
breakpoints) and ``"parallel"`` (acyclic matchings under a critical-path
budget: keeps the parallelism work / critical path; ``report.kept_at`` says
down to which size 90% of it was kept).

>>> from pesto.graph import OpGraph
>>> ops = {f"n{i}": 1 + i % 7 for i in range(1000)}  # a 40 x 25 grid DAG
>>> g = OpGraph.from_edges(ops, [(f"n{i}", f"n{j}", 4096) for i in range(1000) for j in (i + 25, i + 26) if j < 1000])
>>> cg = coarsen(g, 100)
>>> cg.graph.num_ops <= 100
True
"""
from __future__ import annotations

from pesto.errors import CoarsenError
from pesto.graph import OpGraph

from .baechi import coarsen_baechi
from .base import CoarseGraph, CoarsenReport
from .celeritas import coarsen_celeritas
from .height import coarsen_height
from .parallel import coarsen_parallel

__all__ = ["coarsen", "verify", "CoarseGraph", "CoarsenReport", "CoarsenError", "METHODS"]

METHODS = ("height", "baechi", "celeritas", "parallel")
_FUNCTIONS = {"height": coarsen_height, "baechi": coarsen_baechi, "celeritas": coarsen_celeritas,
              "parallel": coarsen_parallel}


def coarsen(graph: OpGraph, target_vertices: int = 200, method: str = "height", **options) -> CoarseGraph:
    """Coarsen ``graph`` to about ``target_vertices`` vertices.

    Parameters
    ----------
    graph : OpGraph
    target_vertices : int
        Stop when at most this many vertices remain (a method may stop above
        it when nothing more can be merged safely; see ``report.reached``).
    method : {"height", "baechi", "celeritas", "parallel"}
    **options
        Passed to the method: ``cluster`` or ``beta`` (for the CCR in the
        report); height/baechi: ``cap_time``, ``cap_ops``, ``cap_growth``,
        ``max_cap_growth``, ``siblings``, ``order`` ("bytes"/"gain"),
        ``partition`` (op -> label mapping, or a list of them: never merge ops
        whose labels differ, so that placement stays exactly representable;
        see :meth:`CoarseGraph.project`); parallel: ``partition``, ``keep``,
        ``eps``, ``cap``, ``max_cap``, ``strict``, ``order`` (see
        :func:`coarsen.parallel.coarsen_parallel`); celeritas: ``range_``,
        ``memory_limit``, ``fuse``. ``check=True`` re-verifies the result
        (partition, conservation, acyclicity) and raises on any defect.

    Raises
    ------
    ValueError
        Unknown method.
    CoarsenError
        With ``check=True``: the result fails :func:`verify`.
    """
    check = options.pop("check", False)
    fn = _FUNCTIONS.get(method)
    if fn is None:
        raise ValueError(f"unknown coarsening method {method!r}; choose one of {METHODS}")
    if method == "celeritas":
        if options.get("partition") is not None:
            raise ValueError("partition= is supported by the 'height', 'baechi' and 'parallel' methods only")
        options.pop("partition", None)
    cg = fn(graph, target_vertices, **options)
    if check:
        verify(cg)
    return cg


def _require(ok: bool, defect: str) -> None:
    if not ok:
        raise CoarsenError(f"invalid coarse graph: {defect}")


def verify(cg: CoarseGraph) -> None:
    """Check a CoarseGraph against its fine graph; raise :class:`CoarsenError` on a defect.

    Members partition the ops in a topological order of each vertex; compute
    per kind (for the vertex's kinds) and persistent bytes are conserved; every
    fine edge is internal or carried by the coarse edge between its vertices
    (with its tensors); the coarse graph is acyclic (OpGraph checks that when
    built) and every colocation group of the fine graph lies in coarse vertices
    of one coarse group. The checks hold under ``python -O`` (no ``assert``).

    Examples
    --------
    >>> from pesto.graph import OpGraph
    >>> ops = {f"n{i}": 1 + i % 7 for i in range(200)}  # a 20 x 10 grid DAG
    >>> g = OpGraph.from_edges(ops, [(f"n{i}", f"n{j}", 4096) for i in range(200) for j in (i + 10, i + 11) if j < 200])
    >>> cg = coarsen(g, 20)
    >>> verify(cg)
    >>> v = next(iter(cg.members))
    >>> cg.members[v] = cg.members[v][1:]
    >>> verify(cg)
    Traceback (most recent call last):
    ...
    pesto.errors.CoarsenError: invalid coarse graph: members do not partition the ops
    """
    fine, coarse = cg.original, cg.graph
    seen = [op for ms in cg.members.values() for op in ms]
    _require(sorted(seen) == sorted(fine.names), "members do not partition the ops")
    _require(set(cg.members) == set(coarse.names), "members and coarse vertices differ")
    for v, ms in cg.members.items():
        _verify_vertex(fine, coarse, v, ms)
    _verify_edges(cg)
    _verify_groups(cg)


def _verify_vertex(fine: OpGraph, coarse: OpGraph, v: str, ms: list) -> None:
    pos = {op: k for k, op in enumerate(ms)}
    for op in ms:
        for s in fine.successors(op):
            _require(s not in pos or pos[s] > pos[op], f"members of {v} are not in topological order")
    cop = coarse.op(v)
    kinds = frozenset.intersection(*(fine.op(o).kinds for o in ms))
    _require(cop.kinds == kinds, f"kinds of {v}: {sorted(cop.kinds)}, members allow {sorted(kinds)}")
    for k in kinds:
        tot = sum(fine.op(o).compute[k] for o in ms)
        _require(abs(cop.compute[k] - tot) <= 1e-6 * max(1.0, tot),
                 f"compute of {v} on {k}: {cop.compute[k]}, members sum to {tot}")
    pers = sum(fine.op(o).persistent_bytes for o in ms)
    _require(cop.persistent_bytes == pers, f"persistent bytes of {v}: {cop.persistent_bytes}, members {pers}")
    temp = max(fine.op(o).temporary_bytes for o in ms)
    _require(cop.temporary_bytes == temp, f"temporary bytes of {v}: {cop.temporary_bytes}, members' max {temp}")


def _verify_edges(cg: CoarseGraph) -> None:
    fine, coarse, vo = cg.original, cg.graph, cg.vertex_of
    for e in fine.edges:
        a, b = vo[e.src], vo[e.dst]
        if a == b:
            continue
        _require(coarse.has_edge(a, b), f"edge {e.src}->{e.dst} lost")
        ce = coarse.edge(a, b)
        for t in e.tensors:
            _require(t in ce.tensors, f"tensor {t} of {e.src}->{e.dst} not on {a}->{b}")
            _require(coarse.tensor(t).src == a and coarse.tensor(t).bytes == fine.tensor(t).bytes,
                     f"tensor {t}: coarse producer or size differs")
    for t in coarse.tensors:
        _require(fine.tensor(t.name).src in cg.members[t.src],
                 f"tensor {t.name} produced by {t.src}, which does not hold its producer")


def _verify_groups(cg: CoarseGraph) -> None:
    fine, coarse, vo = cg.original, cg.graph, cg.vertex_of
    cgroup = {}
    for op in fine.ops:
        if op.colocation_group is not None:
            g = coarse.op(vo[op.name]).colocation_group
            _require(g is not None, f"{op.name} lost its colocation group")
            _require(cgroup.setdefault(op.colocation_group, g) == g,
                     f"group {op.colocation_group} spread over coarse groups")
    for g, vs in coarse.colocation_groups().items():
        _require(bool(frozenset.intersection(*(coarse.op(v).kinds for v in vs))), f"coarse group {g} has no kind")
