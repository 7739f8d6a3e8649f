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
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cost_models.profiles import DeviceSet, load_profile
from cost_models.training import Optimizer
from partitioner.errors import HetpartError
from partitioner.planner import MAX_TIME_LIMIT
from partitioner.solvers.problem import Objective

LOCAL = "local"  # ``devices="local"``: this machine, profiled without measuring (cpu + each CUDA GPU)


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    """What the backend plans for and how (every field is an ``options`` key)."""

    devices: str | DeviceSet = LOCAL          # a built-in profile name, a TOML path, a DeviceSet, or "local"
    memory: Mapping[str, int | str] = dataclasses.field(default_factory=dict)  # caps: {"cuda:0": "8GB"}
    objective: str = "latency"                # "latency" | "throughput" | "makespan"
    pins: Mapping[str, str] = dataclasses.field(default_factory=dict)  # module-path glob or op -> device
    device_map: Mapping[str, str] = dataclasses.field(default_factory=dict)  # logical -> physical binding
    training: bool | None = None              # None: plan for training when the graph is compiled with
    #                                           grad mode on and a parameter that requires grad
    optimizer: str = "adam"                   # optimizer whose state and step a training plan costs
    solver: str = "auto"                      # "auto" | "highs" | "cbc" | a baseline ("greedy", "single:cpu")
    time_limit: float = 10.0                  # seconds the ILP may take per graph
    gap: float = 0.01                         # relative optimality gap at which the ILP stops
    streaming: bool = True                    # may weights stay in host memory and stream in (inference)
    coarsen: bool | str = "auto"              # "auto" (above a size threshold), True or False
    plan_dir: str | None = None               # folder where plans are saved and reused across processes

    def profile(self) -> DeviceSet:
        """The device set the plans are made for: the profile with the memory caps applied."""
        if isinstance(self.devices, DeviceSet):
            profile = self.devices
        elif self.devices == LOCAL:
            from cost_models.detect import detect_local

            profile = detect_local(measure=False)
        else:
            profile = load_profile(self.devices)
        return profile.with_memory(self.memory) if self.memory else profile

    def planning(self, training: bool) -> dict[str, Any]:
        """Keyword arguments of :func:`partitioner.partition_outcome` (devices and graph aside)."""
        return {"objective": self.objective, "training": training, "optimizer": self.optimizer,
                "pins": dict(self.pins) or None, "solver": self.solver, "time_limit": self.time_limit,
                "gap": self.gap, "streaming": self.streaming, "coarsen": self.coarsen}

    def key(self, profile: DeviceSet, training: bool, pins: Mapping[str, str] | None = None) -> str:
        """A hash of everything that changes a plan: the device set (caps applied) and every planning
        option, ``time_limit`` included (a longer solve may find a better plan). ``pins`` are the
        pins applied to the graph (default: all of them). The binding (``device_map``) and
        ``plan_dir`` do not change a plan and are left out."""
        planning = self.planning(training)
        planning["pins"] = dict(sorted((self.pins if pins is None else pins).items())) or None
        text = json.dumps({"devices": profile.to_dict(), "planning": planning}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


KNOWN = tuple(f.name for f in dataclasses.fields(CompileOptions))


def parse_options(options: Mapping[str, Any] | None = None, **more: Any) -> CompileOptions:
    """Check ``options`` (and keyword arguments) and build :class:`CompileOptions`.

    Every option is checked here, before any graph is captured or solved: its type, and its value
    where that needs no profile (an objective, an optimizer, a limit).

    Raises:
        HetpartError: an unknown option (the message lists the known ones) or a value of the wrong
            kind (the message names the option and the expected form).

    Example:
        >>> parse_options({"objective": "throughput"}).objective
        'throughput'
    """
    given = dict(options or {})
    given.update(more)
    unknown = sorted(k for k in given if k not in KNOWN)
    if unknown:
        raise HetpartError(
            f"unknown torch.compile option {', '.join(map(repr, unknown))} for backend 'hetpart': "
            f"the options are {', '.join(KNOWN)}"
        )
    for name, value in given.items():
        _CHECKS[name](value)
    if "plan_dir" in given and given["plan_dir"] is not None:
        given["plan_dir"] = str(Path(given["plan_dir"]))
    if isinstance(given.get("devices"), os.PathLike):
        given["devices"] = str(given["devices"])
    for name in ("memory", "pins", "device_map"):
        if name in given:
            given[name] = dict(given[name])
    return CompileOptions(**given)


def _refuse(name: str, expected: str, value: Any) -> HetpartError:
    return HetpartError(f"option {name!r} must be {expected}; got {value!r}")


def _one_of(name: str, choices: tuple[Any, ...], expected: str) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if not any(_same(value, c) for c in choices):
            raise _refuse(name, expected, value)
    return check


def _same(value: Any, choice: Any) -> bool:
    """``value`` is ``choice``: True is not 1, "1" is not 1 (a str enum such as ``Objective`` is its value)."""
    if choice is None or isinstance(choice, bool):
        return value is choice
    return isinstance(value, type(choice)) and value == choice


def _mapping(name: str, values: tuple[type, ...], expected: str) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if not isinstance(value, Mapping):
            raise _refuse(name, f"a dict, e.g. {_EXAMPLES[name]}", value)
        for key, item in value.items():
            if not isinstance(key, str) or not key:
                raise HetpartError(f"option {name!r}: key {key!r} must be a non-empty string, "
                                   f"e.g. {_EXAMPLES[name]}")
            if isinstance(item, bool) or not isinstance(item, values):
                raise HetpartError(f"option {name!r}: the value for {key!r} must be {expected}; got {item!r}")
    return check


def _devices(value: Any) -> None:
    if not (isinstance(value, DeviceSet) or isinstance(value, os.PathLike) or (isinstance(value, str) and value)):
        raise _refuse("devices", "a built-in profile name (e.g. 'h200-host'), the path of a TOML profile, "
                      "a DeviceSet or 'local'", value)


def _text(name: str, example: str) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if not isinstance(value, str) or not value:
            raise _refuse(name, f"a name, e.g. {example!r}", value)
    return check


def _plan_dir(value: Any) -> None:
    if value is not None and not (isinstance(value, os.PathLike) or (isinstance(value, str) and value)):
        raise _refuse("plan_dir", "the path of a folder (a str or a pathlib.Path), or None", value)


def _time_limit(value: Any) -> None:
    if not _finite(value) or not 0 < value <= MAX_TIME_LIMIT:
        raise _refuse("time_limit", f"a positive number of seconds, at most {MAX_TIME_LIMIT:g} (a week), e.g. 10",
                      value)


def _gap(value: Any) -> None:
    if not _finite(value) or not 0 <= value < 1:
        raise _refuse("gap", "a relative optimality gap from 0 (prove optimal) up to but not including 1, e.g. 0.01",
                      value)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


_CHECKS: dict[str, Callable[[Any], None]] = {
    "devices": _devices,
    "memory": _mapping("memory", (int, str), 'a byte count: an integer or a string such as "8GB"'),
    "objective": _one_of("objective", tuple(o.value for o in Objective),
                         "one of " + ", ".join(o.value for o in Objective)),
    "pins": _mapping("pins", (str,), 'a device name such as "cpu"'),
    "device_map": _mapping("device_map", (str,), 'a device name such as "cuda:1"'),
    "training": _one_of("training", (None, True, False), "True, False or None (decide per graph)"),
    "optimizer": _one_of("optimizer", tuple(o.value for o in Optimizer),
                         "one of " + ", ".join(o.value for o in Optimizer)),
    "solver": _text("solver", "auto"),
    "time_limit": _time_limit,
    "gap": _gap,
    "streaming": _one_of("streaming", (True, False), "True or False"),
    "coarsen": _one_of("coarsen", ("auto", True, False), "'auto', True or False"),
    "plan_dir": _plan_dir,
}

_EXAMPLES = {"memory": '{"cuda:0": "8GB"}', "pins": '{"emb*": "cpu"}', "device_map": '{"cuda:0": "cpu"}'}

__all__ = ["KNOWN", "LOCAL", "CompileOptions", "parse_options"]
