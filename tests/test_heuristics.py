"""Hand-derivable cases for the list-scheduling heuristics (solver/heuristics.py)."""
import pytest

from pesto.cluster import Cluster, Device, Route, gpus
from pesto.errors import InfeasibleError
from pesto.graph import Edge, Op, OpGraph, Tensor
from pesto.plan import check_plan
from solver import get_placer
from solver.heuristics import (bottom_level_order, favourite_children, place_celeritas, place_heft,
                               heft_ranks, place_m_etf, place_m_sct, place_m_topo)
from pesto.memory import MemoryTracker
from pesto.problem import Problem

LIST_PLACERS = ["m-topo", "m-etf", "m-sct", "celeritas", "heft"]


def fork_join(nbytes=0):
    return OpGraph.from_edges({"a": 1, "b": 5, "c": 5, "d": 1},
                              [("a", "b", nbytes), ("a", "c", nbytes), ("b", "d", nbytes), ("c", "d", nbytes)])


def test_m_etf_fork_join_without_comm_runs_branches_in_parallel():
    plan = place_m_etf(fork_join(), gpus(2, beta=(0.0, 0.0)))
    check_plan(fork_join(), gpus(2, beta=(0.0, 0.0)), plan).raise_if_invalid()
    assert plan.placement["b"] != plan.placement["c"]
    assert plan.makespan == pytest.approx(7.0)  # 1 + 5 + 1


def test_m_etf_fork_join_with_costly_comm_stays_on_one_device():
    # splitting pays 10 us each way: 1 + 10 + 5 + 10 + 1 = 27 > 1 + 5 + 5 + 1 = 12
    c = gpus(2, beta=(10.0, 0.0))
    plan = place_m_etf(fork_join(8), c)
    assert len(set(plan.placement.values())) == 1
    assert plan.makespan == pytest.approx(12.0)
    assert plan.order[plan.placement["a"]][0] == "a"


def baechi_figure1():
    """Two ops that want to share a device (big tensor) but do not fit together."""
    ops = [Op("a", {"GPU": 1.0}, persistent_bytes=60, output_bytes=1),
           Op("b", {"GPU": 1.0}, persistent_bytes=60)]
    return OpGraph(ops, [Edge("a", "b", ("a:0",))], [Tensor("a:0", "a", 1)])


@pytest.mark.parametrize("name", LIST_PLACERS)
def test_memory_forces_a_different_device(name):
    g = baechi_figure1()
    c = gpus(2, memory=100, beta=(100.0, 0.0))  # comm is costly: without memory they would share
    plan = get_placer(name)(g, c)
    assert plan.placement["a"] != plan.placement["b"]
    assert plan.status == "heuristic"
    check_plan(g, c, plan).raise_if_invalid()
    # with room for both, ETF keeps them together
    if name in ("m-etf", "m-sct", "heft"):
        roomy = get_placer(name)(g, gpus(2, memory=1000, beta=(100.0, 0.0)))
        assert roomy.placement["a"] == roomy.placement["b"]


def test_memory_tracker_frees_outputs_after_last_consumer():
    ops = [Op("a", {"GPU": 1.0}, output_bytes=50), Op("b", {"GPU": 1.0}, temporary_bytes=30),
           Op("c", {"GPU": 1.0}, persistent_bytes=10)]
    g = OpGraph(ops, [Edge("a", "b", ("a:0",)), Edge("b", "c", ())], [Tensor("a:0", "a", 50)])
    t = MemoryTracker(Problem.of(g, gpus(2, memory=100)))
    t.commit(0, 0)
    assert t.used == [50, 0]
    assert t.need(1, 1) == 30 + 50  # its temporary + a copy of a:0
    t.commit(1, 1)
    assert t.used == [0, 0]  # a:0 (and its copy) freed: b was a's last consumer
    assert t.peak == [50, 80]
    t.commit(2, 0)
    assert t.used == [10, 0]


def test_colocation_group_pinned_on_first_touch_with_whole_group_memory():
    ops = [Op("v", {"GPU": 1.0}, persistent_bytes=40, colocation_group="g"),
           Op("x", {"GPU": 50.0}, persistent_bytes=50),
           Op("u", {"GPU": 1.0}, persistent_bytes=40, colocation_group="g")]
    g = OpGraph(ops, [Edge("v", "u", ())])
    c = gpus(2, memory=100)
    for name in LIST_PLACERS:
        plan = get_placer(name)(g, c)
        assert plan.placement["v"] == plan.placement["u"], name
        assert plan.placement["x"] != plan.placement["v"], name  # 80 + 50 would not fit
        check_plan(g, c, plan).raise_if_invalid()


def test_m_topo_fills_devices_in_topological_order():
    g = OpGraph([Op(f"o{k}", {"GPU": 1.0}, persistent_bytes=10) for k in range(6)],
                [Edge(f"o{k}", f"o{k + 1}") for k in range(5)])
    plan = place_m_topo(g, gpus(3))
    assert [plan.placement[f"o{k}"] for k in range(6)] == ["/GPU:0"] * 2 + ["/GPU:1"] * 2 + ["/GPU:2"] * 2
    # capacity 25: two ops per device at most, so the third device is needed whatever the share
    plan = place_m_topo(g, gpus(3, memory=25))
    assert plan.status == "heuristic"
    assert sorted(plan.placement.values()).count("/GPU:2") == 2


def test_sct_favourite_child_follows_the_heavy_edge():
    g = OpGraph.from_edges({"a": 1, "b": 1, "c": 1}, [("a", "b", 10**8), ("a", "c", 10)])
    prob = Problem.of(g, gpus(2))
    fav_parent, stats = favourite_children(prob)
    assert stats["lp_status"] == "optimal"
    assert fav_parent[g.index["b"]] == g.index["a"]
    assert fav_parent[g.index["c"]] == -1
    plan = place_m_sct(g, gpus(2))
    assert plan.placement["a"] == plan.placement["b"]


def test_heft_topcuoglu_example_makespan_80():
    """The 10-task, 3-processor example of Topcuoglu et al. (2002), Fig. 2:
    HEFT's schedule has makespan 80 with n1, n3, n5, n7 on P3."""
    costs = {1: (14, 16, 9), 2: (13, 19, 18), 3: (11, 13, 19), 4: (13, 8, 17), 5: (12, 13, 10),
             6: (13, 16, 9), 7: (7, 15, 11), 8: (5, 11, 14), 9: (18, 12, 20), 10: (21, 7, 16)}
    edges = [(1, 2, 18), (1, 3, 12), (1, 4, 9), (1, 5, 11), (1, 6, 14), (2, 8, 19), (2, 9, 16),
             (3, 7, 23), (4, 8, 27), (4, 9, 23), (5, 9, 13), (6, 8, 15), (7, 10, 17), (8, 10, 11),
             (9, 10, 13)]
    ops = [Op(f"n{k}", {f"P{p + 1}": float(c[p]) for p in range(3)}) for k, c in costs.items()]
    g = OpGraph(ops, [Edge(f"n{u}", f"n{v}", (f"n{u}>n{v}",)) for u, v, _ in edges],
                [Tensor(f"n{u}>n{v}", f"n{u}", b) for u, v, b in edges])
    devs = [Device(f"P{p}", f"P{p}") for p in (1, 2, 3)]
    c = Cluster(devs, [Route(a.name, b.name, (f"{a.name}>{b.name}",), 0.0, 1.0)
                       for a in devs for b in devs if a is not b], contention_free=True)
    ranks = heft_ranks(Problem.of(g, c))
    assert [round(r, 2) for r in ranks] == [108.0, 77.0, 80.0, 80.0, 69.0, 63.33, 42.67, 35.67, 44.33, 14.67]
    plan = place_heft(g, c)
    assert plan.stats["estimated_makespan"] == pytest.approx(80.0)
    assert plan.makespan <= 80.0 + 1e-9
    assert {k for k, d in plan.placement.items() if d == "P3"} == {"n1", "n3", "n5", "n7"}
    check_plan(g, c, plan).raise_if_invalid()


def test_bottom_level_order_takes_longest_remaining_path_first():
    g = OpGraph.from_edges({"s": 1, "short": 1, "long1": 1, "long2": 5}, [("s", "short"), ("s", "long1"),
                                                                         ("long1", "long2")])
    prob = Problem.of(g, gpus(1))
    assert [g.names[i] for i in bottom_level_order(prob)] == ["s", "long1", "long2", "short"]


def test_celeritas_adjusting_moves_a_waiting_op():
    # Order-Place puts a, c on GPU0 and b, d on GPU1 (CPD-TOPO interleaves the chains);
    # b then waits 40 us for a's tensor, more than running beside a costs: it moves.
    g = OpGraph.from_edges({"a": 1, "b": 1, "c": 1, "d": 1}, [("a", "b", 8), ("c", "d", 8)])
    plan = place_celeritas(g, gpus(2))
    assert plan.stats["moved"] >= 1
    assert plan.placement["a"] == plan.placement["b"]
    assert plan.placement["c"] == plan.placement["d"] != plan.placement["a"]
    assert plan.makespan == pytest.approx(2.0)


@pytest.mark.parametrize("name", LIST_PLACERS)
def test_cpu_only_ops_go_to_the_cpu(name):
    ops = [Op("read", {"CPU": 4.0}), Op("mm", {"GPU": 2.0, "CPU": 20.0}), Op("save", {"CPU": 1.0})]
    g = OpGraph(ops, [Edge("read", "mm", ("r",)), Edge("mm", "save", ("m",))],
                [Tensor("r", "read", 100), Tensor("m", "mm", 100)])
    c = gpus(2, with_cpu=True)
    plan = get_placer(name)(g, c)
    assert plan.placement["read"] == plan.placement["save"] == "/CPU:0"
    check_plan(g, c, plan).raise_if_invalid()


@pytest.mark.parametrize("name", LIST_PLACERS + ["single", "expert", "metis"])
def test_op_with_no_device_of_its_kind_raises_naming_it(name):
    g = OpGraph([Op("tpu_op", {"TPU": 1.0}), Op("x", {"GPU": 1.0})])
    with pytest.raises(InfeasibleError, match="tpu_op"):
        get_placer(name)(g, gpus(2))


@pytest.mark.parametrize("name", LIST_PLACERS)
def test_an_op_that_fits_nowhere_is_forced_and_reported(name):
    ops = [Op("small", {"GPU": 1.0}, persistent_bytes=10), Op("huge", {"GPU": 1.0}, persistent_bytes=500)]
    g = OpGraph(ops, [Edge("small", "huge")])
    c = gpus(2, memory=100)
    plan = get_placer(name)(g, c)
    assert plan.status == "infeasible"
    assert plan.stats["memory_forced"] == ["huge"]
    assert plan.stats["memory_over"] == {plan.placement["huge"]: 500 + (10 if plan.placement["small"] == plan.placement["huge"] else 0)}


def test_m_etf_waits_for_memory_to_be_freed():
    # one device; after a and b, d (longer remaining path) would go before c, but its
    # 60-byte temporary does not fit while b's 60-byte output waits for c: c goes first
    ops = [Op("a", {"GPU": 1.0}), Op("b", {"GPU": 1.0}, output_bytes=60), Op("c", {"GPU": 5.0}),
           Op("d", {"GPU": 5.5}, temporary_bytes=60)]
    g = OpGraph(ops, [Edge("a", "b", ()), Edge("a", "d", ()), Edge("b", "c", ("b:0",))],
                [Tensor("b:0", "b", 60)])
    assert place_m_etf(g, gpus(1, memory=1000)).order["/GPU:0"] == ("a", "b", "d", "c")
    c = gpus(1, memory=100)
    plan = place_m_etf(g, c)
    assert plan.status == "heuristic" and "memory_forced" not in plan.stats
    assert plan.order["/GPU:0"] == ("a", "b", "c", "d")
    check_plan(g, c, plan).raise_if_invalid()
