"""OpGraphs of ``tf.function`` and Keras training steps, with true sizes.

A ``tf.function``'s graph reaches its variables through captured resource
placeholders: imported as a GraphDef they carry no shapes, so weights weigh
0 bytes and grappler costs every matmul on a weight as if its dims were 1.
Here the step is traced, each captured variable is sized from the Python
variable behind it (``persistent_bytes``), reads of it keep their static
shapes for grappler (:func:`tf_patch.profile.estimate`), and the fetches are
the function's outputs plus its side effects (optimizer updates).

* :func:`function_opgraph` -- any ``tf.function`` (or Python function) and
  its example arguments;
* :func:`keras_opgraph` -- a Keras model, loss, optimizer and a batch: the
  usual ``GradientTape`` training step.

Placing and running such a step on the planned devices (``.apply``/``.run``)
is not built yet: apply a plan to a ``tf.compat.v1`` graph
(:func:`tf_patch.apply_plan`).

Examples
--------
>>> import tensorflow as tf                                          # doctest: +SKIP
>>> model = tf.keras.applications.MobileNetV2(weights=None)          # doctest: +SKIP
>>> g, prof = keras_opgraph(model, "sparse_categorical_crossentropy", "sgd", x, y)  # doctest: +SKIP
>>> plan = pesto.solve(g, gpus=2)                                    # doctest: +SKIP
"""
from __future__ import annotations

from .extract import allowed_kinds, extract, step_ops
from .profile import estimate

__all__ = ["function_opgraph", "keras_opgraph", "train_step"]


def _concrete(fn, args):
    import tensorflow as tf

    if not hasattr(fn, "get_concrete_function"):
        fn = tf.function(fn)
    return fn.get_concrete_function(*args)


def variable_sizes(concrete) -> dict[str, int]:
    """Captured placeholder name -> bytes of the variable behind it."""
    import tensorflow as tf

    by_handle = {id(v.handle): v for v in concrete.graph.variables}
    out = {}
    for ext, internal in concrete.graph.captures:
        v = by_handle.get(id(ext))
        if v is not None and v.shape.is_fully_defined():
            out[internal.op.name] = int(v.shape.num_elements() * tf.as_dtype(v.dtype).size)
    return out


def function_opgraph(fn, *args, gpu: str = "v100", name: str | None = None, overhead: float = 0.0,
                     progress: bool = False, on_unknown: str = "raise", tensor_sizes=None):
    """``(OpGraph, Profile)`` of one call of ``fn(*args)`` with grappler's costs.

    Parameters
    ----------
    fn : tf.function or Python function (traced with ``tf.function``)
    args : example arguments (tensors): their shapes are the step's shapes
    gpu : the device grappler models ("v100", "a100", "h100")
    on_unknown, tensor_sizes : see :func:`tf_patch.extract.extract`

    Returns
    -------
    (OpGraph, Profile)
        Variables are persistent memory at their real size; fetches are the
        function's outputs and its side effects.
    """
    concrete = _concrete(fn, args)
    graph = concrete.graph
    fetches = list(concrete.outputs) + list(graph.control_outputs)
    sizes = variable_sizes(concrete)
    cpu_ops = [op.name for op in step_ops(graph, fetches) if "GPU" not in allowed_kinds(op.type, "GPU")]
    prof = estimate(graph, fetches, gpu, cpu_ops=cpu_ops, overhead=overhead, progress=progress)
    memory = {k: {"output_bytes": v["output_bytes"]} for k, v in prof.memory.items() if v.get("output_bytes")}
    for op, b in sizes.items():
        memory[op] = {**memory.get(op, {}), "persistent_bytes": b}
    og = extract(graph, fetches, costs=prof.costs, cpu_costs=prof.cpu_costs, kind="GPU", memory=memory,
                 name=name or getattr(fn, "__name__", "step"), on_unknown=on_unknown, tensor_sizes=tensor_sizes)
    return og, prof


def train_step(model, loss, optimizer):
    """The usual Keras training step as a ``tf.function``: forward, loss,
    gradients, one optimizer update; returns the loss."""
    import tensorflow as tf

    loss_fn = tf.keras.losses.get(loss)
    opt = tf.keras.optimizers.get(optimizer)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            value = tf.reduce_mean(loss_fn(y, model(x, training=True)))
        grads = tape.gradient(value, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return value

    return step


def keras_opgraph(model, loss, optimizer, x, y, *, gpu: str = "v100", name: str | None = None, **options):
    """``(OpGraph, Profile)`` of one Keras training step on the batch ``(x, y)``
    (:func:`train_step`, then :func:`function_opgraph`; ``options`` go there)."""
    step = train_step(model, loss, optimizer)
    return function_opgraph(step, x, y, gpu=gpu, name=name or getattr(model, "name", "keras"), **options)
