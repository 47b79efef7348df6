"""The search screens weight gradients summed in place (issue 30 item 2):
``weight_grads="accumulate"`` (Megatron-LM's GEMM with ``beta = 1``) as a twin of
every pipeline candidate, the per-op mix of
:func:`pesto.step.slicing.choose_weight_grads`, and data parallelism's gradient
accumulation in place; named, logged and rebuilt from the log."""
from __future__ import annotations

from dataclasses import replace

import pytest

import pesto
from benchmarks.generators import uniform_stages
from pesto.cluster import gpus
from pesto.deadline import Deadline
from pesto.solvelog import SolveLog
from pesto.step import split
from pesto.step.slicing import weight_grad_ops
from solver.options import SolveOptions
from solver.parallel.kinds import KINDS
from solver.parallel.pipelines import pipeline_plan
from solver.parallel.realise import realise
from solver.parallel.search import _Search, step_graph
from solver.parallel.strategy import Strategy

DW = ("gradients/layer_0/dw", "gradients/layer_1/dw")


def _step(joinable: bool = True):
    """Two layers, 128 MB weights, 16 MB activations (tests/test_search_whole.py's)."""
    g = uniform_stages(2, t=4000.0, batch=8, act=1 << 24, params=1 << 25)
    return g if joinable else type(g)([replace(op, role="") for op in g.ops], g.edges, g.tensors, name=g.name)


@pytest.fixture(scope="module")
def four():
    """Four layers of 2 ms per slice (M=4) on four GPUs whose links cost nothing."""
    return uniform_stages(4, t=8000.0, batch=8, act=1 << 20, params=1 << 24), gpus(4, beta=(0.0, 1e-9))


def test_in_place_beats_separate_and_zb_h1_reaches_its_formula(four):
    """Golden: the accumulate ops gone (1F1B 36.68 -> 36.01 ms) and ZB-H1's W
    deferral intact, the copies of one op chained in slice order as its W
    tasks run anyway: ZB-H1 in place is M (T_F + T_B + T_W) + (p - 1) T
    = 4 x 6 + 3 x 2 = 30 ms (plus the 11 µs of data and loss ops), 1F1B's
    (p - 1)(T_F + T_B) fill and drain not. (On bench_parallel's uniform-m8-1x
    both are 120.2 ms: a slice's 128 MiB activation takes 2.8 ms per NVLink hop,
    about T_F, and stage 0, whose order ZB-H1 and 1F1B share, waits on the round
    trip of its p slices in flight: communication, not the W deferral.)"""
    g, c = four
    step = {(sch, wg): pipeline_plan(g, c, schedule=sch, micro_batches=4, weight_grads=wg).plan.makespan
            for sch in ("1f1b", "zb-h1") for wg in ("separate", "accumulate")}
    assert step["1f1b", "separate"] == pytest.approx(36682.1, abs=0.1)
    assert step["1f1b", "accumulate"] == pytest.approx(36011.0, abs=0.1)
    assert step["zb-h1", "separate"] == pytest.approx(30682.1, abs=0.1)
    assert step["zb-h1", "accumulate"] == pytest.approx(30011.0, abs=0.1)


def test_a_twin_in_place_is_named_and_rebuilt():
    s = Strategy(stages=2, micro_batches=4, schedule="zb-h2", weight_grads=dict.fromkeys(DW, "accumulate"))
    assert s.in_place == DW and s.joined == () and s.name == "zb-h2 K=2 M=4 accumulate(2)"
    mix = Strategy(stages=2, micro_batches=4, schedule="1f1b", weight_grads={DW[0]: "accumulate", DW[1]: "whole"})
    assert mix.name == "1f1b K=2 M=4 whole(1) accumulate(1)" and mix.split_rule == {DW[0]: "accumulate",
                                                                                    DW[1]: "whole"}
    log = SolveLog("x", micro_batches=4, graph_kind="micro-batched", joined=(DW[1],), in_place=(DW[0],))
    back = SolveLog.from_dict(log.to_dict())
    assert back.in_place == (DW[0],) and back.split_rule == mix.split_rule
    assert "in_place" not in SolveLog("x").to_dict()
    g = _step()
    assert step_graph(g, 4, "micro-batched", joined=(DW[1],), in_place=(DW[0],)).names == \
        split(g, 4, weight_grads=mix.split_rule).graph.names
    assert pesto.step_graph(g, 2, "replicated", 2, in_place=DW).names == \
        split(pesto.step.replicate(g, 2).graph, 2, weight_grads="accumulate").graph.names


def test_the_search_sums_in_place_what_it_cannot_join():
    """No joinable weight gradient (a graph-mode front end): the search still drops
    the accumulate ops, summing in place, for pipelines and data parallelism alike."""
    g, c = _step(joinable=False), gpus(2, memory=64 << 30)
    r = pesto.solve_step(g, cluster=c, micro_batches=4, time_limit=2, deterministic=True, workers=1)
    log, steps = r.plan.log, r.plan.log.steps
    assert log.in_place == DW and log.joined == () and not [n for n in r.graph.names if "@acc" in n]
    assert steps["1f1b M=4 accumulate(2)"] < steps["1f1b M=4"]
    assert steps["zb-h2 M=4 accumulate(2)"] < steps["zb-h2 M=4"]
    assert steps["data-parallel M=4 accumulate"] < steps["data-parallel M=4"]
    assert not [n for n in steps if "whole" in n]
    assert pesto.step_graph(g, 4, log.graph_kind, log.replicas, joined=log.joined,
                            in_place=log.in_place).names == r.graph.names
    assert pesto.check_plan(r, c).ok


def test_the_mix_joins_where_it_saves_and_fits_else_sums_in_place(monkeypatch):
    """Where a joined op would do less work (here forced: half the in-place time)
    the mix runs it whole if its held bytes fit the in-place plan's free memory on
    its GPU (room on layer 1's GPU only), the other in place."""
    c = gpus(2, memory=64 << 30)
    search = _Search(_step(), c, SolveOptions(micro_batches=4, deterministic=True), Deadline(30, deterministic=True))
    costs = tuple(replace(x, whole_us=x.accumulate_us / 2) for x in search.wg_costs(4))
    monkeypatch.setattr(search, "wg_costs", lambda m: costs)
    strategy = Strategy(stages=2, micro_batches=4, schedule="1f1b")
    r = realise(search.marked, c, strategy)
    gpu = r.plan.placement["gradients/layer_1/dw@mb0"]
    asked = []

    def realised(kind, s):
        asked.append(s.rule_words)
        out = realise(search.marked, c, s)
        used = {d: (1 << 20 if d == gpu else 64 << 30) for d in out.plan.peak_memory}
        return replace(out, plan=out.plan.replace(peak_memory=used)) if not s.joined else out

    monkeypatch.setattr(search, "realised", realised)
    out = search.summed_in_place(KINDS["pipeline"], strategy, r)
    assert asked == ["accumulate(2)", "whole(1) accumulate(1)"]
    assert out[1].strategy.joined == (DW[1],) and out[1].strategy.in_place == (DW[0],)
    assert search.summed_in_place(KINDS["pipeline"], replace(strategy, weight_grads="accumulate"), r) == []
    assert search.in_place_of(Strategy(replicas=2, micro_batches=4, weight_grads="accumulate")) == \
        weight_grad_ops(search.marked)


def test_the_exact_pass_never_returns_worse_than_its_best_start(monkeypatch):
    """A split of at most target_vertices ops runs the paper recipe, which starts from
    none of the screened plans (uniform-m8-1x: 107.0 ms from a 92.2 ms ZB-H2 start):
    the best start, re-ordered, is kept instead; the slice model (separate weight
    gradients only) is a candidate of its own, not a start of the in-place split."""
    import solver.parallel.search as ss

    c = gpus(2, memory=64 << 30)
    search = _Search(_step(), c, SolveOptions(micro_batches=4, deterministic=True), Deadline(30, deterministic=True))
    r = realise(search.marked, c, Strategy(stages=2, micro_batches=4, schedule="zb-h2", weight_grads="accumulate"))
    monkeypatch.setattr(ss, "run_recipe", lambda *a, **k: r.plan.replace(makespan=2 * r.plan.makespan))
    s = ss._Screened(r.transformed, [r.plan], r.plan.makespan, weight_grads=r.strategy.weight_grads)
    out = search.exact(s, 4, Deadline(5, deterministic=True))
    assert out.makespan <= r.plan.makespan and out.placement == r.plan.placement
    assert search.pool.steps["M=4"] == out.makespan
    assert "slice M=4" in search.pool.steps   # offered as a candidate of its own; out is the re-ordered start
