"""What every zoo builder shares: the result type, LSTM cell, optimizer step."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from pesto.errors import MicroBatchError

from ..devices import detect
from ..microstep import GRADIENT_SCOPE, check_micro_batches, split_graph_step
from .data import corpus

__all__ = ["ZooModel", "tf1", "layer_norm", "lstm_cell", "train_step", "merge_preset", "projection_loss", "lazy_corpus",
           "lstm_stack_step", "model_step", "mirrored_step", "slice_scope", "MICRO_DEFAULTS"]

#: The options every zoo builder takes besides its preset's fields: the step
#: split into ``micro_batches`` slices (:func:`model_step`; 1: not split), or
#: run by TensorFlow's ``MirroredStrategy`` on ``mirrored`` devices
#: (:func:`mirrored_step`; 0: not), a data-parallel baseline Pesto does not place.
MICRO_DEFAULTS = {"micro_batches": 1, "mirrored": 0}


def tf1():
    """``tf.compat.v1`` (imported lazily: TensorFlow is slow to import)."""
    import tensorflow as tf
    return tf.compat.v1


@dataclass
class ZooModel:
    """A complete training step in its own ``tf.Graph``.

    Attributes
    ----------
    graph : tf.Graph
    train_op : tf.Operation
        Runs forward, backward and the optimizer update.
    loss : tf.Tensor
        Scalar mean loss of the step.
    feed_fn : callable(step) -> dict
        Placeholder -> numpy batch for training step ``step`` (offline data).
    name : str
    config : dict
        The resolved preset (layers, units, batch, ...).
    init_op : tf.Operation
        Initialises every variable (seeded).
    init_feed : dict or None
        What ``init_op`` is fed (a replicated step's initial values:
        :func:`tf_patch.replicastep.replicate_model`).
    """

    graph: Any
    train_op: Any
    loss: Any
    feed_fn: Callable[[int], dict]
    name: str
    config: dict = field(default_factory=dict)
    init_op: Any = None
    init_feed: Any = None

    @property
    def fetches(self):
        return [self.train_op, self.loss]


def merge_preset(presets: dict, model: str, preset: str, overrides: dict) -> dict:
    if preset not in presets:
        raise ValueError(f"unknown preset {preset!r} for {model}; known: {sorted(presets)}")
    cfg = dict(presets[preset])
    unknown = set(overrides) - set(cfg)
    if unknown:
        raise ValueError(f"unknown option(s) {sorted(unknown)} for {model}; known: {sorted(cfg)}")
    cfg.update(overrides)
    return cfg


def layer_norm(x, scope: str, d: int, eps: float = 1e-6):
    """Layer normalisation over the last axis (``gamma``, ``beta`` under ``scope``)."""
    t = tf1()
    with t.variable_scope(scope):
        g = t.get_variable("gamma", [d], initializer=t.ones_initializer())
        b = t.get_variable("beta", [d], initializer=t.zeros_initializer())
        mean, var = t.nn.moments(x, [-1], keep_dims=True)
        return (x - mean) * t.rsqrt(var + eps) * g + b


def lstm_cell(x, h, c, kernel, bias):
    """One hand-written LSTM step (so the graph has per-step ops, as in the
    paper's static unroll): ``z = [x, h] W + b``; gates i, j, f, o."""
    t = tf1()
    z = t.matmul(t.concat([x, h], 1), kernel) + bias
    i, j, f, o = t.split(z, 4, axis=1)
    c2 = t.sigmoid(f + 1.0) * c + t.sigmoid(i) * t.tanh(j)
    h2 = t.sigmoid(o) * t.tanh(c2)
    return h2, c2


def lstm_stack_step(inp, h: list, c: list, cells: list, scope: str, step: int):
    """One time step through stacked LSTM layers, each under
    ``{scope}/layer_{k}/t{step}/`` (the Expert placer reads ``layer_k``);
    updates ``h`` and ``c`` in place and returns the top layer's output."""
    t = tf1()
    for k, cell in enumerate(cells):
        with slice_scope(f"{scope}/layer_{k}/t{step}/"):
            h[k], c[k] = lstm_cell(inp, h[k], c[k], *cell)
        inp = h[k]
    return inp


def lstm_vars(scope: str, n_in: int, units: int, init):
    t = tf1()
    with t.variable_scope(scope):
        kernel = t.get_variable("kernel", [n_in + units, 4 * units], initializer=init)
        bias = t.get_variable("bias", [4 * units], initializer=t.zeros_initializer())
    return kernel, bias


def slice_scope(name: str):
    """``tf.name_scope(name)`` for a name ending in ``/`` (a scope entered
    as it is, not made unique), inside the current scope: ``mb<i>/`` + name
    in slice ``i`` of a micro-batched step, ``name`` itself otherwise."""
    t = tf1()
    outer = t.get_default_graph().get_name_scope()
    return t.name_scope(f"{outer}/{name}" if outer else name)


def _optimizer(optimizer: str, lr: float):
    t = tf1()
    if optimizer == "adam":
        return t.train.AdamOptimizer(lr)
    if optimizer == "sgd":
        return t.train.GradientDescentOptimizer(lr)
    raise ValueError(f"unknown optimizer {optimizer!r}; use 'adam' or 'sgd'")


def train_step(loss, optimizer: str = "adam", lr: float = 0.01):
    """Gradients (``gradients/`` + forward op name, so scopes carry over) and
    the optimizer update, returned as one op."""
    t = tf1()
    params = t.trainable_variables()
    grads = t.gradients(loss, params)
    opt = _optimizer(optimizer, lr)
    return opt.apply_gradients(list(zip(grads, params)), name="train")


def model_step(forward, inputs: list, cfg: dict):
    """``(loss, train_op)`` of a zoo model's training step, split into
    ``cfg["micro_batches"]`` slices (:mod:`tf_patch.microstep`).

    Parameters
    ----------
    forward : callable(inputs, batch) -> scalar mean loss
        Builds the forward pass on ``inputs`` (tensors whose leading
        dimension is ``batch``), creating its variables with
        ``get_variable`` (reused by the slices after the first).
    inputs : the full-batch placeholders
    cfg : the resolved preset: ``batch``, ``micro_batches``, ``optimizer``, ``lr``

    Returns
    -------
    (loss, train_op)
        With one slice, exactly the un-split step (:func:`train_step`); with
        ``M``, slice ``i`` under ``mb<i>/`` (its gradients under
        ``gradients/mb<i>/``), gradients summed under ``accumulate/``, the
        loss (``microbatch/loss``) the mean over the batch, one update.

    Raises
    ------
    MicroBatchError
        ``micro_batches`` is not an int >= 1 or does not divide ``batch``.
    """
    t = tf1()
    batch = cfg["batch"]
    m = check_micro_batches(batch, cfg.get("micro_batches", 1))
    if cfg.get("mirrored", 0):
        if m != 1:
            raise MicroBatchError(f"micro_batches={m} and mirrored={cfg['mirrored']} cannot be combined: "
                                  "a MirroredStrategy step is not split further", culprit=m)
        return mirrored_step(forward, inputs, cfg)
    if m == 1:
        loss = forward(inputs, batch)
        return loss, train_step(loss, cfg["optimizer"], cfg["lr"])

    def per_slice(i, parts):
        with t.variable_scope(t.get_variable_scope(), reuse=t.AUTO_REUSE), t.name_scope(f"mb{i}"):
            loss = t.multiply(forward(parts, batch // m), 1.0 / m, name="scaled_loss")
        return loss, t.gradients(loss, t.trainable_variables(), name=GRADIENT_SCOPE.format(i))

    loss, pairs = split_graph_step(per_slice, inputs, m, t.trainable_variables)
    return loss, _optimizer(cfg["optimizer"], cfg["lr"]).apply_gradients(pairs, name="train")


def mirrored_step(forward, inputs: list, cfg: dict):
    """``(loss, train_op)`` of the step run by ``tf.distribute.MirroredStrategy``
    (graph mode) on ``cfg["mirrored"]`` devices: each replica takes an equal
    share of the batch, scales its loss by ``1/N`` (so the summed gradients
    are the whole batch's mean), and the optimizer applies the all-reduced
    gradients to mirrored variables; the loss is the sum of the replicas'
    scaled losses. Devices: ``/GPU:k`` if there are that many GPUs, else
    logical CPU devices (a session with :func:`tf_patch.session_config` of as
    many devices, one executor thread per replica).

    Raises
    ------
    MicroBatchError
        ``mirrored`` is not an int >= 1 or does not divide the batch.
    """
    import tensorflow as tf

    t = tf1()
    n = check_micro_batches(cfg["batch"], cfg["mirrored"])
    kind, names = detect(n)
    strategy = t.distribute.MirroredStrategy([d.lower() for d in names])
    b = cfg["batch"] // n
    with strategy.scope():
        opt = _optimizer(cfg["optimizer"], cfg["lr"])

        def replica():
            rid = tf.distribute.get_replica_context().replica_id_in_sync_group  # a tensor in graph mode
            parts = [tf.gather(t.reshape(x, [n, b] + x.shape.as_list()[1:]), rid, name="share") for x in inputs]
            loss = t.multiply(forward(parts, b), 1.0 / n, name="scaled_loss")
            params = t.trainable_variables()
            update = opt.apply_gradients(list(zip(t.gradients(loss, params), params)), name="train")
            with tf.control_dependencies([update]):
                return tf.identity(loss)

        losses = strategy.extended.call_for_each_replica(replica)
        loss = strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)
        return loss, loss.op


def projection_loss(x2d, labels, n_in: int, vocab: int, init, *, scope: str, bias: bool = True):
    """Logits over the vocabulary (variables under ``scope``) and the mean
    cross-entropy (ops under ``loss``): the output layer of the LM-like models.
    ``x2d`` is a function building the ``[rows, n_in]`` input, called inside
    ``scope`` so its ops (the stack and reshape of the outputs) are named
    there, as in the cached benchmark graphs (``softmax/Reshape``)."""
    t = tf1()
    with t.variable_scope(scope):
        w = t.get_variable("w", [n_in, vocab], initializer=init)
        logits = t.matmul(x2d(), w)
        if bias:
            logits = logits + t.get_variable("b", [vocab], initializer=t.zeros_initializer())
    with t.name_scope("loss"):
        return t.reduce_mean(t.nn.sparse_softmax_cross_entropy_with_logits(
            labels=t.reshape(labels, [-1]), logits=logits))


def lazy_corpus(vocab: int, n_tokens: int, cfg: dict):
    """A function returning the token ids of the configured corpus, built on
    first call (building a graph must not build the data)."""
    cache: list = []

    def ids():
        if not cache:
            cache.append(corpus(vocab, n_tokens, source=cfg["corpus"], seed=cfg["seed"]))
        return cache[0]
    return ids
