"""Coarsening on many random DAGs: 10,000 seeded graphs plus Hypothesis.

Every result must be acyclic (the coarse OpGraph checks it when built), its
members must partition the ops, compute per kind and persistent memory are
conserved, every fine edge is internal or carried (with its tensors) by a
coarse edge, colocation groups stay whole and feasible, and the expanded plan
of a coarse plan passes ``check_plan`` on the fine graph.
"""
import random

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

import coarsen
from coarsen import verify
from coarsen.base import CoarsenReport, build_coarse, coarse_edges, kahn_heights
from coarsen.height import select_pairs, theorem35_ok
from pesto import Edge, Op, OpGraph, Plan, Tensor, check_plan, gpus, simulate
from pesto.problem import GraphArrays

CLUSTER = gpus(2, with_cpu=True)
SHAPES = ("sparse", "dense", "layered", "tree", "empty")


def random_graph(seed: int, n: int | None = None, shape: str | None = None) -> OpGraph:
    """A small random DAG: mixed device kinds, multi-consumer tensors, control
    edges, colocation groups with a common kind."""
    rng = random.Random(seed)
    n = n or rng.randint(1, 24)
    shape = shape or rng.choice(SHAPES)
    if shape == "layered":
        layer = [i * rng.randint(2, 5) // n for i in range(n)]  # non-decreasing layer ids
    pairs = []
    for j in range(n):
        for i in range(j):
            if shape == "sparse":
                p = 1.5 / max(1, j)
            elif shape == "dense":
                p = 0.5
            elif shape == "layered":
                p = 0.7 if layer[j] == layer[i] + 1 else 0.05 if layer[j] > layer[i] + 1 else 0.0
            elif shape == "tree":
                p = 0.0
            else:
                p = 0.0
            if rng.random() < p:
                pairs.append((i, j))
        if shape == "tree" and j:
            pairs.append((rng.randrange(j), j))
    kinds_choice = [("GPU",)] * 6 + [("GPU", "CPU")] * 3 + [("CPU",)]
    kinds = [rng.choice(kinds_choice) for _ in range(n)]
    groups = [None] * n
    for gi in range(rng.choice([0, 0, 1, 2, 3])):
        members = rng.sample(range(n), min(n, rng.randint(2, 4)))
        common = rng.choice(["GPU", "CPU"])
        for k in members:
            groups[k] = f"grp{gi}"
            if common not in kinds[k]:
                kinds[k] = tuple(sorted(set(kinds[k]) | {common}))
    # a group touched twice keeps one name; make every group's kinds intersect
    gk = {}
    for k in range(n):
        if groups[k]:
            gk[groups[k]] = gk.get(groups[k], set(kinds[k])) & set(kinds[k])
    for k in range(n):
        if groups[k] and not gk[groups[k]]:
            groups[k] = None
    ops = []
    for k in range(n):
        comp = {kd: round(rng.uniform(0.5, 50) * (3 if kd == "CPU" else 1), 2) for kd in kinds[k]}
        ops.append(Op(f"n{k}", comp, persistent_bytes=rng.randint(0, 1000),
                      temporary_bytes=rng.randint(0, 100), output_bytes=rng.randint(0, 500),
                      colocation_group=groups[k]))
    tensors, edges = {}, []
    for i, j in pairs:
        r = rng.random()
        if r < 0.15:
            ts = ()
        else:
            ts = (f"n{i}:{0 if r < 0.8 else 1}",)
            if r > 0.95:
                ts = (f"n{i}:0", f"n{i}:1")
        for t in ts:
            tensors.setdefault(t, Tensor(t, f"n{i}", rng.choice([0, 8, 4096, 1 << 20])))
        edges.append(Edge(f"n{i}", f"n{j}", ts))
    return OpGraph(ops, edges, tensors.values(), name=f"rand{seed}")


def coarse_plan(cg) -> Plan:
    """A valid coarse plan: vertices alternate over the GPUs, CPU-only to the CPU,
    colocation groups on one device."""
    g = cg.graph
    groups = g.colocation_groups()
    placement, by_group = {}, {}
    for k, v in enumerate(g.topological_order()):
        grp = g.op(v).colocation_group
        if grp in by_group:
            placement[v] = by_group[grp]
            continue
        kinds = (frozenset.intersection(*(g.op(w).kinds for w in groups[grp])) if grp else g.op(v).kinds)
        placement[v] = ("/GPU:0", "/GPU:1")[k % 2] if "GPU" in kinds else "/CPU:0"
        if grp:
            by_group[grp] = placement[v]
    return Plan.from_placement(g, placement)


def check_all(g: OpGraph, cg, *, sim: bool = False):
    verify(cg)  # partition, conservation, edges/tensors, groups (raises CoarsenError)
    fine_plan = cg.expand(coarse_plan(cg))
    rep = check_plan(g, CLUSTER, fine_plan, check_memory=False)
    assert rep.ok, str(rep)
    if sim:
        plan = simulate(g, CLUSTER, fine_plan).to_plan()
        rep = check_plan(g, CLUSTER, plan)
        assert rep.ok, str(rep)


def test_ten_thousand_random_dags():
    """10,000 seeded graphs over the three methods (height gets half, a quarter
    of all with order="gain") at random targets; every 50th one also simulated
    and checked with times."""
    rng = random.Random(2021)
    counts = dict.fromkeys(coarsen.METHODS, 0)
    for seed in range(10_000):
        g = random_graph(seed)
        method = ("height", "height", "baechi", "celeritas")[seed % 4]
        target = rng.randint(1, g.num_ops)
        opts = {"order": "gain"} if seed % 4 == 1 else {}
        cg = coarsen.coarsen(g, target, method=method, **opts)
        assert cg.graph.num_ops <= g.num_ops
        if method == "celeritas" and all("GPU" in op.kinds for op in g.ops) and not cg.report.notes:
            assert cg.graph.num_ops <= target  # adjacent fusion reaches any target when kinds allow
        check_all(g, cg, sim=seed % 50 == 0)
        counts[method] += 1
    assert sum(counts.values()) == 10_000


def test_selection_satisfies_theorem_and_stays_acyclic():
    """The pairs one round selects satisfy (i)-(iii), and merging them gives a DAG."""
    for seed in range(1500):
        g = random_graph(seed, shape=("dense", "layered", "sparse")[seed % 3])
        pairs = select_pairs(g)
        assert theorem35_ok(g, pairs)
        label = np.arange(g.num_ops)
        for u, v in pairs:
            label[g.index[v]] = g.index[u]
        _, label = np.unique(label, return_inverse=True)
        ga = GraphArrays.of(g)
        m = int(label.max()) + 1
        eu, ev, _ = coarse_edges(ga, label.ravel(), m)
        kahn_heights(m, eu, ev)  # raises CycleError on a cycle
        build_coarse(ga, label.ravel(), CoarsenReport("one-round", m, g.num_ops, g.num_edges))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 60), shape=st.sampled_from(SHAPES),
       method=st.sampled_from(coarsen.METHODS), frac=st.floats(0.0, 1.0),
       caps=st.sampled_from([{}, {"cap_ops": 3}, {"cap_time": 20.0, "max_cap_growth": 2},
                             {"order": "gain"}]))
def test_hypothesis_random_dags(seed, n, shape, method, frac, caps):
    g = random_graph(seed, n, shape)
    target = max(1, int(frac * n))
    opts = caps if method in ("height", "baechi") else {}
    if method == "parallel":  # its own knobs, same four shapes of run
        opts = [{}, {"cap": 0.5, "max_cap": 1.0}, {"strict": True}, {"order": "bytes"}][
            [{}, {"cap_ops": 3}, {"cap_time": 20.0, "max_cap_growth": 2}, {"order": "gain"}].index(caps)]
    cg = coarsen.coarsen(g, target, method=method, check=True, **opts)
    check_all(g, cg, sim=True)
    assert cg.report.vertices == cg.graph.num_ops
    if method == "height" and opts in ({}, {"order": "gain"}) and not any(op.colocation_group for op in g.ops) \
            and all(op.kinds == {"GPU"} for op in g.ops):
        assert cg.graph.num_ops <= target  # GPU-only, no groups: sibling merges always reach it


def _ops_per_label(cg, labels):
    return [{labels.get(op) for op in ms} for ms in cg.members.values()]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 50), shape=st.sampled_from(SHAPES),
       frac=st.floats(0.0, 1.0), nlabels=st.integers(0, 3), keep=st.sampled_from([0.5, 0.9, 1.0]),
       strict=st.booleans())
def test_parallel_properties(seed, n, shape, frac, nlabels, keep, strict):
    """method="parallel": acyclic (the coarse OpGraph is built), ops partitioned,
    compute/bytes conserved, colocation groups whole (``verify``); partition=
    respected; the report's critical paths are the graphs' own; with
    ``strict=True`` the kept parallelism is at least ``keep``."""
    g = random_graph(seed, n, shape)
    target = max(1, int(frac * n))
    rng = random.Random(seed)
    labels = {op: rng.randrange(nlabels) for op in g.names} if nlabels else None
    cg = coarsen.coarsen(g, target, method="parallel", partition=labels, keep=keep, strict=strict,
                         check=True)
    check_all(g, cg, sim=True)
    if labels:
        assert all(len(s) == 1 for s in _ops_per_label(cg, labels))
    rep = cg.report
    fastest = {op.name: min(op.compute.values()) for op in g.ops}
    # a vertex runs on its members' common fastest kind
    coarse_fast = OpGraph.from_edges({v: min(cg.graph.op(v).compute.values()) for v in cg.members},
                                     [(e.src, e.dst) for e in cg.graph.edges])
    fine_fast = OpGraph.from_edges(fastest, [(e.src, e.dst) for e in g.edges])
    assert abs(rep.cp_before - fine_fast.critical_path()) <= 1e-6 * max(1.0, rep.cp_before)
    assert abs(rep.cp_after - coarse_fast.critical_path()) <= 1e-6 * max(1.0, rep.cp_after)
    assert rep.cp_after >= rep.cp_before - 1e-6  # merging never shortens a path
    assert rep.parallelism_after <= rep.parallelism_before + 1e-9
    assert rep.kept_at is not None and rep.kept_at <= g.num_ops
    if strict:
        assert rep.parallelism_kept >= keep - 1e-9
        assert rep.kept_at == rep.vertices or rep.vertices == g.num_ops
    if rep.parallelism_kept >= keep - 1e-9:
        assert rep.kept_at <= rep.vertices


def test_parallel_on_seeded_dags():
    """300 seeded graphs at random targets through method="parallel", every 25th simulated."""
    rng = random.Random(11)
    for seed in range(300):
        g = random_graph(seed)
        cg = coarsen.coarsen(g, rng.randint(1, g.num_ops), method="parallel")
        assert cg.graph.num_ops <= g.num_ops
        check_all(g, cg, sim=seed % 25 == 0)
