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
random plans, against every pipeline placer's plan and against a brute-force
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
from .cut import block_orders, least_largest, phases

__all__ = ["SampleBound", "sample_bound", "copies_bound", "colocation_bound", "memory_floor", "memory_need",
           "op_memory", "PipelineBound", "pipeline_bound", "PIPELINE_ATOMS", "THRESHOLDS"]

#: Most forward ops :func:`pipeline_bound` cuts between (its programme is quadratic in them).
PIPELINE_ATOMS = 4096
#: Quantiles of the copies' heads, and of their tails, that :func:`pipeline_bound` sets its subsets at.
THRESHOLDS = 3


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
    pipeline : float
        :func:`pipeline_bound`, when a caller bounds contiguous-stage
        pipelines only (:func:`solver.parallel.search.winner_bound` of a
        pipeline winner, source ``"pipeline"``); else 0.
    """

    step: float
    per_sample: float | None
    generic: float
    copies: float
    colocation: float
    memory: int
    fits: bool
    source: str
    pipeline: float = 0.0


def sample_bound(split: Transformed, cluster: Cluster, *, batch: int | None = None) -> SampleBound:
    """The lower bound of ``split.graph`` on ``cluster`` (module doc).

    ``batch``: the step's batch size, for ``per_sample``.
    """
    prob, fast, head, tail = _levels(split, cluster)
    terms = {"generic": lower_bound(split.graph, cluster),
             "copies": copies_bound(split, prob, head, tail),
             "colocation": colocation_bound(prob, head, tail)}
    source = max(terms, key=lambda k: (terms[k], k == "generic"))
    step = terms[source]
    memory = memory_floor(prob)
    return SampleBound(step, None if not batch else step / batch, terms["generic"], terms["copies"],
                       terms["colocation"], memory, memory <= max(prob.cap), source)


def _levels(split: Transformed, cluster: Cluster) -> tuple[Problem, list, list, list]:
    """The problem of ``split.graph``, its ops' fastest times, heads and tails (module doc)."""
    prob = Problem.of(split.graph, cluster)
    fast = [prob.fastest(i) for i in range(prob.n)]
    head = [t - f for t, f in zip(top_levels(prob.pred, fast, order=prob.topo), fast)]
    tail = [b - f for b, f in zip(bottom_levels(prob.succ, fast, order=prob.topo), fast)]
    return prob, fast, head, tail


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
    ops, n = prob.graph.ops, prob.n
    persistent = np.fromiter((op.persistent_bytes for op in ops), dtype=np.int64, count=n)
    unit = np.asarray(prob.unit, dtype=np.int64)
    held = np.bincount(unit, weights=persistent, minlength=len(prob.members)).astype(np.int64)
    # per (producer, consumer) pair the bytes of the tensors sent (the tensor table: one entry per consumer)
    src, dst, nbytes = [], [], []
    for _, s, b, cons in prob.graph.tensor_table():
        src += [s] * len(cons)
        dst += cons
        nbytes += [b] * len(cons)
    inputs = np.zeros(n, dtype=np.int64)
    if src:
        pair = np.asarray(src, dtype=np.int64) * n + np.asarray(dst, dtype=np.int64)
        pairs, at = np.unique(pair, return_inverse=True)
        sent = np.bincount(at, weights=np.asarray(nbytes, dtype=np.float64))
        out_bytes = np.fromiter((op.output_bytes for op in ops), dtype=np.int64, count=n)
        np.add.at(inputs, pairs % n, np.minimum(out_bytes[pairs // n], sent).astype(np.int64))
    out = []
    for i, op in enumerate(ops):   # one pass: an op timed on every device it may use counts its inputs
        timed = all(prob.dur[i][d] > 0 for d in prob.allowed[i])
        out.append((int(held[prob.unit[i]]) + op.output_bytes + op.temporary_bytes + (int(inputs[i]) if timed else 0),
                    op.name))
    return out


@dataclass(frozen=True)
class PipelineBound:
    """A lower bound of every contiguous-stage pipeline plan of a split step
    (:func:`pipeline_bound`; µs).

    Attributes
    ----------
    step : float
        The bound: the least over the stage counts allowed and the candidate orders.
    stages : int
        The stage count that gives ``step``.
    order : str
        The candidate order that gives it (:func:`solver.parallel.cut.block_orders`).
    """

    step: float
    stages: int
    order: str


def pipeline_bound(split: Transformed, cluster: Cluster, *, stages: int | None = None,
                   loss: str | None = None) -> PipelineBound | None:
    """A bound that charges a pipeline's fill and drain, valid for every plan
    of ``split.graph`` whose stages are contiguous ranges of one candidate
    order of the forward ops (:func:`solver.parallel.cut.block_orders`; a
    backward op with the forward op it is anchored to), each stage's copies
    on a device of its own: the plans of GPipe, 1F1B and every schedule of
    :func:`solver.parallel.pipelines.pipeline_plan`, with ``stages`` stages
    (default: any number up to the cluster's GPUs). None without forward
    ops or with more than :data:`PIPELINE_ATOMS`.

    For a stage holding forward ops ``i..j-1`` of an order and a set ``S``
    of its copies, let ``c(S) = min head + sum p + min tail`` over ``S``
    (heads, tails and times ``p`` as in the module doc). The bound is
    ``min over orders, splits into k stages of max over stages of
    max over sets S of c(S)``, the sets: all the stage's copies, those not
    marked weight-grad, and those whose head (tail) is at least each of
    :data:`THRESHOLDS` quantiles of the step's copies' heads (tails).

    *Proof.* Take such a plan, its order and its stages. A stage's device
    runs the copies of ``S`` one at a time; none starts before its head (the
    ops before it each take at least their fastest time, transfers at least
    0), so the first starts no earlier than the least head, the last ends no
    earlier than that plus ``sum p``, and the step lasts at least that op's
    tail more, at least the least tail: ``step >= c(S)`` for every stage and
    every ``S``. The plan's stages are one of the splits of its order, so
    its step is at least that split's largest ``c``, at least the least
    over splits (:func:`solver.parallel.cut.least_largest`, exact), and at
    least the least over the orders. With all copies, ``c`` is the fill
    (one slice's path to the stage), ``M`` slices' work, and the drain;
    weight gradients have no path to the step's end but the update, so the
    second set keeps the drain of the input gradients; ops of tiny work and
    an early head or a late tail (a shape op, a batch-norm parameter's
    gradient) are left out by the quantile sets. ∎

    On a uniform chain (``k`` layers of forward ``f`` and backward ``b`` per
    slice, a stage each) the last stage gives ``(M + k - 1)(f + b)``, the
    step of GPipe and 1F1B.

    >>> from pesto.graph import Op, OpGraph, Edge, Tensor
    >>> from pesto.cluster import gpus
    >>> from pesto.step import split
    >>> fw = [Op(f"f{i}", {"GPU": 40.0}, batch=True, phase="forward") for i in range(2)]
    >>> bw = [Op(f"b{i}", {"GPU": 40.0}, batch=True, phase="input-grad", anchor=f"f{i}") for i in range(2)]
    >>> names = ["f0", "f1", "b1", "b0"]
    >>> g = OpGraph(fw + bw, [Edge(u, v, (f"{u}:0",)) for u, v in zip(names, names[1:])],
    ...             [Tensor(f"{n}:0", n, 8) for n in names])
    >>> pipeline_bound(split(g, 4), gpus(2))   # (4 + 2 - 1) * (10 + 10)
    PipelineBound(step=100.0, stages=2, order='topological')
    """
    g = split.source
    ph = phases(g, loss=loss)
    if not ph.forward or len(ph.forward) > PIPELINE_ATOMS:
        return None
    prob, fast, head, tail = _levels(split, cluster)
    atom = {**{f: f for f in ph.forward}, **dict(ph.anchor)}
    copies = [(prob.index[name], atom[g.index[o.op]], g.ops[g.index[o.op]].phase == "weight-grad")
              for name, o in split.origin.items() if o.role == "copy" and g.index[o.op] in atom]
    k_of, a_of, wgrad = (np.array(x) for x in zip(*copies))
    h, p, t = (np.asarray(x, float)[k_of] for x in (head, fast, tail))
    sets = [np.ones(len(h), bool), ~wgrad]
    for x in (h, t):   # copies whose head (tail) is at least a quantile: a later start (end) for less work
        sets += [x >= q for q in np.unique(np.quantile(x, np.linspace(0, 1, THRESHOLDS + 2)[1:-1]))]
    terms = [_atom_terms(a_of[m], h[m], p[m], t[m], g.num_ops) for m in sets]
    most = stages or len(cluster.gpus) or len(cluster.devices)
    best, seen = None, set()
    for name, order, _ in block_orders(g, ph):
        if tuple(order) in seen:
            continue
        seen.add(tuple(order))
        cost = _set_costs(*terms[0][:, order])
        for x in terms[1:]:
            np.maximum(cost, _set_costs(*x[:, order]), out=cost)
        values, _ = least_largest(lambda s: cost, min(most, len(order)), len(order))
        for k, v in enumerate(values, start=1):
            if (stages is None or k == stages) and (best is None or v < best.step):
                best = PipelineBound(v, k, name)
    return best


def _atom_terms(atom, head, work, tail, n: int) -> np.ndarray:
    """Per forward op (``n`` ops of the step): least head, work and least tail of its set's copies."""
    out = np.zeros((3, n))
    out[(0, 2), :] = np.inf
    np.minimum.at(out[0], atom, head)
    np.add.at(out[1], atom, work)
    np.minimum.at(out[2], atom, tail)
    return out


def _set_costs(head: np.ndarray, work: np.ndarray, tail: np.ndarray) -> np.ndarray:
    """``c[i, j]``: least head + work + least tail of forward ops ``i..j-1``
    (``inf`` for ``i >= j``; 0 when they hold no copy of the set).

    >>> _set_costs(np.array([0., 5]), np.array([2., 3]), np.array([9., 1])).tolist()   # [0, 2): 0 + 5 + 1
    [[inf, 11.0, 6.0], [inf, inf, 9.0], [inf, inf, inf]]
    """
    n = len(head)
    c = np.full((n + 1, n + 1), np.inf)
    pre = np.concatenate([[0.0], np.cumsum(work)])
    for i in range(n):   # row i: blocks i..j-1 for j > i
        low_head = np.minimum.accumulate(head[i:])
        row = low_head + (pre[i + 1:] - pre[i]) + np.minimum.accumulate(tail[i:])
        c[i, i + 1:] = np.where(np.isfinite(low_head), row, 0.0)
    return c
