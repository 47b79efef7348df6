"""solver.parallel.bound.pipeline_bound with transfers: valid for every
contiguous-stage pipeline (brute force on tiny steps, every one-chunk
schedule's plan on random steps and links), and its value on the uniform chain."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from benchmarks.generators import uniform_stages
from pesto.cluster import NVLINK_GG, gpus, hosts
from pesto.graph import Edge, Op, OpGraph, Tensor
from pesto.step import split
from solver.parallel.bound import covers, pipeline_bound
from solver.parallel.pipelines import pipeline_plan
from test_oracle import oracle


def _step(times, skips=(), nbytes=None, wgrad=False, sources=()) -> OpGraph:
    """A training step of ``len(times)`` forward ops ``f<i>`` (a chain, plus
    ``skips`` edges ``f<i> -> f<j>``), input gradients ``b<i>`` mirroring
    every forward edge, with ``wgrad`` weight gradients ``w<i>`` (the
    layer's input and the gradient from above), and per ``i`` in
    ``sources`` a batched forward op ``s<i>`` of no input read by ``f<i>``
    (a mask, a position table: a path that starts late); ``nbytes[i]``:
    ``f<i>``'s and ``b<i>``'s output bytes."""
    k = len(times)
    nbytes = nbytes or [1000] * k
    ops = [Op(f"f{i}", {"GPU": float(t)}, batch=True, phase="forward") for i, t in enumerate(times)]
    ops += [Op(f"b{i}", {"GPU": float(t)}, batch=True, phase="input-grad", anchor=f"f{i}") for i, t in enumerate(times)]
    if wgrad:
        ops += [Op(f"w{i}", {"GPU": float(t)}, batch=True, phase="weight-grad", anchor=f"f{i}")
                for i, t in enumerate(times)]
    fwd = sorted({(i, i + 1) for i in range(k - 1)} | {(i, j) for i, j in skips if i < j < k})
    pairs = [(f"f{i}", f"f{j}") for i, j in fwd] + [(f"b{j}", f"b{i}") for i, j in fwd]
    pairs += [(f"f{k - 1}", f"b{k - 1}")] + [(f"f{i}", f"b{i}") for i in range(k - 1)]
    if wgrad:
        pairs += [(f"f{i - 1}", f"w{i}") for i in range(1, k)] + [(f"b{i + 1}", f"w{i}") for i in range(k - 1)]
        pairs += [(f"f{k - 1}", f"w{k - 1}")]
    for i in sorted(set(sources)):
        ops.append(Op(f"s{i}", {"GPU": 1.0}, batch=True, phase="forward"))
        pairs.append((f"s{i}", f"f{i}"))
    size = {f"{c}{i}": nbytes[i] for i in range(k) for c in "fbws"}
    return OpGraph(ops, [Edge(u, v, (f"{u}:0",)) for u, v in pairs],
                   [Tensor(f"{op.name}:0", op.name, size[op.name]) for op in ops])


@pytest.mark.parametrize("times,nbytes,beta", [((20, 30), (40, 10), (5.0, 0.5)), ((30, 10), (2, 8), (12.0, 1.0)),
                                               ((10, 10), (20, 20), (0.0, 2.0)), ((40, 10), (100, 1), (3.0, 0.1))])
def test_no_contiguous_pipeline_beats_the_bound(times, nbytes, beta):
    """The brute-force optimum over every contiguous-stage pipeline (every
    placement :func:`covers` accepts, device order and link order) of a
    two-layer step split in two slices."""
    s = split(_step(times, nbytes=list(nbytes)), 2)
    for cluster in (gpus(2, beta=beta), gpus(2, beta=beta, contention_free=True)):
        b, free = pipeline_bound(s, cluster), pipeline_bound(s, cluster, transfers=False)
        best = oracle(s.graph, cluster, keep=lambda placement: covers(s, placement, stages=2))
        assert free.step <= b.step <= best + 1e-9


@st.composite
def _steps(draw):
    k = draw(st.integers(2, 5))
    times = draw(st.lists(st.integers(1, 60), min_size=k, max_size=k))
    skips = draw(st.lists(st.tuples(st.integers(0, k - 1), st.integers(0, k - 1)), max_size=2))
    nbytes = draw(st.lists(st.sampled_from([0, 10, 1000, 100_000, 10_000_000]), min_size=k, max_size=k))
    sources = draw(st.lists(st.integers(1, k - 1), max_size=2))
    return _step(times, skips, nbytes, wgrad=draw(st.booleans()), sources=sources)


@settings(max_examples=25, deadline=None)
@given(_steps(), st.sampled_from([1, 2, 4, 6]), st.integers(2, 4),
       st.sampled_from([(0.0, 0.0), (40.77, 2.0757e-05), (5.0, 1e-3), (200.0, 1e-4)]), st.booleans(), st.data())
def test_every_one_chunk_schedule_is_above_the_bound(g, m, devices, beta, two_hosts, data):
    """Every plan of GPipe, 1F1B, ZB-H1 and ZB-H2 at every stage count is a
    pipeline the bound covers, and no faster than it, on point-to-point
    links of one speed or on two hosts (fast links inside, slow between)."""
    cluster = hosts(2, devices // 2 or 1, "25gbe") if two_hosts and devices % 2 == 0 else gpus(devices, beta=beta)
    s = split(g, m)
    b = pipeline_bound(s, cluster)
    assert b is not None and pipeline_bound(s, cluster, transfers=False).step <= b.step
    schedule = data.draw(st.sampled_from(["gpipe", "1f1b", "zb-h1", "zb-h2"]))
    for k in range(1, len(cluster.gpus) + 1):
        r = pipeline_plan(g, cluster, schedule=schedule, micro_batches=m, stages=k)
        assert covers(s, r.plan.placement, stages=len(cluster.gpus))
        assert b.step <= r.plan.makespan + 1e-6
        assert pipeline_bound(s, cluster, stages=r.stages).step <= r.plan.makespan + 1e-6


def test_the_uniform_chain_by_hand():
    """issue 30's uniform chain, 4 layers on 4 NVLink GPUs, M = 8, weight
    gradients summed in place: a slice's forward, input and weight gradient
    take 3000 µs each, the loss 2, the data op 2, the last update 1. The last
    stage (layer 3 and the loss) cannot start before the data op and three
    layers' forwards of the first slice, each followed by its activation
    (2^30 / 8 bytes) over an NVLink hop, runs 8 slices of 3000 + 2 + 3000 +
    3000, and ends with the update: 3 x 3000 + 2 + 3 e + 8 x 9002 + 1."""
    g = uniform_stages(4, t=24_000.0, batch=24, act=1 << 30, params=400_000_000)
    s = split(g, 8, weight_grads={f"gradients/layer_{l}/dw": "accumulate" for l in range(4)})
    e = NVLINK_GG[0] + NVLINK_GG[1] * (1 << 30) / 8   # 2826.7 µs
    b, free = pipeline_bound(s, gpus(4)), pipeline_bound(s, gpus(4), transfers=False)
    assert free.step == pytest.approx(3 * 3000 + 2 + 8 * 9002 + 1)
    assert b.step == pytest.approx(free.step + 3 * e)
    assert b.stages == 4 and b.step == pytest.approx(89_499.18, abs=0.01)


def test_covers_only_pipelines_of_contiguous_stages():
    s = split(_step((10, 10, 10)), 2)
    stage = {"f0": "/GPU:0", "f1": "/GPU:1", "f2": "/GPU:1"}
    on = {f"{c}{i}@mb{k}": stage[f"f{i}"] for c in "fb" for i in range(3) for k in range(2)}
    assert covers(s, on) and covers(s, on, stages=2) and not covers(s, on, stages=1)
    assert not covers(s, {**on, "f2@mb1": "/GPU:0"})   # one stage's copies on two devices
    assert not covers(s, {**on, **{f"{c}{i}@mb{k}": "/GPU:0" for c in "fb" for i in (2,) for k in range(2)}})


@pytest.mark.parametrize("schedule, covered", [("1f1b", True), ("zb-h1", True), ("zb-v", False)])
def test_winner_bound_charges_the_pipeline_bound_only_where_it_covers_the_plan(schedule, covered):
    """A chunked schedule (ZB-V: two stages on one device) is not a contiguous-stage
    pipeline, so the pipeline bound proves nothing about it: its winner keeps the
    per-sample bound (it had taken the pipeline bound by its schedule's name)."""
    from mb_strategies import deep_step
    from solver.parallel.realise import realise
    from solver.parallel.search import winner_bound
    from solver.parallel.strategy import Strategy
    c = gpus(4)
    r = realise(deep_step(6, act=1_000_000, t=1000.0, weight=400_000), c,
                Strategy(stages=4, micro_batches=4, schedule=schedule))
    b = winner_bound(c, r)
    assert covers(r.transformed, r.plan.placement) is covered
    assert (b.source == "pipeline") is covered
    assert b.step <= r.plan.makespan + 1e-6


@pytest.mark.parametrize("base", ["1f1b", "data-parallel"])
@pytest.mark.parametrize("selective", [False, True])
def test_bounds_leave_recomputation_out(base, selective):
    """Recomputation is a plan's choice, not the step's work: the bounds of a
    recomputing plan's graph are those of the plain step's (they had counted the
    copies' forward work again: GPT-1.3B's recomputing winner read a gap of 0.35 %
    against a bound of its own extra work), and below the plain plan."""
    from dataclasses import replace
    from mb_strategies import deep_step
    from solver.parallel.bound import sample_bound
    from solver.parallel.realise import realise
    from solver.parallel.strategy import Strategy
    c, g = gpus(4), deep_step(6, act=1_000_000, t=1000.0, weight=400_000)
    plain_s = (Strategy(stages=4, micro_batches=4, schedule="1f1b") if base == "1f1b"
               else Strategy(replicas=4, micro_batches=2))
    plain = realise(g, c, plain_s)
    saving = realise(g, c, replace(plain_s, recompute=True, selective=selective))
    assert saving.plan.makespan > plain.plan.makespan          # the copies do cost the plan time
    b, b0 = sample_bound(saving.transformed, c).step, sample_bound(plain.transformed, c).step
    assert b == pytest.approx(b0) and b <= plain.plan.makespan
    if base == "1f1b":
        assert pipeline_bound(saving.transformed, c).step == pytest.approx(pipeline_bound(plain.transformed, c).step)
