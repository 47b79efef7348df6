"""Micro-batched training steps built in TensorFlow (issue 24, item 1).

A step with ``micro_batches=M`` cuts the batch into ``M`` equal slices along
axis 0, runs the forward and backward pass of each slice, sums each
variable's gradients over the slices and applies the optimizer once. The
step is an **unrolled graph**, so Pesto sees every slice's ops as ops of
their own that it can place and order (a pipeline stage is all slices'
copies of a layer on one device); their costs come from the cost model at
the micro-batch size (grappler or measured), because the graph really runs
at that size.

How the graph is built (the naming rule)
----------------------------------------
* ``microbatch/<input>``: one ``Split`` per batched input (``tf.split``
  along axis 0), whose ``M`` outputs are the slices;
* slice ``i``'s forward ops under ``mb<i>/`` and its backward ops under
  ``gradients/mb<i>/`` (``tf.gradients``, graph mode: the zoo; a gradient
  op is named after its forward op, so ``gradients/mb<i>/mb<i>/...``) or
  ``gradient_tape/mb<i>/`` (``tf.GradientTape``, a ``tf.function`` step):
  :func:`slice_of` reads ``i`` back from a name, every op of a slice has
  the component ``mb<i>``. Each slice's loss is scaled
  by ``1/M`` inside the slice (``mb<i>/scaled_loss``), so its gradients are
  *partials* that add up to the un-split step's gradients;
* ``accumulate/<variable>/``: the partial gradients of a variable summed in a
  chain (slice ``k`` is added as soon as it is done); a sparse gradient
  (``IndexedSlices``, an embedding's) is the concatenation of the slices'
  rows, which the optimizer sums per row as it does for one batch;
* ``whole/<variable>/``: with :class:`LossStep`'s ``whole`` (Keras ``Dense``
  layers), the kernel's gradient is not summed over the slices but computed
  once, ``MatMul(concat(x_i)^T, concat(dy_i))`` over every slice's layer
  input ``x_i`` and output-gradient ``dy_i`` (the gradient of the layer's
  ``x W``, which each slice's backward pass computes anyway): Pesto's
  ``weight_grads="whole"`` (:func:`pesto.step.split`). The bias and every
  other variable stay on the ``accumulate/`` chains;
* ``microbatch/loss``: the step's loss, the sum of the scaled slice losses;
* the optimizer update: once, as in the un-split step.

With ``M = 1`` nothing is split: the step is the usual one, op for op.

When the update equals the un-split step's
------------------------------------------
The loss must be a mean over the samples of the batch: the mean over the
whole batch is the mean of the ``M`` slice means (equal slices), so the
summed gradient of the scaled slice losses is the un-split gradient, and
the update equals the un-split step's within float rounding (the sums run in
another order). Not equal, knowingly: batch normalisation in training mode
(each slice normalises with its own statistics, as in GPipe, and updates
the moving averages once per slice), random ops (dropout draws per slice),
and losses that are not per-sample means (a sum is off by a factor; a
batch-level statistic is not additive).

Examples
--------
>>> check_micro_batches(32, 4)
4
>>> check_micro_batches(30, 4)
Traceback (most recent call last):
...
pesto.errors.MicroBatchError: micro_batches=4 does not divide the batch of 30 samples (slices must be equal); divisors of 30: 1, 2, 3, 5, 6, 10, 15, 30
>>> slice_of("gradients/mb3/rnn/layer_0/t1/MatMul_grad/MatMul"), slice_of("accumulate/w/add")
(3, None)
"""
from __future__ import annotations

from . import needs_tf  # noqa: F401  (an ImportError naming the tf extra without TensorFlow)
import numbers
import re

from pesto.errors import MicroBatchError

__all__ = ["check_micro_batches", "slice_of", "batch_size", "split_inputs", "accumulate", "split_graph_step",
           "LossStep", "split_step", "whole_gradient", "SLICE", "GRADIENT_SCOPE"]

#: Name component of slice ``i``'s ops: ``mb<i>``.
SLICE = re.compile(r"(?:^|/)mb(\d+)(?:/|$)")
#: The name scope of slice ``i``'s graph-mode gradients (``tf.gradients(..., name=...)``): under
#: TensorFlow's own ``gradients/`` root, so tools that tell backward ops by it still do, and
#: with the slice's component, so every gradient op of the slice (its sums too) carries it.
GRADIENT_SCOPE = "gradients/mb{}/"


def check_micro_batches(batch, micro_batches) -> int:
    """``micro_batches`` as an int, checked against the batch size.

    Parameters
    ----------
    batch : int or None
        Samples in the batch (None: not known yet, only ``micro_batches`` is checked).
    micro_batches : int
        Slices to cut the batch into.

    Returns
    -------
    int

    Raises
    ------
    MicroBatchError
        (a ``ValueError``) ``micro_batches`` is not an integer >= 1, or does
        not divide ``batch``; the message names both and the divisors.
    """
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, numbers.Integral):
        raise MicroBatchError(f"micro_batches must be an integer >= 1, got {micro_batches!r} "
                              f"({type(micro_batches).__name__})", culprit=micro_batches)
    m = int(micro_batches)
    if m < 1:
        raise MicroBatchError(f"micro_batches must be an integer >= 1, got {m}", culprit=m)
    if batch is not None and int(batch) % m:
        b = int(batch)
        divisors = ", ".join(str(d) for d in range(1, b + 1) if b % d == 0)
        raise MicroBatchError(f"micro_batches={m} does not divide the batch of {b} samples (slices must be "
                              f"equal); divisors of {b}: {divisors}", culprit=m)
    return m


def slice_of(name: str) -> int | None:
    """The slice an op of a micro-batched step belongs to (its ``mb<i>``
    name component), or None (split, accumulation, optimizer, variables)."""
    m = SLICE.search(name)
    return int(m.group(1)) if m else None


def batch_size(tensors) -> int:
    """The common static leading dimension of ``tensors`` (the batch).

    Raises
    ------
    MicroBatchError
        A tensor has no leading dimension (a scalar) or an unknown one, or
        two disagree: the batch cannot be split.
    """
    sizes = {}
    for k, x in enumerate(tensors):
        shape = getattr(x, "shape", None)
        rank = None if shape is None else shape.rank if hasattr(shape, "rank") else len(shape)
        dims = list(shape) if rank else []
        if not dims or dims[0] is None:
            raise MicroBatchError(f"batch argument {k} has no static leading dimension (shape {shape}): "
                                  "a micro-batched step splits every batch argument along axis 0", culprit=k)
        sizes[k] = int(dims[0])
    if len(set(sizes.values())) > 1:
        raise MicroBatchError(f"batch arguments disagree on the batch size (leading dimensions {sizes}): "
                              "a micro-batched step splits them all into the same slices", culprit=sizes)
    if not sizes:
        raise MicroBatchError("a micro-batched step needs at least one batch argument to split")
    return next(iter(sizes.values()))


def split_inputs(inputs, micro_batches: int) -> list[list]:
    """``[[slice 0 of input 0, ...], ...]``: each input cut along axis 0 by one
    ``Split`` op named ``microbatch/<input>`` (the input's op name, its
    last component, or ``input<k>``)."""
    import tensorflow as tf

    out = []
    for k, x in enumerate(inputs):
        label = re.sub(r"[^A-Za-z0-9_.\-]", "_", getattr(getattr(x, "op", None), "name", "").rsplit("/", 1)[-1])
        out.append(tf.split(x, micro_batches, axis=0, name=f"microbatch/{label or f'input{k}'}"))
    return [[parts[i] for parts in out] for i in range(micro_batches)]


def _label(variable, j: int) -> str:
    """A name-scope label for a variable's accumulation ops."""
    name = getattr(variable, "path", None) or getattr(variable, "name", "") or f"var{j}"
    name = re.sub(r":\d+$", "", str(name))
    return re.sub(r"[^A-Za-z0-9_.\-/]", "_", name).strip("/") or f"var{j}"


def accumulate(parts: list, name: str):
    """Sum one variable's per-slice gradients under ``accumulate/<name>/``.

    Dense gradients are added in a chain (slice ``k`` joins the running sum
    as soon as it is done); ``IndexedSlices`` are concatenated (rows and
    indices), which the optimizer sums per row as for one batch; a slice
    without a gradient (None) is left out; all None gives None.
    """
    import tensorflow as tf

    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    with tf.name_scope(f"accumulate/{name}/"):
        if all(isinstance(p, tf.IndexedSlices) for p in parts):
            return tf.IndexedSlices(tf.concat([p.values for p in parts], 0, name="values"),
                                    tf.concat([p.indices for p in parts], 0, name="indices"),
                                    parts[0].dense_shape)
        parts = [tf.convert_to_tensor(p) for p in parts]  # sparse and dense mixed: add densely
        total = parts[0]
        for k, p in enumerate(parts[1:], start=1):
            total = tf.add(total, p, name=f"add_{k}")
        return total


def whole_gradient(inputs: list, output_grads: list, name: str):
    """One ``MatMul`` over every slice: ``concat(inputs)^T concat(output_grads)``
    under ``whole/<name>/`` (a ``Dense`` kernel's gradient, not summed)."""
    import tensorflow as tf

    with tf.name_scope(f"whole/{name}/"):
        x = tf.concat(inputs, 0, name="inputs")
        dy = tf.concat(output_grads, 0, name="output_grads")
        return tf.linalg.matmul(x, dy, transpose_a=True, name="MatMul")


def _backend(variable):
    """The framework variable behind a Keras 3 variable (its ``value``), else ``variable``."""
    value = getattr(variable, "value", variable)
    return variable if callable(value) else value


class _DenseRecorder:
    """While entered (:meth:`on` a tape), each of ``layers`` (Keras ``Dense``)
    computes ``x W`` itself and records ``(x, x W)`` (both 2-D) for its whole
    weight gradient. The tape watches ``x W`` and not the kernel through it
    (``stop_gradient``), so the slice's backward pass builds no kernel
    gradient of its own."""

    def __init__(self, layers):
        self.layers = list(layers)
        for layer in self.layers:
            if not all(hasattr(layer, a) for a in ("kernel", "units", "use_bias", "activation")):
                raise TypeError(f"LossStep(whole=...) takes Keras Dense layers; {layer!r} is not one")
        self.seen: dict[int, tuple] = {}
        self.tape = None

    def on(self, tape) -> "_DenseRecorder":
        self.tape = tape
        return self

    def __enter__(self):
        self.seen = {}
        for layer in self.layers:
            layer.call = self._call(layer)
        return self

    def __exit__(self, *exc):
        for layer in self.layers:
            del layer.call
        missing = [layer.name for layer in self.layers if id(layer) not in self.seen]
        if missing and exc[0] is None:
            raise ValueError(f"LossStep(whole=...): layers not called by the loss: {missing}")

    def _call(self, layer):
        import tensorflow as tf

        def call(inputs, *args, **kwargs):
            if id(layer) in self.seen:
                raise ValueError(f"LossStep(whole=...): layer {layer.name!r} is called twice in one slice "
                                 "(a shared layer's inputs cannot be concatenated once)")
            x = tf.reshape(inputs, [-1, inputs.shape[-1]])
            y = tf.linalg.matmul(x, tf.stop_gradient(layer.kernel))
            self.tape.watch(y)
            self.seen[id(layer)] = (x, y)
            z = tf.reshape(y, tf.concat([tf.shape(inputs)[:-1], [layer.units]], 0))
            if layer.use_bias:
                z = tf.nn.bias_add(z, layer.bias)
            return z if layer.activation is None else layer.activation(z)

        return call


def split_graph_step(per_slice, inputs, micro_batches: int, variables):
    """The split step's loss and summed gradients (graph building).

    Parameters
    ----------
    per_slice : callable(i, slice_inputs) -> (scaled loss, gradients)
        Builds slice ``i`` (under ``mb<i>/``) and its gradients for the
        variables (see :func:`LossStep` and :func:`tf_patch.zoo.common.model_step`).
    inputs : the full-batch input tensors (split by :func:`split_inputs`)
    micro_batches : M >= 2
    variables : callable() -> list of variables, read after slice 0 is
        built (a model's variables may be created by its first call)

    Returns
    -------
    (loss, [(summed gradient, variable), ...])
    """
    import tensorflow as tf

    losses, grads = [], []
    for i, args in enumerate(split_inputs(inputs, micro_batches)):
        loss, g = per_slice(i, args)
        losses.append(loss)
        grads.append(list(g))
    vs = list(variables())
    with tf.name_scope("microbatch/"):
        total = losses[0]
        for k, part in enumerate(losses[1:], start=1):
            total = tf.add(total, part, name="loss" if k == len(losses) - 1 else f"loss_sum_{k}")
    summed = [accumulate([g[j] for g in grads], _label(v, j)) for j, v in enumerate(vs)]
    return total, list(zip(summed, vs))


class LossStep:
    """A training step given by its loss, which can be micro-batched.

    ``loss_fn(*batch)`` returns the scalar **mean** loss of a batch (it
    builds the forward pass); the step computes its gradients for
    ``variables`` and applies ``optimizer`` once. With ``micro_batches=M``
    the batch arguments are split into ``M`` slices (see the module
    docstring); ``M = 1`` is the usual step. Call it, or give it to
    :func:`tf_patch.function_step` (a ``tf.function`` step that applies its
    optimizer inside cannot be split: its update would run once per slice).

    Parameters
    ----------
    loss_fn : callable(*batch) -> scalar tensor
    variables : list of variables, or a callable returning them (read when
        the step is traced: a Keras model creates its variables on first call)
    optimizer : a Keras optimizer (``apply_gradients``)
    micro_batches : int
    batched : indices of the arguments that are batches (split along axis 0);
        default: all of them. The others are given whole to every slice.
    whole : Keras ``Dense`` layers whose kernel gradient runs once over all
        slices (``whole/<variable>/``, module doc) instead of being summed;
        each must be called once by ``loss_fn``. Ignored when ``M = 1``.
    joinable : Keras ``Dense`` layers a plan may join (:meth:`with_whole`
        picks ``whole`` among them by their kernels: a plan's
        ``weight_grads="whole"`` ops, :attr:`pesto.solvelog.SolveLog.joined`);
        :func:`tf_patch.keras_step` gives the model's.

    Examples
    --------
    >>> step = LossStep(lambda x, y: tf.reduce_mean((model(x) - y) ** 2),   # doctest: +SKIP
    ...                 lambda: model.trainable_variables, opt, micro_batches=4)
    >>> tf_patch.function_step(step, x, y)                                  # doctest: +SKIP
    """

    def __init__(self, loss_fn, variables, optimizer, *, micro_batches: int = 1, batched=None, whole=(),
                 joinable=()):
        self.loss_fn, self.optimizer = loss_fn, optimizer
        self._variables = variables
        self.micro_batches = check_micro_batches(None, micro_batches)
        self.batched = None if batched is None else tuple(batched)
        self.whole = tuple(whole)
        self.joinable = tuple(joinable)
        self._fn = None
        self.__name__ = getattr(loss_fn, "__name__", "step")

    def variables(self) -> list:
        """The variables the step trains."""
        return list(self._variables() if callable(self._variables) else self._variables)

    def with_micro_batches(self, micro_batches: int) -> "LossStep":
        """The same step cut into ``micro_batches`` slices (itself when equal)."""
        if micro_batches == self.micro_batches:
            return self
        return LossStep(self.loss_fn, self._variables, self.optimizer, micro_batches=micro_batches,
                        batched=self.batched, whole=self.whole, joinable=self.joinable)

    def with_whole(self, kernels) -> "LossStep":
        """The same step whose ``whole`` layers are the :attr:`joinable` ones of
        ``kernels`` (variables); itself when they already are.

        Raises
        ------
        ValueError
            A kernel of no joinable layer (the plan joined a weight gradient
            this step cannot build once over every slice), named.
        """
        ids = {id(_backend(k)) for k in kernels}
        layers = tuple(layer for layer in self.joinable if id(_backend(layer.kernel)) in ids)
        missing = ids - {id(_backend(layer.kernel)) for layer in layers}
        if missing:
            names = [getattr(k, "path", getattr(k, "name", "?")) for k in kernels if id(_backend(k)) in missing]
            raise ValueError(f"the plan runs the gradient of {names} once over every slice, but no Keras Dense layer "
                             f"of this step (LossStep(joinable=...)) has that kernel: TensorFlow cannot build it")
        if [id(x) for x in layers] == [id(x) for x in self.whole]:
            return self
        return LossStep(self.loss_fn, self._variables, self.optimizer, micro_batches=self.micro_batches,
                        batched=self.batched, whole=layers, joinable=self.joinable)

    def split_args(self, args) -> list[int]:
        """Indices of the batch arguments among ``args``."""
        return list(range(len(args))) if self.batched is None else [k for k in self.batched if k < len(args)]

    def check(self, args) -> int | None:
        """The batch size of ``args``, checked against :attr:`micro_batches`
        (None, unchecked, when the step is not split)."""
        if self.micro_batches == 1:
            return None
        b = batch_size([args[k] for k in self.split_args(args)])
        check_micro_batches(b, self.micro_batches)
        return b

    def function(self):
        """The step as a ``tf.function`` (built once)."""
        import tensorflow as tf

        if self._fn is None:
            self._fn = tf.function(self._step)
        return self._fn

    def get_concrete_function(self, *args):
        self.check(args)
        return self.function().get_concrete_function(*args)

    def __call__(self, *args):
        self.check(args)
        return self.function()(*args)

    def _step(self, *args):
        import tensorflow as tf

        if self.micro_batches == 1:
            with tf.GradientTape() as tape:
                loss = self.loss_fn(*args)
            vs = self.variables()
            pairs = list(zip(tape.gradient(loss, vs), vs))
        else:
            loss, pairs = self._split(args)
        self.optimizer.apply_gradients(pairs)
        return loss

    def _split(self, args):
        import tensorflow as tf

        m, idx = self.micro_batches, self.split_args(args)
        rec = _DenseRecorder(self.whole)
        seen: list[dict] = []     # per slice: layer id -> (x, dy)

        def per_slice(i, parts):
            full = list(args)
            for k, part in zip(idx, parts):
                full[k] = part
            with tf.name_scope(f"mb{i}"):
                with tf.GradientTape() as tape:
                    with rec.on(tape):
                        loss = tf.multiply(self.loss_fn(*full), 1.0 / m, name="scaled_loss")
                vs = self.variables()
                kernels = {id(layer.kernel) for layer in rec.layers}
                rest = [v for v in vs if id(v) not in kernels]
                ys = [rec.seen[id(layer)][1] for layer in rec.layers]
                grads = tape.gradient(loss, rest + ys)
                seen.append({id(layer): (rec.seen[id(layer)][0], g)
                             for layer, g in zip(rec.layers, grads[len(rest):])})
                of = dict(zip((id(v) for v in rest), grads))
                return loss, [of.get(id(v)) for v in vs]

        loss, pairs = split_graph_step(per_slice, [args[k] for k in idx], m, self.variables)
        kernel = {id(layer.kernel): layer for layer in rec.layers}
        return loss, [(whole_gradient([s[id(kernel[id(v)])][0] for s in seen],
                                      [s[id(kernel[id(v)])][1] for s in seen], _label(v, j)), v)
                      if id(v) in kernel else (g, v) for j, (g, v) in enumerate(pairs)]


def split_step(fn, micro_batches, args):
    """``fn`` as a step of ``micro_batches`` slices, checked against ``args``
    (what :func:`tf_patch.function_step` does with ``micro_batches``).

    Raises
    ------
    TypeError
        ``micro_batches != 1`` and ``fn`` is not a :class:`LossStep`.
    MicroBatchError
        A bad ``micro_batches`` or one that does not divide the batch.
    """
    m = check_micro_batches(None, micro_batches)
    if isinstance(fn, LossStep):
        fn = fn.with_micro_batches(m)
        fn.check(args)
        return fn
    if m == 1:
        return fn
    raise TypeError(f"micro_batches={m} needs the step as its loss: pass tf_patch.LossStep(loss_fn, variables, "
                    f"optimizer) instead of {getattr(fn, '__name__', type(fn).__name__)!r} (a step that applies "
                    "its optimizer inside cannot be split: its update would run once per slice)")
