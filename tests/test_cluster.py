"""Cluster: presets, transfer model, validation, identical groups, JSON."""
import json

import pytest

from pesto.cluster import (GiB, Cluster, Device, Route, gpus, heterogeneous, logical_cpus,
                           preset, two_hosts, v100x2_nvlink, v100x4_pcie, PRESETS)
from pesto.errors import InvalidClusterError, SchemaError


def test_v100x2_nvlink_published_fit():
    c = v100x2_nvlink()
    assert c.names == ["/GPU:0", "/GPU:1", "/CPU:0"]
    assert c.device("/GPU:0").memory == 16 * GiB
    r = c.route("/GPU:0", "/GPU:1")
    assert (r.beta0, r.beta1) == (40.77, 2.0757e-5)
    assert (c.route("/CPU:0", "/GPU:1").beta0, c.route("/CPU:0", "/GPU:1").beta1) == (7.0, 7.7778e-5)
    # 1 MB GPU->GPU: 40.77 + 2.0757e-5 * 1e6 = 61.527 µs
    assert c.transfer_time("/GPU:0", "/GPU:1", 1_000_000) == pytest.approx(61.527)
    assert c.transfer_time("/GPU:0", "/GPU:0", 1_000_000) == 0.0
    assert c.transfer_time("/GPU:0", "/GPU:1", 0) == 0.0
    assert v100x2_nvlink(with_cpu=False).names == ["/GPU:0", "/GPU:1"]


def test_v100x4_pcie_shares_switch_lanes():
    c = v100x4_pcie()
    assert len(c.gpus) == 4 and c.device("/GPU:3").memory == 32 * GiB
    r = c.route("/GPU:0", "/GPU:2")
    assert (r.beta0, r.beta1) == (5.581, 1.00244e-4)
    # two transfers into GPU:2 hold the same down lane
    assert set(r.links) & set(c.route("/GPU:1", "/GPU:2").links) == {"down:/GPU:2"}
    assert not set(r.links) & set(c.route("/GPU:1", "/GPU:3").links)


def test_two_hosts_nic_sharing():
    c = two_hosts()
    h0 = [n for n in c.names if "task:0" in n]
    h1 = [n for n in c.names if "task:1" in n]
    cross = [c.route(a, b).links for a in h0 for b in h1]
    assert all(links == ("nic_out:0", "nic_in:1") for links in cross)
    assert c.route(h0[0], h0[1]).links == (f"nvlink:{h0[0]}>{h0[1]}",)
    assert c.route(h0[0], h1[0]).beta0 == 30.0


def test_presets_and_generic():
    for name in PRESETS:
        c = preset(name)
        assert isinstance(c, Cluster) and c.gpus
    c = gpus(3, speeds=[1.0, 1.0, 0.5], memory=GiB)
    assert [d.speed for d in c.devices] == [1.0, 1.0, 0.5]
    assert logical_cpus(3).names == ["/CPU:0", "/CPU:1", "/CPU:2"]
    assert heterogeneous().device("/GPU:1").speed == 0.6
    with pytest.raises(InvalidClusterError, match="unknown cluster preset 'nope'"):
        preset("nope")
    with pytest.raises(InvalidClusterError, match="2 speeds"):
        gpus(3, speeds=[1.0, 2.0])
    with pytest.raises(InvalidClusterError):
        gpus(0)


def test_identical_groups():
    assert v100x2_nvlink().identical_groups() == [["/GPU:0", "/GPU:1"], ["/CPU:0"]]
    assert v100x4_pcie(with_cpu=False).identical_groups() == [[f"/GPU:{i}" for i in range(4)]]
    # the four GPUs of two_hosts are not all interchangeable: NVLink inside a host, NIC across
    g = two_hosts().identical_groups()
    assert len(g) == 2 and all(len(x) == 2 for x in g)
    assert all(len({n.split("/device")[0] for n in x}) == 1 for x in g)
    assert heterogeneous(with_cpu=False).identical_groups() == [["/GPU:0"], ["/GPU:1"]]
    assert gpus(3, memory=GiB).with_memory({"/GPU:2": 2 * GiB}).identical_groups() == \
        [["/GPU:0", "/GPU:1"], ["/GPU:2"]]
    # asymmetric costs between two otherwise equal GPUs
    devs = [Device("/GPU:0"), Device("/GPU:1")]
    asym = Cluster(devs, [Route("/GPU:0", "/GPU:1", ("l0",), 1.0, 0.0),
                          Route("/GPU:1", "/GPU:0", ("l1",), 2.0, 0.0)])
    assert asym.identical_groups() == [["/GPU:0"], ["/GPU:1"]]


def test_identical_groups_link_sharing_matters():
    # same costs everywhere, but GPU:0 and GPU:1 share one outgoing link while GPU:2 has its own
    names = ["/GPU:0", "/GPU:1", "/GPU:2"]
    routes = []
    for a in names:
        for b in names:
            if a != b:
                out = "shared" if a in ("/GPU:0", "/GPU:1") else "solo"
                routes.append(Route(a, b, (out,), 1.0, 0.001))
    c = Cluster([Device(n) for n in names], routes)
    assert c.identical_groups() == [["/GPU:0", "/GPU:1"], ["/GPU:2"]]
    assert c.with_contention_free().identical_groups() == [names]


def test_cluster_validation_errors():
    d0, d1 = Device("/GPU:0"), Device("/GPU:1")
    with pytest.raises(InvalidClusterError, match=r"no route from '/GPU:1' to '/GPU:0'"):
        Cluster([d0, d1], [Route("/GPU:0", "/GPU:1", ("l",), 1.0, 0.0)])
    with pytest.raises(InvalidClusterError, match=r"duplicate device '/GPU:0'"):
        Cluster([d0, d0])
    with pytest.raises(InvalidClusterError, match=r"unknown device '/GPU:7'"):
        Cluster([d0], [Route("/GPU:0", "/GPU:7", ("l",), 1.0, 0.0)])
    with pytest.raises(InvalidClusterError, match=r"'/GPU:0' has invalid memory -1"):
        Cluster([Device("/GPU:0", memory=-1)])
    with pytest.raises(InvalidClusterError, match=r"'/GPU:0' has invalid speed 0"):
        Cluster([Device("/GPU:0", speed=0)])
    with pytest.raises(InvalidClusterError, match=r"invalid cost"):
        Cluster([d0, d1], [Route("/GPU:0", "/GPU:1", ("l",), -1.0, 0.0),
                           Route("/GPU:1", "/GPU:0", ("l",), 1.0, 0.0)])
    with pytest.raises(InvalidClusterError, match=r"two routes"):
        Cluster([d0, d1], [Route("/GPU:0", "/GPU:1", ("l",), 1.0, 0.0)] * 2)
    with pytest.raises(InvalidClusterError, match=r"to itself"):
        Cluster([d0], [Route("/GPU:0", "/GPU:0", ("l",), 1.0, 0.0)])
    with pytest.raises(InvalidClusterError, match="at least one device"):
        Cluster([])


def test_unknown_device_lookups():
    c = gpus(2)
    with pytest.raises(InvalidClusterError, match=r"unknown device '/GPU:5'"):
        c.device("/GPU:5")
    with pytest.raises(InvalidClusterError, match=r"no route from '/GPU:0' to '/GPU:9'"):
        c.route("/GPU:0", "/GPU:9")
    with pytest.raises(InvalidClusterError, match=r"unknown device '/GPU:9'"):
        c.with_memory({"/GPU:9": GiB})


def test_with_memory_and_contention_free():
    c = gpus(2).with_memory({"/GPU:1": 5})
    assert [d.memory for d in c.devices] == [16 * GiB, 5]
    assert [d.memory for d in gpus(2).with_memory(7).devices] == [7, 7]
    assert gpus(2).with_contention_free().contention_free
    assert not gpus(2, contention_free=True).with_contention_free(False).contention_free


@pytest.mark.parametrize("make", [v100x2_nvlink, v100x4_pcie, heterogeneous, two_hosts,
                                  lambda: two_hosts(with_cpu=True), lambda: gpus(3, contention_free=True)])
def test_json_round_trip(make, tmp_path):
    c = make()
    back = Cluster.from_json(c.to_json())
    assert back == c and back.contention_free == c.contention_free
    assert back.identical_groups() == c.identical_groups()
    c.to_json(tmp_path / "c.json")
    assert preset(str(tmp_path / "c.json")) == c


@pytest.mark.parametrize("mutate, pattern", [
    (lambda d: d.pop("devices"), r"missing required field 'devices'"),
    (lambda d: d.pop("routes"), r"missing required field 'routes'"),
    (lambda d: d["devices"][0].pop("memory"), r"lacks required field 'memory'"),
    (lambda d: d["routes"][0].pop("beta1"), r"lacks required field 'beta1'"),
    (lambda d: d["devices"][0].update(memory="lots"), r"memory must be a whole number of bytes, got 'lots'"),
    (lambda d: d.update(version=9), r"unsupported version 9"),
    (lambda d: d.update(format="pesto.opgraph"), r"expected format 'pesto.cluster'"),
])
def test_json_schema_errors(mutate, pattern):
    d = json.loads(v100x2_nvlink().to_json())
    mutate(d)
    with pytest.raises(SchemaError, match=pattern):
        Cluster.from_json(json.dumps(d))


def test_json_missing_route_is_cluster_error():
    d = json.loads(gpus(2).to_json())
    d["routes"] = d["routes"][:1]
    with pytest.raises(InvalidClusterError, match="no route"):
        Cluster.from_json(json.dumps(d))


def test_memory_bound_presets_have_eight_16gb_v100s():
    """The clusters of the memory-bound workloads (issue 30): one NVLink node and 4 hosts x 2 on IB HDR."""
    node = preset("v100x8_nvlink", with_cpu=False)
    assert node.name == "v100x8_nvlink" and len(node.gpus) == 8
    assert all(d.memory == 16 * GiB for d in node.gpus)
    assert node.identical_groups() == [[f"/GPU:{i}" for i in range(8)]]
    assert node.transfer_time("/GPU:0", "/GPU:7", 10**6) == pytest.approx(40.77 + 2.0757e-5 * 1e6)
    assert preset("v100x8_nvlink").names[-1] == "/CPU:0"
    ib = preset("hosts4x2_ib_hdr")
    assert ib.name == "hosts4x2_ib_hdr" and len(ib.gpus) == 8
    assert all(d.memory == 16 * GiB for d in ib.gpus)
    a, b = ib.names[0], ib.names[2]  # task 0 and task 1
    assert ib.route(a, b).links == ("nic_out:0", "nic_in:1")
    assert ib.transfer_time(a, b, 10**6) < ib.transfer_time(a, b, 10**7)
    assert node.transfer_time("/GPU:0", "/GPU:1", 10**8) < ib.transfer_time(a, b, 10**8)
