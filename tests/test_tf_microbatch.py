"""Micro-batched training steps built in TensorFlow (issue 24, item 1).

The split step (``micro_batches=M``: M slices, gradients summed, one update)
must train exactly as the un-split step: the same losses and the same
updated weights within float rounding, in graph mode (the zoo) and for
Keras / ``tf.function`` steps (a CNN, an attention block, an LSTM). Bad
``M`` gets a named error; a placed split step trains with 0 ops off-plan.
Models are tiny; no timing is asserted.
"""
import doctest
import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tf_patch  # noqa: E402  (loads OR-Tools before TensorFlow)

tf = pytest.importorskip("tensorflow")

import pesto  # noqa: E402
from pesto.errors import MicroBatchError  # noqa: E402
from solver import get_placer  # noqa: E402
from tf_patch import microstep  # noqa: E402
from tf_patch.extract import step_ops  # noqa: E402
from tf_patch.function import captured_variables, train_step  # noqa: E402
from tf_patch.microstep import LossStep, check_micro_batches, slice_of  # noqa: E402
from tf_patch.workflow import PlacedRun  # noqa: E402
from tf_patch.zoo import build_model  # noqa: E402
from keras_blocks import attention_block, lstm_gru  # noqa: E402

pytestmark = pytest.mark.tf
L = tf.keras.layers

#: tiny versions of the zoo models, batch 8
TINY = {
    "rnnlm": dict(layers=1, units=16, batch=8, steps=3, vocab=50),
    "nmt": dict(layers=1, units=16, batch=8, src_steps=3, tgt_steps=3, vocab=50),
    "transformer": dict(layers=1, d_model=16, heads=2, d_ff=32, batch=8, seq=4, vocab=50),
    "nasnet": dict(cells=1, channels=4, batch=8, image=8),
    "gpt": dict(layers=1, d_model=16, heads=2, d_ff=32, batch=8, seq=4, vocab=50),
    "bert": dict(layers=1, d_model=16, heads=2, d_ff=32, batch=8, seq=8, vocab=50),
}


def _tiny(name, **kw):
    return build_model(name, "small", optimizer="sgd", lr=0.5, **{**TINY[name], **kw})


def _train(model, steps=2, n_devices=1):
    """Losses of ``steps`` steps and the trainable variables before and after."""
    with tf.compat.v1.Session(graph=model.graph, config=tf_patch.session_config(n_devices)) as sess:
        sess.run(model.init_op)
        variables = model.graph.get_collection("trainable_variables")
        before = dict(zip([v.name for v in variables], sess.run(variables)))
        losses = [float(sess.run(model.fetches, model.feed_fn(s))[1]) for s in range(steps)]
        after = dict(zip([v.name for v in variables], sess.run(variables)))
    return losses, before, after


def _assert_same_training(whole, split):
    """Equal losses, and equal updates (after - before) of every variable."""
    (l1, b1, a1), (l2, b2, a2) = whole, split
    np.testing.assert_allclose(l2, l1, rtol=1e-5)
    assert sorted(a1) == sorted(a2)
    biggest = max(float(np.abs(a1[k] - b1[k]).max()) for k in a1)
    assert biggest > 1e-3  # the step did move the weights
    for k in a1:
        np.testing.assert_array_equal(b1[k], b2[k])  # same initial weights
        np.testing.assert_allclose(a2[k] - b2[k], a1[k] - b1[k], rtol=1e-4, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("name,m", [("rnnlm", 4), ("nmt", 2), ("transformer", 2), ("nasnet", 4),
                                        ("gpt", 2), ("bert", 4)])
def test_a_split_zoo_step_trains_as_the_unsplit_step(name, m):
    _assert_same_training(_train(_tiny(name)), _train(_tiny(name, micro_batches=m)))


def test_a_mirrored_zoo_step_trains_as_the_unsplit_step():
    """TensorFlow's data-parallel baseline of the demo: replicas' losses scaled by 1/N."""
    model = _tiny("nmt", mirrored=2)
    _assert_same_training(_train(_tiny("nmt")), _train(model, n_devices=2))
    assert {op.device[-5:] for op in model.graph.get_operations() if op.type == "MatMul"} == {"CPU:0", "CPU:1"}


def test_slices_are_named_and_gradients_summed_once_per_variable():
    m = _tiny("rnnlm", micro_batches=2)
    ops = step_ops(m.graph, m.fetches)
    by_slice = {i: [op for op in ops if slice_of(op.name) == i] for i in (0, 1)}
    assert len(by_slice[0]) == len(by_slice[1]) > 100
    assert all(op.name.startswith(("mb0/", "gradients/mb0/")) for op in by_slice[0])
    assert all(slice_of(op.name) is not None for op in ops if op.type == "MatMul")
    splits = [op for op in ops if op.type == "Split" and slice_of(op.name) is None]
    assert sorted(op.name for op in splits) == ["microbatch/inputs", "microbatch/targets"]
    assert all(t.shape.as_list()[0] == 4 for op in splits for t in op.outputs)
    params = m.graph.get_collection("trainable_variables")
    writes = [op for op in ops if op.type.startswith(("ResourceApply", "ResourceScatter", "ResourceSparseApply"))]
    assert len(writes) == len(params)  # one update per variable, not one per slice
    acc = m.graph.get_operation_by_name("accumulate/rnn/layer_0/kernel/add_1")
    assert sorted(slice_of(t.op.name) for t in acc.inputs) == [0, 1]
    assert m.loss.op.name == "microbatch/loss"


def test_one_micro_batch_is_the_unsplit_step():
    m = _tiny("nmt", micro_batches=1)
    names = [op.name for op in m.graph.get_operations()]
    assert not [n for n in names if slice_of(n) is not None or n.startswith(("microbatch/", "accumulate/"))]
    assert m.loss.op.name == "loss/Mean" and m.train_op.name == "train"


@pytest.mark.parametrize("bad,text", [(3, "micro_batches=3 does not divide the batch of 8 samples"),
                                      (16, "micro_batches=16 does not divide the batch of 8"),
                                      (0, "must be an integer >= 1, got 0"), (-2, "got -2"),
                                      (2.0, r"got 2\.0 \(float\)"), (True, r"got True \(bool\)")])
def test_a_bad_micro_batch_count_is_a_named_error(bad, text):
    with pytest.raises(MicroBatchError, match=text):
        _tiny("rnnlm", micro_batches=bad)
    with pytest.raises(ValueError, match=text):  # MicroBatchError is a ValueError too
        check_micro_batches(8, bad)
    with pytest.raises(MicroBatchError, match="cannot be combined"):
        _tiny("rnnlm", micro_batches=2, mirrored=2)


def test_microstep_examples_run():
    result = doctest.testmod(microstep, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 3 and result.failed == 0


def _cnn():
    inp = tf.keras.Input((8, 8, 3))
    h = L.Conv2D(4, 3, activation="relu")(inp)
    h = L.GlobalAveragePooling2D()(L.MaxPooling2D()(L.DepthwiseConv2D(3, padding="same")(h)))
    return tf.keras.Model(inp, L.Dense(3)(h)), tf.random.normal((8, 8, 8, 3), seed=1)


def _attention():
    return attention_block(batch=8, seq=6, width=8, classes=3)


def _lstm():
    return lstm_gru(batch=8, steps=5, features=4, lstm=8, gru=6, classes=3)


def _keras_training(model, x, y, m):
    """Losses of 2 traced steps (SGD) and the model's weights after, by path."""
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    fn = train_step(model, loss, tf.keras.optimizers.SGD(0.5), m)
    step = tf_patch.function_step(fn, x, y, n_devices=1, micro_batches=m)
    assert step.unsized == []
    paths = {id(v.value): v.path for v in model.trainable_variables}  # Keras 3: v.value is the tf.Variable
    names = {n: paths.get(id(v)) for n, v in captured_variables(fn.get_concrete_function(x, y)).items()}
    losses = step.run(2)
    values = {names[n]: v for n, v in step.values().items() if names.get(n)}
    step.close()
    return losses, values, step.graph


@pytest.mark.parametrize("family", [_cnn, _attention, _lstm], ids=["cnn", "attention", "lstm"])
def test_a_split_keras_step_trains_as_the_unsplit_step(family):
    tf.keras.utils.set_random_seed(0)
    model, x = family()
    y = tf.random.uniform((8,), 0, 3, dtype=tf.int32, seed=2)
    initial = {v.path: v.numpy() for v in model.trainable_variables}
    whole_losses, whole, whole_graph = _keras_training(model, x, y, 1)
    split_losses, split, graph = _keras_training(model, x, y, 4)
    np.testing.assert_allclose(split_losses, whole_losses, rtol=1e-5)
    assert sorted(split) == sorted(whole) == sorted(initial)
    assert max(float(np.abs(whole[k] - initial[k]).max()) for k in whole) > 1e-3
    for k in whole:
        np.testing.assert_allclose(split[k] - initial[k], whole[k] - initial[k], rtol=1e-4, atol=1e-6, err_msg=k)
    assert graph.num_ops > whole_graph.num_ops
    assert {slice_of(o.name) for o in graph.ops} == {None, 0, 1, 2, 3}


def test_keras_step_takes_micro_batches_and_trains_placed_with_0_ops_off_plan():
    tf.keras.utils.set_random_seed(0)
    model, x = _cnn()
    y = tf.random.uniform((8,), 0, 3, dtype=tf.int32, seed=2)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    step = tf_patch.keras_step(model, loss, tf.keras.optimizers.SGD(0.1), x, y, micro_batches=2)
    unplaced = step.run(2)
    step.reset()
    plan = get_placer("m-etf")(step.graph, pesto.gpus(2, beta=(0.0, 1e-9)))
    assert len(set(plan.placement.values())) == 2
    step.apply(plan)
    np.testing.assert_allclose(step.run(2), unplaced, rtol=1e-6)
    seen = step.check()
    assert seen["misplaced"] == [] and seen["order_violations"] == [] and seen["checked_edges"] > 0
    step.close()
    with pytest.raises(MicroBatchError, match="micro_batches=3 does not divide the batch of 8"):
        tf_patch.keras_step(model, loss, "sgd", x, y, micro_batches=3)


def test_a_loss_step_splits_a_custom_step_and_a_whole_tf_function_is_refused():
    w0 = np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2)
    x = tf.random.normal((12, 3), seed=3)
    y = tf.random.normal((12, 2), seed=4)

    def run(m):
        w = tf.Variable(w0)
        step = LossStep(lambda a, b: tf.reduce_mean((a @ w - b) ** 2), [w], tf.keras.optimizers.SGD(0.1),
                        micro_batches=m)
        fs = tf_patch.function_step(step, x, y, n_devices=1, micro_batches=m)
        losses = fs.run(2)
        (name,) = [n for n, v in captured_variables(step.get_concrete_function(x, y)).items() if v is w]
        value = fs.values()[name]
        fs.close()
        return losses, value, fs.graph

    (l1, w1, _), (l3, w3, g3) = run(1), run(3)
    np.testing.assert_allclose(l3, l1, rtol=1e-5)
    np.testing.assert_allclose(w3, w1, rtol=1e-5, atol=1e-6)
    assert np.abs(w1 - w0).max() > 1e-2
    assert {slice_of(o.name) for o in g3.ops} == {None, 0, 1, 2}

    @tf.function
    def whole(a, b):
        return tf.reduce_sum(a) + tf.reduce_sum(b)

    with pytest.raises(TypeError, match="LossStep"):
        tf_patch.function_step(whole, x, y, micro_batches=2)
    with pytest.raises(MicroBatchError, match="disagree on the batch size"):
        tf_patch.function_step(LossStep(lambda a, b: a, [], None), x, y[:6], micro_batches=2)


def test_a_placed_split_zoo_step_trains_with_0_ops_off_plan():
    def build():
        return _tiny("rnnlm", micro_batches=2)

    graph, _ = tf_patch.opgraph(build().graph, build().fetches, "v100")
    plan = get_placer("m-etf")(graph, pesto.gpus(2, beta=(0.0, 1e-9)))
    used = {d: sum(1 for v in plan.placement.values() if v == d) for d in set(plan.placement.values())}
    assert len(used) == 2 and min(used.values()) >= 10, used
    whole_losses, _, _ = _train(_tiny("rnnlm"), steps=3)
    with PlacedRun(build, plan, n_devices=2) as run:
        losses = run.train(3)
        seen = run.trace()
    np.testing.assert_allclose(losses, whole_losses, rtol=1e-5)
    assert seen["misplaced"] == [] and seen["order_violations"] == [] and seen["checked_edges"] > 0


def test_demo_refuses_a_micro_batch_count_that_does_not_divide_the_batch(capsys):
    from tf_patch import demo

    with pytest.raises(SystemExit) as exc:
        demo.main(["--model", "nmt", "--micro-batches", "3"])
    assert exc.value.code == 2
    assert "micro_batches=3 does not divide the batch of 32 samples" in capsys.readouterr().err


def test_demo_trains_the_split_step_next_to_the_unsplit_one_and_mirrored_strategy(capsys):
    from tf_patch import demo

    assert demo.main(["--model", "rnnlm", "--preset", "small", "--micro-batches", "2", "--time-limit", "2",
                      "--steps", "2", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "rnnlm/small, 2 micro-batches of 8:" in out and "trace: 0 ops off-plan" in out
    assert out.count("equal within 1e-05 relative") == 2 and "NOT EQUAL" not in out
    for text in ("TF default, un-split step *", "MirroredStrategy x2 *", "Pesto vs TF default placement:",
                 "Pesto vs MirroredStrategy x2:", "Pesto vs TF default, un-split step:"):
        assert text in out, text
