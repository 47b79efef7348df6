"""One result type for every step transform: :class:`Transformed` and its :class:`Origin`.

A step transform (:func:`pesto.step.split`, :func:`pesto.step.replicate`)
turns a training step into another ordinary :class:`~pesto.graph.OpGraph`
and says, for each op of the new graph, which op of the step it runs
(:class:`Origin`). Transforms chain: :func:`compose` maps the ops of the
last graph straight to the first step's ops, with the replica of one and
the slice of the other.

Examples
--------
>>> from pesto.graph import Op, OpGraph, Tensor, Edge
>>> from pesto.step import split, replicate
>>> g = OpGraph([Op("x", {"GPU": 4.0}, batch=True), Op("u", {"GPU": 1.0}, batch=False)],
...             [Edge("x", "u", "x:0")], [Tensor("x:0", "x", 8)])
>>> rep = replicate(g, 2)
>>> both = compose(split(rep.graph, 2), rep)
>>> both.origin["x@r1@mb0"]
Origin(op='x', replica=1, slice=0, role='copy', tensor=None, members=())
>>> both.replicas, both.micro_batches, both.copies("u")
(2, 2, ('u@r0', 'u@r1'))
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field, fields
from operator import attrgetter
from functools import cached_property
from types import MappingProxyType
from typing import Mapping, Sequence

from ..errors import MicroBatchError
from ..graph import Op, OpGraph

__all__ = ["Origin", "Transformed", "identity", "compose", "check_count", "renamed", "ROLES"]

#: The roles of an op of a transformed graph (:attr:`Origin.role`).
ROLES = ("copy", "step", "accumulate", "whole", "reduce-scatter", "all-gather", "gather", "recompute")


@dataclass(frozen=True)
class Origin:
    """Where an op of a transformed graph comes from.

    Attributes
    ----------
    op : str
        The original op (for an op a transform adds -- an accumulate or
        all-reduce op -- the producer of the tensor it sums).
    replica : int or None
        The replica holding the op (:func:`~pesto.step.replicate`); None
        when the step was not replicated.
    slice : int or None
        The micro-batch of a copy (:func:`~pesto.step.split`); for an
        accumulate op the last slice it adds (``t@acck`` sums slices
        ``0..k``); None for an op that runs once per step.
    role : str
        ``"copy"`` (a batched op's slice or share), ``"step"`` (an op run
        once per step, or per replica), ``"accumulate"`` (a sum over
        slices; a sparse gradient's: their concatenation), ``"whole"`` (a batched op run once over every slice: a
        weight gradient under :func:`~pesto.step.split`'s rule ``"whole"``),
        ``"reduce-scatter"``, ``"all-gather"`` or ``"gather"`` (the ring
        all-reduce of replicas; with a sharded optimizer the all-gather of
        updated parameters), ``"recompute"`` (a forward op run again before
        its block's backward, :func:`pesto.step.recompute`).
    tensor : str or None
        The original tensor an added op sums (for a fused bucket: its first
        member, whose producer is ``op``).
    members : tuple of str
        Every original tensor an all-reduce op's bucket sums, in bucket order;
        for a ``"whole"`` op, the copies it stands for (``op@mb0 ..
        op@mb{M-1}``, names of no op of the graph); empty for a copy.
    """

    op: str
    replica: int | None = None
    slice: int | None = None
    role: str = "copy"
    tensor: str | None = None
    members: tuple = ()


@dataclass(frozen=True)
class Transformed:
    """A step transformed into another graph, with the map back to the step.

    Attributes
    ----------
    graph : OpGraph
        The transformed step.
    source : OpGraph
        The step it was made from.
    origin : mapping op of ``graph`` -> Origin
    replicas : int
        Replicas of the step in ``graph`` (1: not replicated).
    micro_batches : int
        Slices each replica runs (1: not split).
    partials : frozenset of str
        The original tensors summed over slices or replicas (weight gradients).
    """

    graph: OpGraph
    source: OpGraph
    origin: Mapping[str, Origin]
    replicas: int = 1
    micro_batches: int = 1
    partials: frozenset = field(default_factory=frozenset)

    @cached_property
    def _copies(self) -> Mapping[str, tuple]:
        out: dict[str, list] = {}
        for name, o in self.origin.items():
            if o.role in ("copy", "step", "whole"):
                out.setdefault(o.op, []).append(name)
        return MappingProxyType({k: tuple(v) for k, v in out.items()})

    def copies(self, op: str) -> tuple[str, ...]:
        """The ops of ``graph`` that run original op ``op`` (its copies, or itself once, or its whole op).

        >>> from pesto.graph import Op, OpGraph
        >>> from pesto.step import split
        >>> s = split(OpGraph([Op("a", {"GPU": 4.0}, batch=True), Op("b", {"GPU": 1.0}, batch=False)]), 3)
        >>> s.copies("a"), s.copies("b")
        (('a@mb0', 'a@mb1', 'a@mb2'), ('b',))
        """
        return self._copies.get(op, ())

    def placement(self, devices: Sequence[str]) -> dict[str, str]:
        """Replica ``r`` on ``devices[r]``: the data-parallel placement.

        Raises
        ------
        MicroBatchError
            Fewer devices than replicas.
        """
        if len(devices) < self.replicas:
            raise MicroBatchError(f"{self.replicas} replicas need as many devices, got {list(devices)}",
                                  culprit=len(devices))
        return {name: devices[o.replica or 0] for name, o in self.origin.items()}


def identity(graph: OpGraph) -> Transformed:
    """``graph`` as its own transform: every op its own origin, a batched op
    the one slice's copy (slice 0), any other op run once per step. The step
    in one micro-batch (:func:`pesto.step.split` with ``M = 1``) and the
    plain step a plan places are this.

    >>> from pesto.graph import Op, OpGraph
    >>> t = identity(OpGraph([Op("a", {"GPU": 4.0}, batch=True), Op("b", {"GPU": 1.0}, batch=False)]))
    >>> t.graph is t.source, t.origin["a"], t.origin["b"].role
    (True, Origin(op='a', replica=None, slice=0, role='copy', tensor=None, members=()), 'step')
    """
    return Transformed(graph, graph, _Itself(graph))


class _Itself(Mapping):
    """The identity's origin map, each :class:`Origin` made when read (a
    plain solve keeps its step's identity at no cost)."""

    def __init__(self, graph: OpGraph):
        self._graph = graph

    def __getitem__(self, name: str) -> Origin:
        if name not in self._graph:
            raise KeyError(name)
        op = self._graph.op(name)
        return Origin(name, slice=0) if op.batch else Origin(name, role="step")

    def __iter__(self):
        return iter(self._graph.names)

    def __len__(self) -> int:
        return self._graph.num_ops


def compose(outer: Transformed, inner: Transformed) -> Transformed:
    """``outer`` (a transform of ``inner.graph``) after ``inner``, mapped to ``inner.source``.

    Each op's origin is the inner origin of its outer origin's op, with the
    replica and the slice of whichever transform set them (the outer's
    first); an op the outer transform made (an accumulate or all-reduce op)
    keeps its role, a copy (or once-per-step op) takes the inner op's. An
    outer tensor name maps to the original tensor it was named after: its
    longest prefix, cut before an ``@``, that is a tensor of the source.

    Raises
    ------
    ValueError
        ``outer`` was not made from ``inner.graph``.
    """
    if outer.source is not inner.graph and outer.source.names != inner.graph.names:
        raise ValueError(f"compose: the outer transform was made from {outer.source.name!r}, "
                         f"not from the inner one's graph {inner.graph.name!r}")
    src = inner.source
    origin = {}
    members: dict[tuple, tuple] = {}   # the ring ops of a bucket share theirs: each mapped once
    for name, o in outer.origin.items():
        i = inner.origin[o.op]
        made = o.role not in ("copy", "step")
        if made and o.members not in members:
            members[o.members] = tuple(_original(src, t) for t in o.members)
        origin[name] = Origin(
            i.op, o.replica if o.replica is not None else i.replica, o.slice if o.slice is not None else i.slice,
            o.role if made else i.role, _original(src, o.tensor) if made else i.tensor,
            members[o.members] if made else i.members)
    partials = inner.partials | {_original(src, t) for t in outer.partials}
    return Transformed(outer.graph, src, MappingProxyType(origin), outer.replicas * inner.replicas,
                       outer.micro_batches * inner.micro_batches, frozenset(partials))


def _original(source: OpGraph, tensor: str | None) -> str | None:
    """The tensor of ``source`` a transformed tensor is named after (``dw:0@r1/chunk0`` -> ``dw:0``)."""
    if tensor is None:
        return None
    cut = len(tensor)
    while cut > 0:
        if source.has_tensor(tensor[:cut]):
            return tensor[:cut]
        cut = tensor.rfind("@", 0, cut)
    return tensor


#: :class:`~pesto.graph.Op`'s fields, and all of them read at once (:func:`renamed`).
_OP_FIELDS = tuple(f.name for f in fields(Op))
_op_values = attrgetter(*_OP_FIELDS)
_set = object.__setattr__


def renamed(op: Op, name: str, colocation_group: str | None, anchor: str | None) -> Op:
    """``op`` under other names: ``dataclasses.replace(op, name=..., colocation_group=...,
    anchor=...)`` without re-validating the fields it keeps (``op`` is valid: its
    ``__post_init__`` ran; names are stored as given). A transform copies every op once per
    replica or slice, and ``replace`` took a third of a data-parallel build of GPT-1.3B
    (60k ops).

    >>> a = Op("a", {"GPU": 2.0}, output_bytes=8, colocation_group="g", batch=True)
    >>> renamed(a, "a@r1", "g@r1", None) == Op("a@r1", {"GPU": 2.0}, output_bytes=8, colocation_group="g@r1",
    ...                                        batch=True)
    True
    """
    new = object.__new__(Op)
    for f, v in zip(_OP_FIELDS, _op_values(op)):
        _set(new, f, v)
    _set(new, "name", name)
    _set(new, "colocation_group", colocation_group)
    _set(new, "anchor", anchor)
    return new


def check_count(n, what: str = "micro_batches") -> int:
    """``n`` as a count >= 1, or :class:`~pesto.errors.MicroBatchError` naming ``what``.

    >>> check_count(4)
    4
    >>> check_count(0)
    Traceback (most recent call last):
    ...
    pesto.errors.MicroBatchError: micro_batches must be an integer >= 1, got 0
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise MicroBatchError(f"{what} must be an integer >= 1, got {n!r} ({type(n).__name__})", culprit=n)
    n = int(n)
    if n < 1:
        raise MicroBatchError(f"{what} must be an integer >= 1, got {n}", culprit=n)
    return n
