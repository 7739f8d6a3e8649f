"""The module-level view of a plan: an accelerate-style ``{"module.path": device}`` map.

In: a plan (its parameter-owning ops, their module paths, placement and streamed-weight homes).
Out: the minimal device map accelerate's ``dispatch_model`` takes, or a PlanMismatch naming the
module that is split across devices (re-plan with ``--align-modules``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from partitioner.errors import PlanMismatch


def module_device_map(plan: Any) -> dict[str, str]:
    """An accelerate-style ``{"module.path": device}`` of where each module's weights live.

    Only ops owning parameters count; a streamed op's weights live on its ``weights``
    device. The map is minimal: a module whose parameter-owning ops share a device is
    mapped whole, otherwise its children are visited. One device gives ``{"": device}``.

    Raises:
        PlanMismatch: a module's own ops disagree (the plan is not module-aligned).

    Example:
        >>> plan.to_device_map()                          # doctest: +SKIP
        {'emb': 'cpu', 'layers.0': 'cuda:0', 'layers.1': 'cpu', 'head': 'cuda:0'}
    """
    homes: dict[str, dict[str, list[str]]] = {}   # module path -> device -> its ops
    for op in plan.param_ops:
        device = plan.weights.get(op, plan.placement[op])
        homes.setdefault(plan.modules[op], {}).setdefault(device, []).append(op)
    if not homes:
        return {"": _busiest_device(plan)}
    out: dict[str, str] = {}
    _map_module("", homes, plan.devices.names(), out, plan.param_names)
    # tied names (lm_head.weight sharing tok_emb.weight) go where their storage lives
    for op in plan.param_ops:
        device = plan.weights.get(op, plan.placement[op])
        for tensor in plan.param_names.get(op, ()):
            if not any(k == "" or tensor == k or tensor.startswith(k + ".") for k in out):
                out[tensor] = device
    return out


def _within(path: str, module: str) -> bool:
    """Whether module ``path`` is ``module`` or inside it (every path is inside the root "")."""
    return not module or path == module or path.startswith(module + ".")


def _child(module: str, path: str) -> str:
    """The child of ``module`` on the way to ``path``: ``_child("layers", "layers.3.mlp") == "layers.3"``."""
    rest = path[len(module) + 1:] if module else path
    return _field(module, rest.split(".", 1)[0])


def _map_module(module: str, homes: Mapping[str, Mapping[str, list[str]]],
                device_order: Sequence[str], out: dict[str, str],
                param_names: Mapping[str, tuple[str, ...]] = MappingProxyType({})) -> None:
    """Map ``module`` whole when its parameter-owning ops share a device, else visit its children."""
    paths = [p for p in homes if _within(p, module)]
    devices = [d for d in device_order if any(d in homes[p] for p in paths)]
    if len(devices) == 1:
        out[module] = devices[0]
        return
    name = module or "(the root module)"
    own = homes.get(module, {})
    if len(own) > 1:
        split = _and([d for d in device_order if d in own])
        ops = ", ".join(f"{op} ({d})" for d in device_order for op in own.get(d, ()))
        raise PlanMismatch(f"module {name} is split across {split}: the plan is not module-aligned "
                           f"(its ops: {ops}); re-plan with --align-modules")
    if own and all(op in param_names for ops in own.values() for op in ops):
        # accelerate maps single tensors too: the module's own parameters by name, children below
        device, ops = next(iter(own.items()))
        for op in ops:
            for tensor in param_names[op]:
                out[tensor] = device
    elif own:
        device, ops = next(iter(own.items()))
        raise PlanMismatch(f"module {name} holds parameters of its own ({', '.join(ops)} on {device}) "
                           f"while its submodules are split across {_and(devices)}: a device map "
                           f"cannot express that; re-plan with --align-modules")
    for child in dict.fromkeys(_child(module, p) for p in paths if p != module):
        _map_module(child, homes, device_order, out, param_names)


def _and(names: Sequence[str]) -> str:
    """``cpu and cuda:0``; ``cpu, cuda:0 and cuda:1``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _busiest_device(plan: Any) -> str:
    """The device computing the most ops (profile order breaks ties)."""
    counts = {name: len(ops) for name, ops in plan.per_device_ops().items()}
    return max(counts, key=counts.__getitem__)


def _field(path: str, name: str) -> str:
    """``layers.3`` from ``layers`` and ``3`` (``3`` at the root)."""
    return f"{path}.{name}" if path else name
