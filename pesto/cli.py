"""The ``pesto`` command: place, simulate, check, profile and benchmark from a shell.

Examples
--------
Place a zoo model (profiled with grappler's V100 cost model) on 2 GPUs::

    pesto place rnnlm:2x2048 --gpus 2 --time-limit 30 -o plan.json

Place a graph you exported (``OpGraph.to_json``) with a baseline, then replay it::

    pesto place graph.json --cluster v100x4_pcie --placer m-etf -o plan.json
    pesto simulate graph.json plan.json --gantt step.png --trace step.json
    pesto check graph.json plan.json
    pesto evaluate graph.json placement.json --cluster v100x4_pcie

Exit codes
----------
0 success; 1 the problem or plan is infeasible or invalid (e.g. out of memory,
``check`` found violations); 2 bad input (missing file, malformed or cyclic
graph, unknown placer, preset or model); 3 a needed component is not
installed (e.g. TensorFlow for ``profile``); 130 interrupted (Ctrl-C or SIGTERM
during ``place``: the best plan so far is printed and written with status
``interrupted``; a second Ctrl-C aborts at once, writing nothing, as does one
before the first heuristic made a plan).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import threading
import time
from pathlib import Path

from solver import PLACERS, accepted_options, get_placer
from solver.pipeline_baselines import SCHEDULES, data_parallel_plan, pipeline_plan
from solver.step_search import step_graph, with_marks

from . import __version__
from . import cluster as C
from .api import default_cluster, evaluate, raise_overrun, solve_step
from .errors import InfeasibleError, InvalidPlanError, PestoError
from .graph import OpGraph
from .memory import fmt_bytes
from .plan import Plan, check_plan
from .simulate import simulate

EXIT_OK, EXIT_INFEASIBLE, EXIT_INPUT, EXIT_MISSING, EXIT_INTERRUPTED = 0, 1, 2, 3, 130

ZOO_MODELS = ("rnnlm", "nmt", "transformer", "nasnet")
EXACT_PLACERS = ("cpsat", "mip")

EPILOG = """\
exit codes:
  0    success
  1    infeasible or invalid: no plan fits memory, or `check` found violations
  2    bad input: missing file, malformed/cyclic graph, unknown placer/preset/model
  3    a needed component is not installed (e.g. TensorFlow for `profile`)
  130  interrupted (the best plan so far is written; a second Ctrl-C, or one before
       any plan exists, aborts writing nothing)
"""


class CliError(Exception):
    """A user error with the exit code to return."""

    def __init__(self, message: str, code: int = EXIT_INPUT):
        super().__init__(message)
        self.code = code


# -- helpers -------------------------------------------------------------------
def _say(args, msg: str) -> None:
    if not getattr(args, "quiet", False):
        print(msg, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _progress(args, desc: str, seconds: float | None = None):
    """A stage line on stderr and, on a terminal, a tqdm bar ticking towards
    ``seconds`` (a solver time limit) so long solves show they are alive."""
    _say(args, f"{desc} ...")
    t0 = time.perf_counter()
    bar = stop = thread = None
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
        yield
    finally:
        if bar is not None:
            stop.set()
            thread.join()
            bar.close()
        _say(args, f"{desc}: done in {time.perf_counter() - t0:.1f} s")


def _need_file(path: str, what: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise CliError(f"{what} file not found: {path}")
    if p.is_dir():
        raise CliError(f"{what} path is a directory, not a file: {path}")
    return p


def _load(path: str, what: str, cls):
    """``cls.from_json`` of a file, with the file named in any error."""
    p = _need_file(path, what)
    try:
        return cls.from_json(str(p))
    except PestoError as exc:
        raise CliError(f"{path}: {exc}") from None


def load_graph(path: str):
    """An OpGraph from a JSON file (or .json.gz)."""
    return _load(path, "graph", OpGraph)


def load_plan(path: str):
    """A Plan from a JSON file, and the cluster ``pesto place`` saved with it
    (its ``"cluster"`` key; older files kept it in ``stats``), or None."""
    plan = _load(path, "plan", Plan)
    data = json.loads(Path(path).read_text())  # valid: it just loaded as a plan
    saved = data.get("cluster") or (plan.stats or {}).get("cluster")
    return plan, saved if isinstance(saved, dict) else None


def parse_model(spec: str) -> tuple[str, str | None]:
    """``"rnnlm:2x2048"`` -> ``("rnnlm", "2x2048")``; ``"nmt"`` -> ``("nmt", None)``."""
    name, _, preset = spec.partition(":")
    name = name.strip().lower()
    if name not in ZOO_MODELS:
        raise CliError(f"unknown model {spec!r}: expected one of {list(ZOO_MODELS)} "
                       "(optionally NAME:PRESET, e.g. rnnlm:2x2048) or an OpGraph .json file")
    return name, (preset or None)


def profile_model(args, spec: str, preset: str | None = None, costs: str = "v100"):
    """Profile a zoo model into an OpGraph through ``tf_patch.opgraph_for``."""
    name, spec_preset = parse_model(spec)
    preset = preset or spec_preset or "small"
    try:  # TensorFlow is optional: imported only when a zoo model is profiled
        from tf_patch import opgraph_for
    except ImportError as exc:
        raise CliError(f"profiling a zoo model needs TensorFlow and tf_patch ({exc}); "
                       "install with `pip install -e .[tf]` or pass an OpGraph .json", EXIT_MISSING) from None
    with _progress(args, f"profiling {name}:{preset} (costs={costs})"):
        try:
            return opgraph_for(name, preset, costs=costs)
        except (KeyError, ValueError) as exc:
            raise CliError(f"cannot build model {name!r} preset {preset!r}: {exc}") from None


def graph_from_target(args, target: str):
    """An OpGraph from a JSON path or a zoo model spec."""
    if target.endswith(".json") or os.sep in target or Path(target).exists():
        return load_graph(target)
    return profile_model(args, target, costs=getattr(args, "costs", "v100"))


def make_cluster(graph, gpus: int | None, cluster: str | None):
    """The cluster named by ``--cluster`` (preset or JSON), else ``gpus`` identical
    V100s over NVLink, plus ``/CPU:0`` when some op may run only on a CPU
    (:func:`pesto.api.default_cluster`)."""
    if cluster:
        if cluster.endswith(".json"):
            _need_file(cluster, "cluster")
        try:
            cl = C.preset(cluster)
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


def cluster_for_plan(graph, plan, cluster_arg: str | None, saved: dict | None = None):
    """``--cluster`` if given, else ``saved`` (the cluster ``pesto place`` wrote
    into the plan file), else identical GPUs (and /CPU:0) as many as the plan uses."""
    if cluster_arg:
        return make_cluster(graph, None, cluster_arg)
    if saved is not None:
        return C.Cluster.from_dict(saved)
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


def run_placer(args, graph, cluster, placer: str):
    """Place ``graph`` with ``placer``: the exact ones go through :func:`pesto.solve_step`
    (coarsen, solve, expand, simulate, check; ``--micro-batches``), the
    micro-batch baselines through :mod:`solver.pipeline_baselines`, the others
    through the registry (given ``--time-limit`` and ``--seed`` when they take
    them). Returns the plan and the graph it places (the step, or its split
    or replicated form)."""
    if placer not in PLACERS:
        raise CliError(f"unknown placer {placer!r}; known: {', '.join(sorted(PLACERS))}")
    micro = getattr(args, "micro_batches", 1)
    if placer in EXACT_PLACERS:
        with _progress(args, f"{placer}: solving (time limit {args.time_limit:g} s; graphs above "
                             f"{args.target_vertices} ops are coarsened)", args.time_limit):
            try:
                r = solve_step(graph, cluster=cluster, time_limit=args.time_limit,
                               target_vertices=args.target_vertices, backend=placer, seed=args.seed,
                               deterministic=getattr(args, "deterministic", False),
                               progress=lambda line: _say(args, line), micro_batches=micro,
                               batch_size=getattr(args, "batch_size", None))
            except ValueError as exc:  # an option pesto.solve rejects (e.g. --target-vertices 0)
                raise CliError(str(exc)) from None
            return r.plan, r.graph
    if micro == "auto":
        raise CliError(f"--micro-batches auto needs placer cpsat or mip, not {placer!r}")
    try:
        return _place_step(args, graph, cluster, placer, micro)
    except ValueError as exc:  # MicroBatchError, BatchMarkError
        raise CliError(f"{placer}: {exc}") from None


def _place_step(args, graph, cluster, placer: str, micro: int):
    """A non-exact placer's plan and the graph it places (``micro`` slices:
    GPipe and 1F1B default to 4, data parallelism to 1; a heuristic places the split step)."""
    with _progress(args, f"{placer}: placing {graph.num_ops} ops"):
        if placer in SCHEDULES:
            r = pipeline_plan(with_marks(graph), cluster, schedule=placer, micro_batches=micro if micro > 1 else 4)
            return r.plan, r.graph
        if placer == "data-parallel":
            r = data_parallel_plan(with_marks(graph), cluster, micro_batches=micro)
            return r.plan, r.graph
        placed = graph if micro == 1 else step_graph(graph, micro, "micro-batched")
        try:
            fn = get_placer(placer)
        except (ImportError, AttributeError) as exc:
            raise CliError(f"placer {placer!r} is not available: {exc}", EXIT_MISSING) from None
        return fn(placed, cluster, **accepted_options(fn, {"time_limit": args.time_limit, "seed": args.seed})), placed


def describe_plan(plan, cluster) -> str:
    lines = [plan.summary()]
    if plan.log is not None:  # from pesto.solve: the stages and who won
        log = plan.log
        stages = ", ".join(f"{s.name} {s.seconds:.1f} s" for s in log.stages)
        lines.append(f"  {log.pipeline} pipeline: {stages}; plan from {log.winner}, "
                     f"bound from {log.bound_source}")
    peak = plan.peak_memory or {}
    for d in cluster.devices:
        nops = len(plan.order.get(d.name, ()))
        if nops or peak.get(d.name):
            p = peak.get(d.name)
            flag = "  OOM" if p is not None and p > d.memory else ""
            lines.append(f"  {d.name:>10}: {nops:6d} ops, peak {fmt_bytes(p)} of {fmt_bytes(d.memory)}{flag}")
    return "\n".join(lines)


def describe_step(plan, placed) -> str:
    """What the plan of a transformed step places, and every step compared (``--micro-batches``)."""
    log, stats = plan.log, plan.stats or {}
    m = log.micro_batches if log is not None else stats.get("micro_batches", 1)
    kind = log.graph_kind if log is not None else ("replicated" if "replicas" in stats else "micro-batched")
    lines = [f"  plan of the {kind} step {placed.name}: {m} micro-batch(es), {placed.num_ops} ops"]
    if log is not None and log.steps:
        lines.append("  steps compared: " + ", ".join(f"{k} {v / 1000:.3f} ms" for k, v in log.steps.items()))
    return "\n".join(lines)


def step_graph_path(plan_path: str) -> str:
    """Where ``pesto place -o plan.json`` writes the graph its plan places: ``plan.graph.json.gz``."""
    p = Path(plan_path)
    stem = p.name[:-len(p.suffix)] if p.suffix else p.name
    return str(p.with_name(f"{stem}.graph.json.gz"))


def check_output(path, what: str, suffixes=None) -> None:
    """Refuse, before any work, an output path whose directory is missing or
    whose suffix the writer does not know (so no solve is lost at the end)."""
    if not path:
        return
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise CliError(f"{what} {path}: directory {parent} does not exist")
    if suffixes is not None and Path(path).suffix.lower().lstrip(".") not in suffixes:
        raise CliError(f"{what} {path}: unknown file type; use one of {', '.join(sorted(suffixes))}")


GANTT_SUFFIXES = {"png", "svg", "pdf", "jpg", "jpeg", "eps", "ps", "tif", "tiff", "webp"}


# -- commands ------------------------------------------------------------------
def cmd_place(args) -> int:
    check_output(args.output, "plan file")
    graph = graph_from_target(args, args.target)
    cluster = make_cluster(graph, args.gpus, args.cluster)
    _say(args, f"graph {graph.name}: {graph.num_ops} ops, {graph.num_edges} edges; "
               f"cluster {cluster.name}: {', '.join(cluster.names)}")
    try:
        plan, placed = run_placer(args, graph, cluster, args.placer)
        if plan.status == "infeasible":  # a baseline's over-memory plan: said as pesto.solve says it
            raise_overrun(placed, cluster, plan)
    except InfeasibleError as exc:
        if exc.plan is not None:
            print(describe_plan(exc.plan, cluster))
        raise CliError(f"{exc}\nno plan written", EXIT_INFEASIBLE) from None
    print(describe_plan(plan, cluster))
    if placed is not graph:
        print(describe_step(plan, placed))
    if args.compare:
        rows = [(args.placer, plan.makespan)]
        for name in [c.strip() for c in args.compare.split(",") if c.strip()]:
            other, _ = run_placer(args, graph, cluster, name)
            rows.append((name, other.makespan))
        best = plan.makespan
        print("placer        step (ms)   vs this")
        for name, ms in rows:
            print(f"{name:<12} {ms / 1000:10.3f}   {ms / best:6.3f}x")
    if args.output:
        # the plan JSON plus the cluster and graph name, so `pesto simulate` replays on the same cluster
        data = {**plan.to_dict(), "cluster": cluster.to_dict(), "graph": placed.name}
        Path(args.output).write_text(json.dumps(data))
        _say(args, f"wrote {args.output}")
        if placed is not graph:  # the plan places another graph: write it next to the plan
            gpath = step_graph_path(args.output)
            placed.to_json(gpath)
            print(f"the plan places {placed.name} ({placed.num_ops} ops), written to {gpath}; verify with "
                  f"`pesto check {gpath} {args.output}` and `pesto simulate {gpath} {args.output}`")
    if plan.status == "interrupted":
        stopped = plan.log.stopped if plan.log is not None else "interrupt"
        print(f"pesto: interrupted ({stopped}): the best plan so far"
              + (f" was written to {args.output}" if args.output else " is shown above"), file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_OK


def cmd_simulate(args) -> int:
    check_output(args.trace, "trace file")
    check_output(args.gantt, "Gantt chart", GANTT_SUFFIXES)
    graph = load_graph(args.graph)
    plan, saved = load_plan(args.plan)
    cluster = cluster_for_plan(graph, plan, args.cluster, saved)
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
    if args.trace:
        sched.chrome_trace(args.trace)
        _say(args, f"wrote Chrome trace {args.trace} (open in https://ui.perfetto.dev)")
    if args.gantt:
        sched.gantt(args.gantt)
        _say(args, f"wrote Gantt chart {args.gantt}")
    over = any(sched.peak_memory.get(d.name, 0) > d.memory for d in cluster.devices)
    return EXIT_INFEASIBLE if over else EXIT_OK


def cmd_evaluate(args) -> int:
    check_output(args.output, "plan file")
    graph = load_graph(args.graph)
    _need_file(args.placement, "placement")
    cluster = make_cluster(graph, args.gpus, args.cluster)
    try:
        plan = evaluate(graph, args.placement, cluster=cluster)
    except json.JSONDecodeError as exc:
        raise CliError(f"{args.placement}: not valid JSON ({exc})") from None
    print(describe_plan(plan, cluster))
    if args.output:
        data = {**plan.to_dict(), "cluster": cluster.to_dict(), "graph": graph.name}
        Path(args.output).write_text(json.dumps(data))
        _say(args, f"wrote {args.output}")
    return EXIT_INFEASIBLE if plan.status == "infeasible" else EXIT_OK


def cmd_check(args) -> int:
    graph = load_graph(args.graph)
    plan, saved = load_plan(args.plan)
    cluster = cluster_for_plan(graph, plan, args.cluster, saved)
    report = check_plan(graph, cluster, plan, check_memory=not args.no_memory)
    if report.ok:
        print(f"plan is valid for {graph.name} on {cluster.name}")
        return EXIT_OK
    print(f"plan is INVALID ({len(report.violations)} violations):")
    for v in report.violations[:args.max_violations]:
        print(f"  {v}")
    if len(report.violations) > args.max_violations:
        print(f"  ... and {len(report.violations) - args.max_violations} more")
    return EXIT_INFEASIBLE


def cmd_profile(args) -> int:
    check_output(args.output, "graph file")
    graph = profile_model(args, args.model, args.preset, args.costs)
    out = args.output or f"{graph.name}.json"
    graph.to_json(out)
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
    sp.add_argument("--placer", default="cpsat", help="cpsat (default, = pesto.solve), mip, or a baseline; "
                                                      "see `pesto placers`")
    sp.add_argument("--time-limit", type=_at_least(0.001, float), default=60.0,
                    help="seconds for solving (default 60); loading or profiling the model comes on top")
    sp.add_argument("--target-vertices", type=_at_least(1), default=200, help="coarse graph size for cpsat/mip (default 200)")
    sp.add_argument("--seed", type=_at_least(0), default=0,
                    help="random seed of the solver and the heuristics (default 0)")
    sp.add_argument("--costs", default="v100", choices=["v100", "measured"],
                    help="how a zoo model is profiled (default v100: grappler's analytical model)")
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


def _at_least(lo: float, kind=int):
    """An argparse ``type``: a number of ``kind`` not below ``lo`` (NaN rejected),
    so a bad option is a usage error (exit 2) naming the option."""
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a{'n integer' if kind is int else ' number'}, "
                                             f"got {text!r}") from None
        if not v >= lo:  # also false for nan
            raise argparse.ArgumentTypeError(f"must be at least {lo:g}, got {text}")
        return v
    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


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
        print("pesto: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
