"""Pesto's split graph -> TensorFlow's split step: the name map, and enforcing a micro-batched plan.

``pesto.solve(step, micro_batches=M)`` places Pesto's own split of the
un-split step (:func:`pesto.step.split`: copies ``op@mb<i>``,
accumulations ``t@acc<k>``); TensorFlow builds the split step itself
(:mod:`tf_patch.microstep`: ``mb<i>/...``). :func:`slice_map` maps the first
onto the second; :func:`place_split` turns a Pesto plan into a plan of the TF
split step (profiled at the micro-batch size) that :func:`tf_patch.apply_plan`
enforces.

The naming rule (graph-mode steps: the zoo)
-------------------------------------------
For un-split op ``op`` and slice ``i``, the TF ops tried in this order (the
first that exists with ``op``'s type is the one):

* ``mb<i>/<op>``: a forward op (``mb<i>/rnn/layer_0/t1/MatMul``), and the
  per-slice copies of once-per-step ops the slice builds again (a weight's
  ``ReadVariableOp``, a constant);
* for ``gradients/<rest>``: ``gradients/mb<i>/mb<i>/<rest>`` (a gradient op
  named after its forward op, ``..._grad/...``), then
  ``gradients/mb<i>/<rest>`` (the seed, ``Shape``, ``AddN``);
* a copy ``op@mb<i>`` maps to that op; a once-per-step op ``op`` maps to
  ``op`` itself when the TF step has it (variables, the optimizer), else to
  every slice's op above (a once-per-step op of the un-split step that the
  TF step builds once per slice: all get its device);
* a data input's copy ``inp@mb<i>`` (TF splits the whole input instead):
  the ``Split`` op ``microbatch/<inp>`` (slice 0's also ``inp`` itself);
* a recomputed copy ``op@rc@mb<i>`` (:func:`pesto.step.recompute`, role
  ``"recompute"``): ``recompute/<T>``, the TF copy of slice ``i``'s op ``T``
  of ``op`` that :mod:`tf_patch.recompute` builds (:data:`RECOMPUTE`);
* an accumulation ``t@acc<k>`` (slices ``0..k`` of tensor ``t`` summed): the
  once-per-step consumer ``c`` of ``t`` in the un-split step (an optimizer
  update) reads, in the TF step, an op under ``accumulate/<variable>/``
  (the one whose variable ``c`` names, if it reads several); ``t@acc<k>``
  maps to ``accumulate/<variable>/add_<k>`` (the dense chain, which sums
  slices ``0..k`` as Pesto's does) or, when there is no such op (a sparse
  gradient: Pesto's one concatenation ``t@acc<M-1>`` of every slice's rows
  or indices), to the op ``c`` reads (``accumulate/<variable>/values`` or
  ``/indices``).
* slice ``k``'s copy ``op@mb<k>`` of a weight gradient the plan sums in
  place (``weight_grads="accumulate"``, :attr:`ResultView.in_place`: copy
  ``k`` reads copy ``k - 1``'s partial and adds its own into it): its TF
  copy and, for ``k >= 1``, the chain's ``accumulate/<variable>/add_<k>``
  that reads that copy (both on the copy's device; a sparse gradient's
  concatenation or a partial no chain sums: the copy alone). The cost rule
  (:func:`pesto.step.split`): the sum costs nothing beyond the copy. That
  holds on a GPU where the add fuses into the GEMM (XLA's GEMM rewriter
  folds an addend into cuBLAS's ``beta = 1``; Megatron-LM calls the GEMM so
  by hand); TensorFlow without XLA runs the ``AddV2`` after the ``MatMul``,
  which the TF step's own costs (the re-solve of :func:`place_split`) charge;
* a weight gradient run whole ``op@all`` (a plan's ``weight_grads="whole"``,
  :attr:`ResultView.joined`): the op TF's split step runs it as,
  ``whole/<variable>/MatMul`` (``tf_patch.LossStep(whole=...)``), which the
  caller names (:func:`slice_map`'s ``whole``: the names say no variable).

What maps to nothing is listed, never dropped: TF ops no Pesto op maps to
(the ``microbatch/`` input splits and loss sum, each slice's
``scaled_loss`` and its gradient, concat axes) and Pesto ops with no TF
counterpart. :func:`mapped_hint` gives the former a device (a neighbour's)
so that the whole TF step has a placement to start the re-solve from.

Examples
--------
>>> slice_candidates("gradients/rnn/t0/MatMul_grad/MatMul", 1)
('mb1/gradients/rnn/t0/MatMul_grad/MatMul', 'gradients/mb1/mb1/rnn/t0/MatMul_grad/MatMul', 'gradients/mb1/rnn/t0/MatMul_grad/MatMul')
"""
from __future__ import annotations

from . import needs_tf  # noqa: F401  (an ImportError naming the tf extra without TensorFlow)
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from pesto import evaluate, solve
from pesto.errors import MicroBatchError
from pesto.graph import OpGraph
from pesto.step import Origin
from pesto.step.recompute import RESERVED
from pesto.step.slicing import copy_name, parse_name

__all__ = ["SliceMap", "slice_map", "slice_candidates", "mapped_hint", "SplitPlacement", "place_split",
           "GRADIENT_ROOTS", "ResultView", "result_view", "split_candidates", "Rescored", "Rescoring",
           "rescore_split", "RECOMPUTE", "TF_SAVERS", "recomputes", "recomputed_op", "summed_in_place"]

#: First name components of graph-mode and tape gradient scopes.
GRADIENT_ROOTS = ("gradients", "gradient_tape")
#: Scope of the TF copy of op ``t`` that a recomputed Pesto copy runs (:mod:`tf_patch.recompute`).
RECOMPUTE = "recompute/"
#: The memory savers (:attr:`Strategy.savers` words) whose TF step tf_patch builds: the sharded
#: optimizer (:func:`tf_patch.replicastep.replicate_graph`) and recomputation (:mod:`tf_patch.recompute`:
#: every block or its cheap ops, "recompute(k/n:...)" some blocks, "recompute(k/n:...)+cheap(j/n:...)"
#: blocks at mixed levels: the word before the parenthesis; the copies are the plan's own),
#: alone or together (the copies built on the sharded replicated step). Every combination the search can
#: pick is among them (``tests/test_tf_savers.py``).
TF_SAVERS = frozenset({"ZeRO-1", "ZeRO-2", "ZeRO-3", "recompute", "recompute-cheap"})


@dataclass(frozen=True)
class ResultView:
    """What tf_patch reads of a ``pesto.solve_step`` result (:func:`result_view`).

    Attributes
    ----------
    plan : Plan
        Over ``graph``'s ops.
    graph : OpGraph
        The graph the plan places (the step, Pesto's split of it, or its replicated form).
    micro_batches, replicas : int
    graph_kind : str
        ``"step"``, ``"micro-batched"`` or ``"replicated"``.
    steps : mapping name -> µs
        Every candidate's step (``plan.log.steps``, else the result's
        ``steps``: ``"M=1"``, ``"M=4"``,
        ``"gpipe M=4"``, ``"data-parallel"``, ``"hybrid R=2 M=2"``).
    skipped : mapping name -> str
        The candidates left out, and why (``plan.log.skipped``).
    origin : mapping op -> Origin, or None
        Each op of ``graph``'s origin in the step (``Solved.transformed.origin``);
        None when the result kept no transform (then names are read by the naming rule).
    joined : tuple of str
        The step's weight-gradient ops the plan runs once over every slice
        (``Strategy.joined``, else ``plan.log.joined``): TF's split step
        builds them so (``LossStep(whole=...)``, :meth:`tf_patch.FunctionStep.apply`).
    in_place : tuple of str
        The step's weight-gradient ops the plan sums in place
        (``plan.log.in_place``, else read from ``graph``: a copy ``op@mb1``
        that reads ``op@mb0``): each copy maps with the add of TF's
        accumulation chain that sums it (:func:`slice_map`).
    """

    plan: object
    graph: object
    micro_batches: int
    replicas: int
    graph_kind: str
    steps: Mapping[str, float] = field(default_factory=dict)
    skipped: Mapping[str, str] = field(default_factory=dict)
    origin: Mapping[str, Origin] | None = None
    joined: tuple = ()
    in_place: tuple = ()


def result_view(result) -> ResultView:
    """The one place tf_patch reads ``pesto.solve_step``'s result (so a change
    of its type is adapted here only). A plan with memory savers
    (``plan.log.savers``) other than :data:`TF_SAVERS` (a sharded optimizer,
    :mod:`tf_patch.replicastep`; recomputation, :mod:`tf_patch.recompute`;
    both) raises :class:`~pesto.errors.MicroBatchError` naming them: their
    TensorFlow step is not built.

    >>> class R: plan, graph, micro_batches, replicas, graph_kind = None, None, 2, 1, "micro-batched"
    >>> result_view(R()).graph_kind
    'micro-batched'
    """
    if isinstance(result, ResultView):
        return result
    log = getattr(result.plan, "log", None)
    savers = getattr(log, "savers", "")
    # "recompute(3/4:0-1,3)": some blocks; "recompute-cheap": their cheap ops; "recompute(1/4:0)+cheap(2/4:1-2)":
    # each block at its level (all built as recompute is: from the plan's copies)
    words = [w.partition("(")[0] for w in (savers or "").split()]
    unbuilt = " ".join(w for w in words if w not in TF_SAVERS)
    if unbuilt:   # the search chose them because nothing else fit memory
        raise MicroBatchError(f"the plan uses memory savers ({unbuilt}) that tf_patch does not build in "
                              f"TensorFlow (it builds {', '.join(sorted(TF_SAVERS))}); no plan "
                              f"without them fits memory", culprit=unbuilt)
    steps = getattr(log, "steps", None) or getattr(result, "steps", None) or {}
    kept = getattr(result, "transformed", None)
    joined = getattr(getattr(result, "strategy", None), "joined", None) or getattr(log, "joined", ())
    in_place = getattr(log, "in_place", ()) or summed_in_place(result.graph)
    return ResultView(result.plan, result.graph, int(result.micro_batches), int(result.replicas),
                      str(result.graph_kind), MappingProxyType(dict(steps)),
                      MappingProxyType(dict(getattr(log, "skipped", None) or {})),
                      None if kept is None else kept.origin, tuple(joined or ()), tuple(in_place))


def summed_in_place(graph) -> tuple:
    """The step ops whose slices a split graph sums in place (:func:`pesto.step.split`'s
    ``"accumulate"``: copy ``op@mb1`` reads copy ``op@mb0``, nothing else joins two slices'
    copies of one op), sorted; () for a graph without edges (names only).

    >>> from pesto.graph import OpGraph
    >>> summed_in_place(OpGraph.from_edges({"w@mb0": 1, "w@mb1": 1, "x@mb1": 1}, [("w@mb0", "w@mb1")]))
    ('w',)
    """
    if not hasattr(graph, "predecessors"):
        return ()
    out = set()
    for name in graph.names:
        o = parse_name(name)
        if o.role == "copy" and o.slice == 1 and copy_name(o.op, 0) in graph.predecessors(name):
            out.add(o.op)
    return tuple(sorted(out))


def recomputes(origin: Mapping | None) -> bool:
    """Whether a kept transform's origins (``ResultView.origin``) hold recomputed copies
    (role ``"recompute"``: :func:`pesto.step.recompute`, built in TF by :mod:`tf_patch.recompute`)."""
    return origin is not None and any(o.role == "recompute" for o in origin.values())


def recomputed_op(name: str) -> str | None:
    """The op a recomputed Pesto copy ``name`` runs again (its name without ``@rc``),
    or None when ``name`` is no such copy.

    >>> recomputed_op("layer_0/MatMul@rc@mb1"), recomputed_op("layer_0/MatMul@rc"), recomputed_op("x@mb1")
    ('layer_0/MatMul@mb1', 'layer_0/MatMul', None)
    """
    return RESERVED.sub(r"\1", name, count=1) if RESERVED.search(name) else None


def slice_candidates(op: str, i: int) -> tuple[str, ...]:
    """The TF names slice ``i``'s copy of un-split op ``op`` may have, in the
    order tried (module doc)."""
    out = [f"mb{i}/{op}"]
    root, _, rest = op.partition("/")
    if root in GRADIENT_ROOTS and rest:
        out += [f"{root}/mb{i}/mb{i}/{rest}", f"{root}/mb{i}/{rest}"]
    return tuple(out)


@dataclass(frozen=True)
class SliceMap:
    """Pesto's split graph mapped onto TensorFlow's split step (:func:`slice_map`).

    Attributes
    ----------
    micro_batches : int
    ops : mapping Pesto op -> tuple of TF ops
        Every Pesto op that has a TF counterpart (one op, or every slice's
        copy of a once-per-step op the TF step builds per slice).
    unmapped_tf : tuple of str
        TF ops of the split step no Pesto op maps to.
    unmapped_pesto : tuple of str
        Pesto ops with no TF counterpart.
    """

    micro_batches: int
    ops: Mapping[str, tuple]
    unmapped_tf: tuple
    unmapped_pesto: tuple

    @property
    def target(self) -> str:
        """What the TF step is, for :meth:`summary`."""
        return f"{self.micro_batches}-slice step"

    def placement(self, placement: Mapping[str, str]) -> dict:
        """``{TF op: device}`` of the mapped TF ops from a Pesto placement
        (several Pesto ops on one TF op: the last in map order wins)."""
        return {t: placement[p] for p, ts in self.ops.items() if p in placement for t in ts}

    def summary(self) -> str:
        """One line: what was mapped and what was not (counted, a few named)."""
        def few(names):
            return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        mapped = len({t for ts in self.ops.values() for t in ts})
        out = f"{len(self.ops)} Pesto ops -> {mapped} TF ops of the {self.target}"
        if self.unmapped_tf:
            out += f"; {len(self.unmapped_tf)} TF ops with no Pesto op ({few(self.unmapped_tf)})"
        if self.unmapped_pesto:
            out += f"; {len(self.unmapped_pesto)} Pesto ops with no TF op ({few(self.unmapped_pesto)})"
        return out


def slice_map(step: OpGraph, split_names, tf_split: OpGraph, micro_batches: int,
              whole: Mapping[str, str] | None = None, in_place=()) -> SliceMap:
    """Map the ops of Pesto's split of ``step`` onto TF's split step.

    Parameters
    ----------
    step : OpGraph
        The un-split TF step Pesto split (:func:`tf_patch.extract.extract`'s
        names, batch marks), for its types and the consumers of the partials.
    split_names : iterable of str, or mapping op -> Origin
        The ops of Pesto's split graph: with their origins
        (``Solved.transformed.origin``), else names only (``Solved.graph.names``,
        or the keys of its plan's placement), read by the naming rule
        (:func:`pesto.step.slicing.parse_name`).
    tf_split : OpGraph
        The TF split step of ``micro_batches`` slices (extracted).
    micro_batches : int
    whole : mapping op -> TF op, optional
        For each step op the split runs once over every slice (``op@all``,
        role ``"whole"``), the TF op that does (``whole/<variable>/MatMul``,
        :meth:`tf_patch.FunctionStep.apply` knows it from the variable); a
        whole op not in it maps to nothing (listed).
    in_place : iterable of str, optional
        The step ops whose slices the split sums in place
        (:attr:`ResultView.in_place`): copy ``k >= 1`` maps to its TF copy and
        the ``add_<k>`` of TF's chain that sums it (module doc).

    Returns
    -------
    SliceMap

    Examples
    --------
    >>> from pesto.graph import Op, OpGraph
    >>> step = OpGraph([Op("x", {"CPU": 1.0}, batch=True, type="Relu"), Op("w", {"CPU": 1.0}, batch=False)])
    >>> tf = OpGraph([Op(n, {"CPU": 1.0}, type=t) for n, t in
    ...               [("mb0/x", "Relu"), ("mb1/x", "Relu"), ("w", ""), ("microbatch/in", "Split")]])
    >>> m = slice_map(step, ["x@mb0", "x@mb1", "w"], tf, 2)
    >>> dict(m.ops), m.unmapped_tf
    ({'x@mb0': ('mb0/x',), 'x@mb1': ('mb1/x',), 'w': ('w',)}, ('microbatch/in',))
    """
    have, in_place = set(tf_split.names), frozenset(in_place)
    ops: dict[str, tuple] = {}
    origins = split_names if isinstance(split_names, Mapping) else {n: parse_name(n) for n in split_names}
    for name, origin in origins.items():
        if origin.role == "copy":
            found = _copy(step, tf_split, have, origin.op, origin.slice)
            found = (found,) if found is not None else _input(have, origin.op, origin.slice)
            if origin.op in in_place and origin.slice and found:   # the add summing it, fused into its GEMM
                found += tuple(a for a in tf_split.successors(found[0])
                               if a.startswith("accumulate/") and a.endswith(f"/add_{origin.slice}"))
        elif origin.role == "accumulate":
            found = _accumulation(step, tf_split, have, origin.tensor, origin.slice)
        elif origin.role == "recompute":   # the TF copy of the op it runs again (tf_patch.recompute)
            c = _copy(step, tf_split, have, origin.op, origin.slice or 0)
            found = (RECOMPUTE + c,) if c is not None and RECOMPUTE + c in have else ()
        elif origin.role == "whole":
            found = tuple(t for t in [(whole or {}).get(origin.op)] if t in have)
        elif name in have:
            found = (name,)
        else:
            found = tuple(c for i in range(micro_batches)
                          if (c := _copy(step, tf_split, have, name, i)) is not None)
        if found:
            ops[name] = found
    hit = {t for ts in ops.values() for t in ts}
    return SliceMap(micro_batches, MappingProxyType(ops), tuple(n for n in tf_split.names if n not in hit),
                    tuple(n for n in origins if n not in ops))


def _copy(step: OpGraph, tf_split: OpGraph, have: set, op: str, i: int) -> str | None:
    """The TF op of slice ``i`` that is un-split ``op`` (the naming rule), or None."""
    kind = step.op(op).type if op in step else None
    for cand in slice_candidates(op, i):
        if cand in have and (not kind or tf_split.op(cand).type == kind):
            return cand
    return None


def _input(have: set, op: str, i: int) -> tuple:
    """A data input's slice ``i``: the ``Split`` ``microbatch/<input>`` that
    cuts it (and for slice 0 the input itself), or ()."""
    split = f"microbatch/{op.rsplit('/', 1)[-1]}"
    if split not in have:
        return ()
    return (op, split) if i == 0 and op in have else (split,)


def _accumulation(step: OpGraph, tf_split: OpGraph, have: set, tensor: str, k: int) -> tuple:
    """The TF op that sums slices ``0..k`` of ``tensor`` (module doc), as a 1-tuple, or ()."""
    src = tensor.rsplit(":", 1)[0]
    once = [d for d in step.successors(src) if tensor in step.edge(src, d).tensors and not step.op(d).batch]
    for consumer in once:
        if consumer not in have:
            continue
        feeds = [p for p in tf_split.predecessors(consumer) if p.startswith("accumulate/")]
        if len(feeds) > 1:  # a consumer reading several sums: the one of its own variable
            feeds = [p for p in feeds if _scope(p).removeprefix("accumulate/") in consumer]
        if len(feeds) != 1:
            continue
        chain = f"{_scope(feeds[0])}/add_{k}"
        return (chain,) if chain in have else (feeds[0],)
    return ()


def _scope(name: str) -> str:
    """``accumulate/<variable>`` of an accumulation op's name (its last component dropped;
    a sparse sum's ``values``/``indices`` are that component)."""
    return name.rsplit("/", 1)[0]


def mapped_hint(mapped: Mapping[str, str], tf_split: OpGraph, default: str) -> dict:
    """A placement of every op of ``tf_split``: ``mapped`` where given; an
    unmapped op takes its first placed predecessor's device (in topological
    order), else its first placed successor's, else ``default``; then each
    colocation group goes where most of its members are (the first such
    device on a tie), as TensorFlow requires.

    >>> from pesto.graph import OpGraph
    >>> g = OpGraph.from_edges({"a": 1, "b": 1, "c": 1}, [("a", "b", 8), ("c", "b", 8)])
    >>> sorted(mapped_hint({"b": "/GPU:1"}, g, "/GPU:0").items())
    [('a', '/GPU:1'), ('b', '/GPU:1'), ('c', '/GPU:1')]
    """
    out = {n: d for n, d in mapped.items() if n in tf_split}
    order = tf_split.topological_order()
    for n in order:
        if n not in out:
            d = next((out[p] for p in tf_split.predecessors(n) if p in out), None)
            if d is not None:
                out[n] = d
    for n in reversed(order):
        if n not in out:
            out[n] = next((out[s] for s in tf_split.successors(n) if s in out), default)
    groups: dict[str, list] = {}
    for op in tf_split.ops:
        if op.colocation_group is not None:
            groups.setdefault(op.colocation_group, []).append(op.name)
    for members in groups.values():
        devices = [out[m] for m in members]
        best = max(dict.fromkeys(devices), key=devices.count)
        out.update(dict.fromkeys(members, best))
    return out


@dataclass(frozen=True)
class SplitPlacement:
    """A Pesto plan of a micro-batched step carried onto TF's split step (:func:`place_split`).

    Attributes
    ----------
    plan : Plan
        Over ``tf_split``'s ops (every one, so it is enforced 1:1): the
        solve of ``tf_split`` started from ``hint``.
    hint : Plan
        The mapped placement scored on ``tf_split`` (TF's default order).
    slices : SliceMap
    pesto_step : float
        The step (µs) of the Pesto plan mapped, on Pesto's split graph.
    """

    plan: object
    hint: object
    slices: SliceMap
    pesto_step: float


def place_split(result, step: OpGraph, tf_split: OpGraph, cluster, *, time_limit: float = 10.0,
                workers: int | None = 1, seed: int = 0, whole: Mapping[str, str] | None = None) -> SplitPlacement:
    """Solve TF's split step, the graph TF will run, from ``pesto.solve_step``'s ``result``.

    Maps ``result.plan`` (over ``result.graph``, Pesto's split of ``step``)
    with :func:`slice_map`, completes it with :func:`mapped_hint`, and
    solves ``tf_split`` (traced split into ``M`` slices, its ops costed at
    the micro-batch size: grappler or measured) with ``micro_batches=1`` and
    that placement as ``hint=`` (``pesto.solve``: it joins the starts, so the
    plan is never slower than the mapped one on ``tf_split``). The plan
    places every op of ``tf_split``: applied 1:1, no op unmapped. ``whole``:
    :func:`slice_map`'s (the TF ops of the plan's joined weight gradients).
    :meth:`tf_patch.FunctionStep.apply` does this for a Keras or
    ``tf.function`` step; the demo for the zoo models.

    Raises
    ------
    ValueError
        ``result`` recomputes activations and ``tf_split`` has no copies
        (:func:`tf_patch.recompute.recompute_model` builds them); or
        ``result`` is a replicated plan (data-parallel or hybrid): it runs on
        TF's replicated step, not the split step; the message names the
        functions that build and place that one
        (:func:`tf_patch.replicate_model`, :meth:`tf_patch.FunctionStep.apply`).
    """
    result = result_view(result)
    if result.graph_kind not in ("micro-batched", "step"):
        k = result.replicas * result.micro_batches
        raise ValueError(f"a {result.graph_kind!r} plan ({result.replicas} replicas x {result.micro_batches} "
                         f"micro-batch(es)) runs on TF's replicated step, not on a split step: for a zoo model "
                         f"tf_patch.replicate_model(build_model(..., micro_batches={k}), result) gives the "
                         "model and its plan; a Keras or tf.function step takes the result itself "
                         "(FunctionStep.apply(result))")
    if recomputes(result.origin) and not any(n.startswith(RECOMPUTE) for n in tf_split.names):
        raise ValueError("the plan recomputes activations: place the TF step with its copies, "
                         "tf_patch.recompute_model(model, result, step, tf_split) for a zoo model "
                         "(FunctionStep.apply(result) builds them itself)")
    slices = slice_map(step, result.origin or result.graph.names, tf_split, result.micro_batches, whole,
                       result.in_place)
    placement = result.plan.placement
    if result.graph_kind == "step":  # M = 1: the names are the TF step's own
        own = {n: n if recomputed_op(n) is None else RECOMPUTE + recomputed_op(n) for n in placement}
        slices = SliceMap(1, MappingProxyType({n: (t,) for n, t in own.items() if t in tf_split}),
                          tuple(n for n in tf_split.names if n not in set(own.values())),
                          tuple(n for n, t in own.items() if t not in tf_split))
    hint = evaluate(tf_split, mapped_hint(slices.placement(placement), tf_split, cluster.names[0]),
                    cluster=cluster)
    plan = solve(tf_split, cluster=cluster, hint=hint, time_limit=time_limit, workers=workers, seed=seed,
                 micro_batches=1)
    return SplitPlacement(plan, hint, slices, result.plan.makespan)


#: Names of ``plan.log.steps`` that are a split step of one replica: ``M=4``, ``gpipe M=4``, ``slice M=4``.
_SPLIT = re.compile(r"^(?:[a-z0-9]+ )?M=(\d+)$")


def split_candidates(result, top: int = 3) -> list[tuple[int, float]]:
    """The ``top`` best micro-batched counts (``M`` > 1, one replica) of a
    ``pesto.solve_step`` result: ``(M, µs)`` by its figure (Pesto's split of
    the un-split profile: each slice costs compute/M), best first; then, to
    fill ``top``, counts it skipped (NaN).

    >>> steps = {"M=1": 9.0, "M=2": 7.0, "gpipe M=2": 6.0, "M=4": 8.0, "data-parallel": 5.0}
    >>> split_candidates(ResultView(None, None, 1, 1, "step", steps, {"M=8": "time limit"}))
    [(2, 6.0), (4, 8.0), (8, nan)]
    """
    view, best = result_view(result), {}
    for name, us in view.steps.items():
        m = _SPLIT.match(name)
        if m and int(m.group(1)) > 1 and not name.startswith(("data-parallel", "hybrid")):
            best[int(m.group(1))] = min(us, best.get(int(m.group(1)), float("inf")))
    out = sorted(best.items(), key=lambda kv: kv[1])[:top]
    for name in view.skipped:
        m = _SPLIT.match(name)
        if m and int(m.group(1)) > 1 and int(m.group(1)) not in best and len(out) < top:
            best[int(m.group(1))] = float("nan")
            out.append((int(m.group(1)), float("nan")))
    return out


@dataclass(frozen=True)
class Rescored:
    """One micro-batch count re-scored on TF's traced split step (:func:`rescore_split`).

    ``estimate``: ``pesto.solve_step``'s figure (µs; compute/M slices of the
    un-split profile; NaN when it skipped the count); ``traced``: the step of
    ``plan``, solved on ``graph``, TF's split step of ``micro_batches``
    slices costed at the micro-batch size.
    """

    micro_batches: int
    estimate: float
    traced: float
    plan: object
    graph: OpGraph


@dataclass(frozen=True)
class Rescoring:
    """``auto``'s choice re-scored on the graphs TF runs (:func:`rescore_split`).

    Attributes
    ----------
    rows : tuple of Rescored
        The split counts re-scored, best ``estimate`` first.
    unsplit : float
        The un-split step's figure (µs; its graph is the one TF runs: solved
        here when ``result`` has no figure for it).
    replicated : tuple of (name, µs)
        The best data-parallel or hybrid candidate's figure (Pesto's
        replicated graph; TF's replicated step is not traced here), or ().
        It competes only when ``result`` itself is that replicated plan (the
        one replicated plan at hand to train); else it is shown, not chosen.
    best : str
        ``"M=<m>"`` (a row), ``"M=1"`` or the replicated candidate's name.
    """

    rows: tuple
    unsplit: float
    replicated: tuple
    best: str

    @property
    def row(self) -> Rescored | None:
        """The winning row, or None when the winner is not split."""
        return next((r for r in self.rows if f"M={r.micro_batches}" == self.best), None)

    def table(self) -> str:
        """Per count: the compute/M estimate next to the traced-graph figure (ms), and the choice."""
        lines = [f"         {'candidate':<22}{'compute/M':>10}{'traced':>10}   (ms)"]
        lines.append(f"         {'M=1':<22}{self.unsplit / 1000:>10.3f}{self.unsplit / 1000:>10.3f}")
        for r in self.rows:
            lines.append(f"         {f'M={r.micro_batches}':<22}{r.estimate / 1000:>10.3f}{r.traced / 1000:>10.3f}")
        if self.replicated:
            lines.append(f"         {self.replicated[0]:<22}{self.replicated[1] / 1000:>10.3f}{'-':>10}"
                         "   (Pesto's replicated graph)")
        return "\n".join(lines + [f"         best on the traced graphs: {self.best}"])


def rescore_split(result, step: OpGraph, trace, cluster, *, top: int = 3, time_limit: float = 5.0,
                  workers: int | None = 1, seed: int = 0) -> Rescoring:
    """Re-score ``micro_batches="auto"``'s split counts on TF's split steps.

    For each of :func:`split_candidates` ``(result, top)``, ``trace(M)`` gives
    TF's split step of ``M`` slices (an OpGraph costed at the micro-batch
    size: grappler or measured, on ``cluster``'s kind), which is solved
    within ``time_limit`` seconds: from ``result``'s own plan mapped onto it
    (:func:`place_split`) when that is the count ``result`` chose (and it
    recomputes nothing: a traced step has no copies), else by
    ``pesto.solve``. The best of those, the un-split step (``"M=1"``: its
    graph ``step`` is the one TF runs, solved too when ``result`` skipped it)
    and, when ``result`` is replicated, its own figure is :attr:`Rescoring.best`
    (a split winner whose traced step loses to the un-split step is not chosen).
    """
    view, rows = result_view(result), []
    for m, estimate in split_candidates(view, top):
        tf_split = trace(m)
        if view.graph_kind == "micro-batched" and view.micro_batches == m and not recomputes(view.origin):
            plan = place_split(view, step, tf_split, cluster, time_limit=time_limit, workers=workers,
                               seed=seed).plan
        else:
            plan = solve(tf_split, cluster=cluster, time_limit=time_limit, workers=workers, seed=seed,
                         micro_batches=1)
        rows.append(Rescored(m, estimate, plan.makespan, plan, tf_split))
    unsplit = view.plan.makespan if view.graph_kind == "step" else view.steps.get("M=1")
    if unsplit is None:   # the time limit left the un-split step out: solve it too (it is the graph TF runs)
        unsplit = solve(step, cluster=cluster, time_limit=time_limit, workers=workers, seed=seed).makespan
    rep = [(n, us) for n, us in view.steps.items() if n.startswith(("data-parallel", "hybrid"))]
    replicated = min(rep, key=lambda kv: kv[1]) if rep else ()
    figures = {f"M={r.micro_batches}": r.traced for r in rows}
    figures["M=1"] = unsplit
    if replicated and view.graph_kind == "replicated":   # only the result's own replicated plan is at hand
        figures[replicated[0]] = replicated[1]
    return Rescoring(tuple(rows), unsplit, replicated, min(figures, key=figures.get))
