"""Cluster profiles: several hosts, each a device profile, joined by a network.

In: a TOML cluster profile (a built-in name such as ``"4x-cpu-host"``, a path, or the parsed
mapping), whose host profiles are built-in names, paths (relative to the cluster file) or inline
tables. Out: a frozen :class:`Cluster`, and :meth:`Cluster.flatten`, the one
:class:`~cost_models.profiles.DeviceSet` the rest of hetpart plans on.

The TOML shape::

    name = "h200-a100"               # optional; defaults to the file name

    [[hosts]]                        # host0
    profile = "h200-host"            # a built-in profile or a path to a profile TOML
    [[hosts]]                        # host1, host2: two alike
    profile = "a100-host"
    count = 2                        # optional, default 1
    [[hosts]]                        # host3: an inline profile, the shape of a profile file
    [hosts.devices.cpu]
    kind = "cpu"
    memory = "64GiB"
    ...

    [network]                        # between hosts (every pair of hosts: a switched network)
    bandwidth = "12.5GB/s"           # 100 Gb/s
    latency = "10us"

Flattening names the hosts ``host0``, ``host1``, ... in file order and each device
``hostN/<name in its profile>`` (``host1/cuda:0``, ``host1/cpu``) with ``Device.host = "hostN"``.
Links inside a host come from its profile (renamed the same way); between hosts one link of
``kind = "network"`` joins every pair of host CPUs, so a tensor from ``host0/cuda:0`` to
``host1/cuda:0`` is routed GPU → host CPU → network → host CPU → GPU by
:meth:`DeviceSet.route` (no GPUDirect RDMA is assumed). A host profile must describe one host.

Size: a flattened cluster is one profile, so it may hold at most
:data:`~cost_models.profiles.MAX_DEVICES` (256) devices, as a single-host profile may; a ``count``
is bounded by the same figure (each host has a device at least), checked before any host is made.

Errors are :class:`~partitioner.errors.ProfileError` naming the file and key: a host profile
that does not exist, a missing network section, a count that is not a positive integer or that
takes the cluster over the device limit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cost_models.profiles import MAX_DEVICES, MAX_PROFILE_BYTES, DeviceSet, Link, builtin_profiles, load_profile
from cost_models.units import parse_bandwidth, parse_seconds
from partitioner.errors import HetpartError, ProfileError

__all__ = ["Host", "Network", "Cluster", "is_cluster", "cluster_from_dict", "load_cluster"]

_CLUSTER_KEYS = ("name", "hosts", "network")
_HOST_KEYS = ("profile", "count", "devices", "links", "name")
_NETWORK_KEYS = ("bandwidth", "latency")
_NETWORK_EXAMPLE = '[network] bandwidth = "12.5GB/s" (100 Gb/s), latency = "10us"'


@dataclasses.dataclass(frozen=True)
class Host:
    """One machine of a cluster: its name (``host0``) and its device profile (one host)."""

    name: str
    profile: DeviceSet


@dataclasses.dataclass(frozen=True)
class Network:
    """The network between hosts: bytes/s and seconds per message, the same for every pair."""

    bandwidth: float
    latency: float


@dataclasses.dataclass(frozen=True)
class Cluster:
    """Hosts and the network between them.

    Example:
        >>> cluster = load_cluster("4x-cpu-host")
        >>> [h.name for h in cluster.hosts], cluster.flatten().names()[:2]
        (['host0', 'host1', 'host2', 'host3'], ('host0/cpu', 'host1/cpu'))
    """

    name: str
    hosts: tuple[Host, ...]
    network: Network
    source: str = dataclasses.field(default="<dict>", compare=False)

    def flatten(self) -> DeviceSet:
        """The cluster as one DeviceSet: ``hostN/<device>`` names, host links renamed, and a
        network link between every pair of host CPUs (see the module docstring).

        Raises:
            ProfileError: more than :data:`~cost_models.profiles.MAX_DEVICES` devices in all.
        """
        total = sum(len(h.profile.devices) for h in self.hosts)
        if total > MAX_DEVICES:
            raise ProfileError(f"{self.source}: the cluster has {total:,} devices on {len(self.hosts):,} hosts, over "
                               f"the {MAX_DEVICES} a profile may list (a plan places every op on each of them); "
                               f"list fewer hosts")
        devices, links = [], []
        for host in self.hosts:
            rename = {d.name: f"{host.name}/{d.name}" for d in host.profile.devices}
            devices += [dataclasses.replace(d, name=rename[d.name], host=host.name) for d in host.profile.devices]
            links += [dataclasses.replace(link, between=(rename[link.between[0]], rename[link.between[1]]))
                      for link in host.profile.links]
        cpus = [f"{h.name}/{h.profile.host_device(h.profile.hosts()[0]).name}" for h in self.hosts]
        for i, a in enumerate(cpus):
            for b in cpus[i + 1:]:
                links.append(Link((a, b), self.network.bandwidth, self.network.latency, kind="network"))
        return DeviceSet(self.name, tuple(devices), tuple(links), source=self.source,
                         notes=(f"cluster of {len(self.hosts)} hosts: "
                                + ", ".join(f"{h.name}={h.profile.name}" for h in self.hosts),))


def is_cluster(data: Mapping[str, Any]) -> bool:
    """Whether a parsed profile mapping is a cluster profile (it has ``hosts``).

    Example:
        >>> is_cluster({"hosts": [{"profile": "cpu"}], "network": {}}), is_cluster({"devices": {}})
        (True, False)
    """
    return "hosts" in data


def cluster_from_dict(data: Mapping[str, Any], source: str = "<dict>", *, name: str = "cluster",
                      base_dir: Path | None = None) -> Cluster:
    """Build a :class:`Cluster` from the parsed TOML mapping (see the module docstring).

    ``name`` is the default when ``data`` has no ``"name"``; ``base_dir`` resolves relative host
    profile paths (the cluster file's folder).

    Example:
        >>> c = cluster_from_dict({"hosts": [{"profile": "cpu", "count": 2}],
        ...                        "network": {"bandwidth": "1.25GB/s", "latency": "30us"}})
        >>> len(c.hosts), c.network.bandwidth
        (2, 1250000000.0)
    """
    _check(data, _CLUSTER_KEYS, source)
    cluster_name = data.get("name", name)
    if not isinstance(cluster_name, str) or not cluster_name:
        raise ProfileError(f"{source}: name: {cluster_name!r} is not a string; e.g. name = \"my-cluster\"")
    raw_hosts = data["hosts"]
    if not isinstance(raw_hosts, list) or not raw_hosts:
        raise ProfileError(f"{source}: hosts: expected an array of tables ([[hosts]] with profile = \"cpu\"), "
                           f"got {raw_hosts!r}")
    if len(raw_hosts) > MAX_DEVICES:
        raise ProfileError(f"{source}: hosts: {len(raw_hosts):,} [[hosts]] tables, over the {MAX_DEVICES} devices a "
                           f"cluster may have in all; list fewer hosts")
    hosts: list[Host] = []
    total = 0  # devices so far
    for i, raw in enumerate(raw_hosts):
        where = f"{source}: hosts[{i}]"
        if not isinstance(raw, Mapping):
            raise ProfileError(f"{where}: expected a table, e.g. [[hosts]] profile = \"h200-host\"")
        _check(raw, _HOST_KEYS, where)
        profile = _host_profile(raw, where, base_dir)
        count = raw.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ProfileError(f"{where}.count: {count!r} is not a positive integer; e.g. count = 4")
        total += count * len(profile.devices)
        if total > MAX_DEVICES:
            raise ProfileError(f"{where}.count: {count:,} hosts of {len(profile.devices)} device(s) take the cluster "
                               f"to {total:,} devices, over the {MAX_DEVICES} a cluster may have in all (the "
                               f"limit of a profile); lower count")
        for _ in range(count):
            hosts.append(Host(f"host{len(hosts)}", profile))
    if "network" not in data:
        if len(hosts) > 1:
            raise ProfileError(f"{source}: network: missing; the hosts need a network between them, "
                               f"e.g. {_NETWORK_EXAMPLE}")
        network = Network(1.0, 0.0)  # one host: no link is ever made from it
    else:
        network = _network(data["network"], f"{source}: network")
    return Cluster(cluster_name, tuple(hosts), network, source=source)


def load_cluster(name_or_path: str | Path) -> Cluster:
    """Load a cluster profile by built-in name or path.

    Raises:
        ProfileError: the file is not a cluster profile (no ``[[hosts]]``), or is malformed.

    Example:
        >>> load_cluster("2x-h200-host").flatten().names()
        ('host0/cpu', 'host0/cuda:0', 'host1/cpu', 'host1/cuda:0')
    """
    import tomllib

    from cost_models.profiles import MAX_PROFILE_BYTES, builtin_profile_path
    from partitioner.files import read_text  # partitioner imports this module: a late import

    spec = str(name_or_path)
    path = builtin_profile_path(spec) if spec in builtin_profiles() else Path(spec)
    source = f"builtin:{spec}" if spec in builtin_profiles() else spec
    if not path.exists():
        raise ProfileError(f"cluster profile {spec!r} does not exist: give a built-in name or a TOML path")
    try:   # a regular file of bounded size: a FIFO or a device is refused before it is read
        data = tomllib.loads(read_text(path, what="cluster profile", max_bytes=MAX_PROFILE_BYTES))
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ProfileError(f"{source}: cannot read the cluster profile: {err}") from None
    except HetpartError as err:
        raise ProfileError(str(err)) from None
    if not is_cluster(data):
        raise ProfileError(f"{source}: not a cluster profile (no [[hosts]]); a cluster lists its hosts, "
                           f"e.g. [[hosts]] profile = \"h200-host\"")
    return cluster_from_dict(data, source, name=path.stem, base_dir=path.parent)


# --------------------------------------------------------------------------------------------


def _check(raw: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in raw:
        if key not in allowed:
            raise ProfileError(f"{where}: {key}: unknown field; the allowed fields are: {', '.join(allowed)}")
    if allowed is _CLUSTER_KEYS and "hosts" not in raw:
        raise ProfileError(f"{where}: hosts: missing; list the hosts, e.g. [[hosts]] profile = \"h200-host\"")


def _host_profile(raw: Mapping[str, Any], where: str, base_dir: Path | None) -> DeviceSet:
    """A host's profile: a built-in name, a path (relative to the cluster file), or inline devices."""
    if "profile" in raw and "devices" in raw:
        raise ProfileError(f"{where}: give either profile = \"NAME\" or inline [hosts.devices.*] tables, not both")
    if "devices" in raw:
        inline = {k: v for k, v in raw.items() if k in ("devices", "links", "name")}
        profile = DeviceSet.from_dict(inline, f"{where} (inline)", name=str(raw.get("name", "inline")))
    elif "profile" in raw:
        spec = raw["profile"]
        if not isinstance(spec, str) or not spec:
            raise ProfileError(f"{where}.profile: {spec!r} is not a profile name; e.g. profile = \"h200-host\"")
        if spec in builtin_profiles():
            profile = load_profile(spec)
        else:
            path = Path(spec) if base_dir is None or Path(spec).is_absolute() else base_dir / spec
            if not path.is_file():
                raise ProfileError(
                    f"{where}.profile: no host profile {spec!r}: it is not a built-in profile "
                    f"({', '.join(builtin_profiles())}) and no file {str(path)!r} exists; "
                    f"name a built-in profile or a TOML file next to the cluster profile")
            profile = load_profile(path)
    else:
        raise ProfileError(f"{where}: a host needs profile = \"NAME\" (e.g. \"h200-host\") or inline "
                           f"[hosts.devices.cpu] tables")
    if len(profile.hosts()) != 1:
        raise ProfileError(f"{where}: host profile {profile.name!r} describes {len(profile.hosts())} hosts "
                           f"({', '.join(profile.hosts())}); a cluster host is one machine")
    return profile


def _network(raw: Any, where: str) -> Network:
    if not isinstance(raw, Mapping):
        raise ProfileError(f"{where}: expected a table, e.g. {_NETWORK_EXAMPLE}")
    _check(raw, _NETWORK_KEYS, where)
    for key in _NETWORK_KEYS:
        if key not in raw:
            raise ProfileError(f"{where}.{key}: missing; e.g. {_NETWORK_EXAMPLE}")
    bandwidth = parse_bandwidth(raw["bandwidth"], where=f"{where}.bandwidth")
    if bandwidth <= 0:
        raise ProfileError(f"{where}.bandwidth: must be positive; e.g. {_NETWORK_EXAMPLE}")
    return Network(bandwidth, parse_seconds(raw["latency"], where=f"{where}.latency"))
