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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cost_models.profiles import DeviceSet, load_profile
from partitioner.errors import HetpartError

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

    def key(self, profile: DeviceSet, training: bool) -> str:
        """A hash of everything that changes a plan: the device set (caps applied) and the planning
        options. The binding (``device_map``), ``time_limit`` and ``plan_dir`` do not: a plan found
        under one time limit is as valid under another."""
        planning = self.planning(training)
        planning.pop("time_limit")
        text = json.dumps({"devices": profile.to_dict(), "planning": planning}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


KNOWN = tuple(f.name for f in dataclasses.fields(CompileOptions))


def parse_options(options: Mapping[str, Any] | None = None, **more: Any) -> CompileOptions:
    """Check ``options`` (and keyword arguments) and build :class:`CompileOptions`.

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
    for name in ("memory", "pins", "device_map"):
        if name in given and not isinstance(given[name], Mapping):
            raise HetpartError(f"option {name!r} must be a dict, e.g. {_EXAMPLES[name]}; got {given[name]!r}")
    for name in ("time_limit", "gap"):
        if name in given and (isinstance(given[name], bool) or not isinstance(given[name], (int, float))
                              or given[name] <= 0):
            raise HetpartError(f"option {name!r} must be a positive number; got {given[name]!r}")
    if "training" in given and given["training"] not in (None, True, False):
        raise HetpartError(f"option 'training' must be True, False or None (decide per graph); "
                           f"got {given['training']!r}")
    if "plan_dir" in given and given["plan_dir"] is not None:
        given["plan_dir"] = str(Path(given["plan_dir"]))
    for name in ("memory", "pins", "device_map"):
        if name in given:
            given[name] = {str(k): v for k, v in given[name].items()}
    return CompileOptions(**given)


_EXAMPLES = {"memory": '{"cuda:0": "8GB"}', "pins": '{"emb*": "cpu"}', "device_map": '{"cuda:0": "cpu"}'}

__all__ = ["KNOWN", "LOCAL", "CompileOptions", "parse_options"]
