"""The options of ``torch.compile(model, backend="hetpart", options={...})``.

In: the ``options`` mapping torch.compile passes to the backend (or keyword arguments). Out: a
frozen :class:`CompileOptions`, its device set (the profile with the memory caps applied), the
keyword arguments of :func:`partitioner.partition_outcome` it stands for, and the part of the plan
cache key it contributes. An unknown option is an error that lists the known ones; a bad value is
an error naming the option.

Example:
    >>> opts = parse_options({"devices": "cpu-gpu-npu", "memory": {"cuda:0": "24KB"}})
    >>> opts.objective
    'latency'
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cost_models.profiles import DeviceSet, load_profile
from partitioner.errors import HetpartError
from partitioner.options import FIELDS, META, PlanOptions

LOCAL = "local"  # ``devices="local"``: this machine, profiled without measuring (cpu + each CUDA GPU)

#: the compile backend's own defaults for the plan options (the record's otherwise)
COMPILE_DEFAULTS = {
    "devices": LOCAL,    # this machine
    "time_limit": 10.0,  # seconds per graph: a model compiles many graphs
    "training": None,    # decide per graph: grad mode on and a parameter that requires grad
    "placed_optimizer": False,  # the user's optimizer steps the compiled model, after backward
}
#: the plan options torch.compile takes (the record's metadata says which, and why not the others)
PLAN_FIELDS = tuple(name for name, meta in META.items() if meta["compile"] is True)
OWN = ("device_map", "plan_dir")


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    """What the backend plans for and how: the plan options of every graph (a
    :class:`~partitioner.options.PlanOptions`) and the backend's own two. A plan option reads as
    an attribute too (``opts.objective``)."""

    plan: PlanOptions = dataclasses.field(default_factory=lambda: PlanOptions.build(**COMPILE_DEFAULTS))
    device_map: Mapping[str, str] = dataclasses.field(default_factory=dict)  # logical -> physical binding
    plan_dir: str | None = None               # folder where plans are saved and reused across processes

    def __getattr__(self, name: str) -> Any:
        if name in FIELDS:
            return self.plan.get(name)
        raise AttributeError(name)

    def replace(self, **changes: Any) -> CompileOptions:
        """These options with some replaced: ``device_map`` and ``plan_dir``, or plan options (checked
        again by the record).

        Example:
            >>> parse_options({"devices": "h200-host"}).replace(memory={"cuda:0": "1GB"}).memory
            {'cuda:0': '1GB'}
        """
        own = {k: changes.pop(k) for k in OWN if k in changes}
        plan = self.plan.replace(**changes) if changes else self.plan
        return dataclasses.replace(self, plan=plan, **own)

    def profile(self) -> DeviceSet:
        """The device set the plans are made for: the profile with the memory caps applied."""
        devices, memory = self.plan.hardware.devices, self.plan.hardware.memory
        if isinstance(devices, DeviceSet):
            profile = devices
        elif devices == LOCAL:
            from cost_models.detect import detect_local

            profile = detect_local(measure=False)
        else:
            profile = load_profile(devices)
        return profile.with_memory(memory) if memory else profile

    def planning(self, training: bool, pins: Mapping[str, str] | None = None) -> PlanOptions:
        """The request of one graph's plan: ``training`` decided, ``pins`` those applied to the
        graph (default: all of them)."""
        pins = self.plan.constraints.pins if pins is None else pins
        return self.plan.replace(training=training, pins=dict(sorted(pins.items())) or None if pins else None)

    def key(self, profile: DeviceSet, training: bool, pins: Mapping[str, str] | None = None) -> str:
        """A hash of everything that changes a plan: the device set (caps applied) and every plan
        option as the plan would record it, ``time_limit`` included (a longer solve may find a
        better plan). The binding (``device_map``) and ``plan_dir`` do not change a plan."""
        request = self.planning(training, pins).replace(devices=profile.name).to_record()
        text = json.dumps({"devices": profile.to_dict(), "planning": request}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


KNOWN = PLAN_FIELDS + OWN


def parse_options(options: Mapping[str, Any] | None = None, **more: Any) -> CompileOptions:
    """Check ``options`` (and keyword arguments) and build :class:`CompileOptions`.

    Every option is checked here, before any graph is captured or solved: the plan options by
    :class:`~partitioner.options.PlanOptions` (type, range, combinations), ``device_map`` and
    ``plan_dir`` here. An option of the record that does not apply to a compiled graph is refused
    with the reason the record gives.

    Raises:
        HetpartError: an unknown option (the message lists the known ones), one that does not apply
            here, or a value of the wrong kind (the message names the option and the expected form).

    Example:
        >>> parse_options({"objective": "throughput"}).objective
        'throughput'
    """
    given = dict(options or {})
    given.update(more)
    unknown = sorted(k for k in given if k not in KNOWN)
    not_here = [k for k in unknown if k in META]
    if not_here:
        name = not_here[0]
        raise HetpartError(f"torch.compile option {name!r} does not apply to backend 'hetpart': "
                           f"{META[name]['compile']}; the options are {', '.join(KNOWN)}")
    if unknown:
        raise HetpartError(
            f"unknown torch.compile option {', '.join(map(repr, unknown))} for backend 'hetpart': "
            f"the options are {', '.join(KNOWN)}"
        )
    device_map = given.pop("device_map", {})
    _device_map(device_map)
    plan_dir = given.pop("plan_dir", None)
    _plan_dir(plan_dir)
    if isinstance(given.get("devices"), os.PathLike):
        given["devices"] = str(given["devices"])
    plan = PlanOptions.build(**{**COMPILE_DEFAULTS, **given})
    return CompileOptions(plan, dict(device_map), str(Path(plan_dir)) if plan_dir is not None else None)


def _refuse(name: str, expected: str, value: Any) -> HetpartError:
    return HetpartError(f"option {name!r} must be {expected}; got {value!r}")


def _device_map(value: Any) -> None:
    example = '{"cuda:0": "cpu"}'
    if not isinstance(value, Mapping):
        raise _refuse("device_map", f"a dict, e.g. {example}", value)
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise HetpartError(f"option 'device_map': key {key!r} must be a non-empty string, e.g. {example}")
        if not isinstance(item, str):
            raise HetpartError(f"option 'device_map': the value for {key!r} must be a device name such as "
                               f"\"cuda:1\"; got {item!r}")


def _plan_dir(value: Any) -> None:
    if value is not None and not (isinstance(value, os.PathLike) or (isinstance(value, str) and value)):
        raise _refuse("plan_dir", "the path of a folder (a str or a pathlib.Path), or None", value)


__all__ = ["COMPILE_DEFAULTS", "KNOWN", "LOCAL", "CompileOptions", "parse_options"]
