"""Batch marks from static shapes (issue 24, item 3): tf_patch.batchmarks.

Which ops of an extracted TensorFlow step run once per slice of the batch
(``Op.batch = True``) and which once per step (``False``), on tiny models
built so that a plain "leading dimension equals the batch" rule would get
them wrong: activations reshaped to ``[B*T, F]``, a weight and its gradient
whose leading dimension equals the batch, a Keras optimizer's arithmetic on
the gradients, a split step's slices and accumulation.
"""
import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tf_patch  # noqa: E402  (loads OR-Tools before TensorFlow)

tf = pytest.importorskip("tensorflow")

from tf_patch.batchmarks import batch_marks, batch_sizes  # noqa: E402
from tf_patch.extract import extract, step_ops  # noqa: E402
from tf_patch.function import train_step  # noqa: E402
from tf_patch.microstep import slice_of  # noqa: E402
from tf_patch.zoo import build_model  # noqa: E402

pytestmark = pytest.mark.tf
t1 = tf.compat.v1
B, T, F = 4, 3, 4  # the weight [F, F] has the batch's leading dimension


def _sequence_model(batch_dim=B):
    """Per-token logits of a [B, T, F] batch through a reshape to [B*T, F]."""
    g = tf.Graph()
    with g.as_default():
        x = t1.placeholder(tf.float32, [batch_dim, T, F], name="x")
        y = t1.placeholder(tf.int32, [batch_dim, T], name="y")
        w = t1.get_variable("w", [F, F])
        flat = tf.reshape(x, [-1, F], name="flat")  # [B*T, F]
        logits = tf.matmul(flat, w, name="logits")
        xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.reshape(y, [-1]), logits=logits)
        loss = tf.reduce_mean(xent, name="loss")
        train = t1.train.AdamOptimizer(0.1).minimize(loss, name="train")
    return g, [train, loss]


def test_marks_of_a_step_whose_activations_are_reshaped_and_whose_weight_has_the_batch_size():
    g, fetches = _sequence_model()
    ops = step_ops(g, fetches)
    assert batch_sizes(ops) == {B}
    marks = batch_marks(ops)
    assert set(marks) == {op.name for op in ops}
    for name in ("x", "y", "flat", "logits", "loss"):  # [B*T, F] onwards: found by propagation
        assert marks[name] is True, name
    weight_grads = [op.name for op in ops if op.type == "MatMul" and op.name.startswith("gradients/")]
    assert len(weight_grads) == 2 and all(marks[n] for n in weight_grads)  # dx and dw: per slice
    assert [o.shape.as_list() for n in weight_grads for o in g.get_operation_by_name(n).outputs
            if o.shape.as_list() == [F, F]]  # dw has the batch's leading dimension...
    once = [op for op in ops if op.type in ("VarHandleOp", "ReadVariableOp", "Const", "ResourceApplyAdam")
            or op.name.startswith("train")]
    assert any(op.type == "ResourceApplyAdam" for op in once)
    assert not [op.name for op in once if marks[op.name]]  # ... yet the update reading it is once per step


def test_extract_fills_op_batch_and_leaves_a_step_without_inputs_unmarked():
    g, fetches = _sequence_model()
    og = extract(g, fetches, kind="CPU", default_cost=1.0)
    assert all(op.batch is not None for op in og.ops)
    assert og.op("logits").batch is True and og.op("w").batch is False
    loose = tf.Graph()
    with loose.as_default():
        w = t1.get_variable("w", [3, 2])
        loss = tf.reduce_sum(tf.matmul(tf.ones([5, 3]), w))
        train = t1.train.GradientDescentOptimizer(0.1).minimize(loss)
    og = extract(loose, [train, loss], kind="CPU", default_cost=1.0)
    assert og.num_ops > 5 and all(op.batch is None for op in og.ops)  # no data input: Pesto does not guess


def test_an_unknown_leading_dimension_is_the_batch_extraction_is_given():
    g, fetches = _sequence_model(batch_dim=None)
    og = extract(g, fetches, kind="CPU", default_cost=1.0, batch=B, on_unknown="ignore")
    assert og.op("x").batch and og.op("logits").batch and og.op("loss").batch
    assert og.op("w").batch is False


def test_a_keras_step_marks_the_optimizer_arithmetic_once_per_step():
    tf.keras.utils.set_random_seed(0)
    inp = tf.keras.Input((6,))
    model = tf.keras.Model(inp, tf.keras.layers.Dense(3)(tf.keras.layers.Dense(6, activation="relu")(inp)))
    x, y = tf.random.normal((6, 6)), tf.zeros((6,), tf.int32)  # 6: the batch and the first kernel's rows
    step = train_step(model, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      tf.keras.optimizers.Adam(0.1))
    g, _ = tf_patch.function_opgraph(step, x, y)
    adam = [op for op in g.ops if op.name.startswith("adam")]
    assert any(op.type == "Square" for op in adam)  # Keras 3 Adam: arithmetic on the gradient, then writes
    assert not [op.name for op in adam if op.batch]
    assert all(op.batch for op in g.ops if op.type in ("MatMul", "BiasAddGrad", "ReluGrad"))


def test_a_split_zoo_step_is_marked_slice_by_slice():
    m = build_model("rnnlm", "small", layers=1, units=16, batch=8, steps=3, vocab=50, micro_batches=2)
    ops = step_ops(m.graph, m.fetches)
    assert batch_sizes(ops) == {8, 4}
    marks = batch_marks(ops)
    for op in ops:
        if op.name.startswith(("accumulate/", "train")) or op.type in ("VarHandleOp", "ReadVariableOp", "Const"):
            assert marks[op.name] is False, op.name
        elif slice_of(op.name) is not None and op.name != f"mb{slice_of(op.name)}/scaled_loss":
            assert marks[op.name] is True, op.name  # every slice op but the scalar scaling of its loss
    assert marks["microbatch/inputs"] and not marks["microbatch/loss"]


def test_pesto_step_split_splits_an_extracted_unsplit_step():
    """The marks are what the graph-level split needs: every op marked, no
    variable marked batched, and each batched op copied once per slice."""
    from pesto.step import split

    m = build_model("rnnlm", "small", layers=1, units=16, batch=8, steps=3, vocab=50)
    g, _ = tf_patch.opgraph(m.graph, m.fetches, "v100", on_unknown="ignore")
    out = split(g, 2).graph
    batched = {op.name for op in g.ops if op.batch}
    assert {n[:-4] for n in out.names if n.endswith("@mb1")} == batched
    assert not [op.name for op in g.ops if op.batch and op.persistent_bytes]
