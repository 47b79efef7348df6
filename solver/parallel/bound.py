"""A lower bound of a micro-batched step, valid for every placement and order.

:func:`sample_bound` bounds the step time of a split step
(:func:`pesto.step.split`, any number of slices, replicated or
not) whatever devices its ops go to and in whatever order they run;
communication is left out (zero-cost transfers only shorten a schedule), so
it holds for every link model. All durations are an op's fastest allowed
device time (:meth:`pesto.problem.Problem.fastest`); heads and tails are the
longest paths of those before and after an op. The terms:

* ``generic`` -- :func:`solver.bounds.lower_bound` of the split graph: its
  critical path (the longest chain of one slice, through the shared ops and
  the accumulation), its total work over the devices, and work forced onto
  one device kind over that kind's devices;
* ``copies`` -- the ``M`` copies of one op: they start no earlier than their
  head ``h``; on a device of time ``p`` per copy at most ``m`` of them can end
  by ``h + m p``, so the ``j``-th copy to end ends no earlier than the ``j``-th
  smallest of those times over the devices allowed, and the step lasts at
  least that plus the tail of the copy ending ``j``-th. Giving the longest
  tails to the earliest ends is the best case (an exchange argument), so
  ``max_j (end_j + tail_j)`` with tails in decreasing order is a bound.
  Copies held in one colocation group (a slice bound to its variable) count
  on one device only, the best one. This is the fill of a pipeline: one
  slice's chain plus ``ceil(M / devices) - 1`` more copies of its
  bottleneck op;
* ``colocation`` -- a colocation group runs on one device: the least head of
  its members, their work there and their least tail, on the best device;
* ``memory`` (bytes, not a time) -- the least peak some device must reach:
  every op's persistent bytes are held all step, so some device holds at
  least their sum over the devices; and a colocation unit's device holds the
  unit's persistent bytes plus, while any member runs, its outputs and
  temporaries; at the start of an op of positive duration, its device also
  holds its inputs (the producer's output, or the received tensors:
  whichever is less, per producer) -- an accumulate op holds the running sum,
  the slice's gradient and the new sum at once (:func:`op_memory`).
  ``fits`` says whether that is within the largest device.

``step`` is the largest time term; ``per_sample`` divides it by the batch
size when one is given. The bound is the *same step's*: every plan of
``split.graph`` is at least ``step`` (tests check it against the simulator on
random plans, against every pipeline baseline and against a brute-force
optimum on tiny graphs).

Examples
--------
>>> from pesto.graph import Op, OpGraph
>>> from pesto.cluster import gpus
>>> from pesto.step import split
>>> s = split(OpGraph([Op("a", {"GPU": 30.0}, batch=True)]), 3)
>>> b = sample_bound(s, gpus(2), batch=6)
>>> b.generic, b.copies, b.step, b.per_sample, b.source   # 3 copies of 10 on 2 GPUs: 2 rounds
(15.0, 20.0, 20.0, 3.3333333333333335, 'copies')
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pesto.cluster import Cluster
from pesto.dag import bottom_levels, top_levels
from pesto.step import Transformed
from pesto.problem import INF, Problem

from ..bounds import lower_bound

__all__ = ["SampleBound", "sample_bound", "copies_bound", "colocation_bound", "memory_floor", "memory_need",
           "op_memory"]


@dataclass(frozen=True)
class SampleBound:
    """A lower bound of a micro-batched step (:func:`sample_bound`; times in µs).

    Attributes
    ----------
    step : float
        The bound: the largest of ``generic``, ``copies`` and ``colocation``.
    per_sample : float or None
        ``step / batch`` when a batch size was given.
    generic, copies, colocation : float
        The terms (module doc).
    memory : int
        Bytes some device must hold at its peak.
    fits : bool
        Whether ``memory`` is within the largest device's memory.
    source : str
        The term that gives ``step``.
    """

    step: float
    per_sample: float | None
    generic: float
    copies: float
    colocation: float
    memory: int
    fits: bool
    source: str


def sample_bound(split: Transformed, cluster: Cluster, *, batch: int | None = None) -> SampleBound:
    """The lower bound of ``split.graph`` on ``cluster`` (module doc).

    ``batch``: the step's batch size, for ``per_sample``.
    """
    prob = Problem.of(split.graph, cluster)
    fast = [prob.fastest(i) for i in range(prob.n)]
    head = [t - f for t, f in zip(top_levels(prob.pred, fast, order=prob.topo), fast)]
    tail = [b - f for b, f in zip(bottom_levels(prob.succ, fast, order=prob.topo), fast)]
    terms = {"generic": lower_bound(split.graph, cluster),
             "copies": copies_bound(split, prob, head, tail),
             "colocation": colocation_bound(prob, head, tail)}
    source = max(terms, key=lambda k: (terms[k], k == "generic"))
    step = terms[source]
    memory = memory_floor(prob)
    return SampleBound(step, None if not batch else step / batch, terms["generic"], terms["copies"],
                       terms["colocation"], memory, memory <= max(prob.cap), source)


def copies_bound(split: Transformed, prob: Problem, head, tail) -> float:
    """The ``copies`` term (module doc): the largest over the original batched ops.

    >>> from pesto.graph import Op, OpGraph
    >>> from pesto.cluster import gpus
    >>> from pesto.step import split
    >>> s = split(OpGraph([Op("a", {"GPU": 40.0}, batch=True)]), 4)
    >>> p = Problem.of(s.graph, gpus(3))
    >>> copies_bound(s, p, [0.0] * 4, [0.0] * 4)   # 4 copies of 10 on 3 GPUs: 2 rounds
    20.0
    """
    groups: dict[tuple, list[int]] = {}
    for name, o in split.origin.items():
        if o.role == "copy":   # one replica's copies of one op
            groups.setdefault((o.op, o.replica), []).append(prob.index[name])
    best = 0.0
    for members in groups.values():
        h = min(head[i] for i in members)
        tails = sorted((tail[i] for i in members), reverse=True)
        one = split.graph.ops[members[0]].colocation_group
        together = one is not None and all(split.graph.ops[i].colocation_group == one for i in members)
        best = max(best, _copies(prob, members[0], len(members), h, tails, together))
    return best


def _copies(prob: Problem, i: int, m: int, h: float, tails, together: bool) -> float:
    """``max_j(end_j + tails[j])`` with ``end_j`` the j-th earliest end of ``m`` copies of op ``i``."""
    times = [prob.dur[i][d] for d in prob.allowed[i] if prob.dur[i][d] < INF]
    rounds = np.arange(1, m + 1)
    q = np.asarray(tails)
    if together:
        return float(min(np.max(h + rounds * p + q) for p in times))
    ends = np.sort(np.concatenate([rounds * p for p in times]))[:m]
    return float(np.max(h + ends + q))


def colocation_bound(prob: Problem, head, tail) -> float:
    """The ``colocation`` term (module doc): the largest over units of two ops or more.

    >>> from pesto.graph import Op, OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph([Op(n, {"GPU": 5.0}, colocation_group="g") for n in "abc"])
    >>> colocation_bound(Problem.of(g, gpus(3)), [0.0] * 3, [0.0] * 3)
    15.0
    """
    best = 0.0
    for members in prob.members:
        if len(members) < 2:
            continue
        devs = prob.allowed[members[0]]
        if not devs:
            continue
        work = min(sum(prob.dur[i][d] for i in members) for d in devs)
        best = max(best, min(head[i] for i in members) + work + min(tail[i] for i in members))
    return best


def memory_floor(prob: Problem) -> int:
    """Bytes some device must hold at its peak, for any plan (module doc).

    >>> from pesto.graph import Op, OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph([Op("w", {"GPU": 1.0}, persistent_bytes=100, colocation_group="g"),
    ...              Op("f", {"GPU": 1.0}, output_bytes=30, temporary_bytes=5, colocation_group="g"),
    ...              Op("v", {"GPU": 1.0}, persistent_bytes=60)])
    >>> memory_floor(Problem.of(g, gpus(2)))   # 100 + 30 + 5 beats (100 + 60) / 2
    135
    """
    return memory_need(prob)[0]


def memory_need(prob: Problem) -> tuple[int, str]:
    """:func:`memory_floor` and what sets it: ``"op 'name'"`` (:func:`op_memory`)
    or ``"persistent bytes over N devices"``.

    >>> from pesto.graph import Op, OpGraph
    >>> from pesto.cluster import gpus
    >>> memory_need(Problem.of(OpGraph([Op("w", {"GPU": 1.0}, persistent_bytes=90)]), gpus(2)))
    (90, "op 'w'")
    """
    spread = -(-sum(op.persistent_bytes for op in prob.graph.ops) // max(1, prob.nd))
    need, name = max(op_memory(prob), default=(0, ""))
    if spread > need:
        return int(spread), f"persistent bytes over {prob.nd} devices"
    return int(need), f"op {name!r}"


def op_memory(prob: Problem) -> list[tuple[int, str]]:
    """Per op, the bytes its device holds while it runs, whatever the plan,
    and the op's name: its unit's persistent bytes, its output and temporary
    bytes and (at its start, when it takes time on every device it may use)
    each producer's output or the tensors received from it, whichever is less.

    >>> from pesto.graph import Op, OpGraph, Tensor, Edge
    >>> from pesto.cluster import gpus
    >>> g = OpGraph([Op("a", {"GPU": 1.0}, output_bytes=40), Op("b", {"GPU": 1.0}, output_bytes=40),
    ...              Op("sum", {"GPU": 1.0}, output_bytes=40)],
    ...             [Edge("a", "sum", "a:0"), Edge("b", "sum", "b:0")], [Tensor("a:0", "a", 40), Tensor("b:0", "b", 40)])
    >>> max(op_memory(Problem.of(g, gpus(2))))   # both inputs and the sum
    (120, 'sum')
    """
    graph, ops = prob.graph, prob.graph.ops
    held = [sum(ops[i].persistent_bytes for i in mem) for mem in prob.members]
    sent: dict[tuple[int, int], set] = {}
    for e in graph.edges:
        if e.tensors:
            sent.setdefault((prob.index[e.src], prob.index[e.dst]), set()).update(e.tensors)
    inputs = [0] * prob.n
    for (src, dst), names in sent.items():
        inputs[dst] += min(ops[src].output_bytes, sum(graph.tensor(t).bytes for t in names))
    out = []
    for i, op in enumerate(ops):
        timed = all(prob.dur[i][d] > 0 for d in prob.allowed[i])
        out.append((held[prob.unit[i]] + op.output_bytes + op.temporary_bytes + (inputs[i] if timed else 0),
                    op.name))
    return out
