"""``make demo HOSTS=2``: place and train a zoo model across hosts on TensorFlow's distributed runtime.

    python -m tf_patch.demo_hosts [--hosts 2] [--devices 2] [--model rnnlm] [--steps 20] [--timeout 300]

Starts ``--hosts`` ``tf.distribute.Server`` processes on free localhost ports
(the stand-in for hosts; each with ``--devices`` logical CPU devices when
there is no GPU), profiles the model here, fits the transfer cost inside a
host and between two servers (gRPC), builds the host cluster
(:func:`pesto.cluster.hosts`), places it with ``pesto.solve``, enforces the
plan on task-qualified devices and trains in a session on the cluster.
Prints ops per host and device (planned and traced), predicted and measured
step time, and the losses next to a single-process run of the same model;
then stops the servers. The whole run is bounded by ``--timeout`` seconds.
"""
from __future__ import annotations

from . import needs_tf  # noqa: F401  (an ImportError naming the tf extra without TensorFlow)
import argparse
import os
import signal
import sys
import time

from pesto import solve
from pesto.cluster import GiB, Network, hosts
from pesto.simulate import simulate

from .commfit import fit_transfers
from .demo import ZOO_MODELS, cluster_kind
from .distributed import LocalServers, fit_task_transfers, run_on_servers, single_process_losses
from .workflow import profile_model
from .zoo import build_model

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


class DemoTimeout(TimeoutError):
    """The demo ran past ``--timeout``."""


def _alarm(signum, frame):
    raise DemoTimeout("the demo ran past its --timeout; servers stopped")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tf_patch.demo_hosts", description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=2, help="servers (stand-ins for hosts)")
    ap.add_argument("--devices", type=int, default=2, help="devices per host (logical if no GPU)")
    ap.add_argument("--model", default="rnnlm", choices=ZOO_MODELS)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--steps", type=int, default=20, help="training steps compared with the single-process run")
    ap.add_argument("--time-limit", type=float, default=10.0, help="solver seconds")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole demo")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.hosts < 1 or args.devices < 1 or args.steps < 1:
        ap.error("--hosts, --devices and --steps must be at least 1")

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(max(1, int(args.timeout)))
    servers = LocalServers(args.hosts, args.devices, start_timeout=min(120.0, args.timeout),
                           op_timeout=min(60.0, args.timeout))
    try:
        servers.launch()  # the servers start while this process profiles the model
        return _run(args, servers)
    except DemoTimeout as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 124
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        servers.close()
        left = [p.pid for p in servers.procs if p.poll() is None]
        print(f"servers stopped ({len(servers.procs)} processes, {len(left)} left running)")


def _run(args, servers) -> int:
    def build():
        return build_model(args.model, args.preset, seed=args.seed)

    t0 = time.perf_counter()
    graph, prof = profile_model(build, n_devices=args.devices, steps=5)
    kind = cluster_kind(graph)
    print(f"[1/5] {args.model}/{args.preset}: {graph.num_ops} ops, serial work "
          f"{graph.total_work(kind) / 1000:.2f} ms ({kind}); profiled in {time.perf_counter() - t0:.1f} s")
    intra = fit_transfers(args.devices, repeats=5)
    servers.wait_ready()
    print(f"      {servers.n_tasks} servers ready: {', '.join(servers.spec['worker'])} "
          f"({servers.devices_per_task} {servers.kind} devices each)")
    b0, b1, r2 = fit_task_transfers(servers)
    net = Network("local-grpc", max(b0, 0.0), max(b1, 0.0), f"measured now between two local servers (R^2 {r2:.2f})")
    cluster = hosts(args.hosts, args.devices, net, kind=servers.kind,
                    intra=(max(intra.beta0, 0.0), max(intra.beta1, 0.0)), memory=4 * GiB)
    print(f"[2/5] inside a host: {intra}; between hosts (gRPC): {b0:.1f} us + {b1 * 1e6:.4f} us/MB")
    t0 = time.perf_counter()
    plan = solve(graph, cluster=cluster, time_limit=args.time_limit, workers=1, seed=args.seed)
    print(f"[3/5] {plan.summary()}; placed in {time.perf_counter() - t0:.1f} s")
    one = simulate(graph, cluster, {o: cluster.names[0] for o in graph.names}).makespan
    print(f"[4/5] training {args.steps} steps on the servers, then the same model in one process...")
    res = run_on_servers(build, plan, servers, steps=args.steps, timed=10, trace=True)
    single = single_process_losses(build, args.steps, servers.kind)
    return 0 if _report(plan, res, single, one, servers) else 1


def _report(plan, res, single, one_device_us, servers) -> bool:
    """Print the run; True when the losses equal the single-process run's."""
    tr = res.trace
    print("[5/5] ops per host and device (planned / traced):")
    planned: dict[str, int] = {}
    for d in plan.placement.values():
        planned[d] = planned.get(d, 0) + 1
    for t in range(servers.n_tasks):
        print(f"  host {t} (localhost:{servers.ports[t]})")
        for k in range(servers.devices_per_task):
            name = servers.device(t, k)
            print(f"    {name:<44} {planned.get(name, 0):>6} / {tr['ops_per_device'].get(name, 0):<6}")
    print(f"  plan enforced: {res.applied.note}; {len(res.applied.control_edges)} control edges added; "
          f"trace: {len(tr['misplaced'])} ops off-plan, {len(tr['order_violations'])}/{tr['checked_edges']} "
          "order violations")
    print(f"  step time: predicted {plan.makespan / 1000:.3f} ms (all on one device: {one_device_us / 1000:.3f} ms), "
          f"measured {res.step_us / 1000:.3f} ms (median of {len(res.step_times)})")
    worst = max(abs(a - b) for a, b in zip(res.losses, single))
    same = worst <= 1e-6 * max(1.0, max(abs(v) for v in single))
    print(f"  losses, {servers.n_tasks} hosts: " + ", ".join(f"{v:.4f}" for v in res.losses[:3])
          + f" ... {res.losses[-1]:.4f}")
    print("  losses, one process: " + ", ".join(f"{v:.4f}" for v in single[:3]) + f" ... {single[-1]:.4f}")
    print(f"  {'equal' if same else 'DIFFERENT'}: largest difference {worst:.2e} over {len(res.losses)} steps")
    if servers.kind == "CPU":
        print("  (logical CPU devices and local servers share this machine's cores and talk gRPC over\n"
              "   loopback: measured times show the distributed path works, not a real cluster's speed)")
    return same


if __name__ == "__main__":
    sys.exit(main())
