"""Saved activations held on the host: the ops a training plan lists run under saved-tensor hooks.

In: a placed graph module (:func:`backends.torch.module.place_module`) of a training plan whose
``training_state["saved_on_host"]`` lists ops (:mod:`partitioner.plan.training_state`), and the
binding of its logical devices. Out: the module with each listed op's call made through
:func:`run_holding`, which runs the op under ``torch.autograd.graph.saved_tensors_hooks``: every
tensor autograd saves for that op's backward (but a parameter, which lives where the plan keeps
it) is copied to the host device when forward saves it, and back to the op's device when
backward needs it. It is ``torch.autograd.graph.save_on_cpu`` for one op at a time, with the
devices the plan names:

* on CUDA the host copy is pinned and both copies are ``non_blocking`` on the current stream (the
  device tensor may be freed as soon as forward is done with it: the stream orders the copy before
  any kernel that reuses its memory; backward's copy back is ordered before the op's backward);
* on a CPU binding (logical devices bound to CPUs, as strict devices bind them:
  :mod:`backends.strict_devices`) the copy is ``tensor.to(host)`` to the logical host's tag, so a
  strict run records each copy out (kind ``saved``); backward runs outside the strict mode, so its
  copies back are not recorded there.

The plan counts an op's outputs as its saved activations (``cost_models.training.saved_activation_bytes``);
autograd saves what the op's backward reads (its inputs, its outputs or neither), so the bytes a
run copies are what torch saves, which may differ from the plan's count.

Refused: an op not in the captured graph (the plan is not this model's), a module called whole
(a symbolic trace's ``call_module``). Under ``torch.no_grad`` nothing is saved and nothing is
copied.

Example:
    >>> hold_saved_on_host(gm, plan, {"cpu": "cpu", "cuda:0": "cuda:0"})   # doctest: +SKIP
    ['linear', 'gelu']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
import torch.fx

from partitioner.errors import HetpartError

__all__ = ["HoldOnHost", "held_ops", "hold_saved_on_host", "run_holding"]

#: node.meta key keeping the op's own target (strict devices read its schema)
TARGET_META = "hetpart_target"


def held_ops(plan: Any) -> dict[str, int]:
    """The ops whose saved activations the host holds, with the plan's bytes (empty without them)."""
    section = plan.training_state
    return dict(section.get("saved_on_host", {})) if section else {}


class _Held(NamedTuple):
    """A saved tensor's host copy and the device it was saved on (where backward wants it)."""

    tensor: torch.Tensor
    device: torch.device


class HoldOnHost:
    """The pack and unpack hooks of one op: saved tensors to ``host`` in forward, back to
    ``device`` in backward (pinned and non-blocking where ``device`` is CUDA and ``host`` a CPU)."""

    def __init__(self, host: torch.device, device: torch.device) -> None:
        self.host = host
        self.device = device
        self.pinned = device.type == "cuda" and host.type == "cpu"

    def pack(self, tensor: torch.Tensor) -> Any:
        if isinstance(tensor, torch.nn.Parameter) or tensor.layout is not torch.strided:
            return tensor  # weights stay where the plan keeps them; sparse tensors as they are
        if self.device.type != "cpu" and tensor.device != self.device:
            return tensor  # not on the op's accelerator (a host scalar): nothing to move
        if self.pinned:
            packed = torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype, pin_memory=True)
            packed.copy_(tensor, non_blocking=True)
        else:
            packed = tensor.to(self.host)
        return _Held(packed, tensor.device)

    def unpack(self, held: Any) -> torch.Tensor:
        if not isinstance(held, _Held):
            return held
        return held.tensor.to(held.device, non_blocking=self.pinned)


def run_holding(host: str, device: str, target: Any, *args: Any, **kwargs: Any) -> Any:
    """``target(*args, **kwargs)`` with the tensors autograd saves for it held on ``host`` (physical
    devices), brought back to ``device`` for its backward."""
    hooks = HoldOnHost(torch.device(host), torch.device(device))
    with torch.autograd.graph.saved_tensors_hooks(hooks.pack, hooks.unpack):
        return target(*args, **kwargs)


def hold_saved_on_host(gm: torch.fx.GraphModule, plan: Any, binding: Mapping[str, str]) -> list[str]:
    """Make each op of ``plan``'s ``saved_on_host`` call through :func:`run_holding`, in place;
    returns those ops in graph order.

    Raises:
        HetpartError: a listed op that is not in the graph, or is a module called whole.
    """
    held = held_ops(plan)
    if not held:
        return []
    nodes = {n.name: n for n in gm.graph.nodes}
    missing = sorted(set(held) - set(nodes))
    if missing:
        raise HetpartError(f"training_state.saved_on_host names {', '.join(missing[:5])}, not ops of the captured "
                           f"graph: the plan is not this model's")
    host = binding[plan.devices.host_device().name]
    done = []
    for node in gm.graph.nodes:
        if node.name not in held:
            continue
        if node.op != "call_function":
            raise HetpartError(f"cannot hold {node.name}'s saved activations on the host: it calls module "
                               f"{node.target} whole (symbolic_trace capture); re-plan with capture 'export' or "
                               f"save_on_host=False")
        device = binding[plan.placement[node.name]]
        node.meta[TARGET_META] = node.target
        node.args = (host, device, node.target, *node.args)
        node.target = run_holding
        done.append(node.name)
    gm.graph.lint()
    gm.recompile()
    return done
