"""Cluster profiles: hosts (built-in, file or inline profiles) joined by a network, flattened to a DeviceSet."""

from __future__ import annotations

import dataclasses

import pytest

import partitioner  # noqa: F401  (imports the package first: cost_models and partitioner import each other)
from cost_models.cluster import load_cluster
from cost_models.profiles import builtin_profiles, load_profile, load_profile_text
from partitioner.errors import ProfileError

NETWORK = '[network]\nbandwidth = "1.25GB/s"\nlatency = "50us"\n'


def _write(tmp_path, text, name="cluster.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_builtin_clusters_flatten_with_host_prefixed_names():
    assert {"2x-h200-host", "4x-cpu-host"} <= set(builtin_profiles())
    h200 = load_profile("2x-h200-host")
    assert h200.names() == ("host0/cpu", "host0/cuda:0", "host1/cpu", "host1/cuda:0")
    assert h200.hosts() == ("host0", "host1") and h200.host_device().name == "host0/cpu"
    single = load_profile("h200-host")
    # links inside a host come from its profile, renamed; the network joins the host CPUs
    inside = h200.link("host1/cpu", "host1/cuda:0")
    assert inside.bandwidth == single.link("cpu", "cuda:0").bandwidth and inside.latency == single.link("cpu", "cuda:0").latency
    network = h200.link("host0/cpu", "host1/cpu")
    assert network.kind == "network" and network.bandwidth == 12.5e9          # 100 Gb/s
    assert h200.device("host1/cuda:0").memory == single.device("cuda:0").memory
    route = [link.label for link in h200.route("host0/cuda:0", "host1/cuda:0")]
    assert route == ["host0/cpu<->host0/cuda:0", "host0/cpu<->host1/cpu", "host1/cpu<->host1/cuda:0"]
    cpus = load_profile("4x-cpu-host")
    assert cpus.names() == tuple(f"host{i}/cpu" for i in range(4))
    assert len(cpus.links) == 6 and all(link.bandwidth == 1.25e9 for link in cpus.links)   # 10 Gb/s, every pair
    for ds in (h200, cpus):
        assert load_profile_text(ds.to_toml(), "again.toml") == ds      # a flattened cluster is a plain profile


def test_hosts_by_path_and_inline(tmp_path):
    (tmp_path / "box.toml").write_text(load_profile("a100-host").to_toml())
    text = ('name = "mixed"\n[[hosts]]\nprofile = "h200-host"\n[[hosts]]\nprofile = "box.toml"\ncount = 2\n'
            '[[hosts]]\n[hosts.devices.cpu]\nkind = "cpu"\nmemory = "8GiB"\npeak_flops = 1e11\n'
            'mem_bandwidth = "10GB/s"\nlaunch_overhead = "2us"\n' + NETWORK)
    cluster = load_cluster(_write(tmp_path, text))
    assert [h.name for h in cluster.hosts] == ["host0", "host1", "host2", "host3"]
    ds = load_profile(_write(tmp_path, text, "mixed.toml"))
    assert ds.name == "mixed"
    assert ds.device("host2/cuda:0").peak("float32") == 19.5e12          # the A100 from box.toml
    assert ds.device("host3/cpu").memory == 8 * 2**30 and ds.device("host3/cpu").host == "host3"


def test_unknown_host_profile_is_named(tmp_path):
    path = _write(tmp_path, '[[hosts]]\nprofile = "h300-host"\n' + NETWORK)
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    msg = str(err.value)
    assert "hosts[0].profile" in msg and "'h300-host'" in msg and "h200-host" in msg and str(path) in msg


@pytest.mark.parametrize("text, words", [
    ('[[hosts]]\nprofile = "cpu"\ncount = 2\n', ("network", "missing")),
    ('[[hosts]]\nprofile = "cpu"\ncount = 0\n' + NETWORK, ("count", "positive")),
    ('[[hosts]]\nprofile = "2x-h200-host"\n' + NETWORK, ("describes 2 hosts",)),
    ('[[hosts]]\nprofil = "cpu"\n' + NETWORK, ("profil", "unknown field")),
    ('[[hosts]]\nprofile = "cpu"\n[network]\nbandwidth = "10Gb/s"\nlatency = "1us"\n', ("bits per second",)),
])
def test_bad_cluster_profiles(tmp_path, text, words):
    with pytest.raises(ProfileError) as err:
        load_profile(_write(tmp_path, text))
    assert all(w in str(err.value) for w in words), str(err.value)


@pytest.mark.parametrize("hosts, words", [
    ('[[hosts]]\nprofile = "cpu"\ncount = 1000000\n', ("hosts[0].count", "1,000,000 hosts", "256")),
    ('[[hosts]]\nprofile = "cpu"\ncount = 257\n', ("hosts[0].count", "257 devices", "256")),
    ('[[hosts]]\nprofile = "cpu"\ncount = 200\n[[hosts]]\nprofile = "h200-host"\ncount = 29\n',
     ("hosts[1].count", "258 devices", "256")),                 # 200 + 29 x 2 devices
    ('[[hosts]]\nprofile = "cpu"\n' * 257, ("hosts: 257", "256")),
])
def test_a_cluster_over_the_device_limit_is_refused_naming_the_field(tmp_path, hosts, words):
    with pytest.raises(ProfileError) as err:
        load_profile(_write(tmp_path, hosts + NETWORK))
    msg = str(err.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_a_cluster_at_the_device_limit_flattens():
    from cost_models.cluster import cluster_from_dict
    from cost_models.profiles import MAX_DEVICES

    cluster = cluster_from_dict({"hosts": [{"profile": "h200-host", "count": MAX_DEVICES // 2}],
                                 "network": {"bandwidth": "1.25GB/s", "latency": "50us"}})
    assert len(cluster.flatten().devices) == MAX_DEVICES
    bigger = dataclasses.replace(cluster, hosts=cluster.hosts + cluster.hosts[:1])   # built by hand, one host more
    with pytest.raises(ProfileError, match="258 devices on 129 hosts, over the 256"):
        bigger.flatten()


def test_a_cluster_file_over_the_profile_size_limit_is_refused_unread(tmp_path):
    from cost_models.cluster import load_cluster
    from cost_models.profiles import MAX_PROFILE_BYTES

    path = _write(tmp_path, '[[hosts]]\nprofile = "cpu"\n' + NETWORK + "#" * MAX_PROFILE_BYTES)
    with pytest.raises(ProfileError, match="over the 16,777,216 a cluster profile may be"):
        load_cluster(path)
