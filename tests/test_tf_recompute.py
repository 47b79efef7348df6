"""A plan with activation recomputation runs in TensorFlow (issue 30, item 4).

``pesto.step.recompute`` copies each layer block's forward ops (``op@rc``)
for the block's backward to read; :mod:`tf_patch.recompute` makes the same
copies in the TF step (``recompute/<op>``) from the plan's own graph, so
``FunctionStep.apply`` of a recompute plan trains with the un-recomputed
step's losses, every copy mapped one to one and on the device the plan gives
it. The plans come from the realiser (``Strategy(..., recompute=True)``), so the
test does not depend on what a timed search picks. Models are tiny; no timing
is asserted.
"""
import dataclasses
import doctest
import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tf_patch  # noqa: E402  (loads OR-Tools before TensorFlow)

tf = pytest.importorskip("tensorflow")

import pesto  # noqa: E402
from keras_blocks import tanh_mlp, wide_mlp  # noqa: E402
from pesto.api import marked  # noqa: E402
from pesto.errors import MicroBatchError  # noqa: E402
from pesto.solvelog import SolveLog  # noqa: E402
from solver.parallel.realise import realise  # noqa: E402
from solver.parallel.strategy import Strategy  # noqa: E402
from tf_patch import recompute  # noqa: E402
from tf_patch.slicemap import RECOMPUTE, place_split, recomputed_op, result_view  # noqa: E402
from tf_patch.workflow import PlacedRun  # noqa: E402
from tf_patch.zoo import build_model  # noqa: E402

pytestmark = pytest.mark.tf

CLUSTER = pesto.gpus(2, beta=(0.0, 1e-9))


def _mlp(n_devices=2):
    """Three Dense layers ``layer_<k>`` (the blocks) and a head, trained by SGD."""
    model, x, y = tanh_mlp()
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return tf_patch.keras_step(model, loss, tf.keras.optimizers.SGD(0.5), x, y, n_devices=n_devices)


def _copies(result):
    return [n for n, o in result.transformed.origin.items() if o.role == "recompute"]


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_a_recompute_pipeline_trains_as_the_step_with_its_copies_mapped_one_to_one(micro_batches):
    step = _mlp()
    whole = step.run(3)
    step.reset()
    result = realise(marked(step.graph), CLUSTER, Strategy(stages=2, micro_batches=micro_batches, schedule="1f1b",
                                                           recompute=True))
    copies = _copies(result)
    assert len(copies) == 9 * micro_batches   # MatMul, BiasAdd, Tanh of 3 layers, per slice
    step.apply(result, cluster=CLUSTER)
    rc = step.recomputed
    assert rc.left_out == () and len(rc.copies) == len(copies)
    # each Pesto copy is one TF op recompute/<the TF op of its original>, in the graph TF runs
    tf_of = {p: ts for p, ts in step.mapping.ops.items()}
    for c in copies:
        orig = recomputed_op(c)
        assert tf_of[c] == tuple(RECOMPUTE + t for t in tf_of[orig]), c
        assert tf_of[c][0] in step.graph and tf_of[c][0] == rc.copies[tf_of[orig][0]]
    # the block's backward reads the copies: each TanhGrad reads recompute/.../Tanh, not the forward Tanh
    g = step.tf_graph
    grads = [op for op in g.get_operations() if op.type == "TanhGrad"]
    assert len(grads) == 3 * micro_batches
    assert all(op.inputs[0].op.name.startswith(RECOMPUTE) for op in grads)
    # TF's backward reads each op where Pesto's does: an original only where Pesto's backward still reads
    # it (the next block's weight gradient reads a block's output), else the copy (the original dies early)
    for c in copies:
        (t,) = tf_of[recomputed_op(c)]
        readers = {x.name for out in g.get_operation_by_name(t).outputs for x in out.consumers()}
        pesto = {x for s in result.graph.successors(recomputed_op(c)) for x in tf_of.get(s, ())}
        assert {r for r in readers if r.startswith("gradient_tape/")} <= pesto, c
    # a block's first copy waits (a control input) for its trigger: the TF op of Pesto's, a backward op
    triggers = [(e.src, e.dst) for e in result.graph.edges if e.dst in copies and not e.tensors]
    # every block's, the last one's too: the tape's gradient is not downstream of the loss op, so its
    # trigger is the gradient into it (the head's), not a forward-pass op
    assert len(triggers) >= 3 * micro_batches
    last = [src for src, c in triggers if "layer_2" in recomputed_op(c)]
    assert len(last) == micro_batches and all(result.graph.op(s).phase in ("input-grad", "weight-grad")
                                              for s in last), last
    for src, c in triggers:
        waits = {op.name for op in g.get_operation_by_name(tf_of[c][0]).control_inputs}
        assert set(tf_of[src]) <= waits and all(t.startswith("gradient_tape/") for t in tf_of[src]), (src, c)
    np.testing.assert_allclose(step.run(3), whole, rtol=1e-6)
    # the copies sit where the plan put them: the hint carries Pesto's devices, and TF ran the enforced plan
    plan = step.placed.hint if micro_batches > 1 else step.plan
    for c in copies:
        assert plan.placement[tf_of[c][0]].endswith(result.plan.placement[c][-1]), c
    seen = step.check()
    assert seen["misplaced"] == [] and seen["order_violations"] == []
    assert all(seen["devices"][rc.copies[t]] == step.plan.placement[rc.copies[t]] for t in rc.copies)
    step.close()


def test_a_plan_recomputing_some_blocks_trains_as_the_step_with_those_copies_only():
    """Strategy.recompute names blocks 0 and 2 of the three (per-block recomputation):
    TF builds the copies of those blocks alone, each block's trigger still the next
    layer's backward, and trains with the un-recomputed step's losses."""
    step = _mlp()
    whole = step.run(3)
    step.reset()
    result = realise(marked(step.graph), CLUSTER, Strategy(stages=2, micro_batches=2, schedule="1f1b",
                                                           recompute=(True, False, True)))
    assert result.strategy.savers == "recompute(2/3:0,2)" and result.plan.status != "infeasible"
    copies = _copies(result)
    assert len(copies) == 6 * 2 and not any("layer_1" in c for c in copies)   # 3 ops of 2 layers, per slice
    step.apply(result, cluster=CLUSTER)
    assert step.recomputed.left_out == () and len(step.recomputed.copies) == len(copies)
    assert not any(n.startswith(RECOMPUTE) and "layer_1" in n for n in step.graph.names)
    grads = [op for op in step.tf_graph.get_operations() if op.type == "TanhGrad"]
    assert sum(op.inputs[0].op.name.startswith(RECOMPUTE) for op in grads) == 2 * 2   # layer_1 reads its own Tanh
    np.testing.assert_allclose(step.run(3), whole, rtol=1e-6)
    seen = step.check()
    assert seen["misplaced"] == [] and seen["order_violations"] == []
    step.close()


def test_a_selective_plan_copies_the_cheap_ops_only_and_trains_as_the_step():
    """Strategy.selective: each Dense layer's cheap ops are copied
    (pesto.step.recompute.cheap_ops), the others not; TanhGrad reads the copy,
    the losses are the step's."""
    from pesto.step.recompute import cheap_ops, layer_blocks
    step = _mlp()
    whole = step.run(3)
    step.reset()
    g = marked(step.graph)
    cheap = {n for b in cheap_ops(g, layer_blocks(g)) for n in b}
    result = realise(g, CLUSTER, Strategy(stages=2, micro_batches=2, schedule="1f1b", recompute=True,
                                          selective=True))
    assert result.strategy.savers == "recompute-cheap"
    copies = _copies(result)
    assert copies and {recomputed_op(c).rpartition("@mb")[0] for c in copies} <= cheap < {
        n for b in layer_blocks(g) for n in b}
    step.apply(result, cluster=CLUSTER)
    assert step.recomputed.left_out == () and len(step.recomputed.copies) == len(copies)
    grads = [op for op in step.tf_graph.get_operations() if op.type == "TanhGrad"]
    assert grads and all(op.inputs[0].op.name.startswith(RECOMPUTE) for op in grads)
    np.testing.assert_allclose(step.run(3), whole, rtol=1e-6)
    seen = step.check()
    assert seen["misplaced"] == [] and seen["order_violations"] == []
    step.close()


def test_a_step_recomputed_once_takes_a_plain_plan_without_the_copies():
    step = _mlp()
    result = realise(marked(step.graph), CLUSTER, Strategy(stages=2, micro_batches=2, schedule="1f1b",
                                                           recompute=True))
    step.apply(result, cluster=CLUSTER)
    assert any(n.startswith(RECOMPUTE) for n in step.graph.names)
    plain = realise(step._unsplit, CLUSTER, Strategy(stages=2, micro_batches=2, schedule="1f1b"))
    step.apply(plain, cluster=CLUSTER)
    assert step.recomputed is None and not any(n.startswith(RECOMPUTE) for n in step.graph.names)
    step.close()


def test_result_view_takes_recompute_and_refuses_the_savers_tf_does_not_build_by_name():
    class Result:
        graph_kind, replicas, micro_batches, graph = "micro-batched", 1, 2, None

    ok = Result()
    ok.plan = pesto.Plan({}, {}, log=SolveLog(recipe="step search", savers="recompute"))
    assert result_view(ok).micro_batches == 2
    unknown = Result()
    unknown.plan = pesto.Plan({}, {}, log=SolveLog(recipe="step search", savers="recompute offload"))
    some = Result()
    some.plan = pesto.Plan({}, {}, log=SolveLog(recipe="step search", savers="recompute(2/3:0,2)"))
    assert result_view(some).micro_batches == 2   # some blocks recomputed: built as recompute is
    some.plan = pesto.Plan({}, {}, log=SolveLog(recipe="step search", savers="recompute-cheap(2/3:0,2)"))
    assert result_view(some).micro_batches == 2   # their cheap ops only: likewise
    with pytest.raises(MicroBatchError, match=r"memory savers \(offload\) that tf_patch does not build") as err:
        result_view(unknown)   # ZeRO with recomputation is built (tests/test_tf_savers.py), an unknown saver not
    assert err.value.culprit == "offload"


@pytest.mark.parametrize("name, tiny", [
    ("rnnlm", dict(layers=2, units=16, batch=8, steps=3, vocab=50, optimizer="sgd", lr=0.5)),
    ("gpt", dict(optimizer="adam"))])
def test_a_zoo_model_runs_a_recompute_plan_placed_and_place_split_refuses_a_step_without_copies(name, tiny):
    """rnnlm and GPT (graph mode, ``rnn/layer_<k>``, ``layer_<k>`` blocks; GPT with Adam):
    ``recompute_model`` builds the copies on TF's 2-slice step; ``place_split`` places it 1:1
    and it trains with the un-split step's losses."""
    def build(m):
        return build_model(name, "small", micro_batches=m, **tiny)

    whole = build(1)
    step, _ = tf_patch.opgraph(whole.graph, whole.fetches, "v100", on_unknown="ignore")
    tf_split, _ = tf_patch.opgraph(build(2).graph, build(2).fetches, "v100", on_unknown="ignore")
    result = realise(marked(step), CLUSTER, Strategy(stages=2, micro_batches=2, schedule="1f1b", recompute=True))
    with pytest.raises(ValueError, match=r"recomputes activations.*tf_patch.recompute_model"):
        place_split(result, step, tf_split, CLUSTER)
    model, graph = tf_patch.recompute_model(build(2), result, step, tf_split)
    copies = _copies(result)
    assert copies and sum(n.startswith(RECOMPUTE) for n in graph.names) == len(copies)
    placed = place_split(result, step, graph, CLUSTER, time_limit=2)
    assert all(c in placed.slices.ops for c in copies) and placed.slices.unmapped_pesto == ()
    with tf.compat.v1.Session(graph=whole.graph) as sess:
        sess.run(whole.init_op)
        expected = [float(sess.run(whole.fetches, whole.feed_fn(s))[1]) for s in range(2)]
    with PlacedRun(lambda: tf_patch.recompute_model(build(2), result, step, tf_split)[0], placed.plan,
                   n_devices=2) as run:
        losses = run.train(2)
        seen = run.trace()
    np.testing.assert_allclose(losses, expected, rtol=1e-6)
    assert seen["misplaced"] == [] and seen["order_violations"] == [] and seen["checked_edges"] > 0


@pytest.mark.parametrize("strategy, devices, optimizer", [
    (Strategy(replicas=2, stages=2, micro_batches=2, schedule="1f1b", recompute=True), 4, "sgd"),
    (Strategy(replicas=2, shard_optimizer=2, recompute=True), 2, "adam")], ids=["hybrid", "zero-2"])
def test_a_zoo_model_runs_a_recompute_plan_replicated_with_its_copies_placed(strategy, devices, optimizer):
    """rnnlm as a hybrid R=2 x M=2 with recomputation on 4 devices, and data-parallel with
    Adam sharded (ZeRO-2) and recomputation on 2 (``replicate_model`` then
    ``recompute_replicated``): each copy on the plan's device, the un-split step's losses."""
    tiny = dict(layers=2, units=16, batch=8, steps=3, vocab=50, optimizer=optimizer,
                lr=0.5 if optimizer == "sgd" else 0.01)
    whole = build_model("rnnlm", "small", **tiny)
    step, _ = tf_patch.opgraph(whole.graph, whole.fetches, "v100", on_unknown="ignore")
    result = realise(marked(step), pesto.gpus(devices, beta=(0.0, 1e-9)), strategy)
    log = SolveLog(recipe="step search", graph_kind="replicated", replicas=2, savers=result.strategy.savers)
    result = dataclasses.replace(result, plan=result.plan.replace(log=log))   # as the search returns it
    slices = strategy.replicas * strategy.micro_batches
    built = tf_patch.replicate_model(build_model("rnnlm", "small", micro_batches=slices, **tiny), result)
    model, plan, rmap = recompute.recompute_replicated(built[0], result, built[2])
    copies = _copies(result)
    assert copies and all(len(rmap.ops[c]) == 1 and rmap.ops[c][0].startswith(RECOMPUTE) for c in copies)
    assert all(plan.placement[rmap.ops[c][0]] == result.plan.placement[c] for c in copies)
    updates = [op.name for op in model.graph.get_operations() if op.type == "ResourceApplyAdam"]
    assert all(n.startswith("allreduce/") and n.endswith("/update") for n in updates)   # ZeRO: pieces only
    assert bool(updates) == bool(strategy.shard_optimizer)
    with tf.compat.v1.Session(graph=whole.graph) as sess:
        sess.run(whole.init_op)
        expected = [float(sess.run(whole.fetches, whole.feed_fn(s))[1]) for s in range(3)]
    with PlacedRun(lambda: model, plan, n_devices=devices) as run:
        losses = run.train(3)
        seen = run.trace()
    np.testing.assert_allclose(losses, expected, rtol=1e-6)
    assert seen["misplaced"] == [] and seen["order_violations"] == [] and seen["checked_edges"] > 100
    assert {seen["devices"][rmap.ops[c][0]] for c in copies} == {f"/CPU:{k}" for k in range(devices)}


def test_recompute_examples_run():
    assert doctest.testmod(recompute).failed == 0


def test_a_recompute_hybrid_trains_on_four_devices_as_the_step_with_its_copies_placed():
    step = _mlp(n_devices=4)
    whole = step.run(3)
    step.reset()
    cluster = pesto.gpus(4, beta=(0.0, 1e-9))
    result = realise(marked(step.graph), cluster, Strategy(replicas=2, stages=2, micro_batches=2, schedule="1f1b",
                                                           recompute=True))
    copies = _copies(result)
    assert result.graph_kind == "replicated" and len(copies) == 9 * 4   # 2 replicas x 2 slices
    step.apply(result, cluster=cluster)
    assert step.replicas == 2 and step.recomputed.left_out == ()
    for c in copies:   # one to one, on the plan's device
        (t,) = step.mapping.ops[c]
        assert t.startswith(RECOMPUTE) and t in step.graph
        assert step.plan.placement[t].endswith(result.plan.placement[c][-1]), c
    np.testing.assert_allclose(step.run(3), whole, rtol=1e-6)
    seen = step.check()
    assert seen["misplaced"] == [] and seen["order_violations"] == []
    assert {seen["devices"][t] for c in copies for t in step.mapping.ops[c]} == {f"/CPU:{k}" for k in range(4)}
    step.close()


def test_the_demo_trains_a_recompute_plan_auto_chose(capsys, monkeypatch):
    """``--micro-batches auto`` returning a 1F1B plan with recomputation (forced: the zoo's
    presets fit memory) trains with its copies, on-plan, with the un-split step's losses."""
    from tf_patch import demo

    def chose_recompute(args, batch):
        def build():
            return build_model(args.model, args.preset, seed=args.seed)

        alone, _, cluster, reference, graph = demo._profile(build, args)
        result = realise(marked(graph), cluster, Strategy(stages=2, micro_batches=2, schedule="1f1b",
                                                          recompute=True))
        return demo.Chosen(2, result, graph, (alone, cluster, reference, graph), None, result.plan.makespan)

    monkeypatch.setattr(demo, "choose_micro_batches", chose_recompute)
    assert demo.main(["--model", "rnnlm", "--preset", "small", "--micro-batches", "auto", "--time-limit", "1",
                      "--steps", "2", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "the plan recomputes activations: " in out and " copies built on TF's step" in out
    assert "trace: 0 ops off-plan, 0/" in out and "NOT EQUAL" not in out
    assert "equal within 1e-05 relative" in out


def test_a_timed_search_picks_recomputation_where_only_it_fits_a_wide_keras_mlp():
    """Four blocks Dense(512, relu) -> Dense(128) at batch 1024 (the 512-wide activation is
    recomputed, the weights are small), 2 GPUs of 8.05 MB, M=2: every plan without
    recomputation needs more (a weight's read a view of its variable: data-parallel M=2 about
    8.66 MB, pipelines 15-16 MB; with recomputation 7.91 MB; the exact passes place the split step in 8.2 MB without), so the timed search returns one
    that recomputes and fits (a Keras optimizer's update is not sharded, so no ZeRO saver is
    screened)."""
    model, x, y = wide_mlp()
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    step = tf_patch.keras_step(model, loss, tf.keras.optimizers.SGD(0.1), x, y, n_devices=2)
    cluster = pesto.gpus(2, memory=8_050_000)   # deterministic: the same plan on a loaded machine
    r = pesto.solve_step(step.graph, cluster=cluster, time_limit=20, micro_batches=2, workers=1, deterministic=True)
    assert r.strategy.recompute and r.plan.status != "infeasible", r.strategy
    copies = _copies(r)
    assert copies and all(r.graph.predecessors(c) for c in copies)
    s = pesto.simulate(r, cluster)
    assert max(s.peak_memory.values()) <= 8_050_000
    # each block's first copy waits for a backward op, the last block's too
    waits = {recomputed_op(c).split("/")[1] for c in copies for p in r.graph.predecessors(c)
             if r.graph.op(p).phase in ("input-grad", "weight-grad") and not r.graph.edge(p, c).tensors}
    assert {f"layer_{k}_1" for k in range(4)} <= waits, waits
    # and TensorFlow trains it: recomputation alone is a data-parallel saver TF builds
    assert r.strategy.savers == "recompute", r.strategy.savers
    whole = step.run(2)
    step.reset()
    step.apply(r, cluster=cluster)
    np.testing.assert_allclose(step.run(2), whole, rtol=1e-5)
    step.close()
