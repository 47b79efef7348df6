"""A NASNet-like CNN: a stack of cells, each with parallel branches
(separable convolutions, pooling, identity) summed in pairs and concatenated.

Scopes: ``stem``, ``cell_<k>/branch_<b>``, ``cell_<k>/combine``, ``softmax``, ``loss``.
Data: seeded synthetic images whose label is the brightest quadrant-channel
bucket (learnable, offline).
"""
from __future__ import annotations

from .common import MICRO_DEFAULTS, ZooModel, merge_preset, model_step, tf1

PRESETS = {
    "small": dict(cells=3, channels=16, batch=8, image=16, classes=10),
    # NASNet-A (6 @ 768) on CIFAR-sized inputs: 18 cells, no reduction cells
    "paper": dict(cells=18, channels=96, batch=64, image=32, classes=10),
}
_DEFAULTS = dict(optimizer="adam", lr=0.003, seed=0, **MICRO_DEFAULTS)


def _sep_conv(x, ksize, ch, init, name):
    t = tf1()
    cin = x.shape[-1]
    with t.variable_scope(name):
        dw = t.get_variable("depthwise", [ksize, ksize, cin, 1], initializer=init)
        pw = t.get_variable("pointwise", [1, 1, cin, ch], initializer=init)
        y = t.nn.depthwise_conv2d(t.nn.relu(x), dw, [1, 1, 1, 1], "SAME")
        return t.nn.conv2d(y, pw, [1, 1, 1, 1], "SAME")


def build_nasnet(preset: str = "small", **overrides) -> ZooModel:
    """Build the NASNet-like training step (see module docstring); ``micro_batches``
    splits it into that many slices of the batch (:func:`tf_patch.zoo.common.model_step`)."""
    cfg = merge_preset({k: {**v, **_DEFAULTS} for k, v in PRESETS.items()}, "nasnet", preset, overrides)
    t = tf1()
    import numpy as np
    import tensorflow as tf

    N, C, B, I, K = (cfg[k] for k in ("cells", "channels", "batch", "image", "classes"))
    graph = tf.Graph()
    with graph.as_default():
        t.set_random_seed(cfg["seed"])
        init = t.glorot_uniform_initializer(seed=cfg["seed"])
        x_ph = t.placeholder(tf.float32, [B, I, I, 3], name="images")
        y_ph = t.placeholder(tf.int32, [B], name="labels")

        def forward(inputs, batch):  # noqa: ARG001  (no op needs the batch size)
            x_in, y_in = inputs
            with t.variable_scope("stem"):
                w = t.get_variable("conv", [3, 3, 3, C], initializer=init)
                x = t.nn.conv2d(x_in, w, [1, 1, 1, 1], "SAME")
            prev = x
            for k in range(N):
                with t.variable_scope(f"cell_{k}"):
                    cell_in = [x, prev]
                    ops = [(5, 0), (3, 1), ("avg", 0), ("max", 1), (3, 0), ("id", 1)]
                    outs = []
                    for b, (kind, src) in enumerate(ops):
                        with t.variable_scope(f"branch_{b}"):
                            h = cell_in[src]
                            if kind == "avg":
                                h = t.nn.avg_pool2d(h, 3, 1, "SAME")
                            elif kind == "max":
                                h = t.nn.max_pool2d(h, 3, 1, "SAME")
                            elif kind == "id":
                                h = t.identity(h)
                            else:
                                h = _sep_conv(h, kind, C, init, "sep")
                            outs.append(h)
                    with t.variable_scope("combine"):
                        pairs = [outs[i] + outs[i + 1] for i in range(0, len(outs), 2)]
                        wr = t.get_variable("reduce", [1, 1, C * len(pairs), C], initializer=init)
                        prev, x = x, t.nn.conv2d(t.nn.relu(t.concat(pairs, 3)), wr, [1, 1, 1, 1], "SAME")
            with t.variable_scope("softmax"):
                pooled = t.reduce_mean(x, [1, 2])
                wf = t.get_variable("w", [C, K], initializer=init)
                logits = t.matmul(pooled, wf)
            with t.name_scope("loss"):
                return t.reduce_mean(t.nn.sparse_softmax_cross_entropy_with_logits(labels=y_in, logits=logits))

        loss, train_op = model_step(forward, [x_ph, y_ph], cfg)
        init_op = t.global_variables_initializer()

    def feed_fn(step: int) -> dict:
        rng = np.random.default_rng(cfg["seed"] * 1000003 + step)
        imgs = rng.standard_normal((B, I, I, 3)).astype(np.float32)
        h = I // 2
        quad = np.stack([imgs[:, :h, :h].mean((1, 2)), imgs[:, h:, h:].mean((1, 2))], 1).reshape(B, -1)
        labels = (np.argmax(quad, 1) % K).astype(np.int32)
        return {x_ph: imgs, y_ph: labels}

    return ZooModel(graph, train_op, loss, feed_fn, "nasnet", cfg, init_op)
