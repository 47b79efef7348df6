"""tf_patch.zoo: offline data, model presets, name-scope convention, training."""
import os
import re
import resource

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")

from tf_patch.zoo import MODELS, build_model, presets  # noqa: E402
from tf_patch.zoo.data import corpus, lm_batches, translation_pair  # noqa: E402
pytestmark = pytest.mark.tf


def test_corpus_is_deterministic_and_in_range():
    a, b = corpus(300, 5000, seed=3), corpus(300, 5000, seed=3)
    assert np.array_equal(a, b) and a.dtype == np.int32
    assert 0 <= a.min() and a.max() < 300
    assert not np.array_equal(a, corpus(300, 5000, seed=4))
    counts = np.bincount(a, minlength=300)
    assert counts[0] > counts[100]  # Zipf: frequent head, rare tail


def test_stdlib_corpus_reads_python_sources():
    ids = corpus(200, 3000, source="stdlib")
    assert ids.shape == (3000,) and ids.max() < 200
    assert len(np.unique(ids)) > 50
    with pytest.raises(ValueError, match="unknown corpus source"):
        corpus(10, 10, source="web")


def test_batches_shift_targets_by_one():
    ids = np.arange(1000, dtype=np.int32)
    x, y = lm_batches(ids, 4, 5, 0)
    assert x.shape == y.shape == (4, 5)
    assert np.array_equal(y[:, :-1], x[:, 1:])
    src, tin, tout = translation_pair(corpus(50, 2000), 4, 6, 6, 50, 1)
    assert src.shape == tin.shape == tout.shape == (4, 6)
    assert (tin[:, 0] == 1).all() and np.array_equal(tin[:, 1:], tout[:, :-1])


def test_presets_include_the_papers():
    assert sorted(MODELS) == ["bert", "gpt", "nasnet", "nmt", "rnnlm", "transformer"]
    assert {"small", "2x2048", "4x2048", "16x1024"} <= set(presets("rnnlm"))
    assert {"small", "2x1024", "4x1024"} <= set(presets("nmt"))
    assert {"small", "6", "12"} <= set(presets("transformer"))
    assert {"small", "paper"} <= set(presets("nasnet"))
    assert {"small", "1.3b", "2.7b"} <= set(presets("gpt")) and {"small", "large"} <= set(presets("bert"))
    with pytest.raises(ValueError, match="unknown preset"):
        build_model("rnnlm", "huge")
    with pytest.raises(ValueError, match="unknown option"):
        build_model("rnnlm", "small", colour=1)
    with pytest.raises(ValueError, match="unknown model"):
        build_model("gpt2", "small")


SCOPES = {
    "rnnlm": [r"(^|/)embed", r"rnn/layer_0/", r"rnn/layer_1/", r"gradients/rnn/layer_1/", r"softmax", r"loss"],
    "nmt": [r"embed_src", r"embed_tgt", r"encoder/layer_1/", r"decoder/layer_1/", r"attention/",
            r"gradients/.*attention", r"output_projection", r"loss"],
    "transformer": [r"embed", r"layer_0/attention", r"layer_1/ffn", r"output_projection", r"loss"],
    "nasnet": [r"cell_0/branch_0/", r"cell_2/branch_5/", r"gradients/cell_1/branch_1/", r"softmax", r"loss"],
    "gpt": [r"^embed/", r"^layer_1/attention/qkv/", r"^layer_0/mlp/gelu/", r"^gradients/layer_1/ln_0/",
            r"^train/update_layer_0/mlp/fc/w/", r"^ln_f/", r"^output_projection/", r"^loss/"],
    "bert": [r"^embed/ln/", r"^layer_1/attention/", r"^layer_0/ln_1/", r"^gradients/layer_1/mlp/",
             r"^mlm/transform/", r"^output_projection/", r"^loss/"],
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_small_model_trains_and_follows_scope_convention(name):
    m = build_model(name, "small")
    names = [op.name for op in m.graph.get_operations()]
    for pat in SCOPES[name]:
        assert any(re.search(pat, n) for n in names), f"{name}: no op matches {pat!r}"
    with tf.compat.v1.Session(graph=m.graph) as sess:
        sess.run(m.init_op)
        losses = [float(sess.run(m.fetches, m.feed_fn(s))[1]) for s in range(15)]
    assert all(np.isfinite(losses))
    assert np.mean(losses[-3:]) < losses[0], f"{name}: loss did not fall: {losses}"


def test_same_seed_same_losses():
    out = []
    for _ in range(2):
        m = build_model("rnnlm", "small", layers=1, steps=4)
        with tf.compat.v1.Session(graph=m.graph) as sess:
            sess.run(m.init_op)
            out.append([float(sess.run(m.fetches, m.feed_fn(s))[1]) for s in range(3)])
    assert out[0] == out[1]


def test_paper_preset_builds_without_allocating_variables():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    m = build_model("rnnlm", "2x2048")
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    params = sum(int(np.prod(v.shape)) for v in m.graph.get_collection("variables"))
    assert params > 50_000_000   # weights + Adam slots: > 200 MB if they were allocated
    assert grown_mb < 150, f"building the graph grew RSS by {grown_mb:.0f} MB"
    assert m.config["units"] == 2048 and m.config["batch"] == 128
