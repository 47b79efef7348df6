"""solver.parallel.user_baselines: megatron, zero-dp, best-pipeline; pipeline_plan's op_stages."""
from __future__ import annotations

import pytest

from benchmarks.generators import uniform_stages as uniform_step
from mb_strategies import layered_step
from pesto.cluster import GiB, gpus, hosts
from pesto.errors import PestoError
from pesto.plan import check_plan
from solver.parallel import user_baselines as ub
from solver.parallel.hybrid import hybrid_plan
from solver.parallel.pipelines import phases, pipeline_plan
from solver.parallel.schedules import SCHEDULES
from solver.registry import PLACERS, run_placers


def test_uniform_stages_split_the_layers_by_count_and_anchor_the_gradients():
    g = layered_step(6)
    st = ub.uniform_stages(g, 4)   # 6 layers over 4 stages: 2, 2, 1, 1
    of = {n: st[g.index[n]] for n in g.names}
    assert [of[f"layer_{l}/f"] for l in range(6)] == [0, 0, 1, 1, 2, 3]
    ph = phases(g)
    for b, a in ph.anchor.items():
        assert st[b] == st[a]
    assert all(st[i] == -1 for i, op in enumerate(g.ops) if not op.batch)
    assert of["x"] == 0   # the data input goes with the first layer


def test_layers_come_from_the_smallest_depth_with_enough_numbered_groups():
    g = layered_step(3)
    with pytest.raises(PestoError, match="no 4 layers"):
        ub.uniform_stages(g, 4)


def test_given_op_stages_are_the_pipeline_and_hybrid_placement():
    g = layered_step(4, t=1000.0)
    st = ub.uniform_stages(g, 2)
    c = gpus(2)
    r = pipeline_plan(g, c, schedule="1f1b", micro_batches=2, op_stages=st)
    assert r.blocking == "given" and r.stages == 2
    for name in g.names:
        if g.op(name).batch:
            want = c.names[st[g.index[name]]]
            assert r.plan.placement[f"{name}@mb0"] == want and r.plan.placement[f"{name}@mb1"] == want
    assert check_plan(r.graph, c, r.plan).ok
    h = hybrid_plan(g, hosts(2, 2, "10gbe"), replicas=2, micro_batches=2, op_stages=st)
    assert h.replicas == 2 and h.stages == 2 and h.plan.makespan > 0


def test_bad_op_stages_are_refused_by_name():
    g = layered_step(2)
    with pytest.raises(ValueError, match="op_stages has 3 entries"):
        pipeline_plan(g, gpus(2), op_stages=(0, 0, 1))
    with pytest.raises(ValueError, match="op_stages uses 3 stages"):
        pipeline_plan(g, gpus(2), op_stages=tuple(2 if op.batch else -1 for op in g.ops))


def test_megatron_tries_every_factorisation_and_skips_what_does_not_fit():
    g = uniform_step(4, t=2000.0, act=1 << 26, params=1 << 28)   # 3 GiB a layer: data parallelism does not fit 8 GiB
    c = gpus(4, memory=8 * GiB)
    r = ub.megatron_plan(g, c, batch_size=8)
    configs = [t.config for t in r.tried]
    assert any(x.startswith("data-parallel DP=4") for x in configs)
    assert any("PP=2" in x and "DP=2" in x for x in configs) and any("PP=4" in x and "DP=1" in x for x in configs)
    assert all(t.fits is False for t in r.tried if t.config.startswith("data-parallel") and t.step is not None)
    # one-op layers: recomputation would save nothing, so its re-runs are notes, not plans
    assert all("nothing to recompute" in t.note for t in r.tried if t.config.endswith("recompute"))
    assert r.fits and "PP=4" in r.config
    assert r.plan.makespan == min(t.step for t in r.tried if t.fits)
    over = [t for t in r.tried if t.fits is False and t.step is not None
            and not t.config.startswith("data-parallel") and not t.config.endswith("recompute")]
    assert all(any(u.config == t.config + " recompute" for u in r.tried) for t in over)   # re-run recomputed


def test_megatron_schedules_follow_the_registry():
    assert ub.megatron_schedules() == tuple(s for s in SCHEDULES if s == "1f1b" or "interleav" in s)


def test_best_pipeline_is_the_best_schedule_and_count():
    g = layered_step(4, t=1000.0)
    r = ub.best_pipeline_plan(g, gpus(2), batch_size=8)
    assert {t.config.split()[0] for t in r.tried} == set(SCHEDULES)
    assert {t.config.split()[1] for t in r.tried} == {"M=2", "M=4", "M=8"}
    assert r.plan.makespan == min(t.step for t in r.tried if t.fits)
    fixed = ub.best_pipeline_plan(g, gpus(2), batch_size=8, micro_batches=4)
    assert {t.config.split()[1] for t in fixed.tried} == {"M=4"}


def test_zero_dp_is_skipped_with_its_reason_until_sharding_exists():
    g = layered_step(2)
    if ub.strategy_takes(replicas=2, shard_optimizer=1):
        plans, errors = run_placers(g, gpus(2), ["zero-dp"], batch_size=4)
        assert not plans and "sharded optimizer state is not available" in errors["zero-dp"]
    else:   # sharding landed: a plan of the replicated step
        r = ub.zero_plan(g, gpus(2), batch_size=4)
        assert r.solved.strategy.shard_optimizer == 1 and r.plan.makespan > 0


def test_registered_and_no_pipeline_baselines():
    for name in ("megatron", "zero-dp", "best-pipeline"):
        assert name in PLACERS and PLACERS[name].rank is None
    plan = PLACERS["megatron"](layered_step(2), gpus(2), batch_size=4)
    assert plan.makespan > 0


def test_cli_places_with_a_user_baseline_and_writes_the_graph_it_places(tmp_path, capsys):
    from pesto.cli import EXIT_OK, main
    from pesto.graph import OpGraph

    gpath, plan_path = tmp_path / "g.json", tmp_path / "plan.json"
    layered_step(4, t=1000.0).to_json(str(gpath))
    rc = main(["place", str(gpath), "--placer", "megatron", "--gpus", "2", "--batch-size", "8", "-o", str(plan_path)])
    out, err = capsys.readouterr()
    assert rc == EXIT_OK, err
    placed = OpGraph.from_json(str(tmp_path / "plan.graph.json.gz"))
    rc = main(["check", str(tmp_path / "plan.graph.json.gz"), str(plan_path)])
    assert rc == EXIT_OK and placed.num_ops > 0, capsys.readouterr()


def test_counts_cap_is_the_searchs():
    from solver.parallel.search import AUTO_MAX, micro_batch_counts

    assert ub.MAX_MICRO == AUTO_MAX
    assert ub.micro_counts(24) == micro_batch_counts("auto", 24) and ub.micro_counts(None) == micro_batch_counts("auto")


@pytest.mark.parametrize("room, config, tried", [
    (5.7, "zero-3 DP=4 M=1", ["zero-1 DP=4 M=1", "zero-2 DP=4 M=1", "zero-3 DP=4 M=1"]),
    (5.5, "zero-3 DP=4 M=1 recompute", ["zero-1 DP=4 M=1", "zero-2 DP=4 M=1", "zero-3 DP=4 M=1",
                                        "zero-2 DP=4 M=1 recompute", "zero-3 DP=4 M=1 recompute"])])
def test_zero_dp_tries_zero2_then_fsdp_then_recomputation(room, config, tried):
    """Two layers of a 32 MiB weight (Adam-like slots of as much), 4 GPUs: per GPU
    ZeRO-1 peaks at 6.9, ZeRO-2 at 6.1, ZeRO-3 at 5.6 and ZeRO-3 with recomputation
    at 5.4 weights; a user walks them in turn until one fits."""
    from mb_strategies import deep_step

    big = 2**25
    g = deep_step(2, weight=big, act=big // 2)
    r = ub.zero_plan(g, gpus(4, memory=int(room * big), beta=(1.0, 1e-6)), batch_size=4)
    assert r.fits and r.config == config and [t.config for t in r.tried] == tried
    assert r.solved.strategy.shard_optimizer == 3 and bool(r.solved.strategy.recompute) == config.endswith("recompute")
    assert [t.fits for t in r.tried] == [False] * (len(tried) - 1) + [True]
