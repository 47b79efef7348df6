"""Keras applications models for the demo and the benchmarks, built offline.

``weights=None`` (random initial weights, nothing downloaded) and a
synthetic batch; the training step is traced by
:func:`tf_patch.keras_step` / :func:`tf_patch.keras_opgraph`.

>>> sorted(KERAS_MODELS)
['mobilenetv2', 'resnet50']
"""
from __future__ import annotations

__all__ = ["KERAS_MODELS", "keras_model"]

#: name -> (keras.applications constructor, default image size, default batch)
KERAS_MODELS = {"mobilenetv2": ("MobileNetV2", 64, 16), "resnet50": ("ResNet50", 64, 8)}


def keras_model(name: str, *, size: int | None = None, batch: int | None = None, classes: int = 10,
                seed: int = 0):
    """``(model, x, y)``: ``keras.applications`` model ``name`` with random
    weights and a synthetic batch of ``batch`` images of ``size`` pixels.

    Raises
    ------
    ValueError
        An unknown name.
    """
    import tensorflow as tf

    if name not in KERAS_MODELS:
        raise ValueError(f"unknown Keras model {name!r}; known: {sorted(KERAS_MODELS)}")
    ctor, size0, batch0 = KERAS_MODELS[name]
    size, batch = size or size0, batch or batch0
    tf.keras.utils.set_random_seed(seed)
    model = getattr(tf.keras.applications, ctor)(weights=None, input_shape=(size, size, 3), classes=classes)
    x = tf.random.normal((batch, size, size, 3), seed=seed)
    y = tf.random.uniform((batch,), 0, classes, dtype=tf.int32, seed=seed)
    return model, x, y
