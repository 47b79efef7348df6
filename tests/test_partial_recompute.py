"""Per-block recomputation as a plan choice: Strategy.recompute names layer blocks,
the realisers build those, the search picks the least that fits (issue 30, item 4)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from mb_strategies import deep_step
from pesto.cluster import gpus
from pesto.deadline import Deadline
from pesto.errors import InvalidGraphError
from pesto.plan import check_plan
from pesto.step import recompute
from pesto.step.recompute import cheap_ops, layer_blocks
from solver.options import SolveOptions
from solver.parallel.kinds import KINDS
from solver.parallel.partial import held_where, next_levels
from solver.parallel.realise import realise, with_savers
from solver.parallel.search import _Search, savers_of, step_graph, with_marks
from solver.parallel.strategy import Strategy, recompute_mask

#: Eight layers whose weights and Adam-like state (1.2 MB a layer) rule out data
#: parallelism and two-stage hybrids on 5.3 MB GPUs; a 4-stage 1F1B pipeline of 8
#: slices fits only with recomputation, and needs it on its first stages only.
HEAVY = dict(act=1_000_000, t=1000.0, weight=400_000)
MEMORY = 5_300_000


def _pipe(recompute_=False):
    return Strategy(stages=4, micro_batches=8, schedule="1f1b", recompute=recompute_)


def test_the_name_says_which_blocks_and_reads_back():
    s = Strategy(stages=4, micro_batches=8, schedule="zb-h1", recompute=(True,) * 10 + (False, True) + (False,) * 20)
    assert s.name == "zb-h1 K=4 M=8 recompute(11/32:0-9,11)"
    assert s.recomputed == tuple(range(10)) + (11,)
    assert recompute_mask(s.recompute_words) == s.recompute
    assert savers_of(s.savers).recompute == s.recompute
    assert Strategy(recompute=(True,) * 3).recompute is True and Strategy(recompute=(False,) * 3).recompute is False
    assert Strategy(recompute=True).recomputed is None and Strategy().recomputed == ()
    for bad in (0, "all", (), (True, 1), [None]):
        with pytest.raises(ValueError, match="one level per layer block"):
            Strategy(recompute=bad)
    for word in ("recompute(2/3:0-3)", "recompute(1/3:0,1)", "recompute(x)"):
        with pytest.raises(ValueError, match="recompute"):
            recompute_mask(word)


def test_the_realiser_recomputes_the_named_blocks_only_and_checks_their_count():
    g = with_marks(deep_step(4))
    cluster = gpus(2, memory=10**12)
    r = realise(g, cluster, Strategy(stages=2, micro_batches=2, schedule="1f1b", recompute=(True, False, False, True)))
    copied = {r.origin_of(n).op.split("/")[0] for n in r.graph.names if r.origin_of(n).role == "recompute"}
    assert copied == {"layer_0", "layer_3"} and check_plan(r, cluster).ok
    assert r.strategy.savers == "recompute(2/4:0,3)"
    assert step_graph(g, r.micro_batches, r.graph_kind, r.replicas, r.plan.log.savers if r.plan.log else
                      r.strategy.savers).names == r.graph.names
    # layer 0's copies still wait for layer 1's backward (the next layer), not layer 3's
    waits = with_savers(g, r.strategy).graph.predecessors("layer_0/a@rc")
    assert "gradients/layer_1/c_grad" in waits and not any("layer_3" in n for n in waits)
    with pytest.raises(ValueError, match="names 3 layer blocks, the step .* has 4"):
        realise(g, cluster, Strategy(stages=2, micro_batches=2, schedule="1f1b", recompute=(True, False, True)))
    with pytest.raises(InvalidGraphError, match=r"chosen blocks \[7\]"):
        recompute(g, chosen=[0, 7])


def test_partial_recompute_fits_and_beats_recomputing_every_block():
    g, cluster = with_marks(deep_step(8, **HEAVY)), gpus(4, memory=MEMORY)
    plain, full = realise(g, cluster, _pipe()), realise(g, cluster, _pipe(True))
    assert plain.plan.status == "infeasible" and full.plan.status != "infeasible"
    part = realise(g, cluster, _pipe((True,) * 4 + (False, True, False, False)))
    assert part.plan.status != "infeasible" and check_plan(part, cluster).ok
    assert part.plan.makespan < full.plan.makespan
    # the first stage holds the most slices: it keeps recomputing, the last stages stop
    blocks = layer_blocks(g)
    where = held_where(full.strategy, full.plan.placement, full.transformed.origin, blocks, full.plan.peak_memory,
                       {d: MEMORY for d in full.plan.peak_memory})
    assert where.held[where.device[0]] == 4 and where.held[where.device[-1]] == 1 and where.share == 1 / 8
    levels = next_levels(("full",) * 8, {"full": [1e6] * 8, "cheap": [1e6] * 8}, where)   # cheap: as much
    mask = tuple(lv != "none" for lv in levels)
    assert mask[:2] == (True, True) and not all(mask) and set(levels) == {"cheap", "none"}


def test_the_search_picks_the_least_recomputation_that_fits():
    g, cluster = deep_step(8, **HEAVY), gpus(4, memory=MEMORY)
    opts = SolveOptions(time_limit=60, micro_batches=8, deterministic=True)
    search = _Search(g, cluster, opts, Deadline(60, deterministic=True))
    search.tight = search.floor(1, 1)[0] > search.capacity   # as run() sets it: memory-bound
    assert search.tight
    search.screen(8)
    best, steps = search.pool.best, search.pool.steps
    assert best.plan.status != "infeasible" and check_plan(best, cluster).ok
    assert isinstance(best.strategy.recompute, tuple) and best.strategy.schedule == "1f1b"
    assert 0 < len(best.strategy.recomputed) < 8
    assert best.plan.makespan < steps["1f1b M=8 recompute"]
    assert f"1f1b M=8 {best.strategy.savers}" in steps
    # a pipeline that does not fit even when recomputing every block gets no partial plans
    assert not any(k.startswith("zb-h1 M=8 recompute(") for k in steps)


def test_no_partial_plan_for_a_plain_strategy_or_one_that_does_not_fit():
    g, cluster = deep_step(8, **HEAVY), gpus(4, memory=MEMORY)
    search = _Search(g, cluster, SolveOptions(time_limit=60, micro_batches=8, deterministic=True),
                     Deadline(60, deterministic=True))
    full = realise(search.marked, cluster, _pipe(True))
    assert search.partial(KINDS["pipeline"], _pipe(), full) is None   # not a recomputing strategy
    short = realise(search.marked, cluster, Strategy(stages=4, micro_batches=8, schedule="zb-h1", recompute=True))
    assert short.plan.status == "infeasible"
    assert search.partial(KINDS["zero-bubble"], replace(short.strategy, stages=4), short) is None   # did not fit
    assert search.pool.steps == {}   # nothing built


def test_selective_recomputation_copies_each_blocks_cheap_ops():
    g = with_marks(deep_step(4))
    cluster = gpus(2, memory=10**12)
    assert cheap_ops(g, layer_blocks(g))[1] == ("layer_1/b", "layer_1/c")   # a: twice the time per byte
    s = Strategy(stages=2, micro_batches=2, schedule="1f1b", recompute=True, selective=True)
    assert s.name == "1f1b K=2 M=2 recompute-cheap" and savers_of(s.savers) == replace(s, stages=1,
                                                                                        micro_batches=1,
                                                                                        schedule="none")
    r = realise(g, cluster, s)
    copied = {r.origin_of(n).op for n in r.graph.names if r.origin_of(n).role == "recompute"}
    assert copied == {f"layer_{k}/b" for k in range(4)}   # c: no backward reads it; a: kept
    assert r.strategy.selective and check_plan(r, cluster).ok
    assert step_graph(g, r.micro_batches, r.graph_kind, r.replicas, r.strategy.savers).names == r.graph.names
    full = realise(g, cluster, replace(s, selective=False))
    assert r.graph.total_work() < full.graph.total_work()
    part = replace(s, recompute=(False, True, True, False))
    assert part.name == "1f1b K=2 M=2 recompute-cheap(2/4:1-2)"
    assert part.recompute == (False, "cheap", "cheap", False) and not part.selective   # one form: the levels
    assert savers_of(part.savers).recompute == part.recompute
    with pytest.raises(ValueError, match="True only with recompute"):
        Strategy(selective=True)
    with pytest.raises(InvalidGraphError, match="a subset of its ops"):
        recompute(g, only=[("layer_1/b",)])


def test_partial_keeps_the_cut_of_the_plan_recomputing_every_block():
    g, cluster = deep_step(8, **HEAVY), gpus(4, memory=MEMORY)
    search = _Search(g, cluster, SolveOptions(time_limit=60, micro_batches=8, deterministic=True),
                     Deadline(60, deterministic=True))
    full = realise(search.marked, cluster, _pipe(True))
    part = search.partial(KINDS["pipeline"], _pipe(True), full)
    assert part is not None and part.plan.status != "infeasible" and check_plan(part, cluster).ok
    assert part.plan.makespan < full.plan.makespan and part.graph.total_work() < full.graph.total_work()
    ops = [f"layer_{k}/{x}@mb{s}" for k in range(8) for x in "abc" for s in range(8)]
    assert [part.plan.placement[n] for n in ops] == [full.plan.placement[n] for n in ops]
    # the search's candidate, named with its blocks
    assert search.pool.steps[f"1f1b M=8 {part.strategy.savers}"] == part.plan.makespan


def test_a_partial_plan_skipped_for_time_is_built_on_the_time_left():
    g, cluster = deep_step(8, **HEAVY), gpus(4, memory=MEMORY)
    search = _Search(g, cluster, SolveOptions(time_limit=60, micro_batches=8), Deadline(60))
    full = realise(search.marked, cluster, _pipe(True))
    search.window = Deadline(60).sub(0.0)   # the screening window spent
    assert search.partial(KINDS["pipeline"], _pipe(True), full) is None
    assert len(search.pending) == 1 and any(v.startswith("not built") for v in search.pool.skipped.values())
    search.screen_rest({})   # the time the exact passes leave: the pending plan first
    assert search.pending == [] and any(k.startswith("1f1b M=8 recompute(") for k in search.pool.steps)


def test_a_pending_partial_plan_skipped_again_is_kept_not_retried_forever():
    g, cluster = deep_step(8, **HEAVY), gpus(4, memory=MEMORY)
    search = _Search(g, cluster, SolveOptions(time_limit=60, micro_batches=8), Deadline(60))
    full = realise(search.marked, cluster, _pipe(True))
    search.pending = [(KINDS["pipeline"], _pipe(True), full)]
    search.pace.predict = lambda ops, sims: 1e9   # every candidate outlasts any window
    search.screen_rest({})
    assert len(search.pending) == 1 and not any("recompute(" in k for k in search.pool.steps)
