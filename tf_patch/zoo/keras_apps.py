"""Keras applications models for the demo and the benchmarks, built offline.

``weights=None`` (random initial weights, nothing downloaded) and a
synthetic batch; the training step is traced by
:func:`tf_patch.keras_step` / :func:`tf_patch.keras_opgraph`, or, model and
step at once (``micro_batches`` too), by :func:`keras_app_step`.

>>> sorted(KERAS_MODELS)
['mobilenetv2', 'resnet50']
"""
from __future__ import annotations

from ..function import keras_step

__all__ = ["KERAS_MODELS", "keras_model", "keras_app_step"]

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


def keras_app_step(name: str, *, micro_batches: int = 1, size: int | None = None, batch: int | None = None,
                   classes: int = 10, seed: int = 0, lr: float = 0.01, **options):
    """The training step of :func:`keras_model` ``name`` (sparse categorical
    cross-entropy, SGD at ``lr``) as a :class:`tf_patch.FunctionStep`, split
    into ``micro_batches`` slices of the batch (:mod:`tf_patch.microstep`);
    ``options`` go to :func:`tf_patch.keras_step` (``costs``, ``n_devices``...).

    Both models hold batch normalisation: in a split step each slice
    normalises with its own statistics (as in GPipe), so its losses are not
    the un-split step's.

    Raises
    ------
    ValueError
        An unknown name; ``micro_batches`` that does not divide the batch
        (:class:`pesto.errors.MicroBatchError`).
    """
    import tensorflow as tf

    model, x, y = keras_model(name, size=size, batch=batch, classes=classes, seed=seed)
    return keras_step(model, "sparse_categorical_crossentropy", tf.keras.optimizers.SGD(lr), x, y,
                      micro_batches=micro_batches, **options)
