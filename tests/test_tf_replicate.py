"""Data-parallel and hybrid plans run in TensorFlow (issue 31, item 1).

A replicated plan of ``pesto.solve_step`` (R replicas, a ring all-reduce per
gradient bucket; hybrid: each replica in M micro-batches) is carried onto TF's
replicated step (:mod:`tf_patch.replicastep`) and trains there with the
un-split step's (and ``MirroredStrategy``'s) losses and every op on the device
the plan gives it. The plans come from the data-parallel and hybrid placers
(what ``auto`` returns when they win), so that the test does not depend on
which candidate a timed search picks. Models are tiny; no timing is asserted.
"""
import doctest
import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tf_patch  # noqa: E402  (loads OR-Tools before TensorFlow)

tf = pytest.importorskip("tensorflow")

import pesto  # noqa: E402
from keras_blocks import attention_block, lstm_gru  # noqa: E402
from solver.parallel.hybrid import hybrid_plan  # noqa: E402
from solver.parallel.pipelines import data_parallel_plan  # noqa: E402
from solver.parallel.realise import realise  # noqa: E402
from pesto.api import marked as with_marks  # noqa: E402
from pesto.solvelog import SolveLog  # noqa: E402
from solver.parallel.strategy import Solved, Strategy  # noqa: E402
from tf_patch import replicastep  # noqa: E402
from tf_patch.workflow import PlacedRun  # noqa: E402
from tf_patch.replicastep import pesto_buckets, replicate_model  # noqa: E402
from tf_patch.zoo import build_model  # noqa: E402

pytestmark = pytest.mark.tf

L = tf.keras.layers
CLUSTER = {n: pesto.gpus(n, beta=(0.0, 1e-9)) for n in (1, 2, 4)}
TINY = {"rnnlm": dict(layers=1, units=16, batch=8, steps=3, vocab=50),
        "nmt": dict(layers=1, units=16, batch=8, src_steps=3, tgt_steps=3, vocab=50)}


def _cnn():
    inp = tf.keras.Input((8, 8, 3))
    h = L.Conv2D(4, 3, activation="relu")(inp)
    h = L.GlobalAveragePooling2D()(L.MaxPooling2D()(L.DepthwiseConv2D(3, padding="same")(h)))
    return tf.keras.Model(inp, L.Dense(3)(h)), tf.random.normal((8, 8, 8, 3), seed=1)


FAMILIES = {"cnn": _cnn,
            "attention": lambda: attention_block(batch=8, seq=6, width=8, classes=3),
            "rnn": lambda: lstm_gru(batch=8, steps=5, features=4, lstm=8, gru=6, classes=3)}


def _keras(family, n_devices):
    tf.keras.utils.set_random_seed(0)
    model, x = FAMILIES[family]()
    y = tf.random.uniform((8,), 0, 3, dtype=tf.int32, seed=2)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return tf_patch.keras_step(model, loss, tf.keras.optimizers.SGD(0.5), x, y, n_devices=n_devices)


def _replicated(graph, replicas, micro_batches=1):
    """The data-parallel (M = 1) or hybrid plan as ``pesto.solve_step`` returns it."""
    marked = with_marks(graph)
    if micro_batches == 1:
        sp = data_parallel_plan(marked, CLUSTER[replicas])
    else:
        sp = hybrid_plan(marked, CLUSTER[replicas * micro_batches], replicas=replicas, micro_batches=micro_batches)
    return Solved(sp.plan, sp.graph, Strategy(replicas=replicas, stages=sp.stages if micro_batches > 1 else 1,
                                               micro_batches=micro_batches))


def _assert_placed(step, result, devices):
    seen = step.check()
    assert seen["misplaced"] == [] and seen["order_violations"] == [] and seen["checked_edges"] > 50
    assert set(seen["devices"].values()) == {f"/CPU:{k}" for k in range(devices)}
    # the plan's device map: every TF op Pesto's ops map to is where the plan puts them
    for p, ts in step.mapping.ops.items():
        assert all(step.plan.placement[t].endswith(result.plan.placement[p][-1]) for t in ts), p
    # most of the work is mapped: every slice's matmuls and convolutions, and the rings
    heavy = [op.name for op in step.graph.ops if op.type in ("MatMul", "Conv2D", "BatchMatMulV2", "AddV2")
             and (op.name.startswith("mb") or op.name.startswith("allreduce/"))]
    mapped = {t for ts in step.mapping.ops.values() for t in ts}
    assert heavy and len([t for t in heavy if t in mapped]) >= 0.8 * len(heavy), step.mapping.summary()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_data_parallel_plan_trains_each_family_as_the_unsplit_step(family):
    step = _keras(family, 2)
    whole = step.run(3)
    step.reset()
    result = _replicated(step.graph, 2)
    step.apply(result)
    assert step.replicas == 2 and step.micro_batches == 2
    assert any(n.startswith("allreduce/0/rs0/r1") for n in step.graph.names)
    np.testing.assert_allclose(step.run(3), whole, rtol=1e-6)
    _assert_placed(step, result, 2)
    step.close()


def test_a_hybrid_plan_trains_on_four_devices_as_the_unsplit_step():
    step = _keras("cnn", 4)
    whole = step.run(3)
    step.reset()
    result = _replicated(step.graph, 2, micro_batches=2)
    assert len(set(result.plan.placement.values())) == 4
    step.apply(result)
    assert step.replicas == 2 and step.micro_batches == 4
    assert any("/acc_1" in n for n in step.graph.names)   # each replica sums its 2 micro-batches first
    np.testing.assert_allclose(step.run(3), whole, rtol=1e-6)
    _assert_placed(step, result, 4)
    step.close()


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_a_zero_bubble_hybrid_plan_trains_as_the_unsplit_step(micro_batches):
    """A hybrid whose pipelines run ZB-H1 (weight gradients deferred, what the
    search screens beside 1F1B): the same replicated step, ordered otherwise;
    it trains as the un-split step, every op where the plan puts it."""
    step = _keras("cnn", 4)
    whole = step.run(3)
    step.reset()
    marked = with_marks(step.graph)
    sp = hybrid_plan(marked, CLUSTER[4], replicas=2, micro_batches=micro_batches, schedule="zb-h1")
    assert sp.stages == 2
    result = Solved(sp.plan, sp.graph, Strategy(replicas=2, stages=2, micro_batches=micro_batches,
                                                schedule="zb-h1"))
    step.apply(result)
    assert step.replicas == 2 and step.micro_batches == 2 * micro_batches
    np.testing.assert_allclose(step.run(3), whole, rtol=1e-6)
    _assert_placed(step, result, 4)
    step.close()


@pytest.mark.parametrize("family", ["rnn", "attention"])
def test_replicas_of_a_free_placement_train_as_the_unsplit_step(family):
    """Two replicas, each the one-step placer's plan of a replica's step on two
    GPUs (:mod:`solver.parallel.placed`, the ``placed`` kind): the replicated
    step of a hybrid of one slice, placed and ordered freely; it trains as the
    un-split step, every op where the plan puts it."""
    step = _keras(family, 4)
    whole = step.run(3)
    step.reset()
    place = lambda g, c: pesto.solve(g, cluster=c, time_limit=2, deterministic=True, workers=1)  # noqa: E731
    result = realise(with_marks(step.graph), CLUSTER[4], Strategy(replicas=2, stages=2, schedule="free"),
                     place=place)
    assert result.graph_kind == "replicated" and result.strategy.schedule == "free"
    step.apply(result)
    assert step.replicas == 2 and step.micro_batches == 2
    np.testing.assert_allclose(step.run(3), whole, rtol=1e-6)
    _assert_placed(step, result, 4)   # two GPUs per replica
    step.close()


@pytest.mark.parametrize("name, optimizer, micro_batches", [("rnnlm", "sgd", 1), ("rnnlm", "adam", 1),
                                                         ("nmt", "adam", 2)])
def test_a_zoo_model_trains_replicated_as_mirrored_strategy(name, optimizer, micro_batches):
    """Data parallelism (and a hybrid R=2 x M=2 on 4 devices): an embedding's sparse gradient is
    gathered, not summed; Adam's state per replica; losses as MirroredStrategy's on 2 devices."""
    cfg = dict(TINY[name], optimizer=optimizer, lr=0.5 if optimizer == "sgd" else 0.01)
    whole = build_model(name, "small", **cfg)
    graph, _ = tf_patch.opgraph(whole.graph, whole.fetches, "v100", on_unknown="ignore")
    result = _replicated(graph, 2, micro_batches)
    split = build_model(name, "small", micro_batches=2 * micro_batches, **cfg)
    buckets, missing = pesto_buckets(result.graph, split.graph, [split.loss.name, split.train_op.name])
    scopes = [s for b in buckets.values() for s in b]
    variables = len(whole.graph.get_collection("trainable_variables"))
    assert missing == [] and len(scopes) == len(set(scopes)) == variables   # each in one of the plan's buckets
    model, plan, rmap = replicate_model(split, result)
    inputs = {op.name for op in graph.ops if op.type == "Placeholder"}
    assert rmap.unmapped_pesto and {n.split("@")[0] for n in rmap.unmapped_pesto} <= inputs  # TF splits them once
    assert any(n.startswith("allgather/") for n in plan.placement)   # the embedding's rows
    with PlacedRun(lambda: model, plan, n_devices=2 * micro_batches) as run:
        losses = run.train(3)
        seen = run.trace()
    with PlacedRun(lambda: build_model(name, "small", mirrored=2, **cfg), None, n_devices=2, inter_op=2) as run:
        mirrored = run.train(3)
    np.testing.assert_allclose(losses, mirrored, rtol=1e-6)
    assert seen["misplaced"] == [] and seen["order_violations"] == [] and seen["checked_edges"] > 100
    assert set(seen["devices"].values()) == {f"/CPU:{k}" for k in range(2 * micro_batches)}


def test_one_replica_is_the_step_itself():
    """``auto`` on one GPU may return the data-parallel plan of one replica (``op@r0``, no all-reduce)."""
    step = _keras("cnn", 1)
    whole = step.run(2)
    step.reset()
    result = _replicated(step.graph, 1)
    assert result.replicas == 1 and all(n.endswith("@r0") for n in result.graph.names)
    step.apply(result)
    assert step.replicas == 1 and step.micro_batches == 1 and step.tf_graph is not None
    assert set(step.plan.placement) <= set(step.graph.names) and len(step.plan.placement) > 20
    assert step.run(2) == whole
    seen = step.check()
    assert seen["misplaced"] == [] and seen["order_violations"] == []
    step.close()


def test_a_replicated_step_takes_the_next_plan_and_trains_on():
    """Data parallelism, then the un-split step's own plan: training goes on from replica 0's values."""
    step = _keras("cnn", 2)
    whole = step.run(4)
    step.reset()
    step.apply(_replicated(step.graph, 2))
    first = step.run(2)
    plain = pesto.evaluate(step._unsplit, {n: "/GPU:1" for n in step._unsplit.names}, gpus=2)
    step.apply(Solved(plain, step._unsplit))
    assert step.replicas == 1 and step.micro_batches == 1 and not any(n.startswith("rep") for n in step.graph.names)
    np.testing.assert_allclose(first + step.run(2), whole, rtol=1e-6)
    seen = step.check()
    assert seen["misplaced"] == [] and set(step.plan.placement.values()) == {"/CPU:1"}
    step.close()


def test_a_step_given_as_a_whole_function_cannot_take_a_replicated_plan():
    x, y = tf.random.normal((4, 3), seed=3), tf.random.normal((4, 2), seed=4)
    w = tf.Variable(tf.ones((3, 2)))

    @tf.function
    def whole(a, b):
        w.assign_sub(0.1 * tf.reduce_mean(a @ w - b) * tf.ones((3, 2)))
        return tf.reduce_sum(a)

    step = tf_patch.function_step(whole, x, y, n_devices=2)
    result = Solved(None, step.graph, Strategy(replicas=2))
    with pytest.raises(ValueError, match="given as a whole tf.function: it cannot be traced again in 2 slices"):
        step.apply(result)


def test_replicastep_examples_run():
    assert doctest.testmod(replicastep).failed == 0


def test_demo_auto_trains_a_data_parallel_winner_and_says_whether_it_held(capsys, monkeypatch):
    from tf_patch import demo

    def data_parallel(graph, cluster, **_):
        sp = data_parallel_plan(with_marks(graph), cluster)
        steps = {"data-parallel": sp.plan.makespan, "M=1": 2 * sp.plan.makespan}   # it won
        log = SolveLog(recipe="step search", graph_kind="replicated", replicas=sp.replicas, steps=steps)
        return Solved(sp.plan.replace(log=log), sp.graph, Strategy(replicas=sp.replicas))

    monkeypatch.setattr(demo, "solve_step", data_parallel)
    assert demo.main(["--model", "rnnlm", "--preset", "small", "--micro-batches", "auto", "--time-limit", "1",
                      "--steps", "2", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "[auto] chose data parallelism, 2 replicas x 1 micro-batch(es)" in out
    assert "carried onto TF's replicated step" in out and "trace: 0 ops off-plan, 0/" in out
    assert out.count("equal within 1e-05 relative") == 2 and "NOT EQUAL" not in out
    assert "the chosen plan (data parallelism, 2 replicas x 1 micro-batch(es)): predicted " in out
    assert "the un-split step (TF default, un-split step): predicted " in out
    assert ("the choice lost: measured" in out) != ("the choice held: measured" in out)


def test_a_data_parallel_plan_of_small_buckets_trains_with_its_own_rings():
    """A plan's gradient bucket size (``Strategy.bucket_bytes``, screened by the
    search) is what TensorFlow builds: as many rings as the plan has buckets,
    and the un-split step's losses."""
    import re
    step = _keras("attention", 2)
    whole = step.run(3)
    step.reset()
    marked = with_marks(step.graph)
    default, small = (data_parallel_plan(marked, CLUSTER[2], bucket_bytes=b) for b in (25 << 20, 256))
    rings = [len([n for n in sp.graph.names if n.endswith("@allreduce@r0")]) for sp in (default, small)]
    assert rings[1] > rings[0] >= 1
    step.apply(Solved(small.plan, small.graph, Strategy(replicas=2, bucket_bytes=256)))
    built = {m.group(1) for n in step.graph.names for m in [re.match(r"allreduce/(\d+)/rs0/r1", n)] if m}
    assert len(built) == rings[1]
    np.testing.assert_allclose(step.run(3), whole, rtol=1e-6)
    _assert_placed(step, Solved(small.plan, small.graph, Strategy(replicas=2, bucket_bytes=256)), 2)
    step.close()
