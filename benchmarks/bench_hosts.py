"""Placement across hosts: 2x2 and 4x2 V100 host clusters on a slow and a fast network.

Run: ``python -m benchmarks.bench_hosts [--quick] [--time-limit S] [--graphs a,b]``.
Writes ``benchmarks/results/hosts.csv`` and ``hosts.md``.

Zoo graphs with grappler's V100 costs (``benchmarks/graphs``) are placed on
:func:`pesto.cluster.hosts` clusters (NVLink inside a host, one NIC per host
shared by its GPUs in each direction) on 25 GbE and InfiniBand HDR, by every
baseline placer and by Pesto (``pesto.solve``, the default recipe; the
paper's MIP is formulated for 2 GPUs and is left out). Each placement runs in
a forked child with a timeout; its step time is an independent
``pesto.simulate`` replay with link contention. Per run: hosts used, ops on
each host, and the bytes one step sends over the NICs, which show how a
placement changes when the network gets slower.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import multiprocessing as mp
import os
import platform
import time
import traceback
from pathlib import Path

import pesto
from pesto.api import load_graph, needs_cpu
from pesto.cluster import NETWORKS, hosts
from pesto.simulate import simulate
from solver import accepted_options, get_placer

HERE = Path(__file__).resolve().parent
OUT = HERE / "results"
BASELINES = ["single", "expert", "m-topo", "m-etf", "m-sct", "celeritas", "metis", "heft"]
PLACERS = BASELINES + ["pesto"]
SHAPES = ((2, 2), (4, 2))
NETS = ("25gbe", "ib_hdr")  # slow, fast
GRAPHS = ("rnnlm_2x2048", "nmt_2x1024", "transformer_6")
FIELDS = ["graph", "ops", "cluster", "net", "placer", "status", "step_ms", "ratio_best_baseline", "wall_s",
          "hosts_used", "ops_per_host", "nic_mb", "error"]


def _place(graph, cluster, placer, time_limit):
    if placer == "pesto":
        return pesto.solve(graph, cluster=cluster, time_limit=time_limit, workers=1, seed=0)
    fn = get_placer(placer)
    return fn(graph, cluster, **accepted_options(fn, {"time_limit": time_limit, "seed": 0}))


def _child(conn, graph, cluster, placer, time_limit):
    try:
        t0 = time.perf_counter()
        plan = _place(graph, cluster, placer, time_limit)
        conn.send({"status": plan.status, "wall_s": time.perf_counter() - t0, "placement": dict(plan.placement),
                   "order": {d: list(o) for d, o in plan.order.items()}})
    except BaseException as exc:  # report everything, the parent decides
        conn.send({"status": "error", "error": f"{type(exc).__name__}: {exc}"[:300],
                   "traceback": traceback.format_exc(limit=3)})
    finally:
        conn.close()


def place(graph, cluster, placer, time_limit, timeout):
    """The placement in a forked child: ``{"status", "wall_s", "placement", "order"}``
    (status "timeout"/"error" when it hangs or fails)."""
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, graph, cluster, placer, time_limit), daemon=True)
    t0 = time.perf_counter()
    proc.start()
    child.close()
    out = parent.recv() if parent.poll(timeout) else None
    if proc.is_alive():
        proc.terminate()
        proc.join(5)
        if proc.is_alive():
            proc.kill()
    proc.join(5)
    if out is None:
        out = {"status": "timeout", "error": f"no plan within {timeout:.0f} s"}
    out.setdefault("wall_s", time.perf_counter() - t0)
    return out


def host_of(device: str) -> int:
    return int(device.split("/task:")[1].split("/")[0])


def measure(graph, cluster, placement, order) -> dict:
    """Simulated step (contention on), hosts used, ops per host, MB over the NICs per step."""
    plan = pesto.Plan(placement=placement, order=order) if order else placement
    sched = simulate(graph, cluster, plan)
    nbytes = {t.name: t.bytes for t in graph.tensors}
    nic = sum(nbytes[t.tensor] for t in sched.transfers if host_of(t.src) != host_of(t.dst))
    per: dict[int, int] = {}
    for d in placement.values():
        per[host_of(d)] = per.get(host_of(d), 0) + 1
    n_hosts = len({host_of(d) for d in cluster.names})
    return {"step_ms": sched.makespan / 1000, "hosts_used": len(per), "nic_mb": nic / 1e6,
            "ops_per_host": "/".join(str(per.get(h, 0)) for h in range(n_hosts))}


def graphs(args):
    if args.quick:
        from benchmarks.generators import lstm_grid, transformer_like

        return {"lstm_grid(4,8)": lstm_grid(4, 8), "transformer_like(3)": transformer_like(3)}
    names = args.graphs.split(",") if args.graphs else GRAPHS
    return {n: load_graph(str(HERE / "graphs" / f"{n}.json.gz")) for n in names}


def run(args, log=print) -> list[dict]:
    rows = []
    for gname, g in graphs(args).items():
        log(f"== {gname}: {g.num_ops} ops")
        for n_hosts, per in SHAPES:
            for net in NETS:
                cluster = hosts(n_hosts, per, net, with_cpu=needs_cpu(g))
                group = []
                for placer in PLACERS:
                    timeout = 2 * args.time_limit + 120 if placer == "pesto" else args.heuristic_timeout
                    r = place(g, cluster, placer, args.time_limit, timeout)
                    row = {"graph": gname, "ops": g.num_ops, "cluster": f"{n_hosts}x{per}", "net": net,
                           "placer": placer, "status": r["status"], "wall_s": round(r["wall_s"], 2),
                           "error": r.get("error", "")}
                    if "placement" in r:
                        row.update(measure(g, cluster, r["placement"], r["order"]))
                    group.append(row)
                    log(f"  {n_hosts}x{per} {net:<7} {placer:<10} {row['status']:<10} "
                        f"{row.get('step_ms', float('nan')):9.3f} ms  {row['wall_s']:6.1f} s  "
                        f"hosts {row.get('ops_per_host', '-')}  NIC {row.get('nic_mb', float('nan')):.1f} MB")
                _ratios(group)
                rows += group
    return rows


def _ratios(group):
    base = [r for r in group if r["placer"] in BASELINES and r.get("step_ms") is not None]
    best = min((r["step_ms"] for r in base), default=None)
    for r in group:
        if best and r.get("step_ms") is not None:
            r["ratio_best_baseline"] = round(r["step_ms"] / best, 3)


def network_lines(rows) -> list[str]:
    """How Pesto's placement changes from the slow to the fast network, per graph and shape."""
    out = []
    by = {(r["graph"], r["cluster"], r["net"]): r for r in rows if r["placer"] == "pesto" and r.get("step_ms")}
    for (g, c, net), slow in sorted(by.items()):
        if net != NETS[0] or (g, c, NETS[1]) not in by:
            continue
        fast = by[(g, c, NETS[1])]
        out.append(f"- {g} on {c}: {NETS[0]}: {slow['hosts_used']} host(s) used (ops per host {slow['ops_per_host']}), "
                   f"{slow['nic_mb']:.1f} MB over the NICs per step, {slow['step_ms']:.2f} ms; "
                   f"{NETS[1]}: {fast['hosts_used']} host(s) ({fast['ops_per_host']}), {fast['nic_mb']:.1f} MB, "
                   f"{fast['step_ms']:.2f} ms")
    return out


def write(rows, args) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    suffix = "_quick" if args.quick else ""
    with open(OUT / f"hosts{suffix}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    nets = "; ".join(f"`{n}`: {NETWORKS[n].beta0:g} µs + {NETWORKS[n].gbit_s:g} Gb/s ({NETWORKS[n].source})"
                     for n in NETS)
    lines = ["# Placement across hosts (simulated V100 costs)", "",
             f"{now}; {os.cpu_count()} cores (shared), Python {platform.python_version()}; "
             f"clusters `pesto.cluster.hosts(H, 2, net)`: NVLink inside a host, one NIC per host shared by its "
             f"GPUs in each direction; networks {nets}. Step = `pesto.simulate` replay with link contention; "
             f"Pesto = `pesto.solve(time_limit={args.time_limit:g}, workers=1)`; ratio = step / best baseline "
             f"of the same graph, cluster and network; NIC MB = bytes one step sends between hosts.", "",
             "## How placement changes with the network (Pesto)", "", *network_lines(rows), "",
             "## Every placer", "",
             "| graph | cluster | net | placer | status | step (ms) | / best baseline | place s | ops per host | NIC MB |",
             "|---|---|---|---|---|---:|---:|---:|---|---:|"]
    for r in rows:
        step = f"{r['step_ms']:.3f}" if r.get("step_ms") is not None else "-"
        nic = f"{r['nic_mb']:.1f}" if r.get("nic_mb") is not None else "-"
        lines.append(f"| {r['graph']} | {r['cluster']} | {r['net']} | {r['placer']} | {r['status']} | {step} | "
                     f"{r.get('ratio_best_baseline', '-')} | {r['wall_s']} | {r.get('ops_per_host', '-')} | {nic} |"
                     + (f" {r['error'][:80]}" if r.get("error") else ""))
    (OUT / f"hosts{suffix}.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="two small synthetic graphs (smoke run)")
    ap.add_argument("--time-limit", type=float, default=20.0, help="Pesto's (and m-SCT's LP) seconds per run")
    ap.add_argument("--heuristic-timeout", type=float, default=300.0, help="seconds before a baseline is cut off")
    ap.add_argument("--graphs", help=f"comma-separated zoo graphs (default {','.join(GRAPHS)})")
    args = ap.parse_args(argv)
    if args.quick:
        args.time_limit = min(args.time_limit, 3.0)
    rows = run(args)
    write(rows, args)
    return 0 if all(r["status"] not in ("error", "timeout") for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
