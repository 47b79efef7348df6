"""Devices, links and the linear communication model.

A :class:`Cluster` has devices (TF name, kind, memory, relative speed) and, for
every ordered pair of distinct devices, a :class:`Route`: the link resources a
transfer occupies and the fit ``beta0 + beta1 * bytes`` (µs). A link resource
carries one transfer at a time (FCFS), and several routes may share one (a PCIe
switch, a host NIC). With ``contention_free=True`` transfers never queue: the
classic DAG-scheduling model.

JSON schema (``format = "pesto.cluster"``, ``version = 1``)::

    {"format": "pesto.cluster", "version": 1, "name": "v100x2_nvlink",
     "contention_free": false,
     "devices": [{"name": "/GPU:0", "kind": "GPU", "memory": 17179869184, "speed": 1.0}],
     "routes": [{"src": "/GPU:0", "dst": "/GPU:1", "links": ["nvlink:0>1"],
                 "beta0": 40.77, "beta1": 2.0757e-05}]}

Examples
--------
>>> c = v100x2_nvlink()
>>> [d.name for d in c.devices]
['/GPU:0', '/GPU:1', '/CPU:0']
>>> round(c.transfer_time("/GPU:0", "/GPU:1", 1_000_000), 2)
61.53
"""
from __future__ import annotations

import json
import math
import numbers
import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from .jsonio import write as _write_document
from .errors import InvalidClusterError, SchemaError
from .graph import _check_header, _field, _load_json
from .symmetry import Swaps

FORMAT = "pesto.cluster"
VERSION = 1
GiB = 1 << 30
SPEED_RANGE = (1e-6, 1e6)  # a device speed outside it makes durations overflow the solvers' integers

__all__ = ["Device", "Route", "Cluster", "v100x2_nvlink", "v100x8_nvlink", "v100x4_pcie", "gpus",
           "logical_cpus", "heterogeneous", "two_hosts", "hosts", "NETWORKS", "Network", "task_device",
           "PRESETS", "preset", "GiB"]

# Published fits (Pesto paper section 5.1; Celeritas for PCIe), µs and µs/byte.
NVLINK_GG = (40.77, 2.0757e-5)
NVLINK_CG = (7.0, 7.7778e-5)
PCIE_GG = (5.581, 1.00244e-4)
# Inter-host 10 GbE-class link: 1.25 GB/s and ~30 µs latency.
NIC = (30.0, 8.0e-4)


@dataclass(frozen=True)
class Network:
    """A named inter-host network fit: ``beta0`` µs + ``beta1`` µs/byte, and where it comes from."""

    name: str
    beta0: float
    beta1: float
    source: str

    @property
    def beta(self) -> tuple:
        return (self.beta0, self.beta1)

    @property
    def gbit_s(self) -> float:
        """Bandwidth in Gbit/s (8e-3 / beta1: 1 µs/byte is 8 Mbit/s)."""
        return 8e-3 / self.beta1


# Bandwidth is the line rate (an upper bound: TCP/gRPC framing takes ~5% more,
# a real job's fit comes from tf_patch.commfit); latency is the one-way
# small-message figure of the usual transport on that fabric.
NETWORKS = {
    "10gbe": Network("10gbe", *NIC, "10 Gb/s line rate (IEEE 802.3ae), ~30 µs one-way kernel TCP; "
                     "the fit two_hosts() always used"),
    "25gbe": Network("25gbe", 25.0, 8 / 25e3, "25 Gb/s line rate (IEEE 802.3by 25GBASE-R) = 3.125 GB/s; "
                     "25 µs one-way: kernel TCP small-message latency on a 25 GbE NIC and switch"),
    "100gbe": Network("100gbe", 10.0, 8 / 100e3, "100 Gb/s line rate (IEEE 802.3bj 100GBASE-CR4) = 12.5 GB/s; "
                      "10 µs one-way: kernel TCP on a 100 GbE NIC with interrupt moderation off"),
    "ib_hdr": Network("ib_hdr", 2.0, 8 / 200e3, "InfiniBand HDR 4x, 200 Gb/s (InfiniBand Trade Association "
                      "spec vol. 2 rel. 1.4) = 25 GB/s; 2 µs one-way: RDMA verbs (NVIDIA ConnectX-6 brief: "
                      "<0.6 µs port to port) plus host and switch"),
}


@dataclass(frozen=True)
class Device:
    """A device as TensorFlow names it (``"/GPU:0"``), of a ``kind``."""

    name: str
    kind: str = "GPU"
    memory: int = 16 * GiB
    speed: float = 1.0


@dataclass(frozen=True)
class Route:
    """How a transfer goes from ``src`` to ``dst``: the links it holds and its cost."""

    src: str
    dst: str
    links: tuple
    beta0: float
    beta1: float

    def time(self, nbytes: int) -> float:
        return self.beta0 + self.beta1 * nbytes if nbytes > 0 else 0.0


def _cost_ok(b) -> bool:
    """A finite non-negative number (``float``/``int`` checked first: a 500-GPU
    cluster has 250k routes, and an ``isinstance`` against ``numbers.Real`` is slow)."""
    if type(b) is float or type(b) is int:
        return b >= 0 and math.isfinite(b)
    return isinstance(b, numbers.Real) and not isinstance(b, bool) and math.isfinite(b) and b >= 0


class Cluster:
    """Immutable set of devices with routes between every ordered pair.

    Parameters
    ----------
    devices : iterable of Device
    routes : iterable of Route
        One per ordered pair of distinct devices.
    contention_free : bool
        If true, transfers never queue on links.

    Raises
    ------
    InvalidClusterError
        Duplicate device, bad memory or speed (not a finite number in
        ``SPEED_RANGE``: durations are scaled by ``1 / speed`` into the
        solvers' integer ranges), missing or unknown route endpoint.
    """

    def __init__(self, devices: Iterable[Device], routes: Iterable[Route] = (), *,
                 contention_free: bool = False, name: str = "cluster"):
        self.name = name
        self.contention_free = bool(contention_free)
        self.devices: tuple[Device, ...] = tuple(devices)
        if not self.devices:
            raise InvalidClusterError("a cluster needs at least one device")
        self.index: dict[str, int] = {}
        for i, d in enumerate(self.devices):
            if not isinstance(d, Device):
                raise InvalidClusterError(f"expected Device, got {type(d).__name__}: {d!r}")
            if not isinstance(d.name, str) or not d.name:
                raise InvalidClusterError(f"device name must be a non-empty string, got {d.name!r}")
            if not isinstance(d.kind, str) or not d.kind:
                raise InvalidClusterError(f"device {d.name!r}: kind must be a non-empty string "
                                          f"such as 'GPU', got {d.kind!r}")
            if d.name in self.index:
                raise InvalidClusterError(f"duplicate device {d.name!r}")
            if not (isinstance(d.memory, numbers.Integral) and not isinstance(d.memory, bool)
                    and d.memory > 0):
                raise InvalidClusterError(f"device {d.name!r} has invalid memory {d.memory!r}")
            if not (isinstance(d.speed, numbers.Real) and math.isfinite(d.speed) and d.speed > 0):
                raise InvalidClusterError(f"device {d.name!r} has invalid speed {d.speed!r}")
            if not SPEED_RANGE[0] <= d.speed <= SPEED_RANGE[1]:
                raise InvalidClusterError(
                    f"device {d.name!r} has speed {d.speed:g}: speeds are relative (1.0 = the profiled "
                    f"GPU) and must lie in {SPEED_RANGE[0]:g} .. {SPEED_RANGE[1]:g}")
            self.index[d.name] = i
        self._routes: dict[tuple[str, str], Route] = {}
        for r in routes:
            for end in (r.src, r.dst):
                if end not in self.index:
                    raise InvalidClusterError(f"route {r.src!r} -> {r.dst!r} names unknown device {end!r}")
            if r.src == r.dst:
                raise InvalidClusterError(f"route from {r.src!r} to itself (same-device transfers are free)")
            if (r.src, r.dst) in self._routes:
                raise InvalidClusterError(f"two routes from {r.src!r} to {r.dst!r}")
            for b in (r.beta0, r.beta1):
                if not _cost_ok(b):
                    raise InvalidClusterError(f"route {r.src!r} -> {r.dst!r} has an invalid cost {b!r}")
            if isinstance(r.links, str) or not all(isinstance(x, str) and x for x in r.links):
                got = r.links if isinstance(r.links, str) else list(r.links)
                raise InvalidClusterError(f"route {r.src!r} -> {r.dst!r}: links must be a list of names "
                                          f"(non-empty strings), got {got!r}")
            if not (type(r) is Route and type(r.links) is tuple and type(r.beta0) is float
                    and type(r.beta1) is float):  # already as stored (500 GPUs: 250k routes)
                r = Route(r.src, r.dst, tuple(r.links), float(r.beta0), float(r.beta1))
            self._routes[(r.src, r.dst)] = r
        for a in self.devices:
            for b in self.devices:
                if a is not b and (a.name, b.name) not in self._routes:
                    raise InvalidClusterError(f"no route from {a.name!r} to {b.name!r}")
        self.links: tuple[str, ...] = tuple(sorted({l for r in self._routes.values() for l in r.links}))

    def __repr__(self):
        return f"Cluster({self.name!r}, devices={[d.name for d in self.devices]})"

    def __len__(self):
        return len(self.devices)

    def device(self, name: str) -> Device:
        try:
            return self.devices[self.index[name]]
        except KeyError:
            raise InvalidClusterError(
                f"unknown device {name!r}; cluster has {[d.name for d in self.devices]}") from None

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.devices]

    def devices_of_kind(self, kind: str) -> list[Device]:
        return [d for d in self.devices if d.kind == kind]

    @property
    def gpus(self) -> list[Device]:
        return self.devices_of_kind("GPU")

    def route(self, src: str, dst: str) -> Route:
        try:
            return self._routes[(src, dst)]
        except KeyError:
            raise InvalidClusterError(f"no route from {src!r} to {dst!r}") from None

    @property
    def routes(self) -> tuple[Route, ...]:
        return tuple(self._routes.values())

    def transfer_time(self, src: str, dst: str, nbytes: int) -> float:
        """µs to move ``nbytes`` from ``src`` to ``dst`` (0 on the same device)."""
        if src == dst or nbytes <= 0:
            return 0.0
        return self.route(src, dst).time(nbytes)

    def identical_groups(self) -> list[list[str]]:
        """Interchangeable devices, for symmetry breaking.

        Two devices are interchangeable when swapping them maps the cluster
        onto itself (:meth:`swap_keeps`). Swaps compose, so every permutation
        inside a returned group is a symmetry. Groups (of one device too) come
        in the order of their first device. A device is compared only with the
        groups of the same signature (kind, memory, speed, route costs in and
        out, hashed), so 500 identical GPUs take a fraction of a second, not minutes.

        Examples
        --------
        >>> two_hosts().identical_groups()[0]
        ['/job:worker/task:0/device:GPU:0', '/job:worker/task:0/device:GPU:1']
        >>> v100x2_nvlink().identical_groups()
        [['/GPU:0', '/GPU:1'], ['/CPU:0']]
        """
        names = self.names
        return [[names[i] for i in g] for g in self._swaps().groups()]

    def swap_keeps(self, a: str, b: str) -> bool:
        """Whether swapping devices ``a`` and ``b`` maps the cluster onto
        itself: same kind, memory and speed, every route keeps its cost and
        its number of links, and (unless contention-free) links stay shared
        by the same routes (:mod:`pesto.symmetry`).

        >>> v100x4_pcie().swap_keeps("/GPU:0", "/GPU:3"), v100x4_pcie().swap_keeps("/GPU:0", "/CPU:0")
        (True, False)
        """
        self.device(a), self.device(b)  # unknown names raise
        return self._swaps().swap_keeps(self.index[a], self.index[b])

    def _swaps(self) -> Swaps:
        if getattr(self, "_swap_index", None) is None:
            self._swap_index = Swaps(self)
        return self._swap_index

    def with_memory(self, memory: int | Mapping[str, int]) -> "Cluster":
        """A copy with new memory capacities (one value for all, or per device)."""
        if isinstance(memory, Mapping):
            for name in memory:
                if name not in self.index:
                    raise InvalidClusterError(f"with_memory: unknown device {name!r}; cluster has {self.names}")
            devs = [Device(d.name, d.kind, memory.get(d.name, d.memory), d.speed) for d in self.devices]
        else:
            devs = [Device(d.name, d.kind, memory, d.speed) for d in self.devices]
        return Cluster(devs, self.routes, contention_free=self.contention_free, name=self.name)

    def subset(self, names: Iterable[str]) -> "Cluster":
        """The cluster restricted to devices ``names`` (and the routes among
        them, links included): a plan on it is a plan on ``self`` too.

        >>> two_hosts().subset(["/job:worker/task:0/device:GPU:0", "/job:worker/task:0/device:GPU:1"]).names
        ['/job:worker/task:0/device:GPU:0', '/job:worker/task:0/device:GPU:1']
        """
        keep = list(dict.fromkeys(names))
        for n in keep:
            self.device(n)  # raises on an unknown name
        kept = set(keep)
        return Cluster([self.device(n) for n in keep],
                       [r for r in self.routes if r.src in kept and r.dst in kept],
                       contention_free=self.contention_free, name=f"{self.name}[{len(keep)}]")

    def with_contention_free(self, flag: bool = True) -> "Cluster":
        return Cluster(self.devices, self.routes, contention_free=flag, name=self.name)

    # -- JSON ------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "name": self.name,
                "contention_free": self.contention_free,
                "devices": [{"name": d.name, "kind": d.kind, "memory": d.memory, "speed": d.speed}
                            for d in self.devices],
                "routes": [{"src": r.src, "dst": r.dst, "links": list(r.links),
                            "beta0": r.beta0, "beta1": r.beta1} for r in self._routes.values()]}

    @classmethod
    def from_dict(cls, d: Mapping) -> "Cluster":
        """Inverse of :meth:`to_dict`; a field of the wrong type (``"memory": true``,
        ``"contention_free": "false"``, links that are not names) raises
        :class:`SchemaError` or :class:`InvalidClusterError` naming it."""
        _check_header(d, FORMAT, VERSION)
        cf, name = d.get("contention_free", False), d.get("name", "cluster")
        if not isinstance(cf, bool):
            raise SchemaError(f"{FORMAT}: contention_free must be true or false, got {cf!r}")
        if not isinstance(name, str):
            raise SchemaError(f"{FORMAT}: name must be a string, got {name!r}")
        try:
            devs = [_device_from(x) for x in _entries(d, "devices")]
            routes = [Route(r["src"], r["dst"], _links_from(r), r["beta0"], r["beta1"])
                      for r in _entries(d, "routes")]
        except KeyError as exc:
            raise SchemaError(f"{FORMAT}: an entry lacks required field {exc.args[0]!r}") from None
        return cls(devs, routes, contention_free=cf, name=name)

    def to_json(self, path=None, indent=2):
        """JSON text, or write it to ``path`` (gzip-compressed if it ends in
        ``.gz``; atomically: :func:`pesto.jsonio.write`)."""
        text = json.dumps(self.to_dict(), indent=indent)
        if path is None:
            return text
        _write_document(path, text)
        return None

    @classmethod
    def from_json(cls, source) -> "Cluster":
        return cls.from_dict(_load_json(source))

    def __eq__(self, other):
        return isinstance(other, Cluster) and self.to_dict() == other.to_dict()

    __hash__ = None


def _entries(d: Mapping, key: str) -> list:
    items = _field(d, key)
    if not isinstance(items, list) or not all(isinstance(x, Mapping) for x in items):
        raise SchemaError(f"{FORMAT}: {key} must be a list of objects, got {items!r:.80}")
    return items


def _device_from(x: Mapping) -> Device:
    """A device entry; memory a whole number of bytes, speed a number (no booleans)."""
    memory, speed = x["memory"], x.get("speed", 1.0)
    if (isinstance(memory, bool) or not isinstance(memory, (int, float)) or not math.isfinite(memory)
            or memory != int(memory)):
        raise SchemaError(f"{FORMAT}: device {x.get('name')!r}: memory must be a whole number of bytes, got {memory!r}")
    if isinstance(speed, bool) or not isinstance(speed, (int, float)):
        raise SchemaError(f"{FORMAT}: device {x.get('name')!r}: speed must be a number, got {speed!r}")
    return Device(x["name"], x.get("kind", "GPU"), int(memory), float(speed))


def _links_from(r: Mapping) -> tuple:
    links = r["links"]
    if not isinstance(links, list):
        raise SchemaError(f"{FORMAT}: route {r.get('src')!r} -> {r.get('dst')!r}: links must be a list, got {links!r}")
    return tuple(links)


# -- presets -------------------------------------------------------------------
def _p2p(names, beta, prefix):
    """A dedicated link per ordered pair (full-duplex point-to-point)."""
    return [Route(a, b, (f"{prefix}:{a}>{b}",), *beta) for a in names for b in names if a != b]


def _host_routes(cpu, gpu_names, beta):
    """CPU <-> each GPU over that GPU's own PCIe lanes, one link per direction."""
    out = []
    for g in gpu_names:
        out.append(Route(cpu, g, (f"pcie:{cpu}>{g}",), *beta))
        out.append(Route(g, cpu, (f"pcie:{g}>{cpu}",), *beta))
    return out


def gpus(n: int = 2, *, memory: int = 16 * GiB, beta: tuple = NVLINK_GG, with_cpu: bool = False,
         cpu_beta: tuple = NVLINK_CG, cpu_memory: int = 64 * GiB, contention_free: bool = False,
         speeds: Iterable[float] | None = None, name: str | None = None) -> Cluster:
    """``n`` GPUs ``/GPU:0..n-1`` with a point-to-point link per ordered pair.

    Examples
    --------
    >>> gpus(3, contention_free=True).names
    ['/GPU:0', '/GPU:1', '/GPU:2']
    """
    if n < 1:
        raise InvalidClusterError(f"need at least one GPU, got {n}")
    speeds = list(speeds) if speeds is not None else [1.0] * n
    if len(speeds) != n:
        raise InvalidClusterError(f"gpus({n}): got {len(speeds)} speeds")
    names = [f"/GPU:{i}" for i in range(n)]
    devs = [Device(nm, "GPU", memory, s) for nm, s in zip(names, speeds)]
    routes = _p2p(names, beta, "link")
    if with_cpu:
        devs.append(Device("/CPU:0", "CPU", cpu_memory, 1.0))
        routes += _host_routes("/CPU:0", names, cpu_beta)
    return Cluster(devs, routes, contention_free=contention_free, name=name or f"gpus{n}")


def v100x2_nvlink(*, with_cpu: bool = True) -> Cluster:
    """Pesto's testbed: 2x V100 16 GB over NVLink (paper section 5.1 fit)."""
    return gpus(2, memory=16 * GiB, beta=NVLINK_GG, with_cpu=with_cpu, cpu_beta=NVLINK_CG,
                name="v100x2_nvlink")


def v100x8_nvlink(*, with_cpu: bool = True) -> Cluster:
    """8x V100 16 GB in one node, a point-to-point NVLink per ordered pair at
    the 2-GPU testbed's fit (an all-to-all NVSwitch-like node; a DGX-1's
    hybrid cube mesh links each GPU to 4 peers only). The memory-bound
    workloads' cluster (``benchmarks/graphs``: GPT-1.3B, GPT-2.7B,
    BERT-Large); ``hosts4x2_ib_hdr`` spreads the same 8 GPUs over 4 hosts.

    >>> c = v100x8_nvlink()
    >>> len(c.gpus), c.gpus[0].memory == 16 * GiB, c.route("/GPU:0", "/GPU:7").links
    (8, True, ('link:/GPU:0>/GPU:7',))
    """
    return gpus(8, memory=16 * GiB, beta=NVLINK_GG, with_cpu=with_cpu, cpu_beta=NVLINK_CG,
                name="v100x8_nvlink")


def v100x4_pcie(*, with_cpu: bool = True) -> Cluster:
    """Celeritas's testbed: 4x V100 32 GB behind one PCIe switch.

    Each GPU has an up and a down lane to the switch; a GPU-GPU transfer holds
    the sender's up lane and the receiver's down lane, so two transfers into one
    GPU queue.
    """
    names = [f"/GPU:{i}" for i in range(4)]
    devs = [Device(n, "GPU", 32 * GiB) for n in names]
    routes = [Route(a, b, (f"up:{a}", f"down:{b}"), *PCIE_GG) for a in names for b in names if a != b]
    if with_cpu:
        devs.append(Device("/CPU:0", "CPU", 64 * GiB))
        routes += [Route("/CPU:0", g, ("up:/CPU:0", f"down:{g}"), *PCIE_GG) for g in names]
        routes += [Route(g, "/CPU:0", (f"up:{g}", "down:/CPU:0"), *PCIE_GG) for g in names]
    return Cluster(devs, routes, name="v100x4_pcie")


def heterogeneous(*, with_cpu: bool = True) -> Cluster:
    """A V100 32 GB (speed 1.0) and a slower, smaller GPU (speed 0.6, 12 GB) over PCIe."""
    names = ["/GPU:0", "/GPU:1"]
    devs = [Device("/GPU:0", "GPU", 32 * GiB, 1.0), Device("/GPU:1", "GPU", 12 * GiB, 0.6)]
    routes = _p2p(names, PCIE_GG, "pcie")
    if with_cpu:
        devs.append(Device("/CPU:0", "CPU", 64 * GiB))
        routes += _host_routes("/CPU:0", names, NVLINK_CG)
    return Cluster(devs, routes, name="heterogeneous")


def task_device(task: int, kind: str, k: int, *, job: str = "worker", replica: bool = True) -> str:
    """TensorFlow's task-qualified device name.

    Examples
    --------
    >>> task_device(1, "GPU", 0)
    '/job:worker/replica:0/task:1/device:GPU:0'
    """
    return f"/job:{job}" + ("/replica:0" if replica else "") + f"/task:{task}/device:{kind}:{k}"


def _network(net) -> Network:
    if isinstance(net, Network):
        return net
    if net in NETWORKS:
        return NETWORKS[net]
    raise InvalidClusterError(f"unknown network {net!r}; known: {sorted(NETWORKS)} or a pesto.cluster.Network")


def _intra_routes(names, intra):
    """Routes between the devices of one host: NVLink pairs, one PCIe switch,
    or a point-to-point link per pair with a given ``(beta0, beta1)``."""
    if isinstance(intra, tuple):
        return _p2p(names, intra, "mem")
    if intra == "nvlink":
        return _p2p(names, NVLINK_GG, "nvlink")
    if intra == "pcie":
        return [Route(a, b, (f"up:{a}", f"down:{b}"), *PCIE_GG) for a in names for b in names if a != b]
    raise InvalidClusterError(f"unknown intra-host link {intra!r}; known: 'nvlink', 'pcie'")


def hosts(n_hosts: int = 2, gpus_per_host: int = 2, net="25gbe", *, intra: str | tuple = "nvlink",
          memory: int = 16 * GiB, with_cpu: bool = False, cpu_memory: int = 64 * GiB, kind: str = "GPU",
          replica: bool = True, contention_free: bool = False, name: str | None = None) -> Cluster:
    """``n_hosts`` hosts of ``gpus_per_host`` V100s, TensorFlow task ``h`` per host.

    Inside a host: NVLink pairs (``intra="nvlink"``, paper fit), one PCIe
    switch (``"pcie"``, Celeritas fit) or a measured ``(beta0, beta1)`` per
    pair (e.g. logical CPU devices, ``kind="CPU"``, as :mod:`tf_patch.distributed`
    runs them without GPUs). Between hosts every transfer holds the
    sender host's ``nic_out:h`` and the receiver host's ``nic_in:o`` link, so
    the GPUs of a host share its NIC, each direction separately (full duplex),
    at the fit of ``net``: a :class:`Network` or a name in :data:`NETWORKS`
    (``"10gbe"``, ``"25gbe"``, ``"100gbe"``, ``"ib_hdr"``). With ``with_cpu``
    each host also has its ``CPU:0`` (behind its GPUs' PCIe lanes).

    Device names are TensorFlow's: ``/job:worker/replica:0/task:h/device:GPU:k``.

    Examples
    --------
    >>> c = hosts(2, gpus_per_host=2, net="100gbe")
    >>> c.names[2]
    '/job:worker/replica:0/task:1/device:GPU:0'
    >>> c.route(c.names[0], c.names[3]).links
    ('nic_out:0', 'nic_in:1')
    >>> round(c.transfer_time(c.names[0], c.names[3], 1_000_000), 1)   # 10 µs + 1 MB at 12.5 GB/s
    90.0
    """
    if n_hosts < 1 or gpus_per_host < 1:
        raise InvalidClusterError(f"hosts({n_hosts}, gpus_per_host={gpus_per_host}): need at least one of each")
    fit = _network(net)
    if kind not in ("GPU", "CPU") or (kind == "CPU" and with_cpu):
        raise InvalidClusterError(f"hosts(kind={kind!r}, with_cpu={with_cpu}): kind is 'GPU' (with or without "
                                  "a CPU per host) or 'CPU' (the host's logical CPU devices only)")
    per = [[task_device(h, kind, k, replica=replica) for k in range(gpus_per_host)] for h in range(n_hosts)]
    devs = [Device(n, kind, memory) for hs in per for n in hs]
    routes = []
    for hs in per:
        routes += _intra_routes(hs, intra) if len(hs) > 1 else []
    if with_cpu:
        for h, hs in enumerate(per):
            cpu = task_device(h, "CPU", 0, replica=replica)
            devs.append(Device(cpu, "CPU", cpu_memory))
            routes += _host_routes(cpu, hs, NVLINK_CG)
            per[h] = hs + [cpu]
    for h, hs in enumerate(per):
        for o, os_ in enumerate(per):
            if o != h:
                routes += [Route(a, b, (f"nic_out:{h}", f"nic_in:{o}"), *fit.beta) for a in hs for b in os_]
    return Cluster(devs, routes, contention_free=contention_free,
                   name=name or f"hosts{n_hosts}x{gpus_per_host}_{fit.name}")


def two_hosts(*, with_cpu: bool = False) -> Cluster:
    """Two hosts of 2 V100 each: NVLink inside a host; between hosts every
    transfer shares the sender host's NIC out and the receiver host's NIC in
    (10 GbE fit; short names ``/job:worker/task:h/...``). ``hosts()`` builds
    any number of hosts on other networks."""
    return hosts(2, 2, "10gbe", with_cpu=with_cpu, replica=False, name="two_hosts")


def logical_cpus(n: int = 2, *, memory: int = 4 * GiB, beta: tuple = (20.0, 1.0e-4),
                 kind: str = "CPU") -> Cluster:
    """``n`` TensorFlow virtual CPU devices ``/CPU:0..n-1`` (of ``kind``).

    The default comm fit is a placeholder; measure it with
    ``tf_patch.commfit`` for real runs.
    """
    names = [f"/CPU:{i}" for i in range(n)]
    devs = [Device(nm, kind, memory) for nm in names]
    return Cluster(devs, _p2p(names, beta, "mem"), name=f"logical_cpus{n}")


PRESETS = {"v100x2_nvlink": v100x2_nvlink, "v100x8_nvlink": v100x8_nvlink, "v100x4_pcie": v100x4_pcie,
           "heterogeneous": heterogeneous, "two_hosts": two_hosts}


_HOSTS = re.compile(r"^hosts(\d+)x(\d+)_(\w+)$")


def preset(name: str, *, with_cpu: bool | None = None) -> Cluster:
    """A preset by name, ``hostsNxG_NET`` (``hosts(N, G, NET)``, e.g.
    ``hosts2x2_25gbe``), or a cluster JSON path. ``with_cpu`` (presets only;
    None: each preset's default) adds or leaves out the host ``/CPU:0``: the
    CLI and the benchmarks add it only when some op cannot run on a GPU.

    >>> preset("v100x4_pcie").names[-1], preset("v100x4_pcie", with_cpu=False).names[-1]
    ('/CPU:0', '/GPU:3')
    """
    cpu = {} if with_cpu is None else {"with_cpu": bool(with_cpu)}
    if name in PRESETS:
        return PRESETS[name](**cpu)
    m = _HOSTS.match(name)
    if m:
        return hosts(int(m.group(1)), int(m.group(2)), m.group(3), **cpu)
    if name.endswith((".json", ".json.gz")):
        return Cluster.from_json(name)
    raise InvalidClusterError(f"unknown cluster preset {name!r}; known: {sorted(PRESETS)}, "
                              f"hostsNxG_NET (NET in {sorted(NETWORKS)}) or a .json file")
