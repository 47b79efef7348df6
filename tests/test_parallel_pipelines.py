"""solver.parallel.pipelines: GPipe, 1F1B and data parallel on micro-batched steps."""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from mb_strategies import layered_step
from pesto.cluster import gpus, v100x4_pcie
from pesto.errors import BatchMarkError
from pesto.graph import Op, OpGraph
from pesto.step.slicing import parse_name
from pesto.plan import check_plan
from pesto.simulate import simulate
from tf_patch.marks import mark_step
from solver.parallel.cut import phases
from solver.parallel.pipelines import (data_parallel_plan, pipeline_plan, place_1f1b,
                                       place_data_parallel, place_gpipe, split_stages, task_order)
from solver.registry import PLACERS, get_placer

GRAPHS = Path(__file__).resolve().parent.parent / "benchmarks" / "graphs"


@pytest.fixture(scope="module")
def step():
    return layered_step(4, t=1000.0)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,m", [(2, 1), (2, 4), (3, 5), (4, 2)])
def test_task_order_runs_every_task_once_forward_first(schedule, stages, m):
    for s in range(stages):
        seq = task_order(schedule, s, stages, m)
        assert sorted(seq) == sorted([(p, i) for p in "BF" for i in range(m)])
        assert all(seq.index(("F", i)) < seq.index(("B", i)) for i in range(m))
        in_flight = max(sum(p == "F" for p, _ in seq[:k]) - sum(p == "B" for p, _ in seq[:k])
                        for k in range(len(seq) + 1))
        assert in_flight == (m if schedule == "gpipe" else min(m, stages - s))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=7), st.data())
def test_split_stages_is_optimal(work, data):
    n = len(work)
    comm = data.draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
    k = data.draw(st.integers(1, n))

    def cost(starts):
        ends = list(starts[1:]) + [n]
        return max(sum(work[i:j]) + (comm[i] if i else 0) + (comm[j] if j < n else 0)
                   for i, j in zip(starts, ends))

    got = split_stages(work, comm, k)
    assert len(got) == k and got[0] == 0 and list(got) == sorted(set(got))
    brute = min(cost((0,) + c) for c in itertools.combinations(range(1, n), k - 1))
    assert cost(got) == brute


def test_backward_ops_are_staged_with_the_layer_they_differentiate():
    g = mark_step(OpGraph.from_json(GRAPHS / "rnnlm_2x2048.json.gz"))
    ph = phases(g)
    name = {g.index[n]: n for n in g.names}
    anchor = {name[b]: name[a] for b, a in ph.anchor.items()}
    assert anchor["gradients/rnn/layer_0/t3/MatMul_grad/MatMul_1"] == "rnn/layer_0/t3/MatMul"
    assert all(a.split("/")[0] != "gradients" for a in anchor.values())
    assert all(g.index[a] in ph.forward for a in anchor.values())


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_is_valid_contiguous_and_faster(step, schedule):
    c = gpus(2)
    r = pipeline_plan(step, c, schedule=schedule, micro_batches=4)
    check_plan(r.graph, c, r.plan).raise_if_invalid()
    single = simulate(step, c, {n: "/GPU:0" for n in step.names}).makespan
    assert r.stages == 2 and r.plan.makespan < 0.7 * single
    stage = {}
    for name, dev in r.plan.placement.items():
        o = parse_name(name)
        if o.role == "copy":
            assert stage.setdefault(o.op, dev) == dev           # every slice of an op on one stage
    layers = [stage[f"layer_{l}/f"] for l in range(4)]
    assert layers == sorted(layers)                              # contiguous in layer order
    assert all(stage[f"gradients/layer_{l}/f_grad/dx"] == stage[f"layer_{l}/f"] for l in range(4))


def test_1f1b_holds_fewer_slices_than_gpipe(step):
    c = gpus(2)
    peak = {s: max(pipeline_plan(step, c, schedule=s, micro_batches=8, stages=2).plan.peak_memory.values())
            for s in ("gpipe", "1f1b")}
    assert peak["1f1b"] < 0.5 * peak["gpipe"]


def test_data_parallel_puts_replica_r_on_gpu_r(step):
    c = v100x4_pcie(with_cpu=False)
    for m in (1, 2):
        r = data_parallel_plan(step, c, micro_batches=m)
        check_plan(r.graph, c, r.plan).raise_if_invalid()
        assert r.stages == 4 and r.schedule == "data-parallel"
        assert all(d == f"/GPU:{n.rsplit('@r', 1)[1][0]}" for n, d in r.plan.placement.items()
                   if "@allreduce@" not in n and "@rs" not in n and "@ag" not in n)
    single = simulate(step, c, {n: "/GPU:0" for n in step.names}).makespan
    assert data_parallel_plan(step, c).plan.makespan < 0.5 * single


def test_placers_are_registered_and_return_plans_of_the_split_graph(step):
    c = gpus(2)
    for name, fn in [("gpipe", place_gpipe), ("1f1b", place_1f1b), ("data-parallel", place_data_parallel)]:
        assert get_placer(name) is fn and name in PLACERS
    assert "layer_0/f@mb3" in place_gpipe(step, c, micro_batches=4).placement
    assert "layer_0/f@r1" in place_data_parallel(step, c).placement


def test_bad_input_is_named(step):
    with pytest.raises(ValueError, match="unknown pipeline schedule 'zb'"):
        pipeline_plan(step, gpus(2), schedule="zb")
    with pytest.raises(BatchMarkError, match="no batch mark"):
        place_gpipe(OpGraph([Op("a", {"GPU": 1.0})]), gpus(2))


def test_data_parallel_runs_weight_gradients_as_soon_as_ready_when_the_all_reduce_is_long():
    """On 4 PCIe GPUs with 20 MB per layer, the all-reduce outlasts the backward: the order that
    runs each weight gradient before the input gradient beside it (a list schedule) starts the
    first bucket's all-reduce earlier, and the plan is shorter than FIFO's and all-reduce-first's."""
    from mb_strategies import deep_step
    from pesto.cluster import v100x4_pcie
    from pesto.simulate import simulate
    from solver.parallel import pipelines as P

    g = deep_step(4, weight=20_000_000, t=2000.0, slots=0)
    cluster = v100x4_pcie(with_cpu=False)
    sp = P.data_parallel_plan(g, cluster)
    assert sp.blocking == "weight-grad first"
    fifo = simulate(sp.transformed.graph, cluster, dict(sp.plan.placement), mode="fifo")
    assert sp.plan.makespan < fifo.makespan - 1000.0   # by more than one weight gradient's half
    ours = simulate(sp.transformed.graph, cluster, sp.plan)
    assert ours.makespan == pytest.approx(sp.plan.makespan)
    # the last layer's weight gradient runs before its input gradient on every replica
    for r in range(4):
        dw, dx = (f"gradients/layer_3/a_grad/{x}@r{r}" for x in ("dw", "dx"))
        assert ours.start[dw] < ours.start[dx]
