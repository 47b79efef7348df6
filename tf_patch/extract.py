"""tf.Graph / GraphDef + fetches -> :class:`pesto.OpGraph`.

Only ops that actually run in a step are kept: the ancestors of the fetches
(data and control inputs); initialisers, savers and summaries are left out.

* tensor bytes come from static shapes (an unknown leading dimension is the
  ``batch`` given); resource handles weigh nothing; a shape computation's
  integer vector of unknown length (``BroadcastGradientArgs``, ``Shape`` of a
  tensor of unknown rank...) is sized by :func:`shape_tensor_bytes`'s bound;
* colocation groups join (a) the ``_class = ["loc:@x"]`` attributes TF writes
  for ``colocate_with`` and (b) resource / reference edges: an op reading or
  updating a variable through its handle must sit with it (TF's placer
  refuses otherwise). A group is named after its variable. The colocation
  ``tf.gradients`` gives a gradient sum (:func:`aggregation_colocated`) is
  TensorFlow's placement default, not a constraint, and is left out;
* device kinds: ``kind`` for every op, except ops without a GPU kernel, which
  get ``"CPU"`` only (TF's kernel registry when it knows GPU kernels, else a
  list of well-known host-only ops);
* ``persistent_bytes`` for variables (weights and optimizer slots), from the
  variable's shape and dtype;
* scope = op name without its last component;
* ``batch``: whether the op runs once per slice of the batch, from static
  shapes (:func:`tf_patch.batchmarks.batch_marks` states the rule);
* ``phase``, ``anchor``, ``role``: from TensorFlow's gradient scopes and op
  types (:func:`tf_patch.marks.mark_phases` states the rule).
* ``view_bytes``: a variable's read shares the variable's buffer
  (:func:`tf_patch.marks.mark_views` states the rule).

Examples
--------
>>> import tensorflow as tf                           # doctest: +SKIP
>>> g = extract(model.graph, [model.train_op])        # doctest: +SKIP
"""
from __future__ import annotations

from . import needs_tf  # noqa: F401  (an ImportError naming the tf extra without TensorFlow)
from typing import Callable, Iterable, Mapping

from pesto.errors import InvalidGraphError
from pesto.graph import Edge, Op, OpGraph, Tensor

from .batchmarks import batch_marks
from .marks import GRADIENT_ROOT, mark_phases, mark_views

__all__ = ["extract", "step_ops", "colocation_groups", "aggregation_colocated", "class_attr", "SUM_AGGREGATION_TYPES",
           "tensor_bytes", "allowed_kinds", "HOST_ONLY", "MAX_UNKNOWN", "unsized_tensors", "shape_tensor_bytes",
           "MAX_SHAPE_ELEMENTS"]

# Ops with no GPU kernel in stock TensorFlow (strings, I/O, Python calls, host
# queues). Used when the installed TF has no GPU kernels to ask.
HOST_ONLY = frozenset({
    "SaveV2", "RestoreV2", "MergeV2Checkpoints", "ShardedFilename", "StringJoin",
    "AsString", "StringFormat", "PrintV2", "Print", "PyFunc", "EagerPyFunc", "PyFuncStateless",
    "DecodeRaw", "DecodeCSV", "ParseExample", "ParseExampleV2", "ParseSingleExample",
    "IteratorGetNext", "IteratorV2", "MakeIterator", "OneShotIterator", "QueueDequeueV2",
    "QueueDequeueManyV2", "QueueEnqueueV2", "FIFOQueueV2", "ReaderReadV2", "WriteFile", "ReadFile",
    "StringToHashBucketFast", "StringSplit", "StringSplitV2", "Substr", "RegexReplace",
    "ScalarSummary", "HistogramSummary", "MergeSummary", "WriteScalarSummary", "Assert",
    "HashTableV2", "LookupTableFindV2", "InitializeTableV2",
})
_VARIABLE_OPS = frozenset({"VarHandleOp", "VariableV2", "Variable", "VarHandleOpV2"})
#: Op types ``tf.gradients`` sums gradient contributions with (``add_n``; ``accumulate_n``).
SUM_AGGREGATION_TYPES = frozenset({"AddN", "AccumulateNV2"})


def step_ops(graph, fetches) -> list:
    """The ops run by ``session.run(fetches)``: ancestors of the fetch ops
    (``graph``: a tf.Graph or a GraphDef; fetches by name or object)."""
    graph = _as_graph(graph)
    seen, stack, out = set(), [_as_op(graph, f) for f in _flatten(fetches)], []
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        out.append(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return out


def tensor_bytes(tensor, batch: int | None = None) -> int:
    """Bytes of ``tensor`` from its static shape (0 if unknown or a handle)."""
    import tensorflow as tf

    dt = tensor.dtype.base_dtype
    if dt in (tf.resource, tf.variant, tf.string):
        return 0
    n = _static_elements(tensor, batch)
    return 0 if n is None else int(n * dt.size)


def aggregation_colocated(op) -> bool:
    """Whether ``op``'s ``_class`` is only the colocation ``tf.gradients``
    gives a gradient sum, which :func:`colocation_groups` does not bind.

    ``tf.gradients`` sums the contributions to one gradient with
    ``_MultiDeviceAddN``, which builds each ``add_n`` under
    ``_colocate_with_for_gradient(tensors[0].op, ignore_existing=True)``: the
    sum's ``_class`` is the colocation of its first summand's producer. For a
    residual stream that producer is the previous layer's sum, so the sums of
    every layer chain into one group: TensorFlow's placement default (put the
    sum where its first input is), not a constraint the model needs. The rule:
    ``op`` is of a type in :data:`SUM_AGGREGATION_TYPES`, the first component
    of its name is a gradient scope (:data:`tf_patch.marks.GRADIENT_ROOT`:
    ``gradients``, ``gradients_<n>``, ``gradient_tape``), it has a ``_class``
    with ``loc:@`` entries, and those entries are exactly the colocation groups
    of its first input's producer (``Operation.colocation_groups()``: its own
    ``loc:@`` entries, else ``loc:@<its name>``). A user's ``colocate_with``
    stays binding: on an op of another type, outside a gradient scope, or
    around a sum unless it names exactly the sum's first summand's producer
    (then it is what ``tf.gradients`` writes, and cannot be told apart).
    """
    if op.type not in SUM_AGGREGATION_TYPES or not op.inputs or not GRADIENT_ROOT.match(op.name.split("/", 1)[0]):
        return False
    locs = {x for x in class_attr(op) if x.startswith(b"loc:@")}
    return bool(locs) and locs == set(op.inputs[0].op.colocation_groups())


def class_attr(op) -> list[bytes]:
    """``op``'s ``_class`` attribute (``[]`` when it has none), as bytes."""
    try:
        return [x if isinstance(x, bytes) else x.encode() for x in op.get_attr("_class")]
    except ValueError:
        return []


def colocation_groups(ops) -> dict[str, str]:
    """Op name -> group name, for ops of ``ops`` that must share a device
    (groups of 2+ of them). A ``loc:@X`` joins its op to X's group even when X
    is not among ``ops`` (TensorFlow still puts the op with X, so two ops
    colocated with one outside variable share a device); the ``_class`` of a
    gradient sum that only repeats its first summand's colocation
    (:func:`aggregation_colocated`) joins nothing."""
    import tensorflow as tf

    parent: dict[str, str] = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a, b):
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    names = {op.name for op in ops}
    for op in ops:
        find(op.name)
        if not aggregation_colocated(op):
            for loc in class_attr(op):
                if loc.startswith(b"loc:@"):  # TF enforces it even when X itself does not run
                    union(op.name, loc[5:].decode())
        for t in op.inputs:
            if t.op.name in names and (t.dtype.base_dtype == tf.resource or t.dtype._is_ref_dtype):
                union(op.name, t.op.name)
    members: dict[str, list[str]] = {}
    for n in list(parent):
        members.setdefault(find(n), []).append(n)
    types = {op.name: op.type for op in ops}
    handles = {op.name for op in ops if op.type == "Placeholder" and op.outputs[0].dtype == tf.resource}
    out = {}
    for root, every in members.items():
        ms = [m for m in every if m in names]  # the members that run in the step
        if len(ms) < 2:
            continue
        var = sorted(m for m in every if types.get(m) in _VARIABLE_OPS or m in handles)
        anchors = sorted(set(every) - names)  # a loc:@X target that does not run: the group is X's
        label = f"coloc:{var[0] if var else anchors[0] if anchors else min(ms)}"
        for m in ms:
            out[m] = label
    return out


def allowed_kinds(op_type: str, kind: str = "GPU") -> frozenset:
    """``{kind}``, or ``{"CPU"}`` for an op with no GPU kernel."""
    if kind != "GPU":
        return frozenset({kind})
    return frozenset({"CPU"}) if not _has_gpu_kernel(op_type) else frozenset({"GPU"})


_KERNEL_CACHE: dict[str, bool] = {}


def _has_gpu_kernel(op_type: str) -> bool:
    if op_type in _KERNEL_CACHE:
        return _KERNEL_CACHE[op_type]
    ans = op_type not in HOST_ONLY
    try:
        import tensorflow as tf
        from tensorflow.python.framework import kernels

        if tf.config.list_physical_devices("GPU"):  # only a GPU build registers GPU kernels
            ks = kernels.get_registered_kernels_for_op(op_type).kernel
            ans = any(k.device_type == "GPU" for k in ks) or not ks
    except Exception:  # registry unavailable: keep the list's answer
        pass
    _KERNEL_CACHE[op_type] = ans
    return ans


def extract(graph, fetches, *, costs: Mapping[str, float] | None = None,
            cpu_costs: Mapping[str, float] | None = None, kind: str = "GPU",
            batch: int | None = None, name: str = "graph", default_cost: float = 0.0,
            memory: Mapping[str, Mapping[str, int]] | None = None,
            kinds_fn: Callable[[str, str], frozenset] | None = None,
            tensor_sizes: Mapping[str, int] | None = None, on_unknown: str = "raise") -> OpGraph:
    """Build the OpGraph of one step of ``graph`` running ``fetches``.

    Parameters
    ----------
    graph : tf.Graph or GraphDef
    fetches : op / tensor / name or a list of them (e.g. ``[train_op, loss]``)
    costs : op name -> µs on ``kind`` (missing ops get ``default_cost``)
    cpu_costs : op name -> µs on CPU for ops allowed only there (default: ``costs``)
    kind : device kind of the target devices ("GPU", or "CPU" for logical CPUs)
    batch : value for unknown leading dimensions
    memory : op name -> {"output_bytes", "temporary_bytes", "persistent_bytes"}
        overrides from profiling
    kinds_fn : (op_type, kind) -> allowed kinds; default :func:`allowed_kinds`
    tensor_sizes : tensor name -> bytes, overriding the static shape (e.g.
        measured sizes) and the shape-vector bound
    on_unknown : {"raise", "warn", "ignore"}
        What to do when more than :data:`MAX_UNKNOWN` of the data tensors
        have no size from their static shape (nor ``batch``, nor
        ``tensor_sizes``, nor :func:`shape_tensor_bytes`: a shape vector
        proven to hold at most :data:`MAX_SHAPE_ELEMENTS` integers), or a
        variable reaches the step without a size (a resource placeholder: a
        tf.function's captured variable): their bytes would count as 0 and
        the plan would be solved for the wrong graph.

    Returns
    -------
    OpGraph

    Raises
    ------
    InvalidGraphError
        ``on_unknown="raise"`` and sizes are missing; the message names
        examples and the fix.
    """
    graph = _as_graph(graph)
    costs = costs or {}
    cpu_costs = cpu_costs if cpu_costs is not None else costs
    memory = memory or {}
    kinds_fn = kinds_fn or allowed_kinds
    ops = step_ops(graph, fetches)
    ops.sort(key=lambda o: o._id)  # creation order: deterministic and topological
    names = {op.name for op in ops}
    groups = colocation_groups(ops)

    allowed_of = {op.name: kinds_fn(op.type, kind) for op in ops}
    # TF puts a whole colocation group on the host if one member has no GPU
    # kernel: mirror that so every group keeps a common kind
    host_groups = {groups[n] for n, k in allowed_of.items() if n in groups and kind not in k}
    for n, g in groups.items():
        if g in host_groups:
            allowed_of[n] = frozenset({"CPU"})
    sizes = {**shape_tensor_bytes(ops, names, batch), **(tensor_sizes or {})}
    _check_sizes(ops, names, sizes, batch, memory, on_unknown)
    marks = batch_marks(ops, batch=batch)
    tensors, edges, op_objs = [], {}, []
    for op in ops:
        out_bytes = 0
        for t in op.outputs:
            b = int(sizes[t.name]) if t.name in sizes else tensor_bytes(t, batch)
            out_bytes += b
            consumers = [c for c in t.consumers() if c.name in names]
            if not consumers:
                continue
            tensors.append(Tensor(t.name, op.name, b))
            for c in consumers:
                edges.setdefault((op.name, c.name), []).append(t.name)
        for c in op.control_inputs:
            edges.setdefault((c.name, op.name), [])
        allowed = allowed_of[op.name]
        compute = {}
        for k in allowed:
            src = cpu_costs if (k == "CPU" and kind != "CPU") else costs
            compute[k] = float(src.get(op.name, costs.get(op.name, default_cost)))
        persistent = _variable_bytes(op) if op.type in _VARIABLE_OPS else 0
        mem = memory.get(op.name, {})
        op_objs.append(Op(op.name, compute, kinds=allowed,
                          persistent_bytes=int(mem.get("persistent_bytes", persistent)),
                          output_bytes=int(mem.get("output_bytes", out_bytes)),
                          temporary_bytes=int(mem.get("temporary_bytes", 0)),
                          colocation_group=groups.get(op.name),
                          scope=op.name.rsplit("/", 1)[0] if "/" in op.name else "",
                          type=op.type, batch=marks.get(op.name)))
    # a pair with data edges and a control edge: the data edge already orders them
    edge_objs = [Edge(u, v, tuple(dict.fromkeys(ts))) for (u, v), ts in edges.items()]
    # phase, anchor, role (batch: above), then the views (a variable's read shares its buffer)
    return mark_views(mark_phases(OpGraph(op_objs, edge_objs, tensors, name=name)))


MAX_UNKNOWN = 0.01  # share of data tensors allowed without a static size


def _sized(t, batch) -> bool:
    """The static shape gives ``t``'s bytes (a handle, string or variant weighs 0 by design)."""
    import tensorflow as tf

    if t.dtype.base_dtype in (tf.resource, tf.variant, tf.string):
        return True
    dims = t.shape.as_list() if t.shape.rank is not None else None
    return dims is not None and all(d is not None or (i == 0 and batch) for i, d in enumerate(dims))


def unsized_tensors(ops, names, sizes=None, batch=None) -> list[str]:
    """Names of the tensors of ``ops`` consumed in the step (by ops named in
    ``names``) whose bytes neither their static shape (with ``batch`` for an
    unknown leading dimension) nor ``sizes`` give."""
    sizes = sizes or {}
    return [t.name for op in ops for t in op.outputs
            if any(c.name in names for c in t.consumers()) and t.name not in sizes and not _sized(t, batch)]


def _check_sizes(ops, names, sizes, batch, memory, on_unknown: str) -> None:
    """Refuse (or warn about) a graph whose tensor or variable sizes are unknown."""
    import tensorflow as tf

    if on_unknown not in ("raise", "warn", "ignore"):
        raise ValueError(f"on_unknown must be 'raise', 'warn' or 'ignore', got {on_unknown!r}")
    data = [t for op in ops for t in op.outputs if any(c.name in names for c in t.consumers())]
    unknown = unsized_tensors(ops, names, sizes, batch)
    handles = [op.name for op in ops if op.type == "Placeholder" and op.outputs[0].dtype == tf.resource
               and "persistent_bytes" not in memory.get(op.name, {})]
    problems = []
    if data and len(unknown) > MAX_UNKNOWN * len(data):
        by_name = {t.name: t for t in data}
        examples = ", ".join(_describe(by_name[n]) for n in unknown[:3])
        problems.append(f"{len(unknown)} of {len(data)} tensors ({len(unknown) / len(data):.0%}) have no static "
                        f"size and are not provably small shape vectors (e.g. {examples}): their bytes would "
                        "count as 0 and grappler's costs would be wrong")
    if handles:
        problems.append(f"{len(handles)} variables reach the step as resource placeholders with no size "
                        f"(e.g. {', '.join(handles[:3])}; a tf.function's captured variables): weights would "
                        "count 0 bytes")
    if not problems or on_unknown == "ignore":
        return
    msg = ("; ".join(problems) + ". Fix: for a tf.function or Keras step use tf_patch.function_opgraph or "
           "tf_patch.keras_opgraph (they size variables and shapes from the traced step); else give batch= "
           "for an unknown leading dimension, tensor_sizes= or memory= overrides; on_unknown='warn' goes on "
           "regardless")
    if on_unknown == "warn":
        import warnings
        warnings.warn(msg, stacklevel=3)
        return
    raise InvalidGraphError(msg)


def _describe(t) -> str:
    """``name (OpType, dtype, shape)`` of a tensor, for error messages."""
    return f"{t.name} ({t.op.type}, {t.dtype.base_dtype.name}, {t.shape})"


MAX_SHAPE_ELEMENTS = 1024  # the most integers a shape vector sized by its bound may hold

#: op -> how many elements its (rank <= 1) output holds at most, from its inputs' bounds
_AT_MOST_FIRST = frozenset({  # no more elements than its first input: slices, reshapes, reductions
    "StridedSlice", "Slice", "Reshape", "Squeeze", "Identity", "Snapshot", "StopGradient", "Cast", "Neg", "Abs",
    "ListDiff", "SetDiff1d", "Unique", "Sum", "Prod", "Max", "Min", "ZerosLike", "OnesLike"})
_AT_MOST_LONGEST = frozenset({  # elementwise on vectors (broadcast: the longest input) and broadcast shapes
    "Add", "AddV2", "Sub", "Mul", "FloorDiv", "FloorMod", "TruncateDiv", "Maximum", "Minimum",
    "BroadcastGradientArgs", "BroadcastArgs", "SelectV2"})
_AT_MOST_SUM = {"ConcatV2": slice(0, -1), "Concat": slice(1, None), "Pack": slice(0, None)}


def shape_tensor_bytes(ops, names, batch: int | None = None) -> dict[str, int]:
    """Bytes of the step's shape vectors that have no static size, from a bound.

    The rule: a tensor of an integer dtype (int32, int64) with static rank 0
    or 1 whose length is unknown (``BroadcastGradientArgs`` of two shapes,
    ``Shape`` of a tensor of unknown rank...) holds at most ``n`` elements,
    where ``n`` is proven from the ops it is computed from: a statically
    shaped tensor holds its element count (``batch`` for an unknown leading
    dimension); ``Shape``/``ShapeN`` of a tensor of known rank ``r`` hold
    ``r``; slices, reshapes, casts and reductions hold no more than their
    first input; elementwise ops and ``BroadcastGradientArgs`` /
    ``BroadcastArgs`` no more than their longest input; ``ConcatV2`` /
    ``Pack`` the sum of theirs; ``GatherV2`` of a vector as many as its
    indices. Any other op (``Range``, ``Fill``, ``Tile``, ``Where``...: a
    length set by values) proves nothing. A tensor proven to hold at most
    :data:`MAX_SHAPE_ELEMENTS` elements weighs ``n * dtype size`` bytes (an
    upper bound, tens of bytes in practice); the rest stay unsized.

    Parameters
    ----------
    ops : the step's tf.Operations
    names : names of the ops that run in the step (consumers outside it do not count)
    batch : value for unknown leading dimensions

    Returns
    -------
    dict
        tensor name -> bytes, for the consumed tensors this rule sizes.
    """
    import tensorflow as tf

    memo: dict = {}
    out = {}
    for op in ops:
        for t in op.outputs:
            if (t.dtype.base_dtype not in (tf.int32, tf.int64) or t.shape.rank is None or t.shape.rank > 1
                    or _sized(t, batch) or not any(c.name in names for c in t.consumers())):
                continue
            try:
                n = _elements_bound(t, batch, memo)
            except RecursionError:
                n = None
            if n is not None and n <= MAX_SHAPE_ELEMENTS:
                out[t.name] = int(n) * t.dtype.base_dtype.size
    return out


def _elements_bound(t, batch, memo) -> int | None:
    """At most how many elements ``t`` holds (None: nothing proven); see
    :func:`shape_tensor_bytes`."""
    if t.name in memo:
        return memo[t.name]
    memo[t.name] = None  # a cycle (a loop's back edge) proves nothing
    n = _static_elements(t, batch)
    if n is None:
        op, ins = t.op, list(t.op.inputs)
        if op.type in ("Shape", "ShapeN"):
            rank = ins[t.value_index].shape.rank if ins else None
            n = rank if rank is not None else None
        elif op.type in _AT_MOST_FIRST and ins:
            n = _elements_bound(ins[0], batch, memo)
        elif op.type in _AT_MOST_LONGEST and ins:
            bounds = [_elements_bound(i, batch, memo) for i in ins]
            n = None if not bounds or None in bounds else max(bounds)
        elif op.type in _AT_MOST_SUM:
            bounds = [_elements_bound(i, batch, memo) for i in ins[_AT_MOST_SUM[op.type]]]
            n = None if not bounds or None in bounds else sum(bounds)
        elif op.type in ("GatherV2", "Gather") and len(ins) >= 2 and ins[0].shape.rank == 1:
            n = _elements_bound(ins[1], batch, memo)
    memo[t.name] = n
    return n


def _static_elements(t, batch) -> int | None:
    """Elements of ``t`` from its static shape (``batch`` for an unknown leading dimension), or None."""
    if t.shape.rank is None:
        return None
    n = 1
    for i, d in enumerate(t.shape.as_list()):
        if d is None:
            if i == 0 and batch:
                d = batch
            else:
                return None
        n *= d
    return n


def _variable_bytes(op) -> int:
    import tensorflow as tf

    try:
        shape = tf.TensorShape(op.get_attr("shape"))
        dtype = tf.as_dtype(op.get_attr("dtype"))
    except ValueError:
        return 0
    if not shape.is_fully_defined():
        return 0
    return int(shape.num_elements() * dtype.size)


def _as_graph(graph):
    import tensorflow as tf

    if isinstance(graph, tf.Graph):
        return graph
    gd = graph
    if not isinstance(gd, tf.compat.v1.GraphDef):
        raise TypeError(f"expected tf.Graph or GraphDef, got {type(graph).__name__}")
    g = tf.Graph()
    with g.as_default():
        tf.graph_util.import_graph_def(gd, name="")
    return g


def _flatten(fetches) -> Iterable:
    if isinstance(fetches, (list, tuple, set)):
        for f in fetches:
            yield from _flatten(f)
    else:
        yield fetches


def _as_op(graph, f):
    if isinstance(f, str):
        obj = graph.as_graph_element(f)
    else:
        obj = f
    return obj if hasattr(obj, "control_inputs") else obj.op
