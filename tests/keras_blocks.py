"""Tiny Keras models of the attention and recurrent families, shared by the TF tests
(imported after ``pytest.importorskip("tensorflow")``). Each returns ``(model, x)``."""
from __future__ import annotations

import tensorflow as tf

L = tf.keras.layers


def tanh_mlp():
    """Three ``Dense(16, tanh)`` layers ``layer_<k>`` (recomputation's blocks) and a head of
    3 logits, seeded; with its batch ``(x, y)`` of 8 samples."""
    tf.keras.utils.set_random_seed(0)
    inp = tf.keras.Input((8,))
    h = inp
    for k in range(3):
        h = L.Dense(16, activation="tanh", name=f"layer_{k}")(h)
    model = tf.keras.Model(inp, L.Dense(3, name="head")(h))
    x = tf.random.normal((8, 8), seed=1)
    return model, x, tf.random.uniform((8,), 0, 3, dtype=tf.int32, seed=2)


def wide_mlp(blocks: int = 4, width: int = 128, batch: int = 1024):
    """``blocks`` blocks ``layer_<k>``, each ``Dense(4 width, relu) -> Dense(width)``
    (a wide activation, small weights: what recomputation saves), on 64 features into 4
    logits, seeded; with its batch ``(x, y)``."""
    class Block(L.Layer):
        def __init__(self, width, **kw):
            super().__init__(**kw)
            self.up, self.down = L.Dense(4 * width, activation="relu"), L.Dense(width)

        def call(self, x):
            return self.down(self.up(x))

    tf.keras.utils.set_random_seed(0)
    inp = tf.keras.Input((64,))
    h = inp
    for k in range(blocks):
        h = Block(width, name=f"layer_{k}")(h)
    model = tf.keras.Model(inp, L.Dense(4, name="head")(h))
    x = tf.random.normal((batch, 64), seed=1)
    return model, x, tf.random.uniform((batch,), 0, 4, dtype=tf.int32, seed=2)


def attention_block(batch: int, seq: int, width: int, classes: int):
    """A Transformer encoder block: 2-head self-attention (causal mask), residual +
    LayerNormalization, a GELU feed-forward, pooled into ``classes`` logits."""
    inp = tf.keras.Input((seq, width))
    a = L.MultiHeadAttention(2, width // 2)(inp, inp, use_causal_mask=True)
    h = L.LayerNormalization()(inp + a)
    h = L.LayerNormalization()(h + L.Dense(width)(L.Dense(2 * width, activation="gelu")(h)))
    model = tf.keras.Model(inp, L.Dense(classes)(L.GlobalAveragePooling1D()(h)))
    return model, tf.random.normal((batch, seq, width), seed=1)


def lstm_gru(batch: int, steps: int, features: int, lstm: int, gru: int, classes: int):
    """An LSTM (its whole sequence) into a GRU, then ``classes`` logits."""
    inp = tf.keras.Input((steps, features))
    h = L.LSTM(lstm, return_sequences=True)(inp)
    return tf.keras.Model(inp, L.Dense(classes)(L.GRU(gru)(h))), tf.random.normal((batch, steps, features), seed=1)


def convnext_like(batch: int, size: int, width: int, classes: int):
    """ConvNeXt in small: a patchify stem (a 4x4 stride-4 convolution with a
    bias, LayerNormalization), two stages of one block (a 7x7 depthwise
    convolution with a bias, LayerNormalization, a GELU pointwise Dense pair,
    a residual add) with a LayerNormalization + 2x2 stride-2 downsampling
    convolution between them, pooled into ``classes`` logits."""
    inp = tf.keras.Input((size, size, 3))
    h = L.LayerNormalization(epsilon=1e-6)(L.Conv2D(width, 4, strides=4)(inp))
    for stage in range(2):
        if stage:
            h = L.Conv2D(width, 2, strides=2)(L.LayerNormalization(epsilon=1e-6)(h))
        r = L.LayerNormalization(epsilon=1e-6)(L.DepthwiseConv2D(7, padding="same")(h))
        h = L.Add()([h, L.Dense(width)(L.Dense(4 * width, activation="gelu")(r))])
    h = L.LayerNormalization(epsilon=1e-6)(L.GlobalAveragePooling2D()(h))
    return tf.keras.Model(inp, L.Dense(classes)(h)), tf.random.normal((batch, size, size, 3), seed=1)
