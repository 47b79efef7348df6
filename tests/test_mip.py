"""The paper's big-M MIP: agrees with CP-SAT on small 2-GPU instances."""
from __future__ import annotations

import random

import pytest

from pesto.cluster import gpus, heterogeneous
from pesto.errors import InvalidClusterError
from pesto.graph import Edge, Op, OpGraph, Tensor
from pesto.plan import check_plan
from solver.cpsat import place_cpsat
from solver.mip import place_mip


def small_graph(seed, n=7, coloc=False, cpu=False):
    rng = random.Random(seed)
    ops = []
    for i in range(n):
        comp = {"GPU": float(rng.randint(2, 9))}
        ops.append(Op(f"v{i}", comp, colocation_group="g" if coloc and i in (1, n - 2) else None))
    edges, tensors = [], []
    for j in range(1, n):
        for i in rng.sample(range(j), k=min(j, rng.randint(1, 2))):
            t = f"v{i}->v{j}"
            tensors.append(Tensor(t, f"v{i}", rng.randint(0, 6)))
            edges.append(Edge(f"v{i}", f"v{j}", (t,)))
    return OpGraph(ops, edges, tensors, name=f"small{seed}")


CASES = [(s, cf) for s in range(4) for cf in (False, True)]


@pytest.mark.parametrize("seed,contention_free", CASES)
def test_mip_agrees_with_cpsat(seed, contention_free):
    g = small_graph(seed, coloc=seed % 2 == 1)
    c = gpus(2, beta=(1.0, 1.0), contention_free=contention_free)
    mip = place_mip(g, c, time_limit=30)
    cp = place_cpsat(g, c, time_limit=30, workers=1)
    assert mip.status == "optimal" and cp.stats["model_status"] == "optimal"
    assert mip.stats["model_makespan"] == pytest.approx(cp.stats["model_makespan"], abs=1e-6)
    for p in (mip, cp):
        check_plan(g, c, p).raise_if_invalid()
    if contention_free:
        assert mip.makespan == pytest.approx(cp.makespan)


def test_mip_heterogeneous_speeds_and_directional_routes():
    g = small_graph(9, n=6)
    c = heterogeneous(with_cpu=False)
    mip = place_mip(g, c, time_limit=30)
    cp = place_cpsat(g, c, time_limit=30, workers=1)
    assert mip.status == "optimal" and cp.stats["model_status"] == "optimal"
    # CP-SAT rounds float times up; the MIP works in floats
    assert mip.stats["model_makespan"] <= cp.stats["model_makespan"] + 1e-6
    assert mip.stats["model_makespan"] >= cp.stats["model_makespan"] - cp.stats["rounding_error_us"] - 1e-6


def test_mip_memory_and_kinds():
    ops = [Op("a", {"GPU": 1.0}, persistent_bytes=600), Op("b", {"GPU": 1.0}, persistent_bytes=600)]
    g = OpGraph(ops, [Edge("a", "b", ("t",))], [Tensor("t", "a", 8)])
    p = place_mip(g, gpus(2, beta=(50.0, 0.0), memory=1000), time_limit=10)
    assert p.placement["a"] != p.placement["b"] and p.makespan == 52.0


def test_mip_needs_two_devices():
    with pytest.raises(InvalidClusterError):
        place_mip(small_graph(0), gpus(3))


@pytest.mark.parametrize("seed", [7, 10])
def test_mip_equals_oracle_with_link_contention(seed):
    from test_oracle import oracle, wide_graph

    g = wide_graph(seed, 6, shared=seed % 2 == 0)
    c = gpus(2, beta=(1.0, 1.0))
    mip = place_mip(g, c, time_limit=30)
    assert mip.status in ("optimal", "feasible")
    assert mip.stats["model_makespan"] == pytest.approx(oracle(g, c))


def test_unknown_option_raises_type_error():
    with pytest.raises(TypeError):
        place_mip(small_graph(0), gpus(2), time_limit=5, log=True)  # the MIP has no log option


@pytest.mark.parametrize("seed", range(6))
def test_mip_memory_is_static_peak(seed):
    """A plan of the MIP with its memory constraint on has a static peak
    (:func:`pesto.memory.static_peak`) within every device, so its liveness peak
    is too; and the constraint matches the CP-SAT model's optimum."""
    from test_cpsat import memory_graph

    from pesto.memory import static_bytes, static_peak
    from pesto.problem import Problem

    g = memory_graph(seed)
    p0 = Problem.of(g, gpus(2))
    one = max(p0.persistent[i] + p0.out[i] + p0.temp[i] for i in range(p0.n))
    need = sum(static_bytes(op) for op in g.ops) + max(p0.temp)
    c = gpus(2, beta=(1.0, 0.01), memory=max(int(need * (0.55 + 0.1 * (seed % 3))), one))
    mip = place_mip(g, c, time_limit=30)
    if "fallback" in mip.stats:
        assert mip.stats["fallback"] == "model proved infeasible"
        return
    assert mip.stats["memory_constraints"] and mip.status == "optimal"
    static = static_peak(g, c, Problem.of(g, c).placement_index(mip.placement))
    assert all(v <= d.memory for v, d in zip(static.values(), c.devices))
    cp = place_cpsat(g, c, time_limit=30, workers=1, memory="static")
    if cp.stats["memory_model"] == "static" and cp.stats["model_status"] == "optimal":
        assert mip.stats["model_makespan"] == pytest.approx(cp.stats["model_makespan"])
