"""Keras model families through tf_patch.keras_step (issue 25, item 2).

One small model per family (a CNN, an attention/Transformer block, an RNN):
traced with every tensor sized, placed by m-ETF on two devices
(logical CPU devices here), trained one step placed with 0 ops off-plan, 0
order violations and the unplaced step's losses bit for bit. Then the
shape-vector rule of :func:`tf_patch.extract.shape_tensor_bytes` by hand,
and an unsized tensor that no rule bounds still refused by name.
"""
import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")

import pesto  # noqa: E402
import tf_patch  # noqa: E402
from pesto.errors import InvalidGraphError  # noqa: E402
from solver import get_placer  # noqa: E402
from tf_patch.extract import extract, shape_tensor_bytes, step_ops  # noqa: E402
from keras_blocks import attention_block, lstm_gru  # noqa: E402

pytestmark = pytest.mark.tf
L = tf.keras.layers


def _cnn():
    inp = tf.keras.Input((12, 12, 3))
    h = L.Conv2D(8, 3, activation="relu")(inp)
    h = L.BatchNormalization()(h)
    h = L.DepthwiseConv2D(3, padding="same", activation="relu6")(h)
    h = L.Activation("relu")(L.Add()([h, L.Conv2D(8, 1)(h)]))
    h = L.GlobalAveragePooling2D()(L.MaxPooling2D()(h))
    return tf.keras.Model(inp, L.Dense(4)(h)), tf.random.normal((4, 12, 12, 3), seed=1)


def _attention():
    return attention_block(batch=4, seq=8, width=16, classes=4)


def _rnn():
    return lstm_gru(batch=4, steps=6, features=8, lstm=16, gru=8, classes=4)


@pytest.mark.parametrize("family", [_cnn, _attention, _rnn], ids=["cnn", "attention", "rnn"])
def test_a_keras_family_is_traced_placed_and_trains_with_the_unplaced_losses(family):
    tf.keras.utils.set_random_seed(0)
    model, x = family()
    y = tf.random.uniform((4,), 0, 4, dtype=tf.int32, seed=2)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    step = tf_patch.keras_step(model, loss, tf.keras.optimizers.SGD(0.1), x, y)
    assert step.unsized == []
    unplaced = step.run(2)
    step.reset()
    # m-ETF (fast, deterministic) with transfers nearly free: both devices get work wherever the
    # step has parallel branches
    plan = get_placer("m-etf")(step.graph, pesto.gpus(2, beta=(0.0, 1e-9)))
    used = {d: sum(1 for v in plan.placement.values() if v == d) for d in set(plan.placement.values())}
    assert len(used) == 2 and min(used.values()) >= 5, used
    step.apply(plan)
    assert step.run(2) == unplaced  # bit for bit
    seen = step.check()
    assert seen["misplaced"] == [] and seen["order_violations"] == []
    assert seen["checked_edges"] == len(step.applied.control_edges) > 0
    step.close()


def test_a_lowered_while_is_checked_where_its_control_edges_go():
    """TensorFlow lowers an LSTM's While into control flow and keeps its name
    on an IdentityN nothing waits on (it ran 0.9 ms after the op the order
    put next, a false violation); its control edges leave from LoopExecuted
    and arrive at LoopControlInputs."""
    from tf_patch.workflow import _lowered_ends
    traced = ["rnn/while", "rnn/while/LoopExecuted/_79", "rnn/while/LoopExecuted/_79/_225",
              "rnn/while/LoopControlInputs/_3", "rnn/while/LoopCond/_41", "cell/cond/branch_executed/_8"]
    after, before = _lowered_ends(traced)
    assert after == {"rnn/while": "rnn/while/LoopExecuted/_79", "cell/cond": "cell/cond/branch_executed/_8"}
    assert before == {"rnn/while": "rnn/while/LoopControlInputs/_3"}


def test_keras_step_takes_on_unknown():
    tf.keras.utils.set_random_seed(0)
    model, x = _attention()
    y = tf.random.uniform((4,), 0, 4, dtype=tf.int32, seed=2)
    step = tf_patch.keras_step(model, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), "sgd",
                               x, y, on_unknown="ignore")
    assert step.graph.num_ops > 100
    with pytest.raises(ValueError, match="on_unknown"):
        tf_patch.keras_step(model, "mse", "sgd", x, tf.one_hot(y, 4), on_unknown="maybe")


def _shape_graph():
    g = tf.Graph()
    with g.as_default():
        a = tf.compat.v1.placeholder(tf.float32, [2, 3], name="a")
        b = tf.compat.v1.placeholder(tf.float32, [1, 3], name="b")
        n = tf.compat.v1.placeholder(tf.int32, [], name="n")
        anyrank = tf.compat.v1.placeholder(tf.float32, None, name="anyrank")
        r0, r1 = tf.raw_ops.BroadcastGradientArgs(s0=tf.shape(a), s1=tf.shape(b), name="bga")
        both = tf.concat([r0, r1, tf.shape(a)], 0, name="both")  # 2 + 2 + 2 at most
        ranged = tf.range(n, name="ranged")  # as long as n says: no bound
        unknown_rank = tf.shape(anyrank, name="unknown_rank")  # rank unknown: no bound
        outs = [tf.reduce_sum(t) for t in (r0, r1, both, ranged, unknown_rank)]
    return g, outs


def test_shape_vectors_are_sized_by_their_bound_and_value_lengths_are_not():
    g, outs = _shape_graph()
    ops = step_ops(g, outs)
    sizes = shape_tensor_bytes(ops, {op.name for op in ops})
    assert sizes["bga:0"] == sizes["bga:1"] == 2 * 4  # at most the longer shape: 2 int32
    assert sizes["both:0"] == 6 * 4
    assert "ranged:0" not in sizes and "unknown_rank:0" not in sizes
    og = extract(g, outs, kind="CPU", default_cost=1.0, on_unknown="ignore")
    by_name = {t.name: t.bytes for t in og.tensors}
    assert by_name["bga:0"] == 8 and by_name["ranged:0"] == 0


def test_an_unknown_tensor_no_rule_bounds_is_refused_by_name():
    """A tf.function traced for any batch length leaves its activations
    without a size: still refused, naming the tensors, their op and shape."""
    model = tf.keras.Sequential([tf.keras.Input((16,)), L.Dense(32, activation="relu"), L.Dense(4)])
    step = tf_patch.function.train_step(model, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                                        "sgd")
    fn = tf.function(step.python_function, input_signature=[tf.TensorSpec([None, None]),
                                                           tf.TensorSpec([None], tf.int32)])
    with pytest.raises(InvalidGraphError, match=r"not provably small shape vectors .*float32, \(None, ") as exc:
        tf_patch.function_opgraph(fn, np.zeros((4, 16), np.float32), np.zeros(4, np.int32))
    assert "MatMul" in str(exc.value) or "Relu" in str(exc.value) or "BiasAdd" in str(exc.value)
