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

Recomputed ops (``phase="recompute"``, :func:`pesto.step.recompute`) count
as taking no time in every term (:func:`own_work`): recomputation is a plan's
choice, not the step's work, so a bound of a recomputing plan's graph holds
for the plain step's plans too (a plan of the plain step is one of the
recomputing graph with each copy run, in no time, where its original ran:
its inputs are there then, and the backward ops it feeds come later).

``step`` is the largest time term; ``per_sample`` divides it by the batch
size when one is given. The bound is the *same step's*: every plan of
``split.graph`` is at least ``step`` (tests check it against the simulator on
random plans, against every pipeline placer's plan and against a brute-force
optimum on tiny graphs).

:func:`pipeline_bound` bounds a narrower class, the pipelines of contiguous
stages (:func:`covers` says whether a plan is one), and so can charge what
they cannot avoid: fill, drain and the transfers between stages, on the
cluster's fastest route (:func:`least_transfer`).

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

from bisect import insort
from dataclasses import dataclass, replace

import numpy as np

from pesto.cluster import Cluster
from pesto.dag import bottom_levels, top_levels
from pesto.graph import OpGraph
from pesto.step import Transformed
from pesto.problem import INF, GraphArrays, Problem

from ..bounds import lower_bound
from .cut import block_orders, least_largest, phases

__all__ = ["SampleBound", "sample_bound", "copies_bound", "colocation_bound", "memory_floor", "memory_need",
           "op_memory", "PipelineBound", "pipeline_bound", "least_transfer", "covers", "own_work",
           "PIPELINE_ATOMS", "THRESHOLDS"]

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
    split = own_work(split)
    prob, fast, head, tail = _levels(split, cluster)
    terms = {"generic": lower_bound(split.graph, cluster),
             "copies": copies_bound(split, prob, head, tail),
             "colocation": colocation_bound(prob, head, tail)}
    source = max(terms, key=lambda k: (terms[k], k == "generic"))
    step = terms[source]
    memory = memory_floor(prob)
    return SampleBound(step, None if not batch else step / batch, terms["generic"], terms["copies"],
                       terms["colocation"], memory, memory <= max(prob.cap), source)


def own_work(split: Transformed) -> Transformed:
    """``split`` with its recomputed ops (``phase="recompute"``) taking no
    time: the step's own work (module doc); ``split`` itself when it has none.

    >>> from pesto.graph import Op, OpGraph
    >>> from pesto.step import identity
    >>> t = identity(OpGraph([Op("a", {"GPU": 3.0}), Op("a@rc", {"GPU": 3.0}, phase="recompute")]))
    >>> [op.compute["GPU"] for op in own_work(t).graph.ops]
    [3.0, 0.0]
    """
    g = split.graph
    if not any(op.phase == "recompute" for op in g.ops):
        return split
    ops = [replace(op, compute=dict.fromkeys(op.compute, 0.0)) if op.phase == "recompute" else op for op in g.ops]
    return replace(split, graph=OpGraph(ops, g.edges, g.tensors, name=g.name))


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
    and the op's name: its unit's persistent bytes, its allocated output
    (:attr:`~pesto.graph.Op.allocated_bytes`) and temporary bytes and (at its
    start, when it takes time on every device it may use) each producer's
    allocated output or the tensors received from it, whichever is less (a
    variable's read, a view, adds nothing where it runs with its consumer).

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
        out_bytes = np.asarray(prob.out, dtype=np.int64)   # allocated: a view's producer holds none
        np.add.at(inputs, pairs % n, np.minimum(out_bytes[pairs // n], sent).astype(np.int64))
    out = []
    for i, op in enumerate(ops):   # one pass: an op timed on every device it may use counts its inputs
        timed = all(prob.dur[i][d] > 0 for d in prob.allowed[i])
        out.append((int(held[prob.unit[i]]) + prob.out[i] + op.temporary_bytes + (int(inputs[i]) if timed else 0),
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
                   loss: str | None = None, transfers: bool = True) -> PipelineBound | None:
    """A bound that charges a pipeline's fill and drain, and the transfers
    between its stages, valid for every plan of ``split.graph`` whose stages
    are contiguous ranges of one candidate order of the forward ops
    (:func:`solver.parallel.cut.block_orders`; a backward op with the
    forward op it is anchored to), each stage's copies on a device of its
    own (no two stages on one device): the plans of GPipe, 1F1B, ZB-H1/H2
    and every one-chunk schedule of :func:`solver.parallel.pipelines.pipeline_plan`,
    any schedule, any device order, with ``stages`` stages or fewer
    (default: any number up to the cluster's GPUs). Not covered: a plan with
    copies of one stage on two devices, or two stages on one device (the
    chunked schedules: interleaved, ZB-V). Recomputed ops take no time
    (:func:`own_work`, module doc); ``transfers=False`` takes every
    charge below as 0, as the compute-only proof allows. None without forward
    ops, without copies or with more than :data:`PIPELINE_ATOMS`.

    For a stage holding forward ops ``i..j-1`` of an order and a set ``S``
    of its copies, let ``c(S) = min head + sum p + min tail`` over ``S``
    (heads, tails and times ``p`` as in the module doc). The compute-only
    bound is ``min over orders, splits into k stages of max over stages of
    max over sets S of c(S)``, the sets: all the stage's copies, those not
    marked weight-grad, and those whose head (tail) is at least each of
    :data:`THRESHOLDS` quantiles of the step's copies' heads (tails).

    *Proof (compute only).* Take such a plan, its order and its stages. A
    stage's device runs the copies of ``S`` one at a time; none starts before
    its head (the ops before it each take at least their fastest time,
    transfers at least 0), so the first starts no earlier than the least
    head, the last ends no earlier than that plus ``sum p``, and the step
    lasts at least that op's tail more, at least the least tail: ``step >=
    c(S)`` for every stage and every ``S``. The plan's stages are one of the
    splits of its order (stages without copies dropped: they bind nothing),
    so its step is at least that split's largest ``c``, at least the least
    over splits (:func:`solver.parallel.cut.least_largest`, exact), and at
    least the least over the orders. With all copies, ``c`` is the fill (one
    slice's path to the stage), ``M`` slices' work, and the drain; weight
    gradients have no path to the step's end but the update, so the second
    set keeps the drain of the input gradients; ops of tiny work and an early
    head or a late tail (a shape op, a batch-norm parameter's gradient) are
    left out by the quantile sets. ∎

    *Transfers.* Positions are those of the forward ops with copies in the
    order, cut ``b`` lies between positions ``b - 1`` and ``b``; stage ``s``
    (from 0) starting at ``i`` has ``s`` cuts ``b_1 < ... < b_s = i`` before
    it. Fix for every copy ``x`` one longest path ``P`` into it (its head
    path: each op's heaviest predecessor) and one out of it (its tail path).
    A *hop* of ``P`` joins two consecutive copies of ``P`` (ops between them
    are not copies); its charge ``e`` is :func:`least_transfer` of the
    fewest bytes among its edges' largest tensors, its span the distance of
    its ends' positions. ``kappa(b)`` is the least ``e / span`` over the hops
    of every head (tail) path that cross cut ``b``, 0 where none does, and
    ``lo(x)`` the least position on ``x``'s path. The charge of stage ``s`` at
    ``i`` for ``lo <= L`` is ``C(s, i, L) = kappa(i) + the s - 1 - L
    smallest kappa(b), L < b < i`` (0 for ``s = 0`` or ``i <= L``). The
    bound takes, per stage, the largest of the compute-only sets' ``c(S)``
    and, for ``S`` all the stage's copies or those not marked weight-grad and
    ``S_L`` those of ``lo <= L`` on the head path (on both paths), ``c(S_L) +
    C_head`` (``+ C_tail``), ``L`` the least position whose copies hold half
    the copies' work (per path). ``transfers=False`` keeps the sets, every
    charge 0 (``S_L`` alone may start later than ``S``: the copies it leaves
    out, of short paths, are often the ones of least head).

    *Proof (transfers).* Take a copy ``x`` of stage ``s`` with ``lo(x) <=
    L``. Its path visits positions ``lo(x)`` and ``x``'s own, at least ``i``,
    so it crosses every cut ``b_t > lo(x)`` by some hop; a hop of span ``d``
    crosses at most ``d`` cuts, so ``sum kappa(b_t)`` over those cuts is at
    most the sum of the crossing hops' ``e``. A crossing hop joins copies of
    two stages, on two devices, so one of its edges joins two devices: its
    largest tensor goes over a route, no faster than ``least_transfer``, after
    its producer ends (the engine sends a tensor when its producer ends, once
    per remote device; the consumer waits for every tensor). The ops of the
    path still take their fastest time, so ``x`` starts no earlier than its
    head plus ``sum e`` over the crossing hops, at least its head plus
    ``C(s, i, lo(x))``, at least its head plus ``C(s, i, L)`` (``C`` does not
    grow with ``lo``: of the ``s`` cuts, those at most ``lo`` are free). The
    tail path from ``x``'s end likewise. The compute-only proof with these
    heads and tails gives ``step >= c(S_L) + C``. ∎

    On a uniform chain (``k`` layers of forward ``f`` and backward ``b`` per
    slice, a stage each, activations of ``e`` per hop) the last stage gives
    ``(M + k - 1)(f + b) + 2 (k - 1) e``, the step of GPipe and 1F1B.

    >>> from pesto.graph import Op, OpGraph, Edge, Tensor
    >>> from pesto.cluster import gpus
    >>> from pesto.step import split
    >>> fw = [Op(f"f{i}", {"GPU": 40.0}, batch=True, phase="forward") for i in range(2)]
    >>> bw = [Op(f"b{i}", {"GPU": 40.0}, batch=True, phase="input-grad", anchor=f"f{i}") for i in range(2)]
    >>> names = ["f0", "f1", "b1", "b0"]
    >>> g = OpGraph(fw + bw, [Edge(u, v, (f"{u}:0",)) for u, v in zip(names, names[1:])],
    ...             [Tensor(f"{n}:0", n, 8) for n in names])
    >>> pipeline_bound(split(g, 4), gpus(2, beta=(3.0, 0.0)))   # (4 + 2 - 1) * (10 + 10) + 2 * 3
    PipelineBound(step=106.0, stages=2, order='topological')
    >>> pipeline_bound(split(g, 4), gpus(2, beta=(3.0, 0.0)), transfers=False).step
    100.0
    """
    g, split = split.source, own_work(split)
    ph = phases(g, loss=loss)
    if not ph.forward or len(ph.forward) > PIPELINE_ATOMS:
        return None
    prob, fast, head, tail = _levels(split, cluster)
    copies = [(prob.index[name], a, g.ops[g.index[split.origin[name].op]].phase == "weight-grad")
              for name, a in _stage_copies(split, ph)]
    if not copies:
        return None
    k_of, a_of, wgrad = (np.array(x) for x in zip(*copies))
    hops = _hops(prob, fast, head, tail, k_of)
    h, p, t = (np.asarray(x, float)[k_of] for x in (head, fast, tail))
    sets = [np.ones(len(h), bool), ~wgrad]
    for x in (h, t):   # copies whose head (tail) is at least a quantile: a later start (end) for less work
        sets += [x >= q for q in np.unique(np.quantile(x, np.linspace(0, 1, THRESHOLDS + 2)[1:-1]))]
    most, held = stages or len(cluster.gpus) or len(cluster.devices), set(a_of.tolist())
    best, seen = None, set()
    for name, order, _ in block_orders(g, ph):
        order = [a for a in order if a in held]   # the forward ops with copies
        if tuple(order) in seen:
            continue
        seen.add(tuple(order))
        k, pos = min(most, len(order)), np.full(g.num_ops, -1)
        pos[order] = np.arange(len(order))
        free = _stage_costs([_atom_terms(a_of[m], h[m], p[m], t[m], g.num_ops) for m in sets], order)
        groups = _charged(hops, pos[a_of], sets, (a_of, h, p, t, g.num_ops), order, k)
        values, _ = least_largest(_segments(free, groups, charge=transfers), k, len(order))
        for s, v in enumerate(values, start=1):
            if best is None or v < best.step:
                best = PipelineBound(v, s, name)
    return best


def _stage_copies(split: Transformed, ph) -> list[tuple[str, int]]:
    """Every copy a pipeline stage holds and the forward op it is staged with
    (its own op, or the one its op is anchored to)."""
    g = split.source
    atom = {**{f: f for f in ph.forward}, **dict(ph.anchor)}
    return [(name, atom[g.index[o.op]]) for name, o in split.origin.items()
            if o.role == "copy" and g.index[o.op] in atom]


def covers(split: Transformed, placement, *, stages: int | None = None, loss: str | None = None) -> bool:
    """Whether :func:`pipeline_bound` (of ``stages`` stages or fewer) covers a
    plan of ``split.graph`` placed by ``placement`` (op name -> device): each
    forward op's copies, and those staged with it, on one device, and along
    some candidate order each device holds one contiguous range of them.

    >>> from pesto.graph import Op, OpGraph, Edge
    >>> from pesto.step import split
    >>> ops = [Op(n, {"GPU": 1.0}, batch=True, phase="forward") for n in "ab"]
    >>> ops += [Op(f"d{n}", {"GPU": 1.0}, batch=True, phase="input-grad", anchor=n) for n in "ab"]
    >>> s = split(OpGraph(ops, [Edge("a", "b"), Edge("b", "db"), Edge("db", "da")]), 2)
    >>> on = {f"{n}@mb{k}": "g0" if "a" in n else "g1" for n in ("a", "b", "da", "db") for k in (0, 1)}
    >>> covers(s, on), covers(s, {**on, "da@mb1": "g1"}), covers(s, {**on, "b@mb0": "g0", "db@mb0": "g0"})
    (True, False, False)
    """
    g = split.source
    ph = phases(g, loss=loss)
    where: dict[int, set] = {}
    for name, a in _stage_copies(split, ph):
        where.setdefault(a, set()).add(placement.get(name))
    if not where or any(len(d) != 1 or None in d for d in where.values()):
        return False
    device = {a: next(iter(d)) for a, d in where.items()}
    for _, order, _ in block_orders(g, ph):
        runs = [device[a] for a in order if a in device]
        runs = [d for k, d in enumerate(runs) if k == 0 or d != runs[k - 1]]
        if len(runs) == len(set(runs)) and (stages is None or len(runs) <= stages):
            return True
    return False


def least_transfer(prob: Problem, nbytes) -> np.ndarray:
    """The least time a tensor of ``nbytes`` takes between two distinct
    devices of ``prob``'s cluster: the least ``beta0 + beta1 * nbytes`` over
    its routes (the engine's transfer time); 0 for 0 bytes or one device.

    >>> from pesto.graph import Op, OpGraph
    >>> from pesto.cluster import gpus
    >>> least_transfer(Problem.of(OpGraph([Op("a", {"GPU": 1.0})]), gpus(2, beta=(2.0, 0.5))), [0, 10]).tolist()
    [0.0, 7.0]
    """
    nb = np.asarray(nbytes, dtype=float)
    pairs = [(prob.beta0[a][b], prob.beta1[a][b]) for a in range(prob.nd) for b in range(prob.nd) if a != b]
    if not pairs or nb.size == 0:
        return np.zeros(nb.shape)
    b0, b1 = np.asarray(pairs, dtype=float).T
    least = np.min(b0[:, None] + b1[:, None] * nb.ravel()[None, :], axis=0).reshape(nb.shape)
    return np.where(nb > 0, least, 0.0)


@dataclass(frozen=True)
class _Hops:
    """Per copy (index into the copies' list), the copy before it on its head
    path and the one after it on its tail path (-1: none), each hop's charge
    (:func:`pipeline_bound`'s proof)."""

    head_from: np.ndarray
    head_cost: np.ndarray
    tail_to: np.ndarray
    tail_cost: np.ndarray


def _hops(prob: Problem, fast, head, tail, k_of: np.ndarray) -> _Hops:
    """The head and tail paths' hops (:func:`pipeline_bound`): each op's
    heaviest predecessor (successor) chains it to a source (sink)."""
    ga = GraphArrays.of(prob.graph)
    src, dst, n = ga.esrc, ga.edst, prob.n
    ebytes = np.zeros(len(src))   # per edge its largest tensor, then per (producer, consumer) pair
    np.maximum.at(ebytes, ga.pe, ga.tbytes[ga.pt].astype(float))
    keys, at = np.unique(src * n + dst, return_inverse=True)
    pair = np.zeros(len(keys))
    np.maximum.at(pair, at, ebytes)
    is_copy = np.zeros(n + 1, bool)   # index -1: no op
    is_copy[k_of] = True
    out = []
    for level, frm, to in ((head, src, dst), (tail, dst, src)):
        weight = np.asarray(level, float) + np.asarray(fast, float)
        link, edge = _heaviest(frm, to, weight[frm], n)   # per op the op before it on its path, the edge
        nbytes = np.where(edge >= 0, pair[at[np.maximum(edge, 0)]], 0.0)
        near, least = _nearest(link, nbytes, is_copy)
        cid = np.full(n + 1, -1)
        cid[k_of] = np.arange(len(k_of))
        out += [cid[near[k_of]], least_transfer(prob, least[k_of])]
    return _Hops(*out)


def _heaviest(frm: np.ndarray, to: np.ndarray, score: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per op ``v``, the ``frm`` end of its edge ``frm -> v`` of largest
    ``score`` and that edge (-1, -1: none).

    >>> [x.tolist() for x in _heaviest(np.array([0, 1]), np.array([2, 2]), np.array([5., 7]), 3)]
    [[-1, -1, 1], [-1, -1, 1]]
    """
    link, edge = np.full(n, -1), np.full(n, -1)
    if len(to):
        order = np.lexsort((score, to))
        last = order[np.r_[to[order][1:] != to[order][:-1], True]]
        link[to[last]], edge[to[last]] = frm[last], last
    return link, edge


def _nearest(link: np.ndarray, nbytes: np.ndarray, is_copy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per op, the nearest copy along ``link`` (-1: none) and the fewest
    ``nbytes`` (of the edge into each op) on the way, by pointer jumping.

    >>> [x.tolist() for x in _nearest(np.array([-1, 0, 1]), np.array([0., 5, 3]), np.array([1, 0, 0, 0], bool))]
    [[-1, 0, 0], [0.0, 5.0, 3.0]]
    """
    ptr, least = link.copy(), nbytes.astype(float)
    done = is_copy[ptr]
    done[ptr < 0] = True
    while not done.all():
        i = np.flatnonzero(~done)
        a = ptr[i]
        least[i], ptr[i], done[i] = np.minimum(least[i], least[a]), ptr[a], done[a]
    return ptr, least


def _charged(hops: _Hops, pos: np.ndarray, sets, copies, order, k: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The charged sets of :func:`pipeline_bound`: per group, the largest of
    its sets' costs and its charges ``C[s, i]``."""
    a_of, h, p, t, n_ops = copies
    n, terms = len(order), {}
    for path, (frm, cost) in (("head", (hops.head_from, hops.head_cost)), ("tail", (hops.tail_to, hops.tail_cost))):
        lo = _lowest(pos, frm)
        kappa = _cut_charges(n, pos, frm, cost)
        w = np.bincount(lo, weights=p, minlength=n)
        low = int(np.searchsorted(np.cumsum(w), w.sum() / 2))   # L: half the copies' work at lo <= L
        terms[path] = (lo <= low, _stage_charges(kappa, low, k))
    groups = []
    for paths in (("head",), ("head", "tail")):
        keep = np.logical_and.reduce([terms[x][0] for x in paths])
        masks = [m for m in (s & keep for s in sets[:2]) if m.any()]   # all copies, all but weight gradients
        if masks:
            cost = _stage_costs([_atom_terms(a_of[m], h[m], p[m], t[m], n_ops) for m in masks], order, empty=-np.inf)
            groups.append((cost, sum(terms[x][1] for x in paths)))
    return groups


def _segments(free: np.ndarray, groups, charge: bool = True):
    """``seg(s)`` for :func:`solver.parallel.cut.least_largest`: the largest
    of ``free`` (the uncharged sets' costs) and each charged group's cost
    plus, with ``charge``, its stage's charges."""
    def seg(s: int) -> np.ndarray:
        out = free.copy()
        for cost, charges in groups:
            np.maximum(out, cost + charges[s][:, None] if charge else cost, out=out)
        return out
    return seg


def _lowest(pos: np.ndarray, frm: np.ndarray) -> np.ndarray:
    """Per copy, the least position on its path (``frm``: the copy before it,
    -1: none), by pointer jumping.

    >>> _lowest(np.array([2, 0, 5]), np.array([-1, -1, 0])).tolist()
    [2, 0, 2]
    """
    lo, ptr = pos.copy(), frm.copy()
    while (ptr >= 0).any():
        i = np.flatnonzero(ptr >= 0)
        a = ptr[i]
        lo[i], ptr[i] = np.minimum(lo[i], lo[a]), ptr[a]
    return lo


def _cut_charges(n: int, pos: np.ndarray, frm: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """``kappa[b]`` (cut ``b`` between positions ``b - 1`` and ``b``): the
    least ``cost / span`` of the hops across it, 0 where none is.

    >>> _cut_charges(4, np.array([0, 1, 3]), np.array([-1, 0, 1]), np.array([0., 2, 4])).tolist()
    [0.0, 2.0, 2.0, 2.0, 0.0]
    """
    has = frm >= 0
    a, b = pos[has], pos[frm[has]]
    lo, hi, c = np.minimum(a, b), np.maximum(a, b), cost[has]
    cross = hi > lo
    kappa = np.full(n + 1, np.inf)
    if cross.any():
        hops = np.unique(np.stack([lo[cross], hi[cross], c[cross] / (hi - lo)[cross]], axis=1), axis=0)
        for l, r, v in sorted(hops.tolist(), key=lambda x: -x[2]):   # the least last
            kappa[int(l) + 1:int(r) + 1] = v
    return np.where(np.isfinite(kappa), kappa, 0.0)


def _stage_charges(kappa: np.ndarray, low: int, k: int) -> np.ndarray:
    """``C[s, i]``: the charge of stage ``s`` (of ``k``) starting at position
    ``i`` for copies whose path reaches down to ``low`` (:func:`pipeline_bound`).

    >>> _stage_charges(np.array([0., 1, 2, 3]), 0, 3)[:, 3].tolist()   # kappa(3), + kappa(1)
    [0.0, 3.0, 4.0]
    """
    out = np.zeros((k, len(kappa)))
    small: list[float] = []   # the k smallest kappa(b), low < b < i
    for i in range(low + 1, len(kappa)):
        sums = np.concatenate([[0.0], np.cumsum(small)])
        for s in range(1, k):
            out[s, i] = kappa[i] + sums[min(len(small), max(0, s - 1 - low))]
        insort(small, float(kappa[i]))
        del small[k:]
    return out


def _stage_costs(terms, order, empty: float = 0.0) -> np.ndarray:
    """The largest of :func:`_set_costs` over ``terms`` (:func:`_atom_terms` per set) in ``order``."""
    return _set_costs(*np.stack([x[:, order] for x in terms], axis=1), empty=empty)


def _atom_terms(atom, head, work, tail, n: int) -> np.ndarray:
    """Per forward op (``n`` ops of the step): least head, work and least tail of its set's copies."""
    out = np.zeros((3, n))
    out[(0, 2), :] = np.inf
    np.minimum.at(out[0], atom, head)
    np.add.at(out[1], atom, work)
    np.minimum.at(out[2], atom, tail)
    return out


def _set_costs(head: np.ndarray, work: np.ndarray, tail: np.ndarray, empty: float = 0.0) -> np.ndarray:
    """``c[i, j]``: least head + work + least tail of forward ops ``i..j-1``
    (``inf`` for ``i >= j``; ``empty`` when they hold no copy of the set);
    with one row per set (2-d arrays), the largest over the sets.

    >>> _set_costs(np.array([0., 5]), np.array([2., 3]), np.array([9., 1])).tolist()   # [0, 2): 0 + 5 + 1
    [[inf, 11.0, 6.0], [inf, inf, 9.0], [inf, inf, inf]]
    """
    head, work, tail = (np.atleast_2d(x) for x in (head, work, tail))
    n = head.shape[1]
    c = np.full((n + 1, n + 1), np.inf)
    pre = np.concatenate([np.zeros((len(work), 1)), np.cumsum(work, axis=1)], axis=1)
    for i in range(n):   # row i: blocks i..j-1 for j > i
        low_head = np.minimum.accumulate(head[:, i:], axis=1)
        row = low_head + (pre[:, i + 1:] - pre[:, i:i + 1]) + np.minimum.accumulate(tail[:, i:], axis=1)
        c[i, i + 1:] = np.max(np.where(np.isfinite(low_head), row, empty), axis=0)
    return c
