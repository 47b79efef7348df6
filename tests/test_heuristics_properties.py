"""Every heuristic placer on generated graphs: kinds, colocation, tight memory.

The agreed memory behaviour (solver/memory.py): a plan is always returned; if
it is not labelled "infeasible" it passes check_plan including memory; if it
is, the only violations are memory ones and stats["memory_over"] says where.
"""
import inspect

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pesto.cluster import gpus
from pesto.graph import Edge, Op, OpGraph, Tensor
from pesto.plan import check_plan
from solver import get_placer

PLACERS = ["single", "expert", "metis", "m-topo", "m-etf", "m-sct", "celeritas", "heft"]
KINDS = {"gpu": ("GPU",), "cpu": ("CPU",), "both": ("GPU", "CPU")}
SCOPES = ["", "embed", "rnn/layer_0", "rnn/layer_1", "rnn/layer_2", "softmax", "gradients/rnn/layer_1"]


@st.composite
def graphs(draw, min_persistent=0):
    n = draw(st.integers(1, 12))
    group_kind = {g: draw(st.sampled_from(list(KINDS))) for g in ("g0", "g1", "g2")}
    ops = []
    for k in range(n):
        group = draw(st.sampled_from([None, None, "g0", "g1", "g2"]))
        kind = group_kind[group] if group else draw(st.sampled_from(["gpu", "gpu", "cpu", "both"]))
        t = draw(st.integers(0, 50))
        compute = {kd: float(t) * (4 if kd == "CPU" else 1) for kd in KINDS[kind]}
        ops.append(Op(f"o{k}", compute, persistent_bytes=draw(st.integers(min_persistent, 100)),
                      output_bytes=draw(st.integers(0, 40)), temporary_bytes=draw(st.integers(0, 30)),
                      colocation_group=group, scope=draw(st.sampled_from(SCOPES))))
    edges, tensors = [], []
    for j in range(n):
        for i in range(j):
            if draw(st.integers(0, 3)) == 0:
                nbytes = draw(st.sampled_from([0, 16, 64, 1 << 20]))
                if nbytes == 0 and draw(st.booleans()):
                    edges.append(Edge(f"o{i}", f"o{j}", ()))  # control edge
                else:
                    t = f"o{i}:{j}" if draw(st.booleans()) else f"o{i}:0"  # shared tensor or not
                    if not any(x.name == t for x in tensors):
                        tensors.append(Tensor(t, f"o{i}", nbytes))
                    edges.append(Edge(f"o{i}", f"o{j}", (t,)))
    return OpGraph(ops, edges, tensors)


def _static_need(g, tensors=False):
    """Bytes of every op (persistent, output, the largest temporary) and, with
    ``tensors``, a received copy of every tensor."""
    need = sum(op.persistent_bytes + op.output_bytes for op in g.ops) + max(op.temporary_bytes for op in g.ops)
    return need + (sum(t.bytes for t in g.tensors) if tensors else 0)


def _check(g, c, plan, name):
    assert set(plan.placement) == set(g.names)
    assert plan.placer == name
    assert plan.status in ("heuristic", "infeasible")
    rep = check_plan(g, c, plan)
    if plan.status == "infeasible":
        assert plan.stats.get("memory_over"), plan.stats
        assert all(v.startswith("memory on") for v in rep.violations), rep.violations
    else:
        assert rep.ok, str(rep)
    return rep


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=graphs(), frac=st.sampled_from([0.2, 0.35, 0.5, 0.75, 10.0]))
def test_every_placer_gives_a_checked_plan(g, frac):
    # memory from very tight (a fifth of the ops' static need per device) to roomy
    need = _static_need(g, tensors=True) if frac >= 10.0 else _static_need(g)
    c = gpus(2, with_cpu=True).with_memory(max(1, int(frac * need)))
    for name in PLACERS:
        plan = get_placer(name)(g, c)
        rep = _check(g, c, plan, name)
        if frac >= 10.0:  # everything fits anywhere: nobody may claim otherwise
            assert plan.status == "heuristic" and rep.ok


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=graphs(min_persistent=3))
def test_every_placer_says_so_when_memory_fits_nowhere(g):
    total = sum(op.persistent_bytes for op in g.ops)
    # three devices whose memory together is below the persistent bytes alone
    c = gpus(2, with_cpu=True).with_memory(max(1, (total - 1) // 3))
    for name in PLACERS:
        plan = get_placer(name)(g, c)
        _check(g, c, plan, name)
        assert plan.status == "infeasible", name
        assert not check_plan(g, c, plan).ok


@pytest.mark.parametrize("name", PLACERS)
def test_placers_are_registered_and_deterministic(name):
    g = OpGraph.from_edges({"a": 3, "b": 4, "c": 5, "d": 1},
                           [("a", "b", 1 << 20), ("a", "c", 1 << 10), ("b", "d", 8), ("c", "d", 8)])
    c = gpus(2)
    fn = get_placer(name)
    declared = inspect.signature(fn).parameters
    kw = {k: v for k, v in {"time_limit": 5}.items() if k in declared}
    p1 = fn(g, c, **kw, **({"seed": 1} if "seed" in declared else {}))
    p2 = fn(g, c, **kw, **({"seed": 2} if "seed" in declared else {}))
    assert dict(p1.placement) == dict(p2.placement)
    assert p1.makespan == p2.makespan
    # no placer can beat the compute-only critical path a->c->d (or a->b->d)
    assert p1.makespan >= g.critical_path() - 1e-9


@pytest.mark.parametrize("name", PLACERS)
def test_placers_reject_options_they_do_not_use(name):
    g = OpGraph.from_edges({"a": 1, "b": 1}, [("a", "b", 8)])
    with pytest.raises(TypeError):
        get_placer(name)(g, gpus(2), no_such_option=1)
