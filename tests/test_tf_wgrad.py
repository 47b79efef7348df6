"""TF's split step with whole weight gradients (issue 30 item 2): a Keras
model's Dense kernels get one MatMul over every slice's inputs and
output-gradients (``whole/<variable>/``), and the step trains as the un-split
one. A tiny model; no timing is asserted."""
import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tf_patch  # noqa: E402,F401  (loads OR-Tools before TensorFlow)

tf = pytest.importorskip("tensorflow")

from tf_patch.microstep import LossStep  # noqa: E402

pytestmark = pytest.mark.tf
L = tf.keras.layers


def _model():
    return tf.keras.Sequential([tf.keras.Input((4,)), L.Dense(16, activation="relu"),
                                L.Dense(8, activation="tanh"), L.Dense(1)])


def _run(weights, m, whole, steps=4):
    """Losses of ``steps`` SGD steps from ``weights``, the weights after, the traced graph."""
    model = _model()
    model.set_weights(weights)
    rng = np.random.default_rng(1)
    x, y = (tf.constant(rng.normal(size=s).astype(np.float32)) for s in ((32, 4), (32, 1)))
    dense = [layer for layer in model.layers if isinstance(layer, L.Dense)] if whole else ()
    step = LossStep(lambda a, b: tf.reduce_mean((model(a) - b) ** 2), lambda: model.trainable_variables,
                    tf.keras.optimizers.SGD(0.1), micro_batches=m, whole=dense)
    losses = [float(step(x, y)) for _ in range(steps)]
    return losses, model.get_weights(), step.get_concrete_function(x, y).graph


def _matmuls(graph, prefix=""):
    return [o.name for o in graph.get_operations() if o.type == "MatMul" and o.name.startswith(prefix)]


def test_whole_dense_weight_gradients_train_as_the_unsplit_step():
    tf.keras.utils.set_random_seed(0)
    w0 = _model().get_weights()
    (l1, w1, _), (lw, ww, gw), (ls, _, gs) = _run(w0, 1, False), _run(w0, 4, True), _run(w0, 4, False)
    np.testing.assert_allclose(lw, l1, rtol=1e-6)
    assert l1[-1] < l1[0] - 1e-2                      # it trains
    for a, b, start in zip(ww, w1, w0):
        np.testing.assert_allclose(a - start, b - start, rtol=1e-5, atol=1e-7)
    whole = _matmuls(gw, "whole/")
    assert len(whole) == 3 and all(n.endswith("kernel/MatMul") for n in whole)
    adds = [o.name for o in gw.get_operations() if o.name.startswith("accumulate/")]
    assert adds and not [n for n in adds if "/kernel/" in n]     # biases still summed, kernels not
    assert len(_matmuls(gw)) == len(_matmuls(gs)) - 3 * 4 + 3    # 4 slices' kernel gradients -> 1 each


def test_whole_refuses_what_it_cannot_concatenate():
    model = _model()
    model.set_weights(_model().get_weights())
    x, y = tf.zeros((8, 4)), tf.zeros((8, 1))
    with pytest.raises(TypeError, match="Dense layers"):
        LossStep(lambda a, b: tf.reduce_mean(model(a)), lambda: model.trainable_variables,
                 tf.keras.optimizers.SGD(0.1), micro_batches=2, whole=[object()])(x, y)
    shared = L.Dense(4)
    twice = LossStep(lambda a, b: tf.reduce_mean(shared(shared(a))), lambda: shared.trainable_variables,
                     tf.keras.optimizers.SGD(0.1), micro_batches=2, whole=[shared])
    shared.build((None, 4))
    with pytest.raises(ValueError, match="called twice"):
        twice(x, y)


def _keras_step():
    """The model's Keras step (tf_patch.keras_step, SGD) and its un-split losses over 3 steps, reset."""
    tf.keras.utils.set_random_seed(0)
    model = _model()
    rng = np.random.default_rng(1)
    x, y = (tf.constant(rng.normal(size=s).astype(np.float32)) for s in ((32, 4), (32, 1)))
    step = tf_patch.keras_step(model, "mse", tf.keras.optimizers.SGD(0.1), x, y)
    unsplit = step.run(3)
    step.reset()
    return step, unsplit


def _trains_as_unsplit(step, unsplit):
    """Every TF op of the applied split step placed, its losses the un-split ones, nothing misplaced."""
    assert set(step.placed.plan.placement) == set(step.graph.names)
    np.testing.assert_allclose(step.run(3), unsplit, rtol=1e-5)
    seen = step.check()
    assert seen["misplaced"] == [] and seen["order_violations"] == []
    step.close()


def test_a_plan_joining_dense_kernels_runs_them_whole_with_the_unsplit_losses():
    """A plan whose split runs the Dense kernels' gradients whole (weight_grads="whole"
    for the ops tf_patch marked joinable) is carried onto TF's split step built with
    LossStep(whole=those layers): the joined ops map to whole/<kernel>/MatMul, every TF op
    is placed, and the step trains as the un-split one (logical devices)."""
    import pesto
    from pesto.api import marked
    from pesto.step.marks import joinable_ops
    from solver.parallel.realise import realise
    from solver.parallel.strategy import Strategy

    step, unsplit = _keras_step()
    joined = joinable_ops(marked(step.graph))
    assert len(joined) == 3 and all(step.graph.op(n).type == "MatMul" for n in joined)   # the 3 kernels, no bias
    cluster = pesto.gpus(2, beta=(0.0, 1e-9))
    result = realise(marked(step.graph), cluster, Strategy(stages=2, micro_batches=2, schedule="1f1b",
                                                           weight_grads=dict.fromkeys(joined, "whole")))
    assert result.strategy.joined == tuple(sorted(joined))
    step.apply(result, cluster=cluster, time_limit=2)
    assert step.micro_batches == 2 and len(step._source.whole) == 3
    mapped = {p: ts for p, ts in step.mapping.ops.items() if p.endswith("@all")}
    assert len(mapped) == 3 and all(len(ts) == 1 and ts[0].startswith("whole/") and ts[0].endswith("/MatMul")
                                    for ts in mapped.values())
    _trains_as_unsplit(step, unsplit)


def test_with_whole_refuses_a_kernel_of_no_joinable_layer():
    model = _model()
    dense = [layer for layer in model.layers if isinstance(layer, L.Dense)]
    step = LossStep(lambda a, b: tf.reduce_mean(model(a)), lambda: model.trainable_variables,
                    tf.keras.optimizers.SGD(0.1), micro_batches=2, joinable=dense[:1])
    assert step.with_whole([dense[0].kernel]).whole == (dense[0],)
    assert step.with_whole([]) is step
    with pytest.raises(ValueError, match="no Keras Dense layer of this step"):
        step.with_whole([dense[1].kernel])


@pytest.mark.parametrize("rule", ["accumulate", "mix"])
def test_a_plan_summing_weight_gradients_in_place_runs_with_the_unsplit_losses(rule):
    """A plan whose split sums the weight gradients in place (weight_grads="accumulate",
    or the search's mix: the kernels whole, the rest in place) runs on TF's split step:
    each copy op@mb<k> (k >= 1) maps to its TF copy and to the add_<k> of TF's
    accumulate/<variable>/ chain that sums it, both on the copy's device; every TF op
    is placed and the step trains as the un-split one."""
    import pesto
    from pesto.api import marked
    from pesto.step.marks import joinable_ops
    from pesto.step.slicing import weight_grad_ops
    from solver.parallel.realise import realise
    from solver.parallel.strategy import Strategy
    from tf_patch.slicemap import result_view

    step, unsplit = _keras_step()
    g = marked(step.graph)
    ops, joined = weight_grad_ops(g), joinable_ops(g)
    rules = "accumulate" if rule == "accumulate" else {op: "whole" if op in joined else "accumulate" for op in ops}
    cluster = pesto.gpus(2, beta=(0.0, 1e-9))
    result = realise(g, cluster, Strategy(stages=2, micro_batches=2, schedule="zb-h1", weight_grads=rules))
    view = result_view(result)
    summed = tuple(sorted(set(ops) - (set(joined) if rule == "mix" else set())))
    assert view.in_place == summed and not [n for n in result.graph.names if "@acc" in n]
    step.apply(result, cluster=cluster, time_limit=2)
    adds = {p: ts for p, ts in step.mapping.ops.items() if any("/add_" in t for t in ts)}
    # not the loss metric's Mean (no chain), nor an op the re-traced whole step names otherwise (unmapped)
    chained = [op for op in summed if op.startswith("gradient_tape/") and f"{op}@mb1" in step.mapping.ops]
    assert len(chained) == (6 if rule == "accumulate" else 2)
    assert sorted({p.rsplit("@", 1)[0] for p in adds}) == chained and all(p.endswith("@mb1") for p in adds)
    assert all(len(ts) == 2 and ts[1].startswith("accumulate/") and ts[1].endswith("/add_1") for ts in adds.values())
    hint = step.placed.hint.placement
    assert all(hint[ts[0]] == hint[ts[1]] for ts in adds.values())       # the add on its copy's device
    _trains_as_unsplit(step, unsplit)


def test_a_data_parallel_plan_accumulating_in_place_runs_with_the_unsplit_losses():
    """Data parallelism with gradient accumulation in place (R=2, M=2,
    weight_grads="accumulate": no Pesto accumulate op) on TF's replicated step:
    each copy of slice 1 maps to its TF copy and its replica's acc_1 add, every op is
    where the plan puts it, and the losses are the un-split step's."""
    from pesto.api import marked
    from solver.parallel.pipelines import data_parallel_plan
    from solver.parallel.strategy import Solved, Strategy
    from test_tf_replicate import CLUSTER, _assert_placed, _keras

    step = _keras("cnn", 2)
    unsplit = step.run(3)
    step.reset()
    sp = data_parallel_plan(marked(step.graph), CLUSTER[2], micro_batches=2, weight_grads="accumulate")
    assert not [n for n in sp.graph.names if "@acc" in n]
    result = Solved(sp.plan, sp.graph, Strategy(replicas=2, micro_batches=2, weight_grads="accumulate"),
                    sp.transformed)
    step.apply(result)
    adds = {p: ts for p, ts in step.mapping.ops.items() if any("/acc_1" in t for t in ts)}
    assert len(adds) == 12 and all(p.endswith("@mb1") and len(ts) == 2 for p, ts in adds.items())  # 6 per replica
    np.testing.assert_allclose(step.run(3), unsplit, rtol=1e-6)
    _assert_placed(step, result, 2)
    step.close()


def test_a_free_placement_of_the_split_step_runs_with_the_unsplit_losses():
    """The search's ``free`` kind (one free placement of the split step, every weight
    gradient summed in place, placed by its list placer) runs on TF's split step: every
    TF op where the plan puts it, in its order, and the losses are the un-split step's."""
    import pesto
    from pesto.api import marked
    from solver.parallel.realise import realise
    from solver.parallel.search import _Search
    from solver.parallel.strategy import Strategy

    step, unsplit = _keras_step()
    cluster = pesto.gpus(2, beta=(0.0, 1e-9))
    result = realise(marked(step.graph), cluster, Strategy(micro_batches=2, schedule="free", weight_grads="accumulate"),
                     place=_Search.list_placer)
    assert not [n for n in result.graph.names if "@acc" in n]
    step.apply(result, cluster=cluster, time_limit=2)
    assert len(set(step.placed.plan.placement.values())) == 2
    _trains_as_unsplit(step, unsplit)
