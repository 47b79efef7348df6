"""The table of parallelism kinds the search screens.

A kind is one module's two functions and one entry here: ``candidates(step,
cluster, m)`` -> the :class:`~solver.parallel.strategy.Strategy` s of ``m``
slices worth building, ``realise(step, cluster, strategy, candidates=...)``
-> a :class:`~solver.parallel.strategy.Solved` plan (raising a
:class:`~pesto.errors.PestoError` or ``ValueError`` naming why it does not
apply), ``label(strategy)`` the candidate's name in ``plan.log.steps``, and
``sims`` the simulations of its graph one realisation costs (what the search
predicts its time from; ``solves``: the share of the pass's time left that its
one-step solve gets, the search then giving ``realise`` the one-step placer
``place=`` on that grant; ``lists``: the search gives ``realise`` its list placer
as ``place=`` instead (quick: no solve); ``cheap``: with one stage split only, what the search
falls back to when ``sims`` do not fit; ``fill_only``: its plans beat the
count's GPipe/1F1B plans by at most their fill and drain, so the search
screens it last, on the best counts, and skips it when that cannot beat the
best plan so far; ``tries``: the stage splits it simulates when screening).
:mod:`solver.parallel.search`
screens every kind of :data:`KINDS`, in order, for every count; to add a kind,
write its module and add its entry. The kinds: free (one replica: the step
in ``M > 1`` slices placed and ordered freely over every GPU, the shape the
exact passes refine; screened first, with the search's list placer, the
practitioner's layer stages of the split step list-scheduled by placed rank:
quick, and a count's split is chosen from a plan of its own shape), hybrid (``R`` replicas, each a
contiguous-stage pipeline over ``GPUs / R`` GPUs, :mod:`solver.parallel.hybrid`),
pipeline (GPipe, 1F1B), data-parallel, placed (``R`` replicas of one free
placement: the one-step placer's plan of a replica's step over ``GPUs / R``
GPUs, every replica alike, :mod:`solver.parallel.placed`; one slice), zero-bubble
(interleaved, ZB-H1, ZB-H2, ZB-V).

>>> list(KINDS)
['free', 'hybrid', 'pipeline', 'data-parallel', 'placed', 'zero-bubble']

The memory savers (:func:`savers`) are screened for a candidate whose plan
does not fit memory: the same strategy with ZeRO-1, ZeRO-2, ZeRO-3 (the parameters
sharded too, PyTorch's FSDP), ZeRO-3 with selective recomputation, recomputation, then ZeRO-2
and ZeRO-3 with recomputation (data parallelism), or with selective recomputation (each
block's cheap ops, ``recompute-cheap``) then recomputation (pipelines,
hybrids), until one fits; a recomputing one that fits is then lowered block by block
(:meth:`solver.parallel.search._Search.partial`: every op -> cheap ops -> none). (ZeRO-1 can also be faster: the search's ``"auto"``
first plan, data parallelism of the step, screens it whether or not memory is short.)

>>> [s.savers for s in savers(Strategy(replicas=4))][:4]
['ZeRO-1', 'ZeRO-2', 'ZeRO-3', 'ZeRO-3 recompute-cheap']
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from pesto.cluster import Cluster
from pesto.graph import OpGraph

from .pipelines import gpu_names
from .realise import realise
from .schedules import SCHEDULES
from .strategy import Solved, Strategy

__all__ = ["Kind", "KINDS", "savers"]


@dataclass(frozen=True)
class Kind:
    """One parallelism kind (module doc)."""

    name: str
    candidates: Callable[[OpGraph, Cluster, int], list[Strategy]]
    realise: Callable[..., Solved]
    label: Callable[[Strategy], str]
    sims: float = 2.0
    cheap: float | None = None   # the simulations with one stage split only (``candidates=1``), if it has several
    fill_only: bool = False   # gains at most the fill of the count's GPipe/1F1B plans (screened after them)
    tries: int | None = None   # stage splits simulated when screening (None: the search's default)
    solves: float = 0.0   # share of the pass's time left its one-step solve gets (0: none; ``place=``)
    lists: bool = False   # ``place=`` is the search's list placer (no solve)


def _pipelines(step: OpGraph, cluster: Cluster, m: int) -> list[Strategy]:
    """GPipe and 1F1B (the plain schedules) of ``m > 1`` slices over up to every GPU."""
    n = len(gpu_names(cluster))
    return [Strategy(stages=n, micro_batches=m, schedule=s) for s, x in SCHEDULES.items() if x.plain] if m > 1 else []


def _chunked_or_split(step: OpGraph, cluster: Cluster, m: int) -> list[Strategy]:
    """Interleaved 1F1B, ZB-H1, ZB-H2 and ZB-V (the schedules with model
    chunks or split backward) of ``m > 1`` slices over up to every GPU:
    screened after data parallelism, on the time left."""
    n = len(gpu_names(cluster))
    return [Strategy(stages=n, micro_batches=m, schedule=s) for s, x in SCHEDULES.items()
            if not x.plain] if m > 1 and n > 1 else []


def _data_parallel(step: OpGraph, cluster: Cluster, m: int) -> list[Strategy]:
    """One replica per GPU in ``m > 1`` slices (``M = 1``: the search's first plan)."""
    n = len(gpu_names(cluster))
    return [Strategy(replicas=n, micro_batches=m)] if m > 1 and n > 1 else []


#: The schedules a hybrid's pipelines are screened with (one model chunk: what
#: :func:`solver.parallel.hybrid.hybrid_plan` runs; ZB-H1 defers the weight
#: gradients, at 1F1B's activation memory: NMT-4x1024 on 4 PCIe GPUs, R=2 M=1,
#: 87.7 ms against 1F1B's 110.5).
HYBRID_SCHEDULES = ("1f1b", "zb-h1")


def _hybrids(step: OpGraph, cluster: Cluster, m: int) -> list[Strategy]:
    """``R`` replicas, each a pipeline over ``GPUs / R`` GPUs (1F1B, then
    ZB-H1: :data:`HYBRID_SCHEDULES`), for each divisor ``1 < R < GPUs``."""
    n = len(gpu_names(cluster))
    return [Strategy(replicas=r, stages=n // r, micro_batches=m, schedule=s)
            for r in range(2, n) if n % r == 0 for s in HYBRID_SCHEDULES]


def _placed(step: OpGraph, cluster: Cluster, m: int) -> list[Strategy]:
    """``R`` replicas of one free placement over ``GPUs / R`` GPUs each
    (:func:`solver.parallel.placed.placed_plan`), for each divisor ``1 < R < GPUs``;
    one slice only (``m = 1``)."""
    n = len(gpu_names(cluster))
    return [Strategy(replicas=r, stages=n // r, schedule="free") for r in range(2, n) if n % r == 0] if m == 1 else []


def _free(step: OpGraph, cluster: Cluster, m: int) -> list[Strategy]:
    """One free placement of the step in ``m > 1`` slices over every GPU
    (:func:`solver.parallel.realise.realise` with the search's list placer),
    every weight gradient summed in place (no accumulate ops: a free
    placement's copies of a layer share its GPU, so the chain costs no
    transfer): what the exact passes of ``m`` place, screened so that they start
    from a plan of the count's own shape, their split chosen by it
    (NMT-4x1024 on 4 PCIe GPUs, ``M = 2``: 67.3 ms in place, 86.9 ms with
    accumulate ops, where its best pipeline took 105)."""
    n = len(gpu_names(cluster))
    return [Strategy(micro_batches=m, schedule="free", weight_grads="accumulate")] if m > 1 and n > 1 else []


def _hybrid_label(s: Strategy) -> str:
    """``"hybrid R=2 M=4"`` (1F1B), ``"hybrid R=2 M=4 zb-h1"``."""
    return f"hybrid R={s.replicas} M={s.micro_batches}" + ("" if s.schedule == "1f1b" else f" {s.schedule}")


#: The share of the screening time left that a replica's one-step solve gets
#: (:attr:`Kind.solves` of ``placed``; NMT-4x1024's replica on 2 PCIe GPUs: 52.1 ms
#: in 10 s of deterministic work).
PLACED_SHARE = 0.4

#: The kinds, in the order the search screens them (ties go to the first offered).
KINDS: dict[str, Kind] = {
    "free": Kind("free", _free, realise, lambda s: f"free M={s.micro_batches}", 1.5, lists=True),
    "hybrid": Kind("hybrid", _hybrids, realise, _hybrid_label, 2.0),
    "pipeline": Kind("pipeline", _pipelines, realise, lambda s: f"{s.schedule} M={s.micro_batches}", 5.0, 2.0),
    "data-parallel": Kind("data-parallel", _data_parallel, realise, lambda s: f"data-parallel M={s.micro_batches}",
                          4.0),
    "placed": Kind("placed", _placed, realise, lambda s: f"placed R={s.replicas}", 3.0, solves=PLACED_SHARE),
    "zero-bubble": Kind("zero-bubble", _chunked_or_split, realise, lambda s: f"{s.schedule} M={s.micro_batches}",
                        2.0, fill_only=True, tries=1),
}


def savers(strategy: Strategy) -> list[Strategy]:
    """The strategies that save memory over ``strategy`` (module doc), cheapest
    first: sharding the optimizer costs no step time in the ring model
    (reduce-scatter + all-gather move the all-reduce's bytes), sharding the
    parameters too (ZeRO-3, :func:`pesto.step.replicate`'s ``shard_optimizer=3``)
    two more all-gathers of the weights, selective recomputation a fifth of the
    forward, recomputation the forward again; [] for the slice model, the exact
    pipeline, the plain step, or a strategy that already has savers.

    >>> [s.savers for s in savers(Strategy(replicas=4))]   # doctest: +NORMALIZE_WHITESPACE
    ['ZeRO-1', 'ZeRO-2', 'ZeRO-3', 'ZeRO-3 recompute-cheap', 'recompute', 'ZeRO-2 recompute',
     'ZeRO-3 recompute']
    """
    if strategy.recompute or strategy.shard_optimizer:
        return []
    if strategy.replicas > 1 and strategy.stages == 1 and strategy.schedule == "none":
        return [replace(strategy, shard_optimizer=1), replace(strategy, shard_optimizer=2),
                replace(strategy, shard_optimizer=3),
                replace(strategy, shard_optimizer=3, recompute=True, selective=True),
                replace(strategy, recompute=True), replace(strategy, shard_optimizer=2, recompute=True),
                replace(strategy, shard_optimizer=3, recompute=True)]
    if strategy.schedule in SCHEDULES:
        return [replace(strategy, recompute=True, selective=True), replace(strategy, recompute=True)]
    return []
