"""The plain solve's promises hold in the memory-bound screening (``_Search.tight``: counts
descending, every kind at once, the leanest first): an interrupt returns the best plan so
far, a short limit holds, and a deterministic solve repeats itself."""
from __future__ import annotations

import time

import pytest

import pesto
from mb_strategies import layered_step


@pytest.fixture(scope="module")
def big():
    """4 layers, 40 MB activations each: 0.16 GB live at the loss, weights tiny."""
    return layered_step(4, act=40_000_000, t=1000.0)


@pytest.fixture(scope="module")
def short():
    """Four GPUs of 30 MB: neither the whole step nor data parallelism fits (memory-bound)."""
    return pesto.cluster.gpus(4, memory=30_000_000)


def _solve(graph, cluster, **kw):
    kw = {"micro_batches": "auto", "batch_size": 16, "time_limit": 10, "workers": 1, **kw}
    return pesto.solve_step(graph, cluster=cluster, **kw)


def test_the_step_is_memory_bound(big, short):
    lines = []
    _solve(big, short, time_limit=2, progress=lines.append)
    assert any("needs at least" in ln for ln in lines), lines[:5]


def test_an_interrupt_while_screening_returns_the_best_plan_that_fits(big, short):
    import solver.parallel.search as ss
    real, seen = ss._Search.screen_one, []

    def screen_one(self, kind, strategy, s, *args, **kw):
        seen.append(strategy)
        r = real(self, kind, strategy, s, *args, **kw)
        best = self.pool.best   # once a plan that fits exists (auto's first plans: sharded DP, over memory)
        if best is not None and best.plan.status != "infeasible" and not self.deadline.reason:
            self.deadline.interrupt("SIGTERM")
        return r

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ss._Search, "screen_one", screen_one)
        t = time.perf_counter()
        r = _solve(big, short, time_limit=60)
    assert time.perf_counter() - t < 20
    assert r.plan.status == "interrupted" and r.plan.log.stopped == "SIGTERM"
    assert r.micro_batches > 1
    pesto.check_plan(r.graph, short, r.plan).raise_if_invalid()   # memory included


def test_a_one_second_limit_holds_when_memory_bound(big, short):
    t = time.perf_counter()
    r = _solve(big, short, time_limit=1)
    assert time.perf_counter() - t < 1 + 2 + 2   # the README's tolerance, doubled for a loaded machine
    pesto.check_plan(r.graph, short, r.plan).raise_if_invalid()


def test_a_deterministic_memory_bound_solve_repeats_itself(big, short):
    a, b = (_solve(big, short, time_limit=2, deterministic=True) for _ in range(2))
    assert a.plan.log.steps == b.plan.log.steps
    assert a.plan.placement == b.plan.placement and a.plan.order == b.plan.order
