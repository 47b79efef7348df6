"""Hypothesis strategies shared by the test files.

    from strategies import dags, clusters, placements, plans, random_topo_order

* ``dags()``: small random OpGraphs with GPU-only, CPU-only and either-kind ops,
  colocation groups, multi-tensor and control edges, zero-byte tensors, and
  memory figures;
* ``clusters()``: small clusters (2 GPUs + CPU point-to-point, 4 GPUs on a
  shared PCIe switch, two hosts sharing NICs), contended or contention free;
* ``placements(graph, cluster)``: a valid placement (kinds and colocation
  groups respected);
* ``plans(graph, cluster)``: a Plan = valid placement + a random topological
  order split per device;
* ``random_fifo_plan(graph, cluster, seed)``: a seeded valid random placement
  run in TF's FIFO order (a start for the search tests).
"""
from __future__ import annotations

import random

from hypothesis import strategies as st

from pesto.cluster import Cluster, Device, Route, gpus, two_hosts, v100x4_pcie
from pesto.graph import Edge, Op, OpGraph, Tensor
from pesto.plan import Plan

__all__ = ["dags", "clusters", "placements", "plans", "random_topo_order", "lower_bound", "random_fifo_plan"]


@st.composite
def dags(draw, min_ops: int = 1, max_ops: int = 12, *, cpu_only: bool = True,
         coloc: bool = True, control: bool = True, zero_times: bool = True,
         edge_prob: float | None = None) -> OpGraph:
    """A random DAG (ops ``o0..o{n-1}``, edges only from lower to higher index)."""
    n = draw(st.integers(min_ops, max_ops))
    rnd = draw(st.randoms(use_true_random=False))
    p = edge_prob if edge_prob is not None else draw(st.sampled_from([0.15, 0.3, 0.6]))
    lo = 0 if zero_times else 1
    ops = []
    for i in range(n):
        t = float(rnd.randint(lo, 20))
        shape = rnd.random()
        if cpu_only and shape < 0.15:
            compute = {"CPU": t}
        elif shape < 0.35:
            compute = {"GPU": t, "CPU": 2 * t + 1}
        else:
            compute = {"GPU": t}
        ops.append(Op(f"o{i}", compute, persistent_bytes=rnd.choice([0, 0, 64, 1000]),
                      temporary_bytes=rnd.choice([0, 0, 32, 500]), scope=f"s{i % 3}", type="T"))
    # colocation groups whose members share at least one kind
    if coloc and n > 1:
        groups: dict[str, frozenset] = {}
        for i, op in enumerate(ops):
            if rnd.random() < 0.3:
                g = f"g{rnd.randint(0, max(1, n // 4))}"
                if g in groups and not (groups[g] & op.kinds):
                    continue
                groups[g] = groups.get(g, op.kinds) & op.kinds
                ops[i] = _with(op, colocation_group=g)
    tensors, edges = [], []
    produced: dict[int, list[Tensor]] = {}
    for i in range(n):
        k = rnd.choice([1, 1, 2])
        produced[i] = [Tensor(f"o{i}:{j}", f"o{i}", rnd.choice([0, 8, 100, 1000, 5000]))
                       for j in range(k)]
    used = set()
    for j in range(n):
        for i in range(j):
            if rnd.random() < p:
                if control and rnd.random() < 0.15:
                    edges.append(Edge(f"o{i}", f"o{j}", ()))
                else:
                    outs = produced[i]
                    carried = rnd.sample(outs, rnd.randint(1, len(outs)))
                    edges.append(Edge(f"o{i}", f"o{j}", tuple(t.name for t in carried)))
                    used.update(t.name for t in carried)
    for i in range(n):
        tensors.extend(produced[i])
        out = sum(t.bytes for t in produced[i])
        ops[i] = _with(ops[i], output_bytes=out)
    return OpGraph(ops, edges, tensors, name="hyp")


def _with(op: Op, **changes) -> Op:
    d = dict(name=op.name, compute=dict(op.compute), kinds=op.kinds, persistent_bytes=op.persistent_bytes,
             output_bytes=op.output_bytes, temporary_bytes=op.temporary_bytes,
             colocation_group=op.colocation_group, scope=op.scope, type=op.type)
    d.update(changes)
    return Op(**d)


def _p2p_with_cpu(beta, cpu_beta, contention_free):
    return gpus(2, beta=beta, with_cpu=True, cpu_beta=cpu_beta, contention_free=contention_free)


@st.composite
def clusters(draw, *, speed_one: bool = False, contention_free: bool | None = None) -> Cluster:
    """A small cluster with at least one GPU and one CPU device (``contention_free``
    None draws either mode)."""
    which = draw(st.sampled_from(["p2p", "pcie", "hosts"]))
    cf = draw(st.booleans()) if contention_free is None else contention_free
    if which == "p2p":
        beta = (draw(st.sampled_from([0.0, 1.0, 5.0])), draw(st.sampled_from([0.0, 0.001, 0.01])))
        cpu_beta = (draw(st.sampled_from([0.0, 2.0])), draw(st.sampled_from([0.001, 0.02])))
        speeds = [1.0, 1.0] if speed_one else [1.0, draw(st.sampled_from([0.5, 1.0, 2.0]))]
        c = gpus(2, beta=beta, with_cpu=True, cpu_beta=cpu_beta, speeds=speeds)
    elif which == "pcie":
        c = v100x4_pcie(with_cpu=True)
    else:
        c = two_hosts(with_cpu=True)
    return c.with_contention_free(cf)


def _group_kinds(graph: OpGraph):
    kinds = {}
    for g, members in graph.colocation_groups().items():
        ks = None
        for m in members:
            ks = graph.op(m).kinds if ks is None else ks & graph.op(m).kinds
        kinds[g] = ks
    return kinds


@st.composite
def placements(draw, graph: OpGraph, cluster: Cluster) -> dict:
    """A valid placement of ``graph`` on ``cluster`` (every op's kind must exist there)."""
    rnd = draw(st.randoms(use_true_random=False))
    gk = _group_kinds(graph)
    gdev = {g: rnd.choice([d.name for d in cluster.devices if d.kind in ks]) for g, ks in gk.items()}
    out = {}
    for op in graph.ops:
        if op.colocation_group is not None:
            out[op.name] = gdev[op.colocation_group]
        else:
            out[op.name] = rnd.choice([d.name for d in cluster.devices if d.kind in op.kinds])
    return out


def random_topo_order(graph: OpGraph, rnd: random.Random) -> list[str]:
    """A uniformly shuffled Kahn order: any topological order can come out."""
    pred = graph.pred_idx()
    succ = graph.succ_idx()
    indeg = [len(p) for p in pred]
    ready = [i for i in range(graph.num_ops) if indeg[i] == 0]
    out = []
    while ready:
        k = rnd.randrange(len(ready))
        ready[k], ready[-1] = ready[-1], ready[k]
        i = ready.pop()
        out.append(graph.names[i])
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    return out


@st.composite
def plans(draw, graph: OpGraph, cluster: Cluster) -> Plan:
    """Valid placement + a random topological order split per device (no times)."""
    pl = draw(placements(graph, cluster))
    rnd = draw(st.randoms(use_true_random=False))
    return Plan.from_placement(graph, pl, order=random_topo_order(graph, rnd))


def lower_bound(graph: OpGraph, cluster: Cluster) -> float:
    """max(critical path, total work / devices) with each op at its fastest
    allowed time on this cluster (valid when every device has speed <= 1)."""
    kinds = {d.kind for d in cluster.devices}
    fastest = {op.name: min(op.compute[k] for k in op.kinds if k in kinds) for op in graph.ops}
    best: dict[str, float] = {}
    for nm in graph.topological_order():
        best[nm] = max((best[p] for p in graph.predecessors(nm)), default=0.0) + fastest[nm]
    cp = max(best.values(), default=0.0)
    return max(cp, sum(fastest.values()) / len(cluster.devices))


def random_fifo_plan(g, cl, seed):
    """A valid random placement (kinds and colocation respected), TF FIFO order fixed."""
    from pesto.problem import Problem
    from solver.search import reschedule

    rng = random.Random(seed)
    prob = Problem.of(g, cl)
    place = {}
    for mem in prob.members:
        d = rng.choice(prob.allowed[mem[0]])
        for i in mem:
            place[g.names[i]] = cl.devices[d].name
    return reschedule(g, cl, place, candidates=("fifo",), placer="random")
