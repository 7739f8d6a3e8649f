"""Fitting a device profile to measured op times, and saying how well it fits.

In: measured rows (each a captured :class:`~partitioner.ir.Op` and its measured seconds, from
:mod:`cost_models.microbench` or any other source), optionally the first-touch measurement, and
measured copies between two devices. Out: a :class:`DeviceFit` (the fitted
:class:`~cost_models.profiles.Device`, every row's residual, the median and worst error and a
verdict) and a :class:`LinkFit` (the fitted :class:`~cost_models.profiles.Link` and its residuals).

What is fitted, in order (each from the rows that measure it, the rest held fixed):

* ``launch_overhead``: the median time of one-element elementwise ops (the cost of a call);
* ``fixed_latency.view``: the median time of view ops (they move nothing but are still calls);
* ``peak_flops[dtype]``: the best rate of each dtype measured among matmuls, convolutions and
  attention (a convolution library can beat the matmul path: 2x on the 2-core test machine);
* ``mem_bandwidth``, ``cache_size``, ``cache_bandwidth``: from the copy size sweep (the copies whose
  output pays no first touch), the best rate of the largest working sets (DRAM), and the best rate of the working sets that stream at least
  1.5x faster (cache) up to the geometric mean of the largest of them and the next size;
* ``alloc_threshold`` and ``first_touch_bandwidth``: taken from the first-touch measurement;
* ``matmul_half_rows``: with the float32 matmul rows that have weights, the value of
  :data:`HALF_ROWS_GRID` whose fit of the matmul class below has the lowest error (a matmul with
  few rows per weight runs below the rate of a large one: 36-42 GFLOP/s at 64 rows against 64 at
  512 on the 2-core test machine); every matmul row's efficiency is then scaled by its rows factor;
* per op class (and dtype for matmul, conv and attention rows that are not float32): the compute
  efficiency, memory efficiency and fixed latency minimising the mean absolute log error of
  :func:`cost_models.analytic.kernel_time`'s roofline over the class's rows (a grid search); the
  compute-bound classes keep a memory efficiency of 1 (their rows cannot tell it apart from a low
  compute efficiency, and a copy bounds how fast they stream).

Residuals are computed with :func:`cost_models.analytic.op_time` on the fitted device — the code
that prices plans — not with the fitting formula. A fit is *poor* when the median absolute
relative error is above :data:`POOR_MEDIAN` or a row is off by more than :data:`POOR_WORST`;
a loaded machine (other processes stealing the cores) is the usual cause.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

import torch

from cost_models.analytic import op_time, weight_rows
from cost_models.copies import CopyTime
from cost_models.microbench import BackwardRow, FirstTouch, Row
from cost_models.profiles import Device, DeviceKind, Link
from cost_models.units import format_bytes, format_rate, format_seconds
from partitioner.ir import OpClass

__all__ = ["DeviceFit", "LinkFit", "Residual", "fit_device", "fit_link", "grid_fit", "POOR_MEDIAN", "POOR_WORST"]

POOR_MEDIAN = 0.25   # a fit whose median |relative error| is above this is poor
POOR_WORST = 1.0     # and so is one with a row off by more than this (2x)
CACHE_SPEED_UP = 1.5
#: Classes whose rows are compute-bound: their memory side streams as fast as a copy (memory
#: efficiency 1); what makes them slower is compute efficiency or a fixed cost, not bandwidth.
COMPUTE_CLASSES = (OpClass.MATMUL, OpClass.CONV, OpClass.ATTENTION)
# Descending efficiencies and ascending fixed latencies: where rows leave a parameter free (a class
# that is compute-bound in every row says nothing of its memory efficiency), the first minimum, the
# optimistic value, is taken rather than the worst one.
EFF_GRID = torch.logspace(0.0, math.log10(0.002), 80, dtype=torch.float64)
MEM_GRID = torch.logspace(0.0, math.log10(0.05), 60, dtype=torch.float64)
#: Candidate ``matmul_half_rows``: 0 (the rate does not depend on the rows) and up to 512 rows.
HALF_ROWS_GRID = (0.0, 4.0, 8.0, 16.0, 24.0, 32.0, 48.0, 64.0, 96.0, 128.0, 192.0, 256.0, 384.0, 512.0)
FIXED_GRID = torch.cat([torch.zeros(1, dtype=torch.float64),          # up to 300 µs: an op class's extra
                        torch.logspace(-7, math.log10(3e-4), 40, dtype=torch.float64)])  # setup, not its work


@dataclasses.dataclass(frozen=True)
class Residual:
    """One row: measured and predicted seconds."""

    label: str
    op_class: str
    measured: float
    predicted: float

    @property
    def error(self) -> float:
        """|predicted - measured| / measured."""
        return abs(self.predicted - self.measured) / self.measured

    def line(self) -> str:
        sign = "+" if self.predicted >= self.measured else "-"
        return (f"{self.op_class:<13} {self.label:<58} measured {format_seconds(self.measured):>9}  "
                f"predicted {format_seconds(self.predicted):>9}  {sign}{self.error:.0%}")


def _verdict(residuals: Sequence[Residual], what: str) -> tuple[float, Residual, bool, str]:
    median = statistics.median(r.error for r in residuals)
    worst = max(residuals, key=lambda r: r.error)
    poor = median > POOR_MEDIAN or worst.error > POOR_WORST
    past = [r for r in residuals if r.error > POOR_WORST]
    classes = sorted({r.op_class for r in past})
    if median <= POOR_MEDIAN and len(past) <= 2:
        # a good median with one or two rows far off: a load spike, or kernels of a class that its
        # one efficiency does not describe (e.g. max and adaptive pooling on a CPU): not a busy machine
        cause = (f"the median is good: the {' and '.join(classes)} row{'s' if len(past) > 1 else ''} past the "
                 f"limit {'are kernels' if len(past) > 1 else 'is a kernel'} that the class's one efficiency "
                 f"does not describe here (or a load spike): ops of that class are priced less well (the "
                 f"profiled model measures them); re-run it alone if the machine was busy")
    else:
        cause = "the machine was probably busy: re-run it alone"
    verdict = (f"POOR FIT: median error {median:.0%} (limit {POOR_MEDIAN:.0%}), worst {worst.error:.0%} "
               f"(limit {POOR_WORST:.0%}: {worst.label}); {cause}"
               if poor else f"fit good: median error {median:.1%}, worst {worst.error:.0%} ({worst.label})")
    return median, worst, poor, f"{what}: {len(residuals)} rows; {verdict}"


@dataclasses.dataclass(frozen=True)
class DeviceFit:
    """A fitted device and how well it predicts the rows it was fitted to."""

    device: Device
    residuals: tuple[Residual, ...]
    median_error: float
    worst: Residual
    poor: bool
    notes: tuple[str, ...]      # provenance and residual lines (written as TOML comments)


@dataclasses.dataclass(frozen=True)
class LinkFit:
    """A fitted link and its residuals."""

    link: Link
    residuals: tuple[Residual, ...]
    poor: bool
    notes: tuple[str, ...]


def grid_fit(flops: torch.Tensor, nbytes: torch.Tensor, bandwidth: torch.Tensor, peak: torch.Tensor,
             extra: torch.Tensor, measured: torch.Tensor, *, mem_grid: torch.Tensor | None = None,
             ) -> tuple[float, float, float, float]:
    """Best ``(efficiency, mem_efficiency, fixed, mean |log error|)`` of
    ``max(flops / (peak·eff), nbytes / (bandwidth·mem_eff)) + extra + fixed`` against ``measured``
    (all 1-D float64 tensors of one value per row; ``extra`` is what the rest of the model adds).

    Example:
        >>> t = lambda *v: torch.tensor(v, dtype=torch.float64)
        >>> eff, mem, fixed, loss = grid_fit(t(1e9), t(0.0), t(1e10), t(1e11), t(0.0), t(0.02))
        >>> round(eff, 2)
        0.5
    """
    mem_grid = MEM_GRID if mem_grid is None else mem_grid
    e = EFF_GRID.view(-1, 1, 1, 1)
    m = mem_grid.view(1, -1, 1, 1)
    f = FIXED_GRID.view(1, 1, -1, 1)
    predicted = torch.maximum(flops / (peak * e), nbytes / (bandwidth * m)) + extra + f
    loss = (predicted / measured).log().abs().mean(dim=-1)
    best = int(loss.argmin())
    i, rest = divmod(best, len(mem_grid) * len(FIXED_GRID))
    j, k = divmod(rest, len(FIXED_GRID))
    return float(EFF_GRID[i]), float(mem_grid[j]), float(FIXED_GRID[k]), float(loss.flatten()[best])


def _is_tiny(row: Row) -> bool:
    return row.op.op_class is OpClass.ELEMENTWISE and row.op.bytes_read + row.op.bytes_written <= 64


def _class_key(row: Row) -> str:
    cls = row.op.op_class
    if cls in (OpClass.MATMUL, OpClass.CONV, OpClass.ATTENTION) and row.op.dtype != "float32":
        return f"{cls.value}.{row.op.dtype}"
    return cls.value


def fit_device(name: str, kind: DeviceKind, memory: int, rows: Sequence[Row], *,
               first_touch: FirstTouch | None = None, host: str = "host0") -> DeviceFit:
    """Fit a device of ``kind`` to ``rows`` measured on it (see the module docstring).

    Raises:
        ValueError: the rows lack what the fit needs (one-element ops, fp32 matmuls, the sweep).

    Example:
        >>> fit = fit_device("cpu", DeviceKind.CPU, 2**34, run_suites("cpu", suites()))   # doctest: +SKIP
        >>> fit.poor, fit.device.launch_overhead
        (False, 2.1e-06)
    """
    tiny = [r.seconds for r in rows if _is_tiny(r)]
    fp32 = [r for r in rows if r.op.op_class is OpClass.MATMUL and r.op.dtype == "float32" and r.op.flops]
    sweep = sorted((r for r in rows if r.suite == "stream"), key=lambda r: r.op.bytes_read + r.op.bytes_written)
    if not tiny or not fp32 or len(sweep) < 2:
        raise ValueError("calibration rows need one-element ops, float32 matmuls and the stream sweep")
    launch = statistics.median(tiny)
    views = [r.seconds for r in rows if r.op.op_class is OpClass.VIEW]
    threshold, touch_bw = (first_touch.threshold, first_touch.bandwidth) if first_touch and first_touch.bandwidth else (0, 0.0)

    def first(nbytes: float) -> float:
        return nbytes / touch_bw if threshold and nbytes >= threshold else 0.0

    peaks: dict[str, float] = {}
    for r in rows:   # the best rate of any compute-bound class: convolutions can beat the matmul path
        if r.op.op_class in (OpClass.MATMUL, OpClass.CONV, OpClass.ATTENTION) and r.op.flops:
            rate = r.op.flops / max(r.seconds - launch - first(r.op.bytes_written), 1e-9)
            peaks[r.op.dtype] = max(peaks.get(r.op.dtype, 0.0), rate)
    # rates of copies that pay no first touch (subtracting an estimate of it would add its noise)
    plain = [r for r in sweep if not first(r.op.bytes_written)] or sweep
    rates = [((r.op.bytes_read + r.op.bytes_written),
              (r.op.bytes_read + r.op.bytes_written) / max(r.seconds - launch - first(r.op.bytes_written), 1e-9))
             for r in plain]
    largest = rates[-1][0]
    dram = max(rate for size, rate in rates if size >= largest / 4)
    cached = [(size, rate) for size, rate in rates if rate >= CACHE_SPEED_UP * dram]
    cache_size = 0
    if cached:   # between the largest working set that streams fast and the next one measured
        fast = max(size for size, _ in cached)
        slow = min((size for size, _ in rates if size > fast), default=fast)
        cache_size = int(math.sqrt(fast * slow))
    cache_bw = max((rate for _, rate in cached), default=0.0)
    base = Device(name, kind, memory, _round(peaks), _round1(dram), _round1(launch), host=host,
                  cache_size=int(cache_size), cache_bandwidth=_round1(cache_bw),
                  alloc_threshold=int(threshold), first_touch_bandwidth=_round1(touch_bw),
                  fixed_latency={"view": _round1(statistics.median(views))} if views else {})
    efficiency, mem_efficiency, fixed = {}, {}, dict(base.fixed_latency)
    groups: dict[str, list[Row]] = {}
    for r in rows:
        if r.op.op_class is not OpClass.VIEW:
            groups.setdefault(_class_key(r), []).append(r)

    def fit_class(members: list[Row], half_rows: float) -> tuple[float, float, float, float]:
        vec = lambda xs: torch.tensor(xs, dtype=torch.float64)  # noqa: E731
        footprint = [r.op.param_bytes if r.op.op_class is OpClass.GATHER else 0 for r in members]
        nbytes = [r.op.bytes_read + r.op.bytes_written for r in members]
        compute_class = members[0].op.op_class in COMPUTE_CLASSES
        rows_device = dataclasses.replace(base, matmul_half_rows=half_rows)
        scale = [rows_device.rows_factor(weight_rows(r.op)) if r.op.op_class is OpClass.MATMUL else 1.0
                 for r in members]  # a lower rows factor is the same as more flops at the class's efficiency
        return grid_fit(
            vec([float(r.op.flops) / k for r, k in zip(members, scale)]), vec(nbytes),
            vec([base.stream_bandwidth(max(b, f)) for b, f in zip(nbytes, footprint)]),
            vec([base.peak(r.op.dtype) for r in members]),
            vec([launch + first(r.op.bytes_written) for r in members]), vec([r.seconds for r in members]),
            mem_grid=MEM_GRID[:1] if compute_class else MEM_GRID)

    weighted = [r for r in groups.get(OpClass.MATMUL.value, []) if weight_rows(r.op) != float("inf")]
    half_rows = 0.0
    if len({weight_rows(r.op) for r in weighted}) >= 2:  # rows of two sizes say how the rate depends on them
        half_rows = min(HALF_ROWS_GRID, key=lambda h: (round(fit_class(groups[OpClass.MATMUL.value], h)[3], 9), h))
    base = dataclasses.replace(base, matmul_half_rows=half_rows)
    for key, members in sorted(groups.items()):
        nbytes = [r.op.bytes_read + r.op.bytes_written for r in members]
        eff, mem, fix, _ = fit_class(members, half_rows)
        if any(r.op.flops for r in members):
            efficiency[key] = _round1(eff)
        if any(nbytes):
            mem_efficiency[key] = _round1(mem)
        if fix:
            fixed[key] = _round1(fix)
    device = dataclasses.replace(base, efficiency=efficiency, mem_efficiency=mem_efficiency, fixed_latency=fixed)
    residuals = tuple(Residual(r.label, r.op.op_class.value, r.seconds, op_time(r.op, device).seconds) for r in rows)
    median, worst, poor, headline = _verdict(residuals, f"{name}: {len(rows)} micro-benchmark rows")
    notes = [headline,
             f"{name}: launch {format_seconds(launch)} (one-element ops), views {format_seconds(base.fixed('view'))}; "
             f"peak {', '.join(f'{d} {v / 1e9:.3g} GFLOP/s' for d, v in peaks.items())} (best matmul, conv "
             f"or attention); "
             f"memory {format_rate(dram)} (largest working sets)"
             + (f", cache {format_rate(cache_bw)} up to {format_bytes(cache_size)}" if cache_size else ", no faster cache tier")
             + (f"; matmuls at half their efficiency at {half_rows:g} rows per weight" if half_rows else "")]
    if first_touch is not None:
        notes.append(f"{name}: first touch: a fresh {format_bytes(first_touch.size)} buffer fills in "
                     f"{format_seconds(first_touch.fresh_s)}, a reused one in {format_seconds(first_touch.reused_s)}; "
                     + (f"every allocation from {format_bytes(threshold)} is fresh: {format_rate(touch_bw)} of page faults"
                        if threshold else "no size tried is always fresh"))
    notes.append(f"{name}: residuals (each row predicted by the fitted profile):")
    notes += [f"  {r.line()}" for r in residuals]
    return DeviceFit(device, residuals, median, worst, poor, tuple(notes))


def fit_grouped_backward(fit: DeviceFit, rows: Sequence[BackwardRow]) -> DeviceFit:
    """``fit`` with ``grouped_backward_flops`` set from the measured backward of grouped
    convolutions (:func:`cost_models.microbench.grouped_backward`): the median rate of their
    backward FLOPs (``BACKWARD_FACTOR`` × forward FLOPs), kept only where it is slower than the
    class's own rate predicts (elsewhere the field stays 0: a grouped backward runs as its class).
    The rows and their predictions are added to the notes.

    Example:
        >>> fit = fit_grouped_backward(fit, grouped_backward("cpu"))   # doctest: +SKIP
        >>> fit.device.grouped_backward_flops
        3.9e9
    """
    from cost_models.training import BACKWARD_FACTOR, backward_time

    rows = [r for r in rows if r.op.flops and r.backward_s > 0]
    if not rows:
        return fit
    plain = dataclasses.replace(fit.device, grouped_backward_flops=0.0)
    rate = statistics.median(BACKWARD_FACTOR * r.op.flops / max(r.backward_s - plain.launch_overhead, 1e-9)
                             for r in rows)
    device = dataclasses.replace(plain, grouped_backward_flops=_round1(rate))
    slower = sum(backward_time(r.op, plain).seconds < r.backward_s for r in rows) > len(rows) / 2
    if not slower:
        device = plain
    name = fit.device.name
    notes = [f"{name}: grouped convolutions' backward: "
             + (f"{rate / 1e9:.3g} GFLOP/s (their class's rate predicts them faster)" if slower
                else "as their class (no slower rate fitted)")]
    for r in rows:
        label = f"{r.op.kind} backward, {r.op.groups} groups, {r.op.flops / 1e6:.3g} MFLOP"
        notes.append(f"  {Residual(label, 'conv', r.backward_s, backward_time(r.op, device).seconds).line()}")
    return dataclasses.replace(fit, device=device, notes=(*fit.notes, *notes))


def fit_link(a: str, b: str, copies: Sequence[CopyTime], kind: str = "pcie") -> LinkFit:
    """Fit ``latency`` (the smallest copies), ``bandwidth`` (the largest pinned copies) and
    ``pageable_bandwidth`` (the largest pageable ones) of the link between ``a`` and ``b``.

    Example:
        >>> rows = [CopyTime("cpu", "cuda:0", True, n, 1e-5 + n / 5e10) for n in (4096, 2**26)]
        >>> fit = fit_link("cpu", "cuda:0", rows)
        >>> round(fit.link.bandwidth / 1e9), round(fit.link.latency * 1e6)
        (50, 10)
    """
    both = [c for c in copies if {c.src, c.dst} == {a, b}]
    pinned = sorted((c for c in both if c.pinned), key=lambda c: c.nbytes)
    pageable = sorted((c for c in both if not c.pinned), key=lambda c: c.nbytes)
    if not pinned:
        raise ValueError(f"no pinned copies measured between {a} and {b}")
    latency = min(c.seconds for c in pinned[: max(1, len(pinned) // 4)])

    def rate(rows: list[CopyTime]) -> float:
        large = [c for c in rows if c.nbytes >= rows[-1].nbytes / 4]
        return max(c.nbytes / max(c.seconds - latency, 1e-9) for c in large)

    bandwidth = _round1(rate(pinned))
    pageable_bw = _round1(rate(pageable)) if pageable else None
    link = Link((a, b), bandwidth, _round1(latency), pageable_bw, kind)
    residuals = tuple(
        Residual(f"copy {c.src}->{c.dst} {format_bytes(c.nbytes)}{' pinned' if c.pinned else ''}", "copy", c.seconds,
                 latency + c.nbytes / (bandwidth if c.pinned else (pageable_bw or bandwidth)))
        for c in both if c.seconds > 0)
    _, _, poor, headline = _verdict(residuals, f"link {a}<->{b}: {len(both)} copies")
    notes = [headline, f"link {a}<->{b}: latency {format_seconds(latency)}, pinned {format_rate(bandwidth)}"
             + (f", pageable {format_rate(pageable_bw)}" if pageable_bw else "")]
    notes += [f"  {r.line()}" for r in residuals]
    return LinkFit(link, residuals, poor, tuple(notes))


def _round1(x: float) -> float:
    """Three significant digits: a measurement is not more precise than that."""
    return float(f"{x:.3g}") if x else 0.0


def _round(table: dict[str, float]) -> dict[str, float]:
    return {k: _round1(v) for k, v in table.items()}
