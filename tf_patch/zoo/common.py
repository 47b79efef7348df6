"""What every zoo builder shares: the result type, LSTM cell, optimizer step."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .data import corpus

__all__ = ["ZooModel", "tf1", "lstm_cell", "train_step", "merge_preset", "projection_loss", "lazy_corpus",
           "lstm_stack_step"]


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
    """

    graph: Any
    train_op: Any
    loss: Any
    feed_fn: Callable[[int], dict]
    name: str
    config: dict = field(default_factory=dict)
    init_op: Any = None

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
        with t.name_scope(f"{scope}/layer_{k}/t{step}/"):
            h[k], c[k] = lstm_cell(inp, h[k], c[k], *cell)
        inp = h[k]
    return inp


def lstm_vars(scope: str, n_in: int, units: int, init):
    t = tf1()
    with t.variable_scope(scope):
        kernel = t.get_variable("kernel", [n_in + units, 4 * units], initializer=init)
        bias = t.get_variable("bias", [4 * units], initializer=t.zeros_initializer())
    return kernel, bias


def train_step(loss, optimizer: str = "adam", lr: float = 0.01):
    """Gradients (``gradients/`` + forward op name, so scopes carry over) and
    the optimizer update, returned as one op."""
    t = tf1()
    params = t.trainable_variables()
    grads = t.gradients(loss, params)
    if optimizer == "adam":
        opt = t.train.AdamOptimizer(lr)
    elif optimizer == "sgd":
        opt = t.train.GradientDescentOptimizer(lr)
    else:
        raise ValueError(f"unknown optimizer {optimizer!r}; use 'adam' or 'sgd'")
    return opt.apply_gradients(list(zip(grads, params)), name="train")


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
