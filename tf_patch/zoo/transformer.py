"""Transformer encoder language model written with raw TF ops.

Scopes: ``embed``, ``layer_<k>/attention`` (multi-head self-attention),
``layer_<k>/ffn``, ``layer_<k>/ln_<i>``, ``output_projection``, ``loss``.
Data: next-token prediction over the seeded Zipf corpus of :mod:`tf_patch.zoo.data`.
"""
from __future__ import annotations

from .common import (MICRO_DEFAULTS, ZooModel, layer_norm, lazy_corpus, merge_preset, model_step, projection_loss,
                     tf1)
from .data import lm_batches

PRESETS = {
    "small": dict(layers=2, d_model=64, heads=4, d_ff=128, batch=8, seq=16, vocab=500),
    "6": dict(layers=6, d_model=512, heads=8, d_ff=2048, batch=64, seq=128, vocab=32000),
    "12": dict(layers=12, d_model=512, heads=8, d_ff=2048, batch=64, seq=128, vocab=32000),
}
_DEFAULTS = dict(optimizer="adam", lr=0.003, seed=0, corpus="zipf", **MICRO_DEFAULTS)


def build_transformer(preset: str = "small", **overrides) -> ZooModel:
    """Build the Transformer training step (see module docstring); ``micro_batches``
    splits it into that many slices of the batch (:func:`tf_patch.zoo.common.model_step`)."""
    cfg = merge_preset({k: {**v, **_DEFAULTS} for k, v in PRESETS.items()}, "transformer", preset, overrides)
    t = tf1()
    import numpy as np
    import tensorflow as tf

    L, D, Hh, F, B, S, V = (cfg[k] for k in ("layers", "d_model", "heads", "d_ff", "batch", "seq", "vocab"))
    dk = D // Hh
    graph = tf.Graph()
    with graph.as_default():
        t.set_random_seed(cfg["seed"])
        init = t.glorot_uniform_initializer(seed=cfg["seed"])
        x_ph = t.placeholder(tf.int32, [B, S], name="inputs")
        y_ph = t.placeholder(tf.int32, [B, S], name="targets")

        def forward(inputs, b):
            x_in, y_in = inputs
            with t.variable_scope("embed"):
                emb = t.get_variable("embedding", [V, D], initializer=init)
                pos = t.get_variable("position", [S, D], initializer=init)
                x = t.nn.embedding_lookup(emb, x_in) * float(np.sqrt(D)) + pos
            mask = t.constant(np.triu(np.full((S, S), -1e9, np.float32), 1), name="causal_mask")
            for k in range(L):
                with t.variable_scope(f"layer_{k}"):
                    with t.variable_scope("attention"):
                        wq, wk, wv, wo = (t.get_variable(n, [D, D], initializer=init)
                                          for n in ("wq", "wk", "wv", "wo"))
                        flat = t.reshape(x, [b * S, D])

                        def heads(w):
                            return t.transpose(t.reshape(t.matmul(flat, w), [b, S, Hh, dk]), [0, 2, 1, 3])
                        q, kk, v = heads(wq), heads(wk), heads(wv)
                        att = t.nn.softmax(t.matmul(q, kk, transpose_b=True) / float(np.sqrt(dk)) + mask)
                        o = t.reshape(t.transpose(t.matmul(att, v), [0, 2, 1, 3]), [b * S, D])
                        x = layer_norm(x + t.reshape(t.matmul(o, wo), [b, S, D]), "ln_0", D)
                    with t.variable_scope("ffn"):
                        w1 = t.get_variable("w1", [D, F], initializer=init)
                        w2 = t.get_variable("w2", [F, D], initializer=init)
                        hdn = t.nn.relu(t.matmul(t.reshape(x, [b * S, D]), w1))
                        x = layer_norm(x + t.reshape(t.matmul(hdn, w2), [b, S, D]), "ln_1", D)
            return projection_loss(lambda: t.reshape(x, [b * S, D]), y_in, D, V, init, scope="output_projection",
                                   bias=False)

        loss, train_op = model_step(forward, [x_ph, y_ph], cfg)
        init_op = t.global_variables_initializer()

    ids = lazy_corpus(V, max(B * (S + 1) * 50, 20000), cfg)

    def feed_fn(step: int) -> dict:
        xb, yb = lm_batches(ids(), B, S, step)
        return {x_ph: xb, y_ph: yb}

    return ZooModel(graph, train_op, loss, feed_fn, "transformer", cfg, init_op)
