"""Activation recomputation as a step transform: :func:`recompute`.

Time for memory. Each chosen **block** (a layer: a group of forward ops)
keeps only its inputs from the forward pass to the backward pass; its
backward ops read copies of its forward ops that run again just before
them. The result is an ordinary :class:`~pesto.graph.OpGraph` in a
:class:`~pesto.step.transform.Transformed`, so the simulator and the memory
model (:mod:`pesto.memory`: an output is live until its last consumer on
its device finishes) cost it as they cost any step.

Blocks (the rule, read from marks and scopes only)
--------------------------------------------------
The forward ops are the batched ops marked ``phase="forward"``
(:func:`pesto.step.marks.forward_ops`). An op's scope is :attr:`Op.scope`,
else its name's parent path. At the smallest scope depth ``d`` (1 to 8)
where two or more scope prefixes of ``d`` parts have the same *pattern*
(the prefix with every run of digits read as ``#``: ``layer_0`` and
``layer_11`` are both ``layer_#``, ``rnn/cell_2`` is ``rnn/cell_#``), each
prefix of a repeated pattern is a block: its forward ops. Blocks are in the
order of their ops' mean topological position. Ops under no such prefix
(the embedding, the head, the loss) are not recomputed. ``blocks=`` gives
the blocks instead (lists of forward op names); ``chosen=`` recomputes only
those blocks (their indices), the others kept as they are (each still the
"next block" whose backward triggers the copies of the block before it).

The transform (per block ``k``)
-------------------------------
* a backward op (:data:`pesto.step.marks.BACKWARD`) *of block k* is one
  whose :attr:`~pesto.graph.Op.anchor` is an op of the block;
* the block's **needed** ops are those whose output such a backward op
  reads, and their ancestors inside the block; each gets a copy
  ``op@rc`` (its output tensors ``t@rc``, the same bytes and compute: the
  forward ops again), ``phase="recompute"`` (a backward phase: a pipeline
  stages it with its anchor, the op it copies, and schedules it in the
  slice's backward task), :attr:`~pesto.step.transform.Origin.role`
  ``"recompute"``. A copy reads the copies of its in-block producers and
  the originals of everything else (the block's inputs: the previous
  block's output, the weights);
* the block's backward ops read the copies instead of the originals, so the
  originals' outputs die once the forward pass has read them; the block's
  inputs stay live (the copies and the earlier blocks read them);
* **when**: every copy without an in-block producer waits (a control edge)
  for the block's **trigger**: the topologically first backward op of the
  next block (for the last block, of any forward op after it: the head's
  gradient) that waits for the gradient from above -- a descendant of a
  backward op anchored after that region (for the last block, of the
  topologically last forward op, the loss), so not a shape computation
  that runs in the forward pass -- and not for the block's own backward
  ops. So the copies run after the next block's backward has started, not
  during the forward pass. When no such op exists (a ``GradientTape`` step:
  its gradient starts from a seed that reads no forward op, so nothing is
  downstream of the loss), the trigger is, of the backward ops anchored in
  that region which the block's backward waits for (the gradient into the
  block passes through them), the one downstream of the most backward ops
  (a shape op reading only the forward pass is downstream of none).

Costs: the step runs the needed forward ops twice (their compute again);
the peak holds every block's inputs plus about two blocks' activations
instead of every activation. Marks are kept on the copies (``batch``), so
:func:`pesto.step.split` and :func:`pesto.step.replicate` take the result
(:func:`~pesto.step.transform.compose` maps it back).

Examples
--------
>>> from pesto.graph import Op, OpGraph, Tensor, Edge
>>> def op(name, phase, anchor=None):
...     return Op(name, {"GPU": 10.0}, output_bytes=100, batch=True, phase=phase, anchor=anchor)
>>> ops = [op("l0/a", "forward"), op("l0/b", "forward"), op("l1/a", "forward"),
...        op("l1/da", "input-grad", "l1/a"), op("l0/db", "input-grad", "l0/b")]
>>> es = [Edge("l0/a", "l0/b", "l0/a:0"), Edge("l0/b", "l1/a", "l0/b:0"), Edge("l1/a", "l1/da", "l1/a:0"),
...       Edge("l1/da", "l0/db", "l1/da:0"), Edge("l0/b", "l0/db", "l0/b:0")]
>>> g = OpGraph(ops, es, [Tensor(f"{o.name}:0", o.name, 100) for o in ops])
>>> layer_blocks(g)
[('l0/a', 'l0/b'), ('l1/a',)]
>>> r = recompute(g)
>>> sorted(n for n, o in r.origin.items() if o.role == "recompute")
['l0/a@rc', 'l0/b@rc', 'l1/a@rc']
>>> r.graph.predecessors("l0/db"), r.graph.predecessors("l0/a@rc")   # l0's copies wait for l1's backward
(['l1/da', 'l0/b@rc'], ['l1/da'])
>>> r.graph.total_work() - g.total_work()   # the forward ops again
30.0
"""
from __future__ import annotations

import re
from dataclasses import replace
from types import MappingProxyType
from typing import Collection, Iterable, Sequence

from ..dag import closure
from ..errors import BatchMarkError, InvalidGraphError
from ..graph import Edge, OpGraph, Tensor
from .marks import BACKWARD
from .transform import Origin, Transformed

__all__ = ["recompute", "layer_blocks", "cheap_ops", "recompute_name", "RESERVED", "MAX_DEPTH"]

#: Names :func:`recompute` makes: an original op or tensor may not look like them.
RESERVED = re.compile(r"@rc(@|$)")
#: Deepest scope depth the block rule looks at.
MAX_DEPTH = 8


def recompute_name(name: str) -> str:
    """The recomputed copy of op (or tensor) ``name``: ``name@rc``."""
    return f"{name}@rc"


def _scope(op) -> list[str]:
    return op.scope.split("/") if op.scope else op.name.split("/")[:-1]


def layer_blocks(graph: OpGraph) -> list[tuple[str, ...]]:
    """The layer-like blocks of ``graph``'s forward ops (module doc's rule),
    each its ops in topological order, blocks by mean position; [] when no
    depth has a repeated scope pattern.

    >>> from pesto.graph import Op
    >>> g = OpGraph([Op(n, {"GPU": 1.0}, batch=True, phase="forward") for n in
    ...              ["embed/x", "enc/layer_0/a", "enc/layer_0/b", "enc/layer_1/a", "head/y"]])
    >>> layer_blocks(g)
    [('enc/layer_0/a', 'enc/layer_0/b'), ('enc/layer_1/a',)]
    """
    topo = graph.topo_idx()
    fwd = [i for i in topo if graph.ops[i].batch and graph.ops[i].phase == "forward"]
    parts = {i: _scope(graph.ops[i]) for i in fwd}
    for depth in range(1, MAX_DEPTH + 1):
        groups: dict[str, list[int]] = {}
        for i in fwd:
            if len(parts[i]) >= depth:
                groups.setdefault("/".join(parts[i][:depth]), []).append(i)
        patterns: dict[str, set] = {}
        for key in groups:
            patterns.setdefault(re.sub(r"\d+", "#", key), set()).add(key)
        layers = [k for keys in patterns.values() if len(keys) > 1 for k in keys]
        if layers:
            pos = {i: p for p, i in enumerate(topo)}
            layers.sort(key=lambda k: sum(pos[i] for i in groups[k]) / len(groups[k]))
            return [tuple(graph.names[i] for i in groups[k]) for k in layers]
    return []


def cheap_ops(graph: OpGraph, blocks: Sequence[Iterable[str]]) -> list[tuple[str, ...]]:
    """Per block, its **cheap** ops (selective recomputation): those whose
    compute per output byte is at most the block's (its ops' compute over
    their output bytes; an op's compute its largest over device kinds), ops
    of no output bytes left out. In a transformer layer they are the
    element-wise ops, the softmax and the attention scores' product (much
    memory, little time), not the projections' and the MLP's matrix products,
    whose outputs the copies then read (kept).

    >>> from pesto.graph import Op
    >>> g = OpGraph([Op("l0/mm", {"GPU": 90.0}, output_bytes=10, batch=True, phase="forward"),
    ...              Op("l0/gelu", {"GPU": 5.0}, output_bytes=40, batch=True, phase="forward"),
    ...              Op("l0/drop", {"GPU": 5.0}, output_bytes=40, batch=True, phase="forward")])
    >>> cheap_ops(g, [("l0/mm", "l0/gelu", "l0/drop")])
    [('l0/gelu', 'l0/drop')]
    """
    def work(n):
        return max(graph.op(n).compute.values(), default=0.0)

    out = []
    for block in blocks:
        names = [n for n in block if graph.op(n).output_bytes > 0]
        rate = sum(map(work, names)) / max(1, sum(graph.op(n).output_bytes for n in names))
        out.append(tuple(n for n in names if work(n) <= rate * graph.op(n).output_bytes))
    return out


def _check(graph: OpGraph, blocks: Sequence[Iterable[str]]) -> list[set[int]]:
    """The blocks as sets of op indices, refused (named) when an op is unknown,
    not a batched forward op, or in two blocks; names the rule makes refused."""
    taken = [n for n in graph.names if RESERVED.search(n)] + [t.name for t in graph.tensors
                                                               if RESERVED.search(t.name)]
    if taken:
        raise BatchMarkError(f"names look like the ones recompute makes ({RESERVED.pattern}): rename them", taken)
    out, seen = [], set()
    for block in blocks:
        names = list(block)
        bad = [n for n in names if n not in graph or not graph.op(n).batch or graph.op(n).phase != "forward"]
        if bad:
            raise InvalidGraphError(f"recompute: block ops must be batched forward ops of {graph.name!r} "
                                    f"(Op.batch and phase='forward'): {bad[:5]}")
        twice = seen.intersection(names)
        if twice:
            raise InvalidGraphError(f"recompute: ops in two blocks: {sorted(twice)[:5]}")
        seen.update(names)
        out.append({graph.index[n] for n in names})
    return out


def recompute(graph: OpGraph, blocks: Sequence[Iterable[str]] | None = None,
              chosen: Collection[int] | None = None, only: Sequence[Iterable[str]] | None = None) -> Transformed:
    """``graph`` with each block's activations recomputed before its backward (module doc);
    ``chosen``: the indices of the blocks recomputed (default all); ``only``:
    per block, the ops that may be copied (selective recomputation, e.g.
    :func:`cheap_ops`; default all): the block's backward reads their copies,
    the copies read the other ops' originals (kept).

    >>> from pesto.graph import Op
    >>> def op(name, phase, anchor=None):
    ...     return Op(name, {"GPU": 1.0}, batch=True, phase=phase, anchor=anchor)
    >>> ops = [op("l0/a", "forward"), op("l1/a", "forward"), op("l1/da", "input-grad", "l1/a"),
    ...        op("l0/da", "input-grad", "l0/a")]
    >>> es = [Edge("l0/a", "l1/a", "l0/a:0"), Edge("l1/a", "l1/da", "l1/a:0"), Edge("l1/da", "l0/da", "l1/da:0"),
    ...       Edge("l0/a", "l0/da", "l0/a:0")]
    >>> g = OpGraph(ops, es, [Tensor(f"{o.name}:0", o.name, 8) for o in ops])
    >>> r = recompute(g, chosen=[0])   # layer 0 only; layer 1's backward still triggers it
    >>> sorted(n for n, o in r.origin.items() if o.role == "recompute"), r.graph.predecessors("l0/a@rc")
    (['l0/a@rc'], ['l1/da'])

    Raises
    ------
    InvalidGraphError
        No block (no layer-like scopes and none given); a block op that is not
        a batched forward op, or in two blocks; a chosen index that is no
        block's; ``only`` not a subset per block; no chosen block whose backward reads an activation from
        inside it (nothing to recompute).
    BatchMarkError
        Names that look like the copies' (``@rc``).
    """
    sets = _check(graph, layer_blocks(graph) if blocks is None else blocks)
    if not sets:
        raise InvalidGraphError(f"recompute: graph {graph.name!r} has no layer-like blocks (no scope depth "
                                f"with a repeated pattern such as layer_0, layer_1); pass blocks=")
    picked = range(len(sets)) if chosen is None else list(dict.fromkeys(chosen))
    bad = [k for k in picked if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < len(sets)]
    if bad:
        raise InvalidGraphError(f"recompute: chosen blocks {bad[:5]} are not block indices of graph {graph.name!r} "
                                f"(0 to {len(sets) - 1})")
    subs = None if only is None else _check(graph, only)
    if subs is not None and (len(subs) != len(sets) or any(not a <= b for a, b in zip(subs, sets))):
        raise InvalidGraphError(f"recompute: only= must give, per block ({len(sets)}), a subset of its ops")
    b = _Recompute(graph, sets, subs)
    for k in sorted(picked):
        b.block(k)
    if not b.ops:
        raise InvalidGraphError(f"recompute: nothing to recompute in graph {graph.name!r}: no backward op reads "
                                f"an activation from inside its block ({len(picked)} blocks; a block's input is "
                                "kept anyway), so recomputation would save no memory")
    ops = list(graph.ops) + b.ops
    tensors = list(graph.tensors) + b.tensors
    edges = [Edge(u, v, tuple(dict.fromkeys(ts))) for (u, v), ts in b.edges().items()]
    out = OpGraph(ops, edges, tensors, name=f"{graph.name}@rc")
    origin = {op.name: Origin(op.name, role="copy" if op.batch else "step") for op in graph.ops}
    origin.update(b.origin)
    return Transformed(out, graph, MappingProxyType(origin))


class _Recompute:
    """The copies, their edges and the redirected reads while they are built."""

    def __init__(self, graph: OpGraph, blocks: list[set[int]], only: list[set[int]] | None = None):
        self.g, self.blocks, self.only = graph, blocks, only or blocks
        self.topo = graph.topo_idx()
        self.pos = {i: p for p, i in enumerate(self.topo)}
        idx = graph.index
        back = [op.phase in BACKWARD for op in graph.ops]
        where = {i: k for k, blk in enumerate(blocks) for i in blk}
        #: backward op -> its block (by its anchor)
        self.owner = {i: where[idx[op.anchor]] for i, op in enumerate(graph.ops)
                      if back[i] and op.anchor in idx and idx[op.anchor] in where}
        self.back = back
        fwd = [i for i in self.topo if graph.ops[i].batch and graph.ops[i].phase == "forward"]
        self.last_forward = fwd[-1] if fwd else self.topo[-1]
        self.moved: dict[tuple[int, int], bool] = {}   # (producer, backward consumer) -> read the copy
        self.ops, self.tensors, self.extra = [], [], {}
        self.origin: dict[str, Origin] = {}
        self.produced: dict[int, list[Tensor]] = {}
        for t in graph.tensors:
            self.produced.setdefault(idx[t.src], []).append(t)

    def block(self, k: int) -> None:
        """Copy block ``k``'s needed ops, redirect its backward reads, add its trigger."""
        g, blk = self.g, self.only[k]
        pred, succ = g.pred_idx(), g.succ_idx()
        readers = [(p, j) for p in blk for j in succ[p] if self.owner.get(j) == k]
        needed = {p for p, _ in readers}
        todo = list(needed)
        while todo:
            for q in pred[todo.pop()]:
                if q in blk and q not in needed:
                    needed.add(q)
                    todo.append(q)
        if not needed:
            return
        for p, j in readers:
            self.moved[(p, j)] = True
        trigger = self.trigger(k, {j for _, j in readers})
        for p in sorted(needed, key=self.pos.get):
            op = g.ops[p]
            name = recompute_name(op.name)
            self.ops.append(replace(op, name=name, phase="recompute", anchor=op.name))
            self.origin[name] = Origin(op.name, role="recompute")
            self.tensors.extend(Tensor(recompute_name(t.name), name, t.bytes) for t in self.produced.get(p, []))
            inner = [q for q in pred[p] if q in needed]
            for q in pred[p]:
                src = recompute_name(g.names[q]) if q in needed else g.names[q]
                ts = g.edge(g.names[q], op.name).tensors
                self.extra.setdefault((src, name), []).extend(recompute_name(t) if q in needed else t for t in ts)
            if not inner and trigger is not None:
                self.extra.setdefault((g.names[trigger], name), [])

    def trigger(self, k: int, readers: set[int]) -> int | None:
        """Block ``k``'s trigger (module doc): the topologically first backward op
        anchored in the next block (the last block: in a forward op after it)
        that waits for the gradient from above (a descendant of a backward op
        anchored after that region; with none, of the last forward op: the
        loss) and not for block ``k``'s readers."""
        g, idx = self.g, self.g.index
        if k + 1 < len(self.blocks):
            region = self.blocks[k + 1]
        else:
            last = max(self.pos[i] for i in self.blocks[k])
            region = {i for i in range(g.num_ops) if self.pos[i] > last and not self.back[i]}
        if not region:
            return None
        end = max(self.pos[i] for i in region)
        anchor = [idx.get(op.anchor) for op in g.ops]
        seeds = [i for i in range(g.num_ops) if self.back[i] and anchor[i] is not None and self.pos[anchor[i]] > end]
        late = closure(self.g.succ_idx(), seeds or [self.last_forward])
        waits = closure(self.g.succ_idx(), readers)
        for i in self.topo:
            if self.back[i] and anchor[i] in region and i in late and i not in waits:
                return i
        return self.feeder(region, readers, anchor, waits)

    def feeder(self, region: set[int], readers: set[int], anchor: list, waits: set[int]) -> int | None:
        """The trigger when no backward op of ``region`` descends from the loss (a
        tape's gradient starts from a seed that does not read the loss op): of the
        backward ops anchored in ``region`` that the block's readers wait for
        (the gradient into the block passes through them), the one downstream of
        the most backward ops (a shape op the gradient needs is downstream of
        none), the topologically last on a tie."""
        pred = self.g.pred_idx()
        up = closure(pred, readers) - waits
        best, key = None, (-1, -1)
        for i in up:
            if self.back[i] and anchor[i] in region:
                k = (sum(1 for j in closure(pred, [i]) if self.back[j]), self.pos[i])
                if k > key:
                    best, key = i, k
        return best

    def edges(self) -> dict[tuple[str, str], list[str]]:
        """Every edge: the originals (a block's backward reads moved to the copies) and the copies'."""
        g, idx = self.g, self.g.index
        out: dict[tuple[str, str], list[str]] = {}
        for e in g.edges:
            if self.moved.get((idx[e.src], idx[e.dst])):
                out.setdefault((recompute_name(e.src), e.dst), []).extend(recompute_name(t) for t in e.tensors)
            else:
                out.setdefault((e.src, e.dst), []).extend(e.tensors)
        for key, ts in self.extra.items():
            out.setdefault(key, []).extend(ts)
        return out
