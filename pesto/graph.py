"""The op graph: one training step as an immutable DAG of ops and tensors.

An :class:`OpGraph` holds

* **ops** (:class:`Op`): compute time per device kind in microseconds, memory
  (persistent bytes such as weights and optimizer slots, output bytes, temporary
  bytes), the device kinds it may run on, an optional colocation group (TensorFlow
  refuses to split one) and an optional name scope;
* **tensors** (:class:`Tensor`): a named value produced by one op, with its size.
  A tensor is sent *once* to each remote device that consumes it, however many
  consumers sit there (TensorFlow's semantics);
* **edges** (:class:`Edge`): producer -> consumer, carrying zero or more tensors.
  An edge with no tensor is a control edge.

The graph is validated when built; problems raise :class:`InvalidGraphError`
(or :class:`CycleError`) naming the culprit. Integer indices (``graph.index``)
are fixed at construction so solvers and the simulator can use arrays.

JSON schema (``format = "pesto.opgraph"``, ``version = 1``)::

    {"format": "pesto.opgraph", "version": 1, "name": "rnnlm",
     "ops": [{"name": "a", "compute": {"GPU": 12.5, "CPU": 40.0},
              "kinds": ["GPU", "CPU"],          # optional, default: keys of compute
              "persistent_bytes": 0, "output_bytes": 4096, "temporary_bytes": 0,
              "colocation_group": null, "scope": "", "type": "",
              "batch": true,                    # optional: true / false / absent (unknown)
              "phase": "forward",               # optional marks (absent: unknown / none):
              "anchor": null, "role": "",       # see Op.phase, Op.anchor, Op.role
              "view_bytes": 0}],                # optional (absent: 0), see Op.view_bytes
     "tensors": [{"name": "a:0", "src": "a", "bytes": 4096}],
     "edges": [{"src": "a", "dst": "b", "tensors": ["a:0"]},
               {"src": "a", "dst": "c", "tensors": []}]}   # control edge
"""
from __future__ import annotations

import contextlib
import gc
import json
import math
import numbers
from dataclasses import dataclass
from types import MappingProxyType
from typing import Iterable, Mapping

from .dag import toposort
from .jsonio import load as _load_document, write as _write_document
from .errors import CycleError, InvalidGraphError, SchemaError

FORMAT = "pesto.opgraph"
VERSION = 1
#: The largest byte count a tensor or op field may have (1 PiB): larger ones are unit
#: mix-ups, and CP-SAT's 64-bit coefficients overflow on sums of them.
MAX_BYTES = 1 << 50

#: The byte fields of an :class:`Op`.
_BYTE_FIELDS = ("persistent_bytes", "output_bytes", "temporary_bytes", "view_bytes")

__all__ = ["Op", "Tensor", "Edge", "OpGraph", "FORMAT", "VERSION", "PHASES", "ROLES", "gc_paused", "gc_frozen", "common_scope"]

#: The values of :attr:`Op.phase` (besides ``None``, unknown).
PHASES = ("forward", "input-grad", "weight-grad", "update", "recompute")
#: The values of :attr:`Op.role`.
ROLES = ("", "grad-sum", "joinable", "unshardable", "sparse-grad")

#: The kind sets ops hold, shared (a graph has a handful of distinct ones; a
#: frozenset of its own cost ~200 bytes per op). With ``slots=True`` on the
#: dataclasses below (no per-instance dict) a 200k-op graph takes ~100 MB less.
_KINDS: dict = {}


@dataclass(frozen=True, slots=True)
class Op:
    """One operation.

    Parameters
    ----------
    name : str
    compute : mapping of device kind -> microseconds
        Time on a device of that kind with speed 1.0.
    kinds : frozenset of str, optional
        Device kinds allowed; default all keys of ``compute``. Every allowed kind
        needs a compute time.
    persistent_bytes, output_bytes, temporary_bytes : int
        Held all step / produced by the op / used while it runs.
    colocation_group : str or None
        Ops sharing a group must share a device.
    scope : str
        Name scope (e.g. ``"rnn/layer_2"``), used by the Expert placer.
    type : str
        Op type (``"MatMul"``), informative.
    batch : bool or None
        Whether the op runs once per slice of the batch (``True``: it reads or
        writes per-sample data -- activations, the loss, their gradients, and
        the per-slice weight gradients before they are summed), once per step
        (``False``: variables and their reads, constants, the optimizer's
        update) or is not known (``None``, the default; old JSON files load
        so). :func:`pesto.step.split` copies the batched ops once per
        micro-batch and refuses a graph with unknown ops. A front end fills
        it: ``tf_patch``'s extractor from static shapes (an op is batched when
        one of its input or output tensors has a leading dimension equal to
        the batch size and it is not an optimizer update), and
        :func:`tf_patch.marks.mark_step` by a stated name/type rule for
        TensorFlow graphs that came without marks.
    phase : str or None
        The op's part of the training step: ``"forward"``, ``"input-grad"``
        (a backward op passing the gradient on), ``"weight-grad"`` (a backward
        op making a weight's gradient: one of its tensors is read by an op that
        runs once per step), ``"update"`` (the optimizer, after the backward
        pass), ``"recompute"`` (a forward op re-run in the backward pass, made
        by :func:`pesto.step.recompute`: staged and scheduled as backward) or
        ``None`` (not known, the default). Set by a front end
        (:func:`tf_patch.marks.mark_step`); :mod:`pesto.step.marks` reads it.
    anchor : str or None
        For a backward op, the forward op it differentiates (a pipeline stage
        holds both); ``None`` when not known or not a backward op.
    role : str
        ``""`` (default) or one of :data:`ROLES`. ``"grad-sum"``: an elementwise sum through which
        gradient contributions flow (per-time-step weight gradients summed
        into one); :func:`pesto.step.split` keeps the inputs of such a sum
        whole when its output is a weight gradient of their size.
        ``"joinable"``: a weight-gradient op the front end can build once over
        every slice's inputs (:func:`pesto.step.split`'s ``weight_grads="whole"``;
        ``tf_patch`` marks a Keras ``Dense`` kernel's gradient, which
        ``tf_patch.LossStep(whole=...)`` builds): the only ops the search
        screens run whole (:func:`pesto.step.marks.joinable_ops`).
        ``"unshardable"``: an update op the front end cannot shard (no
        sharded optimizer is screened, :func:`pesto.step.marks.shardable`).
        ``"sparse-grad"``: a batched op whose partial tensors are a sparse
        gradient's rows or indices (TensorFlow's ``IndexedSlices`` of an
        embedding lookup): each slice or replica holds its own rows, which
        are gathered, not summed (:func:`pesto.step.slicing.sparse_partials`,
        :func:`pesto.step.replicate`); ``tf_patch`` marks the producers of a
        partial read by a sparse update op (:func:`tf_patch.marks.sparse_grads`).
    view_bytes : int
        Bytes of the op's outputs that alias a buffer its device already
        holds, so they take no new memory there (default 0; at most
        ``output_bytes``). The memory model (:mod:`pesto.memory`) holds
        :attr:`allocated_bytes` (``output_bytes - view_bytes``) on the op's
        device; a copy sent to another device costs its full bytes on the
        wire and on the receiver, as every tensor. In TensorFlow a
        ``ReadVariableOp`` of a resource variable returns the variable's own
        tensor (``ReadVariableOp::Compute`` in
        ``tensorflow/core/kernels/resource_variable_ops.cc``:
        ``ctx->set_output(0, *variable->tensor())``) and copies it only in
        the variable's copy-on-read mode, which a sparse access sets
        (``EnsureSparseVariableAccess``, called by ``ResourceGather``,
        ``ResourceGatherNd``, ``ResourceScatter*``, ``ResourceScatterNd*`` and,
        through ``GetInputTensorFromVariable(sparse=true)``,
        ``ResourceSparseApply*``); an ``Identity`` of a ref variable forwards
        its buffer too. :func:`tf_patch.marks.mark_views` states the rule that
        sets it (the extractor and :func:`tf_patch.marks.mark_step` apply it);
        a graph built without TensorFlow keeps 0. A coarsened op sums the view
        bytes of its outputs that leave its group, as ``output_bytes``. What
        the model leaves out: an update that overwrites a variable while a
        read of it is still held copies the variable first
        (``PrepareToUpdateVariable``), bytes the model does not charge.
    """

    name: str
    compute: Mapping[str, float]
    kinds: frozenset = None
    persistent_bytes: int = 0
    output_bytes: int = 0
    temporary_bytes: int = 0
    colocation_group: str | None = None
    scope: str = ""
    type: str = ""
    batch: bool | None = None
    phase: str | None = None
    anchor: str | None = None
    role: str = ""
    view_bytes: int = 0

    def __post_init__(self):
        try:
            compute = dict(self.compute)
        except (TypeError, ValueError):
            raise InvalidGraphError(f"op {self.name!r}: compute must map device kind -> µs, "
                                    f"got {self.compute!r}") from None
        # numpy scalars are fine as inputs but must not leak into JSON
        compute = {k: t if type(t) is float else float(t) if _is_real(t) else t for k, t in compute.items()}
        object.__setattr__(self, "compute", MappingProxyType(compute))
        if isinstance(self.kinds, str):
            kinds = frozenset([self.kinds])
        else:
            kinds = frozenset(compute) if self.kinds is None else frozenset(self.kinds)
        object.__setattr__(self, "kinds", _KINDS.setdefault(kinds, kinds))  # one set per distinct value
        for key in _BYTE_FIELDS:
            v = getattr(self, key)
            if type(v) is not int and isinstance(v, numbers.Integral) and not isinstance(v, bool):
                object.__setattr__(self, key, int(v))

    def __hash__(self):
        return hash((self.name, tuple(sorted(self.compute.items())), self.kinds,
                     self.persistent_bytes, self.output_bytes, self.temporary_bytes,
                     self.colocation_group, self.scope, self.type, self.batch, self.phase, self.anchor,
                     self.role, self.view_bytes))

    def time_on(self, kind: str, speed: float = 1.0) -> float:
        """Compute time on a device of ``kind`` running at ``speed``."""
        return self.compute[kind] / speed

    @property
    def allocated_bytes(self) -> int:
        """Bytes the op's outputs take on its device: ``output_bytes - view_bytes``.

        >>> Op("read", {"GPU": 1.0}, output_bytes=64, view_bytes=64).allocated_bytes
        0
        """
        return self.output_bytes - self.view_bytes

    @property
    def memory_bytes(self) -> int:
        """Conservative footprint: persistent + allocated outputs + temporary."""
        return self.persistent_bytes + self.allocated_bytes + self.temporary_bytes

    def to_dict(self) -> dict:
        d = {"name": self.name, "compute": dict(self.compute)}
        if self.kinds != frozenset(self.compute):
            d["kinds"] = sorted(self.kinds)
        for key in ("persistent_bytes", "output_bytes", "temporary_bytes"):
            d[key] = getattr(self, key)
        d["colocation_group"] = self.colocation_group
        d["scope"] = self.scope
        d["type"] = self.type
        if self.batch is not None:
            d["batch"] = self.batch
        for key in ("phase", "anchor", "role", "view_bytes"):   # marks: written only when set
            if getattr(self, key):
                d[key] = getattr(self, key)
        return d


@dataclass(frozen=True, slots=True)
class Tensor:
    """A value produced by ``src`` of ``bytes`` bytes."""

    name: str
    src: str
    bytes: int

    def __post_init__(self):
        if type(self.bytes) is not int and isinstance(self.bytes, numbers.Integral) and not isinstance(self.bytes, bool):
            object.__setattr__(self, "bytes", int(self.bytes))


@dataclass(frozen=True, slots=True)
class Edge:
    """Producer -> consumer; ``tensors`` empty means a control edge."""

    src: str
    dst: str
    tensors: tuple = ()

    def __post_init__(self):
        if isinstance(self.tensors, str):  # Edge("a", "b", "a:0") means one tensor
            object.__setattr__(self, "tensors", (self.tensors,))
        elif type(self.tensors) is not tuple:
            object.__setattr__(self, "tensors", tuple(self.tensors))

    @property
    def is_control(self) -> bool:
        return not self.tensors


def common_scope(names) -> str:
    """The name scope (``"a/b"``) every op name of ``names`` lies under ("" for none).

    >>> common_scope(["layer_0/attn/q", "layer_0/mlp/fc"]), common_scope(["a/x", "b/y"])
    ('layer_0', '')
    """
    parts = [n.split("/")[:-1] for n in names]
    common = []
    for level in zip(*parts):
        if any(p != level[0] for p in level):
            break
        common.append(level[0])
    return "/".join(common)


@contextlib.contextmanager
def gc_paused():
    """The cyclic garbage collector paused while the block runs (restored after;
    a pause inside a pause leaves it paused): for building many small objects
    that form no cycle (a graph, its arrays, a simulation, a transformed step),
    which it would otherwise walk again and again as they age. Reference
    counting still frees everything dropped.

    >>> with gc_paused():
    ...     gc.isenabled()
    False
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextlib.contextmanager
def gc_frozen():
    """Keep the cyclic garbage collector off what exists when the block starts
    (a solve's graph, its arrays) and off what the block freezes as it goes
    (``gc.freeze()``: candidates a search keeps): on 100k-op graphs every full
    collection walked millions of objects that live on anyway. Everything is
    handed back to the collector when the block ends (``gc.unfreeze()``: also
    what an enclosing block froze, which it freezes again as it goes on)."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class OpGraph:
    """Immutable, validated DAG of ops.

    Parameters
    ----------
    ops : iterable of Op
    edges : iterable of Edge
    tensors : iterable of Tensor, optional
        Every tensor named by an edge must be here.
    name : str

    Raises
    ------
    InvalidGraphError
        Duplicate op, unknown edge endpoint or tensor, self loop, negative or
        missing cost, op allowed on no device kind.
    CycleError
        The edges close a cycle; the message prints one.

    Examples
    --------
    >>> g = OpGraph.from_edges({"a": 2, "b": 3}, [("a", "b", 100)])
    >>> g.num_ops, g.total_work("GPU"), g.topological_order()
    (2, 5.0, ['a', 'b'])
    """

    def __init__(self, ops: Iterable[Op], edges: Iterable[Edge] = (),
                 tensors: Iterable[Tensor] = (), name: str = "graph"):
        # many small objects, no cycles: pausing the cyclic GC makes big graphs
        # build about twice as fast
        with gc_paused():
            self._build(ops, edges, tensors, name)

    def _build(self, ops, edges, tensors, name):
        self.name = name
        self._ops: dict[str, Op] = {}
        for op in ops:
            if not isinstance(op, Op):
                raise InvalidGraphError(f"expected Op, got {type(op).__name__}: {op!r}")
            if op.name in self._ops:
                raise InvalidGraphError(f"duplicate op name {op.name!r}")
            _validate_op(op)
            self._ops[op.name] = op
        self._tensors: dict[str, Tensor] = {}
        for t in tensors:
            if not isinstance(t, Tensor):
                raise InvalidGraphError(f"expected Tensor, got {type(t).__name__}: {t!r}")
            if not isinstance(t.name, str) or not t.name:
                raise InvalidGraphError(f"tensor name must be a non-empty string, got {t.name!r}")
            if t.name in self._tensors:
                raise InvalidGraphError(f"duplicate tensor name {t.name!r}")
            if t.src not in self._ops:
                raise InvalidGraphError(f"tensor {t.name!r} is produced by unknown op {t.src!r}")
            if not isinstance(t.bytes, int) or isinstance(t.bytes, bool) or not 0 <= t.bytes <= MAX_BYTES:
                raise InvalidGraphError(f"tensor {t.name!r} has invalid size {t.bytes!r}{_over(t.bytes)}")
            self._tensors[t.name] = t
        self._edges: dict[tuple[str, str], Edge] = {}
        for e in edges:
            if not isinstance(e, Edge):
                raise InvalidGraphError(f"expected Edge, got {type(e).__name__}: {e!r}")
            self._add_edge(e)
        _check_groups(self._ops.values())
        self.names: tuple[str, ...] = tuple(self._ops)
        self._op_tuple: tuple[Op, ...] = tuple(self._ops.values())   # `ops` is read per op in hot loops
        self.index: dict[str, int] = {n: i for i, n in enumerate(self.names)}
        self._succ: list[list[int]] = [[] for _ in self.names]
        self._pred: list[list[int]] = [[] for _ in self.names]
        for (u, v) in self._edges:
            self._succ[self.index[u]].append(self.index[v])
            self._pred[self.index[v]].append(self.index[u])
        self._topo = self._toposort()
        self._consumers = None
        self._tensor_table = None
        self._data_succ = None

    # -- construction helpers ------------------------------------------------
    def _add_edge(self, e: Edge):
        for end in (e.src, e.dst):
            if end not in self._ops:
                raise InvalidGraphError(f"edge {e.src!r} -> {e.dst!r} names unknown op {end!r}")
        if e.src == e.dst:
            raise CycleError([e.src])
        if (e.src, e.dst) in self._edges:
            raise InvalidGraphError(f"duplicate edge {e.src!r} -> {e.dst!r}")
        if len(set(e.tensors)) != len(e.tensors):
            raise InvalidGraphError(f"edge {e.src!r} -> {e.dst!r} lists a tensor twice: {list(e.tensors)}")
        for t in e.tensors:
            tensor = self._tensors.get(t)
            if tensor is None:
                raise InvalidGraphError(f"edge {e.src!r} -> {e.dst!r} carries unknown tensor {t!r}")
            if tensor.src != e.src:
                raise InvalidGraphError(
                    f"edge {e.src!r} -> {e.dst!r} carries tensor {t!r} produced by {tensor.src!r}")
        # an Edge's tensors are a tuple already (its __post_init__); a subclass is copied
        self._edges[(e.src, e.dst)] = e if type(e) is Edge else Edge(e.src, e.dst, tuple(e.tensors))

    def _toposort(self) -> list[int]:
        return toposort(self._succ, self._pred, names=self.names)

    # -- basic queries -------------------------------------------------------
    @property
    def num_ops(self) -> int:
        return len(self.names)

    @property
    def num_edges(self) -> int:
        return len(self._edges)

    def __len__(self):
        return len(self.names)

    def __contains__(self, name):
        return name in self._ops

    def __iter__(self):
        return iter(self.names)

    def __repr__(self):
        return f"OpGraph({self.name!r}, ops={self.num_ops}, edges={self.num_edges})"

    def op(self, name: str) -> Op:
        try:
            return self._ops[name]
        except KeyError:
            raise InvalidGraphError(f"unknown op {name!r}") from None

    @property
    def ops(self) -> tuple[Op, ...]:
        """Ops in insertion order (``ops[i]`` has index ``i``)."""
        return self._op_tuple

    @property
    def edges(self) -> tuple[Edge, ...]:
        return tuple(self._edges.values())

    @property
    def tensors(self) -> tuple[Tensor, ...]:
        return tuple(self._tensors.values())

    def tensor(self, name: str) -> Tensor:
        """The tensor called ``name`` (``KeyError`` if there is none)."""
        return self._tensors[name]

    def has_tensor(self, name: str) -> bool:
        return name in self._tensors

    def edge(self, src: str, dst: str) -> Edge:
        return self._edges[(src, dst)]

    def has_edge(self, src: str, dst: str) -> bool:
        return (src, dst) in self._edges

    def edge_bytes(self, src: str, dst: str) -> int:
        """Bytes an edge carries (0 for a control edge)."""
        return sum(self._tensors[t].bytes for t in self._edges[(src, dst)].tensors)

    def successors(self, name: str) -> list[str]:
        return [self.names[j] for j in self._succ[self.index[name]]]

    def predecessors(self, name: str) -> list[str]:
        return [self.names[j] for j in self._pred[self.index[name]]]

    def succ_idx(self) -> list[list[int]]:
        """Successor lists by index (shared; do not modify)."""
        return self._succ

    def pred_idx(self) -> list[list[int]]:
        """Predecessor lists by index (shared; do not modify)."""
        return self._pred

    def topological_order(self) -> list[str]:
        """One topological order (deterministic)."""
        return [self.names[i] for i in self._topo]

    def topo_idx(self) -> list[int]:
        return list(self._topo)

    def consumers(self) -> dict[str, list[str]]:
        """Tensor name -> ops that consume it (cached)."""
        if self._consumers is None:
            cons: dict[str, list[str]] = {t: [] for t in self._tensors}
            for e in self._edges.values():
                for t in e.tensors:
                    cons[t].append(e.dst)
            self._consumers = cons
        return self._consumers

    def tensor_table(self) -> list[tuple[str, int, int, list[int]]]:
        """Per tensor ``(name, producer index, bytes, consumer indices)`` (cached;
        do not modify). Consumers are distinct: one entry per consuming op."""
        if self._tensor_table is None:
            self._build_tables()
        return self._tensor_table

    def data_succ_idx(self) -> list[list[int]]:
        """Successors through edges that carry a tensor (control edges left out;
        cached, do not modify)."""
        if self._data_succ is None:
            self._build_tables()
        return self._data_succ

    def _build_tables(self):
        # one pass over the edges for the simulator's and memory model's tables
        # (numpy views of the graph: pesto.problem.GraphArrays)
        idx = self.index
        tpos = {t: k for k, t in enumerate(self._tensors)}
        cons: list[list[int]] = [[] for _ in tpos]
        succ: list[list[int]] = [[] for _ in self.names]
        for (u, v), e in self._edges.items():
            if e.tensors:
                i, j = idx[u], idx[v]
                succ[i].append(j)
                for t in e.tensors:
                    cons[tpos[t]].append(j)
        self._tensor_table = [(t.name, idx[t.src], t.bytes, cons[k])
                              for k, t in enumerate(self._tensors.values())]
        self._data_succ = succ

    def kinds(self) -> set[str]:
        """All device kinds some op can run on."""
        out: set[str] = set()
        for op in self._ops.values():
            out |= op.kinds
        return out

    def colocation_groups(self) -> dict[str, list[str]]:
        """Group name -> member ops (groups of one op included)."""
        groups: dict[str, list[str]] = {}
        for op in self._ops.values():
            if op.colocation_group is not None:
                groups.setdefault(op.colocation_group, []).append(op.name)
        return groups

    def total_work(self, kind: str = "GPU") -> float:
        """Sum of compute times on ``kind`` (ops not allowed there use their fastest kind)."""
        return float(sum(_time_for(op, kind) for op in self._ops.values()))

    def critical_path(self, kind: str = "GPU") -> float:
        """Longest compute-only path (no communication), a makespan lower bound
        for any placement on devices of ``kind`` with speed 1."""
        best = [0.0] * len(self.names)
        ops = self.ops
        for i in self._topo:
            start = max((best[p] for p in self._pred[i]), default=0.0)
            best[i] = start + _time_for(ops[i], kind)
        return max(best, default=0.0)

    # -- conversions ---------------------------------------------------------
    @classmethod
    def from_edges(cls, compute: Mapping[str, float], edges: Iterable[tuple], *,
                   kind: str = "GPU", name: str = "graph") -> "OpGraph":
        """Small graphs for tests and examples.

        ``compute`` maps op -> time on ``kind``; each edge is ``(u, v)`` or
        ``(u, v, bytes)``; every edge carries its own tensor ``"u->v"`` (no
        dedup). An op's ``output_bytes`` is the sum of the tensors it produces.

        Examples
        --------
        >>> g = OpGraph.from_edges({"a": 1, "b": 2, "c": 3}, [("a", "b", 8), ("a", "c", 4)])
        >>> g.op("a").output_bytes, g.edge_bytes("a", "c"), g.successors("a")
        (12, 4, ['b', 'c'])
        """
        tensors, es = [], []
        out: dict[str, int] = {}
        for e in edges:
            u, v = e[0], e[1]
            b = _as_bytes(e[2], f"edge {u!r} -> {v!r}") if len(e) > 2 else 0
            t = f"{u}->{v}"
            tensors.append(Tensor(t, u, b))
            es.append(Edge(u, v, (t,)))
            out[u] = out.get(u, 0) + b
        ops = [Op(n, {kind: t}, output_bytes=out.get(n, 0)) for n, t in compute.items()]
        return cls(ops, es, tensors, name=name)

    @classmethod
    def from_networkx(cls, g, *, name: str | None = None) -> "OpGraph":
        """Build from a ``networkx.DiGraph``.

        Node attributes: ``compute`` (dict kind -> µs; or ``time`` = µs on GPU),
        optional ``kinds``, ``persistent_bytes``, ``output_bytes`` (default:
        the sum of the distinct tensors the op produces), ``temporary_bytes``,
        ``colocation_group``, ``scope``, ``type``, ``batch``, ``phase``, ``anchor``, ``role``.
        Edge attributes: ``bytes`` (default 0) and optional ``tensor`` (a name;
        edges from one op with the same tensor name carry one tensor, sent
        once per device); ``tensors`` (list of names) with ``tensor_bytes``
        (list of sizes) for an edge carrying several; ``control=True`` for a
        control edge. Without any of these each edge carries its own tensor
        ``"u->v"``. :meth:`to_networkx` writes the same attributes.

        Raises
        ------
        InvalidGraphError
            A node without ``compute``/``time``; one tensor name declared with
            two producers or two sizes.

        Examples
        --------
        >>> import networkx as nx
        >>> d = nx.DiGraph()
        >>> d.add_node("a", time=2.0); d.add_node("b", time=1.0); d.add_node("c", time=1.0)
        >>> d.add_edge("a", "b", tensor="a:0", bytes=64); d.add_edge("a", "c", tensor="a:0", bytes=64)
        >>> g = OpGraph.from_networkx(d)
        >>> len(g.tensors), g.op("a").output_bytes
        (1, 64)
        """
        tensors: dict[str, Tensor] = {}
        edges = []

        def declare(t, u, b):
            old = tensors.get(t)
            if old is not None and (old.src != u or old.bytes != b):
                raise InvalidGraphError(
                    f"tensor {t!r} declared twice with different producer or size: "
                    f"({old.src!r}, {old.bytes}) vs ({u!r}, {b})")
            tensors[t] = Tensor(t, u, b)

        for u, v, a in g.edges(data=True):
            u, v = str(u), str(v)
            if a.get("control"):
                edges.append(Edge(u, v, ()))
            elif "tensors" in a:
                names = [str(t) for t in a["tensors"]]
                sizes = a.get("tensor_bytes")
                if sizes is None or len(sizes) != len(names):
                    raise InvalidGraphError(
                        f"edge {u!r} -> {v!r}: 'tensors' needs 'tensor_bytes' of the same length")
                for t, b in zip(names, sizes):
                    declare(t, u, _as_bytes(b, f"tensor {t!r}"))
                edges.append(Edge(u, v, tuple(names)))
            else:
                t = str(a.get("tensor", f"{u}->{v}"))
                declare(t, u, _as_bytes(a.get("bytes", 0), f"edge {u!r} -> {v!r}"))
                edges.append(Edge(u, v, (t,)))
        for n, a in g.nodes(data=True):
            for t, b in (a.get("extra_tensors") or {}).items():
                declare(str(t), str(n), _as_bytes(b, f"tensor {t!r}"))
        produced: dict[str, int] = {}
        for t in tensors.values():
            produced[t.src] = produced.get(t.src, 0) + t.bytes
        ops = []
        for n, a in g.nodes(data=True):
            if "compute" in a:
                compute = a["compute"]
            elif "time" in a:
                compute = {"GPU": a["time"]}
            else:
                raise InvalidGraphError(f"op {n!r} has no compute time (node attribute 'compute' or 'time')")
            kw = {}
            for key in _BYTE_FIELDS:
                if key in a:
                    kw[key] = _as_bytes(a[key], f"op {n!r} {key}")
            kw.setdefault("output_bytes", produced.get(str(n), 0))
            ops.append(Op(str(n), compute, kinds=a.get("kinds"),
                          colocation_group=a.get("colocation_group"),
                          scope=a.get("scope", ""), type=a.get("type", ""),
                          batch=a.get("batch"), phase=a.get("phase"), anchor=a.get("anchor"),
                          role=a.get("role", ""), **kw))
        return cls(ops, edges, tensors.values(), name=name or g.graph.get("name", "graph"))

    def to_networkx(self):
        """``networkx.DiGraph`` with the attributes :meth:`from_networkx` reads.

        Every edge gets ``bytes`` (its total); a one-tensor edge gets ``tensor``,
        a several-tensor edge ``tensors`` and ``tensor_bytes``. Tensors no edge
        carries go to their producer's ``extra_tensors`` ({name: bytes}), so
        ``from_networkx(g.to_networkx()) == g``.
        """
        import networkx as nx

        g = nx.DiGraph(name=self.name)
        for op in self._ops.values():
            d = op.to_dict()
            d.pop("name")
            d["kinds"] = sorted(op.kinds)
            g.add_node(op.name, **d)
        carried = {t for e in self._edges.values() for t in e.tensors}
        for t in self._tensors.values():
            if t.name not in carried:
                g.nodes[t.src].setdefault("extra_tensors", {})[t.name] = t.bytes
        for e in self._edges.values():
            if e.is_control:
                g.add_edge(e.src, e.dst, control=True, bytes=0)
            elif len(e.tensors) == 1:
                g.add_edge(e.src, e.dst, tensor=e.tensors[0], bytes=self.edge_bytes(e.src, e.dst))
            else:
                g.add_edge(e.src, e.dst, tensors=list(e.tensors),
                           tensor_bytes=[self._tensors[t].bytes for t in e.tensors],
                           bytes=self.edge_bytes(e.src, e.dst))
        return g

    def to_dict(self) -> dict:
        return {
            "format": FORMAT, "version": VERSION, "name": self.name,
            "ops": [op.to_dict() for op in self._ops.values()],
            "tensors": [{"name": t.name, "src": t.src, "bytes": t.bytes} for t in self._tensors.values()],
            "edges": [{"src": e.src, "dst": e.dst, "tensors": list(e.tensors)} for e in self._edges.values()],
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> "OpGraph":
        """Inverse of :meth:`to_dict`; raises :class:`SchemaError` on a bad document."""
        _check_header(d, FORMAT, VERSION)
        try:
            ops = [Op(o["name"], o["compute"], kinds=o.get("kinds"),
                      persistent_bytes=o.get("persistent_bytes", 0),
                      output_bytes=o.get("output_bytes", 0),
                      temporary_bytes=o.get("temporary_bytes", 0),
                      colocation_group=o.get("colocation_group"),
                      scope=o.get("scope", ""), type=o.get("type", ""),
                      batch=o.get("batch"), phase=o.get("phase"), anchor=o.get("anchor"),
                      role=o.get("role", ""), view_bytes=o.get("view_bytes", 0))
                   for o in _field(d, "ops")]
            tensors = [Tensor(t["name"], t["src"], t["bytes"]) for t in d.get("tensors", [])]
            edges = [Edge(e["src"], e["dst"], tuple(e.get("tensors", ()))) for e in _field(d, "edges")]
        except KeyError as exc:
            raise SchemaError(f"{FORMAT}: an entry lacks required field {exc.args[0]!r}") from None
        except TypeError as exc:
            raise SchemaError(f"{FORMAT}: malformed entry ({exc})") from None
        return cls(ops, edges, tensors, name=d.get("name", "graph"))

    def to_json(self, path=None, indent=None) -> str | None:
        """JSON text, or write it to ``path`` (gzip-compressed if it ends in
        ``.gz``; atomically: :func:`pesto.jsonio.write`)."""
        text = json.dumps(self.to_dict(), indent=indent)
        if path is None:
            return text
        _write_document(path, text)
        return None

    @classmethod
    def from_json(cls, source) -> "OpGraph":
        """From a path (gzipped or not, told by content) or a JSON string."""
        return cls.from_dict(_load_json(source))

    def __eq__(self, other):
        """Same name, ops (in index order), tensors and edges (as sets)."""
        if not isinstance(other, OpGraph):
            return NotImplemented
        return (self.name == other.name and self.ops == other.ops
                and set(self.tensors) == set(other.tensors) and set(self.edges) == set(other.edges))

    __hash__ = None


def _over(v) -> str:
    """Why a byte count is refused when it is only too large."""
    return f" (more than {MAX_BYTES} bytes = 1 PiB)" if isinstance(v, int) and v > MAX_BYTES else ""


def _time_for(op: Op, kind: str) -> float:
    if kind in op.kinds:
        return op.compute[kind]
    return min(op.compute[k] for k in op.kinds)


def _is_real(x) -> bool:
    t = type(x)   # the common types first: the ABC check is slow and runs per op of a split step
    return t is float or t is int or (isinstance(x, numbers.Real) and t is not bool)


def _as_bytes(v, what) -> int:
    """A non-negative integral byte count (``4096.0`` is accepted, ``4096.5``
    and ``-5`` are not); ``what`` names the culprit in the error."""
    if isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 0:
        return int(v)
    if isinstance(v, numbers.Real) and math.isfinite(v) and float(v).is_integer() and v >= 0:
        return int(v)
    raise InvalidGraphError(f"{what}: invalid byte count {v!r}")


def _check_groups(ops) -> None:
    """Every colocation group must fit one device kind."""
    kinds: dict[str, frozenset] = {}
    first: dict[str, str] = {}
    for op in ops:
        g = op.colocation_group
        if g is None:
            continue
        if g in kinds:
            kinds[g] = kinds[g] & op.kinds
            if not kinds[g]:
                raise InvalidGraphError(
                    f"colocation group {g!r} has no common device kind: op {op.name!r} allows "
                    f"{sorted(op.kinds)}, op {first[g]!r} and the rest of the group do not")
        else:
            kinds[g] = op.kinds
            first[g] = op.name


def _validate_op(op: Op) -> None:
    if not isinstance(op.name, str) or not op.name:
        raise InvalidGraphError(f"op name must be a non-empty string, got {op.name!r}")
    if not op.kinds:
        raise InvalidGraphError(f"op {op.name!r} is allowed on no device kind")
    for kind in op.kinds:
        if kind not in op.compute:
            raise InvalidGraphError(f"op {op.name!r} has no compute time for allowed kind {kind!r}")
    for kind, t in op.compute.items():
        if not isinstance(kind, str) or not kind:
            raise InvalidGraphError(f"op {op.name!r} has a device kind that is not a non-empty string: {kind!r}")
        if not _is_real(t) or not math.isfinite(t) or t < 0:
            raise InvalidGraphError(f"op {op.name!r} has invalid compute time {t!r} on {kind!r}")
    for key in _BYTE_FIELDS:
        v = getattr(op, key)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_BYTES:
            raise InvalidGraphError(f"op {op.name!r} has invalid {key} {v!r}{_over(v)}")
    if op.view_bytes > op.output_bytes:
        raise InvalidGraphError(f"op {op.name!r} has view_bytes {op.view_bytes} over its output_bytes "
                                f"{op.output_bytes} (a view is part of the op's outputs)")
    if op.colocation_group is not None and not isinstance(op.colocation_group, str):
        raise InvalidGraphError(f"op {op.name!r} has a non-string colocation group {op.colocation_group!r}")
    if op.batch is not None and not isinstance(op.batch, bool):
        raise InvalidGraphError(f"op {op.name!r}: batch must be true, false or null (unknown), "
                                f"got {op.batch!r}")
    if op.phase is not None and op.phase not in PHASES:
        raise InvalidGraphError(f"op {op.name!r}: phase must be one of {list(PHASES)} or null (unknown), "
                                f"got {op.phase!r}")
    if op.anchor is not None and not isinstance(op.anchor, str):
        raise InvalidGraphError(f"op {op.name!r}: anchor must be an op name or null, got {op.anchor!r}")
    if op.role not in ROLES:
        raise InvalidGraphError(f"op {op.name!r}: role must be one of {list(ROLES)}, got {op.role!r}")


def _check_header(d, fmt, version):
    if not isinstance(d, Mapping):
        raise SchemaError(f"expected a JSON object for {fmt}, got {type(d).__name__}")
    if d.get("format") != fmt:
        raise SchemaError(f"expected format {fmt!r}, got {d.get('format')!r}")
    if d.get("version") != version:
        raise SchemaError(f"{fmt}: unsupported version {d.get('version')!r} (this Pesto reads version {version})")


def _field(d, key):
    if key not in d:
        raise SchemaError(f"{d.get('format')}: missing required field {key!r}")
    return d[key]


def _load_json(source):
    """A JSON document from a mapping, JSON text or a path (:func:`pesto.jsonio.load`)."""
    return _load_document(source)
