"""solver.parallel.hybrid: replicas x pipeline stages, and its place in the step search."""
from __future__ import annotations

import re

import pytest

import pesto
from mb_strategies import layered_step
from pesto.cluster import gpus, hosts, v100x4_pcie
from pesto.errors import MicroBatchError
from pesto.step import compose, split
from pesto.plan import check_plan
from pesto.step import replicate
from solver.parallel.hybrid import replica_stages, hybrid_plan, replica_groups
from solver.parallel.pipelines import data_parallel_plan, pipeline_plan
from solver.registry import get_placer

# The case hybrid must win (10 GbE: 0.8 µs/byte between hosts, NVLink inside).
# A short chain: 2 layers (1 ms forward, 2 + 2 ms backward each, 10 ms of work
# per step), so no pipeline has more than 2 useful stages and a pure pipeline
# leaves a host idle: ~(M + 1) / M x 5 ms. Big weights: 2.2 MB per layer, so
# the all-reduce between hosts is what data parallelism pays for its 4
# replicas: a ring over 4 GPUs moves 1.5 x 4.4 MB through each NIC (6 steps),
# the hybrid's 2-replica rings (one per stage, between the hosts) 1 x 4.4 MB in
# 2 steps, on 2 replicas x 2 stages that still keep all 4 GPUs busy. (At 1.5 MB
# data parallelism, running each weight gradient as soon as it is ready, hides
# enough of its all-reduce to win; at 3 MB the pipeline does.)
BIG_WEIGHTS = dict(act=100_000, weight=2_200_000, t=1000.0)
SLOW = "10gbe"


@pytest.fixture(scope="module")
def step():
    return layered_step(2, **BIG_WEIGHTS)


@pytest.fixture(scope="module")
def two_hosts():
    return hosts(2, 2, SLOW)


def test_groups_are_hosts_and_consecutive_gpus():
    c = hosts(4, 2, "ib_hdr")
    assert replica_groups(c, 4) == [c.names[2 * h:2 * h + 2] for h in range(4)]
    assert replica_groups(c, 2) == [c.names[:4], c.names[4:]]
    assert replica_groups(v100x4_pcie(), 2) == [["/GPU:0", "/GPU:1"], ["/GPU:2", "/GPU:3"]]
    with pytest.raises(MicroBatchError, match="3 replicas"):
        replica_groups(v100x4_pcie(), 3)


@pytest.mark.parametrize("m", [1, 2, 3])
def test_each_replica_is_a_pipeline_inside_one_host(step, two_hosts, m):
    r = hybrid_plan(step, two_hosts, replicas=2, micro_batches=m)
    assert check_plan(r.graph, two_hosts, r.plan).ok
    assert r.graph.names == pesto.step_graph(step, m, "replicated", 2).names
    assert (r.replicas, r.stages, r.micro_batches) == (2, 2, m)
    host = {d: k // 2 for k, d in enumerate(two_hosts.names)}
    rep = replicate(step, 2)
    assert dict(r.transformed.origin) == dict((compose(split(rep.graph, m), rep) if m > 1 else rep).origin)
    used = [set(), set()]
    for name, dev in r.plan.placement.items():
        origin = r.transformed.origin[name]          # the step's op this one copies or sums, and its replica
        assert host[dev] == origin.replica, name     # a replica's ops, its ring ops too, stay on its host
        used[origin.replica].add(dev)
    assert all(len(u) == 2 for u in used)            # and use both of its GPUs: two stages


def test_the_ring_of_a_variable_runs_between_the_devices_holding_it(step, two_hosts):
    r = hybrid_plan(step, two_hosts, replicas=2, micro_batches=2)
    p = r.plan.placement
    rep = replicate(step, 2)
    for l in range(2):
        t = f"gradients/layer_{l}/f_grad/dw:0"
        ring = [n for n, o in rep.origin.items() if t in o.members]
        first = rep.origin[ring[0]].tensor       # a fused bucket runs on its first member's variable
        owner = re.match(r"gradients/(layer_\d+)/", first).group(1)
        assert len(ring) == 2 * (2 * 1 + 1)
        for name in ring:
            assert p[name] == p[f"{owner}/w@r{rep.origin[name].replica}"], name
    assert p["layer_0/w@r0"] != p["layer_1/w@r0"]


def test_unfused_rings_run_on_their_own_variable(step, two_hosts):
    rep = replicate(step, 2, bucket_bytes=None)
    stage = [0 if "layer_0" in op.name or op.name == "train/apply_0" else 1 for op in step.ops]
    rstage = replica_stages(rep, stage, 2)
    for l in range(2):
        t = f"gradients/layer_{l}/f_grad/dw:0"
        for k in range(2):
            ring = [f"{t}@rs0@r{k}", f"{t}@ag0@r{k}", f"{t}@allreduce@r{k}"]
            assert {rstage[rep.graph.index[n]] for n in ring} == {2 * k + l}


def test_hybrid_beats_data_parallel_and_pipeline_where_built_to(step, two_hosts):
    m = 2
    hybrid = hybrid_plan(step, two_hosts, replicas=2, micro_batches=m).plan.makespan
    dp = data_parallel_plan(step, two_hosts, micro_batches=m).plan.makespan
    pipe = min(pipeline_plan(step, two_hosts, schedule=s, micro_batches=m).plan.makespan for s in ("gpipe", "1f1b"))
    assert hybrid < dp and hybrid < pipe


def test_one_replica_is_the_pipeline_and_one_stage_the_data_parallel_split(step):
    c = gpus(2)
    one = hybrid_plan(step, c, replicas=1, micro_batches=2)
    assert one.graph.names == pesto.step_graph(step, 2, "replicated", 1).names
    assert one.stages == 2 and len(set(one.plan.placement.values())) == 2
    dp = hybrid_plan(step, c, replicas=2, micro_batches=2)
    assert dp.stages == 1 and {d for n, d in dp.plan.placement.items() if "@r1" in n} == {"/GPU:1"}


def test_registered_placer(step, two_hosts):
    plan = get_placer("hybrid")(step, two_hosts, replicas=2, micro_batches=2)
    assert plan.placer == "hybrid" and plan.stats["replicas"] == 2
    assert check_plan(pesto.step_graph(step, 2, "replicated", 2), two_hosts, plan).ok


def test_step_search_offers_hybrid_plans(step, two_hosts):
    plan = pesto.solve(step, cluster=two_hosts, micro_batches="auto", batch_size=8, time_limit=3, seed=0)
    steps = plan.log.steps
    assert {f"hybrid R=2 M={m}" for m in (1, 2, 4)} <= set(steps)
    # 2 replicas x 8 slices cannot share a batch of 8: half a sample per slice (sweep 4, M_cli_auto_b1)
    assert "not a multiple of 2 replicas x 8" in plan.log.skipped["hybrid R=2 M=8"]
    assert plan.makespan <= min(steps.values()) + 1e-6
    assert plan.makespan <= steps["hybrid R=2 M=2"] < steps["data-parallel M=2"]
    placed = pesto.step_graph(step, log=plan.log)   # every field of the log (savers, joined, in place)
    log = plan.log
    assert placed.names == pesto.step_graph(step, log.micro_batches, log.graph_kind, log.replicas, log.savers,
                                            joined=log.joined, in_place=log.in_place).names
    assert check_plan(placed, two_hosts, plan).ok


def test_step_search_skips_hybrids_too_large(step, two_hosts, monkeypatch):
    import solver.parallel.search as ss
    monkeypatch.setattr(ss, "DP_MAX_OPS", 2 * step.num_ops - 1)
    plan = pesto.solve(step, cluster=two_hosts, micro_batches=2, time_limit=2, seed=0)
    assert "hybrid R=2 M=2" not in plan.log.steps
    assert "more than" in plan.log.skipped["hybrid R=2 M=2"]


def test_step_search_screens_zero_bubble_hybrids(step, two_hosts):
    """The hybrid kind offers each replica count with 1F1B and ZB-H1 pipelines,
    named apart; the search logs the ZB-H1 hybrid's step as its realiser makes it."""
    from solver.parallel.kinds import KINDS
    from solver.parallel.search import SCREEN_CANDIDATES
    from solver.parallel.strategy import Strategy
    kind = KINDS["hybrid"]
    got = kind.candidates(step, two_hosts, 2)
    assert [(s.replicas, s.schedule) for s in got] == [(2, "1f1b"), (2, "zb-h1")]
    assert [kind.label(s) for s in got] == ["hybrid R=2 M=2", "hybrid R=2 M=2 zb-h1"]
    assert Strategy(replicas=2, stages=2, micro_batches=2, schedule="zb-h1").name == "hybrid R=2 K=2 M=2 zb-h1"
    plan = pesto.solve(step, cluster=two_hosts, micro_batches=2, time_limit=3, seed=0)
    zb = hybrid_plan(step, two_hosts, replicas=2, micro_batches=2, schedule="zb-h1", candidates=SCREEN_CANDIDATES).plan
    assert plan.log.steps["hybrid R=2 M=2 zb-h1"] == pytest.approx(zb.makespan)
    assert plan.makespan <= min(plan.log.steps.values()) + 1e-6


def test_a_hybrids_cuts_are_priced_on_its_replicas_routes(step, monkeypatch):
    """R=2 on 4 hosts of 2 GPUs: each replica's 4 stages span two hosts, so
    its middle boundary crosses the network and the others stay on NVLink;
    the cutter gets those routes per boundary (the slowest over the
    replicas' groups), not their mean."""
    import solver.parallel.hybrid as hybrid
    seen = {}

    def spy(*args, routes=None, **kw):
        seen["routes"] = routes
        return pipeline_plan(*args, routes=routes, **kw)
    monkeypatch.setattr(hybrid, "pipeline_plan", spy)
    c = hosts(4, 2, SLOW)
    hybrid_plan(step, c, replicas=2, micro_batches=2, candidates=1)
    r = seen["routes"]
    g = replica_groups(c, 2)
    net, nvlink = c.route(g[1][1], g[1][2]), c.route(g[1][0], g[1][1])
    assert r.shape == (4, 4, 2)
    assert r[1, 2].tolist() == pytest.approx([net.beta0, net.beta1])
    assert r[0, 1].tolist() == pytest.approx([nvlink.beta0, nvlink.beta1]) and r[0, 1, 1] < r[1, 2, 1]
