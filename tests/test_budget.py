"""The budget planner on its own (solver.budget): skips, reserves, grants,
deterministic mode and interrupts, on a fake clock (no solve, no timing)."""
from __future__ import annotations

import pytest

from pesto.deadline import Deadline
from solver.budget import COSTS, STATUS_RUNS, Budget, Cost, Skip
from solver.recipes import RECIPES

FULL = RECIPES["full"]


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def budget(seconds=100.0, passes=FULL, wants=None, unit=1.0, **kw):
    clock = FakeClock()
    return Budget(Deadline(seconds, clock=clock), passes, wants or {}, unit=unit, **kw), clock


def test_a_predicted_overrun_skips_the_pass_and_says_why():
    b, clock = budget(10.0, ["lns", "status"], unit=2.0)
    assert not isinstance(b.grant("lns"), Skip)  # (1.5 + 3.5) runs of 2 s = 10 s: fits exactly
    clock.t += 1.0
    skip = b.grant("lns")
    assert skip == Skip("time limit (needs ~10.0 s, 9.0 s left)")
    assert skip.note == "skipped: time limit (needs ~10.0 s, 9.0 s left)"


def test_a_step_inside_a_mandatory_pass_is_skipped_when_its_need_does_not_fit():
    b, _ = budget(10.0, ["heuristics", "reschedule", "status"], unit=1.0)
    # a heuristic predicted at 6 s; re-ordering one plan (1 run) and the status pass (3.5) must still fit
    assert isinstance(b.grant("heuristics", need=6.0), Skip)
    assert b.grant("heuristics", need=5.0).seconds == pytest.approx(10.0 - 1.0 - STATUS_RUNS)
    assert b.grant("heuristics").seconds == pytest.approx(5.5)  # no step: the pass itself is never skipped


def test_the_reserve_comes_from_the_passes_still_ahead():
    wants = {"status": 2.0, "local search": 30.0}
    b, _ = budget(100.0, FULL, wants, unit=1.0)
    # an optional pass leaves every pass ahead its least, and the status pass its bound time
    assert b.reserve("lns") == pytest.approx(1.5 + STATUS_RUNS + 2.0)
    assert b.reserve("local search") == pytest.approx(STATUS_RUNS + 2.0)
    assert b.reserve("exact") == pytest.approx(1.5 + 1.5 + STATUS_RUNS + 2.0)
    # a mandatory pass leaves only the mandatory passes ahead their least
    assert b.reserve("reschedule") == pytest.approx(STATUS_RUNS)
    assert b.reserve("heuristics") == pytest.approx(1.0 + STATUS_RUNS)
    assert b.reserve("status") == 0.0
    # a recipe without local search: LNS reserves nothing for it
    short, _ = budget(100.0, ["lns", "status"], wants, unit=1.0)
    assert short.reserve("lns") == pytest.approx(STATUS_RUNS + 2.0)


def test_a_grant_is_what_the_pass_wants_capped_by_the_reserve():
    b, clock = budget(20.0, ["lns", "local search", "status"], {"lns": 8.0, "status": 1.0}, unit=1.0)
    assert b.grant("lns").seconds == pytest.approx(8.0)
    clock.t += 10.0  # 10 s left, 1.5 + 3.5 + 1 reserved
    assert b.grant("lns").seconds == pytest.approx(4.0)
    assert b.grant("lns", want=2.0).seconds == pytest.approx(2.0)


def test_one_group_wants_a_share_of_what_is_left():
    b, clock = budget(10.0, ["one group", "status"], unit=None)
    assert b.grant("one group").seconds == pytest.approx(COSTS["one group"].share * 10.0)
    clock.t += 5.0
    assert b.grant("one group").seconds == pytest.approx(COSTS["one group"].share * 5.0)


def test_the_exact_pass_is_skipped_with_coarsen_when_coarsen_did_not_fit():
    b, _ = budget(5.0, ["coarsen", "exact", "expand", "status"], unit=1.0)
    skip = b.grant("coarsen")  # 4 runs + 1 s + 3.5 runs > 5 s
    assert isinstance(skip, Skip) and skip.reason.startswith("time limit (needs ~8.5 s")
    b.skip("coarsen", skip)
    assert b.grant("exact") == Skip("time limit (no time to coarsen and expand)")
    assert b.stopped == "time limit" and b.skipped["coarsen"] == skip.reason


def test_a_pass_with_no_least_cost_is_not_skipped_by_a_prediction():
    costs = {**COSTS, "coarsen": Cost()}  # nothing to coarsen
    b, _ = budget(1.0, ["coarsen", "exact", "status"], costs=costs, unit=10.0)
    assert not isinstance(b.grant("coarsen"), Skip)
    assert not isinstance(b.grant("exact"), Skip)  # the exact pass has no least cost of its own


def test_without_a_unit_nothing_is_predicted():
    b, clock = budget(10.0, FULL, unit=None)
    assert not b.predicting and b.runs(100.0) == 0.0 and b.fits(1e9)
    assert not isinstance(b.grant("local search"), Skip)
    b.measure(2.0)
    b.measure(5.0)  # measured once: a later measure does not change the unit
    assert b.unit == 2.0 and b.predicting and b.runs(1.5) == 3.0


def test_deterministic_mode_never_skips_on_wall_time_but_on_charged_work():
    d = Deadline(10.0, deterministic=True)
    b = Budget(d, ["heuristics", "lns", "local search", "status"], {"lns": 4.0, "status": 1.0}, unit=100.0)
    assert not b.predicting and b.runs(5.0) == 0.0 and b.fits(1e9)
    assert not isinstance(b.grant("lns"), Skip)  # 150 + 350 runs of 100 s would never fit on the wall clock
    assert not isinstance(b.grant("heuristics", need=1e6), Skip)
    assert b.grant("lns").seconds == pytest.approx(4.0)
    assert b.grant("local search").seconds == pytest.approx(9.0)  # leaves the status pass its bound time
    d.charge(10.5)  # the work charged passes the limit
    assert b.grant("local search") == Skip("time limit")
    assert b.grant("status").expired()  # a mandatory pass still runs, on an expired deadline


def test_an_interrupt_skips_the_optional_passes_and_steps_and_is_the_stop_reason():
    b, _ = budget(100.0, FULL, unit=1.0)
    b.deadline.interrupt("SIGINT")
    for st in ("one group", "coarsen", "exact", "lns", "local search"):
        assert b.grant(st) == Skip("SIGINT")
    assert b.grant("heuristics", need=0.1) == Skip("SIGINT")  # the next heuristic does not start
    status = b.grant("status")
    assert not isinstance(status, Skip) and status.expired() and status.reason == "SIGINT"
    b.skip("lns", Skip("SIGINT"))
    assert b.stopped == "SIGINT"


def test_a_passed_deadline_skips_the_optional_passes_only():
    b, clock = budget(10.0, FULL, unit=None)
    clock.t += 11.0
    assert b.grant("lns") == Skip("time limit")
    assert b.grant("expand").expired() and not isinstance(b.grant("reschedule"), Skip)


def test_finish_skips_the_optional_passes_only_and_keeps_its_first_reason():
    b = Budget(Deadline(60.0), RECIPES["full"], unit=0.01)
    b.finish("stopped early: proved")
    b.finish("another reason")
    for pass_name in ("one group", "coarsen", "exact", "lns", "local search"):
        skip = b.grant(pass_name)
        assert skip == Skip("stopped early: proved", early=True)
        b.skip(pass_name, skip)
    assert b.stopped == "stopped early: proved" and b.stopped_early
    assert not isinstance(b.grant("expand"), Skip) and not isinstance(b.grant("status"), Skip)
    assert not isinstance(b.grant("heuristics", need=0.1), Skip)  # a heuristic still runs


def test_a_skip_for_time_is_not_an_early_stop():
    b = Budget(Deadline(4.0), ["lns", "status"], unit=1.0)
    b.skip("lns", b.grant("lns"))
    assert b.stopped == "time limit" and not b.stopped_early
