"""Data-parallel and hybrid steps built in TensorFlow from a replicated Pesto plan (issue 31, item 1).

``pesto.solve_step`` may return a plan of the **replicated** step
(:func:`pesto.step.replicate`: ``R`` replicas ``op@r<r>`` and a ring
all-reduce per gradient bucket; with ``micro_batches=M > 1`` each replica
further split into ``M`` slices, the hybrid). This module builds that step in
TensorFlow and maps the plan onto it op by op, so the plan's replicas, device
map and buckets run as planned (:func:`tf_patch.apply_plan` enforces the
devices and the order):

* the TF step split into ``R * M`` slices (:mod:`tf_patch.microstep`:
  ``mb<s>/``, ``gradients/mb<s>/``, ``gradient_tape/mb<s>/``): slice ``s``
  belongs to replica ``s // M`` (its ``s % M``-th micro-batch), each slice's
  loss scaled by ``1 / (R M)``, so the replicas' summed gradients are the
  whole batch's;
* :func:`replicate_graph` rewrites that graph: every once-per-step op
  (variables, their reads outside the slices, the optimizer update) is copied
  per replica as ``rep<r>/<op>`` (each replica its own variables, initialised
  to the same values, as ``MirroredStrategy``'s mirrored variables), the
  slices of replica ``r`` read replica ``r``'s copies, and the accumulation
  chains ``accumulate/<variable>/`` become, per bucket of the plan, a
  **ring all-reduce** ``allreduce/<k>/``: per replica, its slices' gradients
  summed (``r<r>/acc_<i>``, hybrid only), flattened and packed
  (``r<r>/pack``, ``r<r>/chunks``), then ``R - 1`` reduce-scatter adds
  ``rs<s>/r<r>`` and ``R - 1`` all-gather copies ``ag<s>/r<r>`` between ring
  neighbours (the chunks and steps of :mod:`pesto.step.replication`), then unpacked
  (``r<r>/sum``, ``r<r>/grad_<j>``) into what replica ``r``'s update reads. A
  sparse gradient (``IndexedSlices``: rows and indices concatenated) cannot be
  summed: every replica gathers all replicas' rows (``allgather/<k>/r<r>/``),
  which the optimizer sums per row as for one batch;
* a **sharded optimizer** (ZeRO-1/2, :func:`shard_level` of the plan's
  graph: Pesto's :func:`pesto.step.replicate` with ``shard_optimizer``):
  the bucket's chunk ``j`` packs piece ``j`` of every gradient
  (``r<r>/pieces_<i>``, ``r<r>/chunk_<j>``), so after the reduce-scatter
  replica ``r`` holds piece ``(r + 1) mod R`` of each summed gradient
  (``r<r>/shard``) and runs the variable's ``ResourceApply*`` update on it
  only (``r<r>/<variable>/update``, on piece variables ``param`` and
  ``slot_<q>``: the optimizer state ``1 / R`` per replica, no whole slots;
  ``param`` is transient: loaded from the whole variable before the update,
  ``param/load``, and emptied once its updated value is read, ``param/release``,
  so between steps a replica holds its whole weights and ``1 / R`` of the
  optimizer state, what Pesto's memory model counts);
  the updated pieces (``r<r>/updated``) go round the ring (``ag<s>/r<r>``)
  and each replica writes its whole variables from them
  (``r<r>/<variable>/assign``); the update op ``rep<r>/<update>`` becomes a
  ``NoOp`` waiting for both. TensorFlow frees the gradient outside the shard
  after the reduce-scatter either way: ZeRO-1 and ZeRO-2 build the same step.
  A sparse gradient's variable (an embedding) is sharded by rows, as the model
  shards its optimizer state: every replica gathers all replicas' rows as
  without sharding, keeps those of its rows ``[a, b)`` (piece ``(r + 1) mod R``
  of ``ceil(rows / R)``; ``.../<variable>/r<r>/rows/``, indices less ``a``) and
  runs the optimizer's update ops (:func:`_sparse_updates`: a v1 optimizer's
  ``Unique``, ``UnsortedSegmentSum``, scatter-adds and assigns) copied onto row
  pieces of the variable and its slots (``.../r<r>/update/<op>``,
  :meth:`_Zero.rows`); each replica then writes its whole variable from every
  replica's updated rows (``.../r<r>/assign``);
* **sharded parameters** (ZeRO-3, :func:`shard_level` 3: Pesto's
  ``p@fwgather@r<r>``): as ZeRO-1/2, but no updated piece goes round the ring,
  and a replica holds no whole variable: each piece variable ``param`` is the
  parameter's piece for good, and each read of a sharded variable in replica
  ``r`` (``ReadVariableOp``) becomes the concatenation of the replicas' piece
  variables (``zero3/<variable>/piece_<j>``, read once each), one
  (``zero3/r<r>/<variable>/forward``) for its forward consumers and one
  (``.../backward``) for those under a gradient scope, a transient whole copy
  as Pesto's gathers; an embedding lookup (``ResourceGather``) becomes a
  ``GatherV2`` of the forward concatenation and its gradient's
  ``VariableShape`` a constant; the whole variables ``rep<r>/<variable>`` and
  their reads are then dropped (:meth:`_Zero.gather_reads`). Only scalars no
  update shards (Adam's ``beta1_power``, ``beta2_power``) stay whole per replica
  (the model counts ``ceil(4 / R)`` bytes of each). The trained weights are the
  pieces joined (:func:`unshard`; :meth:`tf_patch.FunctionStep.apply` carries
  them so into the next plan);
* the input splits (``microbatch/<input>``) and the loss sum
  (``microbatch/loss``) stay single: the loss is the sum of the replicas'
  scaled losses, the whole batch's mean;
* :func:`replica_map` maps the plan's ops onto these TF ops (module rule
  below) and :func:`replicated_plan` turns the plan into a plan of the TF step:
  every mapped TF op on its Pesto op's device, the others (once-per-step ops
  the re-trace names differently, the input splits, the loss sum) completed by
  :func:`tf_patch.slicemap.mapped_hint` (a neighbour's device), and each
  device's order the TF graph's topological order taking ops by their Pesto
  op's start (:func:`pesto.dag.priority_order`: never a cycle).

The naming rule (Pesto op -> TF ops)
------------------------------------
* ``op@r<r>`` of a batched op (hybrid: ``op@r<r>@mb<i>``): slice ``s = r M +
  i``'s copy (:func:`tf_patch.slicemap.slice_candidates`), or for a data input
  its split ``microbatch/<input>``;
* ``op@r<r>`` of a once-per-step op: ``rep<r>/<op>``, else the copies the
  slices of replica ``r`` build of it (a variable read inside a slice);
* the ring of a bucket named after its first member ``t``: ``t@rs<s>@r<r>``
  -> ``allreduce/<k>/rs<s>/r<r>`` (``s = 0`` also the pack of replica ``r``),
  ``t@ag<s>@r<r>`` -> ``allreduce/<k>/ag<s>/r<r>``, ``t@allreduce@r<r>`` ->
  the unpack of replica ``r``; a sparse gradient's (Pesto gathers its rows:
  ``t@ag<s>@r<r>``, ``t@allreduce@r<r>``) -> replica ``r``'s concatenations of
  every replica's rows and indices (``allgather/<k>/r<r>/``), sharded its
  variable's updated rows ``t@pg<s>@r<r>`` -> replica ``r``'s concatenation of
  them and ``t@allgather@r<r>`` -> its assign;
* a hybrid's accumulation ``c@acc<i>`` of replica ``r``'s chunk ``c`` ->
  replica ``r``'s ``acc_<i>`` adds of that bucket;
* sharded: ``t@allgather@r<r>`` -> replica ``r``'s writes of the gathered
  parameters; ZeRO-3: ``p@fwgather@r<r>`` / ``p@bwgather@r<r>`` -> replica
  ``r``'s forward / backward concatenations of the bucket's members (the
  plan's origins name them), ``p@fsend@r<r>`` -> the reads of replica ``r``'s pieces; an update ``u@r<r>`` -> replica ``r``'s update of its piece
  (and the piece's read, load and release), each op of a sparse update -> its
  copy on replica ``r``'s rows, an optimizer slot ``s@r<r>`` -> replica
  ``r``'s piece slots, a variable ``v@r<r>`` -> its piece ``param`` (ZeRO-1/2:
  and the whole variable) (:attr:`ReplicaGraph.sharded`).

When the update equals the un-split step's: as for :mod:`tf_patch.microstep`
(a per-sample mean loss; batch norm, dropout and batch-level losses differ
knowingly). With ``R = 2`` the ring adds the two replicas' gradients as the
split step's chain does, so the update equals the 2-slice step's bit for bit.

Examples
--------
>>> ring_steps(4, 1)
[(0, 0), (1, 3), (2, 2)]
>>> chunk_sizes(10, 4), chunk_sizes(5, 4)
([3, 3, 3, 1], [2, 2, 1, 0])
"""
from __future__ import annotations

from . import needs_tf  # noqa: F401  (an ImportError naming the tf extra without TensorFlow)
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from pesto.dag import priority_order
from pesto.errors import MicroBatchError
from pesto.step.slicing import parse_name
from pesto.plan import Plan

from .extract import extract, step_ops
from .marks import GRADIENT_ROOT
from .microstep import slice_of
from .slicemap import SliceMap, mapped_hint, slice_candidates
from .zoo.common import ZooModel

__all__ = ["ReplicaGraph", "replicate_graph", "replica_map", "bucket_members", "replicated_plan", "mapped_plan", "one_replica",
           "replica_zero", "unshard", "pesto_buckets", "ring_steps", "shard_level", "origin_of",
           "chunk_sizes", "ReplicaMap", "REPLICA", "slice_adds"]

#: Scope of replica ``r``'s copy of a once-per-step op.
REPLICA = "rep{}/"
_RING = re.compile(r"^(.*)@(rs|ag|pg)(\d+)@r(\d+)$")
_GATHER = re.compile(r"^(.*)@(?:allreduce|allgather)@r(\d+)$")
_COPY = re.compile(r"^(.*)@r(\d+)$")
_CHUNK = re.compile(r"^(.*)@r(\d+)/chunk\d+$")
_REP = re.compile(r"^rep\d+/")
_PARAM_GATHER = re.compile(r"^(.*)@(fwgather|bwgather|fsend)@r(\d+)$")
_ONE = re.compile(r"@r0(?=@|:|$)")


def ring_steps(replicas: int, r: int) -> list[tuple[int, int]]:
    """``[(step, chunk), ...]``: the chunk replica ``r`` adds at each
    reduce-scatter step (it receives that chunk's running sum from ``r - 1``);
    after the last, replica ``r`` holds chunk ``(r + 1) mod R`` summed."""
    return [(s, (r - 1 - s) % replicas) for s in range(replicas - 1)]


def chunk_sizes(total: int, replicas: int) -> list[int]:
    """Elements of each of the ``replicas`` chunks of a ``total``-element buffer
    (``ceil(total / R)`` each, the last ones smaller or empty)."""
    c = -(-total // replicas)
    return [max(0, min(c, total - j * c)) for j in range(replicas)]


@dataclass(frozen=True)
class ReplicaGraph:
    """The replicated TF step (:func:`replicate_graph`).

    Attributes
    ----------
    graph : tf.Graph
    replicas, micro_batches : int
    loss : str
        The loss tensor (the sum of every slice's scaled loss).
    updates : tuple of str
        The ops to run for one step (each fetch op of the split step, a
        once-per-step one as a group of its replicas' copies under its name).
    init : mapping variable handle -> (placeholder tensor, assign op)
        Feed each placeholder its variable's value and run the assigns.
    reads : mapping variable handle -> read tensor
    values : mapping variable handle -> numpy array (every replica's copy
        starts from the same value)
    buckets : tuple of tuple of str
        The ``accumulate/<variable>`` scopes all-reduced together, one tuple
        per ring, in the plan's bucket order.
    ring : mapping (bucket index, part, replica) -> tuple of TF ops
        ``part``: ``"pack"``, ``"rs<s>"``, ``"ag<s>"``, ``"unpack"``, ``"acc<i>"``
        (sharded: ``"update"``, and ``"unpack"`` the writes of the gathered parameters; a sparse
        gradient: ``"unpack"`` and ``"ag<s>"`` its rows' concatenations, sharded ``"pg<s>"`` the
        concatenation of its variable's updated rows and ``"write"`` its assign).
    sharded : mapping (update op, optimizer slot or variable, replica) -> tuple of TF ops
        Sharded (ZeRO): replica ``r``'s update of its piece (a sparse update: each op's copy),
        its piece slots and variables; ZeRO-3 also ``(variable@fsend | @fwgather | @bwgather,
        replica)``: its pieces' reads and the replica's gathers.
    pieces : mapping piece variable handle -> (variable handle, start, stop)
        Sharded: the flat elements of a variable (or slot) a piece variable holds (not a ZeRO-1/2
        update's transient ``param``, which holds them only during the update).
    """

    graph: object
    replicas: int
    micro_batches: int
    loss: str
    updates: tuple
    init: Mapping[str, tuple]
    reads: Mapping[str, str]
    values: Mapping[str, object]
    buckets: tuple
    ring: Mapping[tuple, tuple]
    sharded: Mapping[tuple, tuple] = field(default_factory=lambda: MappingProxyType({}))
    pieces: Mapping[str, tuple] = field(default_factory=lambda: MappingProxyType({}))

    def init_feed(self) -> dict:
        """Placeholder -> value, for running the assigns of :attr:`init`."""
        return {ph: self.values[h] for h, (ph, _) in self.init.items()}

    def copies(self, values: Mapping[str, object]) -> dict:
        """Values of the split step's variables (by handle) -> values of every
        replica's copy (by handle of this graph; a piece variable its elements)."""
        import numpy as np

        out = {}
        for h in self.init:
            src, a, b = self.pieces.get(h, (_REP.sub("", h), None, None))
            out[h] = values[src] if a is None else np.reshape(np.reshape(values[src], [-1])[a:b],
                                                              np.shape(self.values[h]))
        return out


@dataclass(frozen=True)
class _Group:
    """One variable's accumulation in the split step: ``parts[s]`` slice ``s``'s
    gradient (dense) or ``(values, indices)`` (sparse); ``outs``: the tensors
    the update read (the chain's last add; the concatenated rows and indices)."""

    scope: str
    sparse: bool
    parts: tuple
    outs: tuple
    shape: tuple = ()


def _groups(graph, names: set) -> dict[str, _Group]:
    """Every ``accumulate/<variable>`` of the split step, by scope."""
    scopes = dict.fromkeys(n.rsplit("/", 1)[0] for n in names if n.startswith("accumulate/"))
    out = {}
    for scope in scopes:
        if f"{scope}/add_1" in names:
            k, adds = 1, []
            while f"{scope}/add_{k}" in names:
                adds.append(graph.get_operation_by_name(f"{scope}/add_{k}"))
                k += 1
            parts = [adds[0].inputs[0].name] + [a.inputs[1].name for a in adds]
            out[scope] = _Group(scope, False, tuple(parts), (adds[-1].outputs[0].name,),
                                tuple(adds[-1].outputs[0].shape.as_list()))
        elif f"{scope}/values" in names and f"{scope}/indices" in names:
            v, i = (graph.get_operation_by_name(f"{scope}/{w}") for w in ("values", "indices"))
            parts = tuple(zip((t.name for t in v.inputs[:-1]), (t.name for t in i.inputs[:-1])))
            out[scope] = _Group(scope, True, parts, (v.outputs[0].name, i.outputs[0].name))
    return out


def _classify(graph, ops) -> tuple[dict, set]:
    """``(slice of each slice op, once-per-step ops copied per replica)``; the
    rest (inputs, splits, the loss sum and what reads it) stays single."""
    names = {op.name for op in ops}
    acc = {n for n in names if n.startswith("accumulate/")}
    # a variable is once per step whatever its name (a tf.function's captured handle is named
    # after its first read, in slice 0)
    handles = {op.name for op in ops if op.type == "VarHandleOp"}
    sliced = {n: slice_of(n) for n in names - handles if slice_of(n) is not None}
    succ = _successors(ops)
    once = names - acc - set(sliced)
    single = _reach(succ, [n for n in names if n.startswith("microbatch/")], once) | {
        n for n in once if n.startswith("microbatch/") or graph.get_operation_by_name(n).type == "Placeholder"}
    return sliced, once - single


def _successors(ops) -> dict[str, list]:
    """Op name -> the names of the ops reading it (data or control)."""
    succ: dict[str, list] = {}
    for op in ops:
        for t in list(op.inputs) + list(op.control_inputs):
            succ.setdefault(getattr(t, "op", t).name, []).append(op.name)
    return succ


def _reach(succ, starts, within=None) -> set:
    """The ops downstream of ``starts`` (not themselves), through ops of ``within`` only (None: all)."""
    seen, todo = set(), list(starts)
    while todo:
        for d in succ.get(todo.pop(), ()):
            if (within is None or d in within) and d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


def _split_input(text: str) -> tuple[str, str | None]:
    """A NodeDef input -> ``(op, output index as text, or None for a control input)``."""
    if text.startswith("^"):
        return text[1:], None
    op, _, idx = text.partition(":")
    return op, idx or "0"


class _Rewrite:
    """Copies the split step's NodeDefs into replicas (:func:`replicate_graph`)."""

    def __init__(self, gd, names, sliced, per_rep, micro_batches, outs):
        self.nodes = {n.name: n for n in gd.node if n.name in names}
        self.sliced, self.per_rep, self.m = sliced, per_rep, micro_batches
        self.outs = outs   # accumulated tensor name -> its group's index in the outputs

    def name(self, op: str, r: int | None) -> str:
        return REPLICA.format(r) + op if op in self.per_rep and r is not None else op

    def replica_of(self, op: str) -> int | None:
        s = self.sliced.get(op)
        return None if s is None else s // self.m

    def copy(self, op: str, r: int | None, replicas: int):
        """Op ``op``'s NodeDef for replica ``r`` (None: a single op, whose
        control inputs from copied ops wait for every copy)."""
        node = type(self.nodes[op])()
        node.CopyFrom(self.nodes[op])
        node.name = self.name(op, r)
        inputs = []
        for text in node.input:
            src, idx = _split_input(text)
            if idx is not None and f"{src}:{idx}" in self.outs:
                inputs.append(f"__allreduced__/r{r}/{src}:{idx}")
            elif idx is None and src in self.per_rep and r is None:
                inputs += [f"^{self.name(src, k)}" for k in range(replicas)]
            else:
                inputs.append(("^" if idx is None else "") + self.name(src, 0 if r is None else r)
                              + ("" if idx is None else f":{idx}"))
        del node.input[:]
        node.input.extend(inputs)
        if "_class" in node.attr:
            locs = [b.decode() for b in node.attr["_class"].list.s]
            node.attr["_class"].list.s[:] = [("loc:@" + self.name(x[5:], r)).encode() if x.startswith("loc:@")
                                             else x.encode() for x in locs]
        if node.op == "VarHandleOp" and r is not None:
            node.attr["shared_name"].s = node.name.encode()
        return node


def _graph_of(nodes, library, versions):
    """A new tf.Graph of ``nodes`` (NodeDefs, under their own names)."""
    import tensorflow as tf

    gd = tf.compat.v1.GraphDef()
    gd.versions.CopyFrom(versions)
    gd.library.CopyFrom(library)
    gd.node.extend(nodes)
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(gd, name="")
    return graph


def _joined(graph, nodes, remap: Mapping[str, str], library, versions):
    """A new tf.Graph of ``graph`` and ``nodes``, imported at once (so no
    name is made unique against a scope already there); an input of ``nodes``
    in ``remap`` reads the tensor it stands for."""
    for n in nodes:
        inputs = [remap.get(t, t) if not t.startswith("^") else t for t in n.input]
        del n.input[:]
        n.input.extend(inputs)
    gd = graph.as_graph_def()
    return _graph_of(list(gd.node) + list(nodes), library, versions)


class _Ring:
    """The all-reduce ops of one bucket (:func:`replicate_graph`), built in the new graph."""

    def __init__(self, k: int, groups: list, replicas: int, micro_batches: int, zero: "_Zero | None" = None):
        self.k, self.groups, self.n, self.m, self.zero = k, groups, replicas, micro_batches, zero
        self.ops: dict[tuple, list] = {}
        self.out: dict[str, str] = {}   # "__allreduced__/r<r>/<tensor>" -> the tensor replacing it

    def _mark(self, part: str, r: int, *tensors) -> None:
        self.ops.setdefault((self.k, part, r), []).extend(getattr(t, "op", t).name for t in tensors)

    def own(self, graph, group: _Group, r: int, j: int | None = None):
        """Replica ``r``'s gradient of ``group`` (its slices summed, hybrid),
        or for a sparse group (``j`` 0 rows, 1 indices) its slices' concatenated."""
        import tensorflow as tf

        parts = [graph.get_tensor_by_name(p if j is None else p[j]) for p in group.parts[r * self.m:(r + 1) * self.m]]
        if len(parts) == 1:
            return parts[0]
        scope = f"allreduce/{self.k}/r{r}/{_label(group.scope)}"
        if j is not None:
            out = tf.concat(parts, 0, name=f"{scope}/{('rows', 'indices')[j]}")
            self._mark(f"acc{self.m - 1}", r, out)
            return out
        total = parts[0]
        for i, p in enumerate(parts[1:], start=1):
            total = tf.add(total, p, name=f"{scope}/acc_{i}")
            self._mark(f"acc{i}", r, total)
        return total

    def build(self, graph) -> None:
        dense = [g for g in self.groups if not g.sparse]
        if dense:
            self._dense(graph, dense)
        for g in self.groups:
            if g.sparse:
                self._gather(graph, g)

    def _gather(self, graph, group: _Group) -> None:
        """Every replica concatenates all replicas' rows and indices; sharded, each then
        updates its rows of the variable (:meth:`_Zero.rows`)."""
        import tensorflow as tf

        own = [[self.own(graph, group, r, j) for r in range(self.n)] for j in (0, 1)]
        gathered = []
        for r in range(self.n):
            gathered.append([])
            for j, t in enumerate(group.outs):
                out = tf.concat(own[j], 0, name=f"allgather/{self.k}/r{r}/{_label(group.scope)}/{'vi'[j]}")
                for part in ("unpack", *(f"ag{s}" for s in range(self.n - 1))):   # Pesto's ring steps receive
                    self._mark(part, r, out)                                       # the rows it concatenates
                src, idx = _split_input(t)
                self.out[f"__allreduced__/r{r}/{src}:{idx}"] = out.name
                gathered[r].append(out.name)
        if self.zero is not None:
            self.zero.rows(graph, group, gathered, f"allreduce/{self.k}",
                           lambda r, *ts, part="update": self._mark(part, r, *ts))

    def _dense(self, graph, groups: list) -> None:
        """Pack, reduce-scatter, all-gather, unpack (module doc)."""
        import tensorflow as tf

        n, scope = self.n, f"allreduce/{self.k}"
        own = [[self.own(graph, g, r) for g in groups] for r in range(n)]
        dtypes = {t.dtype for t in own[0]}
        sizes = [t.shape.num_elements() for t in own[0]]
        if len(dtypes) > 1 or None in sizes:
            raise MicroBatchError(f"bucket {[g.scope for g in groups]} mixes dtypes {sorted(map(str, dtypes))} or "
                                  "has a gradient of unknown size: the ring packs one flat buffer", culprit=self.k)
        chunks = []
        for r in range(n):
            flat = [tf.reshape(t, [-1], name=f"{scope}/r{r}/flat_{i}") for i, t in enumerate(own[r])]
            if self.zero is not None:   # chunk j: piece j of every gradient (the shards each replica updates)
                chunks.append(self.zero.pack(flat, sizes, f"{scope}/r{r}", lambda *ts, r=r: self._mark("pack", r, *ts)))
                continue
            pack = flat[0] if len(flat) == 1 else tf.concat(flat, 0, name=f"{scope}/r{r}/pack")
            parts = tf.split(pack, chunk_sizes(sum(sizes), n), 0, name=f"{scope}/r{r}/chunks")
            self._mark("pack", r, *flat, pack, parts[0])
            chunks.append(parts)
        held: list[dict] = [{} for _ in range(n)]
        rs = [chunks[0][0]]   # one replica: its own sum
        for s in range(n - 1):
            rs = [tf.add(chunks[(r - 1) % n][j] if s == 0 else rs[(r - 1) % n], chunks[r][j],
                         name=f"{scope}/rs{s}/r{r}") for r, (_, j) in ((r, ring_steps(n, r)[s]) for r in range(n))]
            for r in range(n):
                self._mark(f"rs{s}", r, rs[r])
        if self.zero is not None:   # each replica updates its shard, then the parameters are all-gathered
            rs = [self.zero.update(graph, groups, sizes, rs[r], r, f"{scope}/r{r}",
                                   lambda *ts, r=r: self._mark("update", r, *ts)) for r in range(n)]
            if self.zero.level == 3:   # ZeRO-3: the next step's reads gather the pieces (_Zero.gather_reads)
                return
        ag = rs
        for r in range(n):   # after the reduce-scatter replica r holds chunk r + 1 summed
            held[r][(r + 1) % n] = rs[r]
        for s in range(n - 1):
            ag = [tf.identity(ag[(r - 1) % n], name=f"{scope}/ag{s}/r{r}") for r in range(n)]
            for r in range(n):
                self._mark(f"ag{s}", r, ag[r])
                held[r][(r - s) % n] = ag[r]
        if self.zero is not None:
            for r in range(n):
                self.zero.write(groups, held[r], sizes, r, f"{scope}/r{r}", lambda *ts, r=r: self._mark("unpack", r, *ts))
            return
        self._unpack(groups, held, sizes)

    def _unpack(self, groups, held, sizes) -> None:
        import tensorflow as tf

        scope = f"allreduce/{self.k}"
        for r, chunks in enumerate(held):
            total = tf.concat([chunks[j] for j in range(self.n)], 0, name=f"{scope}/r{r}/sum")
            pieces = tf.split(total, sizes, 0, name=f"{scope}/r{r}/unpack")
            self._mark("unpack", r, total, pieces[0])
            for i, (g, piece) in enumerate(zip(groups, pieces)):
                grad = tf.reshape(piece, g.shape, name=f"{scope}/r{r}/grad_{i}")
                self._mark("unpack", r, grad)
                src, idx = _split_input(g.outs[0])
                self.out[f"__allreduced__/r{r}/{src}:{idx}"] = grad.name


@dataclass(frozen=True)
class _Update:
    """A dense gradient's update in the split step (ZeRO, :class:`_Zero`): the
    one ``ResourceApply*`` op reading the accumulated gradient, its NodeDef,
    its resource inputs ``(position, variable handle)`` (the variable first,
    then the optimizer's slots) and the gradient's input position."""

    op: str
    node: object
    resources: tuple
    grad: int


def _zero_updates(graph, groups: Mapping[str, _Group], nodes: Mapping[str, object]) -> dict[str, _Update]:
    """``{accumulate scope: its update}`` for every dense group (ZeRO); a sparse
    group's update is sharded by rows (:func:`_sparse_updates`).

    Raises
    ------
    MicroBatchError
        A dense gradient read by anything but one element-wise ``ResourceApply*``
        op whose other inputs are the variable, its slots and scalars (a Keras 3
        optimizer's update of several ops, a gradient clipped by a global norm).
    """
    out = {}
    for scope, g in groups.items():
        if g.sparse:
            continue
        t = graph.get_tensor_by_name(g.outs[0])
        users = [c for c in t.consumers() if c.name in nodes]
        op = users[0] if len(users) == 1 else None
        ins = list(op.inputs) if op is not None else []
        res = tuple((i, x.op.name) for i, x in enumerate(ins) if x.dtype.name == "resource")
        grad = [i for i, x in enumerate(ins) if x.name == t.name]
        ok = (op is not None and op.type.startswith("ResourceApply") and len(grad) == 1 and res and res[0][0] == 0
              and all(x.op.type == "VarHandleOp" for x in ins if x.dtype.name == "resource")
              and all(x.shape.rank == 0 for i, x in enumerate(ins) if x.dtype.name != "resource" and i != grad[0]))
        if not ok:
            raise MicroBatchError(f"a sharded optimizer (ZeRO) needs each dense gradient read by one element-wise "
                                  f"ResourceApply* update; {_label(scope)}'s is read by "
                                  f"{sorted((c.name, c.type) for c in users)}", culprit=_label(scope))
        out[scope] = _Update(op.name, nodes[op.name], res, grad[0])
    return out


@dataclass(frozen=True)
class _SparseUpdate:
    """A sparse gradient's update in the split step (ZeRO, :class:`_Zero`): its
    once-per-step ops in topological order (:func:`_sparse_updates`), the variable's
    handle, the slots' (the other variables those ops write, of the variable's shape),
    the gradient's ``(rows, indices)`` tensors and the ops that others wait for."""

    ops: tuple
    var: str
    slots: tuple
    grad: tuple
    exits: tuple


def _sparse_updates(graph, groups: Mapping[str, _Group], nodes: Mapping[str, object],
                    sliced: Mapping[str, int]) -> dict[str, _SparseUpdate]:
    """``{accumulate scope: its update}`` for every sparse group (ZeRO): the once-per-step
    ops downstream of the gradient or reading a variable it writes, on the way to a write
    of one (a v1 optimizer's ``Unique``, ``UnsortedSegmentSum``, reads, scatter-adds and
    assigns; not the scalars it reads, nor what waits for it).

    Raises
    ------
    MicroBatchError
        The update writes no variable that the slices look up, or several, or a variable
        of another shape than it, or its ops are read by others (not only waited for):
        its rows cannot be sharded.
    """
    ops = [graph.get_operation_by_name(n) for n in nodes]
    once = {op.name for op in ops if op.name not in sliced and not op.name.startswith("accumulate/")}
    succ, pred = _successors(ops), {op.name: [getattr(x, "op", x).name for x in (*op.inputs, *op.control_inputs)]
                                     for op in ops}
    out = {}
    for scope, g in groups.items():
        if not g.sparse:
            continue
        down = _reach(succ, [t.split(":")[0] for t in g.outs], once)
        writers = {w for w in down if graph.get_operation_by_name(w).type not in ("ReadVariableOp", "VariableShape")
                   and _resources(graph.get_operation_by_name(w))}
        handles = {h for w in writers for h in _resources(graph.get_operation_by_name(w))}
        looked = [h for h in handles
                  if any(c.name in sliced for c in graph.get_operation_by_name(h).outputs[0].consumers())]
        shape = graph.get_operation_by_name(looked[0]).get_attr("shape") if len(looked) == 1 else None
        # the variable and its slots: what it writes of the looked-up variable's shape (not Adam's scalars)
        written = {h for h in handles if shape is not None and graph.get_operation_by_name(h).type == "VarHandleOp"
                   and graph.get_operation_by_name(h).get_attr("shape") == shape}
        writes = {w for w in writers if set(_resources(graph.get_operation_by_name(w))) & written}
        readers = {c.name for h in written for c in graph.get_operation_by_name(h).outputs[0].consumers()
                   if c.name in once}
        mine = ((down | readers | _reach(succ, readers, once)) & _reach(pred, writes, once)) | writes
        leaks = sorted(c.name for n in mine for t in graph.get_operation_by_name(n).outputs for c in t.consumers()
                       if c.name in nodes and c.name not in mine)
        if shape is None or leaks or any(set(_resources(graph.get_operation_by_name(w))) - written for w in writes):
            raise MicroBatchError(f"a sharded optimizer (ZeRO) shards a sparse gradient's update by rows: it must "
                                  f"write the looked-up variable and slots of its shape, its ops waited for, not "
                                  f"read; {_label(scope)}'s update writes {sorted(handles)} (looked up: {looked}), "
                                  f"its ops read by {leaks}", culprit=_label(scope))
        var = looked[0]
        exits = sorted(n for n in mine if any(x in nodes and x not in mine for x in succ.get(n, ())))
        out[scope] = _SparseUpdate(tuple(op.name for op in ops if op.name in mine), var,
                                   tuple(sorted(written - {var})), g.outs, tuple(exits))
    return out


def _resources(op) -> list:
    """The variable handles (resource inputs) op ``op`` reads."""
    return [x.op.name for x in op.inputs if x.dtype.name == "resource"]


class _Zero:
    """The sharded optimizer of the replicated TF step (ZeRO-1/2/3, :func:`replicate_graph`),
    mirroring :mod:`pesto.step.replication`'s: the bucket's chunk ``j`` packs
    piece ``j`` of every gradient (:meth:`pack`), so after the reduce-scatter
    replica ``r`` holds piece ``(r + 1) mod R`` of each gradient summed and
    updates only that piece (:meth:`update`: the variable's ``ResourceApply*``
    op on a piece variable ``param``, transient under ZeRO-1/2, and piece slots
    ``slot_<q>``, the optimizer state ``1 / R`` per replica); a sparse gradient's
    variable is updated by rows (:meth:`rows`); the updated pieces go round the
    ring (``ag<s>``) and every replica writes its whole variables from them
    (:meth:`write`). The original update op of replica ``r`` becomes a
    ``NoOp`` of its name that waits for both (:meth:`noops`). ZeRO-3: no write,
    the reads gather the pieces and the whole variables are dropped
    (:meth:`gather_reads`)."""

    def __init__(self, updates: Mapping[str, _Update], values: Mapping[str, object], rw: "_Rewrite", replicas: int,
                 level: int = 1, sparse: Mapping[str, _SparseUpdate] | None = None):
        self.updates, self.values, self.rw, self.n, self.level = updates, values, rw, replicas, level
        self.sparse = dict(sparse or {})
        self.pieces: dict[str, tuple] = {}    # piece variable handle -> (variable handle, start, stop)
        self.shapes: dict[str, tuple] = {}    # piece variable handle -> its shape
        self.sharded: dict[tuple, tuple] = {}  # (update op or slot handle, replica) -> its TF ops
        self.done: dict[tuple, list] = {}     # (update op, replica) -> the ops its NoOp waits for
        self.dropped: set[str] = set()        # ZeRO-3: the whole variables and their reads, gone

    def skipped(self, nodes) -> set:
        """The split step's ops not copied: the updates and the slots only they read."""
        ups = {u.op for u in self.updates.values()} | {x for u in self.sparse.values() for x in u.ops}
        readers: dict[str, set] = {}
        for node in nodes.values():
            for text in node.input:
                readers.setdefault(_split_input(text)[0], set()).add(node.name)
        slots = {h for u in self.updates.values() for _, h in u.resources[1:]} | {
            h for u in self.sparse.values() for h in u.slots}
        return ups | {h for h in slots if readers.get(h, set()) <= ups}

    def _piece(self, h: str, a: int, b: int, name: str, r: int, q: int, rows: bool = False):
        """Replica ``r``'s piece variable ``name`` of variable (or slot, ``q > 0``) ``h``:
        its flat elements ``[a, b)``, or with ``rows`` its rows."""
        import numpy as np
        import tensorflow as tf

        value = self.values[h]
        shape = (b - a, *(np.shape(value)[1:] if rows else ()))
        row = int(np.prod(shape[1:], dtype=np.int64))
        transient = q == 0 and self.level < 3
        handle = tf.raw_ops.VarHandleOp(dtype=tf.as_dtype(value.dtype), shape=[None if transient else b - a,
                                                                                 *shape[1:]],
                                        shared_name=name, name=name)
        if not transient:
            self.pieces[handle.op.name], self.shapes[handle.op.name] = (h, a * row, b * row), shape
        # Pesto's variable (or slot) of replica r: its piece (ZeRO-1/2: and the whole variable it writes)
        self._note((h, r), *([self.rw.name(h, r)] if transient else []), handle.op.name)
        return handle

    def _load(self, graph, piece, h: str, a: int, b: int, r: int, rows: bool = False):
        """ZeRO-1/2: replica ``r``'s whole variable ``h``'s elements (or ``rows``) ``[a, b)``
        written into its transient piece variable ``piece`` (the update's operand); the assign."""
        import tensorflow as tf

        name = piece.op.name
        whole = tf.raw_ops.ReadVariableOp(resource=graph.get_tensor_by_name(f"{self.rw.name(h, r)}:0"),
                                          dtype=piece.op.get_attr("dtype"), name=f"{name}/whole")
        part = (whole if rows else tf.reshape(whole, [-1], name=f"{name}/flat"))[a:b]
        return tf.raw_ops.AssignVariableOp(resource=piece, value=part, name=f"{name}/load")

    @staticmethod
    def _release(piece, after):
        """ZeRO-1/2: the transient piece variable ``piece`` emptied once ``after`` (its
        updated value, which keeps its buffer until read) is read: it holds no bytes
        between steps, as Pesto's model says (weights whole, optimizer state ``1 / R``)."""
        import tensorflow as tf

        name = piece.op.name
        empty = tf.zeros([0, *after.shape[1:]], dtype=after.dtype, name=f"{name}/empty")
        with tf.control_dependencies([after]):
            return tf.raw_ops.AssignVariableOp(resource=piece, value=empty, name=f"{name}/release")

    def pack(self, flat, sizes, scope: str, mark) -> list:
        """Replica's chunks: chunk ``j`` the ``j``-th pieces of every flat gradient."""
        import tensorflow as tf

        pieces = [tf.split(f, chunk_sizes(size, self.n), 0, name=f"{scope}/pieces_{i}")
                  for i, (f, size) in enumerate(zip(flat, sizes))]
        chunks = [tf.concat([p[j] for p in pieces], 0, name=f"{scope}/chunk_{j}") for j in range(self.n)]
        mark(*flat, *(p[0] for p in pieces), *chunks)
        return chunks

    def update(self, graph, groups, sizes, shard, r: int, scope: str, mark):
        """Replica ``r``'s updates of its pieces (its summed ``shard``); the updated pieces, packed."""
        import tensorflow as tf

        c = (r + 1) % self.n
        grads = tf.split(shard, [chunk_sizes(s, self.n)[c] for s in sizes], 0, name=f"{scope}/shard")
        mark(grads[0])
        out = [self._apply(graph, self.updates[g.scope], grad, r, c, size, f"{scope}/{_label(g.scope)}", mark)
               for g, grad, size in zip(groups, grads, sizes)]
        own = tf.concat(out, 0, name=f"{scope}/updated")
        mark(own)
        return own

    def _apply(self, graph, up: _Update, grad, r: int, c: int, size: int, scope: str, mark):
        """One variable's update on piece ``c`` (elements ``[a, b)``) in replica ``r``; the piece after it."""
        import tensorflow as tf

        step = -(-size // self.n)
        a = min(size, c * step)
        b = min(size, a + step)
        self.done.setdefault((up.op, r), [])
        if a == b:   # fewer elements than replicas: nothing of it here
            return grad
        handles = {pos: self._piece(h, a, b, f"{scope}/param" if q == 0 else f"{scope}/slot_{q}", r, q)
                   for q, (pos, h) in enumerate(up.resources)}
        load = [self._load(graph, handles[0], up.resources[0][1], a, b, r)] if self.level < 3 else []
        inputs = []
        for pos, text in enumerate(t for t in up.node.input if not t.startswith("^")):
            src, idx = _split_input(text)
            inputs.append(handles[pos] if pos in handles else grad if pos == up.grad
                          else graph.get_tensor_by_name(f"{self.rw.name(src, r)}:{idx}"))
        attrs = {k: v for k, v in up.node.attr.items() if not k.startswith("_")}
        with tf.control_dependencies(load):
            op = graph._create_op_internal(up.node.op, inputs, dtypes=[], attrs=attrs, name=f"{scope}/update")
        with tf.control_dependencies([op]):
            piece = tf.raw_ops.ReadVariableOp(resource=handles[0], dtype=grad.dtype, name=f"{scope}/updated")
        release = [self._release(handles[0], piece)] if load else []
        mark(*load, op, piece, *release)
        self.sharded[(up.op, r)] = (op.name, piece.op.name, *(x.name for x in (*load, *release)))
        self.done[(up.op, r)].extend(x.name for x in (op, *release))
        return piece

    def rows(self, graph, group: _Group, gathered, scope: str, mark) -> None:
        """A sparse gradient's update by rows: replica ``r`` holds rows ``[a, b)`` (piece
        ``(r + 1) mod R`` of ``ceil(rows / R)``) of the variable and its slots (piece
        variables ``param``, ``slot_<q>``) and runs the update's ops on them (``update/<op>``,
        :func:`_sparse_updates`) with the gathered rows (``gathered[r]``: rows, indices) it
        holds, their indices less ``a``; ZeRO-1/2: every replica then writes its whole
        variable from every replica's updated piece (``assign``)."""
        import tensorflow as tf

        up, n = self.sparse[group.scope], self.n
        rows = self.values[up.var].shape[0]
        step = -(-rows // n)
        label, written = f"{scope}/{_label(group.scope)}", []
        for r in range(n):
            a = min(rows, (r + 1) % n * step)
            b = min(rows, a + step)
            at = f"{label}/r{r}"
            pieces = {h: self._piece(h, a, b, f"{at}/param" if q == 0 else f"{at}/slot_{q}", r, q, rows=True)
                      for q, h in enumerate((up.var, *up.slots))}
            load = [self._load(graph, pieces[up.var], up.var, a, b, r, rows=True)] if self.level < 3 else []
            values, indices = (graph.get_tensor_by_name(t) for t in gathered[r])
            with tf.name_scope(f"{at}/rows/"):
                keep = tf.logical_and(indices >= a, indices < b)
                mine = {up.grad[0]: tf.boolean_mask(values, keep),
                        up.grad[1]: tf.boolean_mask(indices, keep) - tf.cast(a, indices.dtype)}
            made = self._copy_update(graph, up, r, f"{at}/update", pieces, mine, load)
            mark(r, keep, *mine.values(), *pieces.values(), *load, *made.values())
            writes = [op for op in made.values() if pieces[up.var].op.name in _resources(op)
                      and op.type not in ("ReadVariableOp", "VariableShape")]
            with tf.control_dependencies(writes):
                written.append(tf.raw_ops.ReadVariableOp(resource=pieces[up.var], dtype=values.dtype,
                                                         name=f"{at}/updated"))
            release = [self._release(pieces[up.var], written[-1])] if load else []
            for x in up.exits:
                self.done.setdefault((x, r), []).extend(y.name for y in (made[x], *release))
            mark(r, written[-1], *release)
        if self.level < 3:
            order = sorted(range(n), key=lambda r: (r + 1) % n)   # replica r holds piece r + 1
            for r in range(n):
                whole = tf.concat([written[k] for k in order], 0, name=f"{label}/r{r}/whole")
                var = graph.get_tensor_by_name(f"{self.rw.name(up.var, r)}:0")
                assign = tf.raw_ops.AssignVariableOp(resource=var, value=whole, name=f"{label}/r{r}/assign")
                mark(r, whole, assign)
                for s in range(n - 1):   # Pesto's ring steps of the updated rows (t@pg<s>@r<r>) receive them
                    mark(r, whole, part=f"pg{s}")
                mark(r, assign, part="write")
                for x in up.exits:
                    self.done[(x, r)].append(assign.name)

    def _copy_update(self, graph, up: _SparseUpdate, r: int, scope: str, pieces, grad, load=()) -> dict:
        """Replica ``r``'s copies of the update's ops (:meth:`rows`), on its ``pieces``
        (variable handle -> piece handle) and its rows of the gradient ``grad``
        (tensor name -> tensor), those using the variable's piece after ``load``;
        ``{op: its copy}``."""
        made: dict[str, object] = {}

        def tensor(text: str):
            src, idx = _split_input(text)
            if src in made:
                return made[src].outputs[int(idx)]
            if src in pieces:
                return pieces[src]
            if f"{src}:{idx}" in grad:
                return grad[f"{src}:{idx}"]
            return graph.get_tensor_by_name(f"{self.rw.name(src, r)}:{idx}")

        for x in up.ops:
            node = self.rw.nodes[x]
            data = [tensor(t) for t in node.input if not t.startswith("^")]
            waits = [made[t[1:]] if t[1:] in made else graph.get_operation_by_name(self.rw.name(t[1:], r))
                     for t in node.input if t.startswith("^")]
            if any(_split_input(t)[0] == up.var for t in node.input):
                waits += list(load)
            attrs = {k: v for k, v in node.attr.items() if not k.startswith("_")}
            with graph.control_dependencies(waits):
                made[x] = graph._create_op_internal(node.op, data, attrs=attrs, name=f"{scope}/{x}")
            self.sharded[(x, r)] = (made[x].name,)
        return made

    def write(self, groups, held, sizes, r: int, scope: str, mark) -> None:
        """Replica ``r``'s variables written whole from the gathered pieces (``held[j]``: chunk ``j``)."""
        import tensorflow as tf

        n = self.n
        parts = [tf.split(held[j], [chunk_sizes(s, n)[j] for s in sizes], 0, name=f"{scope}/gathered_{j}")
                 for j in range(n)]
        mark(*(p[0] for p in parts))
        graph = held[0].graph
        for i, g in enumerate(groups):
            up = self.updates[g.scope]
            label = f"{scope}/{_label(g.scope)}"
            value = tf.reshape(tf.concat([parts[j][i] for j in range(n)], 0, name=f"{label}/whole"), g.shape,
                               name=f"{label}/value")
            var = graph.get_tensor_by_name(f"{self.rw.name(up.resources[0][1], r)}:0")
            assign = tf.raw_ops.AssignVariableOp(resource=var, value=value, name=f"{label}/assign")
            mark(value, assign)
            self.done[(up.op, r)].append(assign.name)

    def noops(self) -> list:
        """``rep<r>/<update>``: a NoOp per replaced update, waiting for its piece's update and its write."""
        import tensorflow as tf

        out = []
        for (op, r), waits in self.done.items():
            node = tf.compat.v1.NodeDef(name=self.rw.name(op, r), op="NoOp")
            node.input.extend(f"^{w}" for w in waits)
            out.append(node)
        return out

    def gather_reads(self, graph, library, versions):
        """ZeRO-3: ``graph`` without the whole variables of the sharded ones (a new tf.Graph).

        Every read of a sharded variable ``h`` in replica ``r`` (a ``ReadVariableOp`` of
        ``rep<r>/h``) is replaced by the concatenation of its pieces, read once per piece
        (``zero3/<h>/piece_<j>``, on its owner's piece variable): one concatenation
        (``zero3/r<r>/<h>/forward``) for the forward readers, one (``.../backward``) for
        those under a gradient scope (a transient whole copy, as Pesto's gathers); a
        ``ResourceGather`` of it (an embedding lookup) becomes a ``GatherV2`` of that
        concatenation, a ``VariableShape`` of it the constant shape. The whole variables
        ``rep<r>/h`` and their reads are then dropped: a replica holds only its pieces
        (:meth:`_drop_whole`). The pieces are read before any update: the forward reads
        feed every replica's loss, hence every reduce-scatter."""
        import tensorflow as tf

        params: dict[str, list] = {}
        for piece, (h, a, b) in self.pieces.items():
            if piece.endswith("/param"):
                params.setdefault(h, []).append((a, piece))
        whole = {self.rw.name(h, r): (h, r) for h in params for r in range(self.n)}
        needs = self._directions(graph, whole)
        gathered: dict[tuple, str] = {}
        with graph.as_default():
            axis = tf.constant(0, name="zero3/axis")
            for h, parts in sorted(params.items()):
                parts.sort()
                var = graph.get_operation_by_name(parts[0][1])
                reads = [tf.raw_ops.ReadVariableOp(resource=graph.get_tensor_by_name(f"{piece}:0"),
                                                   dtype=var.get_attr("dtype"), name=f"zero3/{h}/piece_{j}")
                         for j, (_, piece) in enumerate(parts)]
                for j, (_, piece) in enumerate(parts):
                    owner = int(re.search(r"/r(\d+)/", piece).group(1))
                    self._note((f"{h}@fsend", owner), reads[j].op.name)
                flat = [tf.reshape(x, [-1], name=f"zero3/{h}/flat_{j}") if x.shape.rank != 1 else x
                        for j, x in enumerate(reads)]
                for r, d in sorted(needs.get(h, ())):
                    cat = tf.concat(flat, 0, name=f"zero3/r{r}/{h}/{d}/concat") if len(flat) > 1 else flat[0]
                    out = tf.reshape(cat, self.values[h].shape, name=f"zero3/r{r}/{h}/{d}")
                    self._note((f"{h}@{d[0]}wgather", r), *(x.op.name for x in (cat, out) if x is not flat[0]))
                    gathered[(h, r, d)] = out.name
        return _graph_of(self._drop_whole(graph.as_graph_def(), whole, gathered, axis.op.name), library, versions)

    def _note(self, key: tuple, *ops: str) -> None:
        self.sharded[key] = self.sharded.get(key, ()) + tuple(ops)

    @staticmethod
    def _direction(name: str) -> str:
        """``"backward"`` for an op under a gradient scope, else ``"forward"``."""
        return "backward" if any(GRADIENT_ROOT.match(part) for part in name.split("/")) else "forward"

    def _directions(self, graph, whole) -> dict[str, set]:
        """``{variable: {(replica, direction)}}``: the gathers the readers of the whole variables need."""
        out: dict[str, set] = {}
        for w, (h, r) in whole.items():
            for user in graph.get_operation_by_name(w).outputs[0].consumers():
                readers = list(user.outputs[0].consumers()) if user.type == "ReadVariableOp" else [user]
                for c in readers:
                    if c.type != "VariableShape":
                        out.setdefault(h, set()).add((r, self._direction(c.name)))
        return out

    def _drop_whole(self, gd, whole, gathered, axis: str) -> list:
        """The NodeDefs of ``gd`` without the whole variables ``whole`` and their reads; what read them reads
        ``gathered[(variable, replica, direction)]`` (:meth:`gather_reads`).

        Raises
        ------
        MicroBatchError
            A whole variable used otherwise than read, looked up (``ResourceGather``) or sized.
        """
        reads = {n.name: n.input[0] for n in gd.node if n.op == "ReadVariableOp" and n.input[0] in whole}
        self.dropped.update(whole, reads)
        out = []
        for node in gd.node:
            if node.name in whole or node.name in reads:
                continue
            d, shape, looked_up = self._direction(node.name), None, False
            inputs = []
            for k, text in enumerate(node.input):
                src, idx = _split_input(text)
                if idx is None and (src in reads or src in whole):
                    continue   # a wait for a read (a tf.function's): the pieces' reads come before any update
                if src in reads:
                    inputs.append(gathered[(*whole[reads[src]], d)])
                elif src not in whole:
                    inputs.append(text)
                elif node.op == "ResourceGather" and k == 0:
                    inputs.append(gathered[(*whole[src], d)])
                    looked_up = True
                elif node.op == "VariableShape":
                    shape = self.values[whole[src][0]].shape
                else:
                    raise MicroBatchError(f"ZeRO-3 drops each replica's whole variable {src!r}, but {node.name!r} "
                                          f"({node.op}) uses it otherwise than reading it", culprit=node.name)
            del node.input[:]
            node.input.extend(inputs)
            if looked_up:
                _as_gather(node, axis)
            elif shape is not None:
                _as_shape(node, shape)
            if "_class" in node.attr:
                locs = [x for x in node.attr["_class"].list.s if x.decode()[5:] not in whole]
                node.attr["_class"].list.s[:] = locs
                if not locs:
                    del node.attr["_class"]
            out.append(node)
        return out

    def piece_values(self) -> dict:
        """Initial values of the piece variables (slices of their variables')."""
        import numpy as np

        return {h: np.reshape(np.reshape(self.values[src], [-1])[a:b], self.shapes[h])
                for h, (src, a, b) in self.pieces.items()}


def _as_gather(node, axis: str) -> None:
    """A ``ResourceGather`` NodeDef (its first input already the gathered tensor) as a ``GatherV2``."""
    import tensorflow as tf

    attrs = node.attr
    dtype, tind, batch_dims = attrs["dtype"].type, attrs["Tindices"].type, attrs["batch_dims"].i
    node.op = "GatherV2"
    node.input.insert(2, axis)
    for k in list(attrs):
        if not k.startswith("_"):
            del attrs[k]
    attrs["Tparams"].type, attrs["Tindices"].type = dtype, tind
    attrs["Taxis"].type = tf.int32.as_datatype_enum
    attrs["batch_dims"].i = batch_dims


def _as_shape(node, shape) -> None:
    """A ``VariableShape`` NodeDef (its input dropped) as the constant ``shape``."""
    import tensorflow as tf

    dtype = tf.as_dtype(node.attr["out_type"].type)
    node.op = "Const"
    for k in list(node.attr):
        if not k.startswith("_"):
            del node.attr[k]
    node.attr["dtype"].type = dtype.as_datatype_enum
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(list(shape), dtype=dtype))


def _label(scope: str) -> str:
    """``accumulate/<variable>`` -> ``<variable>`` (a scope name for the ring's ops)."""
    return scope.removeprefix("accumulate/")


def replicate_graph(graph, fetches, replicas: int, micro_batches: int = 1, *, values: Mapping[str, object],
                    buckets=None, shard_optimizer: int = 0) -> ReplicaGraph:
    """The split step ``graph`` of ``replicas * micro_batches`` slices as
    ``replicas`` data-parallel replicas (module doc).

    Parameters
    ----------
    graph : tf.Graph
        A v1 graph of the split step (:mod:`tf_patch.microstep`, resource
        variables: a zoo model's, or :attr:`tf_patch.FunctionStep.tf_graph`).
    fetches : the step's fetches (the loss tensor first, then the update ops), by name
    replicas, micro_batches : int
    values : mapping variable handle op -> initial value (numpy)
    buckets : list of lists of ``accumulate/<variable>`` scopes, or None
        The rings (:func:`pesto_buckets` gives the plan's); a scope in none
        is a ring alone; None: one ring per variable.
    shard_optimizer : int
        ``1`` or ``2``: ZeRO (:class:`_Zero`: each replica updates its
        ``1 / R`` piece of every variable and its slots, a sparse gradient's
        by rows, the updated pieces all-gathered); TensorFlow frees the
        gradient outside the shard after the reduce-scatter in both, so ZeRO-1
        and ZeRO-2 build the same step. ``3``: ZeRO-3, the reads gather the
        pieces instead and no replica holds a whole variable (module doc).
        ``0``: every replica updates everything.

    Returns
    -------
    ReplicaGraph

    Raises
    ------
    MicroBatchError
        The graph has not ``replicas * micro_batches`` slices, or a bucket cannot be packed;
        sharded, a dense gradient not read by one element-wise update (:func:`_zero_updates`), a
        sparse one whose update cannot be sharded by rows (:func:`_sparse_updates`), or (ZeRO-3)
        a variable used otherwise than read, looked up or sized (:meth:`_Zero.gather_reads`).
    """
    ops = step_ops(graph, list(fetches))
    names = {op.name for op in ops}
    groups = _groups(graph, names)
    sliced, per_rep = _classify(graph, ops)
    want = replicas * micro_batches
    if set(sliced.values()) != set(range(want)) or (want > 1 and not groups):
        raise MicroBatchError(f"{replicas} replicas of {micro_batches} micro-batch(es) need the step split into "
                              f"{want} slices with its gradients accumulated; this graph has slices "
                              f"{sorted(set(sliced.values()))}", culprit=want)
    outs = {t for g in groups.values() for t in g.outs}
    gd = graph.as_graph_def()
    rw = _Rewrite(gd, names, sliced, per_rep, micro_batches, outs)
    zero = (_Zero(_zero_updates(graph, groups, rw.nodes), values, rw, replicas, shard_optimizer,
                  _sparse_updates(graph, groups, rw.nodes, sliced)) if shard_optimizer and replicas > 1 else None)
    skip = zero.skipped(rw.nodes) if zero is not None else set()
    rings = [_Ring(k, [groups[s] for s in b if s in groups], replicas, micro_batches, zero)
             for k, b in enumerate(_complete(buckets, groups))]
    late = _reach(_successors(ops), [n for n in names if n.startswith("accumulate/")])
    first, second = [], []
    for op in (o.name for o in ops if not o.name.startswith("accumulate/") and o.name not in skip):
        copies = ([rw.copy(op, r, replicas) for r in range(replicas)] if op in per_rep
                  else [rw.copy(op, rw.replica_of(op), replicas)])
        (second if op in late else first).extend(copies)
    new = _graph_of(first, gd.library, gd.versions)
    remap = {}
    with new.as_default():
        for ring in rings:
            ring.build(new)
            remap.update(ring.out)
    if zero is not None:
        second += zero.noops()
        values = {**values, **zero.piece_values()}
    new = _joined(new, second, remap, gd.library, gd.versions)
    if zero is not None and zero.level == 3:
        new = zero.gather_reads(new, gd.library, gd.versions)
    return _finish(new, fetches, per_rep, rings, values, replicas, micro_batches, zero)


def _complete(buckets, groups: Mapping[str, _Group]) -> list[list[str]]:
    """``buckets`` with every group in exactly one (the rest one ring each)."""
    out, seen = [], set()
    for b in buckets or []:
        b = [s for s in dict.fromkeys(b) if s in groups and s not in seen]
        seen.update(b)
        if b:
            out.append(b)
    return out + [[s] for s in groups if s not in seen]


def _finish(graph, fetches, per_rep, rings, values, replicas, micro_batches, zero=None) -> ReplicaGraph:
    """The fetches (a copied fetch op: a group of its copies under its name; a read
    of a variable ZeRO-3 dropped, none), the variables' initialisers and reads."""
    import tensorflow as tf

    loss, *updates = list(fetches)
    init, reads, vals = {}, {}, {}
    dropped = zero.dropped if zero is not None else set()
    with graph.as_default():
        out = []
        for u in updates:
            u = u.split(":")[0]
            if u in per_rep:   # its name, unless TF had to make that unique
                copies = [REPLICA.format(r) + u for r in range(replicas)]
                if set(copies) <= dropped:
                    continue
                u = tf.group(*[graph.get_operation_by_name(c) for c in copies if c not in dropped], name=u).name
            elif u in dropped:
                continue
            out.append(u)
        with tf.name_scope("pesto_init"):
            for op in graph.get_operations():
                base = _REP.sub("", op.name)
                if op.type != "VarHandleOp" or base not in values:
                    continue
                dtype = op.get_attr("dtype")
                ph = tf.compat.v1.placeholder(dtype, op.get_attr("shape"))
                init[op.name] = (ph.name, tf.raw_ops.AssignVariableOp(resource=op.outputs[0], value=ph).name)
                reads[op.name] = tf.raw_ops.ReadVariableOp(resource=op.outputs[0], dtype=dtype).name
                vals[op.name] = values[base]   # every replica starts from the split step's value
    ring = {key: tuple(v) for r in rings for key, v in r.ops.items()}
    return ReplicaGraph(graph, replicas, micro_batches, loss, tuple(out), MappingProxyType(init),
                        MappingProxyType(reads), MappingProxyType(vals),
                        tuple(tuple(g.scope for g in r.groups) for r in rings), MappingProxyType(ring),
                        MappingProxyType(dict(zero.sharded) if zero else {}),
                        MappingProxyType(dict(zero.pieces) if zero else {}))


def pesto_buckets(pesto_graph, graph, fetches, origin=None) -> tuple[dict, list]:
    """``({first member: [accumulate scopes]}, members not found)``: the
    plan's gradient buckets (the tensors replica 0's ``t@allreduce@r0``
    outputs; sharded, where no gather outputs them, the members ``origin``
    gives replica 0's first reduce-scatter step) as the accumulations of the
    TF split step ``graph`` (a member's slice-0 copy is the first part an
    ``accumulate/<variable>`` sums), in the plan's order."""
    names = {op.name for op in step_ops(graph, list(fetches))}
    scope_of = {}
    for g in _groups(graph, names).values():
        scope_of.update(dict.fromkeys(g.parts[0] if g.sparse else (g.parts[0],), g.scope))
    firsts: dict[str, list] = {}
    for t in pesto_graph.tensors:
        m = _GATHER.match(t.src)
        if m and m.group(2) == "0" and t.name.endswith("@allreduce@r0"):
            firsts.setdefault(m.group(1), []).append(t.name[:-len("@allreduce@r0")])
    if origin is not None:   # sharded: the buckets no gather outputs (a sparse gradient's rows aside)
        for name in pesto_graph.names:
            m = _RING.match(name)
            if m and m.group(2, 3, 4) == ("rs", "0", "0") and name in origin:
                firsts.setdefault(m.group(1), list(origin[name].members))
    out, missing = {}, []
    for first, members in firsts.items():
        out[first] = []
        for member in members:
            src, _, idx = member.rpartition(":")
            cand = next((c for c in slice_candidates(src, 0) if c in names), None)
            scope = scope_of.get(f"{cand}:{idx}")
            if scope is None:
                missing.append(member)
            elif scope not in out[first]:
                out[first].append(scope)
    return out, missing


@dataclass(frozen=True)
class ReplicaMap(SliceMap):
    """The ops of Pesto's replicated graph mapped onto the replicated TF step
    (:func:`replica_map`): a :class:`tf_patch.slicemap.SliceMap` whose
    ``micro_batches`` counts the step's slices (``R x M``); TF ops no Pesto op
    maps to are placed by a neighbour (:func:`tf_patch.slicemap.mapped_hint`)."""

    @property
    def target(self) -> str:
        return f"replicated step ({self.micro_batches} slices)"


def replica_map(pesto_names, rg: ReplicaGraph, buckets: Mapping[str, list], tf_names,
                adds: Mapping[str, tuple] | None = None, origin=None, members: Mapping[str, str] | None = None
                ) -> ReplicaMap:
    """Map the ops of Pesto's replicated graph (``pesto_names``) onto the
    replicated TF step ``rg`` (the module's naming rule); ``buckets``:
    :func:`pesto_buckets`'s first member -> scopes; ``tf_names``: the TF step's ops;
    ``adds``: for a plan that sums the slices' weight gradients in place
    (``weight_grads="accumulate"``), :func:`slice_adds` of the TF step: a copy
    of slice ``i >= 1`` maps to its TF copy and the ``acc_<i>`` add summing it
    (:mod:`tf_patch.slicemap`'s rule for a split step); ``origin``: the plan's
    origins, whose members map a ZeRO-3 gather of a bucket of parameters
    (``p@fwgather@r<r>``, ``p@fsend@r<r>``...) onto every member's TF ops, and a gather's
    members (as ``members``: member -> the bucket's first, :func:`bucket_members`) map a
    hybrid's accumulation of a member's own tensor (a sparse gradient's indices) to its ring."""
    have = set(tf_names)
    ring_of = {b[0]: k for k, b in enumerate(rg.buckets) if b}
    bucket = {first: ring_of[scopes[0]] for first, scopes in buckets.items() if scopes and scopes[0] in ring_of}
    firsts = dict(members or {})
    for name in (pesto_names if origin is not None else ()):
        if (m := _GATHER.match(name)) and name in origin:
            firsts.update(dict.fromkeys(origin[name].members, m.group(1)))
    for member, first in firsts.items():
        if first in bucket:
            bucket.setdefault(member, bucket[first])
    ops: dict[str, tuple] = {}
    for name in pesto_names:
        found = _map_one(name, rg, bucket, have)
        if not found and origin is not None and (z3 := _PARAM_GATHER.match(name)) and name in origin:
            part, r = z3.group(2), int(z3.group(3))
            found = [t for w in origin[name].members for t in rg.sharded.get((f"{w}@{part}", r), ())]
        if adds and len(found) == 1 and parse_name(name).role == "copy" and parse_name(name).slice:
            found = [*found, *adds.get(found[0], ())]
        if found:
            ops[name] = tuple(dict.fromkeys(t for t in found if t in have))
    hit = {t for ts in ops.values() for t in ts}
    return ReplicaMap(rg.replicas * rg.micro_batches, MappingProxyType(ops), tuple(sorted(have - hit)),
                      tuple(n for n in pesto_names if not ops.get(n)))


def bucket_members(pesto_graph) -> dict[str, str]:
    """``{member: the bucket's first member}`` of the buckets of Pesto's replicated graph
    whose gather ``t@allreduce@r0`` outputs its members (``m@allreduce@r0``).

    >>> from pesto.graph import OpGraph, Op, Tensor
    >>> g = OpGraph([Op("a:0@allreduce@r0", {"GPU": 0.0})], [], [Tensor("a:0@allreduce@r0", "a:0@allreduce@r0", 4),
    ...              Tensor("b:0@allreduce@r0", "a:0@allreduce@r0", 4)])
    >>> bucket_members(g)
    {'a:0': 'a:0', 'b:0': 'a:0'}
    """
    out = {}
    for t in pesto_graph.tensors:
        m = _GATHER.match(t.src)
        if m and m.group(2) == "0" and t.name.endswith("@allreduce@r0"):
            out[t.name[:-len("@allreduce@r0")]] = m.group(1)
    return out


def slice_adds(tfg) -> dict:
    """``{TF op: the accumulation adds (``.../acc_<i>``) that read it}`` of an
    extracted replicated TF step: a slice's weight-gradient copy and the add of
    its replica's chain that sums it (:func:`replica_map`'s ``adds``)."""
    out: dict[str, tuple] = {}
    for op in tfg.ops:
        if op.name.startswith("allreduce/") and re.search(r"/acc_\d+$", op.name):
            for p in tfg.predecessors(op.name):
                out[p] = (*out.get(p, ()), op.name)
    return out


def _map_one(name: str, rg: ReplicaGraph, bucket: Mapping[str, int], have: set) -> list:
    """The TF ops of one Pesto op (:func:`replica_map`)."""
    m, micro = rg.micro_batches, None
    if m > 1:
        origin = parse_name(name)
        if origin.role == "accumulate":
            c = _CHUNK.match(origin.tensor) or _COPY.match(origin.tensor)
            k = bucket.get(c.group(1)) if c else None
            return [] if k is None else list(rg.ring.get((k, f"acc{origin.slice}", int(c.group(2))), ()))
        if origin.role == "copy":
            name, micro = origin.op, origin.slice
    if ring := _RING.match(name):
        k, part, r = bucket.get(ring.group(1)), f"{ring.group(2)}{ring.group(3)}", int(ring.group(4))
        extra = ("pack",) if part == "rs0" else ()
        return [] if k is None else [t for p in (*extra, part) for t in rg.ring.get((k, p, r), ())]
    if gather := _GATHER.match(name):
        k, r = bucket.get(gather.group(1)), int(gather.group(2))
        if k is not None and "@allgather@" in name and (k, "write", r) in rg.ring:   # a sparse variable's write
            return list(rg.ring[(k, "write", r)])
        return [] if k is None else list(rg.ring.get((k, "unpack", r), ()))
    copy = _COPY.match(name)
    if copy is None:
        return []
    op, r = copy.group(1), int(copy.group(2))
    for c in (op, *(f"mb{s}/{op}" for s in range(rg.replicas * m))):
        if (c, r) in rg.sharded:   # ZeRO: replica r's update of its piece, its pieces of a variable or slot
            return list(rg.sharded[(c, r)])
    slices = [r * m + micro] if micro is not None else list(range(r * m, (r + 1) * m))
    if micro is not None or m == 1:
        found = next((c for c in slice_candidates(op, slices[0]) if c in have), None)
        if found:
            return [found]
    own = [REPLICA.format(r) + c for c in (op, *(f"mb{s}/{op}" for s in range(rg.replicas * m)))]
    if (found := next((c for c in own if c in have), None)) is not None:
        return [found]   # a once-per-step op (a variable: named after the slice that read it first)
    split = f"microbatch/{op.rsplit('/', 1)[-1]}"
    if split in have:
        return [op, split] if r == 0 and op in have else [split] if r == 0 else []
    return [c for s in slices if (c := next((c for c in slice_candidates(op, s) if c in have), None))]


def shard_level(pesto_names) -> int:
    """``3`` when Pesto's replicated graph (its op names) shards the parameters
    (ZeRO-3: it gathers them for their readers, ``p@fwgather@r<r>``), ``1``
    when it shards the optimizer (ZeRO-1 or -2: it all-gathers updated parameters,
    ``t@allgather@r<r>``; TensorFlow builds both levels alike,
    :func:`replicate_graph`), else ``0``.

    >>> shard_level(["w@r0", "g:0@allgather@r1"]), shard_level(["g:0@allreduce@r0"]), shard_level(["w@fwgather@r0"])
    (1, 0, 3)
    """
    names = list(pesto_names)
    return 3 if any("@fwgather@r" in n for n in names) else int(any("@allgather@r" in n for n in names))


def origin_of(result):
    """The origins a ``pesto.solve_step`` result (or its :class:`tf_patch.slicemap.ResultView`) kept, or None."""
    origin = getattr(result, "origin", None)
    return origin if origin is not None else getattr(getattr(result, "transformed", None), "origin", None)


def replicated_plan(result, rg: ReplicaGraph, buckets: Mapping[str, list]) -> tuple[Plan, ReplicaMap]:
    """``(plan of the replicated TF step, the map)`` from ``pesto.solve_step``'s
    replicated ``result`` (module doc; :func:`mapped_plan`)."""
    tfg = extract(rg.graph, [rg.loss, *rg.updates], on_unknown="ignore")
    rmap = replica_map(result.graph.names, rg, buckets, tfg.names,
                       slice_adds(tfg) if getattr(result, "in_place", ()) else None, origin_of(result),
                       bucket_members(result.graph))
    return mapped_plan(result.plan, rmap, tfg), rmap


def mapped_plan(plan: Plan, op_map, tfg) -> Plan:
    """A plan of the TF step ``tfg`` from a Pesto ``plan`` and ``op_map`` (a
    :class:`ReplicaMap` or :class:`tf_patch.slicemap.SliceMap`: Pesto op -> TF
    ops): every mapped TF op on its Pesto op's device, the others by
    :func:`tf_patch.slicemap.mapped_hint`; each device's order the TF step's
    topological order taking first the op whose Pesto op starts first (an
    unmapped op as soon as its inputs: :func:`pesto.dag.priority_order`, so the
    order never contradicts the TF graph).

    >>> from pesto.graph import OpGraph
    >>> from tf_patch.slicemap import SliceMap
    >>> tfg = OpGraph.from_edges({"a": 1, "b": 1, "c": 1}, [("a", "b", 8)])
    >>> pesto_plan = Plan({"A": "/GPU:0", "B": "/GPU:1"}, {}, start={"A": 0.0, "B": 5.0})
    >>> m = SliceMap(1, {"A": ("a", "c"), "B": ("b",)}, (), ())
    >>> p = mapped_plan(pesto_plan, m, tfg)
    >>> dict(p.order)
    {'/GPU:0': ('a', 'c'), '/GPU:1': ('b',)}
    """
    placement = mapped_hint(op_map.placement(plan.placement), tfg, sorted(set(plan.placement.values()))[0])
    start = plan.start or {}
    key = [float("inf")] * tfg.num_ops
    for p, ts in op_map.ops.items():
        for t in ts:
            if t in tfg:
                i = tfg.index[t]
                key[i] = min(key[i], start.get(p, 0.0))
    preds = tfg.pred_idx()
    for i in tfg.topo_idx():   # an unmapped op: as soon as its inputs
        if key[i] == float("inf"):
            key[i] = max((key[j] for j in preds[i]), default=0.0)
    order: dict[str, list] = {}
    for i in priority_order(tfg.succ_idx(), preds, key):
        order.setdefault(placement[tfg.names[i]], []).append(tfg.names[i])
    return Plan(placement, order, makespan=plan.makespan, placer=plan.placer or "pesto",
                status="feasible" if plan.status == "interrupted" else plan.status)


def one_replica(plan: Plan, names) -> tuple[Plan, tuple]:
    """A plan of the step replicated once (``R = 1``: ops ``op@r0``, no
    all-reduce) as a plan of the step itself, and its op names: ``op@r0`` ->
    ``op``, ``op@r0@mb<i>`` -> ``op@mb<i>`` (the micro-batched step's names).

    >>> p, names = one_replica(Plan({"a@r0": "/GPU:0", "b@r0@mb1": "/GPU:0"}, {"/GPU:0": ("a@r0", "b@r0@mb1")}),
    ...                        ["a@r0", "b@r0@mb1"])
    >>> names, dict(p.order)
    (('a', 'b@mb1'), {'/GPU:0': ('a', 'b@mb1')})
    """
    def strip(name: str) -> str:
        return _ONE.sub("", name)

    start = None if plan.start is None else {strip(n): t for n, t in plan.start.items()}
    return (plan.replace(placement={strip(n): d for n, d in plan.placement.items()}, start=start,
                         order={d: tuple(map(strip, ops)) for d, ops in plan.order.items()}),
            tuple(map(strip, names)))


def replica_zero(values: Mapping[str, object]) -> dict:
    """Values by variable handle, of a replicated step's replica 0 under the
    split step's handle names (``rep0/h`` -> ``h``; other replicas dropped).

    >>> replica_zero({"rep0/w": 1, "rep1/w": 2, "v": 3})
    {'w': 1, 'v': 3}
    """
    return {_REP.sub("", h): v for h, v in values.items() if not _REP.match(h) or h.startswith(REPLICA.format(0))}


def unshard(values: Mapping[str, object], pieces: Mapping[str, tuple]) -> dict:
    """Values of a sharded step's variables and optimizer slots (ZeRO) joined
    from their pieces: ``{split step's handle: flat array}`` for each one whose
    piece variables (:attr:`ReplicaGraph.pieces`: piece -> ``(handle, start,
    stop)``) ``values`` holds, every element covered (the whole slots exist in
    no replica: what a later plan starts from).

    >>> unshard({"p1": [3, 4], "p0": [1, 2], "q0": [5]}, {"p0": ("w", 0, 2), "p1": ("w", 2, 4), "q0": ("s", 1, 2)})
    {'w': array([1, 2, 3, 4])}
    """
    import numpy as np

    parts: dict[str, list] = {}
    for p, (h, a, b) in pieces.items():
        if p in values:
            parts.setdefault(h, []).append((a, b, np.reshape(values[p], [-1])))
    out = {}
    for h, got in parts.items():
        got.sort(key=lambda x: x[0])
        if got[0][0] == 0 and all(x[1] == y[0] for x, y in zip(got, got[1:])):
            out[h] = np.concatenate([v for _, _, v in got])
    return out


def variable_values(graph, init_op, fetches) -> dict:
    """Handle op -> value of every variable the step ``fetches`` runs, after
    ``init_op`` (a session of its own on ``graph``, which gains a read per variable)."""
    import tensorflow as tf

    handles = [op for op in step_ops(graph, list(fetches)) if op.type == "VarHandleOp"]
    with graph.as_default():
        reads = {op.name: tf.raw_ops.ReadVariableOp(resource=op.outputs[0], dtype=op.get_attr("dtype"))
                 for op in handles}
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init_op)
        return sess.run(reads)


def replicate_model(model, result):
    """``(replicated ZooModel, its plan, the map)``: a zoo model built split in
    ``result.replicas * result.micro_batches`` slices (``build_model(...,
    micro_batches=R * M)``), replicated for ``pesto.solve_step``'s replicated
    ``result`` (:func:`replicate_graph` with the plan's buckets and its
    sharded optimizer, :func:`shard_level`; :func:`replicated_plan`); it trains as the model does (same feed, same
    initial values) and ``PlacedRun`` takes it with the plan."""
    import tensorflow as tf

    fetches = [model.loss.name, model.train_op.name]
    values = variable_values(model.graph, model.init_op, fetches)
    buckets, _ = pesto_buckets(result.graph, model.graph, fetches, origin_of(result))
    rg = replicate_graph(model.graph, fetches, result.replicas, result.micro_batches, values=values,
                         buckets=list(buckets.values()), shard_optimizer=shard_level(result.graph.names))
    plan, rmap = replicated_plan(result, rg, buckets)
    g = rg.graph

    def feed_fn(step: int) -> dict:
        return {g.get_tensor_by_name(getattr(t, "name", t)): v for t, v in model.feed_fn(step).items()}

    with g.as_default():
        init_op = tf.group(*[g.get_operation_by_name(a) for _, a in rg.init.values()], name="pesto_init/all")
    replicated = ZooModel(g, g.get_operation_by_name(rg.updates[0]), g.get_tensor_by_name(rg.loss), feed_fn,
                          model.name, {**model.config, "replicas": result.replicas}, init_op,
                          {g.get_tensor_by_name(ph): v for ph, v in rg.init_feed().items()})
    return replicated, plan, rmap
