"""Deterministic CP-SAT parameters: one worker searches alone, several interleave.

OR-Tools 9.15's interleaved search of a single worker ("batch size of 0") corrupted
memory on the slice model of an 8-layer step (``mb_strategies.deep_step(8, act=1e6,
t=1000, weight=4e5)`` on 4 GPUs of 5.3 MB, ``micro_batches=8``, ``deterministic=True``,
``time_limit=60``): a segmentation fault 34 s into the search, the process gone with
no plan. A single worker is deterministic without it, so Pesto interleaves only
several workers (:func:`solver.cpsat_solve.interleave`), in every CP-SAT model."""
from __future__ import annotations

import pytest
from ortools.sat.python import cp_model

from solver.cpsat_solve import deterministic_parameters, interleave


@pytest.mark.parametrize("workers, interleaved", [(1, False), (2, True), (8, True), (0, True)])
def test_deterministic_parameters_interleave_several_workers_only(workers, interleaved):
    p = cp_model.CpSolver().parameters
    p.num_workers = workers
    deterministic_parameters(p, 5.0)
    assert p.interleave_search is interleaved
    assert p.max_deterministic_time == 5.0   # the budget is deterministic time either way
    interleave(p)
    assert p.interleave_search is interleaved


def test_one_worker_deterministic_solves_repeat_exactly():
    """Without interleaving, one worker's deterministic search is still reproducible."""
    def once() -> tuple:
        m = cp_model.CpModel()
        x = [m.new_int_var(0, 20, f"x{i}") for i in range(12)]
        for a, b in zip(x, x[1:]):
            m.add(a + b >= 7)
        m.add_all_different(x)
        m.minimize(sum((i % 5 + 1) * v for i, v in enumerate(x)))
        s = cp_model.CpSolver()
        s.parameters.num_workers, s.parameters.random_seed = 1, 3
        deterministic_parameters(s.parameters, 0.5)
        s.solve(m)
        return s.objective_value, tuple(s.value(v) for v in x), s.parameters.interleave_search

    assert once() == once()
    assert once()[2] is False


def test_deterministic_solve_stops_at_its_wall_net(monkeypatch):
    """A deterministic solve's limit is work, not wall time; on a loaded machine it
    could run a quarter of an hour past a 60 s limit. Its wall-clock net (here made
    0.5 s) ends it as its limit would: the best plan comes back, saying why
    (it is no longer reproducible), not marked ``interrupted`` (nobody interrupted it)."""
    import time
    import pesto
    import pesto.deadline
    from pesto.cluster import gpus
    from tests.mb_strategies import deep_step

    monkeypatch.setattr(pesto.deadline, "wall_net", lambda seconds: 0.5)
    t0 = time.perf_counter()
    cluster = gpus(4, memory=int(8e6))
    r = pesto.solve_step(deep_step(6, act=1_000_000, t=1000.0, weight=400_000), cluster=cluster,
                         micro_batches=4, deterministic=True, time_limit=60, workers=1)
    plan = r.plan
    assert plan.status in ("feasible", "heuristic", "optimal")
    assert plan.log.stopped == pesto.deadline.WALL_NET_REASON
    pesto.check_plan(r, cluster)
    assert time.perf_counter() - t0 < 45.0   # far below the 60 s of deterministic work it was given
