"""Tiny Keras models of the attention and recurrent families, shared by the TF tests
(imported after ``pytest.importorskip("tensorflow")``). Each returns ``(model, x)``."""
from __future__ import annotations

import tensorflow as tf

L = tf.keras.layers


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
