"""Memory accountings against each other on random DAGs (pesto/memory.py).

For any placement (some ops' outputs views: ``Op.view_bytes``) the static peak
(persistent + allocated outputs + each tensor received once + the largest temporary) bounds both the placers' incremental tracker and
the liveness peak of any simulated schedule; the simulator's peak is the
checker's :func:`memory_profile` of the same times; and the pre-solve check
never refuses a problem that some placement fits.
"""
import random
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pesto.cluster import gpus
from pesto.errors import InfeasibleError
from pesto.graph import Op, OpGraph
from pesto.memory import MemoryTracker, check_feasible, memory_profile, static_peak
from pesto.plan import Plan
from pesto.problem import Problem
from benchmarks.generators import random_dag
from pesto.simulate import simulate
from strategies import clusters, dags, placements, random_topo_order

def with_views(g: OpGraph, rnd) -> OpGraph:
    """``g`` with a random part (none, half, all) of random ops' outputs marked a view."""
    ops = [replace(o, view_bytes=rnd.choice([0, o.output_bytes // 2, o.output_bytes])) if rnd.random() < 0.4 else o
           for o in g.ops]
    return OpGraph(ops, g.edges, g.tensors, name=g.name)


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def placed(draw, **dag_kw):
    g = draw(dags(**dag_kw))
    if draw(st.booleans()):   # some ops' outputs are views (Op.view_bytes: a variable's read)
        g = with_views(g, draw(st.randoms(use_true_random=False)))
    c = draw(clusters())
    pl = draw(placements(g, c))
    rnd = draw(st.randoms(use_true_random=False))
    return g, c, pl, rnd


@SETTINGS
@given(placed())
def test_tracker_peak_is_at_most_the_static_peak(case):
    g, c, pl, rnd = case
    prob = Problem.of(g, c)
    dev = prob.placement_index(pl)
    static = static_peak(g, c, dev)
    t = MemoryTracker(prob)
    for name in random_topo_order(g, rnd):
        i = prob.index[name]
        t.commit(i, dev[i])
    for k, name in enumerate(prob.dev_names):
        assert t.peak[k] <= static[name], (name, t.peak, static)


@SETTINGS
@given(placed())
def test_simulated_peak_is_at_most_the_static_peak(case):
    g, c, pl, rnd = case
    static = static_peak(g, c, Problem.of(g, c).placement_index(pl))
    plan = Plan.from_placement(g, pl, order=random_topo_order(g, rnd))
    for s in (simulate(g, c, pl, mode="fifo"), simulate(g, c, plan, mode="order")):
        for name, peak in s.peak_memory.items():
            assert peak <= static[name], (s.mode, name, s.peak_memory, static)


@SETTINGS
@given(placed())
def test_memory_profile_of_the_simulated_times_is_the_simulators_peak(case):
    g, c, pl, rnd = case
    plan = Plan.from_placement(g, pl, order=random_topo_order(g, rnd))
    for s in (simulate(g, c, pl, mode="fifo"), simulate(g, c, plan, mode="order")):
        assert memory_profile(g, c, s.placement, s.start, s.finish, s.transfers) == s.peak_memory
    # without times: the static bound
    assert memory_profile(g, c, pl) == static_peak(g, c, Problem.of(g, c).placement_index(pl))


@SETTINGS
@given(placed(), st.sampled_from(["exact", "slack"]))
def test_check_feasible_accepts_whatever_some_placement_fits(case, how):
    g, c, pl, _ = case
    static = static_peak(g, c, Problem.of(g, c).placement_index(pl))
    # capacities the placement just fits (or with room to spare)
    extra = 0 if how == "exact" else 1000
    fitted = c.with_memory({name: max(1, static[name] + extra) for name in c.names})
    check_feasible(g, fitted)  # must not raise, whatever the link model
    check_feasible(g, fitted.with_contention_free(not c.contention_free))


def test_check_feasible_still_refuses_an_op_too_big_for_every_device():
    big = OpGraph([Op("big", {"GPU": 1.0}, persistent_bytes=10, temporary_bytes=95)])
    try:
        check_feasible(big, gpus(2, memory=100))
    except InfeasibleError as exc:
        assert exc.culprit == "big"
    else:
        raise AssertionError("check_feasible accepted an op larger than any device")


def test_memory_profile_matches_a_fixed_seed_schedule():
    rnd = random.Random(3)
    g = random_dag(30, p=0.2, seed=3)
    c = gpus(2, beta=(1.0, 0.001))
    pl = {nm: rnd.choice(c.names) for nm in g.names}
    s = simulate(g, c, pl)
    assert memory_profile(g, c, pl, s.start, s.finish, s.transfers) == s.peak_memory
