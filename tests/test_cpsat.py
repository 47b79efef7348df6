"""CP-SAT model: one test per constraint family on a graph that breaks it if
the family were removed, plus hints, time limits, symmetry and replay."""
from __future__ import annotations

import pytest

from pesto.cluster import Cluster, Device, Route, gpus, two_hosts, v100x2_nvlink, v100x4_pcie
from pesto.errors import InfeasibleError
from pesto.graph import Edge, Op, OpGraph, Tensor
from pesto.plan import Plan, check_plan, memory_profile
from benchmarks.generators import layered_dag
from pesto.simulate import simulate
from pesto.memory import check_feasible
from solver.bounds import greedy_plan, lower_bound
from solver.cpsat import CpsatModel, place_cpsat, symmetric_groups


def solve(g, c, **kw):
    kw.setdefault("time_limit", 20)
    kw.setdefault("workers", 1)
    plan = place_cpsat(g, c, **kw)
    check_plan(g, c, plan, check_memory=plan.status != "infeasible").raise_if_invalid()
    return plan


def two_kind_cluster(beta=(10.0, 0.0), contention_free=False):
    devs = [Device("/a", "A"), Device("/b", "B")]
    return Cluster(devs, [Route("/a", "/b", ("ab",), *beta), Route("/b", "/a", ("ba",), *beta)],
                   contention_free=contention_free)


def test_device_no_overlap():
    # without no-overlap the three ops would run together in 10 µs
    g = OpGraph.from_edges({"a": 10, "b": 10, "c": 10}, [])
    assert solve(g, gpus(1)).makespan == 30.0
    p = solve(g, gpus(2))
    assert p.makespan == 20.0 and p.status == "optimal"


def test_transfer_time_keeps_ops_together():
    # splitting b and c would give 11 µs without the transfer family; with a
    # 100 µs transfer the optimum keeps all on one device: 21 µs
    g = OpGraph.from_edges({"a": 1, "b": 10, "c": 10}, [("a", "b", 100), ("a", "c", 100)])
    p = solve(g, gpus(2, beta=(0.0, 1.0)))
    assert p.makespan == 21.0 and p.status == "optimal"
    assert len(set(p.placement.values())) == 1


def test_transfer_is_sent_once_per_device():
    # one tensor, two consumers on the remote kind: a single 10 µs transfer
    ops = [Op("p", {"A": 1.0}), Op("c1", {"B": 1.0}), Op("c2", {"B": 1.0})]
    g = OpGraph(ops, [Edge("p", "c1", ("t",)), Edge("p", "c2", ("t",))], [Tensor("t", "p", 1)])
    p = solve(g, two_kind_cluster())
    assert p.makespan == 13.0
    assert len(p.transfers) == 1


def test_link_congestion():
    # two tensors over one link: 22 µs contended, 13 µs if links were free
    ops = [Op("p", {"A": 1.0}), Op("c1", {"B": 1.0}), Op("c2", {"B": 1.0})]
    ts = [Tensor("t1", "p", 1), Tensor("t2", "p", 1)]
    es = [Edge("p", "c1", ("t1",)), Edge("p", "c2", ("t2",))]
    g = OpGraph(ops, es, ts)
    p = solve(g, two_kind_cluster())
    assert p.makespan == 22.0 and p.stats["model_makespan"] == 22.0 and p.status == "optimal"
    assert solve(g, two_kind_cluster(contention_free=True)).makespan == 13.0
    # contention=False relaxes the links in the model; the replay still queues
    relaxed = solve(g, two_kind_cluster(), contention=False)
    assert relaxed.stats["model_makespan"] == 13.0 and relaxed.makespan == 22.0
    assert relaxed.status == "feasible"


def test_memory_forces_a_split():
    # a -> b with an expensive transfer wants one device; each op holds 600 B
    # of a 1000 B device, so they must be split (makespan pays the transfer)
    ops = [Op("a", {"GPU": 1.0}, persistent_bytes=600), Op("b", {"GPU": 1.0}, persistent_bytes=600)]
    g = OpGraph(ops, [Edge("a", "b", ("t",))], [Tensor("t", "a", 8)])
    c = gpus(2, beta=(50.0, 0.0), memory=1000)
    p = solve(g, c)
    assert p.placement["a"] != p.placement["b"]
    assert p.makespan == 52.0 and p.status == "optimal"
    assert p.stats["memory_constraints"]
    assert all(v <= 1000 for v in memory_profile(g, c, p.placement, p.start, p.finish, p.transfers).values())
    assert solve(g, gpus(2, beta=(50.0, 0.0))).makespan == 2.0


def test_memory_counts_received_tensors_and_temporaries():
    # b would fit next to a's output only if the received tensor were free
    ops = [Op("a", {"A": 1.0}, output_bytes=400), Op("b", {"B": 1.0}, temporary_bytes=300),
           Op("c", {"A": 1.0, "B": 1.0}, persistent_bytes=500)]
    g = OpGraph(ops, [Edge("a", "b", ("t",))], [Tensor("t", "a", 400)])
    c = two_kind_cluster(beta=(1.0, 0.0)).with_memory(1000)
    p = solve(g, c)
    # on /b: 400 received + 300 temporary + 500 (c) > 1000, so c goes to /a
    assert p.placement["c"] == "/a"


def test_memory_infeasible_model_falls_back():
    # three 600 B ops on two 1000 B devices: pre-checks pass, no placement fits
    ops = [Op(n, {"GPU": 1.0}, persistent_bytes=600) for n in "abc"]
    g = OpGraph(ops, [])
    p = place_cpsat(g, gpus(2, memory=1000), time_limit=10, workers=1)
    assert p.status == "infeasible"
    assert p.stats["fallback"] == "model proved infeasible"
    assert p.stats["memory_model"].startswith("persistent")


def test_colocation_group_stays_together():
    # b and c must share a device: 1 + 10 + 10 instead of 11
    ops = [Op("a", {"GPU": 1.0}), Op("b", {"GPU": 10.0}, colocation_group="g"),
           Op("c", {"GPU": 10.0}, colocation_group="g")]
    g = OpGraph(ops, [Edge("a", "b", ()), Edge("a", "c", ())])
    p = solve(g, gpus(2, beta=(0.0, 0.0)))
    assert p.placement["b"] == p.placement["c"]
    assert p.makespan == 21.0


def test_kinds_respected():
    ops = [Op("x", {"GPU": 1.0, "CPU": 50.0}, kinds={"CPU"}), Op("y", {"GPU": 5.0})]
    g = OpGraph(ops, [Edge("x", "y", ())])
    c = gpus(2, with_cpu=True)
    p = solve(g, c)
    assert p.placement["x"] == "/CPU:0" and p.placement["y"].startswith("/GPU")
    assert p.makespan == 55.0


def test_speed_scales_durations():
    g = OpGraph.from_edges({"a": 10, "b": 10}, [])
    c = gpus(2, speeds=[1.0, 0.25])
    p = solve(g, c)
    assert p.makespan == 20.0 and set(p.placement.values()) == {"/GPU:0"}


def test_float_times_replay_within_rounding():
    g = layered_dag(12, width=5, seed=3)
    c = v100x2_nvlink(with_cpu=any("GPU" not in op.kinds for op in g.ops))
    p = solve(g, c, time_limit=10)
    assert not p.stats["exact_units"]
    assert p.lower_bound <= p.makespan + 1e-6
    assert p.stats["model_status"] == "optimal"
    if not p.stats.get("simulated_above_model"):
        assert p.makespan <= p.stats["model_makespan"] + 1e-6
        assert p.makespan >= p.stats["model_makespan"] - p.stats["rounding_error_us"] - 1e-6


def test_integer_replay_equals_model():
    g = layered_dag(30, width=4, seed=5)
    # integer copy of the graph's GPU times and sizes
    ops = [Op(op.name, {"GPU": float(max(1, round(op.compute.get("GPU", 1.0))))}) for op in g.ops]
    tensors = [Tensor(t.name, t.src, 1 + t.bytes % 7) for t in g.tensors]
    gi = OpGraph(ops, g.edges, tensors)
    c = gpus(3, beta=(2.0, 1.0), contention_free=True)
    p = solve(gi, c, time_limit=20)
    assert p.stats["exact_units"]
    if p.status == "optimal":
        assert p.makespan == p.stats["model_makespan"] == p.lower_bound
    else:
        assert p.makespan <= p.stats["model_makespan"]


def test_lower_bound_and_gap():
    g = layered_dag(30, width=6, seed=1)
    c = gpus(2)
    p = solve(g, c, time_limit=2)
    assert p.lower_bound >= lower_bound(g, c) - 1e-9
    assert p.lower_bound <= p.makespan + 1e-6
    assert p.gap is not None and 0.0 <= p.gap <= 1.0


def test_hint_then_other_hint():
    g = layered_dag(25, width=5, seed=7)
    c = gpus(2, beta=(5.0, 1e-3))
    model = CpsatModel(g, c)
    single = Plan.from_placement(g, {n: "/GPU:1" for n in g.names})
    first = model.solve(time_limit=10, workers=1, hint=single)
    second = model.solve(time_limit=10, workers=1, hint=greedy_plan(g, c))
    hinted = list(model.model.proto.solution_hint.vars)
    assert len(hinted) == len(set(hinted))  # old hints cleared, none doubled
    assert first.stats["hint_used"] and second.stats["hint_used"]
    if first.status == second.status == "optimal":
        assert first.makespan == pytest.approx(second.makespan)
    for p in (first, second):
        check_plan(g, c, p).raise_if_invalid()


def test_hint_is_relabelled_for_symmetry():
    # a hint that uses only the last GPU violates value precedence; it is
    # relabelled, so the hinted solution is accepted as is
    g = OpGraph.from_edges({"a": 1, "b": 2}, [("a", "b", 10)])
    c = gpus(4)
    model = CpsatModel(g, c)
    assert model.canonical({"a": "/GPU:3", "b": "/GPU:2"}) == {"a": "/GPU:0", "b": "/GPU:1"}
    p = model.solve(time_limit=5, workers=1, hint=Plan.from_placement(g, {"a": "/GPU:3", "b": "/GPU:3"}))
    assert p.status == "optimal" and p.makespan == 3.0


def test_timeout_returns_feasible_or_says_fallback():
    g = layered_dag(120, width=8, seed=2)
    c = v100x4_pcie(with_cpu=any("GPU" not in op.kinds for op in g.ops))
    p = place_cpsat(g, c, time_limit=0.05, workers=1)
    check_plan(g, c, p, check_memory=False).raise_if_invalid()
    assert p.status in ("optimal", "feasible") or "fallback" in p.stats
    if "fallback" in p.stats:
        assert p.stats["fallback"] == "no solution within the time limit"
        assert p.makespan is not None


def test_symmetric_groups():
    assert symmetric_groups(gpus(4)) == [[0, 1, 2, 3]]
    assert [0, 1, 2, 3] in symmetric_groups(v100x4_pcie())
    # NVLink inside a host, NIC between hosts: not all four interchangeable
    assert all(len(grp) < 4 for grp in symmetric_groups(two_hosts()))
    het = gpus(2, speeds=[1.0, 0.5])
    assert symmetric_groups(het) == []


def test_symmetry_breaking_keeps_optimum():
    g = layered_dag(12, width=4, seed=4)
    ops = [Op(op.name, {"GPU": float(round(max(op.compute.values())) % 9 + 1)}) for op in g.ops]
    gi = OpGraph(ops, [Edge(e.src, e.dst, ()) for e in g.edges])
    c = gpus(3, contention_free=True)
    with_sym = place_cpsat(gi, c, time_limit=20, workers=1)
    without = place_cpsat(gi, c, time_limit=20, workers=1, symmetry=False)
    assert with_sym.status == without.status == "optimal"
    assert with_sym.makespan == without.makespan


def test_memory_balance_bound():
    ops = [Op(f"v{i}", {"GPU": 1.0}, persistent_bytes=100) for i in range(6)]
    g = OpGraph(ops, [Edge(f"v{i}", f"v{i + 1}", (f"t{i}",)) for i in range(5)],
                [Tensor(f"t{i}", f"v{i}", 1000) for i in range(5)])
    c = gpus(2)
    free = place_cpsat(g, c, time_limit=10, workers=1)
    assert len(set(free.placement.values())) == 1  # a chain stays on one device
    bal = place_cpsat(g, c, time_limit=10, workers=1, memory_balance=0.0)
    counts = [list(bal.placement.values()).count(d) for d in c.names]
    assert counts == [3, 3]


def test_infeasible_prechecks():
    with pytest.raises(InfeasibleError) as e:
        place_cpsat(OpGraph([Op("huge", {"GPU": 1.0}, persistent_bytes=10 ** 12)]), gpus(2))
    assert e.value.culprit == "huge"
    with pytest.raises(InfeasibleError) as e:
        check_feasible(OpGraph([Op("cpu_only", {"CPU": 1.0})]), gpus(2))
    assert e.value.culprit == "cpu_only"
    ops = [Op(f"o{i}", {"GPU": 1.0}, persistent_bytes=600, colocation_group="H") for i in range(2)]
    with pytest.raises(InfeasibleError) as e:
        check_feasible(OpGraph(ops), gpus(2, memory=1000))
    assert e.value.culprit == "H"
    ops = [Op(f"o{i}", {"GPU": 1.0}, persistent_bytes=900) for i in range(3)]
    with pytest.raises(InfeasibleError) as e:
        check_feasible(OpGraph(ops), gpus(2, memory=1000))
    assert e.value.culprit == "total"


def test_greedy_plan_is_valid():
    g = layered_dag(60, width=6, seed=9, coloc_prob=0.2)
    c = v100x2_nvlink()
    p = greedy_plan(g, c)
    check_plan(g, c, p, check_memory=False).raise_if_invalid()
    assert simulate(g, c, p).makespan == pytest.approx(p.makespan)


def test_static_memory_infeasible_retries_with_persistent_bound():
    # five chained ops with 450 B outputs: holding every output (static model)
    # needs 2250 B > 2 x 1000 B, but the liveness peak on one device is 900 B
    ops = [Op(f"v{i}", {"GPU": 1.0}, output_bytes=450) for i in range(5)]
    g = OpGraph(ops, [Edge(f"v{i}", f"v{i + 1}", (f"t{i}",)) for i in range(4)],
                [Tensor(f"t{i}", f"v{i}", 450) for i in range(4)])
    c = gpus(2, memory=1000)
    p = place_cpsat(g, c, time_limit=10, workers=1)
    assert p.stats["memory_model"].startswith("persistent")
    assert p.status == "optimal" and p.makespan == 5.0
    check_plan(g, c, p).raise_if_invalid()


def test_no_time_falls_back_to_the_hint():
    g = layered_dag(30, width=5, seed=2)
    c = gpus(2)
    hint = greedy_plan(g, c, placer="my-hint")
    p = place_cpsat(g, c, time_limit=0, workers=1, hint=hint)
    assert p.stats["fallback"] == "no solution within the time limit"
    assert p.stats["fallback_placer"] == "my-hint"
    assert p.placement == hint.placement and p.makespan == pytest.approx(hint.makespan)
    assert p.status == "heuristic" and p.lower_bound == pytest.approx(lower_bound(g, c))


def test_auto_aggregation_then_exact_phase():
    # 250 tensors on one edge: 500 transfer candidates, so transfers are
    # aggregated first; the exact model then proves the optimum
    ops = [Op("a", {"GPU": 5.0}), Op("b", {"GPU": 5.0}), Op("c", {"GPU": 5.0})]
    ts = [Tensor(f"t{k}", "a", 1) for k in range(250)]
    es = [Edge("a", "b", tuple(t.name for t in ts[:200])), Edge("a", "c", tuple(t.name for t in ts[200:]))]
    g = OpGraph(ops, es, ts)
    c = gpus(2, beta=(0.01, 0.0))
    p = place_cpsat(g, c, time_limit=20, workers=1)
    assert "phases" in p.stats and p.stats["phases"]["exact_status"] == "optimal"
    assert p.status == "optimal" and p.makespan == pytest.approx(10.5)  # c moved: 0.5 µs of transfers
    assert p.makespan - p.stats["rounding_error_us"] - 1e-9 <= p.lower_bound <= p.makespan + 1e-9
    forced = place_cpsat(g, c, time_limit=20, workers=1, aggregate=True)
    assert forced.stats["aggregated_transfers"] and forced.status == "feasible" and "phases" not in forced.stats


def test_invalid_hint_is_rejected_not_fatal():
    g = OpGraph.from_edges({"a": 1, "b": 2, "c": 3}, [("a", "b", 1), ("b", "c", 1)])
    c = gpus(2, beta=(1.0, 0.0))
    bad = Plan({n: "/GPU:0" for n in g.names}, {"/GPU:0": ["c", "b", "a"]}, placer="bad")
    p = place_cpsat(g, c, time_limit=5, workers=1, hint=bad)
    assert p.stats["hint_rejected"] == "bad" and p.stats["hint_used"] == "greedy"
    assert p.status == "optimal" and p.makespan == 6.0


@pytest.mark.parametrize("seed", range(8))
def test_energy_cuts_keep_the_optimum(seed):
    """The redundant cuts must never cut off an optimal plan (kinds, colocation,
    speeds, shared links and contention-free clusters)."""
    import random

    from test_oracle import bus_cluster, random_graph, wide_graph

    n = random.Random(seed).randint(6, 10)
    g = (random_graph if seed % 2 else wide_graph)(seed, n, shared=seed % 3 == 0)
    if seed % 4 == 0:
        ops = [Op(o.name, {"GPU": o.compute["GPU"], "CPU": 2 * o.compute["GPU"]}, kinds={"CPU"} if i == 1 else None,
                  colocation_group="g" if i in (2, 4) else None) for i, o in enumerate(g.ops)]
        g = OpGraph(ops, g.edges, g.tensors)
        c = gpus(2, beta=(1.0, 1.0), with_cpu=True, cpu_beta=(2.0, 1.0))
    else:
        c = [gpus(3, beta=(2.0, 1.0), contention_free=True), bus_cluster(3),
             gpus(2, beta=(1.0, 1.0), speeds=[1.0, 0.5])][seed % 3]
    with_cuts = CpsatModel(g, c, cuts=True).solve(time_limit=20, workers=1)
    without = CpsatModel(g, c, cuts=False).solve(time_limit=20, workers=1)
    assert with_cuts.stats["model_status"] == without.stats["model_status"] == "optimal"
    assert with_cuts.stats["model_makespan"] == pytest.approx(without.stats["model_makespan"])


# -- options ----------------------------------------------------------------------
def test_unknown_option_raises_type_error():
    g = OpGraph.from_edges({"a": 1, "b": 2}, [("a", "b", 1)])
    with pytest.raises(TypeError):
        place_cpsat(g, gpus(2), time_limit=1, workers=1, timelimit=5)  # misspelt
    with pytest.raises(TypeError):
        CpsatModel(g, gpus(2), time_limit=5)  # a search option is not a model option
    with pytest.raises(ValueError):
        CpsatModel(g, gpus(2), memory="liveness")


def test_variables_say_what_they_are():
    g = OpGraph.from_edges({"a": 2, "b": 3, "c": 4}, [("a", "b", 1), ("a", "c", 1)])
    names = {v.name for v in CpsatModel(g, gpus(3, beta=(1.0, 0.0))).model.proto.variables}
    assert {"on[a@/GPU:0]", "start[b]", "end[c]", "makespan", "send[a->b->/GPU:1]"} <= names
    free = {v.name for v in CpsatModel(g, gpus(2, beta=(1.0, 0.0), contention_free=True)).model.proto.variables}
    assert "same_dev[a->b]" in free


# -- memory: the model's accounting is pesto.memory's -----------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pesto.memory import static_bytes, static_peak  # noqa: E402
from pesto.problem import Problem  # noqa: E402
from solver.cpsat_model import memory_terms  # noqa: E402
from strategies import clusters, dags, placements  # noqa: E402


def model_bytes(model, mode, dev):
    """Per device, what the model's memory constraint sums for placement ``dev``
    (exact bytes, before rounding up to ``memory_unit``)."""
    p = model.problem
    held, peak, recv = memory_terms(p, mode)
    out = [0] * p.nd
    top = [0] * p.nd
    for i in range(p.n):
        out[dev[i]] += held[i]
        top[dev[i]] = max(top[dev[i]], peak[i])
    for _, u, b, cs in (model.tensors if recv else ()):
        for e in {dev[c] for c in cs} - {dev[u]}:
            out[e] += b
    return [out[k] + top[k] for k in range(p.nd)]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_static_memory_terms_are_static_peak(data):
    """The static model sums exactly pesto.memory.static_peak for any placement;
    the persistent one sums persistent bytes + the largest output + temporary."""
    g = data.draw(dags(max_ops=8))
    c = data.draw(clusters())
    try:
        model = CpsatModel(g, c, memory=False, cuts=False)
    except InfeasibleError:
        return
    placement = data.draw(placements(g, c))
    p = Problem.of(g, c)
    dev = p.placement_index(placement)
    peak = static_peak(g, c, dev)
    assert model_bytes(model, "static", dev) == [peak[d] for d in p.dev_names]
    persistent = [sum(p.persistent[i] for i in range(p.n) if dev[i] == k)
                  + max((p.out[i] + p.temp[i] for i in range(p.n) if dev[i] == k), default=0)
                  for k in range(p.nd)]
    assert model_bytes(model, "persistent", dev) == persistent
    assert memory_terms(p, "static")[0] == [static_bytes(op) for op in g.ops]


def memory_graph(seed):
    import random

    rng = random.Random(seed)
    n = rng.randint(4, 7)
    ops = [Op(f"v{i}", {"GPU": float(rng.randint(1, 9))}, persistent_bytes=rng.choice([0, 100, 300]),
              output_bytes=rng.choice([0, 200, 400]), temporary_bytes=rng.choice([0, 50, 250])) for i in range(n)]
    edges, tensors = [], []
    for j in range(1, n):
        for i in rng.sample(range(j), k=min(j, rng.randint(1, 2))):
            tensors.append(Tensor(f"t{i}_{j}", f"v{i}", ops[i].output_bytes))
            edges.append(Edge(f"v{i}", f"v{j}", (f"t{i}_{j}",)))
    return OpGraph(ops, edges, tensors)


@pytest.mark.parametrize("seed", range(10))
def test_memory_guarantee_holds_on_returned_plans(seed):
    """What the model guarantees, checked with pesto.memory: with the static
    model, a solved plan's static peak (hence its liveness peak) fits every
    device; after the retry with the persistent bound, persistent bytes + the
    largest output + temporary fit, and the liveness peak decides the status."""
    g = memory_graph(seed)
    p0 = Problem.of(g, gpus(2))
    need = sum(static_bytes(op) for op in g.ops) + max(p0.temp)
    one = max(p0.persistent[i] + p0.out[i] + p0.temp[i] for i in range(p0.n))  # the pre-check's need
    c = gpus(2 + seed % 2, beta=(1.0, 0.01), memory=max(int(need * (0.4 + 0.1 * (seed % 4))), one))
    try:
        plan = place_cpsat(g, c, time_limit=10, workers=1)
    except InfeasibleError:
        return
    if "fallback" in plan.stats:
        assert plan.stats["fallback"] == "model proved infeasible" and plan.status == "infeasible"
        return
    p = Problem.of(g, c)
    dev = p.placement_index(plan.placement)
    timed = memory_profile(g, c, plan.placement, plan.start, plan.finish, plan.transfers)
    if plan.stats["memory_model"] == "static":
        static = static_peak(g, c, dev)
        assert all(static[d] <= p.cap[k] for k, d in enumerate(p.dev_names))
        assert all(timed[d] <= static[d] for d in p.dev_names)
        assert plan.status != "infeasible"
    else:
        assert plan.stats["memory_model"].startswith("persistent")
        held, peak, _ = memory_terms(p, "persistent")
        for k in range(p.nd):
            mine = [i for i in range(p.n) if dev[i] == k]
            assert sum(held[i] for i in mine) + max((peak[i] for i in mine), default=0) <= p.cap[k]
        over = any(timed[d] > p.cap[k] for k, d in enumerate(p.dev_names))
        assert (plan.status == "infeasible") == over


@pytest.mark.parametrize("case", ["contended", "aggregated", "free", "kinds"])
def test_hint_is_a_complete_feasible_solution(case):
    """The hint (a heuristic plan rescheduled by the engine in model units)
    satisfies every constraint with every variable fixed to its hinted value."""
    from ortools.sat.python import cp_model

    g = layered_dag(40, width=6, seed=11, coloc_prob=0.1 if case == "kinds" else 0.0)
    cpu = any("GPU" not in op.kinds for op in g.ops)
    c = {"contended": v100x4_pcie(with_cpu=cpu), "aggregated": two_hosts(with_cpu=cpu),
         "free": gpus(3, beta=(5.0, 1e-3), contention_free=True, with_cpu=cpu),
         "kinds": v100x2_nvlink(with_cpu=True)}[case]
    model = CpsatModel(g, c, aggregate=case == "aggregated")
    assert model.set_hint(greedy_plan(g, c))
    solver = cp_model.CpSolver()
    solver.parameters.fix_variables_to_their_hinted_value = True
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = 20
    assert solver.solve(model.model) in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    assert solver.value(model.makespan) == max(model.hint_units, model.ms_min)
