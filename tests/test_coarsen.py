"""Coarsening: targeted cases (Figure 6, kinds, colocation, aggregation, expand)."""
import itertools
import random as _r
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import coarsen
from coarsen import CoarseGraph, CoarsenError, verify
from coarsen.base import CoarsenReport, build_coarse, coarse_edges, kahn_heights
from coarsen.celeritas import _breakpoints, cpd_topo_order
from coarsen.height import MergeState, _merged_path, select_pairs, theorem35_ok
from pesto import (CycleError, Edge, InvalidPlanError, Op, OpGraph, Plan, Tensor, check_plan, gpus,
                   simulate, v100x4_pcie)
from pesto.problem import GraphArrays
from benchmarks.generators import layered_dag, lstm_grid, transformer_like

METHODS = coarsen.METHODS


def fig6():
    # A, B at height 1; C, D at height 2; A->C, B->D, A->D, B->C
    return OpGraph.from_edges({"A": 1, "B": 1, "C": 1, "D": 1},
                              [("A", "C", 400), ("B", "D", 300), ("A", "D", 200), ("B", "C", 100)])


def test_figure6_pair_is_refused():
    g = fig6()
    assert theorem35_ok(g, [("A", "C")])
    assert theorem35_ok(g, [("B", "D")])
    assert not theorem35_ok(g, [("A", "C"), ("B", "D")])
    sel = select_pairs(g)
    assert sel == [("A", "C")]
    assert theorem35_ok(g, sel)


def test_figure6_merging_both_really_closes_a_cycle():
    g = fig6()
    ga = GraphArrays.of(g)
    label = np.array([g.index[n] for n in "ABCD"])
    label[g.index["A"]] = label[g.index["C"]] = 0
    label[g.index["B"]] = label[g.index["D"]] = 1
    with pytest.raises(CycleError):
        build_coarse(ga, label, CoarsenReport("manual", 2, 4, 4))


@pytest.mark.parametrize("method", METHODS)
def test_figure6_coarsening_is_acyclic(method):
    for target in (1, 2, 3):
        cg = coarsen.coarsen(fig6(), target, method=method, check=True)
        assert cg.graph.num_ops >= 1


def test_condition_ii_variants():
    # u -> v with a path u -> w -> v: merging (u, v) alone would close a cycle
    g = OpGraph.from_edges({"u": 1, "w": 1, "v": 1}, [("u", "v", 100), ("u", "w", 1), ("w", "v", 1)])
    assert not theorem35_ok(g, [("u", "v")])
    assert ("u", "v") not in select_pairs(g)
    # only successor: always fine
    g2 = OpGraph.from_edges({"u": 1, "v": 1, "x": 1}, [("u", "v", 100), ("x", "v", 1)])
    assert theorem35_ok(g2, [("u", "v")])


def test_heights_by_kahn():
    g = OpGraph.from_edges({k: 1 for k in "abcde"}, [("a", "b"), ("b", "c"), ("a", "c"), ("d", "e")])
    ga = GraphArrays.of(g)
    eu, ev, _ = coarse_edges(ga, np.arange(5), 5)
    H, _, _ = kahn_heights(5, eu, ev)
    assert dict(zip(g.names, H)) == {"a": 1, "b": 2, "c": 3, "d": 1, "e": 2}


def test_chain_collapses_and_expands():
    g = OpGraph.from_edges({f"o{i}": 10 for i in range(10)}, [(f"o{i}", f"o{i+1}", 64) for i in range(9)])
    cg = coarsen.coarsen(g, 1, check=True)
    assert cg.graph.num_ops == 1
    (v,) = cg.graph.names
    assert cg.members[v] == [f"o{i}" for i in range(10)]
    assert cg.graph.op(v).compute["GPU"] == 100
    plan = cg.expand(Plan({v: "/GPU:1"}, {"/GPU:1": [v]}))
    assert plan.order["/GPU:1"] == tuple(f"o{i}" for i in range(10))
    assert check_plan(g, gpus(2), plan).ok


def test_never_merges_disjoint_kinds():
    ops = [Op("g1", {"GPU": 5}), Op("c1", {"CPU": 20}), Op("g2", {"GPU": 5}), Op("b", {"GPU": 1, "CPU": 2})]
    ts = [Tensor("g1:0", "g1", 10), Tensor("c1:0", "c1", 10), Tensor("b:0", "b", 10)]
    es = [Edge("g1", "c1", ("g1:0",)), Edge("c1", "g2", ("c1:0",)), Edge("b", "g1", ("b:0",))]
    g = OpGraph(ops, es, ts)
    for method in METHODS:
        cg = coarsen.coarsen(g, 1, method=method, check=True)
        v_c = cg.vertex_of["c1"]
        assert cg.members[v_c] == ["c1"] or set(cg.members[v_c]) <= {"c1", "b"}
        for v in cg.graph.names:
            assert cg.graph.op(v).kinds  # never empty


def test_colocation_groups_are_constraints():
    # var -> read -> use -> update -> (no edge back); var and update share a group
    ops = [Op("var", {"GPU": 1, "CPU": 1}, persistent_bytes=100, colocation_group="v"),
           Op("read", {"GPU": 1, "CPU": 1}),
           Op("use", {"GPU": 50}),
           Op("upd", {"GPU": 1, "CPU": 1}, colocation_group="v"),
           Op("other", {"GPU": 3}, colocation_group="w")]
    ts = [Tensor(f"{o}:0", o, 1000) for o in ("var", "read", "use")]
    es = [Edge("var", "read", ("var:0",)), Edge("read", "use", ("read:0",)), Edge("use", "upd", ("use:0",)),
          Edge("var", "upd", ()), Edge("use", "other", ("use:0",))]
    g = OpGraph(ops, es, ts)
    for method in METHODS:
        for target in (1, 2, 3, 4, 5):
            cg = coarsen.coarsen(g, target, method=method, check=True)
            gv = cg.graph.op(cg.vertex_of["var"]).colocation_group
            assert gv is not None and gv == cg.graph.op(cg.vertex_of["upd"]).colocation_group


def test_groups_united_when_a_vertex_holds_two():
    g = OpGraph([Op("a", {"GPU": 1}, colocation_group="g1"), Op("b", {"GPU": 1}, colocation_group="g2"),
                 Op("c", {"GPU": 1}, colocation_group="g2")],
                [Edge("a", "b", ("a:0",)), Edge("b", "c", ("b:0",))],
                [Tensor("a:0", "a", 10), Tensor("b:0", "b", 10)])
    ga = GraphArrays.of(g)
    cg = build_coarse(ga, np.array([0, 0, 1]), CoarsenReport("manual", 2, 3, 2))
    verify(cg)
    groups = {cg.graph.op(v).colocation_group for v in cg.graph.names}
    assert len(groups) == 1


def test_tensor_dedup_and_control_edges():
    # u's one tensor feeds x and y; x, y end up in one vertex: one coarse tensor, once
    ops = [Op(n, {"GPU": 1}) for n in ("u", "x", "y", "z")]
    ts = [Tensor("u:0", "u", 1000)]
    es = [Edge("u", "x", ("u:0",)), Edge("u", "y", ("u:0",)), Edge("x", "z", ()), Edge("y", "z", ())]
    g = OpGraph(ops, es, ts)
    ga = GraphArrays.of(g)
    cg = build_coarse(ga, np.array([0, 1, 1, 2]), CoarsenReport("manual", 3, 4, 4))
    verify(cg)
    vu, vxy, vz = cg.vertex_of["u"], cg.vertex_of["x"], cg.vertex_of["z"]
    assert cg.graph.edge(vu, vxy).tensors == ("u:0",)
    assert cg.graph.edge_bytes(vu, vxy) == 1000
    assert cg.graph.op(vu).output_bytes == 1000
    assert cg.graph.edge(vxy, vz).is_control
    assert cg.graph.tensor("u:0").src == vu


def test_aggregation_rules():
    ops = [Op("a", {"GPU": 2, "CPU": 8}, persistent_bytes=5, temporary_bytes=7),
           Op("b", {"GPU": 3}, persistent_bytes=6, temporary_bytes=4)]
    g = OpGraph(ops, [Edge("a", "b", ("a:0",))], [Tensor("a:0", "a", 9)])
    cg = coarsen.coarsen(g, 1, check=True)
    (v,) = cg.graph.names
    op = cg.graph.op(v)
    assert dict(op.compute) == {"GPU": 5.0} and op.kinds == {"GPU"}
    assert (op.persistent_bytes, op.temporary_bytes, op.output_bytes) == (11, 7, 0)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("make,reach", [
    (lambda: layered_dag(3000, seed=3, coloc_prob=0.05), True),
    # 5% CPU-only ops scattered over the graph cannot all be merged: target may be missed
    (lambda: layered_dag(3000, seed=3, cpu_only_prob=0.05, coloc_prob=0.05), False),
    (lambda: lstm_grid(4, 20), True), (lambda: transformer_like(6), True)])
def test_generators_to_target(method, make, reach):
    g = make()
    cg = coarsen.coarsen(g, 100, method=method, check=True)
    rep = cg.report
    assert rep.vertices == cg.graph.num_ops and rep.vertices_before == g.num_ops
    assert rep.reached == (cg.graph.num_ops <= 100)
    if method != "baechi" and reach:
        assert cg.graph.num_ops <= 100
    assert cg.graph.num_ops < g.num_ops / (2 if method == "baechi" else 4)
    assert rep.ccr_before > 0 and rep.rounds
    assert "CCR" in str(rep)
    # a coarse plan placing alternate vertices on two GPUs (CPU-only on the CPU)
    cl = gpus(2, with_cpu=True)
    plan = _coarse_plan(cg, cl)
    assert check_plan(cg.graph, cl, plan, check_memory=False).ok
    fine = cg.expand(plan)
    assert check_plan(g, cl, fine, check_memory=False).ok
    sched = simulate(g, cl, fine)
    assert sched.makespan >= g.critical_path() - 1e-6


def _coarse_plan(cg: CoarseGraph, cl) -> Plan:
    g = cg.graph
    gpus_ = [d.name for d in cl.devices if d.kind == "GPU"]
    placement, by_group = {}, {}
    for k, v in enumerate(g.topological_order()):
        op = g.op(v)
        if op.colocation_group in by_group:
            placement[v] = by_group[op.colocation_group]
            continue
        if op.colocation_group is not None:
            kinds = frozenset.intersection(*(g.op(w).kinds for w in g.colocation_groups()[op.colocation_group]))
        else:
            kinds = op.kinds
        d = gpus_[k % len(gpus_)] if "GPU" in kinds else "/CPU:0"
        placement[v] = d
        if op.colocation_group is not None:
            by_group[op.colocation_group] = d
    return Plan.from_placement(g, placement)


def test_expand_rejects_incomplete_plan():
    cg = coarsen.coarsen(layered_dag(50, seed=1), 5)
    v = cg.graph.names[0]
    with pytest.raises(InvalidPlanError):
        cg.expand(Plan({v: "/GPU:0"}, {"/GPU:0": [v]}))


def test_unknown_method():
    with pytest.raises(ValueError):
        coarsen.coarsen(fig6(), 2, method="nope")


def test_independent_ops_use_sibling_merges():
    g = OpGraph([Op(f"o{i}", {"GPU": 1.0}) for i in range(40)], [], [])
    cg = coarsen.coarsen(g, 10, check=True)
    assert cg.graph.num_ops == 10
    assert any(r["kind"] == "siblings" for r in cg.report.rounds)
    # Baechi has no rule for it: stays above target, says so
    cb = coarsen.coarsen(g, 10, method="baechi", check=True)
    assert cb.graph.num_ops == 40 and not cb.report.reached


def test_caps_limit_merges():
    g = OpGraph.from_edges({f"o{i}": 10 for i in range(20)}, [(f"o{i}", f"o{i+1}", 64) for i in range(19)])
    cg = coarsen.coarsen(g, 1, cap_ops=4, max_cap_growth=0, check=True)
    assert max(len(m) for m in cg.members.values()) <= 4
    assert not cg.report.reached


def test_target_at_least_ops_is_identity():
    g = layered_dag(30, seed=2)
    for method in METHODS:
        cg = coarsen.coarsen(g, 100, method=method, check=True)
        if method != "celeritas":
            assert cg.graph.num_ops == 30
        assert cg.graph.num_ops <= 30


def _cut_cost(ga, order, seg, beta):
    pos = {op: k for k, op in enumerate(order)}
    cost = 0.0
    for e in ga.graph.edges:
        b = ga.graph.edge_bytes(e.src, e.dst)
        u, v = ga.graph.index[e.src], ga.graph.index[e.dst]
        if b > 0 and seg[pos[u]] != seg[pos[v]]:
            cost += beta[0] + beta[1] * b
    return cost


def test_celeritas_breakpoint_dp_is_optimal():
    """Kernighan DP = brute force over all segmentations of the CPD-TOPO order."""
    beta = (10.0, 1e-3)
    for seed in range(60):
        rng = _r.Random(seed)
        n = rng.randint(1, 8)
        comp = {f"v{i}": 1 for i in range(n)}
        edges = [(f"v{i}", f"v{j}", rng.choice([0, 100, 5000])) for j in range(n) for i in range(j)
                 if rng.random() < 0.4]
        g = OpGraph.from_edges(comp, edges)
        ga = GraphArrays.of(g)
        order = cpd_topo_order(ga)
        assert sorted(order) == list(range(n))
        R = rng.randint(1, n)
        seg = _breakpoints(ga, order, R, float("inf"), beta)
        assert np.all(np.bincount(seg) <= R)
        best = float("inf")
        for cuts in itertools.product([0, 1], repeat=n - 1):
            s = np.concatenate([[0], np.cumsum(cuts, dtype=np.int64)]).astype(np.int64)
            if np.bincount(s).max() <= R:
                best = min(best, _cut_cost(ga, order, s, beta))
        assert _cut_cost(ga, order, seg, beta) == pytest.approx(best)


def test_cpd_topo_is_topological():
    g = layered_dag(500, seed=4)
    order = cpd_topo_order(GraphArrays.of(g))
    pos = {i: k for k, i in enumerate(order)}
    assert len(pos) == g.num_ops
    for e in g.edges:
        assert pos[g.index[e.src]] < pos[g.index[e.dst]]


@pytest.mark.parametrize("method", METHODS)
def test_tiny_graphs(method):
    empty = OpGraph([], [], [])
    cg = coarsen.coarsen(empty, 5, method=method)
    assert cg.graph.num_ops == 0 and cg.members == {}
    one = OpGraph([Op("x", {"GPU": 0.0})], [], [])
    cg = coarsen.coarsen(one, 1, method=method, check=True)
    assert cg.members == {"x": ["x"]}
    assert cg.expand(Plan({"x": "/GPU:0"}, {"/GPU:0": ["x"]})).placement == {"x": "/GPU:0"}


def test_report_uses_cluster_beta():
    g = layered_dag(300, seed=5)
    a = coarsen.coarsen(g, 30).report
    b = coarsen.coarsen(g, 30, cluster=v100x4_pcie()).report
    assert a.ccr_before != b.ccr_before and a.ccr_after < a.ccr_before
    d = a.to_dict()
    assert d["vertices"] == a.vertices and isinstance(d["rounds"], list)


def test_kahn_reports_a_cycle():
    with pytest.raises(CycleError) as ei:
        kahn_heights(3, np.array([0, 1, 2]), np.array([1, 2, 0]))
    assert len(ei.value.cycle) == 3


@pytest.mark.parametrize("method", METHODS)
def test_hub_ops(method):
    """A step-counter-like hub feeding every op and a sink reading all of them."""
    g = layered_dag(800, seed=6, coloc_prob=0.05)
    ops = list(g.ops) + [Op("hub", {"GPU": 1.0, "CPU": 1.0}), Op("sink", {"GPU": 1.0, "CPU": 1.0})]
    ts = list(g.tensors) + [Tensor("hub:0", "hub", 8)]
    es = list(g.edges) + [Edge("hub", n, ("hub:0",)) for n in g.names] + [Edge(n, "sink", ()) for n in g.names]
    h = OpGraph(ops, es, ts)
    cg = coarsen.coarsen(h, 40, method=method, check=True)
    if method != "baechi":
        assert cg.graph.num_ops <= 40
    # the hub tensor is one coarse tensor whatever the number of consumer vertices
    assert cg.graph.tensor("hub:0").bytes == 8


def _path_through(g: OpGraph, v: str) -> float:
    top, bottom = {}, {}
    order = g.topological_order()
    for x in order:
        top[x] = max((top[p] + g.op(p).compute["GPU"] for p in g.predecessors(x)), default=0.0)
    for x in reversed(order):
        bottom[x] = g.op(x).compute["GPU"] + max((bottom[s] for s in g.successors(x)), default=0.0)
    return top[v] + bottom[v]


def test_merged_path_matches_the_merged_graph():
    """_merged_path = longest compute path through the merged vertex, checked by
    building each single merge."""
    for seed in range(40):
        rng = _r.Random(seed)
        n = rng.randint(2, 9)
        comp = {f"v{i}": rng.randint(1, 20) for i in range(n)}
        edges = [(f"v{i}", f"v{j}", 8) for j in range(n) for i in range(j) if rng.random() < 0.35]
        g = OpGraph.from_edges(comp, edges)
        ga = GraphArrays.of(g)
        st = MergeState(ga)
        eu, ev, _ = coarse_edges(ga, st.label, st.m)
        H, flat, off = kahn_heights(st.m, eu, ev)
        pw, cp = _merged_path(st, eu, ev, H, flat, off, st.times(eu, ev))
        assert cp == pytest.approx(g.critical_path())
        for k, (u, v) in enumerate(zip(eu.tolist(), ev.tolist())):
            label = np.arange(n)
            label[v] = u
            _, label = np.unique(label, return_inverse=True)
            try:
                cg = build_coarse(ga, label.ravel(), CoarsenReport("one", n - 1, n, len(eu)))
            except CycleError:
                continue
            w = cg.vertex_of[g.names[u]]
            assert pw[k] == pytest.approx(_path_through(cg.graph, w))


@pytest.mark.parametrize("make", [lambda: lstm_grid(4, 20), lambda: layered_dag(2000, seed=8, coloc_prob=0.05)])
def test_gain_order(make):
    g = make()
    cg = coarsen.coarsen(g, 100, order="gain", check=True)
    assert cg.graph.num_ops <= 100 and cg.report.method == "height/gain"
    with pytest.raises(ValueError):
        coarsen.coarsen(g, 100, order="nope")


def test_verify_raises_coarsen_error_on_defects():
    """Each kind of corruption is named in the CoarsenError's message."""
    g = layered_dag(300, seed=8)
    cg = coarsen.coarsen(g, 30)
    verify(cg)
    v = next(iter(cg.members))
    bad = CoarseGraph(cg.graph, g, {**cg.members, v: cg.members[v][1:]}, cg.report)
    with pytest.raises(CoarsenError, match="do not partition"):
        verify(bad)
    # a coarse graph that lost its edges
    lone = OpGraph(list(cg.graph.ops), [], [])
    with pytest.raises(CoarsenError, match="lost"):
        verify(CoarseGraph(lone, g, cg.members, cg.report))
    # compute not conserved
    ops = [Op(o.name, {k: c + 1.0 for k, c in o.compute.items()}, persistent_bytes=o.persistent_bytes,
              output_bytes=o.output_bytes, temporary_bytes=o.temporary_bytes,
              colocation_group=o.colocation_group) for o in cg.graph.ops]
    more = OpGraph(ops, cg.graph.edges, cg.graph.tensors)
    with pytest.raises(CoarsenError, match="compute of"):
        verify(CoarseGraph(more, g, cg.members, cg.report))


def test_verify_holds_under_python_O():
    """verify rejects a corrupted CoarseGraph with assertions off (python -O)."""
    code = ("import coarsen, sys\n"
            "from benchmarks.generators import layered_dag\n"
            "assert False  # proves -O is on: this line is skipped\n"
            "cg = coarsen.coarsen(layered_dag(200, seed=0), 20)\n"
            "v = next(iter(cg.members))\n"
            "cg.members[v] = cg.members[v][1:]\n"
            "try:\n"
            "    coarsen.verify(cg)\n"
            "except coarsen.CoarsenError as e:\n"
            "    print('rejected:', e)\n"
            "    sys.exit(0)\n"
            "sys.exit(3)\n")
    root = Path(coarsen.__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "-O", "-c", code], cwd=root, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rejected: invalid coarse graph: members do not partition the ops" in r.stdout


def test_kahn_cycle_is_reported_by_find_cycle():
    # 0 -> 1 -> 2 -> 1 (cycle 1, 2) and 3 isolated
    with pytest.raises(CycleError, match="coarse graph has a cycle: v1 -> v2 -> v1"):
        kahn_heights(4, np.array([0, 1, 2]), np.array([1, 2, 1]))


# -- method="parallel": parallelism-preserving coarsening ---------------------------------
ZOO = Path(__file__).resolve().parents[1] / "benchmarks" / "graphs"


def _zoo(name):
    p = ZOO / f"{name}.json.gz"
    if not p.exists():
        pytest.skip(f"{p.name} not cached")
    return OpGraph.from_json(p)


@pytest.mark.parametrize("make", [lambda: lstm_grid(4, 25), lambda: _zoo("rnnlm_2x2048"),
                                  lambda: _zoo("transformer_6")], ids=["lstm_grid", "rnnlm_2x2048", "transformer_6"])
def test_parallel_keeps_90_percent_where_height_does_not(make):
    g = make()
    par = coarsen.coarsen(g, 200, method="parallel", check=True).report
    height = coarsen.coarsen(g, 200, method="height").report
    assert par.vertices <= 200 and height.vertices <= 200
    assert par.parallelism_kept >= 0.9
    assert height.parallelism_kept < 0.9
    assert par.kept_at == par.vertices
    # the report's parallelism is the coarse graph's own (fastest kind = GPU here)
    assert par.parallelism_before == pytest.approx(g.total_work() / g.critical_path())


def test_parallel_says_where_90_percent_is_kept():
    """layered_dag(2000) is layer-synchronous (every op within 1% of the critical
    path): 90% cannot be kept at 200 vertices; the report says down to which size
    it was, and strict=True stops there."""
    g = layered_dag(2000, seed=0)
    free = coarsen.coarsen(g, 200, method="parallel").report
    assert free.vertices <= 200 and free.parallelism_kept < 0.9
    assert 200 < free.kept_at < 2000
    strict = coarsen.coarsen(g, 200, method="parallel", strict=True, check=True).report
    assert not strict.reached and strict.parallelism_kept >= 0.9
    assert strict.kept_at == strict.vertices and free.kept_at <= strict.vertices
    assert "not reached" in str(strict) and "kept" in str(strict)
    loose = coarsen.coarsen(g, 200, method="parallel", keep=0.5, strict=True).report
    assert loose.parallelism_kept >= 0.5 and loose.vertices < strict.vertices


def test_parallel_report_for_every_method():
    g = lstm_grid(2, 10)
    for method in METHODS:
        r = coarsen.coarsen(g, 40, method=method).report
        assert r.cp_after >= r.cp_before - 1e-6 > 0
        assert 0 < r.parallelism_kept <= 1 + 1e-9
        assert r.parallelism_after <= r.parallelism_before + 1e-9
        d = r.to_dict()
        assert d["parallelism_kept"] == r.parallelism_kept and "parallelism" in str(r)


def test_parallel_partition_keeps_a_plan_representable():
    g = layered_dag(600, seed=4, coloc_prob=0.05)
    cl = v100x4_pcie()
    fine = simulate(g, cl, coarsen_free_plan(g, cl)).to_plan()
    cg = coarsen.coarsen(g, 60, method="parallel", partition=fine.placement, check=True)
    assert cg.report.method == "parallel/partition"
    for ms in cg.members.values():
        assert len({fine.placement[o] for o in ms}) == 1
    assert cg.expand(cg.project(fine, cl)).placement == fine.placement


def coarsen_free_plan(g, cl):
    """Chunks of the topological order on the GPUs (colocation groups together)."""
    gpus_ = [d.name for d in cl.devices if d.kind == "GPU"]
    order = g.topological_order()
    placement, by_group = {}, {}
    for k, op in enumerate(order):
        grp = g.op(op).colocation_group
        d = by_group.setdefault(grp, gpus_[k * len(gpus_) // len(order)]) if grp else \
            gpus_[k * len(gpus_) // len(order)]
        placement[op] = d
    return placement


def test_parallel_options_are_checked():
    g = lstm_grid(2, 5)
    with pytest.raises(TypeError):
        coarsen.coarsen(g, 10, method="parallel", cap_ops=3)
    with pytest.raises(ValueError):
        coarsen.coarsen(g, 10, method="parallel", keep=0.0)
    with pytest.raises(ValueError):
        coarsen.coarsen(g, 10, method="parallel", order="nope")
