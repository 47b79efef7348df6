"""Validity of the lower bounds: never above a proven optimum nor above any plan.

* the brute-force oracle of ``test_oracle`` (every placement, device order and
  link order on graphs of <= 6 ops) on point-to-point, shared-bus and
  contention-free clusters;
* the Sinnen and STG instances with known optima (skipped when absent);
* every plan the heuristics and ``pesto.solve`` make, and random plans, on
  random graphs and on zoo graphs;
* and that communication is counted: a fork-join whose split costs a transfer
  gets a bound strictly above the simple one.
"""
from __future__ import annotations

import csv
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import pesto
from benchmarks.external import EXTERNAL, classic_cluster, read_gxl, read_stg, sinnen_optima, stg_optima
from pesto.api import load_graph
from pesto.cluster import gpus, preset
from pesto.graph import OpGraph
from pesto.plan import check_plan
from pesto.problem import Problem
from pesto.simulate import simulate
from solver.bound_model import CHAIN_SOURCE, SIMPLE_SOURCE, Bound, colocation_bound, comm_bound, reduced_edges
from solver.bounds import chain_bound, chain_heads, energetic_bound, lower_bound
from solver.options import SolveOptions
from solver.recipes import run_recipe
from solver.registry import run_placers
from strategies import clusters, dags, plans
from test_oracle import bus_cluster, oracle, random_graph, wide_graph

TOL = 1e-6
GRAPHS = Path(__file__).resolve().parents[1] / "benchmarks" / "graphs"


def _fork_join(big: int = 10 ** 9) -> OpGraph:
    """a -> (b, c) -> d with huge tensors: splitting b and c costs 1000 µs."""
    return OpGraph.from_edges({"a": 1, "b": 100, "c": 100, "d": 1},
                              [("a", "b", big), ("a", "c", big), ("b", "d", big), ("c", "d", big)])


def _assert_valid(b: Bound, opt: float, graph, cluster):
    assert b.simple == pytest.approx(lower_bound(graph, cluster))
    assert b.value >= b.simple
    assert b.value <= opt + TOL * max(1.0, opt), (b, opt)


# -- the oracle -------------------------------------------------------------------------
ORACLE_CLUSTERS = {"p2p2": lambda: gpus(2, beta=(1.0, 1.0)), "p2p3": lambda: gpus(3, beta=(2.0, 1.0)),
                   "bus3": lambda: bus_cluster(3), "free2": lambda: gpus(2, beta=(3.0, 2.0), contention_free=True),
                   "slow2": lambda: gpus(2, beta=(8.0, 3.0))}
ORACLE_CASES = ([(k, s, 6, "random") for k in ("p2p2", "free2", "slow2") for s in range(6)]
                + [(k, s, 5, "random") for k in ("bus3", "p2p3") for s in range(3)]
                + [(k, s, 6, "wide") for k in ("p2p2", "slow2") for s in range(4)]
                + [("bus3", s, 5, "wide") for s in range(3)])


@pytest.mark.parametrize("kind,seed,n,shape", ORACLE_CASES)
def test_never_above_the_oracle(kind, seed, n, shape):
    make = random_graph if shape == "random" else wide_graph
    g, c = make(seed, n, shared=seed % 2 == 0), ORACLE_CLUSTERS[kind]()
    opt = oracle(g, c)
    b = comm_bound(g, c, time_limit=5)
    _assert_valid(b, opt, g, c)
    assert b.proven  # a handful of ops: the relaxation is solved
    assert energetic_bound(g, c) <= opt + TOL
    assert lower_bound(g, c) - TOL <= chain_bound(g, c) <= opt + TOL
    assert chain_bound(g, c, window=1) <= opt + TOL
    assert energetic_bound(g, c, phased=chain_heads(g, c)) <= opt + TOL
    assert colocation_bound(Problem.of(g, c), lower_bound(g, c), 10 * opt) <= opt + TOL
    # the subset relaxation (the longest ops only) is valid too
    _assert_valid(comm_bound(g, c, time_limit=5, max_ops=3), opt, g, c)


def test_oracle_cases_gain_somewhere():
    """Across the oracle cases the relaxation beats the simple bound on some
    graph (communication counts), and reaches the optimum on some."""
    gains = exact = 0
    for kind, seed, n, shape in ORACLE_CASES[::3]:
        make = random_graph if shape == "random" else wide_graph
        g, c = make(seed, n, shared=seed % 2 == 0), ORACLE_CLUSTERS[kind]()
        b = comm_bound(g, c, time_limit=5)
        gains += b.value > b.simple + TOL
        exact += b.value >= oracle(g, c) - TOL
    assert gains >= 2 and exact >= 2


def test_communication_is_counted():
    g, c = _fork_join(), gpus(2, beta=(1.0, 1e-6))
    assert lower_bound(g, c) == 102.0         # the critical path; W/2 = 101
    b = comm_bound(g, c, time_limit=5)
    assert b.value == pytest.approx(202.0) and b.proven and b.source == "cp-sat relaxation (fine)"
    assert oracle(g, c) == 202.0                 # b and c in turn on one device
    plan = pesto.solve(g, cluster=c, time_limit=5, workers=1)
    assert plan.makespan == 202.0 and plan.status == "optimal"
    assert plan.lower_bound == pytest.approx(202.0)


def test_energetic_reasoning_counts_queues():
    g = OpGraph.from_edges({"a": 4, "b": 4, "c": 4, "d": 1, "e": 1},
                           [("a", "d"), ("b", "d"), ("c", "d"), ("d", "e")])
    c = gpus(2, beta=(0.0, 0.0))
    assert lower_bound(g, c) == 7.0
    assert energetic_bound(g, c) == pytest.approx(10.0, abs=1e-4)
    b = comm_bound(g, c, time_limit=5)
    assert b.value == pytest.approx(10.0, abs=1e-4) and b.value <= oracle(g, c)


def _phased() -> OpGraph:
    """Four 2 µs sources, then e (1) and f (3) in series: the sources fill
    both devices for 4 µs, then nothing runs beside e and f."""
    ops = {"a": 2, "b": 2, "c": 2, "d": 2, "e": 1, "f": 3}
    return OpGraph.from_edges(ops, [(x, "e", 10) for x in "abcd"] + [("e", "f", 10)])


def test_chain_bound_counts_serial_phases():
    g, free = _phased(), gpus(2, beta=(0.0, 0.0))
    assert lower_bound(g, free) == 6.0          # critical path 6 = work 12 / 2
    assert chain_bound(g, free) == 8.0          # 4 for the sources, then 1 + 3 alone
    assert oracle(g, free) == 8.0               # and that is the optimum
    assert chain_bound(g, free, window=1) == 8.0
    b = comm_bound(g, free, time_limit=5)
    assert b.value == pytest.approx(8.0) and b.value <= oracle(g, free)
    slow = gpus(2, beta=(1.0, 1.0))
    assert chain_bound(g, slow) == 8.0 <= oracle(g, slow)   # communication is not counted: still valid


def test_phases_tighten_energetic_reasoning():
    """Two phased stretches: the phases give the ops of the second their
    true earliest start, and energetic reasoning then sees them queue."""
    g, free = _phased(), gpus(2, beta=(0.0, 0.0))
    ph = chain_heads(g, free)
    i = {name: k for k, name in enumerate(g.names)}
    assert ph.head[i["e"]] == 4.0 and ph.head[i["f"]] == 5.0   # after the four sources on 2 devices
    assert ph.tail[i["a"]] == 4.0 and ph.tail[i["e"]] == 3.0
    assert energetic_bound(g, free, phased=ph) <= oracle(g, free) + TOL


def test_chain_bound_on_a_layered_transformer_is_below_every_plan():
    from benchmarks.generators import transformer_like
    g, c = transformer_like(6), preset("v100x2_nvlink")
    made, _ = run_placers(g, c, ["m-etf", "m-sct", "heft", "expert"], time_limit=30)
    best = min(p.makespan for p in made.values())
    chain = chain_bound(g, c)
    assert lower_bound(g, c) * 1.1 < chain <= best   # attention/FFN phases: well above work / 2
    b = comm_bound(g, c, time_limit=2, incumbent=min(made.values(), key=lambda p: p.makespan))
    assert b.value >= chain and (b.value > chain or b.source == CHAIN_SOURCE)


def test_forced_colocation():
    g, c = _fork_join(), gpus(2, beta=(1.0, 1e-6))
    p = Problem.of(g, c)
    assert colocation_bound(p, 102.0, 1000.0) == pytest.approx(202.0, rel=1e-5)   # all on one device
    assert colocation_bound(p, 102.0, 1000.0) <= 202.0
    assert colocation_bound(Problem.of(g, gpus(2, beta=(0.0, 0.0))), 102.0, 1000.0) == 102.0  # free transfers


def test_bound_edge_cases():
    empty = OpGraph.from_edges({}, [])
    assert comm_bound(empty, gpus(2)) == Bound(0.0, SIMPLE_SOURCE, 0.0, True, 0.0)
    g = OpGraph.from_edges({"a": 3, "b": 4}, [("a", "b", 10)])
    b = comm_bound(g, gpus(2), time_limit=2)   # a chain: the simple bound is the optimum
    assert b.value == 7.0 and b.source == SIMPLE_SOURCE
    with pytest.raises(TypeError):
        comm_bound(g, gpus(2), budget=3)


def test_reduced_edges_keeps_longest_path_through_dropped_ops():
    # a -> x -> y -> b and a -> z -> b (z longer than x + y)
    g = OpGraph.from_edges({"a": 5, "x": 1, "y": 1, "z": 3, "b": 5},
                           [("a", "x"), ("x", "y"), ("y", "b"), ("a", "z"), ("z", "b")])
    p = Problem.of(g, gpus(2))
    keep = [nm in ("a", "b") for nm in p.names]
    ia, ib = p.index["a"], p.index["b"]
    weight = [int(op.compute["GPU"]) for op in g.ops]
    assert reduced_edges(p, keep, weight) == {(ia, ib): 3}


# -- Sinnen and STG -----------------------------------------------------------------------
HAVE_EXTERNAL = (EXTERNAL / "sinnen" / "optima.tsv").exists()
SINNEN = sinnen_optima()[5::23] if HAVE_EXTERNAL else []
STG = [r for r in (stg_optima() if (EXTERNAL / "stg").exists() else [])][::97]


@pytest.mark.skipif(not HAVE_EXTERNAL, reason="external benchmark sets not present")
@pytest.mark.parametrize("path,procs,opt", SINNEN, ids=[f"{Path(p).stem[:40]}-P{k}" for p, k, _ in SINNEN])
def test_never_above_sinnen_optimum(path, procs, opt):
    g, c = read_gxl(path), classic_cluster(procs)
    _assert_valid(comm_bound(g, c, time_limit=2), opt, g, c)


@pytest.mark.skipif(not STG, reason="external benchmark sets not present")
@pytest.mark.parametrize("path,procs,low,high", STG, ids=[f"{Path(p).stem}-P{k}" for p, k, *_ in STG])
def test_never_above_stg_optimum(path, procs, low, high):
    g, c = read_stg(path), classic_cluster(procs)
    b = comm_bound(g, c, time_limit=2)
    _assert_valid(b, high, g, c)
    if low == high:
        assert b.value <= low + TOL


# -- plans --------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_never_above_any_plan(data):
    g = data.draw(dags(max_ops=9))
    c = data.draw(clusters())
    b = comm_bound(g, c, time_limit=1, max_ops=data.draw(st.sampled_from([3, 400])))
    assert b.value >= lower_bound(g, c)
    spans = [simulate(g, c, data.draw(plans(g, c)), memory=False).makespan for _ in range(3)]
    made, _ = run_placers(g, c, ["expert", "m-etf", "heft", "single"], time_limit=5)
    spans += [p.makespan for p in made.values()]
    assert b.value <= min(spans) + TOL * max(1.0, min(spans))
    assert energetic_bound(g, c) <= min(spans) + TOL * max(1.0, min(spans))
    assert lower_bound(g, c) - TOL <= chain_bound(g, c, window=data.draw(st.sampled_from([1, 3, 256]))) \
        <= min(spans) + TOL * max(1.0, min(spans))
    ph = chain_heads(g, c, window=data.draw(st.sampled_from([1, 3, 256])))
    assert energetic_bound(g, c, phased=ph) <= min(spans) + TOL * max(1.0, min(spans))
    names = g.names
    for _ in range(2):  # every schedule starts each op no earlier than its head, ends it no later than T - tail
        sched = simulate(g, c, data.draw(plans(g, c)), memory=False)
        for k, name in enumerate(names):
            assert sched.start[name] >= ph.head[k] - TOL * max(1.0, sched.makespan)
            assert sched.makespan - sched.finish[name] >= ph.tail[k] - TOL * max(1.0, sched.makespan)
    assert colocation_bound(Problem.of(g, c), lower_bound(g, c), 2 * min(spans) + 1) \
        <= min(spans) + TOL * max(1.0, min(spans))


def _placement_csv_best() -> dict:
    """Best simulated step (µs) per (workload file stem, cluster) in placement.csv."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "placement.csv"
    best: dict = {}
    if path.exists():
        for row in csv.DictReader(open(path)):
            try:
                v = float(row["step_ms"]) * 1000.0
            except (TypeError, ValueError):
                continue
            key = (row["workload"], row["cluster"])
            best[key] = min(best.get(key, v), v)
    return best


@pytest.mark.parametrize("stem", ["transformer_6", "rnnlm_2x2048"])
@pytest.mark.parametrize("cluster", ["v100x2_nvlink", "v100x4_pcie"])
def test_zoo_bound_below_plans(stem, cluster):
    g, c = load_graph(GRAPHS / f"{stem}.json.gz"), preset(cluster)
    made, _ = run_placers(g, c, ["expert", "single", "m-etf"], time_limit=30)
    best = min(made.values(), key=lambda p: p.makespan)
    b = comm_bound(g, c, time_limit=2, incumbent=best)
    assert b.simple <= b.value <= best.makespan + TOL * best.makespan
    assert energetic_bound(g, c) <= best.makespan


def test_zoo_energetic_bound_below_recorded_plans():
    """Every plan the placement benchmark recorded (any placer) is above the bound."""
    best = _placement_csv_best()
    if not best:
        pytest.skip("no placement results")
    for path in sorted(GRAPHS.glob("*.json.gz")):
        g = load_graph(path)
        for cluster in ("v100x2_nvlink", "v100x4_pcie"):
            step = best.get((path.name.split(".")[0], cluster))
            if step is not None:
                assert energetic_bound(g, preset(cluster), time_limit=2) <= step * (1 + 1e-6)


def test_recipe_reports_the_bound_and_its_source():
    g = _fork_join()
    c = gpus(2, beta=(1.0, 1e-6))
    plan = pesto.solve(g, cluster=c, time_limit=4, workers=1)
    check_plan(g, c, plan).raise_if_invalid()
    assert plan.lower_bound <= plan.makespan
    assert plan.log.bound == plan.lower_bound and plan.log.bound_source


def test_upper_caps_and_bound_time_zero_keeps_the_simple_bound():
    passes = ("heuristics", "reschedule", "status")  # a heuristic plan, then the bound
    g, c = _fork_join(), gpus(2, beta=(1.0, 1e-6))
    capped = comm_bound(g, c, time_limit=5, upper=202.0)
    assert capped.value == pytest.approx(202.0)
    assert comm_bound(g, c, time_limit=5, upper=102.0).value == 102.0  # an upper at the simple bound: nothing to prove
    plain = run_recipe(g, c, passes, SolveOptions(time_limit=None, exact_time=0.0, bound_time=0.0, hint="m-topo"))
    assert plain.log.bound_source == SIMPLE_SOURCE and plain.lower_bound == 102.0
    counted = run_recipe(g, c, passes, SolveOptions(time_limit=None, exact_time=0.0, bound_time=2.0, hint="m-topo"))
    assert counted.lower_bound == pytest.approx(202.0, rel=1e-6) and counted.lower_bound <= counted.makespan
    assert counted.log.bound_source != SIMPLE_SOURCE
