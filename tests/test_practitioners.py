"""Single device, Expert and METIS (solver/practitioners.py) on hand-derivable graphs."""
import pytest

from pesto.cluster import gpus
from pesto.graph import Edge, Op, OpGraph, Tensor
from pesto.plan import check_plan
from solver.practitioners import expert_assignment, place_expert, place_metis, place_single
from pesto.memory import static_repair
from pesto.problem import Problem


def test_single_uses_the_fastest_gpu_and_the_cpu_for_cpu_only_ops():
    ops = [Op("a", {"GPU": 2.0}), Op("io", {"CPU": 3.0}), Op("b", {"GPU": 2.0})]
    g = OpGraph(ops, [Edge("a", "io", ("a:0",)), Edge("io", "b", ("io:0",))],
                [Tensor("a:0", "a", 10), Tensor("io:0", "io", 10)])
    c = gpus(3, speeds=[1.0, 2.0, 1.0], with_cpu=True)
    plan = place_single(g, c)
    assert plan.placement == {"a": "/GPU:1", "io": "/CPU:0", "b": "/GPU:1"}
    check_plan(g, c, plan).raise_if_invalid()


def test_single_is_honest_about_oom():
    g = OpGraph([Op(f"w{k}", {"GPU": 1.0}, persistent_bytes=60) for k in range(2)])
    plan = place_single(g, gpus(2, memory=100))
    assert plan.status == "infeasible"
    assert plan.stats["memory_over"] == {"/GPU:0": 120}
    assert not check_plan(g, gpus(2, memory=100), plan).ok


def _lm_graph():
    """Embedding, 4 stacked layers, softmax, and their gradients, plus an
    unscoped op between layers."""
    names = ["embed/lookup"] + [f"rnn/layer_{k}/cell" for k in range(4)] + ["softmax/logits", "loss/xent"]
    fwd = list(names)
    fwd.insert(3, "concat_unscoped")  # between layer_1 and layer_2
    grads = [f"gradients/{n}_grad" for n in reversed(names)]
    order = fwd + grads
    ops = [Op(n, {"GPU": 10.0}) for n in order]
    return OpGraph(ops, [Edge(u, v) for u, v in zip(order, order[1:])], name="lm")


def test_expert_splits_layers_by_scope():
    g = _lm_graph()
    slots, summary = expert_assignment(g, 2)
    s = dict(zip(g.names, slots))
    assert s["embed/lookup"] == s["rnn/layer_0/cell"] == s["rnn/layer_1/cell"] == 0
    assert s["rnn/layer_2/cell"] == s["rnn/layer_3/cell"] == s["softmax/logits"] == s["loss/xent"] == 1
    assert s["gradients/rnn/layer_1/cell_grad"] == 0 and s["gradients/rnn/layer_3/cell_grad"] == 1
    assert s["gradients/embed/lookup_grad"] == 0 and s["gradients/softmax/logits_grad"] == 1
    assert summary["layer"] == 8 and summary["neighbours"] == 1
    plan = place_expert(g, gpus(2), rule="paper")  # the paper's split, by name (issue 13)
    assert plan.stats["expert_rule"] == "paper"
    assert plan.placement["rnn/layer_0/cell"] == "/GPU:0" and plan.placement["rnn/layer_3/cell"] == "/GPU:1"
    check_plan(g, gpus(2), plan).raise_if_invalid()
    # by default the paper split is one of the splits timed: on this chain one GPU is faster
    auto = place_expert(g, gpus(2))
    assert auto.makespan <= plan.makespan
    check_plan(g, gpus(2), auto).raise_if_invalid()


def test_expert_balances_layer_compute():
    # layer 0 is as heavy as layers 1-3 together: it gets a GPU of its own
    ops = [Op(f"layer_{k}/m", {"GPU": 30.0 if k == 0 else 10.0}) for k in range(4)]
    g = OpGraph(ops, [Edge(f"layer_{k}/m", f"layer_{k + 1}/m") for k in range(3)])
    assert expert_assignment(g, 2)[0] == [0, 1, 1, 1]


def test_expert_nasnet_branches_across_gpus():
    ops = [Op(f"cell_{c}/branch_{b}/conv", {"GPU": 5.0}) for c in range(2) for b in range(4)]
    g = OpGraph(ops)
    slots, _ = expert_assignment(g, 2)
    assert slots == [0, 1, 0, 1, 0, 1, 0, 1]


def test_expert_generic_fallback_is_a_contiguous_balanced_split():
    g = OpGraph.from_edges({f"x{k}": 1 for k in range(6)}, [(f"x{k}", f"x{k + 1}") for k in range(5)])
    slots, summary = expert_assignment(g, 3)
    assert summary["fallback"] == "generic"
    assert slots == [0, 0, 1, 1, 2, 2]


def test_expert_keeps_colocation_and_kinds():
    ops = [Op("layer_0/w", {"GPU": 1.0}, colocation_group="w"),
           Op("layer_1/w_update", {"GPU": 5.0}, colocation_group="w"),
           Op("layer_1/io", {"CPU": 1.0})]
    g = OpGraph(ops, [Edge("layer_0/w", "layer_1/w_update")])
    c = gpus(2, with_cpu=True)
    plan = place_expert(g, c)
    assert plan.placement["layer_0/w"] == plan.placement["layer_1/w_update"]
    assert plan.placement["layer_1/io"] == "/CPU:0"
    check_plan(g, c, plan).raise_if_invalid()


def test_metis_puts_two_disjoint_chains_on_two_gpus():
    comp = {f"{c}{k}": 10 for c in "ab" for k in range(5)}
    edges = [(f"{c}{k}", f"{c}{k + 1}", 1 << 20) for c in "ab" for k in range(4)]
    g = OpGraph.from_edges(comp, edges)
    c = gpus(2)
    plan = place_metis(g, c)
    a = {plan.placement[f"a{k}"] for k in range(5)}
    b = {plan.placement[f"b{k}"] for k in range(5)}
    assert len(a) == len(b) == 1 and a != b
    assert plan.makespan == pytest.approx(50.0)
    assert plan.stats["edge_cut"] == 0


def test_metis_repairs_an_over_full_device():
    # four 40-byte ops feed one heavy op: balancing compute puts the heavy op alone
    # and the four small ones together (160 > 100 bytes); repair moves whole ops over
    ops = [Op(f"w{k}", {"GPU": 1.0}, persistent_bytes=40) for k in range(4)]
    ops.append(Op("big", {"GPU": 100.0}, persistent_bytes=10))
    g = OpGraph(ops, [Edge(f"w{k}", "big") for k in range(4)])
    c = gpus(2, memory=100)
    plan = place_metis(g, c)
    assert plan.status == "heuristic"
    assert "memory_forced" not in plan.stats
    check_plan(g, c, plan).raise_if_invalid()


def test_static_repair_moves_whole_groups_and_reports_what_cannot_move():
    ops = [Op("a", {"GPU": 1.0}, persistent_bytes=50, colocation_group="g"),
           Op("b", {"GPU": 1.0}, persistent_bytes=30, colocation_group="g"),
           Op("c", {"GPU": 1.0}, persistent_bytes=40)]
    g = OpGraph(ops)
    prob = Problem.of(g, gpus(2, memory=100))
    place = [0, 0, 0]  # 120 bytes on GPU:0
    assert static_repair(prob, place) == []
    assert place == [1, 1, 0]  # the group (80 bytes, the largest unit) moved whole
    prob = Problem.of(g, gpus(2, memory=70))
    place = [0, 0, 0]
    stuck = static_repair(prob, place)
    assert stuck == [0, 1]  # the 80-byte group fits nowhere
    assert place[2] == 1


def test_expert_over_full_plan_is_labelled_infeasible():
    ops = [Op(f"layer_{k}/w", {"GPU": 1.0}, persistent_bytes=150) for k in range(2)]
    g = OpGraph(ops, [Edge("layer_0/w", "layer_1/w")])
    plan = place_expert(g, gpus(2, memory=100))
    assert plan.status == "infeasible"
    assert set(plan.stats["memory_over"]) == {"/GPU:0", "/GPU:1"}
    assert plan.stats["memory_forced_count"] == 2
