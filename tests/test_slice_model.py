"""solver.parallel.slice_model: the joint slice-aware exact model (issue 24, item 3)."""
from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest

import pesto
from mb_strategies import layered_step
from pesto.cluster import gpus, hosts
from pesto.graph import Edge, Op, OpGraph, Tensor
from pesto.step import split
from tf_patch.marks import mark_phases
from pesto.plan import check_plan
from solver.parallel.pipelines import pipeline_plan
from solver.registry import PLACERS
from solver.parallel.slice_cpsat import GridModel
from solver.parallel.slice_grid import slice_grid
from solver.parallel.slice_model import solve_slices


def chain(times, nbytes=None, *, keep=None) -> OpGraph:
    """Layers ``l0..l{n-1}`` then their gradients in reverse, one chain, all batched.

    ``times[k]``: µs of layer k's forward and of its gradient; ``nbytes[j]``:
    bytes of the j-th op's output (default 8); ``keep``: bytes of an extra
    tensor each layer hands to its own gradient (its activation)."""
    n = len(times)
    names = [f"l{k}" for k in range(n)] + [f"gradients/l{k}_grad" for k in reversed(range(n))]
    cost = list(times) + list(reversed(times))
    nbytes = nbytes or [8] * len(names)
    ops = [Op(a, {"GPU": float(t)}, output_bytes=b, batch=True, scope=a) for a, t, b in zip(names, cost, nbytes)]
    ts = [Tensor(f"{a}:0", a, b) for a, b in zip(names, nbytes)]
    es = [Edge(a, b, (f"{a}:0",)) for a, b in zip(names, names[1:])]
    if keep:
        for k in range(n - 1):
            ts.append(Tensor(f"l{k}:1", f"l{k}", keep))
            es.append(Edge(f"l{k}", f"gradients/l{k}_grad", (f"l{k}:1",)))
        ops = [Op(o.name, o.compute, output_bytes=o.output_bytes + (keep if o.name[1:].isdigit() else 0),
                  batch=True, scope=o.scope) for o in ops]
    return mark_phases(OpGraph(ops, es, ts, name=f"chain{n}"))   # TF's rule: gradients/ mirror the layers


@pytest.mark.parametrize("m,optimum", [(2, 30.0), (4, 25.0)])
def test_two_layer_chain_golden_optimum(m, optimum):
    """F0 -> F1 -> B1 -> B0, 10 µs each un-split (10 / M per slice), free links, 2 GPUs.

    Derivation: one stage runs 4 M tasks of 10 / M µs = 40 µs. Two stages hold
    20 µs of work each. Stage 1 (block 1) can start only after F0 of slice 0
    (10 / M) and its last task is a backward B1 (each F1 comes before its B1
    on the same device), so it ends at >= 10 / M + 20, and the B0 of that
    slice follows: makespan >= 20 + 20 / M (30 for M = 2, 25 for M = 4).
    GPipe's order reaches it: F0 of every slice, back to back, feeds F1 in
    time; B0 of slice s follows B1 of slice s. So it is the optimum.
    """
    g = chain([10, 10])
    c = gpus(2, beta=(0.0, 0.0))
    r = solve_slices(g, c, micro_batches=m, time_limit=5, workers=1)
    assert r.status == "optimal" and r.blocks == 2
    assert r.objective == pytest.approx(optimum) and r.grid_bound == pytest.approx(optimum)
    assert len(set(r.block_device)) == 2
    assert r.plan.makespan == pytest.approx(optimum)
    check_plan(r.graph, c, r.plan).raise_if_invalid()


def _oracle(grid, cluster) -> float:
    """The grid's optimum by enumeration: every block -> device map, every
    global task order consistent with the precedences, tasks started as early
    as their device and inputs allow (an optimal schedule, left-shifted, is
    the greedy schedule of its own start order)."""
    m, nb = grid.micro_batches, grid.blocks
    tasks = [(b, p, s) for b in range(nb) for p in (0, 1) for s in range(m)]
    pred = {t: [] for t in tasks}
    for bu, pu, bv, pv, nbytes in grid.edges:
        for s in range(m):
            pred[bv, pv, s].append(((bu, pu, s), nbytes))
    best = float("inf")
    for devs in itertools.product(*grid.allowed):
        def delay(u, v, nbytes):
            a, b = grid.devices[devs[u[0]]], grid.devices[devs[v[0]]]
            return cluster.transfer_time(a, b, nbytes)

        def orders(done, left):
            if not left:
                yield list(done)
                return
            for t in sorted(left):
                if all(u in done for u, _ in pred[t]):
                    done.append(t)
                    yield from orders(done, left - {t})
                    done.pop()

        for order in orders([], frozenset(tasks)):
            free, end = {}, {}
            for t in order:
                d = devs[t[0]]
                ready = max([end[u] + delay(u, t, nb_) for u, nb_ in pred[t]], default=0.0)
                start = max(free.get(d, 0.0), ready)
                end[t] = start + grid.dur[t[0], t[1], t[2], d]
                free[d] = end[t]
            best = min(best, max(end.values()))
    return best


@pytest.mark.parametrize("seed", range(4))
def test_grid_optimum_matches_brute_force(seed):
    rnd = random.Random(seed)
    times = [rnd.choice([8, 12, 16, 20]) for _ in range(3)]
    nbytes = [rnd.choice([0, 1000, 3000]) for _ in range(6)]
    c = gpus(2, beta=(float(rnd.choice([0, 2, 5])), 0.001))
    grid = slice_grid(split(chain(times, nbytes), 2), c)
    assert grid.blocks <= 3
    ans = GridModel(grid, c).solve(time_limit=5, workers=1)
    assert ans.status == "optimal"
    assert ans.objective == pytest.approx(_oracle(grid, c), abs=0.02)


def test_plan_is_checked_and_keeps_a_block_on_one_device():
    g = layered_step(4, act=100_000, t=1000.0)
    c = gpus(2)
    r = solve_slices(g, c, micro_batches=2, time_limit=3, workers=1)
    check_plan(r.graph, c, r.plan).raise_if_invalid()
    parts = split(g, 2)
    block = r.plan and slice_grid(parts, c).blocking.block
    by_block: dict = {}
    for name, o in parts.origin.items():
        if o.role == "copy":
            by_block.setdefault(block[g.index[o.op]], set()).add(r.plan.placement[name])
    assert all(len(d) == 1 for d in by_block.values())
    assert r.plan.placer == "slice-cpsat" and r.status in ("optimal", "feasible")


def test_heterogeneous_links_cut_where_cheapest():
    """Two hosts of two GPUs (NVLink inside, 10 GbE between), four layers whose
    middle activation is heavy (8 MB: 0.3 ms over NVLink, 6.4 ms over 10 GbE)
    and the others light: the plan spreads over both hosts and keeps the heavy
    cut inside one."""
    heavy, light = 8_000_000, 1_000
    nbytes = [light, heavy, light, light, light, heavy, light, light]
    g = chain([4000, 4000, 4000, 4000], nbytes)
    c = hosts(2, 2, "10gbe")
    r = solve_slices(g, c, micro_batches=2, time_limit=5, workers=1)
    host = {d: d.split("/device")[0] for d in c.names}
    block = slice_grid(split(g, 2), c).blocking.block
    dev = [r.block_device[block[g.index[f"l{k}"]]] for k in range(4)]
    assert len({host[d] for d in dev}) == 2 and host[dev[1]] == host[dev[2]]
    check_plan(r.graph, c, r.plan).raise_if_invalid()


def test_memory_forces_an_order_that_fits():
    """Layer 0 keeps 400 MB per slice for its gradient, a GPU holds 1 GB: the
    4 slices GPipe keeps alive do not fit (on any stage split), two do."""
    g = chain([1000, 1000], [8, 8, 8, 8], keep=1_600_000_000)   # 400 MB a slice
    cap = 1_000_000_000
    c = gpus(2, memory=cap, beta=(0.0, 0.0))
    gp = pipeline_plan(g, c, schedule="gpipe", micro_batches=4)
    r = solve_slices(g, c, micro_batches=4, time_limit=5, workers=1)
    assert gp.plan.status == "infeasible"
    assert r.plan.status != "infeasible" and max(r.plan.peak_memory.values()) <= cap


def test_solve_offers_the_slice_plan():
    g = layered_step(4, act=100_000, t=1000.0)
    plan = pesto.solve(g, cluster=pesto.v100x2_nvlink(), micro_batches=2, time_limit=3, workers=1)
    assert "slice M=2" in plan.log.steps


def test_registered_as_a_placer():
    g = layered_step(2, act=1000, t=100.0)
    plan = PLACERS["slice-cpsat"](g, gpus(2), micro_batches=2, time_limit=2, workers=1)
    assert plan.placer == "slice-cpsat" and "l" not in plan.placement and "layer_0/f@mb1" in plan.placement


# --- F, B and W tasks (issue 30, item 3) -------------------------------------------------------------------

def _uniform(p: int, m: int):
    """``p`` identical layers, ``T_F = T_B = T_W`` = 1 ms a slice in ``m`` slices, free links, small weights."""
    from benchmarks.generators import uniform_stages
    return uniform_stages(p, t=1000.0 * m, act=1 << 20, params=1 << 10), gpus(p, beta=(0.0, 0.0))


def _held(grid, ans, d: int) -> float:
    """The most activation bytes device ``d`` holds at once on the grid's answer, over one slice's of its blocks."""
    events, one = [], 0.0
    for b in range(grid.blocks):
        if ans.block_device[b] != d or not grid.activation[b]:
            continue
        one += grid.activation[b]
        last = grid.last(b)
        for s in range(grid.micro_batches):
            end = ans.start[b, last, s] + grid.dur[b, last, s, d]
            events += [(ans.start[b, 0, s], grid.activation[b]), (end, -grid.activation[b])]
    held = peak = 0.0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):   # frees first at one instant
        held += step
        peak = max(peak, held)
    return peak / one if one else 0.0


def test_uniform_split_backward_finds_zb_h1_at_1f1b_memory():
    """p = 3, M = 4, T_F = T_B = T_W: with W tasks and 1F1B's in-flight limit (p slices), the model
    reaches ZB-H1's step, which here is the fill/drain bound M (T_F + T_B + T_W) + (p - 1) T_F = 14 ms
    (plus the data op, the loss and the updates: 17 µs); F/B alone cannot go under 1F1B's bubble
    (its grid optimum is 1F1B's 18 ms). The simulator's step is the model's."""
    p, m = 3, 4
    g, c = _uniform(p, m)
    zb = pipeline_plan(g, c, schedule="zb-h1", micro_batches=m, stages=p).plan.makespan
    fb = solve_slices(g, c, micro_batches=m, time_limit=10, workers=1, weight_tasks=False)
    fbw = solve_slices(g, c, micro_batches=m, time_limit=10, workers=1, in_flight=p)
    free = solve_slices(g, c, micro_batches=m, time_limit=10, workers=1)
    bound = m * 3000.0 + (p - 1) * 1000.0
    assert fbw.status == free.status == "optimal"
    assert bound <= fbw.objective <= zb + 1e-6 and fbw.objective < bound + 20
    assert free.objective == pytest.approx(fbw.objective)
    assert fb.objective > fbw.objective + 3000
    assert fbw.plan.makespan == pytest.approx(fbw.objective, rel=1e-3)
    check_plan(fbw.graph, c, fbw.plan).raise_if_invalid()


def test_in_flight_limit_holds_on_the_grid():
    """One slice in flight per device: every block's slices run one at a time
    (each F waits for the slice before to leave W), so the step is longer."""
    p, m = 2, 4
    g, c = _uniform(p, m)
    split_g = split(g, m)
    grid = slice_grid(split_g, c)
    one = GridModel(grid, c, in_flight=1).solve(time_limit=5, workers=1)
    free = GridModel(grid, c).solve(time_limit=3, workers=1)
    assert one.objective is not None and all(_held(grid, one, d) <= 1 for d in range(p))
    for b in (b for b in range(grid.blocks) if grid.has_w[b]):   # W in slice order (the accumulate chain)
        starts = [free.start[b, 2, s] for s in range(m)]
        assert starts == sorted(starts) and all(free.start[b, 2, s] >= free.start[b, 1, s] for s in range(m))
    assert one.objective > free.objective
    with pytest.raises(ValueError, match="in_flight=0"):
        GridModel(grid, c, in_flight=0)


def test_weight_tasks_follow_their_input_gradient_and_feed_only_the_update():
    g, c = _uniform(2, 2)
    grid = slice_grid(split(g, 2), c)
    w = {i for i, ph in enumerate(grid.task_phase) if ph == 2}
    assert {g.names[i] for i in w} == {"gradients/layer_0/dw", "gradients/layer_1/dw"}
    assert all(pv == 2 or pu != 2 for _, pu, _, pv, _ in grid.edges)   # W feeds no F/B task
    plain = slice_grid(split(g, 2), c, weight_tasks=False)
    assert not any(plain.has_w) and (plain.dur[:, 2] == 0).all()
    assert plain.dur.sum() == pytest.approx(grid.dur.sum())


def test_uneven_stages_beat_every_schedule():
    """Three uneven layers (F, B, W in ms a slice: (1, 2, 1), (2, 1, 1), (1, 1, 2)), M = 4, 3 GPUs: the
    model orders F, B and W per device past every schedule of SCHEDULES (best: ZB-H2, 20.0 ms)."""
    from benchmarks.generators import uniform_stages
    from solver.parallel.schedules import SCHEDULES
    m, times = 4, [(1, 2, 1), (2, 1, 1), (1, 1, 2)]
    base = uniform_stages(3, t=1000.0, act=1 << 20, params=1 << 10)
    cost = {}
    for l, (f, b, w) in enumerate(times):
        cost.update({f"layer_{l}/f": f, f"gradients/layer_{l}/dx": b, f"gradients/layer_{l}/dw": w})
    g = OpGraph([replace(op, compute={"GPU": 1000.0 * m * cost[op.name]}) if op.name in cost else op
                 for op in base.ops], base.edges, base.tensors, name="uneven3")
    c = gpus(3, beta=(0.0, 0.0))
    steps = {}
    for s in SCHEDULES:
        try:
            steps[s] = pipeline_plan(g, c, schedule=s, micro_batches=m).plan.makespan
        except ValueError:
            continue   # a chunked schedule needs more blocks than the step has
    assert {"gpipe", "1f1b", "zb-h1", "zb-h2"} <= set(steps)
    r = solve_slices(g, c, micro_batches=m, time_limit=10, workers=1, in_flight=3)
    assert r.plan.makespan < min(steps.values()) - 500
    check_plan(r.graph, c, r.plan).raise_if_invalid()


def test_memory_limit_holds_on_the_realised_plan():
    """GPUs with ZB-H1's peak memory and 2 % (GPipe's and ZB-H2's plans exceed it), the grid hinted
    with the ZB-H2 plan that breaks it: under 1F1B's in-flight count the realised plan fits memory
    (pesto.memory's liveness peak, the finalised plan's) and is as fast as ZB-H1."""
    p, m = 3, 6
    g, c0 = _uniform(p, m)
    zb1 = pipeline_plan(g, c0, schedule="zb-h1", micro_batches=m, stages=p).plan
    cap = int(1.02 * max(zb1.peak_memory.values()))   # the grid's memory rule overestimates by about 1 % here
    c = c0.with_memory(cap)
    zb2 = pipeline_plan(g, c0, schedule="zb-h2", micro_batches=m, stages=p)
    gp = pipeline_plan(g, c0, schedule="gpipe", micro_batches=m, stages=p).plan
    assert max(zb2.plan.peak_memory.values()) > cap and max(gp.peak_memory.values()) > cap
    r = solve_slices(g, c, micro_batches=m, time_limit=10, workers=1, in_flight=p, hints=[zb2])
    assert max(r.plan.peak_memory.values()) <= cap and r.plan.status != "infeasible"   # finalize's pesto.memory peak
    assert r.plan.makespan <= zb1.makespan + 1e-6


def test_no_solution_in_time_falls_back_to_the_hint():
    """Nothing found by CP-SAT in time: the hint's grid schedule is the answer (status "hint"), never
    with an in_flight limit the hint may break."""
    p, m = 2, 4
    g, c = _uniform(p, m)
    grid = slice_grid(split(g, m), c)
    model = GridModel(grid, c)
    model.hint([0] * (grid.blocks - 1) + [1], {})
    ans = model._hinted_answer(0.0, 0.0)
    best = GridModel(grid, c).solve(time_limit=5, workers=1)
    assert ans.status == "hint" and ans.objective >= best.objective - 1e-6
    assert set(ans.start) == set(model.start) and ans.block_device == (0,) * (grid.blocks - 1) + (1,)
    limited = GridModel(grid, c, in_flight=2)
    limited.hint([0] * (grid.blocks - 1) + [1], {})
    assert limited._hinted_answer(0.0, 0.0) is None
