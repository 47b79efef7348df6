"""``pesto.solve``: the facade over the solver.

Load the graph, choose a cluster, check that a plan can fit, and run a
recipe of :mod:`solver.recipes`: its passes (heuristics, reschedule, coarsen,
exact, expand, lns, local search, status). See ARCHITECTURE.md for the data flow.

Examples
--------
>>> import pesto
>>> g = pesto.OpGraph.from_edges({"a": 20, "b": 30, "c": 40}, [("a", "b", 1000), ("a", "c", 1000)])
>>> plan = pesto.solve(g, gpus=2, time_limit=5, workers=1)
>>> plan.status, plan.makespan <= 90.0, plan.log.winner
('optimal', True, 'cpsat')
"""
from __future__ import annotations

import json
import re
import time
import warnings
from pathlib import Path
from typing import Any, Mapping

import networkx as nx

from coarsen.base import first_op
from solver import recipes as _recipes
from solver.options import SolveOptions, check_int
from solver.registry import HEURISTICS
from solver.parallel.search import solve_step as _solve_step, step_graph as _step_graph
from solver.parallel.strategy import Solved, Strategy
from tf_patch.marks import is_marked, mark_sparse, mark_step, mark_views

from .cluster import Cluster, gpus as _gpus, preset, v100x2_nvlink
from .errors import BatchMarkError, InfeasibleError, InvalidGraphError, InvalidPlanError
from .finalize import finalize
from .graph import OpGraph
from .memory import check_feasible, memory_profile, overrun_message
from .plan import Plan, check_plan
from .solvelog import SolveLog
from .step.marks import slice_constants
from .step.replication import BUCKET_BYTES

__all__ = ["solve", "solve_step", "step_graph", "marked", "Solved", "Strategy", "evaluate", "load_placement",
           "load_graph", "default_cluster", "needs_cpu", "HEURISTICS"]

_DEVICE = re.compile(r"(?:^|/|device:)(CPU|GPU):(\d+)$", re.I)
_TASK = re.compile(r"/task:(\d+)")


def load_graph(graph) -> OpGraph:
    """An OpGraph from an OpGraph, a ``networkx.DiGraph`` (attributes as in
    :meth:`OpGraph.from_networkx`) or a JSON path / string, with TensorFlow's
    views marked (:func:`tf_patch.marks.mark_views`: a variable's read shares
    the variable's buffer; the graph itself when no op is one)."""
    return mark_views(_read_graph(graph))


def _read_graph(graph) -> OpGraph:
    if isinstance(graph, OpGraph):
        return graph
    if isinstance(graph, (str, Path)):
        return OpGraph.from_json(str(graph))
    if isinstance(graph, nx.DiGraph):
        return OpGraph.from_networkx(graph)
    raise InvalidGraphError(f"cannot read a graph from {type(graph).__name__}; "
                            "give an OpGraph, a networkx.DiGraph or a JSON path")


def needs_cpu(graph: OpGraph | None) -> bool:
    """Some op of ``graph`` cannot run on a GPU (so a cluster needs ``/CPU:0``)."""
    return graph is not None and any("GPU" not in op.kinds for op in graph.ops)


def default_cluster(graph: OpGraph | None, n: int = 2) -> Cluster:
    """The one default-cluster rule (``pesto.solve``, the CLI, the benchmarks):
    ``n`` V100 16 GB over NVLink (:func:`~pesto.cluster.v100x2_nvlink` for
    ``n == 2``), named ``v100x{n}_nvlink``, with a ``/CPU:0`` only when some op
    cannot run on a GPU.

    >>> g = OpGraph.from_edges({"a": 1.0}, [])
    >>> default_cluster(g, 2).names, default_cluster(g, 3).name
    (['/GPU:0', '/GPU:1'], 'v100x3_nvlink')
    """
    if n == 2:
        return v100x2_nvlink(with_cpu=needs_cpu(graph))
    return _gpus(n, with_cpu=needs_cpu(graph), name=f"v100x{n}_nvlink")


def resolve_cluster(graph: OpGraph, gpus, cluster) -> Cluster:
    """The cluster to solve on: ``cluster`` (a Cluster, a preset name or a
    cluster JSON path) when given, else :func:`default_cluster` with ``gpus``.
    A preset has a ``/CPU:0`` only when some op of ``graph`` needs one
    (:func:`needs_cpu`), as in the CLI and the benchmarks.

    Raises
    ------
    TypeError
        ``gpus`` is not an int, or ``cluster`` is neither a Cluster nor a string.
    InvalidClusterError
        ``gpus < 1`` or an unknown preset.
    """
    if cluster is None:
        check_int("gpus", gpus, low=1)
        return default_cluster(graph, int(gpus))
    if isinstance(cluster, (str, Path)):  # a preset gets a /CPU:0 only if an op needs one, as in the CLI
        return preset(str(cluster), with_cpu=needs_cpu(graph))
    if not isinstance(cluster, Cluster):
        raise TypeError(f"cluster must be a Cluster, a preset name or a .json path, "
                        f"got {type(cluster).__name__}")
    return cluster


def solve(graph, gpus: int = 2, *, cluster: Cluster | None = None, time_limit: float = 60,
          target_vertices: int = 200, backend: str = "cpsat", hint: Any = "best-heuristic",
          workers: int | None = None, seed: int = 0, coarsen_method: str = "height",
          recipe: str | None = None, verbose: bool | int = False, deterministic: bool = False,
          progress=None, micro_batches: int | str = 1, batch_size: int | None = None,
          pipeline: str | None = None) -> Plan:
    """Place and schedule ``graph`` on ``gpus`` GPUs (or on ``cluster``).

    Parameters
    ----------
    graph : OpGraph, networkx.DiGraph or str/Path (JSON)
    gpus : int
        Number of GPUs for :func:`default_cluster` (ignored if ``cluster`` is given).
    cluster : Cluster, preset name or cluster JSON path, optional
    time_limit : float
        Seconds for the whole solve, every pass included (loading the graph
        comes before it; the pre-checks count): heuristics, coarsening, CP-SAT,
        LNS, local search and the lower bound share one deadline
        (:mod:`pesto.deadline`); the full recipe gives CP-SAT 20 %, LNS 40 %
        and local search 30 %. Ctrl-C or SIGTERM during the solve returns the
        best plan so far with status ``"interrupted"``.
    target_vertices : int
        Coarsen when the graph has more ops than this.
    backend : {"cpsat", "mip"} or any placer name
        The exact pass's placer.
    hint : "best-heuristic", None, a placer name, a Plan, or a placement
        What the exact solver starts from (paper) or the starts (full): every
        heuristic, none, that placer only, or a plan (of the graph: it joins
        the starts, and the result is never slower than it; of the coarse
        graph: the exact solver's hint). A placement (``{op: device}``, TF
        device strings accepted, or a JSON path) is scored with
        :func:`evaluate` (TensorFlow's default order) and used as that plan.
    workers : int, optional
        CP-SAT workers (default all CPUs).
    seed : int
    coarsen_method : str
        ``coarsen.coarsen`` method ("height", "baechi", "celeritas").
    recipe : {"full", "paper"}, optional
        The list of passes to run, for graphs larger than ``target_vertices`` (smaller ones are solved
        exactly, without coarsening). ``"paper"``: coarsen, heuristics on the
        coarse graph as hints, exact solve, expand (the Pesto paper).
        ``"full"`` (the default with CP-SAT): heuristics on the full graph,
        the best ones re-ordered; coarsening that keeps the best plan exactly
        representable, CP-SAT hinted with it, expand, re-order; then local
        search on the full graph. Default: "full" for CP-SAT, "paper" for
        another backend. See :mod:`solver.recipes`.
    pipeline : {"full", "paper"}, optional
        Deprecated: the old name of ``recipe`` (a :class:`DeprecationWarning`);
        removed in the next release.
    verbose : bool or int
        True: print a progress line at each pass's start and end, e.g.
        ``[pesto    1.15s] exact: done in 0.80 s: cpsat feasible on 40
        vertices | incumbent 1.076 ms, bound 0.599 ms, gap 44.4%``;
        2: CP-SAT's own log as well.
    deterministic : bool
        Reproducible mode: the same graph, cluster, seed and ``time_limit``
        give the same plan, byte for byte, however busy the machine is.
        Budgets are then counted in work (CP-SAT's deterministic time, a
        fixed cost per simulated move), so wall time may differ from
        ``time_limit`` (more on a slow or loaded machine). The default mode
        promises a valid plan within ``time_limit`` (+10 % or 2 s), not the
        same plan twice: it uses wall-clock budgets and parallel CP-SAT.
    progress : callable, optional
        Called with each progress line (as ``verbose`` prints them; the CLI
        shows them on stderr unless ``--quiet``).
    micro_batches : 1, int or "auto"
        1 (default): the step as given. ``M > 1``: the step split into ``M``
        slices (:func:`pesto.step.split`), solved from the GPipe
        and 1F1B plans of that ``M``, compared with those and with the
        data-parallel plan; ``"auto"``: the same for every divisor of
        ``batch_size`` up to 16 (1, 2, 4, 8, 16 without one) and ``M = 1``,
        sharing ``time_limit``. The plan then places another graph than
        ``graph``: ``plan.log.graph_kind`` says which, :func:`step_graph`
        rebuilds it, :func:`solve_step` returns it too
        (:mod:`solver.parallel.search`).
    batch_size : int, optional
        The step's batch size (the graph does not record one): ``M`` must divide it.

    Returns
    -------
    Plan
        For every op of ``graph`` (of the transformed graph with
        ``micro_batches`` other than 1), simulated in its fixed order and checked.
        ``plan.log`` (:class:`~pesto.solvelog.SolveLog`) has every pass's time
        and step, the candidates compared on the full graph, the ``winner``,
        the lower bound (valid for the full graph) and its source; with
        ``micro_batches`` other than 1, valid for the graph the plan places
        (the per-sample bound, :func:`solver.parallel.bound.sample_bound`,
        when higher or when a parallelism kind's plan won).

    Raises
    ------
    InfeasibleError
        Before any solving, naming the op, group or "total" that cannot fit;
        or after it, when the best plan found breaks memory: the message names
        each over-full device, the bytes over and its largest ops or groups,
        ``culprit`` the first such device, ``plan`` the plan.
    MicroBatchError
        ``micro_batches`` not 1, an int >= 1 or "auto", or not dividing
        ``batch_size`` (the message lists its divisors).
    MicroBatchMemoryError
        A fixed ``micro_batches`` whose split step fits no device even at its
        memory floor (``"auto"`` skips such an ``M``, saying why in ``plan.log.skipped``).
    BatchMarkError
        ``micro_batches`` other than 1 on a graph with unmarked ops that no rule
        marks (:func:`marked`).
    TypeError, ValueError
        An option of the wrong type or out of range (each named; checked once,
        by :class:`solver.options.SolveOptions`), an unknown recipe, backend
        or hint, or an unsupported combination (``recipe="full"`` with a
        backend other than CP-SAT; ``hint=None`` with the full recipe on a
        graph above ``target_vertices``).
    """
    return solve_step(graph, gpus, cluster=cluster, time_limit=time_limit, target_vertices=target_vertices,
                      backend=backend, hint=hint, workers=workers, seed=seed, coarsen_method=coarsen_method,
                      recipe=_renamed(recipe, pipeline), verbose=verbose, deterministic=deterministic,
                      progress=progress, micro_batches=micro_batches, batch_size=batch_size).plan


def _renamed(recipe: str | None, pipeline: str | None) -> str | None:
    """``recipe``, or the deprecated ``pipeline`` keyword (its old name) with a
    :class:`DeprecationWarning` pointing at the caller's line."""
    if pipeline is None:
        return recipe
    warnings.warn("pesto.solve(pipeline=...) is deprecated: the list of passes a solve runs is now "
                  f"recipe={pipeline!r}; pipeline= goes in the next release", DeprecationWarning, stacklevel=3)
    if recipe is not None and recipe != pipeline:
        raise TypeError(f"recipe={recipe!r} and pipeline={pipeline!r} (its deprecated name) disagree")
    return pipeline


def solve_step(graph, gpus: int = 2, *, cluster: Cluster | None = None, time_limit: float = 60,
               target_vertices: int = 200, backend: str = "cpsat", hint: Any = "best-heuristic",
               workers: int | None = None, seed: int = 0, coarsen_method: str = "height",
               recipe: str | None = None, verbose: bool = False, deterministic: bool = False,
               progress=None, micro_batches: int | str = "auto", batch_size: int | None = None,
               pipeline: str | None = None) -> Solved:
    """:func:`solve` returning the plan with the graph it places
    and the strategy it realises (:class:`~solver.parallel.strategy.Solved`:
    ``plan``, ``graph``, ``strategy``, ``transformed``: the transform that made
    ``graph``, each op's origin in the step; ``micro_batches``, ``graph_kind``,
    ``replicas``, ``steps`` read from them), the same type for every kind
    (the plain step: ``Strategy()``, ``graph`` the input), so that
    ``pesto.check_plan(r, cluster)`` and ``pesto.simulate(r, cluster)`` take it. Default ``micro_batches="auto"``; the options and errors are :func:`solve`'s.
    """
    recipe = _renamed(recipe, pipeline)
    graph = load_graph(graph)
    started = time.perf_counter()  # the limit counts from here: loading excluded, pre-checks included
    cluster = resolve_cluster(graph, gpus, cluster)
    if isinstance(hint, Mapping) or (isinstance(hint, (str, Path)) and str(hint).endswith(".json")):
        hint = evaluate(graph, hint, cluster=cluster)
    _check_hint(graph, hint)
    options = SolveOptions(time_limit=time_limit, target_vertices=target_vertices, backend=backend, hint=hint,
                           workers=workers, seed=seed, coarsen_options={"method": coarsen_method},
                           recipe=recipe, verbose=verbose, deterministic=deterministic, progress=progress,
                           started=started, micro_batches=micro_batches, batch_size=batch_size)
    if options.micro_batches == 1:
        check_feasible(graph, cluster)
        result = Solved(_recipes.solve(graph, cluster, options), graph, Strategy())
    else:
        result = _solve_step(marked(graph), cluster, options)
    if result.plan.status == "infeasible":
        raise_overrun(result.graph, cluster, result.plan)
    return result


def marked(graph: OpGraph) -> OpGraph:
    """``graph`` with the marks a micro-batched or replicated solve reads
    (:attr:`~pesto.graph.Op.batch`, ``phase``, ``anchor``, ``role``) and
    the views (:func:`tf_patch.marks.mark_views`): itself with its views
    (and its sparse gradients, :func:`tf_patch.marks.mark_sparse`) when a front end set the others, else marked by TensorFlow's rules
    (:func:`tf_patch.marks.mark_step`, which needs no TensorFlow: the cached
    JSON graphs of TF steps carry TF's names and types).

    Raises
    ------
    BatchMarkError
        Unmarked ops and no rule to infer their marks (no data input found).
    """
    if is_marked(graph):   # marked by a front end, maybe before it knew sparse gradients
        return slice_constants(mark_views(mark_sparse(graph)))
    try:
        return slice_constants(mark_step(graph))
    except BatchMarkError as exc:
        raise BatchMarkError(f"graph {graph.name!r} has ops without batch marks (Op.batch) and no rule infers "
                             f"them ({exc}); mark the ops (JSON 'batch': true/false)") from None


def step_graph(graph: OpGraph, micro_batches: int = 1, graph_kind: str = "step", replicas: int = 1,
               savers: str = "", joined=(), in_place=(), *, log: SolveLog | None = None,
               bucket_bytes: int | None = BUCKET_BYTES) -> OpGraph:
    """The graph a plan with these log fields places (``plan.log.micro_batches``,
    ``graph_kind``, ``replicas``, ``savers``, ``joined``, ``in_place``, ``bucket_bytes``), rebuilt from the step ``graph``
    (:func:`marked` first, or for the plain step its views: :func:`solver.parallel.search.step_graph`). ``log``: a plan's
    log (``step_graph(graph, log=plan.log)``), whose fields are read instead of the others.

    Raises
    ------
    ValueError
        An unknown ``graph_kind``.
    BatchMarkError
        As :func:`marked`.
    """
    if log is not None:
        micro_batches, graph_kind, replicas = log.micro_batches, log.graph_kind, log.replicas
        savers, joined, in_place, bucket_bytes = log.savers, log.joined, log.in_place, log.bucket_bytes
    base = mark_views(graph) if graph_kind == "step" and not savers else marked(graph)
    return _step_graph(base, micro_batches, graph_kind,
                       replicas, savers, joined, in_place, bucket_bytes)


def _check_hint(graph: OpGraph, hint) -> None:
    """A hint Plan must place ops of ``graph`` (or vertices of its coarse
    graph, named after their first op): a plan of another graph was ignored
    without a word; it is refused naming the ops ``graph`` lacks."""
    if not isinstance(hint, Plan):
        return
    alien = [v for v in hint.placement if v not in graph and first_op(v) not in graph]
    if alien:
        raise ValueError(f"hint is a plan of another graph: it places {len(alien)} ops that graph "
                         f"{graph.name!r} does not have, e.g. {', '.join(map(repr, alien[:5]))}; "
                         "give a plan of this graph (or of its coarse graph)")


def raise_overrun(graph: OpGraph, cluster: Cluster, plan: Plan) -> None:
    """Raise :class:`InfeasibleError` for a plan that breaks memory, naming the
    over-full devices, the bytes over and the largest ops or groups there."""
    peak = plan.peak_memory or memory_profile(graph, cluster, plan.placement, plan.start, plan.finish,
                                              plan.transfers)
    why = overrun_message(graph, cluster, plan.placement, peak) or "the plan breaks memory"
    worst = next((d.name for d in cluster.devices if peak.get(d.name, 0) > d.memory), None)
    raise InfeasibleError(f"no plan found that fits device memory ({plan.placer or 'best plan'}):\n{why}",
                          culprit=worst, plan=plan)


def _local_device(dev, names: set) -> str | None:
    """The device of ``names`` that ``dev`` means, or None: a name of the
    cluster, or a TF name of task 0 (or of no task) reduced to ``/GPU:1``; a
    device of another task of a multi-host job is none of a one-host cluster's."""
    if not isinstance(dev, str):
        return None
    if dev in names:
        return dev
    task, m = _TASK.search(dev), _DEVICE.search(dev)
    if m is None or (task is not None and int(task.group(1)) != 0):
        return None
    d = f"/{m.group(1).upper()}:{m.group(2)}"
    return d if d in names else None


def _why_not(dev: str, cluster: Cluster) -> str:
    devices = f"{cluster.name} ({', '.join(cluster.names)})"
    task = _TASK.search(dev)
    if task is not None and int(task.group(1)) != 0:
        return (f"task {task.group(1)} of a multi-host job, but cluster {devices} is not: "
                "give the cluster with that host's devices")
    return f"not a device of {devices}"


def load_placement(placement, graph: OpGraph, cluster: Cluster) -> dict[str, str]:
    """A user's placement as ``{op: device of cluster}``.

    ``placement`` is a mapping ``{op: device}``, a Plan, or a JSON file (or
    text) holding either that mapping or a plan (its ``"placement"``). TF
    device strings are accepted: ``/job:worker/replica:0/task:0/device:GPU:1``
    and ``GPU:1`` mean ``/GPU:1``.

    Raises
    ------
    InvalidPlanError
        An op of the graph without a device, an op the graph does not have,
        or a device the cluster does not have (each named): a device of a
        task other than 0 (``/job:worker/task:3/device:GPU:1``) is not a
        device of a one-host cluster.

    Examples
    --------
    >>> from pesto.cluster import gpus
    >>> g = OpGraph.from_edges({"a": 1.0, "b": 1.0}, [("a", "b", 8)])
    >>> load_placement({"a": "/job:localhost/replica:0/task:0/device:GPU:1", "b": "GPU:0"}, g, gpus(2))
    {'a': '/GPU:1', 'b': '/GPU:0'}
    """
    if isinstance(placement, Plan):
        placement = placement.placement
    elif isinstance(placement, (str, Path)):
        text = str(placement)
        data = json.loads(text if text.lstrip().startswith("{") else Path(text).read_text())
        placement = data.get("placement", data) if isinstance(data, dict) else data
    if not isinstance(placement, Mapping):
        raise InvalidPlanError([f"a placement is a mapping op -> device, got {type(placement).__name__}"])
    names, out, unknown, off = set(cluster.names), {}, [], {}
    for op, dev in placement.items():
        if op not in graph:
            unknown.append(op)
            continue
        d = _local_device(dev, names)
        if d is None:
            off.setdefault(str(dev), []).append(op)
        out[op] = d
    bad = [f"{len(ops)} ops are placed on {dev!r}, {_why_not(dev, cluster)}, e.g. {', '.join(map(repr, ops[:3]))}"
           for dev, ops in off.items()]
    if unknown:
        bad.append(f"the placement names {len(unknown)} ops the graph does not have, e.g. "
                   f"{', '.join(map(repr, unknown[:3]))}")
    missing = [op for op in graph.names if op not in placement]
    if missing:
        bad.append(f"{len(missing)} ops have no device (e.g. {', '.join(map(repr, missing[:5]))})")
    if bad:
        raise InvalidPlanError(bad)
    return out


def evaluate(graph, placement, *, gpus: int = 2, cluster: Cluster | None = None,
             order: Any = None) -> Plan:
    """Score a placement you already have (your own, another tool's) exactly
    as Pesto scores its own: simulated, memory-checked and verified.

    Parameters
    ----------
    graph : OpGraph, networkx.DiGraph or str/Path (JSON)
    placement : mapping op -> device, a Plan, or a JSON path (see :func:`load_placement`)
    gpus, cluster : as for :func:`solve`
    order : per-device op lists, one global op sequence, or None for
        TensorFlow's default (a FIFO ready queue per device)

    Returns
    -------
    Plan
        ``placer="given"``; ``status`` ``"infeasible"`` if it breaks memory.

    Examples
    --------
    >>> g = OpGraph.from_edges({"a": 10.0, "b": 10.0}, [("a", "b", 8)])
    >>> evaluate(g, {"a": "/GPU:0", "b": "/GPU:0"}).makespan
    20.0
    """
    graph = load_graph(graph)
    cluster = resolve_cluster(graph, gpus, cluster)
    t0 = time.perf_counter()
    plan = finalize(graph, cluster, load_placement(placement, graph, cluster), order=order, placer="given", t0=t0)
    check_plan(graph, cluster, plan, check_memory=plan.status != "infeasible").raise_if_invalid()
    return plan
