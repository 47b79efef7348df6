"""solver.parallel.bound: a lower bound of the micro-batched step for any plan."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from mb_strategies import layered_step, mark, marked_dags
from pesto.cluster import gpus
from pesto.graph import Edge, Op, OpGraph, Tensor
from pesto.step import replicate, split
from pesto.simulate import simulate
from solver.parallel.bound import sample_bound
from solver.parallel.pipelines import data_parallel_plan, pipeline_plan
from strategies import clusters, plans
from test_oracle import oracle


@settings(max_examples=60, deadline=None)
@given(marked_dags(max_ops=8), st.integers(1, 3), clusters(), st.data())
def test_no_plan_beats_the_bound(g, m, cluster, data):
    s = split(g, m)
    b = sample_bound(s, cluster)
    for _ in range(2):
        sched = simulate(s.graph, cluster, data.draw(plans(s.graph, cluster)))
        assert sched.makespan >= b.step - 1e-6
        assert max(sched.peak_memory.values()) >= b.memory
    assert b.step == max(b.generic, b.copies, b.colocation)


def _tiny(seed: int, m: int):
    """A batched chain a -> b whose weight gradient (from b) an unbatched update reads."""
    rng = random.Random(seed)
    ta, tb = rng.choice([8, 12, 20]), rng.choice([6, 16, 24])
    g = OpGraph.from_edges({"a": ta, "b": tb, "apply": rng.choice([1, 3])},
                           [("a", "b", rng.choice([2, 8])), ("b", "apply", rng.choice([1, 4]))])
    return split(mark(g, {"a", "b"}) if seed % 2 else mark(g, {"b"}), m)


@pytest.mark.parametrize("seed,m", [(0, 2), (1, 2), (2, 2), (3, 2), (4, 3), (6, 3)])
def test_bound_is_never_above_the_brute_force_optimum(seed, m):
    s = _tiny(seed, m)
    assert s.graph.num_ops <= 7
    for c in (gpus(2, beta=(1.0, 0.5)), gpus(3, beta=(0.0, 0.0))):
        assert sample_bound(s, c).step <= oracle(s.graph, c) + 1e-9


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("m", [1, 3, 8])
def test_every_baseline_plan_is_above_its_bound(schedule, m):
    step = layered_step(4, t=1000.0)
    c = gpus(2)
    r = pipeline_plan(step, c, schedule=schedule, micro_batches=m)
    b = sample_bound(split(step, m), c)
    assert b.generic <= b.step <= r.plan.makespan
    dp = data_parallel_plan(step, c, micro_batches=m)
    assert sample_bound(split(replicate(step, 2).graph, m), c).step <= dp.plan.makespan


def test_copies_term_counts_rounds_of_copies():
    g = OpGraph([Op("x", {"GPU": 0.5}, batch=True), Op("a", {"GPU": 30.0}, batch=True),
                 Op("u", {"GPU": 1.0}, batch=False)],
                [Edge("x", "a", "x:0"), Edge("a", "u", "a:0")], [Tensor("x:0", "x", 90), Tensor("a:0", "a", 4)])
    b = sample_bound(split(g, 3), gpus(2))
    # 3 copies of 10 need 2 rounds on 2 GPUs after x (0.5); then the sums (2 + 2) and u (1)
    assert b.source == "copies" and b.copies == 0.5 + 20.0 + 2.0 + 1.0 and b.generic < 20.0


def test_copies_bound_to_a_variable_count_on_one_device():
    ops = [Op("v", {"GPU": 0.0}, persistent_bytes=64, batch=False, colocation_group="v"),
           Op("lookup", {"GPU": 40.0}, output_bytes=8, batch=True, colocation_group="v")]
    s = split(OpGraph(ops, [Edge("v", "lookup")]), 4)
    b = sample_bound(s, gpus(4))
    assert b.copies == 40.0 and b.colocation == 40.0 and b.generic == 10.0


def test_memory_and_per_sample():
    ops = [Op("w", {"GPU": 1.0}, persistent_bytes=3000, batch=False), Op("x", {"GPU": 8.0}, batch=True)]
    b = sample_bound(split(OpGraph(ops), 2), gpus(2, memory=2000), batch=32)
    assert b.memory == 3000 and not b.fits
    assert b.per_sample == pytest.approx(b.step / 32)
