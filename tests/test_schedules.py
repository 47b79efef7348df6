"""solver.parallel.schedules: the schedules as data, their lists run with fixed task times."""
from __future__ import annotations

import pytest

from solver.parallel.schedules import SCHEDULES, Action, Schedule, interleaved, unit_run

CASES = [(p, m) for p in (1, 2, 3, 4, 5, 8) for m in (1, 2, 3, 4, 7, 8, 12, 24)]


@pytest.mark.parametrize("name", list(SCHEDULES))
@pytest.mark.parametrize("p,m", CASES)
def test_every_task_once_and_no_deadlock(name, p, m):
    sch = SCHEDULES[name]
    if sch.refuses(p, m):
        assert name == "interleaved" and m % p
        return
    kinds = "FBW" if sch.split_backward else "FB"
    for s in range(p):
        seq = sch.actions(s, p, m)
        assert sorted(seq, key=repr) == sorted((Action(k, i, c) for k in kinds for i in range(m)
                                                for c in range(sch.chunks)), key=repr)
        for c in range(sch.chunks):   # per chunk: a slice's F before its B before its W
            for i in range(m):
                pos = [seq.index(Action(k, i, c)) for k in kinds]
                assert pos == sorted(pos)
    for times, comm in [((1.0, 1.0, 1.0), 0.0), ((1.0, 2.0, 0.5), 0.3), ((2.0, 1.0, 1.0), 1.0)]:
        r = unit_run(name, p, m, times, comm)   # raises on a deadlock
        work = m * (times[0] + times[1] + times[2])
        assert all(b == pytest.approx(work) for b in r.busy)
        assert r.step >= work - 1e-9


def test_deadlock_and_missing_tasks_are_named(monkeypatch):
    from solver.parallel import schedules
    stuck = Schedule("stuck", lambda s, p, m: [Action("B", i) for i in range(m)] + [Action("F", i) for i in range(m)])
    short = Schedule("short", lambda s, p, m: [Action("F", 0)])
    monkeypatch.setattr(schedules, "SCHEDULES", {"stuck": stuck, "short": short})
    with pytest.raises(ValueError, match=r"'stuck' deadlocks with 2 stages and M=2: device 0: Action\(kind='B'"):
        unit_run("stuck", 2, 2)
    with pytest.raises(ValueError, match="device 0's list does not hold every F/B task of 2 slices x 1 chunks"):
        unit_run("short", 2, 2)


@pytest.mark.parametrize("m", [8, 24])
def test_known_figures_on_uniform_stages(m):
    p = 4
    run = {n: unit_run(n, p, m) for n in SCHEDULES}
    assert run["1f1b"].step == run["gpipe"].step == (m + p - 1) * 3
    assert run["1f1b"].peak == (4.0, 3.0, 2.0, 1.0) and max(run["gpipe"].peak) == m
    # ZB-H1: 1F1B's memory, a third of its bubble: (p-1)(F+B-W) against (p-1)(F+B+W)
    assert run["zb-h1"].step == 3 * m + (p - 1) * (1 + 1 - 1)
    assert (run["zb-h1"].step - 3 * m) * 3 == run["1f1b"].step - 3 * m
    assert max(run["zb-h1"].peak) == max(run["1f1b"].peak)
    # ZB-H2: 2p-1 slices in flight, no device idle between its first and last task
    assert max(run["zb-h2"].peak) == 2 * p - 1 and run["zb-h2"].stage_bubble == 0.0
    assert run["zb-h2"].step <= run["zb-h1"].step
    # interleaved: the fill shrinks by the chunks (Megatron: (p-1)/v), more memory
    assert run["interleaved"].step == pytest.approx(3 * m + 3 * (p - 1) / 2)
    assert max(run["interleaved"].peak) > max(run["1f1b"].peak)
    # ZB-V: 1F1B's memory, the smallest step of all, no idle time inside a device's span
    assert max(run["zb-v"].peak) == p and run["zb-v"].stage_bubble == 0.0
    assert run["zb-v"].step == min(r.step for r in run.values())


def test_zb_h2_gains_over_h1_when_weight_gradients_are_cheaper():
    t = (1.0, 1.0, 0.5)
    assert unit_run("zb-h2", 4, 8, t).step < unit_run("zb-h1", 4, 8, t).step < unit_run("1f1b", 4, 8, t).step


def test_virtual_stage_maps():
    v, il = SCHEDULES["zb-v"], SCHEDULES["interleaved"]
    assert [v.device(s, 4) for s in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert [il.device(s, 4) for s in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    for sch in (v, il):
        for s in range(8):
            assert sch.virtual(sch.device(s, 4), sch.chunk(s, 4), 4) == s
    assert il.refuses(4, 6) and not il.refuses(4, 8)


def test_interleaved_is_megatrons_order():
    # p=2, v=2, M=4, device 0: warm-up 2(p-1) + (v-1)p = 4 forwards
    got = [f"{a.kind}{a.slice}.{a.chunk}" for a in interleaved(2)(0, 2, 4)]
    assert got == ["F0.0", "F1.0", "F0.1", "F1.1", "F2.0", "B0.1", "F3.0", "B1.1", "F2.1", "B0.0",
                   "F3.1", "B1.0", "B2.1", "B3.1", "B2.0", "B3.0"]
