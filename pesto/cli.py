"""The ``pesto`` command: place, simulate, check, profile and benchmark from a shell.

Examples
--------
Place a zoo model (profiled with grappler's V100 cost model) on 2 GPUs::

    pesto place rnnlm:2x2048 --gpus 2 --time-limit 30 -o plan.json

Place a graph you exported (``OpGraph.to_json``) with a heuristic, then replay it::

    pesto place graph.json --cluster v100x4_pcie --placer m-etf -o plan.json
    pesto simulate graph.json plan.json --gantt step.png --trace step.json
    pesto check graph.json plan.json
    pesto evaluate graph.json placement.json --cluster v100x4_pcie

Exit codes
----------
0 success; 1 the problem or plan is infeasible or invalid (e.g. out of memory,
``check`` found violations), or this machine ran out of memory; 2 bad input (missing file, malformed or cyclic
graph, unknown placer, preset or model, an output that cannot be written);
3 a needed component is not installed (e.g. TensorFlow for ``profile``);
130 interrupted (Ctrl-C, SIGTERM or SIGHUP during ``place``: the best plan so
far is written with status ``interrupted`` and printed; a second Ctrl-C aborts
at once, writing nothing, as does one before the first heuristic made a plan);
141 the reader of the output went away (``pesto placers | head -1``).

Files: graphs, plans, placements and clusters may be gzipped (told by their
content; written gzipped when the name ends in ``.gz``). Every JSON output is
written to a temporary file and renamed over the target, so an interrupted
write leaves the previous file whole.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

from solver import PLACERS, accepted_options, get_placer
from solver.options import MAX_TIME_LIMIT
from solver.parallel.hybrid import hybrid_plan
from solver.parallel.pipelines import data_parallel_plan, gpu_names, pipeline_plan
from solver.parallel.schedules import SCHEDULES
from solver.parallel.slice_model import place_slice_cpsat
from solver.parallel.search import check_batch
from solver.parallel.user_baselines import PLANS as USER_BASELINES

from . import __version__
from . import cluster as C
from .api import default_cluster, evaluate, marked, raise_overrun, solve_step, step_graph
from .errors import InfeasibleError, InvalidPlanError, PestoError
from .graph import OpGraph
from .memory import fmt_bytes
from .plan import Plan, check_plan
from .simulate import simulate
from . import jsonio
from .api import load_placement, needs_cpu

EXIT_OK, EXIT_INFEASIBLE, EXIT_INPUT, EXIT_MISSING, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_PIPE = 141  # 128 + SIGPIPE, as a shell reports a writer whose reader left
SEED_MAX = 2**31 - 1  # CP-SAT's random_seed is a 32-bit int

ZOO_MODELS = ("rnnlm", "nmt", "transformer", "nasnet")
EXACT_PLACERS = ("cpsat", "mip")

EPILOG = """\
exit codes:
  0    success
  1    infeasible or invalid: no plan fits memory, or `check` found violations;
       or this machine's memory ran out (`ulimit -v`)
  2    bad input: missing or damaged file, malformed/cyclic graph, unknown
       placer/preset/model, an output path that cannot be written
  3    a needed component is not installed (e.g. TensorFlow for `profile`)
  130  interrupted: Ctrl-C, SIGTERM or SIGHUP (the best plan so far is written; a
       second Ctrl-C, or one before any plan exists, aborts writing nothing)
  141  the output pipe was closed (e.g. `pesto placers | head -1`)
files may be gzipped (read by content, written gzipped when named *.gz)
"""


class CliError(Exception):
    """A user error with the exit code to return."""

    def __init__(self, message: str, code: int = EXIT_INPUT):
        super().__init__(message)
        self.code = code


# -- helpers -------------------------------------------------------------------
def _say(args, msg: str) -> None:
    if not getattr(args, "quiet", False):
        with contextlib.suppress(OSError):  # a closed terminal (SIGHUP) must not lose the plan
            print(msg, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _progress(args, desc: str, seconds: float | None = None):
    """A progress line on stderr and, on a terminal, a tqdm bar ticking towards
    ``seconds`` (a solver time limit) so long solves show they are alive.
    Yields a dict: set ``"end"`` to say how it ended (default "done")."""
    _say(args, f"{desc} ...")
    t0 = time.perf_counter()
    bar = stop = thread = None
    info = {"end": "done"}
    if seconds and not getattr(args, "quiet", False) and sys.stderr.isatty():
        try:
            from tqdm import tqdm
        except ImportError:  # tqdm is a dependency, but never fail on cosmetics
            tqdm = None
        if tqdm is not None:
            bar = tqdm(total=int(seconds), desc=desc, unit="s", leave=False,
                       bar_format="{desc}: {bar} {n_fmt}/{total_fmt} s")
            stop = threading.Event()

            def tick():
                while not stop.wait(1.0):
                    if bar.n < bar.total:
                        bar.update(1)
            thread = threading.Thread(target=tick, daemon=True)
            thread.start()
    try:
        yield info
    except KeyboardInterrupt:
        info["end"] = "interrupted"
        raise
    finally:
        if bar is not None:
            stop.set()
            thread.join()
            bar.close()
        _say(args, f"{desc}: {info['end']} {'in' if info['end'] == 'done' else 'after'} "
                   f"{time.perf_counter() - t0:.1f} s")


def _need_file(path: str, what: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise CliError(f"{what} file not found: {path}")
    if p.is_dir():
        raise CliError(f"{what} path is a directory, not a file: {path}")
    return p


def _in_file(path: str, exc: Exception) -> str:
    """An error message that names the file once."""
    msg = str(exc)
    return msg if msg.startswith(str(path)) else f"{path}: {msg}"


def read_json(path: str, what: str):
    """The JSON document in a file (gzipped or not), or a CliError naming it."""
    _need_file(path, what)
    try:
        return jsonio.load(Path(path))
    except PestoError as exc:
        raise CliError(_in_file(path, exc)) from None
    except OSError as exc:
        raise CliError(f"cannot read {what} file {path}: {exc.strerror or exc}") from None


def _load(path: str, what: str, cls, data=None):
    """``cls.from_dict`` of a file's document, with the file named in any error."""
    data = read_json(path, what) if data is None else data
    try:
        return cls.from_dict(data)
    except PestoError as exc:
        raise CliError(_in_file(path, exc)) from None


def load_graph(path: str):
    """An OpGraph from a JSON file (or .json.gz)."""
    return _load(path, "graph", OpGraph)


def load_plan(path: str):
    """A Plan from a JSON file, and the cluster ``pesto place`` saved with it
    (its ``"cluster"`` key, a cluster document or a preset name; older files
    kept it in ``stats``), or None."""
    data = read_json(path, "plan")
    plan = _load(path, "plan", Plan, data)
    saved = data.get("cluster") or (plan.stats or {}).get("cluster")
    return plan, saved if isinstance(saved, (dict, str)) else None


def parse_model(spec: str) -> tuple[str, str | None]:
    """``"rnnlm:2x2048"`` -> ``("rnnlm", "2x2048")``; ``"nmt"`` -> ``("nmt", None)``."""
    name, _, preset = spec.partition(":")
    name = name.strip().lower()
    if name not in ZOO_MODELS:
        raise CliError(f"unknown model {spec!r}: expected one of {list(ZOO_MODELS)} "
                       "(optionally NAME:PRESET, e.g. rnnlm:2x2048) or an OpGraph .json file")
    return name, (preset or None)


def profile_model(args, spec: str, preset: str | None = None, costs: str = "v100"):
    """Profile a zoo model into an OpGraph through ``tf_patch.opgraph_for``;
    without TensorFlow a CliError with exit code 3."""
    name, spec_preset = parse_model(spec)
    preset = preset or spec_preset or "small"
    missing = ("profiling a zoo model needs TensorFlow ({}); install it with `pip install -e .[tf]` "
               "or pass an OpGraph .json")
    try:  # TensorFlow is optional: imported only when a zoo model is profiled
        from tf_patch import opgraph_for
    except ImportError as exc:
        raise CliError(missing.format(exc), EXIT_MISSING) from None
    with _progress(args, f"profiling {name}:{preset} (costs={costs})"):
        try:
            return opgraph_for(name, preset, costs=costs)
        except ImportError as exc:  # tf_patch imports TensorFlow lazily: it fails here
            raise CliError(missing.format(exc), EXIT_MISSING) from None
        except (KeyError, ValueError) as exc:
            raise CliError(f"cannot build model {name!r} preset {preset!r}: {exc}") from None


def _is_file_target(target: str) -> bool:
    return target.endswith((".json", ".gz")) or os.sep in target or Path(target).exists()


def graph_from_target(args, target: str):
    """An OpGraph from a JSON path or a zoo model spec."""
    if _is_file_target(target):
        if getattr(args, "costs", None) is not None:
            raise CliError(f"--costs {args.costs} applies to a zoo model, which Pesto profiles; "
                           f"{target} is a graph file that already holds its costs")
        return load_graph(target)
    return profile_model(args, target, costs=getattr(args, "costs", None) or "v100")


def make_cluster(graph, gpus: int | None, cluster: str | None):
    """The cluster named by ``--cluster`` (preset or JSON), else ``gpus`` identical
    V100s over NVLink. A preset gets a ``/CPU:0`` only when some op may run
    only on a CPU, as ``--gpus`` does (:func:`pesto.api.default_cluster`) and as
    the benchmark tables are made: ``v100x4_pcie`` is its 4 GPUs for a graph
    every op of which has a GPU kernel."""
    if cluster:
        if cluster.endswith((".json", ".json.gz")):
            _need_file(cluster, "cluster")
            cl = _load(cluster, "cluster", C.Cluster)
        else:
            try:
                cl = C.preset(cluster, with_cpu=needs_cpu(graph))
            except PestoError as exc:
                raise CliError(str(exc)) from None
        n_gpus = sum(1 for d in cl.devices if "GPU" in d.kind.upper())
        if gpus is not None and gpus != n_gpus:  # one of the two would be dropped silently
            raise CliError(f"--gpus {gpus} disagrees with --cluster {cluster} ({n_gpus} GPUs); give only one")
        return cl
    n = 2 if gpus is None else gpus
    if n < 1:
        raise CliError(f"--gpus must be at least 1, got {n}")
    return default_cluster(graph, n)


def cluster_for_plan(args, graph, plan, saved=None):
    """The cluster to check or replay ``plan`` on: ``--cluster`` when given
    (whatever the plan file says); else the cluster the plan file stores
    (said on stderr, with a warning when it differs from the preset of its
    name); else identical GPUs (and /CPU:0) as many as the plan uses."""
    if args.cluster:
        return make_cluster(graph, None, args.cluster)
    if isinstance(saved, str):
        _say(args, f"using cluster {saved!r} named in {args.plan}; --cluster names another")
        return make_cluster(graph, None, saved)
    if saved is not None:
        try:
            cl = C.Cluster.from_dict(saved)
        except PestoError as exc:
            raise CliError(f"{args.plan}: the cluster stored in it is malformed: {exc}") from None
        _say(args, f"using the cluster stored in {args.plan} ({cl.name}, {len(cl)} devices); "
                   "--cluster names another")
        differs = _differs_from_preset(graph, cl)
        if differs:
            _say(args, f"warning: the stored cluster differs from preset {cl.name!r}: {differs}; "
                       f"pass --cluster {cl.name} to use the preset")
        return cl
    return _cluster_from_devices(plan)


def _differs_from_preset(graph, cl) -> str:
    """How a cluster stored under a preset's name differs from that preset ("" if not, or no such preset)."""
    cpu = needs_cpu(graph) or any(d.kind == "CPU" for d in cl.devices)
    m = re.fullmatch(r"v100x(\d+)_nvlink", cl.name)  # what --gpus N builds
    try:
        ref = C.preset(cl.name, with_cpu=cpu) if m is None else C.gpus(int(m.group(1)), with_cpu=cpu)
    except PestoError:
        return ""
    diffs = []
    for d in cl.devices:
        r = ref.devices[ref.index[d.name]] if d.name in ref.index else None
        if r is None:
            diffs.append(f"{d.name} is not in the preset")
        elif (d.kind, d.memory, d.speed) != (r.kind, r.memory, r.speed):
            diffs.append(f"{d.name} has {d.kind} {fmt_bytes(d.memory)} speed {d.speed:g}, "
                         f"the preset {r.kind} {fmt_bytes(r.memory)} speed {r.speed:g}")
    costs = {(r.src, r.dst): (r.beta0, r.beta1) for r in ref.routes}
    if not diffs and any(costs.get((r.src, r.dst), (r.beta0, r.beta1)) != (r.beta0, r.beta1) for r in cl.routes):
        diffs.append("its routes have other costs")
    return "; ".join(diffs[:3]) + (f" (and {len(diffs) - 3} more)" if len(diffs) > 3 else "")


def _cluster_from_devices(plan):
    devs = set(plan.placement.values())
    gpu_ids = []
    for d in devs:
        if "GPU:" in d:
            try:
                gpu_ids.append(int(d.rsplit(":", 1)[1]))
            except ValueError:
                raise CliError(f"cannot infer a cluster from device {d!r}; pass --cluster") from None
        elif d != "/CPU:0":
            raise CliError(f"cannot infer a cluster from device {d!r}; pass --cluster")
    return C.gpus(max(gpu_ids, default=0) + 1, with_cpu="/CPU:0" in devs)


def check_placers(args) -> list[str]:
    """``--placer`` and the ``--compare`` names, checked before any loading or
    profiling (an unknown one, or one that cannot take ``--micro-batches
    auto``, fails at once, not after a solve); returns the names to compare."""
    names = [c.strip() for c in (args.compare or "").split(",") if c.strip()]
    for flag, name in [("--placer", args.placer)] + [("--compare", n) for n in names]:
        if name not in PLACERS:
            raise CliError(f"unknown placer {name!r} in {flag}; known: {', '.join(sorted(PLACERS))}")
        if getattr(args, "micro_batches", 1) == "auto" and name not in EXACT_PLACERS:
            raise CliError(f"{flag} {name}: --micro-batches auto searches the count with placer "
                           f"{' or '.join(EXACT_PLACERS)} only; give a count (e.g. --micro-batches 4) to "
                           f"{'compare' if flag == '--compare' else 'run'} {name}")
    return names


def label(placer: str) -> str:
    """How a placer's plan is named in output: ``pesto.solve`` is "pesto"."""
    return "pesto" if placer == "cpsat" else f"pesto ({placer})" if placer in EXACT_PLACERS else placer


def run_placer(args, graph, cluster, placer: str):
    """Place ``graph`` with ``placer``: the exact ones go through :func:`pesto.solve_step`
    (coarsen, solve, expand, simulate, check; ``--micro-batches``), the
    parallelism placers (gpipe, 1f1b, data-parallel, hybrid) through :mod:`solver.parallel.pipelines`, the others
    through the registry (given ``--time-limit`` and ``--seed`` when they take
    them). Returns the plan and the graph it places (the step, or its split
    or replicated form)."""
    if placer not in PLACERS:
        raise CliError(f"unknown placer {placer!r}; known: {', '.join(sorted(PLACERS))}")
    micro = getattr(args, "micro_batches", 1)
    if placer in EXACT_PLACERS:
        with _progress(args, f"{label(placer)}: solving (time limit {args.time_limit:g} s; graphs above "
                             f"{args.target_vertices} ops are coarsened)", args.time_limit) as info:
            try:
                r = solve_step(graph, cluster=cluster, time_limit=args.time_limit,
                               target_vertices=args.target_vertices, backend=placer, seed=args.seed,
                               deterministic=getattr(args, "deterministic", False),
                               recipe=getattr(args, "recipe", None), progress=lambda line: _say(args, line), micro_batches=micro,
                               batch_size=getattr(args, "batch_size", None))
            except ValueError as exc:  # an option pesto.solve rejects (e.g. --target-vertices 0)
                raise CliError(str(exc)) from None
            if r.plan.status == "interrupted":
                info["end"] = f"stopped ({r.plan.log.stopped if r.plan.log is not None else 'interrupt'})"
            return r.plan, r.graph
    if micro == "auto":
        raise CliError(f"--micro-batches auto needs placer cpsat or mip, not {placer!r}")
    try:
        return _place_step(args, graph, cluster, placer, micro)
    except ValueError as exc:  # MicroBatchError, BatchMarkError
        raise CliError(f"{placer}: {exc}") from None


def _place_step(args, graph, cluster, placer: str, micro: int):
    """A non-exact placer's plan and the graph it places (``micro`` slices:
    GPipe, 1F1B and slice-cpsat default to 4, data parallelism and hybrid to 1; megatron, zero-dp and
    best-pipeline pick their best count unless ``micro > 1``; a heuristic places the split step)."""
    m = micro if micro > 1 or placer not in (*SCHEDULES, "slice-cpsat") else 4
    replicas = len(gpu_names(cluster)) if placer == "data-parallel" else 2 if placer == "hybrid" else 1
    why = check_batch(getattr(args, "batch_size", None), replicas, m)
    if why:
        raise CliError(f"{placer}: {why}")
    with _progress(args, f"{placer}: placing {graph.num_ops} ops"):
        if placer in SCHEDULES:
            r = pipeline_plan(marked(graph), cluster, schedule=placer, micro_batches=micro if micro > 1 else 4)
            return r.plan, r.graph
        if placer == "slice-cpsat":
            m = micro if micro > 1 else 4
            plan = place_slice_cpsat(marked(graph), cluster, micro_batches=m,
                                     time_limit=args.time_limit or 10.0, seed=args.seed)
            return plan, step_graph(graph, m, "micro-batched")
        if placer == "data-parallel":
            r = data_parallel_plan(marked(graph), cluster, micro_batches=micro)
            return r.plan, r.graph
        if placer == "hybrid":   # two replicas, each a pipeline over half the GPUs
            r = hybrid_plan(marked(graph), cluster, replicas=2, micro_batches=micro)
            return r.plan, r.graph
        if placer in USER_BASELINES:   # each at its best M (the batch's divisors), or at --micro-batches M
            r = USER_BASELINES[placer](marked(graph), cluster, batch_size=getattr(args, "batch_size", None),
                                       micro_batches=micro if micro > 1 else None)
            return r.solved.plan, r.solved.graph
        placed = graph if micro == 1 else step_graph(graph, micro, "micro-batched")
        try:
            fn = get_placer(placer)
        except (ImportError, AttributeError) as exc:
            raise CliError(f"placer {placer!r} is not available: {exc}", EXIT_MISSING) from None
        return fn(placed, cluster, **accepted_options(fn, {"time_limit": args.time_limit, "seed": args.seed})), placed


def describe_plan(plan, cluster, seconds: float | None = None) -> str:
    """The summary line (with ``seconds``, the whole solve's wall time), the
    recipe's passes and each device's ops and peak memory."""
    lines = [plan.summary(seconds)]
    if plan.log is not None:  # from pesto.solve: the passes and who won
        log = plan.log
        passes = ", ".join(f"{s.name} {s.seconds:.1f} s" for s in log.passes)
        lines.append(f"  {log.recipe} recipe: {passes}; plan from {log.winner}, "
                     f"bound from {log.bound_source}")
    peak = plan.peak_memory or {}
    shown = 0
    for d in cluster.devices:
        nops = len(plan.order.get(d.name, ()))
        if nops or peak.get(d.name):
            p = peak.get(d.name)
            flag = "  OOM" if p is not None and p > d.memory else ""
            lines.append(f"  {d.name:>10}: {nops:6d} ops, peak {fmt_bytes(p)} of {fmt_bytes(d.memory)}{flag}")
            shown += 1
    if shown < len(cluster):
        lines.append(f"  ({len(cluster) - shown} of {len(cluster)} devices run nothing)")
    return "\n".join(lines)


def describe_step(plan, placed) -> str:
    """What the plan of a transformed step places, and every step compared (``--micro-batches``)."""
    log, stats = plan.log, plan.stats or {}
    m = log.micro_batches if log is not None else stats.get("micro_batches", 1)
    kind = log.graph_kind if log is not None else ("replicated" if "replicas" in stats else "micro-batched")
    choices = log.step_choices if log is not None else ()
    savers = "".join(f", memory savers: {c}" if c == log.savers else f", {c}" for c in choices)
    lines = [f"  plan of the {kind} step {placed.name}: {m} micro-batch(es), {placed.num_ops} ops{savers}"]
    if log is not None and log.steps:
        lines.append("  steps compared: " + ", ".join(f"{k} {v / 1000:.3f} ms" for k, v in log.steps.items()))
    return "\n".join(lines)


#: Placers whose plan places a transformed step even without ``--micro-batches``.
STEP_PLACERS = (*SCHEDULES, "slice-cpsat", "data-parallel", "hybrid", *USER_BASELINES)


def check_step_graph_output(args) -> None:
    """Before any work: the graph file ``-o PLAN`` implies for a transformed
    step (``PLAN.graph.json.gz``, :func:`step_graph_path`) must be writable and
    must not be the input graph (sweep 4, ``M_o_clobbers_input_graph``)."""
    if not args.output or (getattr(args, "micro_batches", 1) == 1 and args.placer not in STEP_PLACERS):
        return
    gpath = step_graph_path(args.output)
    if os.path.realpath(gpath) == os.path.realpath(args.target):
        raise CliError(f"-o {args.output} would write the placed graph to {gpath}, which is the input graph "
                       f"{args.target}; choose another -o")
    check_output(gpath, "graph file")


def step_graph_path(plan_path: str) -> str:
    """Where ``pesto place -o plan.json`` writes the graph its plan places: ``plan.graph.json.gz``."""
    p = Path(plan_path)
    stem = p.name[:-len(p.suffix)] if p.suffix else p.name
    return str(p.with_name(f"{stem}.graph.json.gz"))


def device_list(cluster, most: int = 8) -> str:
    """The cluster's device names, the middle left out beyond ``most``."""
    names = cluster.names
    if len(names) <= most:
        return ", ".join(names)
    return f"{', '.join(names[:most - 2])}, ..., {', '.join(names[-2:])} ({len(names)} devices)"


def check_output(path, what: str, suffixes=None) -> None:
    """Refuse, before any work, an output path that cannot be written: a
    directory, a missing directory, a directory Pesto cannot create files in,
    an existing file it cannot replace (read-only, immutable) or a suffix the
    writer does not know. So no solve is lost at the end."""
    if not path:
        return
    p = Path(path)
    if p.is_dir():
        raise CliError(f"{what} {path} is a directory; name a file (e.g. {p / 'out.json'})")
    target = Path(os.path.realpath(p))
    if not target.parent.is_dir():
        raise CliError(f"{what} {path}: directory {target.parent} does not exist")
    if suffixes is not None and p.suffix.lower().lstrip(".") not in suffixes:
        raise CliError(f"{what} {path}: unknown file type; use one of {', '.join(sorted(suffixes))}")
    if target.exists() and not target.is_file():
        return  # /dev/stdout, a FIFO: written in place
    try:
        if target.exists():
            open(target, "ab").close()  # fails on a read-only or immutable file; writes nothing
        fd, probe = tempfile.mkstemp(dir=target.parent, prefix=".pesto-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise CliError(f"{what} {path} cannot be written: {exc.strerror or exc}") from None


def write_output(args, path: str, text: str, what: str) -> None:
    """Write ``text`` to ``path`` atomically. If that fails (a full disk, the
    file made immutable meanwhile), the text is saved to a new file in the
    current or the temporary directory, and the error names it."""
    try:
        jsonio.write(path, text)
    except OSError as exc:
        why = exc.strerror or str(exc)
        suffix = ".json.gz" if str(path).endswith(".gz") else ".json"
        for folder in (os.getcwd(), tempfile.gettempdir()):
            try:
                fd, spare = tempfile.mkstemp(dir=folder, prefix=f"pesto-{what.split()[0]}-", suffix=suffix)
                os.close(fd)
                jsonio.write(spare, text)
            except OSError:
                continue
            raise CliError(f"cannot write {what} {path} ({why}); it was saved to {spare} instead") from None
        raise CliError(f"cannot write {what} {path} ({why}), nor a copy in {os.getcwd()} or "
                       f"{tempfile.gettempdir()}") from None
    _say(args, f"wrote {path}")


def plan_document(args, plan, cluster, graph) -> str:
    """The plan JSON plus the cluster and graph name (so `simulate` and `check`
    can replay it). With ``--deterministic`` the wall-clock fields (the plan's
    ``wall_time``, the passes' ``seconds``, ``*_time`` in ``stats``) are 0, so
    equal runs give equal bytes."""
    data = {**plan.to_dict(), "cluster": cluster.to_dict(), "graph": graph.name}
    if getattr(args, "deterministic", False):
        data = _clock_free(data)
    return json.dumps(data)


def _clock_free(x):
    """``x`` with every wall-clock field (``*_time``, ``seconds``) set to 0."""
    if isinstance(x, dict):
        return {k: 0.0 if (k.endswith("_time") or k == "seconds") and isinstance(v, float) else _clock_free(v)
                for k, v in x.items()}
    if isinstance(x, list):
        return [_clock_free(v) for v in x]
    return x


GANTT_SUFFIXES = {"png", "svg", "pdf", "jpg", "jpeg", "eps", "ps", "tif", "tiff", "webp"}


# -- commands ------------------------------------------------------------------
def cmd_place(args) -> int:
    compare = check_placers(args)
    check_output(args.output, "plan file")
    check_step_graph_output(args)
    graph = graph_from_target(args, args.target)
    cluster = make_cluster(graph, args.gpus, args.cluster)
    _say(args, f"graph {graph.name}: {graph.num_ops} ops, {graph.num_edges} edges; "
               f"cluster {cluster.name}: {device_list(cluster)}")
    t0 = time.perf_counter()
    try:
        plan, placed = run_placer(args, graph, cluster, args.placer)
        if plan.status == "infeasible":  # a heuristic's over-memory plan: said as pesto.solve says it
            raise_overrun(placed, cluster, plan)
    except InfeasibleError as exc:
        if exc.plan is not None:
            print(describe_plan(exc.plan, cluster))
        raise CliError(f"{exc}\nno plan written", EXIT_INFEASIBLE) from None
    seconds = time.perf_counter() - t0  # the whole solve (a micro-batch winner holds only its own time)
    if args.output:  # first: a closed terminal or a Ctrl-C later must not lose it
        write_plan(args, plan, cluster, graph, placed)
    print(describe_plan(plan, cluster, seconds))
    if placed is not graph:
        print(describe_step(plan, placed))
    if plan.status == "interrupted":
        stopped = plan.log.stopped if plan.log is not None else "interrupt"
        print(f"pesto: interrupted ({stopped}): the best plan so far"
              + (f" was written to {args.output}" if args.output else " is shown above"), file=sys.stderr)
        return EXIT_INTERRUPTED
    return compare_placers(args, graph, cluster, plan, compare) if compare else EXIT_OK


def write_plan(args, plan, cluster, graph, placed) -> None:
    """``-o``: the plan; when it places a transformed step (``--micro-batches``),
    that graph too, next to it (``PLAN.graph.json.gz``), said with how to check it."""
    write_output(args, args.output, plan_document(args, plan, cluster, placed), "plan file")
    if placed is not graph:
        gpath = step_graph_path(args.output)
        write_output(args, gpath, placed.to_json(), "graph file")
        print(f"the plan places {placed.name} ({placed.num_ops} ops), written to {gpath}; verify with "
              f"`pesto check {gpath} {args.output}` and `pesto simulate {gpath} {args.output}`")


def compare_placers(args, graph, cluster, plan, names) -> int:
    """``--compare``: each placer's step next to ours; one stopped by Ctrl-C is
    not tabulated as a result (exit 130)."""
    rows, stopped = [(label(args.placer), plan.makespan)], None
    for name in names:
        other, _ = run_placer(args, graph, cluster, name)
        if other.status == "interrupted":
            stopped = name
            break
        rows.append((label(name), other.makespan))
    best = plan.makespan
    print("placer        step (ms)   vs this")
    for name, us in rows:
        print(f"{name:<12} {us / 1000:10.3f}   {us / best:6.3f}x")
    if stopped is not None:
        print(f"pesto: interrupted during --compare {label(stopped)}: its plan is not compared", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_OK


def cmd_simulate(args) -> int:
    check_output(args.trace, "trace file")
    check_output(args.gantt, "Gantt chart", GANTT_SUFFIXES)
    graph = load_graph(args.graph)
    plan, saved = load_plan(args.plan)
    same_graph(args, graph, plan)
    cluster = cluster_for_plan(args, graph, plan, saved)
    try:
        sched = simulate(graph, cluster, plan if args.mode != "fifo" else dict(plan.placement),
                         mode=args.mode)
    except PestoError as exc:
        raise CliError(f"{args.plan}: {exc}", EXIT_INFEASIBLE) from None
    print(f"{graph.name} on {cluster.name} ({sched.mode}): step {sched.makespan / 1000:.3f} ms, "
          f"{len(sched.transfers)} transfers")
    busy = sched.busy()
    for d in cluster.devices:
        p = sched.peak_memory.get(d.name, 0)
        flag = "  OOM" if p > d.memory else ""
        print(f"  {d.name:>10}: busy {100 * busy.get(d.name, 0):5.1f}%, peak {fmt_bytes(p)}{flag}")
    for link in sorted(k for k in busy if k not in cluster.index):
        print(f"  link {link}: busy {100 * busy[link]:5.1f}%")
    over = any(sched.peak_memory.get(d.name, 0) > d.memory for d in cluster.devices)
    failed = [why for why in (_draw(args, args.trace, "Chrome trace", sched.chrome_trace,
                                    " (open in https://ui.perfetto.dev)"),
                              _draw(args, args.gantt, "Gantt chart", sched.gantt)) if why]
    if failed:  # the replay above is printed; only the file is missing
        raise CliError("; ".join(failed))
    return EXIT_INFEASIBLE if over else EXIT_OK


def _draw(args, path, what: str, write, where: str = "") -> str:
    """Write ``what`` to ``path`` with ``write(path)``; "" when done (or no
    path), else why not (a full disk, a directory removed meanwhile), so one
    failed file does not stop the other nor show a traceback."""
    if not path:
        return ""
    try:
        write(path)
    except OSError as exc:
        return f"cannot write {what} {path}: {exc.strerror or exc}"
    _say(args, f"wrote {what} {path}{where}")
    return ""


def read_placement(path: str, graph, cluster) -> dict:
    """``{op: device of cluster}`` from a placement file: ``{op: device}`` or a
    plan (its ``"placement"``), gzipped or not. An op the graph lacks, an op
    without a device, a device the cluster lacks (``/GPU:7``, or a task-qualified
    name of a task other than 0 on a cluster without it: :func:`pesto.api.load_placement`
    decides) is bad input (exit 2)."""
    data = read_json(path, "placement")
    mapping = data.get("placement", data) if isinstance(data, dict) else data
    if not isinstance(mapping, dict):
        raise CliError(f"{path}: a placement is a JSON object {{op: device}}, got {type(mapping).__name__}")
    try:
        return load_placement(mapping, graph, cluster)
    except InvalidPlanError as exc:
        raise CliError(f"{path}: {exc}") from None


def cmd_evaluate(args) -> int:
    check_output(args.output, "plan file")
    graph = load_graph(args.graph)
    _need_file(args.placement, "placement")
    cluster = make_cluster(graph, args.gpus, args.cluster)
    plan = evaluate(graph, read_placement(args.placement, graph, cluster), cluster=cluster)
    if args.output:
        write_output(args, args.output, plan_document(args, plan, cluster, graph), "plan file")
    print(describe_plan(plan, cluster))
    return EXIT_INFEASIBLE if plan.status == "infeasible" else EXIT_OK


def same_graph(args, graph, plan) -> None:
    """Refuse, in one message, a plan that places ops ``graph`` lacks (a
    micro-batched or replicated plan checked against the graph it was
    solved from: thousands of "unknown op" lines otherwise), naming a few
    and the graph file ``pesto place`` wrote next to the plan."""
    alien = [op for op in plan.placement if op not in graph]
    if not alien:
        return
    log = plan.log
    kind = (f" (it places the {log.graph_kind} step, {log.micro_batches} micro-batch(es))"
            if log is not None and log.graph_kind != "step" else "")
    placed = step_graph_path(args.plan)
    use = (f"; use the graph written next to it: `pesto {args.command} {placed} {args.plan}`"
           if Path(placed).is_file() and os.path.realpath(placed) != os.path.realpath(args.graph) else "")
    raise CliError(f"{args.plan} is a plan of another graph{kind}: {len(alien)} of its ops are not in "
                   f"{graph.name!r} ({args.graph}), e.g. {', '.join(map(repr, alien[:5]))}{use}", EXIT_INFEASIBLE)


def cmd_check(args) -> int:
    graph = load_graph(args.graph)
    plan, saved = load_plan(args.plan)
    same_graph(args, graph, plan)
    cluster = cluster_for_plan(args, graph, plan, saved)
    report = check_plan(graph, cluster, plan, check_memory=not args.no_memory)
    if report.ok:
        print(f"plan is valid for {graph.name} on {cluster.name}")
        return EXIT_OK
    print(f"plan is INVALID on {cluster.name} ({len(report.violations)} violations):")
    for v in report.violations[:args.max_violations]:
        print(f"  {v}")
    if len(report.violations) > args.max_violations:
        print(f"  ... and {len(report.violations) - args.max_violations} more")
    return EXIT_INFEASIBLE


def cmd_profile(args) -> int:
    check_output(args.output, "graph file")
    graph = profile_model(args, args.model, args.preset, args.costs)
    out = args.output or f"{graph.name}.json"
    if not args.output:
        check_output(out, "graph file")
    write_output(args, out, graph.to_json(), "graph file")
    print(f"{graph.name}: {graph.num_ops} ops, {graph.num_edges} edges, "
          f"total GPU work {graph.total_work('GPU') / 1000:.2f} ms -> {out}")
    return EXIT_OK


def _first_sentence(doc: str) -> str:
    """A docstring's first sentence on one line, Sphinx roles and literals
    made plain (``:func:`x <y>``` -> ``x``, ````x```` -> ``x``)."""
    para = " ".join(line.strip() for line in doc.strip().split("\n\n")[0].splitlines())
    para = re.sub(r":\w+:`~?([^`<]+?)\s*(<[^>]*>)?`", r"\1", para).replace("``", "")
    return re.split(r"(?<! al\.)(?<=\.)\s", para, maxsplit=1)[0]


def cmd_placers(args) -> int:
    for name in sorted(PLACERS):
        try:
            fn = get_placer(name)
            status = _first_sentence(fn.__doc__ or "")
        except Exception as exc:  # report, do not fail: helpers land at different times
            status = f"(not available: {type(exc).__name__}: {exc})"
        print(f"{name:<10} {status}")
    return EXIT_OK


def _import_run_all():
    # benchmarks/ is optional (a source checkout, not the installed package)
    try:
        from benchmarks import run_all
        return run_all
    except ImportError:
        root = Path(__file__).resolve().parents[1]
        if (root / "benchmarks" / "run_all.py").exists():
            sys.path.insert(0, str(root))
            from benchmarks import run_all
            return run_all
        raise CliError("`pesto bench` needs a source checkout (benchmarks/ next to pesto/)",
                       EXIT_MISSING) from None


def cmd_bench(args) -> int:
    run_all = _import_run_all()
    argv = ["--quick"] if args.quick else []
    if args.out:
        argv += ["--out", args.out]
    return run_all.main(argv) or EXIT_OK


# -- parser --------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pesto", description="Joint op placement and scheduling of a training step over several GPUs.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"pesto {__version__}")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress messages on stderr")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def add(name, fn, help_):
        sp = sub.add_parser(name, help=help_, description=help_, epilog=EPILOG,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        sp.set_defaults(func=fn)
        sp.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="no progress messages on stderr")
        return sp

    sp = add("place", cmd_place, "place and schedule a model or an OpGraph JSON on a cluster")
    sp.add_argument("target", help="zoo model (rnnlm, nmt, transformer, nasnet; NAME:PRESET such as "
                                   "rnnlm:2x2048) or an OpGraph .json file")
    sp.add_argument("--gpus", type=_at_least(1), default=None, help="number of identical V100s over NVLink (default 2)")
    sp.add_argument("--cluster", help="cluster preset (v100x2_nvlink, v100x4_pcie, heterogeneous, "
                                      "two_hosts) or a cluster .json file; overrides --gpus")
    sp.add_argument("--placer", default="cpsat", help="cpsat (default, = pesto.solve), mip, or a heuristic; "
                                                      "see `pesto placers`")
    sp.add_argument("--time-limit", type=_at_least(0.001, float, most=MAX_TIME_LIMIT), default=60.0,
                    help="seconds for solving (default 60); loading or profiling the model comes on top")
    sp.add_argument("--target-vertices", type=_at_least(1), default=200, help="coarse graph size for cpsat/mip (default 200)")
    sp.add_argument("--recipe", choices=["full", "paper"], default=None,
                    help="the passes cpsat/mip run on graphs above --target-vertices: full (default for cpsat: heuristics, reschedule, coarsen, exact, expand, lns, local search) or paper (coarsen, heuristics as hints, exact, expand; default for mip)")
    sp.add_argument("--seed", type=_at_least(0, most=SEED_MAX), default=0,
                    help=f"random seed of the solver and the heuristics, 0 to {SEED_MAX} (default 0)")
    sp.add_argument("--costs", default=None, choices=["v100", "measured"],
                    help="how a zoo model is profiled (default v100: grappler's analytical model; "
                         "not for a graph file, which holds its costs)")
    sp.add_argument("--deterministic", action="store_true",
                    help="reproducible mode: the same input, seed and limit give the same plan, byte for byte "
                         "(budgets counted in solver work, so wall time may differ from --time-limit)")
    sp.add_argument("--compare", help="comma-separated placers to run too and compare, e.g. expert,m-etf,gpipe,"
                                      "1f1b,data-parallel")
    sp.add_argument("--micro-batches", type=_micro_batches, default=1,
                    help="split the step into M micro-batches (an int >= 1) or 'auto' (cpsat/mip try the divisors "
                         "of --batch-size up to 16 and data parallelism); with -o the transformed graph is "
                         "written next to the plan (PLAN.graph.json.gz)")
    sp.add_argument("--batch-size", type=_at_least(1), default=None,
                    help="the step's batch size: --micro-batches must divide it")
    sp.add_argument("-o", "--output", help="write the plan JSON here (it records the cluster)")

    sp = add("simulate", cmd_simulate, "replay a plan in the step simulator")
    sp.add_argument("graph", help="OpGraph .json")
    sp.add_argument("plan", help="plan .json (from `pesto place -o`)")
    sp.add_argument("--cluster", help="preset or .json (default: the cluster saved in the plan)")
    sp.add_argument("--mode", choices=["order", "fifo"], default=None,
                    help="follow the plan's order (default) or TF's FIFO ready queue")
    sp.add_argument("--trace", help="write a Chrome trace JSON (Perfetto, chrome://tracing)")
    sp.add_argument("--gantt", help="write a Gantt chart image (.png, .svg, .pdf)")

    sp = add("evaluate", cmd_evaluate, "score a placement you already have (simulated, checked), under "
                                       "TensorFlow's default order")
    sp.add_argument("graph", help="OpGraph .json")
    sp.add_argument("placement", help="JSON {op: device} (TF device strings accepted) or a plan .json")
    sp.add_argument("--gpus", type=_at_least(1), default=None, help="number of identical V100s over NVLink (default 2)")
    sp.add_argument("--cluster", help="cluster preset or .json file")
    sp.add_argument("-o", "--output", help="write the scored plan JSON here")

    sp = add("check", cmd_check, "verify a plan against a graph and cluster (exit 1 if invalid)")
    sp.add_argument("graph", help="OpGraph .json")
    sp.add_argument("plan", help="plan .json (from `pesto place -o`)")
    sp.add_argument("--cluster", help="preset or .json (default: the cluster saved in the plan)")
    sp.add_argument("--no-memory", action="store_true", help="skip the memory capacity check")
    sp.add_argument("--max-violations", type=_at_least(0), default=30,
                    help="violations listed before '... and N more' (default 30)")

    sp = add("profile", cmd_profile, "profile a zoo model into an OpGraph JSON (needs TensorFlow)")
    sp.add_argument("model", help="rnnlm, nmt, transformer, nasnet, optionally NAME:PRESET")
    sp.add_argument("--preset", help="model preset (default small, or the one in NAME:PRESET)")
    sp.add_argument("--costs", default="v100", choices=["v100", "measured"],
                    help="v100: grappler analytical V100 costs; measured: FULL_TRACE on this machine")
    sp.add_argument("-o", "--output", help="output path (default <graph name>.json)")

    sp = add("bench", cmd_bench, "run the benchmarks (benchmarks/run_all.py)")
    sp.add_argument("--quick", action="store_true", help="small CI run (a few minutes) into a temp dir")
    sp.add_argument("--out", help="results directory (default benchmarks/results, temp dir with --quick)")

    add("placers", cmd_placers, "list the placers and whether they are available")
    return p


def _at_least(lo: float, kind=int, most: float | None = None):
    """An argparse ``type``: a number of ``kind`` not below ``lo`` (nor above
    ``most``; NaN and infinity rejected), so a bad option is a usage error (exit 2) naming
    the option."""
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a{'n integer' if kind is int else ' number'}, "
                                             f"got {text!r}") from None
        if not v >= lo:  # also false for nan
            raise argparse.ArgumentTypeError(f"must be at least {lo:g}, got {text}")
        if v == float("inf"):  # a solver limit is whole milliseconds; Ctrl-C stops a long solve
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}; for a long solve "
                                             "give a large one (e.g. 3600) and stop it with Ctrl-C")
        if most is not None and v > most:
            shown = most if kind is int else format(most, "g")
            raise argparse.ArgumentTypeError(f"must be at most {shown}, got {text}")
        return v
    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def _micro_batches(text: str):
    """``--micro-batches``: ``auto`` or an int >= 1."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1 or 'auto', got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1 or 'auto', got {value}")
    return value


def main(argv=None) -> int:
    """Entry point of the ``pesto`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return EXIT_INPUT
    try:
        return args.func(args)
    except CliError as exc:
        print(f"pesto: error: {exc}", file=sys.stderr)
        return exc.code
    except (InfeasibleError, InvalidPlanError) as exc:
        print(f"pesto: error: {exc}", file=sys.stderr)
        return EXIT_INFEASIBLE
    except PestoError as exc:
        print(f"pesto: error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        with contextlib.suppress(OSError):
            print("pesto: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except MemoryError:  # the host's memory (or `ulimit -v`), not a device's: no traceback
        with contextlib.suppress(OSError):
            print(f"pesto: error: out of memory in {args.command} (this process may not allocate more: "
                  "free memory, raise `ulimit -v`, or give a smaller graph)", file=sys.stderr)
        return EXIT_INFEASIBLE
    except BrokenPipeError:
        # the reader went away (`pesto placers | head -1`): stop quietly, as `cat` does,
        # with stdout pointed at /dev/null so the exit's flush does not fail again
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE


def console() -> int:
    """The ``pesto`` console script and ``python -m pesto``: :func:`main`,
    then the objects it made are frozen out of the garbage collector, so the
    interpreter's exit does not walk them (0.9 s of a 1.2 s exit on a loaded
    machine: a Ctrl-C that wrote its plan at once still took over a second to
    return). Only the exit's last, cyclic sweep is skipped; files are closed
    as usual (reference counting)."""
    code = main()
    gc.disable()
    gc.freeze()
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(console())
