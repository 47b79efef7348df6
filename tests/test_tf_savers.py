"""Every memory saver the search can pick runs in TensorFlow (issue 30, item 4).

The search screens, for a candidate that does not fit memory, the savers of
:func:`solver.parallel.kinds.savers` (ZeRO-1, ZeRO-2, recomputation, ZeRO-2 with
recomputation for data parallelism; recomputation for pipelines and hybrids):
``tf_patch.slicemap.result_view`` accepts each, and a plan that shards the
optimizer and recomputes builds both on TF's replicated step (the sharded
updates of :mod:`tf_patch.replicastep`, then the copies of
:mod:`tf_patch.recompute` per replica). A step that switches plans keeps its
Adam slots through a sharded plan (joined from the replicas' pieces). Plans
come from the realiser (not a timed search); models are tiny; no timing is
asserted.
"""
import dataclasses
import os
import re

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tf_patch  # noqa: E402  (loads OR-Tools before TensorFlow)

tf = pytest.importorskip("tensorflow")

import pesto  # noqa: E402
from keras_blocks import tanh_mlp, wide_mlp  # noqa: E402
from pesto.api import marked  # noqa: E402
from pesto.errors import MicroBatchError  # noqa: E402
from pesto.graph import OpGraph  # noqa: E402
from pesto.solvelog import SolveLog  # noqa: E402
from solver.parallel.kinds import KINDS, savers  # noqa: E402
from solver.parallel.realise import realise  # noqa: E402
from solver.parallel.search import savers_of  # noqa: E402
from solver.parallel.strategy import Strategy  # noqa: E402
from tf_patch.replicastep import unshard  # noqa: E402
from tf_patch.slicemap import RECOMPUTE, TF_SAVERS, result_view  # noqa: E402

pytestmark = pytest.mark.tf

CLUSTER = pesto.gpus(2, beta=(0.0, 1e-9))


class RawAdam:
    """Adam as one ``ResourceApplyAdam`` per variable (a graph-mode optimizer's
    update, which ZeRO shards), its slots ``m``, ``v`` made for ``variables``."""

    def __init__(self, variables, lr=0.01, beta1=0.9, beta2=0.999, epsilon=1e-7):
        self.lr, self.beta1, self.beta2, self.epsilon = lr, beta1, beta2, epsilon
        self.iteration = tf.Variable(0.0, name="iteration")
        self.slots = {id(v): (tf.Variable(tf.zeros_like(v), name="m"), tf.Variable(tf.zeros_like(v), name="v"))
                      for v in variables}

    def apply_gradients(self, pairs):
        t = self.iteration + 1.0
        b1, b2 = tf.pow(self.beta1, t), tf.pow(self.beta2, t)
        graph = tf.compat.v1.get_default_graph()
        for g, var in pairs:
            m, v = self.slots[id(var)]
            for x in (m, v):
                graph.watch_variable(x)   # the step's variables: the traced step captures and sizes them
            tf.raw_ops.ResourceApplyAdam(var=getattr(var, "value", var).handle, m=m.handle, v=v.handle,
                                         beta1_power=b1, beta2_power=b2, lr=self.lr, beta1=self.beta1,
                                         beta2=self.beta2, epsilon=self.epsilon, grad=g)
        self.iteration.assign_add(1.0)


def _mlp(n_devices=2):
    """Three Dense layers ``layer_<k>`` (the recomputed blocks) and a head, trained by :class:`RawAdam`."""
    model, x, y = tanh_mlp()
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    step = tf_patch.LossStep(lambda x, y: tf.reduce_mean(loss(y, model(x, training=True))),
                             lambda: model.trainable_variables, RawAdam(model.trainable_variables))
    return tf_patch.function_step(step, x, y, n_devices=n_devices)


def _copies(result):
    return [n for n, o in result.transformed.origin.items() if o.role == "recompute"]


def _searched(result):
    """``result`` with its savers in the log, as the search returns a winner (the best step)."""
    steps = {f"data-parallel M=1 {result.strategy.savers}": result.plan.makespan, "M=1": 2 * result.plan.makespan}
    log = SolveLog(recipe="step search", graph_kind=result.graph_kind, replicas=result.replicas,
                   micro_batches=result.micro_batches, savers=result.strategy.savers, steps=steps)
    return dataclasses.replace(result, plan=result.plan.replace(log=log))


def _candidates(gpus: int) -> list:
    """Every candidate strategy the search screens on ``gpus`` GPUs (the first plan, data
    parallelism of the step, then each kind's for each count) and their savers."""
    step = OpGraph.from_edges({"a": 1.0}, [])
    cluster = pesto.gpus(gpus)
    out = [Strategy(replicas=gpus)]
    for m in (1, 2, 4, 8):
        for kind in KINDS.values():
            out += kind.candidates(step, cluster, m)
    saving = [s for c in out for s in savers(c)]
    return out + saving + [lower for s in saving for lower in _lowered(s)]


def _lowered(strategy) -> list:
    """What the search's partial recomputation (``_Search.partial``: each block's level
    lowered after a recomputing plan fits) may make of ``strategy``, over three blocks:
    some blocks at its level, and, from every op, a mix of every op, cheap ops and none."""
    if strategy.recompute is not True:
        return []
    top = "cheap" if strategy.selective else True
    out = [dataclasses.replace(strategy, recompute=(top, False, top), selective=False)]
    if top is True:
        out += [dataclasses.replace(strategy, recompute=(True, "cheap", False), selective=False),
                dataclasses.replace(strategy, recompute=("cheap", "cheap", True), selective=False)]
    return out


def test_result_view_accepts_every_saver_combination_the_search_can_pick():
    """A saver the search may pick that TF cannot build fails here (add it to
    ``tf_patch.slicemap.TF_SAVERS`` once tf_patch builds it)."""
    class Result:
        graph, micro_batches, replicas, graph_kind = None, 2, 2, "replicated"

        def __init__(self, words):
            self.plan = pesto.Plan({}, {}, log=SolveLog(recipe="step search", savers=words))

    picked = {s.savers for gpus in (2, 4, 8) for s in _candidates(gpus)}
    assert {"ZeRO-1", "ZeRO-2", "ZeRO-3", "recompute", "ZeRO-2 recompute", "ZeRO-3 recompute-cheap",
            "ZeRO-3 recompute"} <= picked, picked   # data parallelism's savers
    assert any(s.recompute and s.schedule in ("gpipe", "1f1b") for s in _candidates(4))   # a pipeline's
    assert {"ZeRO-2 recompute(1/3:0)+cheap(1/3:1)", "recompute-cheap(2/3:0,2)"} <= picked   # mixed levels
    for words in sorted(picked):
        assert savers_of(words).savers == words   # one reading of the words, the search's
        assert result_view(Result(words)).replicas == 2, words
    # "recompute(2/3:0,2)": some blocks; "recompute(1/3:0)+cheap(1/3:1)": levels mixed, built as recompute is
    assert {w.partition("(")[0] for words in picked for w in words.split()} <= TF_SAVERS
    with pytest.raises(MicroBatchError, match=r"memory savers \(offload\)") as err:
        result_view(Result("ZeRO-2 offload"))   # a saver tf_patch does not build: refused, named
    assert err.value.culprit == "offload"


def test_a_zero_2_plan_with_recomputation_trains_as_the_step_with_its_copies_and_shards_placed():
    step = _mlp()
    whole = step.run(3)
    step.reset()
    result = _searched(realise(marked(step.graph), CLUSTER, Strategy(replicas=2, shard_optimizer=2,
                                                                       recompute=True)))
    assert result.strategy.savers == "ZeRO-2 recompute" and result.graph_kind == "replicated"
    copies = _copies(result)
    assert len(copies) == 9 * 2   # MatMul, BiasAdd, Tanh of 3 layers, per replica
    step.apply(result, cluster=CLUSTER)
    assert step.replicas == 2 and step.recomputed.left_out == ()
    ops = {op.name: op for op in step.tf_graph.get_operations()}
    # each replica updates its piece of every variable (8 variables x 2 replicas), with piece slots
    updates = [n for n, op in ops.items() if op.type == "ResourceApplyAdam"]
    assert len(updates) == 16 and all(n.startswith("allreduce/") and n.endswith("/update") for n in updates)
    for c in copies:   # one to one, on the plan's device
        (t,) = step.mapping.ops[c]
        assert t.startswith(RECOMPUTE) and t in ops
        assert step.plan.placement[t].endswith(result.plan.placement[c][-1]), c
    # the backward reads the copies: each TanhGrad reads a recomputed Tanh
    grads = [op for op in ops.values() if op.type == "TanhGrad"]
    assert len(grads) == 3 * 2 and all(op.inputs[0].op.name.startswith(RECOMPUTE) for op in grads)
    np.testing.assert_allclose(step.run(3), whole, rtol=1e-6)
    seen = step.check()
    assert seen["misplaced"] == [] and seen["order_violations"] == [] and seen["checked_edges"] > 100
    assert {seen["devices"][step.mapping.ops[c][0]] for c in copies} == {"/CPU:0", "/CPU:1"}
    mine = [u for u in result.graph.names if result.graph.op(u).type == "ResourceApplyAdam"]
    assert len(mine) == 16 and all(step.mapping.ops[u][0] in updates for u in mine)   # each replica's own
    assert {seen["devices"][step.mapping.ops[u][0]] for u in mine} == {"/CPU:0", "/CPU:1"}
    step.close()


@pytest.mark.parametrize("strategy", [
    Strategy(replicas=2, shard_optimizer=2, recompute=(True, "cheap", False)),
    Strategy(stages=2, micro_batches=2, schedule="1f1b", recompute=(True, "cheap", False)),
    Strategy(replicas=2, shard_optimizer=3, recompute=(True, "cheap", False))],
    ids=["zero-2", "1f1b", "zero-3"])
def test_a_plan_of_mixed_recomputation_levels_trains_as_the_step_with_each_blocks_copies(strategy):
    """Layer 0 recomputes every op, layer 1 its cheap ops (``pesto.step.recompute.cheap_ops``:
    BiasAdd and Tanh, not the MatMul), layer 2 none: TF builds exactly the plan's copies,
    each placed as the plan says, and trains with the un-split step's losses."""
    from pesto.step.recompute import cheap_ops, layer_blocks
    step = _mlp()
    whole = step.run(3)
    step.reset()
    g = marked(step.graph)
    blocks, cheap = layer_blocks(g), cheap_ops(g, layer_blocks(g))
    result = _searched(realise(g, CLUSTER, strategy))
    assert result.strategy.recompute_words == "recompute(1/3:0)+cheap(1/3:1)"
    assert savers_of(result.plan.log.savers).recompute == strategy.recompute
    copies = _copies(result)
    ops = {result.transformed.origin[c].op for c in copies}
    assert ops & set(blocks[0]) and ops & set(blocks[1]) and not ops & set(blocks[2])
    assert ops & set(blocks[1]) <= set(cheap[1]) < set(blocks[1])   # layer 1: cheap ops only
    assert ops & set(blocks[0]) == set(blocks[0])   # layer 0: every op
    step.apply(result, cluster=CLUSTER)
    assert step.recomputed.left_out == () and len(step.recomputed.copies) == len(copies)
    tf_ops = {op.name: op for op in step.tf_graph.get_operations()}
    for c in copies:   # one to one, on the plan's device
        (t,) = step.mapping.ops[c]
        assert t.startswith(RECOMPUTE) and t in tf_ops
    grads = [op for op in tf_ops.values() if op.type == "TanhGrad"]
    per = len(grads) // 3   # per layer: a replica's or a slice's
    assert sum(op.inputs[0].op.name.startswith(RECOMPUTE) for op in grads) == 2 * per   # layer 2 reads its own
    np.testing.assert_allclose(step.run(3), whole, rtol=1e-6)
    seen = step.check()
    assert seen["misplaced"] == [] and seen["order_violations"] == []
    step.close()


@pytest.mark.parametrize("level", [1, 3])
def test_a_step_switching_plans_through_a_zero_plan_keeps_its_adam_slots(level):
    """Plain, then ZeRO-1 (or ZeRO-3) data parallelism, then 1F1B: the losses go on as the
    unswitched run's (the slots, and under ZeRO-3 the weights, exist only as the replicas'
    pieces in between: no replica holds a whole variable), and the weights read back after
    it (:meth:`FunctionStep.values`) are whole and equal the unswitched run's."""
    step = _mlp()
    expected = step.run(8)
    trained = step.values()
    step.reset()
    losses = step.run(2)
    step.apply(_searched(realise(marked(step.graph), CLUSTER, Strategy(replicas=2, shard_optimizer=level))),
               cluster=CLUSTER)
    assert any(p.endswith("/slot_1") for p in step._pieces)   # each replica holds a piece of each slot
    held = {op.name: op for op in step.tf_graph.get_operations() if op.type == "VarHandleOp"}
    kernels = [n for n in held if n.startswith("rep") and len(held[n].get_attr("shape").dim) == 2]
    assert (kernels == []) == (level == 3), kernels   # ZeRO-3: no whole weight in any replica
    losses += step.run(3)
    step.apply(realise(step._unsplit, CLUSTER, Strategy(stages=2, micro_batches=2, schedule="1f1b")),
               cluster=CLUSTER)
    losses += step.run(3)
    np.testing.assert_allclose(losses, expected, rtol=1e-6)
    back = {re.sub(r"^mb\d+/", "", n): v for n, v in step.values().items()}   # the split step's captured names
    assert set(back) == set(trained)
    for name, value in trained.items():
        np.testing.assert_allclose(back[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    step.close()


def test_unshard_joins_only_whole_pieces():
    pieces = {"p0": ("w", 0, 2), "p1": ("w", 2, 3), "s1": ("s", 2, 3)}
    joined = unshard({"p0": np.array([1.0, 2.0]), "p1": np.array([3.0]), "s1": np.array([9.0])}, pieces)
    assert list(joined) == ["w"] and joined["w"].tolist() == [1.0, 2.0, 3.0]   # s lacks its first piece


def test_a_timed_search_picks_zero_2_with_recomputation_where_only_it_fits_and_tf_trains_it():
    """The wide MLP (``keras_blocks.wide_mlp``: small weights, wide activations) with
    :class:`RawAdam` (weights and two slots), 2 GPUs of 9.4 MB, M=2 (a weight's read a view
    of its variable): data-parallel needs about 12.6 MB, with ZeRO-1/2 10.6 MB, ZeRO-3 11.0 MB,
    with recomputation 11.2 MB, ZeRO-3 with recomputation 9.7 MB, GPipe/1F1B 18-23 MB;
    ZeRO-2 with recomputation 9.2 MB (0.397 ms): the search (deterministic, so the same on any
    machine) returns ZeRO-2 with recomputation, and TensorFlow trains it on-plan with the
    un-split step's losses."""
    model, x, y = wide_mlp()
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    step = tf_patch.function_step(tf_patch.LossStep(lambda x, y: tf.reduce_mean(loss(y, model(x, training=True))),
                                                    lambda: model.trainable_variables,
                                                    RawAdam(model.trainable_variables)), x, y, n_devices=2)
    cluster = pesto.gpus(2, memory=9_400_000)
    r = pesto.solve_step(step.graph, cluster=cluster, time_limit=20, micro_batches=2, workers=1, deterministic=True)
    assert r.strategy.savers == "ZeRO-2 recompute" and r.plan.log.savers == "ZeRO-2 recompute", r.strategy
    assert max(pesto.simulate(r, cluster).peak_memory.values()) <= 9_400_000
    whole = step.run(2)
    step.reset()
    step.apply(r, cluster=cluster)
    assert step.replicas == 2 and step.recomputed.left_out == () and step._pieces
    np.testing.assert_allclose(step.run(2), whole, rtol=1e-6)
    seen = step.check()
    assert seen["misplaced"] == [] and seen["order_violations"] == []
    step.close()
