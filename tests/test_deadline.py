"""One clock per solve (pesto.deadline) and CP-SAT stopping on it."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from benchmarks.generators import layered_dag
from pesto.cluster import gpus
from pesto.deadline import Deadline, Stopped
from solver.cpsat import place_cpsat
from solver.registry import get_placer
from solver.search import reschedule

# Ctrl-C as in a terminal, however pytest was started (conftest.ctrl_c)
pytestmark = pytest.mark.usefixtures("ctrl_c")


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_left_budget_and_expiry_follow_the_clock():
    clock = FakeClock()
    d = Deadline(10, clock=clock)
    assert d.left() == 10 and d.budget(4) == 4 and not d.expired()
    clock.t += 8
    assert d.left() == pytest.approx(2) and d.budget(4) == pytest.approx(2)
    clock.t += 5
    assert d.left() == 0 and d.budget(4) == 0 and d.expired() and not d.interrupted
    assert Deadline(None).left() == float("inf")


def test_interrupt_runs_stoppers_once_registered_and_at_once_when_late():
    d = Deadline(10)
    calls = []
    with d.stopping(lambda: calls.append("a")):
        d.interrupt("SIGTERM")
        d.interrupt("SIGINT")  # the first reason stays
    with d.stopping(lambda: calls.append("b")):
        pass
    d.interrupt("again")  # no stopper left registered
    assert calls == ["a", "b"] and d.reason == "SIGTERM" and d.left() == 0


def test_signals_interrupt_once_then_abort_and_handlers_come_back():
    before = signal.getsignal(signal.SIGINT)
    d = Deadline(60)
    with d.catching_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert d.reason == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    assert signal.getsignal(signal.SIGINT) is before


def test_cpsat_search_stops_when_the_deadline_is_interrupted():
    g = layered_dag(150, width=8, seed=1)
    d = Deadline(60)
    threading.Timer(1.0, d.interrupt, args=("SIGINT",)).start()
    t = time.perf_counter()
    plan = place_cpsat(g, gpus(2), time_limit=60, workers=2, deadline=d)
    assert time.perf_counter() - t < 30  # stopped long before its 60 s (generous: shared CI cores)
    assert plan.makespan is not None and d.reason == "SIGINT"
    again = place_cpsat(g, gpus(2), time_limit=60, workers=2, deadline=d)  # expired: not searched
    assert again.stats["fallback"].startswith("not searched")


def test_ctrl_c_reaches_the_caller_during_a_cpsat_search():
    g = layered_dag(150, width=8, seed=1)
    timer = threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    t = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        place_cpsat(g, gpus(2), time_limit=60, workers=2)
        time.sleep(60)  # if the search ended before the signal, wait for it here
    assert time.perf_counter() - t < 30


def test_deterministic_deadline_moves_only_by_charged_work():
    d = Deadline(2.0, deterministic=True)
    time.sleep(0.05)
    assert d.deterministic and d.left() == 2.0
    d.charge(1.5)
    assert d.left() == pytest.approx(0.5) and not d.expired()
    d.charge(1.0)
    assert d.expired()
    wall = Deadline(2.0)
    wall.charge(5.0)  # the wall clock ignores charges
    assert not wall.deterministic and not wall.expired()


def test_cpsat_on_a_deterministic_deadline_repeats_its_plan():
    g = layered_dag(60, width=6, seed=2)
    plans = []
    for _ in range(2):
        d = Deadline(0.5, deterministic=True)
        plans.append(place_cpsat(g, gpus(2), time_limit=0.5, workers=2, deadline=d))
        assert d.clock() > 0  # CP-SAT's deterministic time was charged
    a, b = plans
    assert a.placement == b.placement and a.order == b.order and a.makespan == b.makespan


def test_a_pass_deadline_ends_with_its_share_or_the_solve():
    clock = FakeClock()
    solve = Deadline(10, clock=clock)
    part = solve.sub(4)
    assert part.left() == 4
    clock.t += 5
    assert part.expired() and not solve.expired()
    late = solve.sub(20)  # never beyond the solve's own end
    assert late.left() == pytest.approx(5)
    calls = []
    with late.stopping(lambda: calls.append(1)):
        solve.interrupt("SIGTERM")
    assert late.expired() and late.reason == "SIGTERM" and calls == [1]


@pytest.mark.parametrize("name", ["m-topo", "m-etf", "m-sct", "heft", "celeritas"])
def test_a_heuristic_stops_on_a_passed_or_interrupted_deadline(name):
    g, c = layered_dag(300, width=6, seed=2), gpus(2)
    with pytest.raises(Stopped) as exc:
        get_placer(name)(g, c, deadline=Deadline(0.0))
    assert exc.value.reason == "time limit"
    d = Deadline(60)
    d.interrupt("SIGINT")
    with pytest.raises(Stopped, match="SIGINT"):
        get_placer(name)(g, c, deadline=d)
    # a live deadline changes nothing: the same plan as without one
    a, b = get_placer(name)(g, c), get_placer(name)(g, c, deadline=Deadline(60))
    assert a.placement == b.placement and a.makespan == b.makespan


def test_the_expert_keeps_its_first_split_when_the_deadline_has_passed():
    g, c = layered_dag(300, width=6, seed=2), gpus(2)
    full, cut = get_placer("expert")(g, c), get_placer("expert")(g, c, deadline=Deadline(0.0))
    assert len(full.stats["expert_candidates"]) > 1
    assert len(cut.stats["expert_candidates"]) == 1 and cut.stats["expert_cut"] == "time limit"


def test_reschedule_past_its_deadline_keeps_the_given_order_only():
    g, c = layered_dag(300, width=6, seed=2), gpus(2)
    start = get_placer("m-etf")(g, c)
    p = reschedule(g, c, start, deadline=Deadline(0.0))
    assert list(p.stats["reschedule"]) == ["given"] and p.stats["reschedule_cut"] == "time limit"
    assert p.makespan == pytest.approx(start.makespan)
    assert len(reschedule(g, c, start, deadline=Deadline(60)).stats["reschedule"]) == 4


def test_ignored_signals_stay_ignored():
    # nohup, or a job a script started with '&': the caller chose not to be stopped by Ctrl-C
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        d = Deadline(60.0)
        with d.catching_signals():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            assert not d.interrupted
            os.kill(os.getpid(), signal.SIGTERM)  # not ignored: still caught
            time.sleep(0.05)
            assert d.interrupted and d.reason == "SIGTERM"
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_an_ignored_sigint_does_not_cut_a_solve_short():
    import pesto

    g = layered_dag(400, width=8, seed=2)
    cluster = pesto.v100x2_nvlink()
    sent = []
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    timer = threading.Timer(0.5, lambda: (sent.append(time.perf_counter()), os.kill(os.getpid(), signal.SIGINT)))
    try:
        timer.start()
        plan = pesto.solve(g, cluster=cluster, time_limit=3.0, workers=1)
        end = time.perf_counter()
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, before)
    assert sent and sent[0] < end  # the signal came while the solve ran
    assert plan.status != "interrupted" and plan.log.stopped != "SIGINT"


def test_an_interrupt_before_the_search_has_begun_still_stops_it():
    # OR-Tools ignores stop_search until its solve has started: a deadline interrupted
    # just before (a signal while the worker thread starts) must still stop the search
    from ortools.sat.python import cp_model
    from solver.cpsat_model import CpsatModel
    from solver.cpsat_solve import search
    model = CpsatModel(layered_dag(150, width=8, seed=1), gpus(2))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = 60
    solver.parameters.catch_sigint_signal = False
    solver.parameters.num_workers = 2
    d = Deadline(60)
    d.interrupt("SIGINT")
    t = time.perf_counter()
    search(solver, model.model, d)
    assert time.perf_counter() - t < 20  # not the 60 s limit (generous: shared CI cores)
