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


# -- the op-level realiser: pipeline_plan on a uniform layered step ---------------------------------

@pytest.fixture(scope="module")
def uniform():
    from benchmarks.bench_schedules import uniform_step
    return uniform_step()


@pytest.fixture(scope="module")
def plans(uniform):
    from pesto.cluster import gpus
    from solver.parallel.pipelines import pipeline_plan
    c = gpus(4, beta=(0.0, 0.0))
    return c, {(n, m): pipeline_plan(uniform, c, schedule=n, micro_batches=m, stages=4)
               for n in SCHEDULES for m in (8, 24)}


def _stage_of_layers(r):
    """Per layer, the GPU its forward copies run on (all slices on one)."""
    from pesto.step.slicing import parse_name
    out = {}
    for name, dev in r.plan.placement.items():
        o = parse_name(name)
        if o.role == "copy" and o.op.endswith("/f"):
            out.setdefault(int(o.op.split("/")[0].split("_")[1]), set()).add(dev)
    assert all(len(d) == 1 for d in out.values())
    return [out[k].pop() for k in sorted(out)]


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_every_schedule_plan_is_valid_and_places_virtual_stages(plans, name):
    from pesto.plan import check_plan
    c, ps = plans
    r = ps[name, 8]
    check_plan(r.graph, c, r.plan).raise_if_invalid()
    assert r.stages == 4 and r.schedule == name and r.plan.placer == name
    dev = [int(d.rsplit(":", 1)[1]) for d in _stage_of_layers(r)]   # 16 layers, in order
    want = {"interleaved": [0, 0, 1, 1, 2, 2, 3, 3] * 2,
            "zb-v": [0, 0, 1, 1, 2, 2, 3, 3, 3, 3, 2, 2, 1, 1, 0, 0]}.get(name, [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4)
    assert dev == want


def test_zb_h1_defers_weight_gradients_as_the_schedule_says(plans):
    from solver.parallel.schedules import actions
    c, ps = plans
    r = ps["zb-h1", 8]
    for d in range(4):
        seq = r.plan.order[f"/GPU:{d}"]
        pos = {n: k for k, n in enumerate(seq)}
        tasks = actions("zb-h1", d, 4, 8)
        first_w = tasks.index(Action("W", 0))
        last_b_before = max(a.slice for a in tasks[:first_w] if a.kind == "B")
        dws = [pos[n] for n in seq if n.endswith("/dw@mb0")]
        dxs = [pos[n] for n in seq if n.endswith(f"/dx@mb{last_b_before}")]
        assert dws and dxs and min(dws) > max(dxs)   # W0 after that B, as listed
        accs = [pos[n] for n in seq if "/dw:0@acc" in n]
        assert accs   # the accumulate ops of the weight gradients run on the W op's GPU


@pytest.mark.parametrize("m", [8, 24])
def test_zero_bubble_figures_at_the_op_level(plans, m):
    from benchmarks.bench_schedules import device_idle
    c, ps = plans
    step = {n: ps[n, m].plan.makespan for n in SCHEDULES}
    unit = 4 * 1000.0 / m   # one stage's forward work of one slice (4 layers of 1 ms / M)
    assert step["zb-h1"] <= step["1f1b"]
    assert step["zb-h1"] == pytest.approx(unit_run("zb-h1", 4, m).step * unit, rel=0.03)   # (M+p-1)... formula
    assert step["zb-v"] == pytest.approx(unit_run("zb-v", 4, m).step * unit, rel=0.03)
    assert step["interleaved"] < step["1f1b"]   # free transfers
    h1 = device_idle(ps["zb-h1", m].plan)
    h2 = device_idle(ps["zb-h2", m].plan)
    assert h2[1] < 0.01 < h1[1] and step["zb-h2"] <= step["zb-h1"] * 1.001


def test_interleaved_refuses_a_count_that_is_not_whole_rounds(uniform):
    from pesto.cluster import gpus
    from solver.parallel.pipelines import pipeline_plan
    with pytest.raises(ValueError, match=r"interleaved M=6: no stage split: interleaved needs the micro-batches "
                                         r"\(6\) to be a multiple of the stages \(4\)"):
        pipeline_plan(uniform, gpus(4), schedule="interleaved", micro_batches=6, stages=4)
    r = pipeline_plan(uniform, gpus(4), schedule="interleaved", micro_batches=6)   # 1, 2 or 3 stages do
    assert 6 % r.stages == 0


def test_the_search_screens_the_new_schedules(uniform):
    from pesto.cluster import gpus
    from solver.parallel.kinds import KINDS
    names = [s.schedule for s in KINDS["zero-bubble"].candidates(uniform, gpus(4), 8)]
    assert names == ["interleaved", "zb-h1", "zb-h2", "zb-v"]
    assert [s.schedule for s in KINDS["pipeline"].candidates(uniform, gpus(4), 8)] == ["gpipe", "1f1b"]
    assert KINDS["zero-bubble"].candidates(uniform, gpus(4), 1) == []


def test_auto_screens_the_new_schedules_on_the_best_count_only():
    # 3 s deterministic: every candidate built is charged to the work clock (about 1.5 s here)
    import pesto
    from benchmarks.generators import training_step
    from pesto.cluster import gpus
    g = training_step(8, act=64_000, weight=4000, t=1000.0, back=1.0)
    r = pesto.solve_step(g, cluster=gpus(4, beta=(0.0, 0.0)), micro_batches="auto", batch_size=8, time_limit=3,
                         deterministic=True, workers=1)
    steps, skipped = r.plan.log.steps, r.plan.log.skipped
    assert {f"{n} M=8" for n in ("interleaved", "zb-h1", "zb-h2", "zb-v")} <= set(steps)
    assert steps["zb-h1 M=8"] < steps["1f1b M=8"] and steps["zb-v M=8"] < steps["zb-h1 M=8"]
    for m in (2, 4):   # the best GPipe/1F1B plans were those of M=8
        assert skipped[f"zero-bubble M={m}"] == "not built: screened for M=8 only, the count whose GPipe/1F1B " \
                                               "plans were best"
        assert not any(n.startswith(("zb-", "interleaved")) and n.endswith(f"M={m}") for n in steps)
    pesto.check_plan(r, gpus(4, beta=(0.0, 0.0))).raise_if_invalid()


def test_the_new_schedules_are_skipped_when_no_fill_could_beat_the_best_plan():
    import pesto
    from benchmarks.generators import training_step
    from pesto.cluster import gpus
    g = training_step(1, act=64_000, weight=4000, t=1000.0, back=1.0)   # one layer: no pipeline to speak of
    r = pesto.solve_step(g, cluster=gpus(4), micro_batches="auto", time_limit=0.2, deterministic=True, workers=1)
    why = r.plan.log.skipped["zero-bubble M=2"]
    assert why.startswith("not built: the best GPipe/1F1B step of M=2 less its fill and drain, ")
    assert "is no better than the best plan's" in why
    assert not any(n.startswith(("zb-", "interleaved")) for n in r.plan.log.steps)


def test_the_hybrid_runs_split_backward_schedules_and_refuses_chunked_ones():
    from pesto.cluster import gpus
    from pesto.plan import check_plan
    from benchmarks.generators import training_step
    from solver.parallel.hybrid import hybrid_plan
    g, c = training_step(8, act=64_000, weight=4000, t=1000.0, back=1.0), gpus(4, beta=(0.0, 0.0))
    one, zb = (hybrid_plan(g, c, replicas=2, micro_batches=8, schedule=s) for s in ("1f1b", "zb-h1"))
    check_plan(zb.graph, c, zb.plan).raise_if_invalid()
    assert zb.schedule == "zb-h1" and zb.plan.makespan < one.plan.makespan
    with pytest.raises(ValueError, match="hybrid: schedule 'zb-v' runs 2 model chunks per device"):
        hybrid_plan(g, c, replicas=2, micro_batches=8, schedule="zb-v")
