"""Binding a plan's logical devices (``cuda:0``, ``npu:0``) to the devices present here.

In: a plan and an optional ``device_map`` (logical → physical, e.g. ``{"cuda:0": "cpu"}``). Out: a
complete logical → physical mapping, or an error naming the missing device and a binding that
works, so any plan can be checked on a CPU-only machine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from partitioner.errors import HetpartError


def present(device: str) -> bool:
    """Whether ``device`` (``"cpu"``, ``"cuda:1"``) exists on this machine."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        return False
    if dev.type == "cpu":
        return True
    if dev.type == "cuda":
        return torch.cuda.is_available() and (dev.index or 0) < torch.cuda.device_count()
    return False


def bind_devices(plan: Any, device_map: Mapping[str, str] | None = None) -> dict[str, str]:
    """Logical device → physical device for every device the plan uses.

    Example:
        >>> bind_devices(plan, {"cuda:0": "cpu"})   # doctest: +SKIP
        {'cpu': 'cpu', 'cuda:0': 'cpu'}
    """
    device_map = dict(device_map or {})
    used = sorted(set(plan.placement.values()) | set(plan.weights.values())
                  | {d for entry in getattr(plan, "splits", {}).values() for d in entry["devices"]})
    unknown = [d for d in device_map if d not in plan.devices.names()]
    if unknown:
        raise HetpartError(
            f"device_map names {', '.join(unknown)}, which the plan's profile does not have "
            f"({', '.join(plan.devices.names())})"
        )
    binding = {d: str(device_map.get(d, d)) for d in used}
    missing = [f"{logical} (bound to {physical})" if logical != physical else logical
               for logical, physical in binding.items() if not present(physical)]
    if missing:
        fix = ", ".join(f"'{d}': 'cpu'" for d in used if not present(binding[d]))
        flags = " ".join(f"--bind {d}=cpu" for d in used if not present(binding[d]))
        raise HetpartError(
            f"the plan uses {', '.join(missing)}, not present on this machine "
            f"(CUDA available: {torch.cuda.is_available()}); bind it to a present device: "
            f"device_map={{{fix}}} (CLI: {flags})"
        )
    return binding
