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
  usual ``GradientTape`` training step;
* :func:`function_step` / :func:`keras_step` -- a :class:`FunctionStep`:
  ``.graph`` (the OpGraph), ``.run(steps)`` (train, returns the losses),
  ``.apply(plan)`` (devices and the plan's order enforced; any
  ``pesto.solve_step`` result too: split or replicated, the step is traced
  again as TF must run it), ``.check()``
  (a traced step compared with the plan).

How a step runs placed: its traced graph is rebuilt as a ``tf.compat.v1``
graph in which every captured variable becomes a real variable handle of the
same name, initialised from the Python variable's value; devices and control
dependencies are then set on that graph exactly as for any v1 graph
(:func:`tf_patch.apply_plan`). The Python variables are not updated: read
the trained values with :meth:`FunctionStep.values`.

Examples
--------
>>> import tensorflow as tf                                          # doctest: +SKIP
>>> model = tf.keras.applications.MobileNetV2(weights=None)          # doctest: +SKIP
>>> g, prof = keras_opgraph(model, "sparse_categorical_crossentropy", "sgd", x, y)  # doctest: +SKIP
>>> plan = pesto.solve(g, gpus=2)                                    # doctest: +SKIP
"""
from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType, SimpleNamespace

from . import needs_tf  # noqa: F401  (an ImportError naming the tf extra without TensorFlow)
from pesto.cluster import gpus, logical_cpus

from .apply import apply_plan
from .devices import detect, session_config
from .extract import allowed_kinds, extract, shape_tensor_bytes, step_ops, unsized_tensors
from .microstep import LossStep, _backend, _label, split_step
from .workflow import trace_check
from .profile import estimate, measure
from .recompute import carried_graph, recompute_graph, with_copies
from .replicastep import (mapped_plan, one_replica, pesto_buckets, replica_map, replica_zero, replicate_graph,
                          replicated_plan, shard_level, unshard)
from .slicemap import RECOMPUTE, SliceMap, place_split, recomputed_op, recomputes, result_view, slice_map

__all__ = ["function_opgraph", "keras_opgraph", "train_step", "keras_loss_step", "function_step", "keras_step",
           "FunctionStep"]


def _concrete(fn, args):
    import tensorflow as tf

    if not hasattr(fn, "get_concrete_function"):
        fn = tf.function(fn)
    return fn.get_concrete_function(*args)


def captured_variables(concrete) -> dict:
    """Captured placeholder name -> the Python variable behind it."""
    by_handle = {id(v.handle): v for v in concrete.graph.variables}
    return {internal.op.name: by_handle[id(ext)] for ext, internal in concrete.graph.captures
            if id(ext) in by_handle}


def variable_sizes(concrete) -> dict[str, int]:
    """Captured placeholder name -> bytes of the variable behind it."""
    import tensorflow as tf

    return {name: int(v.shape.num_elements() * tf.as_dtype(v.dtype).size)
            for name, v in captured_variables(concrete).items() if v.shape.is_fully_defined()}


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
    return _traced_opgraph(_concrete(fn, args), gpu=gpu, overhead=overhead, progress=progress,
                           name=name or getattr(fn, "__name__", "step"), on_unknown=on_unknown,
                           tensor_sizes=tensor_sizes)


def _traced_opgraph(concrete, *, gpu, overhead, progress, name, on_unknown, tensor_sizes, measured=None):
    """Grappler's estimate for ``gpu`` gives output sizes (and, without
    ``measured``, the costs); with ``measured`` (a Profile of this machine)
    op costs are its times, kind "CPU"."""
    graph = concrete.graph
    fetches = list(concrete.outputs) + list(graph.control_outputs)
    sizes = variable_sizes(concrete)
    cpu_ops = [op.name for op in step_ops(graph, fetches) if "GPU" not in allowed_kinds(op.type, "GPU")]
    prof = estimate(graph, fetches, gpu, cpu_ops=cpu_ops, overhead=overhead, progress=progress)
    memory = {k: {"output_bytes": v["output_bytes"]} for k, v in prof.memory.items() if v.get("output_bytes")}
    for op, b in sizes.items():
        memory[op] = {**memory.get(op, {}), "persistent_bytes": b}
    if measured is not None:
        og = extract(graph, fetches, costs=measured.costs, kind="CPU", memory=memory, name=name,
                     on_unknown=on_unknown, tensor_sizes=tensor_sizes)
        return og, measured
    og = extract(graph, fetches, costs=prof.costs, cpu_costs=prof.cpu_costs, kind="GPU", memory=memory,
                 name=name, on_unknown=on_unknown, tensor_sizes=tensor_sizes)
    return og, prof


def train_step(model, loss, optimizer, micro_batches: int = 1):
    """The usual Keras training step as a ``tf.function``: forward, loss,
    gradients, one optimizer update; returns the loss. With
    ``micro_batches`` > 1 the same step split into that many slices of the
    batch (a :class:`tf_patch.microstep.LossStep`)."""
    import tensorflow as tf

    loss_fn = tf.keras.losses.get(loss)
    opt = tf.keras.optimizers.get(optimizer)
    if micro_batches != 1:
        return keras_loss_step(model, loss_fn, opt).with_micro_batches(micro_batches)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            value = tf.reduce_mean(loss_fn(y, model(x, training=True)))
        grads = tape.gradient(value, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return value

    return step


def keras_loss_step(model, loss, optimizer) -> LossStep:
    """The usual Keras training step as a :class:`tf_patch.LossStep` (the mean
    loss of a batch; split or replicated by :meth:`LossStep.with_micro_batches`; its
    Dense layers joinable, :meth:`LossStep.with_whole`)."""
    import tensorflow as tf

    loss_fn = tf.keras.losses.get(loss)
    dense = [layer for layer in model._flatten_layers() if isinstance(layer, tf.keras.layers.Dense)]
    return LossStep(lambda x, y: tf.reduce_mean(loss_fn(y, model(x, training=True))),
                    lambda: model.trainable_variables, tf.keras.optimizers.get(optimizer), joinable=dense)


def keras_opgraph(model, loss, optimizer, x, y, *, gpu: str = "v100", name: str | None = None, **options):
    """``(OpGraph, Profile)`` of one Keras training step on the batch ``(x, y)``
    (:func:`train_step`, then :func:`function_opgraph`; ``options`` go there)."""
    step = train_step(model, loss, optimizer)
    return function_opgraph(step, x, y, gpu=gpu, name=name or getattr(model, "name", "keras"), **options)


def _rebuild(concrete, args):
    """The traced step as a tf.compat.v1 graph: captured variables become
    ``VarHandleOp`` s of the same names, with assign ops fed from values."""
    import numpy as np
    import tensorflow as tf

    variables = captured_variables(concrete)
    gd = concrete.graph.as_graph_def()
    for node in gd.node:
        v = variables.get(node.name)
        if v is None:
            continue
        node.op = "VarHandleOp"
        del node.input[:]
        node.attr.clear()
        node.attr["dtype"].type = tf.as_dtype(v.dtype).as_datatype_enum
        node.attr["shape"].shape.CopyFrom(tf.TensorShape(v.shape).as_proto())
        node.attr["shared_name"].s = node.name.encode()
        node.attr["container"].s = b""
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(gd, name="")
        init, reads = {}, {}
        with tf.name_scope("pesto_init"):
            for name, v in variables.items():
                h = graph.get_tensor_by_name(name + ":0")
                ph = tf.compat.v1.placeholder(tf.as_dtype(v.dtype), v.shape)
                init[name] = (ph.name, tf.raw_ops.AssignVariableOp(resource=h, value=ph).name)
                reads[name] = tf.raw_ops.ReadVariableOp(resource=h, dtype=tf.as_dtype(v.dtype)).name
    inputs = [t.name for t in concrete.inputs[:len(concrete.inputs) - len(concrete.graph.captures)]]
    feed = {n: np.asarray(a) for n, a in zip(inputs, args)}
    values = {name: np.asarray(v.numpy()) for name, v in variables.items()}
    return graph, feed, init, reads, values


class FunctionStep:
    """A traced training step that trains, takes a plan, and reports.

    Build it with :func:`function_step` or :func:`keras_step`.

    Attributes
    ----------
    graph : OpGraph
        What Pesto places: full static shapes, variables as persistent
        memory at their real size, TF's colocation groups.
    profile : Profile
        Grappler's cost estimate behind ``graph``.
    tf_graph : tf.Graph
        The runnable v1 copy of the step (see the module docstring).
    n_devices : int
        Devices the step runs on (real GPUs if there are that many, else
        logical CPU devices).
    note : str
        How plan devices were mapped onto this machine, and how many of the
        plan's order edges are enforced (after :meth:`apply`).
    unsized : list of str
        Tensors of the step with no size from their static shape nor from
        the shape-vector bound (:func:`tf_patch.extract.shape_tensor_bytes`);
        should be empty, extraction refuses more than 1 %.
    micro_batches, replicas : int
        The slices the TF step runs in and the replicas they form (after
        :meth:`apply` of a replicated plan: ``R x M`` slices, ``R`` replicas).
    mapping : SliceMap or ReplicaMap or None
        How the last plan :meth:`apply` carried was mapped onto the TF step.
    recomputed : Recomputed or None
        After :meth:`apply` of a plan with recomputation: the TF copies
        (:func:`tf_patch.recompute.recompute_graph`) :attr:`tf_graph` runs.
    placed : SplitPlacement or None
        After :meth:`apply` of a micro-batched result: the plan solved on the
        traced split step (``placed.plan.makespan`` its predicted step),
        the mapped hint it started from, and Pesto's own figure.
    """

    def __init__(self, concrete, args, *, costs: str = "v100", name: str = "step", n_devices: int = 2,
                 on_unknown: str = "raise", steps: int = 5, warmup: int = 2, source: LossStep | None = None):
        self.tf_graph, self.feed, self._init, self._reads, self._values = _rebuild(concrete, args)
        self._initial = dict(self._values)
        self._captured = captured_variables(concrete)
        self._args, self._source = args, source
        self._options = dict(name=name, n_devices=n_devices, on_unknown=on_unknown, costs=costs, steps=steps,
                             warmup=warmup)
        self.micro_batches = source.micro_batches if source is not None else 1
        self.replicas, self.mapping, self.placed, self.recomputed = 1, None, None, None
        self._pieces: dict = {}   # replicated with ZeRO: piece variable -> (the split step's handle, start, stop)
        fetches = list(concrete.outputs) + list(concrete.graph.control_outputs)
        self.loss = concrete.outputs[0].name if concrete.outputs else None
        self.updates = [op.name for op in concrete.graph.control_outputs]
        measured = self._measure(steps, warmup) if costs == "measured" else None
        self.graph, self.profile = _traced_opgraph(concrete, gpu="v100" if measured else costs, overhead=0.0,
                                                   progress=False, name=name, on_unknown=on_unknown,
                                                   tensor_sizes=None, measured=measured)
        ops = step_ops(concrete.graph, fetches)
        names = {op.name for op in ops}
        self.unsized = unsized_tensors(ops, names, shape_tensor_bytes(ops, names))
        self.n_devices, self.plan, self.applied, self.note = n_devices, None, None, ""
        self._sess = None
        self._unsplit = self.graph if self.micro_batches == 1 else None

    def _initialise(self, sess) -> None:
        feed = {ph: self._values[n] for n, (ph, _) in self._init.items()}
        sess.run([op for _, op in self._init.values()], feed)

    def _measure(self, steps: int, warmup: int):
        """Profile of ``steps`` traced steps on one device and one thread
        (each kernel timed alone, as :func:`tf_patch.model_opgraph` does), in a
        session of its own: the step's variables are left as they were."""
        import tensorflow as tf

        sess = tf.compat.v1.Session(graph=self.tf_graph, config=session_config(1, inter_op=1))
        try:
            self._initialise(sess)
            return measure(graph=self.tf_graph, fetches=self._fetches(), feed_fn=lambda s: self.feed,
                           session=sess, steps=steps, warmup=warmup, progress=False)
        finally:
            sess.close()

    def _fetches(self) -> list:
        return ([self.loss] if self.loss else []) + self.updates

    def _session(self):
        import tensorflow as tf

        if self._sess is None:
            self._sess = tf.compat.v1.Session(graph=self.tf_graph,
                                              config=session_config(self.n_devices, kind=detect(self.n_devices)[0]))
            self._initialise(self._sess)
        return self._sess

    def run(self, steps: int = 1) -> list[float]:
        """Train ``steps`` steps on the example batch; the losses."""
        sess, out = self._session(), []
        for _ in range(steps):
            res = sess.run(self._fetches(), self.feed)
            out.append(float(res[0]) if self.loss else float("nan"))
        return out

    def reset(self) -> None:
        """Back to the initial variable values (those of the model when the
        step was traced); the plan stays applied."""
        self.close()
        self._values = dict(self._initial)

    def values(self) -> dict:
        """Current variable values, by captured name (numpy arrays). After a sharded
        (ZeRO) plan, an optimizer slot is only the replicas' piece variables
        (``allreduce/<k>/r<r>/<variable>/slot_<q>``), and under ZeRO-3 a weight too
        (``.../param``); the next plan :meth:`apply` carries starts from them joined
        (:func:`tf_patch.replicastep.unshard`, which joins them whole)."""
        if self._sess is None:
            return dict(self._values)
        return dict(zip(self._reads, self._sess.run(list(self._reads.values()))))

    def apply(self, plan, *, cluster=None, time_limit: float = 10.0, seed: int = 0):
        """Place the step: ``plan``'s devices and order on :attr:`tf_graph`.

        ``plan`` is a plan of this step, or anything ``pesto.solve_step``
        returns (read by :func:`tf_patch.slicemap.result_view`): the un-split
        step's plan as it is; a micro-batched or replicated plan is carried
        onto the step TensorFlow runs for it, traced again (from the step's
        loss: :func:`keras_step`, or a :class:`tf_patch.LossStep`) split into
        ``M`` slices, or into ``R x M`` slices whose replicas get their own
        variables and the plan's ring all-reduces (:mod:`tf_patch.replicastep`);
        a plan that recomputes activations gets its copies built on that step
        (:mod:`tf_patch.recompute`, :attr:`recomputed`);
        :attr:`mapping` says what was mapped. A micro-batched plan is not
        merely mapped: the traced split step (its ops costed at the micro-batch
        size, as this step's ``costs`` say; the Dense kernels' gradients the
        plan joins, ``ResultView.joined``, built once over every slice:
        :meth:`LossStep.with_whole`) is solved on ``cluster`` within
        ``time_limit`` seconds, Pesto's plan mapped onto it as the hint
        (:func:`tf_patch.slicemap.place_split`), and that plan, over every op
        TF runs, is enforced 1:1; :attr:`placed` has it. ``cluster``: the one
        the result was solved on (default ``pesto.gpus(k)`` or
        ``pesto.logical_cpus(k)`` by the graph's op kind, ``k`` the plan's devices).
        Plan devices are mapped onto this machine: ``/GPU:k`` stays when
        there are enough GPUs, else it becomes logical CPU device ``/CPU:k``
        (after ``/CPU:0`` when the plan uses that too); :attr:`note` says
        which. Training goes on from the current values. Returns what
        :func:`tf_patch.apply_plan` did.

        Raises
        ------
        ValueError
            A split or replicated plan for a step given as a whole
            ``tf.function`` (it cannot be traced again split), or a
            micro-batched plan for a step not traced un-split first, or one that
            runs a weight gradient whole that no Keras Dense layer of the step
            (``LossStep(joinable=...)``) has (:meth:`LossStep.with_whole`).
        """
        self._values = self.values()
        self.close()
        if hasattr(plan, "graph_kind"):
            plan = self._carry(result_view(plan), cluster, time_limit, seed)
        self.applied = apply_plan(self.tf_graph, plan, n_devices=self.n_devices)
        self.plan, self.note, self.n_devices = self.applied.plan, self.applied.note, self.applied.n_devices
        return self.applied

    def _carry(self, result, cluster, time_limit, seed):
        """The plan of the TF step that runs ``result`` (a ResultView, :meth:`apply`);
        this step re-traced and rebuilt for it first when it needs other slices
        (or when it is replicated already: the rebuild starts from its split step)."""
        kind, m, r = result.graph_kind, result.micro_batches, result.replicas
        plan, names = result.plan, result.graph.names
        if kind == "replicated" and r == 1:   # one replica: the step itself (split in M)
            plan, names = one_replica(plan, names)
            kind = "micro-batched" if m > 1 else "step"
        slices = {"replicated": r * m, "micro-batched": m}.get(kind, 1)
        kernels = self._kernels(result.joined) if kind == "micro-batched" else []
        if (slices != self.micro_batches or self.replicas > 1 or self.recomputed is not None
                or self._whole_ids() != sorted(id(_backend(k)) for k in kernels)):
            self._retrace(slices, kernels)
        if kind == "replicated":
            return self._replicate(result)
        if kind == "micro-batched":
            if self._unsplit is None:
                raise ValueError("a micro-batched plan maps Pesto's split of the un-split step onto TF's: build "
                                 "this step un-split (micro_batches=1), solve its graph, then apply the result")
            if recomputes(result.origin):
                self._recompute(result.graph, slice_map(self._unsplit, result.origin, self.graph, m).ops)
            cluster = _plan_cluster(plan, self.graph) if cluster is None else cluster
            mine = replace(result, plan=plan, graph=SimpleNamespace(names=names), replicas=1, graph_kind=kind)
            whole = {op: f"whole/{_label(k, 0)}/MatMul" for op, k in zip(result.joined, kernels)}
            self.placed = place_split(mine, self._unsplit, self.graph, cluster, time_limit=time_limit, seed=seed,
                                      whole=whole)
            self.mapping = self.placed.slices
            return self.placed.plan
        if recomputes(result.origin):
            self._recompute(result.graph, {n: (n,) for n in plan.placement if n in self.graph})
        if all(n in self.graph for n in plan.placement):
            return plan
        # traced again: the names the trace gives anew (a Keras optimizer's scope) are placed by a neighbour;
        # a recomputed copy op@rc is TF's recompute/op
        kept = {n: (t,) for n in plan.placement
                if (t := n if recomputed_op(n) is None else RECOMPUTE + recomputed_op(n)) in self.graph}
        self.mapping = SliceMap(1, MappingProxyType(kept), tuple(n for n in self.graph.names if n not in kept),
                                tuple(n for n in plan.placement if n not in kept))
        return mapped_plan(plan, self.mapping, self.graph)

    def _recompute(self, pesto_graph, op_map) -> None:
        """This step's TF graph with the recomputed copies of the plan's graph
        (:func:`tf_patch.recompute.recompute_graph`; ``op_map``: its other ops
        on this step), and its OpGraph costed as before, each copy as its original."""
        self.recomputed = recompute_graph(self.tf_graph, pesto_graph, op_map)
        self.graph = carried_graph(self.recomputed.graph, self._fetches(), self.graph, self.recomputed.copies)
        self.tf_graph = self.recomputed.graph

    def _replicate(self, result):
        """This split step rebuilt as ``result``'s replicas; the plan of it."""
        fetches = self._fetches()
        buckets, _ = pesto_buckets(result.graph, self.tf_graph, fetches, result.origin)
        rg = replicate_graph(self.tf_graph, fetches, result.replicas, result.micro_batches, values=self._values,
                             buckets=list(buckets.values()), shard_optimizer=shard_level(result.graph.names))
        self._initial, self._pieces = rg.copies(self._initial), dict(rg.pieces)
        self.tf_graph, self._init, self._reads, self._values = rg.graph, dict(rg.init), dict(rg.reads), dict(rg.values)
        self.loss, self.updates, self.replicas = rg.loss, list(rg.updates), result.replicas
        if recomputes(result.origin):   # the plan's copies on the replicated step, then mapped as the rest
            before = extract(rg.graph, self._fetches(), on_unknown="ignore")
            rmap = replica_map(result.graph.names, rg, buckets, before.names, origin=result.origin)
            self.recomputed = recompute_graph(rg.graph, result.graph, rmap.ops)
            self.tf_graph = self.recomputed.graph
            self.graph = extract(self.tf_graph, self._fetches(), on_unknown="ignore")
            self.mapping = with_copies(rmap, result.graph.names, self.graph.names)
            return mapped_plan(result.plan, self.mapping, self.graph)
        plan, self.mapping = replicated_plan(result, rg, buckets)
        self.graph = extract(rg.graph, self._fetches(), on_unknown="ignore")
        return plan

    def _whole_ids(self) -> list:
        """Ids of the kernels whose gradient this step runs once over every slice, sorted."""
        return (sorted(id(_backend(layer.kernel)) for layer in getattr(self._source, "whole", ()))
                if self.micro_batches > 1 else [])

    def _kernels(self, joined) -> list:
        """The variables (kernels) whose gradients are the un-split step's ops
        ``joined`` (a plan's ``weight_grads="whole"`` ops): the captured
        variable each one's anchor (its forward ``MatMul``) reads."""
        g, out = self._unsplit, []
        for op in joined:
            v = _read_variable(g, g.op(op).anchor, self._captured) if g is not None and op in g else None
            if v is None:
                raise ValueError(f"the plan runs weight gradient {op!r} once over every slice, but this step's "
                                 f"un-split graph names no variable its forward MatMul reads")
            out.append(v)
        return out

    def _retrace(self, slices: int, kernels=()) -> None:
        """This step traced again in ``slices`` slices (grappler's costs), from
        the current values; the gradients of ``kernels`` run whole (:meth:`LossStep.with_whole`)."""
        import numpy as np

        if self._source is None:
            raise ValueError(f"this step was given as a whole tf.function: it cannot be traced again in {slices} "
                             "slices for a split or replicated plan; build it with tf_patch.keras_step or from a "
                             "tf_patch.LossStep")
        fn = self._source.with_micro_batches(slices).with_whole(kernels)
        fn.check(self._args)
        other = FunctionStep(_concrete(fn, self._args), self._args, source=fn, **self._options)
        # replicated: replica 0's values; sharded (ZeRO), the variables and slots joined from their pieces
        values, initial = ({**replica_zero(x), **unshard(x, self._pieces)} for x in (self._values, self._initial))
        now = {id(v): values[n] for n, v in self._captured.items() if n in values}
        first = {id(v): initial[n] for n, v in self._captured.items() if n in initial}
        for n, v in other._captured.items():
            shape = np.shape(other._values[n])
            other._values[n] = np.reshape(now.get(id(v), other._values[n]), shape)
            other._initial[n] = np.reshape(first.get(id(v), other._initial[n]), shape)
        unsplit = self._unsplit
        self.__dict__.update(other.__dict__)
        self._unsplit = unsplit

    def check(self) -> dict:
        """One traced training step compared with the applied plan.

        Returns
        -------
        dict
            :func:`tf_patch.workflow.trace_check`'s: ``misplaced`` ops,
            ``order_violations`` among every control edge added (an op oneDNN
            fused into another is checked under the fused kernel's name),
            ``checked_edges`` (all of them, when every op ran), ``left_out``
            (the plan's order edges not enforced: ``self.applied.left_out``
            says which and why). It trains that step too.
        """
        import tensorflow as tf

        md = tf.compat.v1.RunMetadata()
        opts = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        self._session().run(self._fetches(), self.feed, options=opts, run_metadata=md)
        return trace_check(md, self.plan, self.applied)

    def close(self) -> None:
        if self._sess is not None:
            self._sess.close()
            self._sess = None


def _read_variable(graph, op, captured):
    """The captured variable op ``op`` reads through once-per-step ops (a weight's
    ``ReadVariableOp`` and its resource), or None."""
    todo, seen = [op] if op in graph else [], set()
    while todo:
        for u in graph.predecessors(todo.pop()):
            for name in (u, f"{u}/resource"):
                if name in captured:
                    return captured[name]
            if u not in seen and graph.op(u).batch is False:
                seen.add(u)
                todo.append(u)
    return None


def _plan_cluster(plan, graph):
    """The default cluster for re-solving a split step: ``k`` devices of the
    graph's op kind, ``k`` the highest device index the plan uses plus one.

    >>> from pesto.graph import OpGraph
    >>> from pesto.plan import Plan
    >>> _plan_cluster(Plan({"a": "/GPU:0", "b": "/GPU:2"}, {}), OpGraph.from_edges({"a": 1, "b": 1}, [])).names
    ['/GPU:0', '/GPU:1', '/GPU:2']
    """
    k = 1 + max(int(d.rsplit(":", 1)[-1]) for d in plan.placement.values())
    return logical_cpus(k) if "CPU" in graph.kinds() and "GPU" not in graph.kinds() else gpus(k)


def function_step(fn, *args, costs: str = "v100", name: str | None = None, n_devices: int = 2,
                  on_unknown: str = "raise", steps: int = 5, warmup: int = 2,
                  micro_batches: int = 1, source: LossStep | None = None) -> FunctionStep:
    """A :class:`FunctionStep` of ``fn(*args)``.

    Parameters
    ----------
    fn : tf.function or Python function (traced with ``tf.function``); with
        ``micro_batches`` > 1 a :class:`tf_patch.LossStep`
    args : the example batch it trains on (tensors or arrays)
    costs : str
        A GPU name ("v100", "a100", "h100") for grappler's analytical costs
        (op kind "GPU": solve with ``gpus=k``), or "measured" for median times
        of ``steps`` traced steps (after ``warmup``) on this machine, one
        device and one thread (op kind "CPU": solve on
        ``pesto.logical_cpus(k)``).
    name : the OpGraph's name (default: the function's)
    n_devices : devices the step runs on (GPUs if there are that many, else
        logical CPU devices)
    on_unknown : {"raise", "warn", "ignore"}
        Tensors without a size: see :func:`tf_patch.extract.extract` (shape
        vectors are sized by :func:`tf_patch.extract.shape_tensor_bytes`).
    micro_batches : int
        The step split into that many slices of the batch
        (:mod:`tf_patch.microstep`; :func:`tf_patch.microstep.split_step`
        says what it refuses).
    source : LossStep, optional
        The same step as its loss, traced again when :meth:`FunctionStep.apply`
        gets a split or replicated plan (default: ``fn`` when it is a
        :class:`tf_patch.LossStep`; :func:`keras_step` gives it).

    Returns
    -------
    FunctionStep
    """
    fn = split_step(fn, micro_batches, args)
    source = source if source is not None else fn if isinstance(fn, LossStep) else None
    return FunctionStep(_concrete(fn, args), args, costs=costs, name=name or getattr(fn, "__name__", "step"),
                        n_devices=n_devices, on_unknown=on_unknown, steps=steps, warmup=warmup, source=source)


def keras_step(model, loss, optimizer, x, y, *, costs: str = "v100", name: str | None = None,
               n_devices: int = 2, on_unknown: str = "raise", steps: int = 5, warmup: int = 2,
               micro_batches: int = 1) -> FunctionStep:
    """A :class:`FunctionStep` of the usual Keras training step.

    Parameters
    ----------
    model : a built ``keras.Model`` (any layers: convolutions, attention, RNNs)
    loss, optimizer : anything ``keras.losses.get`` / ``keras.optimizers.get`` take
    x, y : the batch the step trains on
    costs, name, n_devices, on_unknown, steps, warmup, micro_batches : as in :func:`function_step`

    Returns
    -------
    FunctionStep
        Of :func:`train_step` (forward, loss, gradients, one update; split
        into ``micro_batches`` slices).
    """
    import tensorflow as tf

    optimizer = tf.keras.optimizers.get(optimizer)   # one optimizer for the step and its re-traces
    return function_step(train_step(model, loss, optimizer, micro_batches), x, y, costs=costs,
                         name=name or getattr(model, "name", "keras"), n_devices=n_devices, on_unknown=on_unknown,
                         steps=steps, warmup=warmup, micro_batches=micro_batches,
                         source=keras_loss_step(model, loss, optimizer).with_micro_batches(micro_batches))
