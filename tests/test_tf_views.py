"""Views from the extractor (tf_patch.extract -> tf_patch.marks.mark_views) on a real TF step.

A dense weight ``w`` (read by ``ReadVariableOp``, updated by ``ResourceApplyAdam``)
is read as a view; an embedding ``e`` read by ``ResourceGather`` (and its Adam
slots, updated by ``ResourceScatterAdd``) is in copy-on-read mode: its reads copy.
"""
import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tf_patch  # noqa: E402,F401  (loads OR-Tools before TensorFlow)

tf = pytest.importorskip("tensorflow")

from tf_patch.extract import extract  # noqa: E402

pytestmark = pytest.mark.tf
t1 = tf.compat.v1
B, V, F = 4, 10, 8


def _step():
    g = tf.Graph()
    with g.as_default():
        ids = t1.placeholder(tf.int32, [B], name="ids")
        y = t1.placeholder(tf.int32, [B], name="y")
        e = t1.get_variable("e", [V, F])
        w = t1.get_variable("w", [F, V])
        h = tf.nn.embedding_lookup(e, ids, name="lookup")
        logits = tf.matmul(h, w, name="logits")
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
        train = t1.train.AdamOptimizer(0.1).minimize(loss, name="train")
    return g, [train, loss]


def test_a_dense_weight_s_read_is_a_view_and_a_gathered_one_s_is_not():
    g, fetches = _step()
    graph = extract(g, fetches, batch=B)
    types = {op.type for op in graph.ops}
    assert "ResourceGather" in types and "ResourceApplyAdam" in types

    def reads_of(var):
        return [graph.op(n) for n in graph.successors(var) if graph.op(n).type == "ReadVariableOp"]

    w_reads = reads_of("w")
    assert w_reads and all(o.view_bytes == o.output_bytes == F * V * 4 for o in w_reads)
    sparse = [n for n in graph.names if graph.op(n).type == "VarHandleOp"
              and any(graph.op(s).type.startswith(("ResourceGather", "ResourceScatter", "ResourceSparseApply"))
                      for s in graph.successors(n))]
    assert "e" in sparse and any(reads_of(v) for v in sparse)   # Adam's slots of e are read, and scattered
    assert all(o.view_bytes == 0 for v in sparse for o in reads_of(v))
