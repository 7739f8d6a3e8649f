"""What limits the host CPU's throughput beyond its cores: affinity, a CPU quota, bursts vs sustained work.

In: nothing (the OS and torch). Out: :class:`CpuLimits` — the logical CPUs the OS reports, those
this process may run on (affinity), the CPU quota of its cgroup (v2 ``cpu.max`` or v1
``cpu.cfs_quota_us``/``cpu.cfs_period_us``; None when unlimited), torch's intra-op thread count —
and :func:`burst_and_sustained`: the rate of a matmul timed in short bursts after a pause against
its rate over a continuous run of about a second.

Why it matters: a profile's rates are measured in short runs, a whole model is sustained work. A
container whose CPU quota is below the threads torch starts (``os.cpu_count()`` reports the host's
CPUs, not the quota) runs short bursts at full speed and is throttled for the rest of each
scheduler period once its quota is spent: the op rows of a calibration then look right while a
whole model runs several times slower than their sum. :meth:`CpuLimits.warnings` says so, and the
calibration writes these lines into the profile.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import torch

__all__ = ["CpuLimits", "cpu_limits", "burst_and_sustained"]


@dataclasses.dataclass(frozen=True)
class CpuLimits:
    """The CPUs this process may use, and the threads torch starts."""

    logical: int                 # os.cpu_count()
    affinity: int                # CPUs in this process's affinity mask
    quota: float | None          # CPUs' worth of time per period the cgroup allows (None: unlimited)
    threads: int                 # torch.get_num_threads()

    @property
    def usable(self) -> float:
        """CPUs' worth of throughput available: the affinity, lowered by the quota."""
        return min(self.affinity, self.quota) if self.quota else float(self.affinity)

    def line(self) -> str:
        quota = f"cgroup quota {self.quota:.3g} CPUs" if self.quota else "no cgroup CPU quota"
        return (f"host CPUs: {self.logical} logical, {self.affinity} in this process's affinity, {quota}; "
                f"torch uses {self.threads} threads")

    def warnings(self) -> list[str]:
        """What will make sustained work slower than the profile's rates."""
        out = []
        if self.threads > self.usable:
            out.append(f"torch runs {self.threads} threads on {self.usable:.3g} CPUs' worth of time (affinity/quota): "
                       f"sustained work is throttled and OpenMP threads stall; set torch.set_num_threads("
                       f"{max(1, int(self.usable))}) (hetpart calibrate/profile --threads {max(1, int(self.usable))})")
        return out


def _cgroup_quota() -> float | None:
    """The CPU quota in CPUs from cgroup v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us``; None if unlimited."""
    v2 = Path("/sys/fs/cgroup/cpu.max")
    try:
        if v2.is_file():
            quota, period = v2.read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        v1 = Path("/sys/fs/cgroup/cpu")
        quota_us = int((v1 / "cpu.cfs_quota_us").read_text())
        period_us = int((v1 / "cpu.cfs_period_us").read_text())
        return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def cpu_limits() -> CpuLimits:
    """This process's CPU limits now.

    Example:
        >>> cpu_limits().threads == torch.get_num_threads()
        True
    """
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = os.cpu_count() or 1
    return CpuLimits(os.cpu_count() or 1, affinity, _cgroup_quota(), torch.get_num_threads())


def burst_and_sustained(n: int = 512, burst_calls: int = 5, sustained_s: float = 1.0) -> tuple[float, float]:
    """FLOP/s of an ``n``-cubed fp32 matmul: the median of ``burst_calls`` calls after a pause, and
    the total work over the total time of calls run back to back for ``sustained_s`` seconds.

    Example:
        >>> burst, sustained = burst_and_sustained(128, sustained_s=0.05)
        >>> burst > 0 and sustained > 0
        True
    """
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    time.sleep(0.2)                       # let any quota period refill
    bursts = []
    for _ in range(burst_calls):
        t0 = time.perf_counter()
        torch.mm(a, b)
        bursts.append(time.perf_counter() - t0)
    bursts.sort()
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < sustained_s:
        torch.mm(a, b)
        calls += 1
    flops = 2.0 * n**3
    return flops / bursts[len(bursts) // 2], flops * calls / (time.perf_counter() - started)
