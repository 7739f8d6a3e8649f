"""Calibration: a device profile of this machine fitted to micro-benchmarks run on it.

In: the devices to calibrate (``"detect"``: this machine's CPU and CUDA GPUs; or a profile whose
devices are present or bound to present ones), how much to measure, and a progress callback.
Out: a :class:`Calibration`: the fitted :class:`~cost_models.profiles.DeviceSet` — its
``to_toml()`` is the profile file, with the provenance, every residual and the verdict as comments
— and the fits behind it, with ``poor`` set when any fit is poor.

For each physical device: the micro-benchmark suites (:mod:`cost_models.microbench`) measured in
place, the first-touch measurement on the host, and a fit (:func:`cost_models.fit.fit_device`);
then the backward of grouped (depthwise) convolutions, whose slower rate is fitted apart
(:func:`cost_models.fit.fit_grouped_backward`).
For each host-accelerator pair: copies from 4 KiB to 256 MiB, pinned and pageable, fitted
(:func:`cost_models.fit.fit_link`). For the host: its CPU limits (affinity, cgroup quota, torch's
threads) and a matmul's rate in bursts against its sustained rate, with a warning when sustained
work runs slower (:mod:`cost_models.cpu_limits`). Measurements are not taken from the measurement cache: a
calibration measures the machine as it is now. The profile holds for the torch version and the
intra-op thread count it was measured with; both are in its comments.
"""

from __future__ import annotations

import dataclasses
import platform
import time
from collections.abc import Mapping

import torch

from cost_models.copies import measure_copies
from cost_models.cpu_limits import burst_and_sustained, cpu_limits
from cost_models.fit import DeviceFit, LinkFit, fit_device, fit_grouped_backward, fit_link
from cost_models.measure import MeasureOptions, ProgressFn
from cost_models.measure_cache import MeasurementCache
from cost_models.microbench import first_touch, grouped_backward, run_suites, suites
from cost_models.profiles import DeviceSet

__all__ = ["Calibration", "calibrate", "LINK_SIZES"]

SUSTAINED_FLOOR = 0.8   # sustained / burst matmul rate below which the calibration warns

#: Copy sizes measured for each link: 4 KiB to 256 MiB.
LINK_SIZES = tuple(4096 * 4**i for i in range(9))


@dataclasses.dataclass(frozen=True)
class Calibration:
    """A fitted profile and the fits behind it."""

    profile: DeviceSet
    devices: Mapping[str, DeviceFit]     # physical device -> its fit
    links: Mapping[str, LinkFit]         # link label -> its fit

    @property
    def poor(self) -> bool:
        """Whether any fit is poor (see :data:`cost_models.fit.POOR_MEDIAN`)."""
        return any(f.poor for f in self.devices.values()) or any(f.poor for f in self.links.values())

    def verdicts(self) -> list[str]:
        """One line per fit: rows, median and worst error, good or POOR FIT."""
        return [f.notes[0] for f in (*self.devices.values(), *self.links.values())]


def calibrate(
    devices: str | DeviceSet = "detect",
    *,
    name: str = "calibrated",
    bind: Mapping[str, str] | None = None,
    quick: bool = False,
    options: MeasureOptions = MeasureOptions(),
    progress: ProgressFn | None = None,
) -> Calibration:
    """Measure this machine and fit a profile to it (see the module docstring).

    Example:
        >>> cal = calibrate("detect", name="my-host", quick=True)     # doctest: +SKIP
        >>> cal.profile.names(), cal.poor
        (('cpu',), False)
    """
    from cost_models.detect import detect_local
    from cost_models.profiler import physical_binding

    logical = detect_local(measure=False) if devices == "detect" else devices
    if isinstance(logical, str):
        from cost_models.profiles import load_profile

        logical = load_profile(logical)
    binding = physical_binding(logical, bind)
    missing = [d for d in logical.names() if d not in binding]
    if missing:
        _raise_missing(missing, logical)
    cache = MeasurementCache()   # in memory: calibration measures the machine as it is now
    fits: dict[str, DeviceFit] = {}
    threads = torch.get_num_threads() if options.threads is None else options.threads
    for physical in dict.fromkeys(binding.values()):
        kind = "gpu" if torch.device(physical).type == "cuda" else "cpu"
        rows = run_suites(physical, suites(kind, quick=quick, bf16=_bf16_ok(physical)), options=options,
                          cache=cache, progress=progress)
        touch = first_touch(physical) if kind == "cpu" else None
        template = next(logical.device(d) for d, p in binding.items() if p == physical)
        fit = fit_device(physical, template.kind, template.memory, rows, first_touch=touch, host=template.host)
        backward = grouped_backward(physical, quick=quick, options=options, cache=cache, progress=progress)
        fits[physical] = fit_grouped_backward(fit, backward)
    links: dict[str, LinkFit] = {}
    for link in logical.links:
        a, b = (binding[x] for x in link.between)
        if a == b:
            continue
        copies = measure_copies(LINK_SIZES if not quick else LINK_SIZES[::4], [(a, b), (b, a)], cache=cache,
                                progress=progress)
        fitted = fit_link(a, b, copies, link.kind or "pcie")
        links[link.label] = dataclasses.replace(
            fitted, link=dataclasses.replace(fitted.link, between=link.between))
    out_devices = tuple(dataclasses.replace(fits[binding[d.name]].device, name=d.name, kind=d.kind, memory=d.memory,
                                            host=d.host, supported_ops=d.supported_ops)
                        for d in logical.devices)
    out_links = tuple(links[link.label].link if link.label in links else link for link in logical.links)
    notes = [f"calibrated by `hetpart calibrate` on {platform.node() or 'this machine'} ({platform.machine()}) at "
             f"{time.strftime('%Y-%m-%d %H:%M:%S')}: torch {torch.__version__}, {threads} intra-op threads — the "
             f"profile holds for this torch version and thread count",
             "devices bound for measuring: " + ", ".join(f"{d}->{p}" for d, p in binding.items())]
    verdicts = [f.notes[0] for f in (*fits.values(), *links.values())]
    if any(torch.device(p).type == "cpu" for p in binding.values()):
        verdicts += _host_limits(quick)
    if any(f.poor for f in (*fits.values(), *links.values())):
        notes.append("POOR FIT: at least one fit below is poor; re-run `hetpart calibrate` on an idle machine")
    notes += verdicts
    for fit in (*fits.values(), *links.values()):
        notes += fit.notes[1:]
    profile = DeviceSet(name, out_devices, out_links, source=f"calibrated:{platform.node() or 'local'}",
                        notes=tuple(notes))
    return Calibration(profile, fits, links)


def _raise_missing(missing: list[str], logical: DeviceSet) -> None:
    from partitioner.errors import HetpartError

    raise HetpartError(f"cannot calibrate {', '.join(missing)} of profile {logical.name!r}: not present on this "
                       f"machine; bind each to a present device (--bind {missing[0]}=cpu) or use --devices detect")


def _host_limits(quick: bool) -> list[str]:
    """The host's CPU limits, and a warning when sustained work runs slower than bursts."""
    limits = cpu_limits()
    burst, sustained = burst_and_sustained(sustained_s=0.3 if quick else 1.0)
    ratio = sustained / burst
    lines = [limits.line(), *limits.warnings(),
             f"host matmul 512^3 fp32: {burst / 1e9:.3g} GFLOP/s in bursts, {sustained / 1e9:.3g} GFLOP/s sustained "
             f"({ratio:.2f}x)"]
    if ratio < SUSTAINED_FLOOR:
        lines.append(f"SUSTAINED WORK RUNS AT {ratio:.2f}x THE RATE OF BURSTS (a CPU quota below torch's threads, or "
                     f"other processes on this machine): whole models will run slower than this profile predicts; "
                     f"use the profiled model (hetpart profile), or fewer threads")
    return lines


def _bf16_ok(device: str) -> bool:
    """Whether bf16 matmuls are worth measuring (CUDA, or a CPU with AVX-512 or AMX)."""
    if torch.device(device).type == "cuda":
        return True
    return torch.backends.cpu.get_cpu_capability() in ("AVX512", "AVX512_BF16", "AMX")
