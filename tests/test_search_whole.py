"""The search screens weight gradients run whole over every slice (issue 30 item 2):
``weight_grads="whole"`` for the ops the front end marked joinable, chosen per
plan with its memory cost, recorded in the log and rebuilt from it."""
from __future__ import annotations

from dataclasses import replace

import pytest

import pesto
from benchmarks.generators import uniform_stages
from pesto.cluster import gpus
from pesto.graph import OpGraph
from pesto.plan import check_plan
from pesto.solvelog import SolveLog
from pesto.step import split
from pesto.step.marks import joinable_ops
from solver.parallel.realise import realise
from solver.parallel.search import step_graph
from solver.parallel.strategy import Strategy

MiB = 1 << 20
DW = ("gradients/layer_0/dw", "gradients/layer_1/dw")


def _step(marked: bool = True, params: int = 1 << 25, act: int = 1 << 24) -> OpGraph:
    """Two layers; by default 128 MB weights and 16 MB activations: summing the
    slices' weight gradients costs more than joining them saves (a joined op
    holds every slice's inputs until it runs)."""
    g = uniform_stages(2, t=4000.0, batch=8, act=act, params=params)
    if marked:
        return g
    return OpGraph([replace(op, role="") for op in g.ops], g.edges, g.tensors, name=g.name)


def _lean():
    """16 MB weights, 128 MB activations: joining holds much more than it saves."""
    return _step(params=1 << 22, act=1 << 27)


def _solve(g, memory, deterministic=False):
    # deterministic: 2 s of work; else 3 s (a deterministic solve of _lean() at 300 MiB aborts inside
    # OR-Tools on main too: "Check failed: heuristics.fixed_search != nullptr")
    return pesto.solve_step(g, cluster=gpus(2, memory=memory), micro_batches=4, time_limit=2 if deterministic else 3,
                            deterministic=deterministic, workers=1)


def test_joinable_ops_are_the_marked_weight_gradients():
    assert joinable_ops(_step()) == DW[::-1]   # graph order
    assert joinable_ops(_step(marked=False)) == ()


def test_strategy_takes_a_mapping_and_names_it():
    s = Strategy(stages=2, micro_batches=4, schedule="1f1b", weight_grads={DW[1]: "whole", DW[0]: "whole"})
    assert s.weight_grads == ((DW[0], "whole"), (DW[1], "whole")) and s.joined == DW
    assert s.split_rule == {DW[0]: "whole", DW[1]: "whole"} and s.name == "1f1b K=2 M=4 whole(2)"
    assert hash(s) == hash(replace(s))
    with pytest.raises(ValueError, match="Strategy.weight_grads 'fused' is unknown"):
        Strategy(weight_grads={DW[0]: "fused"})


def test_a_whole_op_runs_after_its_stages_last_slice():
    """A whole weight gradient reads every slice: it runs with the last slice's
    backward task, never ahead of a slice's input gradient on its GPU."""
    g, c = _lean(), gpus(2, memory=64 << 30)
    r = realise(g, c, Strategy(stages=2, micro_batches=4, schedule="1f1b", weight_grads="whole"))
    p = r.plan
    for l in (0, 1):
        w, dev = f"gradients/layer_{l}/dw@all", p.placement[f"gradients/layer_{l}/dw@all"]
        dx = [n for n in r.graph.names if n.startswith(f"gradients/layer_{l}/dx@") and p.placement[n] == dev]
        assert dx and p.start[w] >= max(p.finish[n] for n in dx) - 1e-6


def test_the_search_joins_them_or_sums_them_in_place_when_faster_and_it_fits():
    """Joined and in place do the same work here (above the floor); the winner
    runs neither the separate accumulate ops, its log says which, and the graph is
    rebuilt from it."""
    g = _step()
    r = _solve(g, 64 << 30, deterministic=True)
    log = r.plan.log
    assert r.plan.status != "infeasible" and check_plan(r, gpus(2, memory=64 << 30)).ok
    assert sorted(log.joined + log.in_place) == sorted(DW) and not [n for n in r.graph.names if "@acc" in n]
    assert log.joined == r.strategy.joined and log.in_place == r.strategy.in_place
    steps = log.steps
    assert "gpipe M=4 whole(2)" in steps and steps["gpipe M=4 whole(2)"] < steps["gpipe M=4"]
    back = SolveLog.from_dict(log.to_dict())
    assert (back.joined, back.in_place) == (log.joined, log.in_place)
    assert step_graph(g, r.micro_batches, r.graph_kind, r.replicas, joined=log.joined,
                      in_place=log.in_place).names == r.graph.names
    assert pesto.step_graph(g, 4, "micro-batched", joined=DW).names == \
        split(g, 4, weight_grads=dict.fromkeys(DW, "whole")).graph.names
    assert [n for n in pesto.step_graph(g, 4, "micro-batched", joined=DW).names if n.endswith("@all")] == \
        [f"{d}@all" for d in reversed(DW)]
    from pesto.cli import describe_step
    words = "2 weight gradient(s) run whole" if log.joined else "2 summed in place"
    assert words in describe_step(r.plan, r.graph)   # what `pesto place` prints
    again = _solve(g, 64 << 30, deterministic=True)
    assert again.plan.placement == r.plan.placement and again.plan.log.steps == steps


def test_the_search_keeps_them_separate_when_joined_does_not_fit():
    """300 MiB per GPU: 1F1B with separate weight gradients fits (240 MiB), every
    joined plan holds each slice's inputs (352 MiB): refused, separate kept."""
    r = _solve(_lean(), 300 * MiB)
    assert r.plan.status != "infeasible" and r.strategy.joined == () and r.plan.log.joined == ()
    assert not [n for n in r.graph.names if n.endswith("@all")]
    steps = r.plan.log.steps
    assert "1f1b M=4 whole(2)" in steps          # screened, did not fit
    joined = realise(_lean(), gpus(2, memory=300 * MiB),
                     Strategy(stages=2, micro_batches=4, schedule="1f1b", weight_grads=dict.fromkeys(DW, "whole")))
    assert joined.plan.status == "infeasible"
    assert "joined" not in r.plan.log.to_dict()


def test_no_marks_no_joined_candidates():
    """A step whose front end marked no weight gradient joinable: the search screens none
    (TensorFlow could not build them), whatever the work saved."""
    r = _solve(_step(marked=False), 64 << 30)
    assert r.strategy.joined == () and not [n for n in r.plan.log.steps if "whole" in n]
    assert split(_step(marked=False), 4, weight_grads=r.plan.log.split_rule).graph.names == r.graph.names \
        or r.graph_kind != "micro-batched"


def test_tf_marks_join_only_what_loss_step_builds():
    """tf_patch's rule: a tape step's MatMul weight gradient whose forward MatMul reads a
    weight is joinable; a graph-mode (zoo) gradient, a bias gradient are not."""
    from pesto.graph import Edge, Op, Tensor
    from tf_patch.marks import mark_phases

    def step(root):
        ops = [Op("w", {"GPU": 0.0}, output_bytes=8, batch=False, type="ReadVariableOp"),
               Op("x", {"GPU": 1.0}, output_bytes=8, batch=True, type="Placeholder"),
               Op("m/d/MatMul", {"GPU": 1.0}, output_bytes=8, batch=True, type="MatMul", scope="m/d"),
               Op(f"{root}/m/d/MatMul_grad/MatMul_1", {"GPU": 1.0}, output_bytes=8, batch=True, type="MatMul",
                  scope=f"{root}/m/d/MatMul_grad"),
               Op(f"{root}/m/d/BiasAdd_grad/BiasAddGrad", {"GPU": 1.0}, output_bytes=8, batch=True,
                  type="BiasAddGrad", scope=f"{root}/m/d/BiasAdd_grad"),
               Op("apply", {"GPU": 1.0}, batch=False, type="ResourceApplyGradientDescent", scope="train")]
        dw, db = ops[3].name, ops[4].name
        es = [Edge("w", "m/d/MatMul", "w:0"), Edge("x", "m/d/MatMul", "x:0"), Edge("x", dw, "x:0"),
              Edge("m/d/MatMul", dw, "m/d/MatMul:0"), Edge("m/d/MatMul", db, "m/d/MatMul:0"),
              Edge(dw, "apply", f"{dw}:0"), Edge(db, "apply", f"{db}:0")]
        ts = [Tensor(f"{o.name}:0", o.name, 8) for o in ops[:5]]
        return mark_phases(OpGraph(ops, es, ts))

    tape = step("gradient_tape")
    assert [o.name for o in tape.ops if o.role == "joinable"] == ["gradient_tape/m/d/MatMul_grad/MatMul_1"]
    assert joinable_ops(tape) == ("gradient_tape/m/d/MatMul_grad/MatMul_1",)
    assert not [o for o in step("gradients").ops if o.role == "joinable"]    # graph mode: the zoo


def test_joined_falls_back_to_the_weight_gradients_that_fit_their_gpu(monkeypatch):
    """When every joinable op run whole does not fit memory but the separate plan
    does, the twin joins only those whose held bytes fit the separate plan's free
    memory on their GPU (here: the GPU holding layer 1 only), and keeps that plan
    if it fits."""
    from pesto.deadline import Deadline
    from solver.options import SolveOptions
    from solver.parallel.kinds import KINDS
    from solver.parallel.search import _Search

    c = gpus(2, memory=64 << 30)
    search = _Search(_step(), c, SolveOptions(micro_batches=4, deterministic=True), Deadline(30, deterministic=True))
    strategy = Strategy(stages=2, micro_batches=4, schedule="1f1b")
    r = realise(search.marked, c, strategy)
    gpu = r.plan.placement["gradients/layer_1/dw@mb0"]
    used = {d: (1 << 20 if d == gpu else 64 << 30) for d in r.plan.peak_memory}   # no room but on layer 1's GPU
    r = replace(r, plan=r.plan.replace(peak_memory=used))
    asked = []

    def realised(kind, s):
        asked.append(s.joined)
        out = realise(search.marked, c, s)
        return replace(out, plan=out.plan.replace(status="infeasible")) if len(s.joined) == 2 else out

    monkeypatch.setattr(search, "realised", realised)
    w = search.joined(KINDS["pipeline"], strategy, r)
    assert asked == [DW, ("gradients/layer_1/dw",)]
    assert w.strategy.joined == ("gradients/layer_1/dw",) and w.plan.status != "infeasible"
