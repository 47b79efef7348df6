"""Memory savers as plan choices: Strategy.recompute / shard_optimizer, realised and screened (issue 30, item 4)."""
from __future__ import annotations

import pytest

import pesto
from mb_strategies import deep_step
from pesto.cluster import gpus
from pesto.errors import MicroBatchMemoryError
from pesto.cli import describe_step
from pesto.plan import check_plan
from pesto.solvelog import SolveLog
from solver.parallel.kinds import savers
from solver.parallel.pipelines import data_parallel_plan, pipeline_plan
from solver.parallel.realise import realise
from solver.parallel.search import memory_short, savers_of, step_graph
from solver.parallel.strategy import Strategy

W0 = 50_000_000


@pytest.fixture(scope="module")
def heavy():
    """Layer 0's weight (50 MB) and its optimizer state (4 x 50 MB) dominate; 2 GPUs of 280 MB."""
    return deep_step(4, weight=[W0, 1_000_000, 1_000_000, 1_000_000], act=1_000_000, slots=2), \
        gpus(2, memory=280_000_000)


def test_the_step_does_not_fit_without_a_saver(heavy):
    g, cluster = heavy
    assert memory_short(g, cluster, 1) is not None   # layer 0's state and its gradient on one device
    assert data_parallel_plan(g, cluster).plan.status == "infeasible"
    assert data_parallel_plan(g, cluster, micro_batches=2).plan.status == "infeasible"
    assert pipeline_plan(g, cluster, micro_batches=2).plan.status == "infeasible"


def test_solve_step_chooses_a_saver_that_fits_and_says_so(heavy):
    g, cluster = heavy
    r = pesto.solve_step(g, cluster=cluster, time_limit=8, deterministic=True)
    assert r.strategy.shard_optimizer == 2 and r.strategy.name.endswith("ZeRO-2")
    assert r.plan.status != "infeasible" and check_plan(r, cluster).ok
    assert r.plan.log.savers == "ZeRO-2"
    assert r.plan.log.to_dict()["savers"] == "ZeRO-2"
    assert SolveLog.from_dict(r.plan.log.to_dict()).savers == "ZeRO-2"
    assert "memory savers: ZeRO-2" in describe_step(r.plan, r.graph)   # what `pesto place` prints
    steps = r.plan.log.steps
    assert "data-parallel M=1 ZeRO-2" in steps and "data-parallel M=2 ZeRO-1" in steps
    assert "1f1b M=2 recompute" in steps and "1f1b M=2" not in steps   # M=2 short: its savers only
    # the graph the log says is the graph the plan places
    rebuilt = step_graph(g, r.micro_batches, r.graph_kind, r.replicas, r.plan.log.savers)
    assert rebuilt.names == r.graph.names


def test_fixed_m_short_of_memory_tries_the_savers_then_refuses(heavy):
    """At M = 2 the slices' gradient sum (two slices' and the sum's 50 MB) outweighs
    what ZeRO saves: every saver is screened, none fits, the count is refused."""
    g, cluster = heavy
    said = []
    with pytest.raises(MicroBatchMemoryError, match="M=2: in-flight slices need"):
        pesto.solve_step(g, cluster=cluster, time_limit=6, micro_batches=2, progress=said.append,
                         deterministic=True)
    assert any(line.startswith("data-parallel M=2 ZeRO-2: step") for line in said)
    assert any(line.startswith("1f1b M=2 recompute: step") for line in said)


def test_savers_order():
    assert [s.name for s in savers(Strategy(replicas=4, micro_batches=2))] == [
        "data-parallel R=4 M=2 ZeRO-1", "data-parallel R=4 M=2 ZeRO-2", "data-parallel R=4 M=2 ZeRO-3",
        "data-parallel R=4 M=2 ZeRO-3 recompute-cheap", "data-parallel R=4 M=2 recompute",
        "data-parallel R=4 M=2 ZeRO-2 recompute", "data-parallel R=4 M=2 ZeRO-3 recompute"]
    assert [s.name for s in savers(Strategy(stages=4, micro_batches=8, schedule="1f1b"))] == [
        "1f1b K=4 M=8 recompute-cheap", "1f1b K=4 M=8 recompute"]
    assert savers(Strategy(micro_batches=4, schedule="slice")) == [] == savers(Strategy(replicas=2, recompute=True))


@pytest.mark.parametrize("kw, words", [
    ({"shard_optimizer": 4, "replicas": 2}, "must be one of"),
    ({"shard_optimizer": True, "replicas": 2}, "must be one of"),
    ({"shard_optimizer": 1}, "needs replicas > 1"),
    ({"recompute": 1}, "True, False or one level per layer block"),
    ({"recompute": ()}, "True, False or one level per layer block"),
    ({"recompute": (1, 0)}, "True, False or one level per layer block"),
])
def test_bad_savers_named(kw, words):
    with pytest.raises(ValueError, match=words):
        Strategy(**kw)


@pytest.mark.parametrize("strategy", [
    Strategy(replicas=2, micro_batches=2, shard_optimizer=1, recompute=True),
    Strategy(stages=2, micro_batches=4, schedule="1f1b", recompute=True),
    Strategy(stages=2, micro_batches=4, schedule="gpipe", recompute=True),
])
def test_realised_with_savers(strategy):
    g, cluster = deep_step(4), gpus(2, memory=10**12)
    r = realise(g, cluster, strategy)
    assert r.strategy.recompute == strategy.recompute and r.strategy.shard_optimizer == strategy.shard_optimizer
    assert any(n.split("@mb")[0].endswith("@rc") or "@rc@" in n for n in r.graph.names)
    assert check_plan(r, cluster).ok
    assert step_graph(g, r.micro_batches, r.graph_kind, r.replicas, r.strategy.savers).names == r.graph.names
    if strategy.replicas == 1:   # data parallelism picks its device order by step time, memory permitting
        plain = realise(g, cluster, Strategy(**{**strategy.__dict__, "recompute": False}))
        assert max(r.plan.peak_memory.values()) < max(plain.plan.peak_memory.values())


def test_hybrid_with_recompute_and_refusals():
    g, cluster = deep_step(4), gpus(4, memory=10**12)
    r = realise(g, cluster, Strategy(replicas=2, stages=2, micro_batches=2, schedule="1f1b", recompute=True))
    assert r.strategy.recompute and check_plan(r, cluster).ok
    with pytest.raises(ValueError, match="data parallelism only"):
        realise(g, cluster, Strategy(replicas=2, stages=2, micro_batches=2, schedule="1f1b", shard_optimizer=1))
    with pytest.raises(ValueError, match="slice model does not take recompute"):
        realise(g, cluster, Strategy(micro_batches=2, schedule="slice", recompute=True))


def test_bench_savers_reading_follows_the_rows():
    from benchmarks.bench_savers import Row, reading, strategies, table

    gib = 2**30
    rows = [Row("dp", "w", "data-parallel R=8 M=2", 10, 40 * gib, 16 * gib, 16 * gib, 1000.0, 1.0),
            Row("zero1", "w", "data-parallel R=8 M=2 ZeRO-1", 10, 30 * gib, 16 * gib, 6 * gib, 990.0, 1.0),
            Row("zero2", "w", "data-parallel R=8 M=2 ZeRO-2", 10, 29 * gib, 16 * gib, 6 * gib, 990.0, 1.0),
            Row("zero2-rc", "w", "data-parallel R=8 M=2 ZeRO-2 recompute", 12, 12 * gib, 16 * gib, 6 * gib,
                1250.0, 1.0)]
    text = reading(rows)
    assert "10.00 GiB less persistent" in text and "ZeRO-2 peaks 1.00 GiB lower" in text
    assert "from 29.00 GiB to 12.00 GiB (fits 16 GiB) for +26 % step" in text
    assert text.endswith("fits 16 GiB: data-parallel R=8 M=2 ZeRO-2 recompute.")
    assert table(rows).count("| w |") == 4 and set(strategies(2)) >= {r.key for r in rows}


def test_zero3_savers_read_back():
    """Every saver string data parallelism's list yields reads back to the same fields."""
    more = savers(Strategy(replicas=4, micro_batches=2))
    zero3 = [s.savers for s in more if s.shard_optimizer == 3]
    assert zero3 == ["ZeRO-3", "ZeRO-3 recompute-cheap", "ZeRO-3 recompute"]
    for s in more:
        back = savers_of(s.savers)
        assert (back.shard_optimizer, back.recompute, back.selective) == (s.shard_optimizer, s.recompute, s.selective)


def test_auto_screens_the_step_s_sharded_data_parallelism_under_the_memory_floor():
    """``auto``'s first plan: the step's data parallelism is under the memory floor (which counts
    the weights and optimizer state whole); its savers the forecast says fit are screened in
    turn until one fits: two layers of a 32 MiB weight ``W``, Adam-like slots, 4 GPUs of 5.7 W.
    By hand, per GPU: 6 W persistent whole, ZeRO-1/2 2 W + 4 W / 4, ZeRO-3 6 W / 4; ZeRO-1
    peaks at 6.9 W, ZeRO-2 at 6.1 W, ZeRO-3 at 5.6 W."""
    from pesto.deadline import Deadline
    from solver.options import SolveOptions
    from solver.parallel.search import _Search

    big = 2**25
    g = deep_step(2, weight=big, act=big // 2)
    cluster = gpus(4, memory=int(5.7 * big), beta=(1.0, 1e-6))
    search = _Search(g, cluster, SolveOptions(time_limit=60, micro_batches="auto", batch_size=4, deterministic=True),
                     Deadline(60, deterministic=True))
    assert search.floor(4, 1)[0] > search.capacity
    forecast = {z: search.predicted_memory(Strategy(replicas=4, shard_optimizer=z)) for z in (0, 1, 2, 3)}
    assert forecast[0] - forecast[2] == 3 * big == forecast[0] - forecast[1]
    assert forecast[2] - forecast[3] == 3 * big // 2
    search.first_plan()
    assert "needs at least" in search.pool.skipped["data-parallel"]
    # in turn until one fits (ZeRO-3), then a less sharded level's leanest saver (ZeRO-2 recomputing every op)
    assert list(search.pool.steps) == ["data-parallel M=1 ZeRO-1", "data-parallel M=1 ZeRO-2", "data-parallel M=1 ZeRO-3",
                                       "data-parallel M=1 ZeRO-2 recompute"]
    assert search.pool.best.strategy.shard_optimizer == 3 and search.pool.best.plan.status != "infeasible"


def test_under_the_memory_floor_a_plan_that_fits_comes_back_whatever_the_clock(monkeypatch):
    """GPT-1.3B on 8 V100s at ``time_limit=1``: every saver was predicted past the limit, nothing
    was built and ``auto`` raised MicroBatchMemoryError (or built one at random). While no plan
    fits, the floor's savers are built in turn until one fits; the rest is skipped for time."""
    from pesto.deadline import Deadline
    from solver.options import SolveOptions
    from solver.parallel.search import _Search

    big = 2**25
    g = deep_step(2, weight=big, act=big // 2)
    cluster = gpus(4, memory=int(5.7 * big), beta=(1.0, 1e-6))
    search = _Search(g, cluster, SolveOptions(time_limit=60, micro_batches="auto", batch_size=4), Deadline(60))
    monkeypatch.setattr(search.pace, "predict", lambda ops, sims: 1e6)   # every candidate past the window
    search.first_plan()
    assert list(search.pool.steps) == ["data-parallel M=1 ZeRO-1", "data-parallel M=1 ZeRO-2",
                                       "data-parallel M=1 ZeRO-3"]
    assert search.pool.best.plan.status != "infeasible"
    assert "not built: about" in search.pool.skipped["data-parallel M=1 ZeRO-2 recompute"]


def test_data_parallelism_past_its_deadline_keeps_the_first_order_that_fits():
    """The three device orders are simulated in turn; past ``deadline`` once one fits, the rest
    are skipped. Not past it (or no deadline): the same plan as ever."""
    from pesto.deadline import Deadline

    g, cluster = deep_step(3, weight=1_000_000, act=1_000_000), gpus(4)
    full = data_parallel_plan(g, cluster)
    assert data_parallel_plan(g, cluster, deadline=Deadline(600)).plan.makespan == full.plan.makespan
    gone = Deadline(600)
    gone.interrupt("time limit")
    late = data_parallel_plan(g, cluster, deadline=gone)
    assert late.blocking == "fifo" and late.plan.status != "infeasible"
    assert late.plan.makespan >= full.plan.makespan
