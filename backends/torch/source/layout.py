"""Where everything of a generated file lives: devices, the tensor tree, homes and streamed weights.

In: the plan, the model, the exported program and the binding of logical to physical devices.
Out: a :class:`Layout`: one ``DEVICE_*`` identifier per logical device, every parameter, buffer and
lifted constant with its logical home (tied tensors registered once and aliased), and the
streamed weights in issue order. Homes follow :func:`backends.torch.module.emit_module`: a
tensor lives with its first reader, a streamed weight where its weights are kept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
import torch.fx
from torch.export.graph_signature import InputKind

from backends.torch.module import STREAMER_ATTR
from backends.torch.source.template import Names, device_tag
from partitioner.errors import HetpartError, UnsupportedOp


@dataclasses.dataclass(frozen=True)
class TensorEntry:
    """One line of ``__init__``: a parameter or buffer (or an alias of one) at a qualified name."""

    qualified: str
    value: torch.Tensor
    kind: str                 # "parameter" | "buffer"
    persistent: bool          # buffers: saved in the state_dict
    device: str | None        # logical home; None: the tensor's own device (no op reads it)
    alias_of: str | None      # the first name of a tied tensor


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where everything lives, in the plan's logical devices."""

    binding: Mapping[str, str]           # logical device -> physical device
    device_var: Mapping[str, str]        # logical device -> DEVICE_* identifier
    tensors: tuple[TensorEntry, ...]         # __init__'s registrations, in state_dict order
    target_device: Mapping[str, str]     # placeholder target -> logical device of its tensor
    streamed: tuple[tuple[str, str], ...]  # (target, logical device computing with it), issue order


def plan_layout(plan: Any, model: torch.nn.Module, program: Any, binding: Mapping[str, str], names: Names) -> Layout:
    device_var = {d: names.make(f"DEVICE_{device_tag(d).upper()}" if device_tag(d) else "", "DEVICE_")
                  for d in binding}
    targets = tensor_placeholders(program)
    by_name = _named_tensors(model)
    home_of_target = _homes(plan, targets)
    home_by_id: dict[int, str] = {}
    for target, device in home_of_target.items():  # first reader wins, as emit_module moves them
        tensor = by_name.get(target)
        if tensor is not None:
            home_by_id.setdefault(id(tensor), device)
    tensors = _tensor_tree(model, home_by_id)
    constants = _constants(program, by_name, home_of_target)
    target_device = {t: home_by_id.get(id(by_name[t]), d) if t in by_name else d
                     for t, d in home_of_target.items()}
    return Layout(binding, device_var, tensors + constants, target_device, _streamed(plan, targets, home_of_target))


def tensor_placeholders(program: Any) -> dict[str, torch.fx.Node]:
    """Target (qualified name) → placeholder, for lifted parameters, buffers and constants."""
    nodes = {n.name: n for n in program.graph_module.graph.nodes if n.op == "placeholder"}
    out: dict[str, torch.fx.Node] = {}
    for spec in program.graph_signature.input_specs:
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            out[spec.target] = nodes[spec.arg.name]
        elif spec.kind is not InputKind.USER_INPUT:
            raise UnsupportedOp(f"the captured graph takes a {spec.kind.name.lower()} input "
                                f"({ascii(spec.arg.name)}): emit_source cannot write it; use plan.emit")
    return out


def _named_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    named = dict(model.named_parameters(remove_duplicate=False))
    named.update(model.named_buffers(remove_duplicate=False))
    return named


def _homes(plan: Any, targets: Mapping[str, torch.fx.Node]) -> dict[str, str]:
    """Each read tensor's logical home, as :func:`backends.torch.module.emit_module` puts it: with the
    op owning it in the plan (its first reader for plans that do not record owners), on the host
    when that op streams its weights; a tensor the capture lifted as a constant is an input of the
    plan, on the host."""
    owner_of = {name: op for op, names in plan.param_names.items() for name in names}
    host = plan.devices.host_device().name
    homes: dict[str, str] = {}
    for target, node in targets.items():
        readers = [u.name for u in node.users if u.op != "output" and u.name in plan.placement]
        if not readers:
            continue
        owner = owner_of.get(target)
        if owner not in plan.placement:
            if plan.param_names:
                homes[target] = host
                continue
            owner = readers[0]
        homes[target] = plan.weights.get(owner, plan.placement[owner])
    return homes


def _streamed(plan: Any, targets: Mapping[str, torch.fx.Node], homes: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    position = {op: i for i, op in enumerate(plan.schedule)}
    out: list[tuple[int, str, str]] = []
    for target, node in targets.items():
        for user in node.users:
            if user.name in plan.weights and homes.get(target) == plan.weights[user.name]:
                out.append((position.get(user.name, 0), target, plan.placement[user.name]))
                break
    return tuple((t, d) for _, t, d in sorted(out))


def _tensor_tree(model: torch.nn.Module, home_by_id: Mapping[int, str]) -> tuple[TensorEntry, ...]:
    """Every parameter and buffer in state_dict order; a tensor seen before becomes an alias."""
    first_name: dict[int, str] = {}
    out: list[TensorEntry] = []
    for prefix, module in model.named_modules(remove_duplicate=False):
        if STREAMER_ATTR in module._parameters or STREAMER_ATTR in module._buffers:
            raise HetpartError(f"the model holds a tensor named {STREAMER_ATTR!r}, which the generated "
                               f"module uses for its weight streamer; rename it")
        entries = [(n, t, "parameter", True) for n, t in module._parameters.items()]
        saved = [n not in module._non_persistent_buffers_set for n in module._buffers]
        entries += [(n, t, "buffer", keep) for (n, t), keep in zip(module._buffers.items(), saved)]
        for name, tensor, kind, persistent in entries:
            if tensor is None:
                continue
            if "." in name or not name:
                raise HetpartError(f"module {ascii(prefix)} holds a tensor named {ascii(name)}: torch "
                                   f"forbids '.' and empty names, and a qualified name would be ambiguous")
            qualified = f"{prefix}.{name}" if prefix else name
            alias = first_name.setdefault(id(tensor), qualified)
            out.append(TensorEntry(qualified, tensor, kind, persistent, home_by_id.get(id(tensor)),
                               alias if alias != qualified else None))
    return tuple(out)


def _constants(program: Any, by_name: Mapping[str, torch.Tensor], homes: Mapping[str, str]) -> tuple[TensorEntry, ...]:
    """Tensors the capture lifted that the model does not list: registered as non-persistent buffers."""
    out = []
    for spec in program.graph_signature.input_specs:
        if spec.kind is InputKind.CONSTANT_TENSOR and spec.target not in by_name:
            value = program.constants[spec.target]
            out.append(TensorEntry(spec.target, value, "buffer", False, homes.get(spec.target), None))
    return tuple(out)
