"""NMT: encoder-decoder stacked LSTM with Luong attention (as tensorflow/nmt),
statically unrolled.

Scopes: ``embed_src``/``embed_tgt`` (contain "embed"), ``encoder/layer_<k>/t<s>``,
``decoder/layer_<k>/t<s>``, ``attention/t<s>``, ``output_projection``, ``loss``.
Data: a synthetic translation task over the seeded Zipf corpus of
:mod:`tf_patch.zoo.data` (target = source reversed through a fixed token map).
"""
from __future__ import annotations

from .common import (MICRO_DEFAULTS, ZooModel, lazy_corpus, lstm_stack_step, lstm_vars, merge_preset,
                     model_step, projection_loss, slice_scope, tf1)
from .data import translation_pair

PRESETS = {
    "small": dict(layers=2, units=64, batch=16, src_steps=8, tgt_steps=8, vocab=500),
    # `make train MODEL=nmt` on a CPU: ms-scale kernels, two layers to pipeline
    # across 2 devices, a small vocabulary (see rnnlm's "demo" preset)
    "demo": dict(layers=2, units=256, batch=32, src_steps=8, tgt_steps=8, vocab=1000),
    "2x1024": dict(layers=2, units=1024, batch=128, src_steps=20, tgt_steps=20, vocab=17000),
    "4x1024": dict(layers=4, units=1024, batch=128, src_steps=20, tgt_steps=20, vocab=17000),
}
_DEFAULTS = dict(optimizer="adam", lr=0.01, seed=0, corpus="zipf", **MICRO_DEFAULTS)


def build_nmt(preset: str = "small", **overrides) -> ZooModel:
    """Build the NMT training step (see module docstring); ``micro_batches``
    splits it into that many slices of the batch
    (:func:`tf_patch.zoo.common.model_step`)."""
    cfg = merge_preset({k: {**v, **_DEFAULTS} for k, v in PRESETS.items()}, "nmt", preset, overrides)
    t = tf1()
    import tensorflow as tf

    L, H, B, S, T, V = (cfg[k] for k in ("layers", "units", "batch", "src_steps", "tgt_steps", "vocab"))
    graph = tf.Graph()
    with graph.as_default():
        t.set_random_seed(cfg["seed"])
        init = t.random_uniform_initializer(-0.1, 0.1, seed=cfg["seed"])
        src_ph = t.placeholder(tf.int32, [B, S], name="source")
        tin_ph = t.placeholder(tf.int32, [B, T], name="target_in")
        tout_ph = t.placeholder(tf.int32, [B, T], name="target_out")

        def forward(inputs, b):
            src, tin, tout = inputs
            with t.variable_scope("embed_src"):
                e_src = t.get_variable("embedding", [V, H], initializer=init)
                xs = t.unstack(t.nn.embedding_lookup(e_src, src), axis=1)
            with t.variable_scope("embed_tgt"):
                e_tgt = t.get_variable("embedding", [V, H], initializer=init)
                ys = t.unstack(t.nn.embedding_lookup(e_tgt, tin), axis=1)
            enc = [lstm_vars(f"encoder/layer_{k}", H, H, init) for k in range(L)]
            # decoder layer 0 also reads the previous attentional vector (input feeding)
            dec = [lstm_vars(f"decoder/layer_{k}", 2 * H if k == 0 else H, H, init) for k in range(L)]
            with t.variable_scope("attention"):
                w_att = t.get_variable("w_score", [H, H], initializer=init)
                w_c = t.get_variable("w_combine", [2 * H, H], initializer=init)
            h = [t.zeros([b, H]) for _ in range(L)]
            c = [t.zeros([b, H]) for _ in range(L)]
            mem = []
            for s in range(S):
                mem.append(lstm_stack_step(xs[s], h, c, enc, "encoder", s))
            with slice_scope("attention/keys/"):
                memory = t.stack(mem, axis=1)                                    # [b, S, H]
                keys = t.reshape(t.matmul(t.reshape(memory, [b * S, H]), w_att), [b, S, H])
            att = t.zeros([b, H])
            outs = []
            for s in range(T):
                inp = t.concat([ys[s], att], 1, name=f"decoder/layer_0/t{s}/input_feed")
                inp = lstm_stack_step(inp, h, c, dec, "decoder", s)
                with slice_scope(f"attention/t{s}/"):
                    score = t.squeeze(t.matmul(keys, t.expand_dims(inp, 2)), 2)      # [b, S]
                    align = t.nn.softmax(score)
                    ctx = t.reduce_sum(t.expand_dims(align, 2) * memory, 1)         # [b, H]
                    att = t.tanh(t.matmul(t.concat([ctx, inp], 1), w_c))
                outs.append(att)
            return projection_loss(lambda: t.reshape(t.stack(outs, axis=1), [b * T, H]), tout, H, V, init,
                                   scope="output_projection")

        loss, train_op = model_step(forward, [src_ph, tin_ph, tout_ph], cfg)
        init_op = t.global_variables_initializer()

    ids = lazy_corpus(V, max(B * S * 50, 20000), cfg)

    def feed_fn(step: int) -> dict:
        src, tin, tout = translation_pair(ids(), B, S, T, V, step)
        return {src_ph: src, tin_ph: tin, tout_ph: tout}

    return ZooModel(graph, train_op, loss, feed_fn, "nmt", cfg, init_op)
