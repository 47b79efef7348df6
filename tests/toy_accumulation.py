"""A toy parallelism kind in one module: sequential gradient accumulation.

The step split into ``M`` slices, every op on the first GPU, the slices run
one after another (the memory of one slice's activations, no parallelism).
Its table entry is ``KINDS["accumulation"] = KIND`` (tests/test_microbatch_sweep4.py)."""
from __future__ import annotations

import time

from pesto.finalize import finalize
from pesto.step import split as split_step
from solver.parallel.kinds import Kind
from solver.parallel.strategy import Solved, Strategy
from solver.parallel.pipelines import gpu_names


def candidates(step, cluster, m):
    """One candidate per count ``m > 1``: ``m`` slices in sequence on one GPU."""
    return [Strategy(micro_batches=m)] if m > 1 else []


def realise(step, cluster, strategy, **_):
    """The split step on the first GPU, in the split's topological order (slice after slice)."""
    split = split_step(step, strategy.micro_batches)
    gpu = gpu_names(cluster)[0]
    plan = finalize(split.graph, cluster, {n: gpu for n in split.graph.names},
                    order=split.graph.topological_order(), placer="accumulation", t0=time.perf_counter())
    return Solved(plan, split.graph, strategy, split)


KIND = Kind("accumulation", candidates, realise, lambda s: f"accumulation M={s.micro_batches}", sims=1.0)
