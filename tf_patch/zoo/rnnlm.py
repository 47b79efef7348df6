"""RNNLM: a stacked-LSTM language model, statically unrolled (as in the paper).

Scopes: ``embed``, ``rnn/layer_<k>/t<step>``, ``softmax``, ``loss``; gradients
get TF's ``gradients/`` prefix and optimizer updates ``train/update_<var>``.
Data: the seeded synthetic Zipf corpus of :mod:`tf_patch.zoo.data` (or
``corpus="stdlib"`` for the words of Python's standard library).

Examples
--------
>>> m = build_rnnlm("small", layers=1, steps=2)        # doctest: +SKIP
>>> sorted(m.feed_fn(0))                               # doctest: +SKIP
"""
from __future__ import annotations

from .common import (MICRO_DEFAULTS, ZooModel, lazy_corpus, lstm_stack_step, lstm_vars, merge_preset,
                     model_step, projection_loss, tf1)
from .data import lm_batches

PRESETS = {
    "small": dict(layers=2, units=64, batch=16, steps=10, vocab=500),
    # `make demo` on a CPU: kernels long enough (LSTM matmuls ~0.3-0.7 ms on one
    # core) that per-op dispatch (~5 us) and hand-offs between devices (~3 us) stay
    # small, two layers so a 2-device pipeline has work to overlap, and a small
    # vocabulary so the softmax (one device's serial work) does not dominate
    "demo": dict(layers=2, units=256, batch=32, steps=10, vocab=1000),
    "2x2048": dict(layers=2, units=2048, batch=128, steps=20, vocab=10000),
    "4x2048": dict(layers=4, units=2048, batch=128, steps=20, vocab=10000),
    "16x1024": dict(layers=16, units=1024, batch=128, steps=20, vocab=10000),
}
_DEFAULTS = dict(optimizer="adam", lr=0.01, seed=0, corpus="zipf", **MICRO_DEFAULTS)


def build_rnnlm(preset: str = "small", **overrides) -> ZooModel:
    """Build the RNNLM training step; ``overrides`` change preset fields
    (layers, units, batch, steps, vocab) or optimizer, lr, seed, corpus,
    micro_batches (the step split into that many slices of the batch:
    :func:`tf_patch.zoo.common.model_step`)."""
    cfg = merge_preset({k: {**v, **_DEFAULTS} for k, v in PRESETS.items()}, "rnnlm", preset, overrides)
    t = tf1()
    import tensorflow as tf

    L, H, B, T, V = cfg["layers"], cfg["units"], cfg["batch"], cfg["steps"], cfg["vocab"]
    graph = tf.Graph()
    with graph.as_default():
        t.set_random_seed(cfg["seed"])
        init = t.random_uniform_initializer(-0.1, 0.1, seed=cfg["seed"])
        x_ph = t.placeholder(tf.int32, [B, T], name="inputs")
        y_ph = t.placeholder(tf.int32, [B, T], name="targets")

        def forward(inputs, b):
            x_in, y_in = inputs
            with t.variable_scope("embed"):
                emb = t.get_variable("embedding", [V, H], initializer=init)
                x = t.nn.embedding_lookup(emb, x_in)
                xs = t.unstack(x, axis=1)
            cells = [lstm_vars(f"rnn/layer_{k}", H, H, init) for k in range(L)]
            h = [t.zeros([b, H]) for _ in range(L)]
            c = [t.zeros([b, H]) for _ in range(L)]
            outs = []
            for s in range(T):
                outs.append(lstm_stack_step(xs[s], h, c, cells, "rnn", s))
            return projection_loss(lambda: t.reshape(t.stack(outs, axis=1), [b * T, H]), y_in, H, V, init,
                                   scope="softmax")

        loss, train_op = model_step(forward, [x_ph, y_ph], cfg)
        init_op = t.global_variables_initializer()

    ids = lazy_corpus(V, max(B * (T + 1) * 50, 20000), cfg)

    def feed_fn(step: int) -> dict:
        xb, yb = lm_batches(ids(), B, T, step)
        return {x_ph: xb, y_ph: yb}

    return ZooModel(graph, train_op, loss, feed_fn, "rnnlm", cfg, init_op)
