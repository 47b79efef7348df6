"""Recomputation at three levels per layer block (none, cheap ops, every op), mixed
in one plan and chosen after a recomputing plan fits, for every kind (issue 30, item 4)."""
from __future__ import annotations

from dataclasses import replace

import pytest

import pesto
from mb_strategies import deep_step
from pesto.cluster import gpus
from pesto.deadline import Deadline
from pesto.plan import check_plan
from pesto.solvelog import SolveLog
from pesto.step.recompute import cheap_ops, layer_blocks
from solver.options import SolveOptions
from solver.parallel.kinds import KINDS
from solver.parallel.realise import realise, with_savers
from solver.parallel.search import _Search, savers_of, with_marks
from solver.parallel.strategy import LEVELS, Strategy, recompute_mask

#: deep_step(8, act=1 MB, t=1000 µs): per replica of two, a layer's ``a`` runs 500 µs,
#: ``b`` and ``c`` 250 µs each, 0.5 MB out each. Its backward reads ``a`` and ``b``;
#: its cheap ops (compute per byte at most the layer's) are ``b`` and ``c``. So every
#: op recomputed runs ``a`` and ``b`` again (750 µs a layer), its cheap ops ``b`` only
#: (250 µs): each layer moved from every op to cheap ops saves 500 µs of the step and
#: keeps ``a``'s 0.5 MB.
STEP = dict(act=1_000_000, t=1000.0, weight=4000)
#: GPUs of 8.5 MB: data parallelism recomputing every op peaks at 6.1 MB, its cheap ops
#: only at 9.6 MB (over), the plain step at 13.1 MB.
MEMORY = 8_500_000


def _search(memory=MEMORY, m=1):
    cluster = gpus(2, memory=memory)
    opts = SolveOptions(time_limit=60, micro_batches=m, deterministic=True)
    return _Search(deep_step(8, **STEP), cluster, opts, Deadline(60, deterministic=True)), cluster


@pytest.mark.parametrize("levels, word", [
    ((True, "cheap", "cheap", False), "recompute(1/4:0)+cheap(2/4:1-2)"),
    (("cheap", False, False, "cheap"), "recompute-cheap(2/4:0,3)"),
    ((True, False, True, False), "recompute(2/4:0,2)"),
    (("cheap",) * 4, "recompute-cheap"),
    ((True,) * 4, "recompute"),
])
def test_a_level_per_block_has_one_name_read_back(levels, word):
    s = Strategy(replicas=4, shard_optimizer=2, recompute=levels)
    assert s.recompute_words == word and savers_of(s.savers) == Strategy(replicas=2, shard_optimizer=2,
                                                                         recompute=levels)
    assert Strategy(recompute=recompute_mask(word), selective=word == "recompute-cheap") == Strategy(
        recompute=levels)
    assert s.levels(4) == tuple(LEVELS[0 if x is False else 1 if x == "cheap" else 2] for x in levels)


def test_one_form_per_plan_and_bad_levels_refused():
    # selective with a tuple: its recomputed blocks cheap; one level for all: True / False
    assert Strategy(recompute=(True, False), selective=True) == Strategy(recompute=("cheap", False))
    assert Strategy(recompute=("cheap", "cheap")) == Strategy(recompute=True, selective=True)
    assert Strategy(recompute=(False, False)).recompute is False
    assert Strategy(recompute=(True, "cheap", False)).recomputed == (0, 1)
    for bad in (("all",), (True, 2), ("cheap", None)):
        with pytest.raises(ValueError, match="one level per layer block"):
            Strategy(recompute=bad)
    for word in ("recompute(1/3:0)+cheap(1/3:0)", "recompute(1/3:0)+cheap(1/4:2)", "cheap(1/3:0)",
                 "recompute(1/3:0)+recompute-cheap(1/3:1)"):
        with pytest.raises(ValueError, match="recompute word|none of them twice"):
            recompute_mask(word)
    with pytest.raises(ValueError, match="names 3 layer blocks, the step has 4"):
        Strategy(recompute=(True, False, "cheap")).levels(4)


def test_a_mixed_plan_copies_each_blocks_ops_at_its_level_and_is_rebuilt_from_its_log():
    g = with_marks(deep_step(4, **STEP))
    cluster = gpus(2, memory=10**12)
    blocks, cheap = layer_blocks(g), cheap_ops(g, layer_blocks(g))
    assert cheap[0] == ("layer_0/b", "layer_0/c") and blocks[0] == ("layer_0/a", "layer_0/b", "layer_0/c")
    s = Strategy(stages=2, micro_batches=2, schedule="1f1b", recompute=(True, "cheap", False, "cheap"))
    copies = {o.op for o in with_savers(g, s).origin.values() if o.role == "recompute"}
    assert copies == {"layer_0/a", "layer_0/b", "layer_1/b", "layer_3/b"}   # c: no backward reads it
    for st in (s, Strategy(replicas=2, recompute=s.recompute, shard_optimizer=2)):
        r = realise(g, cluster, st)
        assert r.strategy.recompute == s.recompute and check_plan(r, cluster).ok
        assert {r.origin_of(n).op for n in r.graph.names if r.origin_of(n).role == "recompute"} == copies
        log = SolveLog(recipe="step search", graph_kind=r.graph_kind, replicas=r.replicas,
                       micro_batches=r.micro_batches, savers=r.strategy.savers)
        assert pesto.step_graph(g, log=SolveLog.from_dict(log.to_dict())).names == r.graph.names


def test_data_parallelism_mixes_levels_where_cheap_ops_alone_do_not_fit():
    search, cluster = _search()
    dp = KINDS["data-parallel"]
    full = realise(search.marked, cluster, Strategy(replicas=2, recompute=True))
    cheap = realise(search.marked, cluster, Strategy(replicas=2, recompute=True, selective=True))
    assert full.plan.status != "infeasible" and cheap.plan.status == "infeasible"
    mix = search.partial(dp, full.strategy, full)
    assert mix is not None and mix.plan.status != "infeasible" and check_plan(mix, cluster).ok
    levels = mix.strategy.levels(8)
    k = levels.count("cheap")
    assert 0 < k < 8 and levels.count("full") == 8 - k   # a mix: neither uniform level
    assert "+cheap(" in mix.strategy.savers and search.pool.steps[f"data-parallel M=1 {mix.strategy.savers}"]
    # strictly better than both uniform levels: it fits (cheap ops alone do not) and each block
    # moved to its cheap ops saves its a's 500 µs per replica (recomputing every op does not)
    assert mix.plan.makespan == pytest.approx(full.plan.makespan - 500.0 * k)
    assert cheap.plan.makespan < mix.plan.makespan < full.plan.makespan


def test_the_search_follows_a_fitting_recomputation_with_its_mix():
    search, cluster = _search()
    search.save(KINDS["data-parallel"], Strategy(replicas=2))   # the plain plan is over memory
    steps, best = search.pool.steps, search.pool.best
    assert "data-parallel M=1 recompute" in steps and best.plan.status != "infeasible"
    assert "+cheap(" in best.strategy.savers and best.plan.makespan < steps["data-parallel M=1 recompute"]
    # with room for every block's cheap ops and a bit (10.5 MB against 9.6), every block goes to its
    # cheap ops (-500 µs each), then one keeps its activations (its b again: -250 µs)
    roomy, _ = _search(memory=10_500_000)
    full = realise(roomy.marked, roomy.cluster, Strategy(replicas=2, recompute=True))
    lower = roomy.partial(KINDS["data-parallel"], full.strategy, full)
    assert "data-parallel M=1 recompute-cheap" in roomy.pool.steps   # the uniform level, built on the way
    assert lower.strategy.levels(8) == ("none",) + ("cheap",) * 7 and lower.plan.status != "infeasible"
    assert lower.plan.makespan == pytest.approx(full.plan.makespan - 8 * 500.0 - 250.0)


def test_a_pipeline_recomputing_every_op_lowers_blocks_to_their_cheap_ops():
    search, cluster = _search(memory=4_000_000, m=4)
    pipe = Strategy(stages=2, micro_batches=4, schedule="1f1b", recompute=True)
    r = realise(search.marked, cluster, pipe)
    assert r.plan.status != "infeasible"
    best = search.partial(KINDS["pipeline"], pipe, r)
    assert best is not None and best.plan.status != "infeasible" and check_plan(best, cluster).ok
    assert "cheap" in best.strategy.levels(8) and best.plan.makespan < r.plan.makespan


def test_data_parallelism_under_its_memory_floor_tries_its_leanest_saver_then_lowers_its_levels():
    """The auto search's first plan, data parallelism of the step, is under its floor (one
    slice's activations do not fit): its savers the forecast says fit are built in turn
    until one fits, then a less sharded level's leanest saver, mixed; with GPUs the forecast rules it out for, nothing is built."""
    search, cluster = _search(m="auto")
    assert search.floor(2, 1)[0] > MEMORY
    # the forecast shards the optimizer state (Adam-like slots: 2 x 4 kB a layer) over the replicas
    zero = Strategy(replicas=2, recompute=True, shard_optimizer=2)
    assert search.state == 8 * 2 * 4000
    assert search.predicted_memory(replace(zero, shard_optimizer=0)) - search.predicted_memory(zero) == 8 * 4000
    lean = search.savers(Strategy(replicas=2))[-1]
    assert lean.recompute is True and not lean.selective
    search.first_plan()
    steps, best = search.pool.steps, search.pool.best
    assert "data-parallel" in search.pool.skipped
    # in turn (ZeRO-3 with cheap ops recomputed does not fit) until one fits: the unsharded level's
    # leanest saver (every op recomputed), its levels lowered to a mix that beats it
    mixes = [k for k in steps if k.startswith("data-parallel M=1 recompute(") and "+cheap(" in k]
    assert "data-parallel M=1 recompute" in steps and mixes
    assert steps[mixes[0]] < steps["data-parallel M=1 recompute"]
    assert best.plan.status != "infeasible" and best.plan.makespan == steps[mixes[0]]
    small, _ = _search(memory=3_000_000, m="auto")
    assert small.predicted_memory(lean) > 3_000_000
    small.first_plan()
    assert small.pool.steps == {}


def test_a_hybrid_mixes_levels_per_gpu_where_cheap_ops_alone_do_not_fit():
    cluster = gpus(4, memory=4_000_000)
    search = _Search(deep_step(8, **STEP), cluster, SolveOptions(time_limit=60, micro_batches=2, deterministic=True),
                     Deadline(60, deterministic=True))
    hybrid = Strategy(replicas=2, stages=2, micro_batches=2, schedule="1f1b", recompute=True)
    full = realise(search.marked, cluster, hybrid)
    cheap = realise(search.marked, cluster, Strategy(replicas=2, stages=2, micro_batches=2, schedule="1f1b",
                                                     recompute=True, selective=True))
    assert full.plan.status != "infeasible" and cheap.plan.status == "infeasible"
    mix = search.partial(KINDS["hybrid"], full.strategy, full)
    assert mix is not None and mix.plan.status != "infeasible" and check_plan(mix, cluster).ok
    assert {"full", "cheap"} <= set(mix.strategy.levels(8)) and mix.plan.makespan < full.plan.makespan
