"""Baselines a user would pick instead of a planner, each at its best micro-batch count.

Three placers, registered in :mod:`solver.registry` beside ``gpipe``,
``1f1b`` and ``data-parallel`` (their plans place the transformed step, so
they are no baselines of the placement pipeline):

* ``megatron`` (:func:`megatron_plan`): the hand configuration of a
  Megatron-LM user. Every factorisation ``PP x DP`` of the GPUs (``PP = 1``:
  data parallelism, :func:`~solver.parallel.pipelines.data_parallel_plan`;
  ``DP = 1``: a pipeline, :func:`~solver.parallel.pipelines.pipeline_plan`;
  else :func:`~solver.parallel.hybrid.hybrid_plan`, consecutive GPUs per
  pipeline), the model's layers split **uniformly by count** over the ``PP``
  stages (:func:`uniform_stages`: the hand rule, not a cut by cost), each
  schedule of :func:`megatron_schedules` (1F1B, and the interleaved ones
  :data:`~solver.parallel.schedules.SCHEDULES` holds), every count ``M``
  below. A configuration that does not fit memory is re-run with activation
  recomputation (:func:`pesto.step.recompute`, every layer block), and both
  are said (:attr:`UserChoice.tried`).
* ``zero-dp`` (:func:`zero_plan`): one replica per GPU with sharded state,
  what a DeepSpeed or FSDP user tries in turn until it fits memory: ZeRO-1,
  ZeRO-2, ZeRO-3 (the parameters sharded: FSDP), then ZeRO-2 and ZeRO-3
  with activation recomputation, each realised by
  :func:`~solver.parallel.realise.realise` of
  ``Strategy(replicas=GPUs, micro_batches=M, shard_optimizer=level, recompute=...)``.
* ``best-pipeline`` (:func:`best_pipeline_plan`): the best of every schedule
  of :data:`~solver.parallel.schedules.SCHEDULES` (GPipe, 1F1B, and the
  split-backward ones once registered) with
  :func:`~solver.parallel.pipelines.pipeline_plan`'s own stage cuts.

**Counts.** ``M`` runs over the divisors of the batch a pipeline replica gets
(``batch_size / DP``) up to ``max_micro`` (default
:data:`MAX_MICRO`, the cap of ``micro_batches="auto"``); without a batch size,
1, 2, 4, 8, 16 up to the cap. **Choice.** Among every configuration tried,
the plan that fits memory first, then the shortest step
(:func:`solver.common.rank`).

**Layers** (:func:`layer_groups`): the batched forward ops grouped by their
scope cut at depth ``d`` (as the pipeline cutter's block orders,
:func:`~solver.parallel.pipelines.blockings`); the layers are the groups whose
last scope part ends in a number (``layer_3``, ``rnn/layer_0``,
``encoder/layer_1``), at the smallest depth that has at least as many of them
as stages. Layers are taken in the cutter's pipeline order and split into
``PP`` contiguous runs of equal count (the first ``L mod PP`` runs one layer
longer: Megatron-LM asks ``PP`` to divide ``L``; an uneven model still gets
the hand split). Every other group (embedding, head, loss) goes with the
nearest layer before it in that order (the first layer for those before all
layers); backward ops with the forward op they differentiate
(:func:`~solver.parallel.pipelines.phases`' anchors).

Examples
--------
>>> from pesto.graph import Op, OpGraph, Tensor, Edge
>>> from pesto.cluster import gpus
>>> names = ["layer_0/f", "layer_1/f", "layer_2/f", "layer_2/d", "layer_1/d", "layer_0/d"]
>>> ops = [Op(n, {"GPU": 10.0}, output_bytes=8, batch=True, scope=n.split("/")[0],
...           phase="forward" if n.endswith("f") else "input-grad",
...           anchor=None if n.endswith("f") else n[:-1] + "f") for n in names]
>>> es = [Edge(a, b, f"{a}:0") for a, b in zip(names, names[1:])]
>>> g = OpGraph(ops, es, [Tensor(f"{n}:0", n, 8) for n in names])
>>> uniform_stages(g, 2)   # 3 layers over 2 stages: 2 + 1
(0, 0, 1, 1, 0, 0)
>>> r = megatron_plan(g, gpus(2), batch_size=4)
>>> r.config, [t.config for t in r.tried][:3]
('data-parallel DP=2 M=1', ['data-parallel DP=2 M=1', 'data-parallel DP=2 M=2', '1f1b PP=2 M=1 DP=1'])
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

from pesto.cluster import Cluster
from pesto.errors import PestoError
from pesto.graph import OpGraph
from pesto.plan import Plan
from pesto.step.recompute import recompute

from ..common import rank
from .hybrid import hybrid_plan
from .cut import Phases, blockings, phases
from .pipelines import CANDIDATES, data_parallel_plan, gpu_names, pipeline_plan
from .realise import realise, solved_of
from .schedules import SCHEDULES
from .strategy import Solved, Strategy

__all__ = ["UserChoice", "Tried", "layer_groups", "uniform_stages", "megatron_schedules", "micro_counts",
           "megatron_plan", "zero_plan", "best_pipeline_plan", "place_megatron", "place_zero_dp",
           "place_best_pipeline", "MAX_MICRO", "ZERO_LEVELS", "PLANS"]

#: Largest micro-batch count screened (the cap of ``micro_batches="auto"``,
#: :data:`solver.parallel.search.AUTO_MAX`).
MAX_MICRO = 16
_LAYER = re.compile(r"\d+$")


@dataclass(frozen=True)
class Tried:
    """One configuration a baseline tried: its step (µs; None: not built) and memory fit."""

    config: str
    step: float | None
    fits: bool | None
    note: str = ""


@dataclass(frozen=True)
class UserChoice:
    """A baseline's winner and every configuration it tried.

    Attributes
    ----------
    baseline : str
        ``"megatron"``, ``"zero-dp"`` or ``"best-pipeline"``.
    solved : Solved
        The winning plan with the graph it places.
    config : str
        The winner's configuration (``"1f1b PP=4 M=8 DP=2"``).
    tried : tuple of Tried
    """

    baseline: str
    solved: Solved
    config: str
    tried: tuple

    @property
    def plan(self) -> Plan:
        return self.solved.plan

    @property
    def fits(self) -> bool:
        return self.solved.plan.status != "infeasible"


def strategy_takes(**fields) -> str:
    """Why :class:`~solver.parallel.strategy.Strategy` refuses ``fields`` ("" when it takes them).

    >>> strategy_takes(replicas=2)
    ''
    """
    try:
        Strategy(**fields)
    except ValueError as exc:
        return str(exc)
    return ""


def micro_counts(batch_size: int | None, replicas: int = 1, max_micro: int = MAX_MICRO,
                 micro_batches: int | None = None) -> list[int]:
    """The counts screened (module doc): ``M <= max_micro`` with ``replicas x M``
    dividing the batch; ``micro_batches``: that count only (if it divides).

    >>> micro_counts(16, 4), micro_counts(None, 8, 8), micro_counts(24, 1), micro_counts(24, 3, micro_batches=8)
    ([1, 2, 4], [1, 2, 4, 8], [1, 2, 3, 4, 6, 8, 12], [8])
    """
    if micro_batches is not None:
        return [micro_batches] if batch_size is None or batch_size % (replicas * micro_batches) == 0 else []
    if batch_size is None:
        return [m for m in (1, 2, 4, 8, 16) if m <= max_micro]
    return [m for m in range(1, max_micro + 1) if batch_size % (replicas * m) == 0]


def layer_groups(graph: OpGraph, ph: Phases, stages: int) -> list[list[int]]:
    """The layers of ``graph`` in pipeline order, each its forward ops with
    the other groups attached (module doc); ``[]`` when no depth has
    ``stages`` numbered groups."""
    fwd = list(ph.forward)
    orders = blockings(graph, ph, chunks=max(1, len(fwd)))
    for depth in range(1, 9):
        keys = {i: "/".join((graph.ops[i].scope or graph.names[i]).split("/")[:depth]) for i in fwd}
        order = _group_order(keys, orders, f"scope:{depth}")
        layers = [k for k in order if _LAYER.search(k.rsplit("/", 1)[-1])]
        if len(layers) < stages:
            continue
        owner, at = {}, layers[0]
        for k in order:
            at = k if k in layers else at
            owner[k] = at
        members: dict[str, list[int]] = {k: [] for k in layers}
        for i in fwd:
            members[owner[keys[i]]].append(i)
        return [members[k] for k in layers]
    return []


def _group_order(keys, orders, name: str) -> list[str]:
    """The groups of ``keys`` (op -> group) in the pipeline order of the block
    order ``name``, else of the first block order holding each group whole
    (:func:`~solver.parallel.pipelines.blockings` drops a scope order equal
    to an earlier one), else by first op."""
    for bl in sorted(orders, key=lambda b: b.name != name):
        span: dict[str, list[int]] = {}
        for i, k in keys.items():
            lo, hi = span.get(k, (bl.block[i], bl.block[i]))
            span[k] = [min(lo, bl.block[i]), max(hi, bl.block[i])]
        order = sorted(span, key=lambda k: (span[k], k))
        if all(span[a][1] <= span[b][0] for a, b in zip(order, order[1:])):
            return order
    return list(dict.fromkeys(keys[i] for i in sorted(keys)))


def uniform_stages(graph: OpGraph, stages: int, *, loss: str | None = None) -> tuple[int, ...]:
    """Per op of ``graph`` its stage under the hand rule (module doc): the
    layers split uniformly by count over ``stages``; ``-1`` for unbatched ops
    (:func:`~solver.parallel.pipelines.pipeline_plan`'s ``op_stages``).

    Raises
    ------
    PestoError
        ``graph`` has fewer numbered scope groups (layers) than ``stages``.
    """
    ph = phases(graph, loss=loss)
    layers = layer_groups(graph, ph, stages)
    if not layers:
        raise PestoError(f"megatron: {graph.name!r} has no {stages} layers to split (scope groups ending in "
                         "a number, e.g. 'layer_3', at any depth)")
    stage = [-1] * graph.num_ops
    per, extra = divmod(len(layers), stages)
    k = 0
    for s in range(stages):
        for _ in range(per + (s < extra)):
            for i in layers[k]:
                stage[i] = s
            k += 1
    for b, a in ph.anchor.items():
        stage[b] = stage[a] if stage[a] >= 0 else stages - 1
    return tuple(stage)


def megatron_schedules() -> tuple[str, ...]:
    """The schedules a Megatron-LM user picks among: 1F1B and every
    interleaved schedule :data:`~solver.parallel.schedules.SCHEDULES` holds.

    >>> "1f1b" in megatron_schedules()
    True
    """
    return tuple(s for s in SCHEDULES if s == "1f1b" or "interleav" in s)


def _best(baseline: str, found: list, tried: list, graph: OpGraph) -> UserChoice:
    if not found:
        why = "; ".join(f"{t.config}: {t.note}" for t in tried[:6]) or "nothing to try"
        raise PestoError(f"{baseline}: no configuration of {graph.name!r} could be built ({why})")
    sp, config = min(found, key=lambda f: rank(f[0].plan))
    return UserChoice(baseline, sp if isinstance(sp, Solved) else solved_of(sp), config, tuple(tried))


def _record(found: list, tried: list, config: str, build: Callable) -> object:
    """Build one configuration; a PestoError or ValueError is a :class:`Tried` note."""
    try:
        sp = build()
    except (PestoError, ValueError) as exc:
        tried.append(Tried(config, None, None, f"{type(exc).__name__}: {exc}"))
        return None
    fits = sp.plan.status != "infeasible"
    tried.append(Tried(config, sp.plan.makespan, fits, "" if fits else "does not fit memory"))
    found.append((sp, config))
    return sp


def megatron_plan(graph: OpGraph, cluster: Cluster, *, batch_size: int | None = None,
                  max_micro: int = MAX_MICRO, schedules: Sequence[str] | None = None,
                  loss: str | None = None, micro_batches: int | None = None) -> UserChoice:
    """The best hand configuration of a Megatron-LM user (module doc).

    ``schedules``: default :func:`megatron_schedules`; ``micro_batches``:
    that count only (:func:`micro_counts`).

    Raises
    ------
    PestoError
        No configuration could be built (each one's reason named).
    """
    n = len(gpu_names(cluster))
    found, tried = [], []
    for pp in (p for p in range(1, n + 1) if n % p == 0):
        dp = n // pp
        try:
            cuts = uniform_stages(graph, pp, loss=loss) if pp > 1 else None
        except PestoError as exc:
            tried.append(Tried(f"PP={pp} DP={dp}", None, None, str(exc)))
            continue
        for m in micro_counts(batch_size, dp, max_micro, micro_batches):
            for s in (schedules or megatron_schedules()) if pp > 1 else ("data-parallel",):
                _megatron_config(graph, cluster, found, tried, (s, pp, dp, m), cuts, loss)
    return _best("megatron", found, tried, graph)


def _megatron_config(graph, cluster, found, tried, conf, cuts, loss) -> None:
    """One configuration ``(schedule, PP, DP, M)``; re-run with activation
    recomputation (:func:`pesto.step.recompute`, the copies on their block's
    stage) when it does not fit."""
    s, pp, dp, m = conf
    if pp == 1:
        fn, name = data_parallel_plan, f"data-parallel DP={dp} M={m}"
        opts = {"micro_batches": m}
    elif dp == 1:
        fn, name = pipeline_plan, f"{s} PP={pp} M={m} DP=1"
        opts = {"schedule": s, "micro_batches": m, "stages": pp, "op_stages": cuts, "loss": loss}
    else:
        fn, name = hybrid_plan, f"{s} PP={pp} M={m} DP={dp}"
        opts = {"replicas": dp, "micro_batches": m, "schedule": s, "op_stages": cuts, "loss": loss}
    sp = _record(found, tried, name, lambda: fn(graph, cluster, **opts))
    if sp is None or sp.plan.status != "infeasible":
        return

    def recomputed():   # refused (a Tried note) where nothing would be recomputed
        rc = recompute(graph)
        more = {} if opts.get("op_stages") is None else {   # a recomputed copy on its original's stage
            "op_stages": [cuts[graph.index[rc.origin[n].op]] for n in rc.graph.names]}
        return fn(rc.graph, cluster, **{**opts, **more})

    _record(found, tried, name + " recompute", recomputed)


#: The ZeRO stages a user tries in turn, each plain (``zero-dp``): the optimizer state sharded
#: (ZeRO-1), the gradients too (ZeRO-2), the parameters too (ZeRO-3, PyTorch's FSDP).
ZERO_LEVELS = (1, 2, 3)


def zero_plan(graph: OpGraph, cluster: Cluster, *, batch_size: int | None = None, max_micro: int = MAX_MICRO,
              level: int | None = None, micro_batches: int | None = None) -> UserChoice:
    """Data parallelism with sharded state at its best ``M`` (module doc).

    Per count, what a user tries in turn until a plan fits memory: ZeRO-1,
    ZeRO-2, ZeRO-3 (FSDP, :data:`ZERO_LEVELS`), then activation recomputation
    (every layer block, :func:`pesto.step.recompute`) with ZeRO-2 and with
    ZeRO-3 (FSDP + activation checkpointing). ``level``: that stage only (and
    with recomputation when it does not fit). The label says which:
    ``"zero-3 DP=8 M=1 recompute"``.

    Raises
    ------
    PestoError
        Sharded optimizer state is not supported by this build (the reason
        :class:`~solver.parallel.strategy.Strategy` gives), or no count could
        be built.
    """
    n = len(gpu_names(cluster))
    levels = ZERO_LEVELS if level is None else (level,)
    why = strategy_takes(replicas=max(n, 2), shard_optimizer=levels[0])
    if why:
        raise PestoError(f"zero-dp: sharded optimizer state is not available ({why})")
    found, tried = [], []
    tries = [(z, False) for z in levels] + [(z, True) for z in levels if z >= 2 or level is not None]
    for m in micro_counts(batch_size, n, max_micro, micro_batches):
        for z, rc in tries:
            sp = _record(found, tried, f"zero-{z} DP={n} M={m}" + (" recompute" if rc else ""),
                         lambda z=z, rc=rc: realise(graph, cluster, Strategy(replicas=n, micro_batches=m,
                                                                            shard_optimizer=z, recompute=rc)))
            if sp is not None and sp.plan.status != "infeasible":
                break
    return _best("zero-dp", found, tried, graph)


def best_pipeline_plan(graph: OpGraph, cluster: Cluster, *, batch_size: int | None = None,
                       max_micro: int = MAX_MICRO, schedules: Sequence[str] | None = None,
                       candidates: int = CANDIDATES, loss: str | None = None,
                       micro_batches: int | None = None) -> UserChoice:
    """The best pipeline of every schedule (default all of
    :data:`~solver.parallel.schedules.SCHEDULES`) and count ``M > 1`` (module doc).

    Raises
    ------
    PestoError
        No configuration could be built.
    """
    found, tried = [], []
    for s in schedules or tuple(SCHEDULES):
        for m in (m for m in micro_counts(batch_size, 1, max_micro, micro_batches) if m > 1):
            _record(found, tried, f"{s} M={m}", lambda: pipeline_plan(graph, cluster, schedule=s, micro_batches=m,
                                                                       candidates=candidates, loss=loss))
    return _best("best-pipeline", found, tried, graph)


def place_megatron(graph: OpGraph, cluster: Cluster, *, batch_size: int | None = None,
                   max_micro: int = MAX_MICRO, micro_batches: int | None = None, loss: str | None = None) -> Plan:
    """Megatron-LM's hand configuration at its best ``PP x DP``, schedule and
    ``M`` (:func:`megatron_plan`; the plan places the transformed step)."""
    return megatron_plan(graph, cluster, batch_size=batch_size, max_micro=max_micro, micro_batches=micro_batches,
                         loss=loss).plan


def place_zero_dp(graph: OpGraph, cluster: Cluster, *, batch_size: int | None = None,
                  max_micro: int = MAX_MICRO, micro_batches: int | None = None, level: int | None = None) -> Plan:
    """ZeRO data parallelism at its best ``M`` (:func:`zero_plan`)."""
    return zero_plan(graph, cluster, batch_size=batch_size, max_micro=max_micro, micro_batches=micro_batches,
                     level=level).plan


def place_best_pipeline(graph: OpGraph, cluster: Cluster, *, batch_size: int | None = None,
                        max_micro: int = MAX_MICRO, micro_batches: int | None = None,
                        loss: str | None = None) -> Plan:
    """The best of every pipeline schedule at its best ``M`` (:func:`best_pipeline_plan`)."""
    return best_pipeline_plan(graph, cluster, batch_size=batch_size, max_micro=max_micro,
                              micro_batches=micro_batches, loss=loss).plan


#: name -> the function returning its :class:`UserChoice` (the CLI and the benchmarks read it).
PLANS: dict[str, Callable[..., UserChoice]] = {"megatron": megatron_plan, "zero-dp": zero_plan,
                                               "best-pipeline": best_pipeline_plan}
