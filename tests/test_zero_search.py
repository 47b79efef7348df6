"""The search screens ZeRO-1 data parallelism when memory is not short (issue 30, item 4).

ZeRO-1 moves the all-reduce's bytes (reduce-scatter + all-gather) and each replica
updates ``1 / R`` of the weights: where the update weighs, it is faster than plain
data parallelism, and ``auto`` returns it with ``plan.log.savers == "ZeRO-1"``.
"""
from __future__ import annotations

from dataclasses import replace

import pesto
from mb_strategies import deep_step
from pesto.cluster import gpus
from pesto.graph import OpGraph
from pesto.plan import check_plan
from solver.parallel.realise import realise
from solver.parallel.strategy import Strategy


def _heavy_update(us: float) -> OpGraph:
    """One layer of ``deep_step`` whose update takes ``us`` µs (no placement
    spreads one update op over the GPUs; ZeRO shards it)."""
    g = deep_step(1, weight=40_000, act=1_000_000, t=200.0)
    return OpGraph([replace(op, compute={"GPU": us}) if op.phase == "update" else op for op in g.ops],
                   g.edges, g.tensors, name="heavy_update")


def test_auto_returns_zero1_data_parallelism_where_the_update_weighs():
    g, cluster = _heavy_update(800.0), gpus(4)
    plain = realise(g, cluster, Strategy(replicas=4))
    zero = realise(g, cluster, Strategy(replicas=4, shard_optimizer=1))
    assert plain.plan.status != "infeasible" and zero.plan.makespan < plain.plan.makespan   # the premise
    r = pesto.solve_step(g, cluster=cluster, time_limit=3, deterministic=True)
    steps = r.plan.log.steps
    assert "data-parallel M=1 ZeRO-1" in steps and steps["data-parallel M=1 ZeRO-1"] < steps["data-parallel"]
    # ZeRO-1 data parallelism wins (at M=1, or at a count whose ZeRO-1 twin screening builds too,
    # on the separate or the in-place split, whichever is the faster)
    assert replace(r.strategy, micro_batches=1, weight_grads="separate") == Strategy(replicas=4, shard_optimizer=1)
    assert r.plan.log.savers == "ZeRO-1"
    assert r.plan.makespan <= zero.plan.makespan and check_plan(r, cluster).ok


def test_zero1_is_screened_but_not_chosen_where_it_does_not_pay():
    """A cheap update: ZeRO-1 is screened too (not for memory) and the faster plan wins."""
    g, cluster = _heavy_update(1.0), gpus(4)
    r = pesto.solve_step(g, cluster=cluster, time_limit=3, deterministic=True)
    steps = r.plan.log.steps
    assert "data-parallel M=1 ZeRO-1" in steps and "data-parallel" in steps
    assert r.plan.makespan == min(steps.values())
    assert (r.plan.log.savers == "ZeRO-1") == (r.plan.makespan == steps["data-parallel M=1 ZeRO-1"]
                                                < steps["data-parallel"])
