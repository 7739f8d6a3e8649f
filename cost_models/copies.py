"""Measured copies between devices: what moving a tensor of a given size really costs here.

In: tensor sizes in bytes (the distinct sizes a plan may cut, and the weights it may stream),
pairs of physical devices present on this machine, and the measurement cache. Out: one
:class:`CopyTime` per (source, destination, pinned, size): the median of timed ``Tensor.to``
copies after a warm-up, synchronised on CUDA. ``pinned`` copies leave page-locked host memory
with ``non_blocking=True`` (how streamed weights and hetpart's transfers move); pageable ones
are plain copies of ordinary host tensors (what ``.to(device)`` of a normal tensor does). A pair
of logical devices bound to the same physical device copies nothing (``.to`` returns the tensor
itself): that costs the call, which is measured too.

:func:`interpolate` reads a table of measured sizes at any size: linear between the two
measured neighbours (a copy is latency plus bytes over bandwidth, linear in bytes), the rate of
the largest size beyond it, the smallest size's time below it.
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence

import torch

from cost_models.measure_cache import MeasurementCache
from cost_models.signature import environment

__all__ = ["CopyTime", "measure_copies", "representative_sizes", "interpolate"]

MAX_SIZES = 16       # sizes measured per device pair at most (representatives of the rest)
_REPEATS = 7
_BUDGET_S = 2.0      # per size and direction, before taking fewer repeats


@dataclasses.dataclass(frozen=True)
class CopyTime:
    """One measured copy: ``nbytes`` from ``src`` to ``dst`` took ``seconds`` (median)."""

    src: str
    dst: str
    pinned: bool
    nbytes: int
    seconds: float


def representative_sizes(sizes: Iterable[int], limit: int = MAX_SIZES) -> list[int]:
    """At most ``limit`` of the distinct positive ``sizes``, spread evenly over their sorted order
    (always the smallest and the largest).

    Example:
        >>> representative_sizes([8, 8, 16, 4096, 0], limit=2)
        [8, 4096]
    """
    distinct = sorted({int(s) for s in sizes if s > 0})
    if len(distinct) <= limit:
        return distinct
    step = (len(distinct) - 1) / (limit - 1)
    return sorted({distinct[round(i * step)] for i in range(limit)})


def measure_copies(
    sizes: Sequence[int],
    pairs: Iterable[tuple[str, str]],
    *,
    cache: MeasurementCache | None = None,
    repeats: int = _REPEATS,
    progress: Callable[[int, int, str], None] | None = None,
) -> list[CopyTime]:
    """Time copies of every size in ``sizes`` for every (source, destination) in ``pairs``.

    Host-to-accelerator and accelerator-to-host pairs are measured pinned and pageable; others
    (accelerator to accelerator, a device to itself) once, as ``pinned``.

    Example:
        >>> [(c.src, c.dst, c.nbytes) for c in measure_copies([4096], [("cpu", "cpu")])]
        [('cpu', 'cpu', 4096)]
    """
    cache = cache if cache is not None else MeasurementCache()
    jobs = [(src, dst, pinned) for src, dst in dict.fromkeys(pairs) for pinned in _variants(src, dst)]
    out = []
    for i, (src, dst, pinned) in enumerate(jobs):
        env = environment(src)
        for nbytes in sizes:
            signature = f"copy({src}->{dst}, bytes={nbytes}, pinned={pinned})"
            entry = cache.get(env, "copy", signature)
            if entry is None or len(entry.samples) < min(3, repeats):
                entry = cache.put(env, "copy", signature, _time_copy(nbytes, src, dst, pinned, repeats))
            out.append(CopyTime(src, dst, pinned, nbytes, entry.seconds or 0.0))
        if progress is not None:
            progress(i + 1, len(jobs), f"copies {src}->{dst}{' pinned' if pinned else ''}")
    return out


def _variants(src: str, dst: str) -> tuple[bool, ...]:
    host = {torch.device(src).type == "cpu", torch.device(dst).type == "cpu"}
    return (True, False) if src != dst and host == {True, False} else (True,)


def _time_copy(nbytes: int, src: str, dst: str, pinned: bool, repeats: int) -> list[float]:
    source, target = torch.device(src), torch.device(dst)
    cuda = "cuda" in (source.type, target.type)
    pin = pinned and source.type == "cpu" and target.type == "cuda"
    x = torch.empty(nbytes, dtype=torch.uint8, device=source, pin_memory=pin)
    x.fill_(1)
    landing = None
    if pinned and source.type == "cuda" and target.type == "cpu":   # into a page-locked buffer
        landing = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def copy() -> None:
        if landing is not None:
            landing.copy_(x, non_blocking=True)
        else:
            x.to(target, non_blocking=pinned)
        if cuda:
            torch.cuda.synchronize()

    copy()
    samples: list[float] = []
    started = time.perf_counter()
    while len(samples) < repeats:
        t0 = time.perf_counter()
        copy()
        samples.append(time.perf_counter() - t0)
        if len(samples) >= 3 and time.perf_counter() - started > _BUDGET_S:
            break
    return samples


def interpolate(table: Sequence[tuple[int, float]], nbytes: float) -> float:
    """Seconds to copy ``nbytes`` from ``(size, seconds)`` measurements sorted by size.

    Example:
        >>> round(interpolate([(1000, 1e-5), (3000, 3e-5)], 2000), 9)
        2e-05
    """
    if not table:
        raise ValueError("no measured copies to interpolate")
    sizes = [s for s, _ in table]
    i = bisect.bisect_left(sizes, nbytes)
    if i < len(sizes) and sizes[i] == nbytes:
        return table[i][1]
    if i == 0:
        return table[0][1]
    if i == len(sizes):
        size, seconds = table[-1]
        return seconds * nbytes / size
    (s0, t0), (s1, t1) = table[i - 1], table[i]
    return t0 + (t1 - t0) * (nbytes - s0) / (s1 - s0)

