"""A hand-made accelerate ``device_map`` as pins: hetpart places the rest, and may improve on it.

In: a ``device_map`` in accelerate's form (``{"model.embed_tokens": 0, "model.layers.0": "cpu",
"lm_head": "cuda:1", "": "cpu"}``: module path -> GPU index, device name, or ``"disk"``), the
captured graph, the profile's device names, and the user's own pins. Out: pins
(:class:`~partitioner.options.Constraints.pins`) that fix every op of a mapped module on its
device, the modules the map leaves out for the solver to place.

A key covers its module and everything under it, as in accelerate; where keys nest, the longest
one wins (``{"model": 0, "model.layers.3": "cpu"}`` puts layer 3 on the host). An integer ``i``
is ``cuda:i``; ``"disk"`` is refused (hetpart keeps weights on the host and streams them
instead). The user's own pins win over the map where both cover an op. Refused, each naming the
key: a module the model does not have (with the modules it does), a device the profile lacks.

Example:
    >>> pins_from_device_map({"layers.0": 0, "head": "cpu"}, graph, ["cpu", "cuda:0"])   # doctest: +SKIP
    {'layers.0': 'cuda:0', 'layers.0.linear': 'cuda:0', 'head': 'cpu'}
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from typing import Any

from partitioner.errors import HetpartError
from partitioner.ir import OpGraph

__all__ = ["device_of", "pins_from_device_map"]

SHOWN = 6


def device_of(key: str, value: Any, devices: Sequence[str]) -> str:
    """The profile device a ``device_map`` value names: ``0`` -> ``cuda:0``, ``"cpu"``, ``"cuda:1"``.

    Example:
        >>> device_of("lm_head", 0, ["cpu", "cuda:0"])
        'cuda:0'
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise HetpartError(f"device_map {key!r}: {value!r} is no device: give a GPU index (0) or a device name "
                           f"({', '.join(devices)})")
    device = f"cuda:{value}" if isinstance(value, int) else value
    if device == "disk":
        raise HetpartError(f"device_map {key!r} -> 'disk': hetpart does not offload to disk; map it to 'cpu' "
                           f"(the plan may stream its weights from host memory)")
    if device == "cuda":
        device = "cuda:0"
    if device not in devices:
        raise HetpartError(f"device_map {key!r} -> {value!r}: the profile has no device {device!r}; its devices "
                           f"are {', '.join(devices)} (choose the profile with --devices)")
    return device


def pins_from_device_map(device_map: Mapping[str, Any], graph: OpGraph, devices: Sequence[str],
                         pins: Mapping[str, str] | None = None) -> dict[str, str]:
    """The user's ``pins`` plus one exact pin per module path the map covers (see the module docstring).

    Raises:
        HetpartError: a key names a module the model lacks, or a device the profile lacks.
    """
    mapped = {str(key): device_of(str(key), value, devices) for key, value in device_map.items()}
    modules = set(graph.module_types) | {op.module_path for op in graph.ops.values()}
    lacking = [k for k in mapped if k and k not in modules]
    if lacking:
        shown = sorted(m for m in modules if m and "." not in m) or sorted(m for m in modules if m)
        raise HetpartError(
            f"device_map names {len(lacking)} module(s) {graph.name!r} does not have: "
            f"{', '.join(map(repr, lacking[:SHOWN]))}{', ...' if len(lacking) > SHOWN else ''}; its top-level "
            f"modules are {', '.join(shown[:SHOWN]) or 'none'} (hetpart plan MODEL --format device-map writes a map "
            f"of this model)")
    own = dict(pins or {})
    out = dict(own)
    for path in sorted({op.module_path or "" for op in graph.ops.values()}):
        key = _longest(path, mapped)
        if key is None or _pinned_by(path, own):
            continue
        if path:
            out.setdefault(path, mapped[key])
    if "" in mapped:  # ops of the root module itself (no module path): pinned by name
        for op in graph.ops.values():
            if not op.module_path and not _pinned_by(op.name, own):
                out.setdefault(op.name, mapped[""])
    return out


def _longest(path: str, mapped: Mapping[str, str]) -> str | None:
    """The longest key covering ``path`` (itself, or a module above it; ``""`` covers all)."""
    best = None
    for key in mapped:
        if key == "" or path == key or path.startswith(key + "."):
            if best is None or len(key) > len(best):
                best = key
    return best


def _pinned_by(name: str, pins: Mapping[str, str]) -> bool:
    return any(name == p or fnmatch.fnmatchcase(name, p) for p in pins)
