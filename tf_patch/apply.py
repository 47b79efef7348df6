"""Enforce a :class:`pesto.Plan` on a tf.Graph: devices and op order.

1. Check the plan against the graph's colocation groups *before* TF sees it:
   a group split over devices raises :class:`pesto.InvalidPlanError` naming
   the group and its devices.
2. Set each op's device (plan ``/CPU:1`` -> ``/job:localhost/.../device:CPU:1``).
3. Add the plan's per-device order as control dependencies between
   consecutive ops of a device, skipping pairs already ordered by a path in
   the graph (ops without inputs, e.g. variable handles, are not chained:
   they cost nothing and an edge into a handle would reach its initialiser).
   Every edge is checked first: one that would close a cycle (a
   plan whose orders contradict the data flow across devices) raises
   :class:`pesto.CycleError` with the cycle, and nothing is changed.
   A pair ``(a, b)`` where ``b`` feeds a consumer of ``a`` (at most two
   hops down) is not chained either: TensorFlow's runtime fuses such ops
   (oneDNN merges Conv2D + BiasAdd [+ Add + Relu] after the graph is handed
   over), the edge would then run from the fused node into its own input, and
   the step silently stops with ``Retval[0] does not have value`` (ResNet50,
   one edge ``conv -> bias Reshape``) or hangs across devices.
4. :func:`verify` creates a session with ``allow_soft_placement=False`` and
   grappler's reordering passes off (:func:`tf_patch.devices.session_config`),
   so TF's own placer accepts the placement or fails loudly.

Examples
--------
>>> info = apply_plan(model.graph, plan)                      # doctest: +SKIP
>>> len(info.control_edges), info.skipped                     # doctest: +SKIP
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pesto.errors import CycleError, InvalidPlanError

from .extract import colocation_groups
from .devices import map_devices, session_config, tf_device

__all__ = ["Applied", "check_colocation", "control_edges_for", "apply_plan", "verify"]


@dataclass
class Applied:
    """What :func:`apply_plan` did."""

    devices: dict = field(default_factory=dict)        # op -> TF device string
    control_edges: list = field(default_factory=list)  # (a, b): b waits for a
    skipped: int = 0                                   # consecutive pairs already ordered
    fusion_guarded: int = 0                            # pairs left out: a fusion would make a cycle
    plan: object = None                                # the plan as applied (devices of this machine)
    note: str = ""                                     # how plan devices were mapped
    n_devices: int = 0                                 # devices a session needs


def check_colocation(graph, placement) -> None:
    """Raise InvalidPlanError if ``placement`` splits a TF colocation group.

    Groups are computed from the tf.Graph itself (``_class`` attributes and
    resource edges), not trusted from the plan's OpGraph.
    """

    ops = [graph.get_operation_by_name(n) for n in placement if _has_op(graph, n)]
    # include colocation partners not in the plan (e.g. a variable's initializer)
    groups = colocation_groups(ops)
    members: dict[str, dict[str, list]] = {}
    for op_name, g in groups.items():
        members.setdefault(g, {}).setdefault(placement[op_name], []).append(op_name)
    bad = []
    for g, by_dev in sorted(members.items()):
        if len(by_dev) > 1:
            where = "; ".join(f"{d}: {sorted(v)[:3]}{'...' if len(v) > 3 else ''}"
                              for d, v in sorted(by_dev.items()))
            bad.append(f"colocation group {g!r} is split over {sorted(by_dev)} ({where})")
    if bad:
        raise InvalidPlanError(bad)


def _has_op(graph, name):
    try:
        graph.get_operation_by_name(name)
        return True
    except KeyError:
        return False


def control_edges_for(graph, plan, *, max_bitset_ops: int = 60000):
    """The control edges enforcing ``plan.order`` on ``graph``.

    Returns ``(edges, skipped, guarded)``. A consecutive pair (a, b) on a
    device is skipped when a path a -> ... -> b exists already (reachability
    by bitsets; for graphs over ``max_bitset_ops`` only direct edges are
    detected), and guarded (left out) when ``b`` feeds one of ``a``'s
    consumers up to two hops down (see the module docstring: a runtime
    fusion would turn the edge into a cycle). Raises CycleError if the edges
    would close a cycle.
    """
    ops = graph.get_operations()
    idx = {op.name: i for i, op in enumerate(ops)}
    succ = [set() for _ in ops]
    data_succ = [set() for _ in ops]
    for op in ops:
        j = idx[op.name]
        for t in op.inputs:
            succ[idx[t.op.name]].add(j)
            data_succ[idx[t.op.name]].add(j)
        for c in op.control_inputs:
            succ[idx[c.name]].add(j)
    topo = _toposort(succ, [op.name for op in ops])
    reach = None
    if len(ops) <= max_bitset_ops:
        reach = [0] * len(ops)  # reach[i]: bitset of ops reachable from i
        for i in reversed(topo):
            r = 0
            for j in succ[i]:
                r |= reach[j] | (1 << j)
            reach[i] = r
    edges, skipped, guarded = [], 0, 0
    # Sources (no inputs: variable handles, constants, placeholders) are left
    # out of the chains: they cost nothing, and an edge into a variable
    # handle would drag step ops into its initialiser's run.
    sources = {op.name for op in ops if not op.inputs and not op.control_inputs}
    for dev, seq in plan.order.items():
        seq = [n for n in seq if n in idx and n not in sources]
        for a, b in zip(seq, seq[1:]):
            ia, ib = idx[a], idx[b]
            if ib in succ[ia] or (reach is not None and (reach[ia] >> ib) & 1):
                skipped += 1
            elif _feeds_fusable(ia, ib, succ, reach, data_succ):
                guarded += 1
            else:
                edges.append((a, b))
    # cycle check on the graph with the new edges
    for a, b in edges:
        succ[idx[a]].add(idx[b])
    _toposort(succ, [op.name for op in ops], what="graph with the plan's control edges")
    return edges, skipped, guarded


def _feeds_fusable(ia: int, ib: int, succ, reach, data_succ) -> bool:
    """Does op ``ib`` reach a data consumer of ``ia``, or a consumer of one
    (the ops a runtime fusion may merge ``ia`` with)? Without ``reach`` (a
    huge graph) only direct inputs count."""
    near = set(data_succ[ia])
    for c in data_succ[ia]:
        near.update(data_succ[c])
    if reach is None:
        return any(c in succ[ib] for c in near)
    return any((reach[ib] >> c) & 1 for c in near)


def _toposort(succ, names, what="tf graph"):
    n = len(succ)
    indeg = [0] * n
    for s in succ:
        for j in s:
            indeg[j] += 1
    stack = [i for i in range(n) if indeg[i] == 0]
    order = []
    while stack:
        i = stack.pop()
        order.append(i)
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                stack.append(j)
    if len(order) < n:
        left = {i for i in range(n) if indeg[i] > 0}
        pred = {i: [] for i in left}
        for i in left:
            for j in succ[i]:
                if j in left:
                    pred[j].append(i)
        i, seen, path = next(iter(left)), {}, []
        while i not in seen:
            seen[i] = len(path)
            path.append(i)
            i = pred[i][0]
        cyc = path[seen[i]:][::-1]
        raise CycleError([names[k] for k in cyc], what=what)
    return order


def apply_plan(graph, plan, *, order: bool = True, n_devices: int = 0) -> Applied:
    """Set devices (and, with ``order``, control edges) on ``graph`` in place.

    Plan devices are mapped onto this machine first
    (:func:`tf_patch.devices.map_devices`): ``/GPU:k`` stays where there are
    enough GPUs, else runs on logical CPU device ``/CPU:k``; ``Applied.note``
    says which, ``Applied.n_devices`` how many devices a session needs (at
    least ``n_devices``).

    Raises
    ------
    InvalidPlanError
        The plan splits a colocation group, or names an op not in the graph.
    CycleError
        The plan's order would close a cycle.
    """

    plan, note, needed = map_devices(plan, n_devices)
    missing = [n for n in plan.placement if not _has_op(graph, n)]
    if missing:
        raise InvalidPlanError([f"plan places op {m!r} that is not in the tf.Graph" for m in missing[:20]])
    check_colocation(graph, plan.placement)
    edges, skipped, guarded = control_edges_for(graph, plan) if order else ([], 0, 0)
    out = Applied(skipped=skipped, fusion_guarded=guarded, plan=plan, note=note, n_devices=needed)
    for name, dev in plan.placement.items():
        d = tf_device(dev)
        graph.get_operation_by_name(name)._set_device(d)
        out.devices[name] = d
    # ops outside the plan that TF colocates with a placed op (initialisers,
    # Adam's beta powers' initial values...) follow it, so nothing is split
    _follow_colocation(graph, out.devices)
    for a, b in edges:
        graph.get_operation_by_name(b)._add_control_input(graph.get_operation_by_name(a))
    out.control_edges = edges
    return out


def _follow_colocation(graph, devices):
    import tensorflow as tf

    for op in graph.get_operations():
        if op.name in devices:
            continue
        target = None
        try:
            for loc in op.get_attr("_class"):
                loc = loc.decode() if isinstance(loc, bytes) else loc
                if loc.startswith("loc:@") and loc[5:] in devices:
                    target = devices[loc[5:]]
        except ValueError:
            pass
        if target is None:
            for t in op.inputs:
                if t.op.name in devices and (t.dtype.base_dtype == tf.resource or t.dtype._is_ref_dtype):
                    target = devices[t.op.name]
        if target is not None:
            op._set_device(target)


def verify(graph, n_devices: int, *, kind: str = "CPU", init_op=None, fetches=None, feed=None):
    """Create a session with no soft placement and run ``init_op`` (and
    ``fetches`` once if given): TF's placer must accept the placement.
    Returns the open session (caller closes it)."""
    import tensorflow as tf

    sess = tf.compat.v1.Session(graph=graph, config=session_config(n_devices, kind=kind))
    try:
        if init_op is not None:
            sess.run(init_op)
        if fetches is not None:
            sess.run(fetches, feed or {})
    except Exception:
        sess.close()
        raise
    return sess
