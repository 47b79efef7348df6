"""One realiser: a :class:`~solver.parallel.strategy.Strategy` of a step -> a
:class:`~solver.parallel.strategy.Solved` plan.

Data parallelism is one stage per replica (:func:`solver.parallel.pipelines.data_parallel_plan`,
one replica per GPU), a pipeline one replica (:func:`solver.parallel.pipelines.pipeline_plan`,
GPipe or 1F1B from :data:`solver.parallel.schedules.SCHEDULES`, at most
``strategy.stages`` stages), a hybrid both (:func:`solver.parallel.hybrid.hybrid_plan`);
the slice model (``schedule="slice"``, :func:`solver.parallel.slice_model.solve_slices`)
is one more realiser, and so are replicas of one free placement
(``schedule="free"`` with ``replicas > 1``: :func:`solver.parallel.placed.placed_plan`,
given the one-step placer ``place``) and one free placement of the split step
(``schedule="free"``, one replica, ``M > 1``: ``place`` on :func:`pesto.step.split`
of the step by the strategy's weight-gradient rule; the search gives its list
placer, and its exact passes refine the same shape with the recipe).

The memory savers compose with the kinds: ``recompute`` realises the kind
on :func:`pesto.step.recompute` of the step, every layer block or those it
names, each at its level (every op or its cheap ops: :func:`with_savers`; every kind but the slice model), ``shard_optimizer`` replicates with ZeRO-1/2/3
(data parallelism only: a hybrid's rings follow its stages, not shards).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from pesto.cluster import Cluster
from pesto.graph import OpGraph, gc_paused
from pesto.step import Transformed, compose, identity, recompute, split as split_step
from pesto.step.recompute import cheap_ops, layer_blocks

from .hybrid import hybrid_plan
from .placed import Place, placed_plan
from .pipelines import CANDIDATES, StepPlan, data_parallel_plan, gpu_names, pipeline_plan
from .slice_model import solve_slices
from .schedules import SCHEDULES
from .strategy import Solved, Strategy

__all__ = ["realise", "strategy_of", "solved_of", "with_savers"]


def strategy_of(sp: StepPlan) -> Strategy:
    """The :class:`~solver.parallel.strategy.Strategy` a parallelism placer's plan realises."""
    if sp.schedule == "data-parallel":
        return Strategy(replicas=sp.replicas, micro_batches=sp.micro_batches)
    return Strategy(replicas=sp.replicas, stages=sp.stages, micro_batches=sp.micro_batches, schedule=sp.schedule)


def solved_of(sp: StepPlan, weight_grads="separate") -> Solved:
    """A parallelism placer's :class:`~solver.parallel.pipelines.StepPlan` as a :class:`Solved`
    (its transform kept; ``weight_grads``: the split's rule it was made with)."""
    return Solved(sp.plan, sp.graph, replace(strategy_of(sp), weight_grads=weight_grads), sp.transformed, detail=sp)


def with_savers(step: OpGraph, strategy: Strategy) -> Transformed:
    """The step a kind realises ``strategy`` on (its ``graph``): :func:`pesto.step.recompute`
    of ``step`` when ``strategy.recompute``, each layer block at its level
    (:meth:`Strategy.levels`: every op, its cheap ops only,
    :func:`pesto.step.recompute.cheap_ops`, as ``only=``, or none), else ``step`` itself
    (:func:`pesto.step.identity`).

    Raises
    ------
    ValueError
        ``strategy.recompute`` names a count of blocks other than ``step``'s
        (:func:`pesto.step.recompute.layer_blocks`).

    A recomputed step is kept on ``step`` per ``(recompute, selective)``: the
    search asks for the same levels with each ZeRO level and for its memory forecast.
    """
    if not strategy.recompute:
        return identity(step)
    kept = step.__dict__.setdefault("_with_savers", {})
    key = (strategy.recompute, strategy.selective)
    if key not in kept:
        kept[key] = _recomputed(step, strategy)
    return kept[key]


def _recomputed(step: OpGraph, strategy: Strategy) -> Transformed:
    """:func:`with_savers` of a ``strategy`` that recomputes, built."""
    if strategy.recomputed is None and not strategy.selective:
        return recompute(step)
    blocks = layer_blocks(step)
    if isinstance(strategy.recompute, tuple) and len(blocks) != len(strategy.recompute):
        raise ValueError(f"{strategy.name}: recompute names {len(strategy.recompute)} layer blocks, "
                         f"the step {step.name!r} has {len(blocks)}")
    levels = strategy.levels(len(blocks))
    cheap = cheap_ops(step, blocks) if "cheap" in levels else blocks
    return recompute(step, blocks, chosen=strategy.recomputed,
                     only=None if "cheap" not in levels else [c if lv == "cheap" else b
                                                             for b, c, lv in zip(blocks, cheap, levels)])


def realise(step: OpGraph, cluster: Cluster, strategy: Strategy, *, candidates: int = CANDIDATES,
            time_limit: float = 10.0, seed: int = 0, workers: int | None = None, deadline=None,
            stage_of: Mapping[str, int] | None = None, place: Place | None = None) -> Solved:
    """The plan of the marked ``step`` that ``strategy`` says (module doc).

    ``candidates``: the stage splits a pipeline simulates; ``time_limit``,
    ``seed``, ``workers``, ``deadline``: the slice model's search (``deadline``
    also data parallelism's: its device orders after one that fits are skipped once
    it has passed, :func:`~solver.parallel.pipelines.data_parallel_plan`).
    ``stage_of``: a pipeline of one chunk and one replica cut as given, per
    batched op of ``step`` its stage (a recomputed copy's: its original's;
    :func:`solver.parallel.pipelines.pipeline_plan`'s ``op_stages``), not searched.
    ``place``: the placer a ``schedule="free"`` strategy places with: a replica of
    replicas of one free placement (``replicas > 1``,
    :func:`solver.parallel.placed.placed_plan`), or the split step (one replica);
    the search gives it.

    >>> from pesto.cluster import gpus
    >>> realise(OpGraph.from_edges({"a": 1.0}, []), gpus(4), Strategy(replicas=2))
    Traceback (most recent call last):
    ...
    ValueError: data-parallel R=2: data parallelism runs one replica per GPU (4)

    Raises
    ------
    ValueError
        A strategy no realiser supports (named), e.g. data parallelism with
        fewer replicas than GPUs.
    PestoError
        As the realiser (no stage split, no grid, ...).
    """
    with gc_paused():   # a replicated or split step: 100k ops and more, their tensors and plans
        if strategy.schedule == "free" and strategy.replicas > 1:
            return _placed(step, cluster, strategy, place)
        if strategy.schedule == "free":
            return _free(step, cluster, strategy, place)
        return _realise(step, cluster, strategy, candidates, time_limit, seed, workers, deadline, stage_of)


def _placed(step: OpGraph, cluster: Cluster, s: Strategy, place: Place | None) -> Solved:
    """Replicas of one free placement (:func:`solver.parallel.placed.placed_plan`)."""
    if place is None:
        raise ValueError(f"{s.name}: replicas of one free placement need the one-step placer (place=)")
    if s.micro_batches > 1 or s.savers:
        raise ValueError(f"{s.name}: replicas of one free placement run one slice and no memory savers")
    sp = placed_plan(step, cluster, replicas=s.replicas, place=place, bucket_bytes=s.bucket_bytes)
    return Solved(sp.plan, sp.graph, replace(s, stages=sp.stages), sp.transformed, detail=sp)


def _free(step: OpGraph, cluster: Cluster, s: Strategy, place: Place | None) -> Solved:
    """One free placement of the split step: ``place`` on :func:`pesto.step.split` of ``step``."""
    if place is None:
        raise ValueError(f"{s.name}: a free placement of the split step needs its placer (place=)")
    if s.micro_batches < 2 or s.savers or s.stages > 1:
        raise ValueError(f"{s.name}: a free placement of the split step takes M > 1 slices, one stage and no "
                         f"memory savers")
    t = split_step(step, s.micro_batches, weight_grads=s.split_rule)
    return Solved(place(t.graph, cluster), t.graph, s, t)


def _realise(step, cluster, strategy, candidates, time_limit, seed, workers, deadline, stage_of) -> Solved:
    """:func:`realise`'s body (the cyclic garbage collector paused)."""
    s, m, wg = strategy, strategy.micro_batches, strategy.split_rule
    if s.schedule == "slice":
        if s.weight_grads != "separate":
            raise ValueError(f"slice model M={m}: weight_grads={wg!r} is not supported (only 'separate')")
        if s.recompute:
            raise ValueError(f"{s.name}: the slice model does not take recompute")
        r = solve_slices(step, cluster, micro_batches=m, time_limit=time_limit, workers=workers, seed=seed,
                         deadline=deadline)
        if r.plan is None:
            raise ValueError(f"slice model M={m}: no grid solution ({r.status})")
        return Solved(r.plan, r.graph, Strategy(micro_batches=m, schedule="slice"), r.transformed, detail=r)
    if s.shard_optimizer and (s.stages > 1 or s.schedule != "none"):
        raise ValueError(f"{s.name}: shard_optimizer (ZeRO) is realised for data parallelism only")
    kept = with_savers(step, s)
    saved = kept.graph
    if s.replicas > 1 and s.stages == 1 and s.schedule == "none":
        if s.replicas != len(gpu_names(cluster)):
            raise ValueError(f"{s.name}: data parallelism runs one replica per GPU ({len(gpu_names(cluster))})")
        return _saving(solved_of(data_parallel_plan(saved, cluster, micro_batches=m, weight_grads=wg,
                                                    shard_optimizer=s.shard_optimizer,
                                                    bucket_bytes=s.bucket_bytes, deadline=deadline), wg), s, kept)
    if s.schedule in SCHEDULES and s.replicas == 1:
        given = None if stage_of is None else [stage_of[kept.origin[op.name].op] if op.batch else -1
                                               for op in saved.ops]
        return _saving(solved_of(pipeline_plan(saved, cluster, schedule=s.schedule, micro_batches=m,
                                               candidates=candidates,
                                               stages=None if s.stages >= len(gpu_names(cluster)) else s.stages,
                                               weight_grads=wg, op_stages=given), wg), s, kept)
    if s.schedule in SCHEDULES and s.replicas > 1:
        return _saving(solved_of(hybrid_plan(saved, cluster, replicas=s.replicas, micro_batches=m,
                                             schedule=s.schedule, candidates=candidates, weight_grads=wg,
                                             bucket_bytes=s.bucket_bytes), wg), s, kept)
    raise ValueError(f"no realiser for {s.name} (schedule {s.schedule!r}); the search realises 'free' itself")


def _saving(solved: Solved, strategy: Strategy, kept: Transformed) -> Solved:
    """``solved`` with the savers (and bucket size) of ``strategy`` in its strategy, its transform
    composed with ``kept`` (:func:`with_savers`: the recomputation) down to the step."""
    t = solved.transformed if kept.graph is kept.source else compose(solved.transformed, kept)
    return replace(solved, strategy=replace(solved.strategy, recompute=strategy.recompute,
                                            selective=strategy.selective, bucket_bytes=strategy.bucket_bytes,
                                            shard_optimizer=strategy.shard_optimizer), transformed=t)
