"""The split's weight-gradient rules (issue 30 item 2): separate accumulate ops,
accumulation in place, one op over all slices."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from mb_strategies import layered_step, marked_dags
from pesto.cluster import gpus
from pesto.errors import MicroBatchError
from pesto.graph import Edge, Op, OpGraph, Tensor
from pesto.plan import check_plan
from pesto.simulate import simulate
from pesto.step import Origin, compose, replicate, split
from pesto.step.slicing import BANDWIDTH, FLOOR_US, WEIGHT_GRADS, parse_name, weight_grad_ops, whole_ops
from solver.parallel.realise import realise
from solver.parallel.strategy import Strategy


def _step(act: int = 2000):
    """x -> h -> dh; dw reads x and dh (a MatMul weight gradient); db = reshape(sum(dh)) (a bias gradient)."""
    ops = [Op("x", {"GPU": 0.5}, output_bytes=act, batch=True, type="Placeholder"),
           Op("w", {"GPU": 0.0}, persistent_bytes=400, output_bytes=400, batch=False),
           Op("h", {"GPU": 40.0}, output_bytes=act, batch=True),
           Op("dh", {"GPU": 80.0}, output_bytes=act, batch=True),
           Op("dw", {"GPU": 60.0}, output_bytes=400, temporary_bytes=40, batch=True, phase="weight-grad"),
           Op("sum", {"GPU": 20.0}, output_bytes=8, batch=True),
           Op("db", {"GPU": 0.001}, output_bytes=8, batch=True, phase="weight-grad"),
           Op("apply", {"GPU": 5.0}, batch=False)]
    ts = [Tensor("x:0", "x", act), Tensor("w:0", "w", 400), Tensor("h:0", "h", act), Tensor("dh:0", "dh", act),
          Tensor("dw:0", "dw", 400), Tensor("sum:0", "sum", 8), Tensor("db:0", "db", 8)]
    es = [Edge("x", "h", "x:0"), Edge("w", "h", "w:0"), Edge("h", "dh", "h:0"), Edge("x", "dw", "x:0"),
          Edge("dh", "dw", "dh:0"), Edge("dh", "sum", "dh:0"), Edge("sum", "db", "sum:0"),
          Edge("dw", "apply", "dw:0"), Edge("db", "apply", "db:0"), Edge("w", "apply", "w:0")]
    return OpGraph(ops, es, ts, name="step")


def test_rules_named():
    assert WEIGHT_GRADS == ("separate", "accumulate", "whole")
    assert weight_grad_ops(_step()) == ("dw", "db")


def test_separate_is_todays_rule_and_the_default():
    a, b = split(_step(), 4), split(_step(), 4, weight_grads="separate")
    assert a.graph == b.graph
    assert [n for n in a.graph.names if "@acc" in n] == [f"{t}@acc{k}" for t in ("dw:0", "db:0") for k in (1, 2, 3)]


def test_accumulate_in_place_chains_the_copies_and_adds_nothing():
    s = split(_step(), 4, weight_grads="accumulate")
    g = s.graph
    assert not [n for n in g.names if "@acc" in n]
    for k in range(1, 4):   # the running sum: copy k reads copy k-1's partial
        assert g.edge(f"dw@mb{k - 1}", f"dw@mb{k}").tensors == (f"dw:0@mb{k - 1}",)
    assert g.edge("dw@mb3", "apply").tensors == ("dw:0@mb3",) and "dw@mb0" not in g.predecessors("apply")
    # cost rule: a copy is op time / M with the floor, plus nothing
    assert g.op("dw@mb2").compute["GPU"] == 15.0
    assert g.op("db@mb2").compute["GPU"] == 0.001          # below the floor: keeps its time
    assert g.total_work() == pytest.approx(_step().total_work() + 3 * 0.001 + 3 * 0.5)
    sep = split(_step(), 4).graph.total_work()
    acc = 3 * 2 * max(FLOOR_US, 3 * 400 / BANDWIDTH["GPU"])   # 3 sums of dw, 3 of db (both at the floor)
    assert sep == pytest.approx(g.total_work() + acc)


def test_whole_runs_the_unsplit_op_once_over_every_slice():
    s = split(_step(), 4, weight_grads="whole")
    g = s.graph
    assert "dw@all" in g and "sum@all" in g and "db@all" in g        # the bias' Sum goes whole with its Reshape
    assert not [n for n in g.names if "@acc" in n or n.startswith(("dw@mb", "db@mb", "sum@mb"))]
    one = _step()
    assert g.op("dw@all").compute == one.op("dw").compute and g.op("dw@all").temporary_bytes == 40
    assert g.op("dw@all").batch is False and g.op("dw@all").phase == "weight-grad"
    assert sorted(g.predecessors("dw@all")) == sorted([f"x@mb{i}" for i in range(4)] + [f"dh@mb{i}" for i in range(4)])
    assert g.edge("dh@mb2", "dw@all").tensors == ("dh:0@mb2",)
    assert g.edge("sum@all", "db@all").tensors == ("sum:0",)
    assert g.edge("dw@all", "apply").tensors == ("dw:0",)
    assert s.origin["dw@all"] == Origin("dw", role="whole", members=("dw@mb0", "dw@mb1", "dw@mb2", "dw@mb3"))
    assert s.copies("dw") == ("dw@all",) and parse_name("dw@all").role == "whole"
    # time: the un-split op's; the rest of the step as the copies' rule has it
    assert g.total_work() == pytest.approx(one.total_work() + 3 * 0.5)


def test_mapping_chooses_per_op():
    g = split(_step(), 2, weight_grads={"dw": "whole", "db": "accumulate"}).graph
    assert "dw@all" in g and "db@mb1" in g and "sum@mb1" in g and not [n for n in g.names if "@acc" in n]
    g = split(_step(), 2, weight_grads={"dw": "accumulate"}).graph     # db left out: separate
    assert "db:0@acc1" in g and "dw:0@acc1" not in g


@pytest.mark.parametrize("rule, words", [
    ("fused", "unknown weight_grads rule 'fused'"),
    ({"dw": "fused"}, "unknown weight_grads rule 'fused'"),
    ({"h": "whole"}, "not weight-gradient ops of 'step'"),
    (3, "weight_grads must be one of"),
])
def test_bad_rules_named(rule, words):
    with pytest.raises(MicroBatchError, match=words):
        split(_step(), 2, weight_grads=rule)


def _read_twice():
    """dw feeds the optimizer and a batched op: it cannot run whole."""
    g = _step()
    ops = list(g.ops) + [Op("use", {"GPU": 1.0}, batch=True)]
    return OpGraph(ops, list(g.edges) + [Edge("dw", "use", "dw:0")], g.tensors, name="twice")


def test_an_op_a_batched_op_reads_cannot_run_whole():
    assert whole_ops(_read_twice(), ["dw", "db"])[1] == ("dw",)
    with pytest.raises(MicroBatchError, match="'dw' cannot run whole"):
        split(_read_twice(), 2, weight_grads={"dw": "whole"})
    g = split(_read_twice(), 2, weight_grads="whole").graph    # the string form: accumulate there
    assert "db@all" in g and "dw@all" not in g and g.has_edge("dw@mb0", "dw@mb1")


def test_whole_holds_every_slice_input_until_it_runs():
    """The memory cost: on one device the whole rule's peak holds every slice's
    x and dh (sliced activations) until dw@all runs; in place holds one slice's."""
    big = _step(act=4_000_000)
    c = gpus(1)
    peak = {}
    for r in WEIGHT_GRADS:
        g = split(big, 4, weight_grads=r).graph
        first = {n: -float(parse_name(n).slice or 0) for n in g.names}     # slice by slice, as a pipeline runs
        peak[r] = simulate(g, c, {n: "/GPU:0" for n in g.names}, mode="fifo", priority=first).peak_memory["/GPU:0"]
    assert peak["whole"] >= peak["accumulate"] + 4_000_000
    assert peak["accumulate"] <= peak["separate"]


@pytest.mark.parametrize("rule", WEIGHT_GRADS)
def test_every_rule_is_a_valid_step(rule):
    g, c = split(layered_step(3), 4, weight_grads=rule).graph, gpus(2)
    place = {op.name: "/GPU:0" if op.colocation_group else f"/GPU:{i % 2}" for i, op in enumerate(g.ops)}
    assert check_plan(g, c, simulate(g, c, place).to_plan()).ok


def test_uniform_chain_accumulation_costs_no_more_than_one_weight_gradient_op_per_layer():
    """Issue 30's check on a uniform chain (L layers, T_W per weight gradient), M = 8."""
    layers, m = 6, 8
    step = layered_step(layers, weight=40_000_000, t=100.0)
    t_w = step.op("gradients/layer_0/f_grad/dw").compute["GPU"]
    for rule in ("accumulate", "whole"):
        extra = split(step, m, weight_grads=rule).graph.total_work() - step.total_work()
        assert extra <= layers * t_w, rule
    extra = split(step, m).graph.total_work() - step.total_work()
    assert extra > layers * t_w          # today's rule: M - 1 sums of 40 MB per layer


def test_composed_with_replicas():
    rep = replicate(_step(), 2)
    both = compose(split(rep.graph, 2, weight_grads="whole"), rep)
    assert both.origin["dw@r1@all"].role == "whole" and both.origin["dw@r1@all"].replica == 1
    assert both.origin["dw@r1@all"].op == "dw"


@pytest.mark.parametrize("kind", [dict(stages=2, schedule="1f1b"), dict(replicas=2)])
def test_strategy_field_reaches_the_split(kind):
    step = layered_step(4, act=100_000, t=1000.0)
    solved = realise(step, gpus(2), Strategy(micro_batches=4, weight_grads="whole", **kind))
    assert solved.strategy.weight_grads == "whole"
    names = solved.graph.names
    assert any(n.endswith("@all") for n in names) and not any("@acc" in n for n in names)
    assert check_plan(solved.graph, gpus(2), solved.plan).ok
    base = realise(step, gpus(2), Strategy(micro_batches=4, **kind))
    assert base.strategy.weight_grads == "separate" and any("@acc" in n for n in base.graph.names)


def test_strategy_names_a_bad_rule():
    with pytest.raises(ValueError, match="Strategy.weight_grads 'x' is unknown"):
        Strategy(weight_grads="x")
    with pytest.raises(ValueError, match="not supported"):
        realise(layered_step(2), gpus(2), Strategy(micro_batches=2, schedule="slice", weight_grads="whole"))


def test_costs_per_rule_match_the_split_graphs():
    """weight_grad_costs' figures are the split graphs' own: each rule's work
    differs from the others' by the costs' differences."""
    from pesto.step.slicing import choose_weight_grads, weight_grad_costs

    step = _step(act=4000)
    costs = {c.op: c for c in weight_grad_costs(step, 4)}
    assert set(costs) == {"dw", "db"} and costs["db"].ops == ("sum", "db")
    work = {r: split(step, 4, weight_grads=r).graph.total_work() for r in WEIGHT_GRADS}
    assert work["separate"] - work["accumulate"] == pytest.approx(
        sum(c.separate_us - c.accumulate_us for c in costs.values()))
    assert work["accumulate"] - work["whole"] == pytest.approx(
        sum(c.accumulate_us - c.whole_us for c in costs.values()))
    assert costs["dw"].whole_bytes == 3 * (1000 + 1000)     # x and dh: 3 slices beyond one
    assert costs["db"].whole_bytes == 3 * 1000 and costs["dw"].sum_bytes == 400
    # db's copies sit at the floor: whole saves work there; dw's do not
    assert choose_weight_grads(costs.values()) == {"dw": "accumulate", "db": "whole"}
    assert choose_weight_grads(costs.values(), whole_bytes=0) == {"dw": "accumulate", "db": "accumulate"}
    assert weight_grad_costs(_read_twice(), 2)[0].whole_us is None


@settings(max_examples=40, deadline=None)
@given(marked_dags(max_ops=9), st.integers(2, 4))
def test_every_rule_splits_any_marked_step(graph, m):
    """On random marked steps: each rule's graph is a valid step (every
    original op runs, no cycle), and its work is ordered whole <= in place <= separate."""
    work = {}
    for rule in WEIGHT_GRADS:
        s = split(graph, m, weight_grads=rule)
        assert {o.op for o in s.origin.values()} == set(graph.names)
        assert all(s.copies(n) for n in graph.names)
        work[rule] = s.graph.total_work()
    assert work["whole"] <= work["accumulate"] + 1e-9 <= work["separate"] + 2e-9
