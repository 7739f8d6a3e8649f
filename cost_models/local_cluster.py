"""A cluster of local ranks: the pipeline that ``hetpart launch --run`` starts here, as a cluster profile.

In: the number of ranks, the threads each rank runs (``OMP_NUM_THREADS``: 1 under
``backends/pipeline/launch.py``'s ``run_local``), and optionally the machine's CPU profile, its
core count and the link between ranks. Out: a :class:`~cost_models.cluster.Cluster` of ``ranks``
hosts, each one rank's share of this machine's CPU, joined by the loopback network; its
:meth:`~cost_models.cluster.Cluster.flatten` is what a plan of a local gloo run is made on, so that
the plan's predicted step time can be held against the measured one on the machine it runs on.

Each rank's CPU (``hostN/cpu``):

* rates: the machine's CPU rates are for ``rated`` cores — all ``cores`` when ``host`` is given,
  the ``min(threads_per_rank, cores)`` threads it was measured with when detected
  (:func:`~cost_models.detect.detect_local` run with that many torch threads, the rank's view), or
  all its cores when detected without measuring (the per-core defaults). A rank gets
  ``share = min(threads_per_rank, cores / ranks)`` cores: its peak FLOP/s, memory, cache and
  first-touch bandwidth are the machine's times ``share / rated`` (linear in cores: a fair figure for
  FLOP/s; for memory bandwidth a low one, as one core often streams more than its share);
* sharing: when ``ranks * threads_per_rank`` exceeds ``cores`` the ranks time-slice the cores, and
  ``share`` is below the threads a rank runs: each op takes ``min(threads, cores) / share`` times
  longer, per-op overhead included (``launch_overhead`` is scaled by that factor). This assumes all
  ranks busy at once — the steady state of a pipeline; fill and drain, when some ranks wait, run
  faster than predicted;
* memory: the machine's memory divided among the ranks.

The network: the measured gloo loopback link (:func:`cost_models.loopback.measure_loopback`,
about two seconds, once per process), ``LOOPBACK_DEFAULTS`` when ``measure=False``, or the link
given. The host profile's ``notes`` say where every figure came from.

Errors are :class:`~partitioner.errors.ProfileError` naming the argument and its fix.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path

from cost_models.cluster import Cluster, Host, Network
from cost_models.loopback import LOOPBACK_DEFAULTS, LoopbackLink, measure_loopback
from cost_models.profiles import MAX_DEVICES, Device, DeviceSet, load_profile
from cost_models.units import format_bytes, format_flops, format_rate, format_seconds
from partitioner.errors import ProfileError

__all__ = ["local_cluster", "rank_cpu"]


def local_cluster(ranks: int, threads_per_rank: int = 1, host: DeviceSet | Device | str | Path | None = None, *,
                  cores: int | None = None, network: Network | LoopbackLink | None = None,
                  measure: bool = True) -> Cluster:
    """``ranks`` local ranks of ``threads_per_rank`` threads each, as a cluster (see the module docstring).

    ``host`` is the whole machine's CPU (a profile name or path, a DeviceSet whose ``host0`` CPU is
    taken, or a Device); None detects this machine's CPU (measured when ``measure``). ``cores`` is
    the machine's core count (default: the CPUs this process may use, lowered by a cgroup quota).

    Raises:
        ProfileError: ``ranks``, ``threads_per_rank`` or ``cores`` is not a positive integer, or
            ``ranks`` is over :data:`~cost_models.profiles.MAX_DEVICES`.

    Example:
        >>> c = local_cluster(4, host="cpu", cores=16, measure=False)
        >>> c.flatten().names(), c.hosts[0].profile.device("cpu").peak()
        (('host0/cpu', 'host1/cpu', 'host2/cpu', 'host3/cpu'), 62500000000.0)
    """
    _positive(ranks, "ranks", "the number of local processes, e.g. local_cluster(2)")
    if ranks > MAX_DEVICES:
        raise ProfileError(f"local_cluster: ranks = {ranks:,} is over the {MAX_DEVICES} devices a cluster may have "
                           f"(one CPU per rank); give at most {MAX_DEVICES}")
    _positive(threads_per_rank, "threads_per_rank", "OMP_NUM_THREADS of each rank, 1 under run_local")
    if cores is None:
        cores = _usable_cores()
    _positive(cores, "cores", "this machine's cores, e.g. cores=os.cpu_count()")
    machine, rated, how = _machine_cpu(host, threads_per_rank, cores, measure)
    cpu = rank_cpu(machine, ranks=ranks, threads_per_rank=threads_per_rank, cores=cores, rated=rated)
    link = _network(network, measure)
    share = min(threads_per_rank, cores / ranks)
    notes = (
        f"local cluster: {ranks} rank(s) x {threads_per_rank} thread(s) on {cores} core(s): each rank gets "
        f"{share:.3g} core(s)" + (f", time-sliced ({ranks * threads_per_rank} threads > {cores} cores)"
                                  if ranks * threads_per_rank > cores else ""),
        f"machine cpu ({how}, rates for {rated:g} core(s)): {format_flops(machine.peak(), per_second=True)}, "
        f"{format_rate(machine.mem_bandwidth)}, {format_seconds(machine.launch_overhead)} per op",
        f"rank cpu: {format_flops(cpu.peak(), per_second=True)}, {format_rate(cpu.mem_bandwidth)}, "
        f"{format_seconds(cpu.launch_overhead)} per op, {format_bytes(cpu.memory)}",
        f"network: {format_seconds(link.latency)} per message, {format_rate(link.bandwidth)} ({link.how})",
    )
    profile = DeviceSet("local-rank", (cpu,), (), source="local_cluster", notes=notes)
    name = f"local-{ranks}x{threads_per_rank}"
    return Cluster(name, tuple(Host(f"host{i}", profile) for i in range(ranks)),
                   Network(link.bandwidth, link.latency), source=f"local_cluster({ranks}, {threads_per_rank})")


def rank_cpu(machine: Device, *, ranks: int, threads_per_rank: int, cores: int, rated: float) -> Device:
    """One rank's share of ``machine`` (whose rates are for ``rated`` cores of ``cores``): rates
    times ``share / rated``, per-op overhead times the time-slicing factor, memory over ``ranks``.

    Example:
        >>> m = Device("cpu", "cpu", "64GiB", {"float32": 1.6e12}, "32GB/s", "2us")
        >>> r = rank_cpu(m, ranks=8, threads_per_rank=4, cores=16, rated=16)
        >>> r.peak(), r.mem_bandwidth, r.launch_overhead, r.memory == 8 * 2**30
        (200000000000.0, 4000000000.0, 4e-06, True)
    """
    share = min(threads_per_rank, cores / ranks)
    scale = share / rated
    slicing = min(threads_per_rank, cores) / share
    return dataclasses.replace(
        machine, name="cpu", host="host0",
        peak_flops={k: v * scale for k, v in machine.peak_flops.items()},
        mem_bandwidth=machine.mem_bandwidth * scale,
        cache_bandwidth=machine.cache_bandwidth * scale,
        first_touch_bandwidth=machine.first_touch_bandwidth * scale,
        launch_overhead=machine.launch_overhead * slicing,
        memory=machine.memory // ranks,
    )


# --------------------------------------------------------------------------------------------


def _positive(value: object, name: str, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ProfileError(f"local_cluster: {name} = {value!r} is not a positive integer; give {hint}")


def _usable_cores() -> int:
    from cost_models.cpu_limits import cpu_limits

    return max(1, math.floor(cpu_limits().usable))


def _machine_cpu(host: DeviceSet | Device | str | Path | None, threads: int, cores: int,
                 measure: bool) -> tuple[Device, float, str]:
    """The machine's CPU, the cores its rates are for, and where it came from."""
    if isinstance(host, Device):
        return host, cores, f"given device {host.name!r}"
    if isinstance(host, (str, Path)):
        return load_profile(host).host_device(), cores, f"profile {str(host)!r}"
    if isinstance(host, DeviceSet):
        return host.host_device(host.hosts()[0]), cores, f"profile {host.name!r}"
    if host is not None:
        raise ProfileError(f"local_cluster: host = {host!r} is not a profile; give a profile name (\"cpu\"), a "
                           f"path, a DeviceSet, a Device, or None to detect this machine")
    import torch

    from cost_models.detect import detect_local

    if not measure:
        from cost_models.cpu_limits import cpu_limits

        return detect_local(measure=False).device("cpu"), cpu_limits().affinity, "detected, per-core defaults"
    before = torch.get_num_threads()
    measured_threads = min(threads, cores)
    torch.set_num_threads(measured_threads)
    try:
        cpu = detect_local(measure=True).device("cpu")
    finally:
        torch.set_num_threads(before)
    return cpu, measured_threads, f"detected, measured with {measured_threads} torch thread(s)"


def _network(network: Network | LoopbackLink | Mapping | None, measure: bool) -> LoopbackLink:
    if isinstance(network, LoopbackLink):
        return network
    if isinstance(network, Network):
        return LoopbackLink(network.latency, network.bandwidth, "given")
    if network is not None:
        raise ProfileError(f"local_cluster: network = {network!r} is not a link; give "
                           f"Network(bandwidth, latency), a LoopbackLink, or None")
    if measure:
        return measure_loopback()
    return LoopbackLink(LOOPBACK_DEFAULTS["latency"], LOOPBACK_DEFAULTS["bandwidth"],
                        "LOOPBACK_DEFAULTS, not measured")
