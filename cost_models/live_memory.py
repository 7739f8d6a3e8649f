"""The memory free on each accelerator now, and a profile capped at it (``--devices detect``).

In: a base profile (the one detected on this machine, or a built-in or TOML profile the user
names: ``detect:h200-host``), a margin, and what this machine reports now. Out: a
:class:`~cost_models.profiles.DeviceSet` whose accelerators' memory is what is free minus the
margin, with the probe that set it attached (``DeviceSet.probe``, a :class:`Probe`) so that the
plan records it.

The cap of accelerator ``d``::

    cap(d) = min(memory(d), free(d) - margin(d))
    margin(d) = fraction x total(d)     (margin 0.05: 5% of the device's memory, the default)
              | a fixed byte count       (margin "2GiB")

Where ``free`` comes from, first that answers, per device: NVML through ``nvidia-ml-py``
(``pynvml``: free, used, total and utilisation), else ``torch.cuda.mem_get_info`` (free and total),
else the profile's own capacity (nothing free is known: the figure of the profile stands). Each
fallback is said in ``Probe.notes`` ("NVML missing (...): used torch.cuda.mem_get_info", "no CUDA:
used the profile's capacity"). Only ``cuda:N`` devices are probed; other accelerators (NPUs) keep
their profile figure, and the CPU is never capped.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from cost_models.profiles import DeviceKind, DeviceSet, load_profile
from cost_models.units import format_bytes, parse_bytes
from partitioner.errors import ProfileError

__all__ = ["DEFAULT_MARGIN", "CudaReader", "DeviceReading", "Probe", "detect_devices", "parse_margin", "profile_for",
           "read_devices", "SOURCES"]

#: The default margin: 5% of each accelerator's memory is left to the allocator's fragmentation,
#: the CUDA context and whatever else starts between planning and running.
DEFAULT_MARGIN = 0.05

#: Where a reading comes from, best first.
SOURCES = ("nvml", "torch", "profile")

_CUDA_NAME = re.compile(r"(?:^|/)cuda:(\d+)$")


@dataclasses.dataclass(frozen=True)
class DeviceReading:
    """One accelerator's memory as read now."""

    device: str                    # the profile's device name, e.g. "cuda:0"
    source: str                    # "nvml" | "torch" | "profile" (see SOURCES)
    free: int                      # bytes free now (the profile's capacity when source is "profile")
    total: int                     # bytes of the device
    used: int | None = None        # bytes in use (NVML only)
    utilization: float | None = None  # percent of time a kernel ran over the last sample (NVML only)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Probe:
    """What :func:`detect_devices` read, from where and when, and the caps it set."""

    taken_at: str                            # UTC, ISO 8601
    base: str                                # the base profile's source ("detected:local", "builtin:h200-host")
    margin: float | int                      # a fraction of each device's memory (float) or bytes (int)
    readings: tuple[DeviceReading, ...]
    caps: Mapping[str, int]                  # device -> the memory the plan may use there
    notes: tuple[str, ...] = ()              # each fallback, said in words

    def to_dict(self) -> dict[str, Any]:
        """The plan's ``probe`` section (see :mod:`partitioner.plan.live`)."""
        return {"taken_at": self.taken_at, "base": self.base,
                "margin": {"fraction": self.margin} if isinstance(self.margin, float) else {"bytes": self.margin},
                "devices": {r.device: {**{k: v for k, v in r.to_dict().items() if k != "device"},
                                       "cap": self.caps[r.device]} for r in self.readings},
                "notes": list(self.notes)}


def parse_margin(value: float | int | str) -> float | int:
    """A margin: a fraction in [0, 1) (``0.05``, ``"5%"``) or a byte count (``"2GiB"``, ``1024``).

    Example:
        >>> parse_margin("5%"), parse_margin("1KiB")
        (0.05, 1024)
    """
    where = "detect margin"
    form = "a fraction in [0, 1) such as 0.05, a percentage \"5%\" or a size \"2GiB\""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = float(text[:-1]) / 100 if text.endswith("%") else int(text) if text.isdigit() else float(text)
        except ValueError:
            if text.endswith("%"):
                raise ProfileError(f"{where} {text!r}: expected {form}") from None
            return _byte_margin(parse_bytes(text, where=where), text)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProfileError(f"{where} {value!r}: expected {form}")
    if isinstance(value, float):
        if not 0 <= value < 1:
            raise ProfileError(f"{where} {value!r}: a fraction must be in [0, 1); expected {form}")
        return value
    return _byte_margin(value, value)


def _byte_margin(nbytes: int, raw: Any) -> int:
    if nbytes < 0:
        raise ProfileError(f"detect margin {raw!r} is negative; give a size such as \"2GiB\"")
    return nbytes


class CudaReader:
    """Reads one CUDA device's memory now: NVML when it answers, else ``torch.cuda.mem_get_info``.

    ``nvml`` and ``torch_module`` return the initialised ``pynvml`` module and ``torch`` (or None);
    they default to importing them. Why a source was passed over is kept in ``notes``.

    Example:
        >>> reading = CudaReader().read("cuda:0", 0)      # None on a machine without CUDA
        >>> reading is None or reading.source in ("nvml", "torch")
        True
    """

    def __init__(self, *, nvml: Callable[[], Any] | None = None, torch_module: Callable[[], Any] | None = None) -> None:
        from cost_models.detect import _cuda_available, _import_torch, _nvml

        self.notes: list[str] = []
        nv = nvml() if nvml is not None else _nvml_or_why(_nvml)
        if isinstance(nv, str):
            self.notes.append(f"NVML missing ({nv}): used torch.cuda.mem_get_info")
            nv = None
        torch = torch_module() if torch_module is not None else _import_torch()
        self.nvml, self.torch = nv, torch if torch is not None and _cuda_available(torch) else None

    def read(self, name: str, index: int) -> DeviceReading | None:
        """The reading of CUDA device ``index`` (reported as ``name``), or None when neither source has it."""
        reading = _read_nvml(self.nvml, name, index, self.notes) if self.nvml is not None else None
        if reading is None and self.torch is not None:
            reading = _read_torch(self.torch, name, index, self.notes)
        return reading


def read_devices(profile: DeviceSet, *,
                 reader: CudaReader | None = None) -> tuple[tuple[DeviceReading, ...], tuple[str, ...]]:
    """The memory of every accelerator of ``profile`` now, and a note for each fallback taken.

    Example:
        >>> readings, notes = read_devices(load_profile("h200-host"))
        >>> readings[0].device
        'cuda:0'
    """
    accelerators = [d for d in profile.devices if d.kind is not DeviceKind.CPU]
    cuda = {d.name: int(m.group(1)) for d in accelerators if (m := _CUDA_NAME.search(d.name))}
    if cuda and reader is None:
        reader = CudaReader()
    readings, notes = [], []
    for device in accelerators:
        index = cuda.get(device.name)
        reading = reader.read(device.name, index) if index is not None and reader is not None else None
        if reading is None:
            why = ("not a CUDA device" if index is None else
                   "no CUDA" if reader is None or reader.torch is None else f"no CUDA device {index} here")
            notes.append(f"{device.name}: {why}: used the profile's capacity ({format_bytes(device.memory)})")
            reading = DeviceReading(device.name, "profile", device.memory, device.memory)
        readings.append(reading)
    return tuple(readings), tuple([*(reader.notes if reader is not None else ()), *notes])


def _nvml_or_why(load: Callable[[], Any]) -> Any:
    """The initialised pynvml module, or a string saying why there is none."""
    try:
        import pynvml  # noqa: F401 - only to tell "not installed" from "no driver"
    except ImportError as err:
        return f"{err}; pip install nvidia-ml-py"
    module = load()
    return module if module is not None else "nvmlInit failed (no NVIDIA driver?)"


def _read_nvml(nv: Any, name: str, index: int, notes: list[str]) -> DeviceReading | None:
    try:
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        info = nv.nvmlDeviceGetMemoryInfo(handle)
    except Exception as err:  # noqa: BLE001 - any NVML error means "ask torch instead", said in the notes
        notes.append(f"{name}: NVML failed ({err}): used torch.cuda.mem_get_info")
        return None
    try:
        utilization = float(nv.nvmlDeviceGetUtilizationRates(handle).gpu)
    except Exception:  # noqa: BLE001 - utilisation is optional (not supported on every GPU)
        utilization = None
    return DeviceReading(name, "nvml", int(info.free), int(info.total), int(info.used), utilization)


def _read_torch(torch: Any, name: str, index: int, notes: list[str]) -> DeviceReading | None:
    if index >= torch.cuda.device_count():
        return None
    try:
        free, total = torch.cuda.mem_get_info(index)
    except RuntimeError as err:
        notes.append(f"{name}: torch.cuda.mem_get_info failed ({err})")
        return None
    return DeviceReading(name, "torch", int(free), int(total))


def detect_devices(base: str | DeviceSet | None = None, *, margin: float | int | str = DEFAULT_MARGIN,
                   readings: tuple[DeviceReading, ...] | None = None) -> DeviceSet:
    """``base`` with each accelerator capped at its free memory now minus ``margin``.

    ``base`` is None for this machine's own profile (:func:`cost_models.detect.detect_local`
    without micro-benchmarks: its devices, datasheet figures), or a built-in name, a TOML path or a
    DeviceSet. ``readings`` replaces the probe (tests, or a reading taken elsewhere).

    Raises:
        ProfileError: a bad margin or base, or a device with nothing left after the margin.

    Example:
        >>> ds = detect_devices("h200-host")
        >>> ds.probe.readings[0].source in ("nvml", "torch", "profile")
        True
    """
    from cost_models.detect import detect_local

    share = parse_margin(margin)
    profile = detect_local(measure=False) if base is None else load_profile(base) if isinstance(base, str) else base
    notes: tuple[str, ...] = ()
    if readings is None:
        readings, notes = read_devices(profile)
        if not readings:
            notes = (f"{profile.name} has no accelerator: nothing capped",)
    caps = {}
    for r in readings:
        device = profile.device(r.device)
        keep = int(share * r.total) if isinstance(share, float) else share
        cap = min(device.memory, r.free - keep)
        if cap <= 0:
            raise ProfileError(f"{r.device}: {format_bytes(r.free)} free now ({r.source}), nothing left after the "
                               f"margin of {format_bytes(keep)}; free memory on {r.device}, lower the margin "
                               f"(--detect-margin), or plan without it (--devices {_base_name(profile)})")
        caps[r.device] = cap
    probe = Probe(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), profile.source, share, tuple(readings),
                  caps, notes)
    capped = profile.with_memory({d: c for d, c in caps.items() if c < profile.device(d).memory})
    lines = [f"live memory at {probe.taken_at}, margin {_margin_text(share)}: " +
             ", ".join(f"{d} {format_bytes(c)} ({r.source})" for (d, c), r in zip(caps.items(), readings)),
             *notes]
    return dataclasses.replace(capped, notes=capped.notes + tuple(lines), probe=probe)


def profile_for(spec: str | DeviceSet, *, margin: float | int | str = DEFAULT_MARGIN) -> DeviceSet:
    """A profile from a ``--devices`` value: ``detect`` or ``detect:BASE`` probes now, else load it.

    Example:
        >>> profile_for("detect:h200-host").probe is not None, profile_for("h200-host").probe
        (True, None)
    """
    if isinstance(spec, DeviceSet):
        return spec
    if spec == "detect":
        return detect_devices(None, margin=margin)
    if spec.startswith("detect:"):
        base = spec.removeprefix("detect:")
        if not base:
            raise ProfileError("--devices detect: names no base profile; use detect (this machine) or "
                               "detect:NAME, e.g. detect:h200-host")
        try:
            profile = load_profile(base)
        except ProfileError as err:
            raise ProfileError(f"--devices {spec}: unknown base profile: {err}") from None
        return detect_devices(profile, margin=margin)
    return load_profile(spec)


def _base_name(profile: DeviceSet) -> str:
    """How ``--devices`` names the base profile: its built-in name, its file, or PROFILE for a detected one."""
    if profile.source.startswith("builtin:"):
        return profile.source.removeprefix("builtin:")
    return profile.source if profile.source.endswith(".toml") else "PROFILE"


def _margin_text(margin: float | int) -> str:
    return f"{margin:.0%} of each device" if isinstance(margin, float) else format_bytes(margin)
