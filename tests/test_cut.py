"""solver.parallel.cut and the pipeline bound: the stage cut programme against a brute-force oracle,
memory, layer blocks; the fill/drain bound against simulated pipelines and a uniform chain's optimum."""
from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mb_strategies import layered_step
from pesto.cluster import gpus
from pesto.graph import Edge, Op, OpGraph, Tensor
from pesto.step import split
from solver.practitioners import pipeline_cuts
from solver.parallel.cut import (block_memory, blockings, in_flight, largest_stage, phases, split_stages,
                                 step_estimate)
from solver.parallel.bound import pipeline_bound
from solver.parallel.pipelines import pipeline_plan, step_stages


def _oracle(work, comm, k, slices, memory, capacity):
    """Every contiguous split of ``k`` stages: (objective, starts) of those that fit, else None."""
    n = len(work)
    best = None
    for c in itertools.combinations(range(1, n), k - 1):
        starts = (0,) + c
        ends = list(c) + [n]
        costs = [sum(work[i:j]) + (comm[i] if i else 0) + (comm[j] if j < n else 0) for i, j in zip(starts, ends)]
        if memory is not None and any(sum(memory[s][i:j]) > capacity for s, (i, j) in enumerate(zip(starts, ends))):
            continue
        value = max(costs) if not slices else sum(costs) + (slices - 1) * max(costs)
        if best is None or value < best[0]:
            best = (value, starts)
    return best


def _value(work, comm, starts, slices):
    return step_estimate(work, comm, starts, slices) if slices else largest_stage(work, comm, starts)


@settings(max_examples=120, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=7), st.data())
def test_split_stages_matches_a_brute_force_oracle_with_slices_and_memory(work, data):
    """The least largest stage, or the least step estimate for M slices, over
    every contiguous split; with memory, over those that fit (none: the split
    without memory)."""
    n = len(work)
    comm = data.draw(st.lists(st.integers(0, 6), min_size=n + 1, max_size=n + 1))
    k = data.draw(st.integers(1, n))
    slices = data.draw(st.sampled_from([None, 1, 2, 3, 8]))
    memory = capacity = None
    if data.draw(st.booleans()):
        memory = [data.draw(st.lists(st.integers(0, 5), min_size=n, max_size=n)) for _ in range(k)]
        capacity = data.draw(st.integers(0, 15))
    got = split_stages(work, comm, k, slices=slices, memory=memory,
                       capacity=np.inf if capacity is None else capacity)
    assert len(got) == k and got[0] == 0 and list(got) == sorted(set(got)) and got[-1] < n
    oracle = _oracle(work, comm, k, slices, memory, capacity)
    if oracle is None:   # nothing fits: the split without memory
        oracle = _oracle(work, comm, k, slices, None, None)
        assert got == split_stages(work, comm, k, slices=slices)
    else:
        ends = list(got[1:]) + [n]
        assert memory is None or all(sum(memory[s][i:j]) <= capacity for s, (i, j) in enumerate(zip(got, ends)))
    assert abs(_value(work, comm, got, slices) - oracle[0]) < 1e-9


def test_a_memory_limit_forces_a_different_cut():
    """1F1B on 2 stages of 4 equal blocks: stage 0 holds 2 slices'
    activations, stage 1 one; at capacity 3 stage 0 can hold one block only."""
    work, comm, act = [1.0] * 4, [0.0] * 5, np.ones(4)
    assert split_stages(work, comm, 2, slices=8) == (0, 2)
    memory = [in_flight("1f1b", s, 2, 8) * act for s in range(2)]
    assert [row.tolist() for row in memory] == [[2.0] * 4, [1.0] * 4]
    assert split_stages(work, comm, 2, slices=8, memory=memory, capacity=3) == (0, 1)
    assert split_stages(work, comm, 2, slices=8, memory=memory, capacity=4) == (0, 2)


def test_pipeline_cuts_is_the_same_programme():
    assert pipeline_cuts([1, 1, 1, 1, 4], [0, 0, 0, 0], 2) == [0, 4]
    assert pipeline_cuts([[1, 1, 1, 1], [2, 2, 2, 2]], [0, 0, 0], 2) == [0, 3]   # the slow device gets one block


def _scoped(widths: list[float]) -> OpGraph:
    """A chain of layers ``l{i}`` of two ops each (work ``widths[i]`` per op), a scope per layer."""
    names = [f"l{i}/{p}" for i in range(len(widths)) for p in "ab"]
    g = OpGraph.from_edges({n: widths[int(n[1:].split("/")[0])] for n in names}, list(zip(names, names[1:])))
    return OpGraph([replace(op, batch=True, scope=op.name.split("/")[0]) for op in g.ops], g.edges, g.tensors)


def test_layer_blocks_are_whole_layers_and_merge_whole_layers_past_the_cap():
    g = _scoped([5.0, 1.0, 1.0, 1.0, 5.0, 1.0])
    ph = phases(g, loss=g.names[-1])
    layer = {i: int(g.names[i][1:].split("/")[0]) for i in range(g.num_ops)}
    by = {b.name: b for b in blockings(g, ph, chunks=4)}
    assert by["layers:1"].count == 6 and all(by["layers:1"].block[i] == layer[i] for i in layer)
    merged = {b.name: b for b in blockings(g, ph, chunks=4, layers=3)}["layers:1"]
    assert merged.count <= 3
    for i, j in itertools.combinations(range(g.num_ops), 2):   # a layer never spans two blocks
        assert layer[i] != layer[j] or merged.block[i] == merged.block[j]
    assert "topological" in by and by["topological"].count == 4   # the equal-work chunks stay
    assert all(not b.name.startswith("layers") for b in blockings(g, ph, chunks=4, layers=0))


def test_block_memory_counts_weights_once_and_activations_per_slice():
    g = layered_step(4, act=1000, weight=400)
    ph = phases(g)
    bl = next(b for b in blockings(g, ph, chunks=2) if b.name == "layers:1")   # x, layer_0 .. layer_3
    static, act = block_memory(g, ph, bl, 4, step_stages(g, bl.block))
    assert bl.count == 5 and static.sum() == sum(op.persistent_bytes for op in g.ops) == 4 * 400
    for layer in range(4):   # a layer's weight with its block; its output read by the gradients, a quarter per slice
        b = bl.block[g.index[f"layer_{layer}/f"]]
        assert static[b] == 400 and act[b] == 1000 / 4


def test_pipeline_plan_cuts_a_layered_step_between_layers():
    g = layered_step(4, t=1000.0)
    r = pipeline_plan(g, gpus(2, beta=(1.0, 0.0)), schedule="1f1b", micro_batches=4, stages=2)
    dev = {o: d for o, d in r.plan.placement.items()}
    assert dev["layer_0/f@mb0"] == dev["layer_1/f@mb0"] != dev["layer_2/f@mb0"] == dev["layer_3/f@mb0"]


def _timed_step(times: list[float]) -> OpGraph:
    """:func:`layered_step` with layer ``l``'s forward taking ``times[l]`` µs, its gradients twice that."""
    g = layered_step(len(times))
    def scale(op):
        layer = next((int(p[6:]) for p in op.name.split("/") if p.startswith("layer_") and p[6:].isdigit()), None)
        if layer is None or not op.batch:
            return op
        return replace(op, compute={k: times[layer] * (1 if op.phase == "forward" else 2) for k in op.compute})
    return OpGraph([scale(op) for op in g.ops], g.edges, g.tensors, name=g.name)


@settings(max_examples=6, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=2, max_size=5), st.sampled_from([2, 4]), st.sampled_from([2, 3]),
       st.sampled_from(["gpipe", "1f1b"]))
def test_the_pipeline_bound_is_below_every_pipeline_plan(times, m, devices, schedule):
    g = _timed_step([100.0 * t for t in times])
    cluster = gpus(devices, beta=(5.0, 1e-4))
    s = split(g, m)
    b = pipeline_bound(s, cluster)
    assert b is not None and 1 <= b.stages <= devices
    for k in range(1, devices + 1):
        r = pipeline_plan(g, cluster, schedule=schedule, micro_batches=m, stages=k)
        assert b.step <= r.plan.makespan + 1e-6
        assert pipeline_bound(s, cluster, stages=r.stages).step <= r.plan.makespan + 1e-6


def test_the_pipeline_bound_is_the_optimum_of_a_uniform_chain():
    """k layers of forward f and backward b per slice, a stage each, free
    links: GPipe and 1F1B take (M + k - 1)(f + b), and so does the bound."""
    k, m, f = 4, 8, 80.0
    names = [f"f{i}" for i in range(k)] + [f"b{i}" for i in reversed(range(k))]
    ops = [Op(n, {"GPU": f}, batch=True, phase="forward" if n[0] == "f" else "input-grad",
              anchor=None if n[0] == "f" else f"f{n[1:]}", scope=f"l{n[1:]}") for n in names]
    g = OpGraph(ops, [Edge(u, v, (f"{u}:0",)) for u, v in zip(names, names[1:])],
                [Tensor(f"{n}:0", n, 8) for n in names])
    cluster = gpus(k, beta=(0.0, 0.0))
    b = pipeline_bound(split(g, m), cluster, stages=k)
    assert b.step == (m + k - 1) * 2 * f / m
    r = pipeline_plan(g, cluster, schedule="1f1b", micro_batches=m, stages=k)
    assert r.plan.makespan == pytest.approx(b.step)


def test_pipeline_plan_moves_a_cut_to_fit_the_schedules_activations():
    """1F1B on 2 GPUs: stage 0 holds 2 slices' activations, stage 1 one. The
    balanced cut (x, layer 0, 1 | layer 2, 3) needs 2 w + 1.5 a on GPU 0; at
    2 w + 1.2 a the cut moves before layer 1 (w + a and 3 w + 0.75 a)."""
    a, w = 1_000_000, 4000
    g = layered_step(4, act=a, weight=w, t=1000.0)
    free = gpus(2, beta=(1.0, 0.0))
    tight = free.with_memory(int(2 * w + 1.2 * a))
    where = {}
    for name, cluster in (("free", free), ("tight", tight)):
        r = pipeline_plan(g, cluster, schedule="1f1b", micro_batches=4, stages=2, candidates=1)
        where[name] = r.plan.placement["layer_1/f@mb0"]
    assert where == {"free": "/GPU:0", "tight": "/GPU:1"}
