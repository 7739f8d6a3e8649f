"""How busy the machine was while something was measured: the CPU time *other* processes took.

In: nothing (the kernel's counters). Out: :class:`LoadReading`, the CPU time other processes used
on the CPUs this process may run on over a span of wall time, read by a :class:`LoadMeter` started
at the span's beginning. Formula, over a span of ``w`` seconds, on the CPUs of this process's
affinity mask::

    others_s = (Δ busy ticks of those CPUs in /proc/stat - Δ ticks of this process, all its threads,
                in /proc/self/stat) / USER_HZ
    load     = others_s / w                                     (CPUs' worth of other work)
    busy     = (others_s - resolution_s) / w > BUSY_SHARE * cpus

"Busy" ticks are user, nice, system, irq, softirq and steal (a hypervisor giving the CPU to another
machine is other work too). This process's own threads are never counted (torch's intra-op threads
measuring are not "other work": a load average counts them). Each counter is read to the tick, so
``resolution_s`` is ``(cpus + 2)`` ticks: a span too short to tell (a few tens of milliseconds) is
not busy, and neither is a machine without ``/proc`` (``others_s`` is None there: unknown). The
load is the host CPUs': another process's kernels on a shared GPU are not seen.

Why: times measured while other processes share the cores are too high (5x to 15x seen for whole
models after a busy hour). :mod:`cost_models.measure_cache` records each entry's load, so that an
entry measured while busy is measured again once the machine is quiet, or flagged, never silently
reused.

Example:
    >>> meter = LoadMeter()                         # doctest: +SKIP
    >>> ...                                         # measure something
    >>> meter.reading().describe()                  # doctest: +SKIP
    'other processes used 0.03 of 2 CPUs over 1.2 s'
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Protocol

__all__ = ["BUSY_SHARE", "LoadReading", "LoadMeter", "Meter", "cpu_ticks", "own_ticks"]

#: A span is busy when other processes took more than this share of the CPUs this process may use:
#: a fifth of 2 CPUs (0.4 CPUs' worth of other work) already slows a 2-thread measurement by tens of
#: percent through shared cores, caches and memory bandwidth; an idle machine's background is a
#: few hundredths of a CPU.
BUSY_SHARE = 0.2

_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)   # /proc/stat: user nice system [idle iowait] irq softirq steal


@dataclasses.dataclass(frozen=True)
class LoadReading:
    """The CPU time other processes used over a span, on the CPUs this process may run on."""

    others_s: float | None   # CPU seconds of other processes over the span (None: unknown here)
    own_s: float             # CPU seconds of this process (all its threads) over the span
    wall_s: float            # the span's wall time
    cpus: int                # CPUs this process may run on (its affinity)
    resolution_s: float = 0.0  # how far others_s may be off (the counters tick)

    @property
    def load(self) -> float | None:
        """CPUs' worth of other work over the span (None: unknown)."""
        if self.others_s is None or self.wall_s <= 0:
            return None
        return max(self.others_s, 0.0) / self.wall_s

    @property
    def busy(self) -> bool:
        """Whether other processes provably took more than :data:`BUSY_SHARE` of the CPUs."""
        if self.others_s is None or self.wall_s <= 0:
            return False
        return (self.others_s - self.resolution_s) / self.wall_s > BUSY_SHARE * self.cpus

    @property
    def quiet(self) -> bool:
        """Whether other processes provably took at most :data:`BUSY_SHARE` of the CPUs (neither
        ``busy`` nor ``quiet``: the span was too short to tell, or the load is unknown)."""
        if self.others_s is None or self.wall_s <= 0:
            return False
        return (max(self.others_s, 0.0) + self.resolution_s) / self.wall_s <= BUSY_SHARE * self.cpus

    def describe(self) -> str:
        """``other processes used 1.7 of 2 CPUs over 3.1 s`` (or that it is unknown here)."""
        if self.load is None:
            return f"the load of other processes is unknown here (no /proc/stat) over {self.wall_s:.2g} s"
        return f"other processes used {self.load:.2g} of {self.cpus} CPUs over {self.wall_s:.2g} s"


class Meter(Protocol):
    """What measuring code reads the load with: ``restart()`` begins a span, ``reading()`` ends it."""

    def restart(self) -> None: ...

    def reading(self) -> LoadReading: ...


class LoadMeter:
    """Reads the load of other processes since it was made (or last restarted), from ``/proc``.

    Example:
        >>> LoadMeter().reading().cpus >= 1
        True
    """

    def __init__(self) -> None:
        self.cpus = _affinity()
        self.hz = _user_hz()
        self.restart()

    def restart(self) -> None:
        """Begin a new span now."""
        self._wall = time.perf_counter()
        self._cpu = cpu_ticks(self.cpus)
        self._own = own_ticks()

    def reading(self) -> LoadReading:
        """The load since :meth:`restart` (the span goes on: read it again for a longer one)."""
        wall = time.perf_counter() - self._wall
        cpu, own = cpu_ticks(self.cpus), own_ticks()
        own_s = (own - self._own) / self.hz if own is not None and self._own is not None else 0.0
        if cpu is None or self._cpu is None or own is None or self._own is None:
            return LoadReading(None, own_s, wall, len(self.cpus))
        others_s = (cpu - self._cpu - (own - self._own)) / self.hz
        return LoadReading(others_s, own_s, wall, len(self.cpus), (len(self.cpus) + 2) / self.hz)


def cpu_ticks(cpus: frozenset[int]) -> int | None:
    """Busy ticks of ``cpus`` since boot, from ``/proc/stat`` (None where it cannot be read)."""
    try:
        text = Path("/proc/stat").read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError):
        return None
    total, seen = 0, 0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or not name[3:].isdigit() or int(name[3:]) not in cpus:
            continue
        fields = rest.split()
        try:
            total += sum(int(fields[i]) for i in _BUSY_FIELDS if i < len(fields))
        except ValueError:
            return None
        seen += 1
    return total if seen else None


def own_ticks() -> int | None:
    """This process's user and system ticks (every thread), from ``/proc/self/stat``."""
    try:
        text = Path("/proc/self/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()   # after the command name, which may hold spaces
    try:
        return int(fields[11]) + int(fields[12])   # utime, stime (fields 14 and 15 of proc(5))
    except (IndexError, ValueError):
        return None


def _affinity() -> frozenset[int]:
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset(range(os.cpu_count() or 1))


def _user_hz() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK")) or 100
    except (AttributeError, ValueError, OSError):
        return 100
