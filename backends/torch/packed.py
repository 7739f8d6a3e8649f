"""Packed weights in the emitted module: linears the plan lists in ``precision.weights`` run a
weight-only kernel on their packed weight.

In: a GraphModule that :func:`~backends.torch.module.place_module` has placed (each weight already
in its home) and a plan whose ``precision`` section lists ``weights`` (:mod:`partitioner.plan.precision`).
Out: the same module, in place: each listed ``aten.linear(x, weight, bias)`` becomes
``backends.torch.quantized_ops.linear_<dtype>(x, <packed tensors>, bias)``, the packed tensors
(quantized values and scales, made by :func:`~backends.torch.quantized_ops.pack_weight` with
torchao's quantization primitives and torch's packing op for the device) registered as buffers
beside the weight on its device, and the float weight dropped (no other op reads it: the plan
packs only weights their linear owns alone). A linear that streams its weight (the plan's
``weights``) keeps its packed tensors where the weight lived, in host memory, packed once here for
the device that computes with them, and fetches each of them every call through the module's
:class:`~backends.torch.streaming.WeightStreamer` (pinned host copies, reused device buffers on a
GPU), so the link carries the packed bytes. The kernel reads bfloat16 activations and returns
the dtype it was given, so :mod:`backends.torch.precision` casts around it as around any op.

Packed weights are for inference: a training plan never lists them (refused when planned).

``shared_from``: another emitted module of the same model (a generation plan's prefill module, for
its decode module) whose packed buffers this module reads instead of packing its own: one packed
copy of each weight serves both (the plan stores each weight one way for both phases).

Example:
    >>> emitted = plan.emit(model, strict_devices=True)    # doctest: +SKIP
    >>> print(emitted.code)                                 # doctest: +SKIP
    ... linear = backends_torch_quantized_ops_linear_int8(layer_norm, self.fc_weight_int8_qweight, ...
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.fx

from backends.strict_devices import StrictDevices
from backends.torch.attributes import attribute
from backends.torch.streaming import STREAMER_ATTR
from partitioner.errors import HetpartError, PlanMismatch

__all__ = ["pack_linears", "PACKED_ATTR"]

#: the emitted module's map of packed buffer name -> the parameter name of the weight it stands for
PACKED_ATTR = "hetpart_packed"

_LINEAR = torch.ops.aten.linear.default


def pack_linears(gm: torch.fx.GraphModule, plan: Any, packed: Mapping[str, str], *,
                 shared_from: torch.nn.Module | None = None) -> None:
    """Replace each linear named in ``packed`` (op -> weight dtype) by its weight-only kernel (see
    the module docstring), on ``shared_from``'s packed buffers where given.

    Raises:
        HetpartError: a training plan; a listed op that is not a linear of the graph or whose weight
            another op reads (the plan does not match the graph); a weight that cannot be packed.
        PlanMismatch: ``shared_from`` holds no packed form of a listed weight in its dtype.
    """
    from backends.torch import quantized_ops

    if plan.training:
        raise HetpartError(f"{plan.source} packs weights (precision.weights) but is a training plan: packed "
                           f"weights are for inference; re-plan without weights in --precision")
    nodes = {n.name: n for n in gm.graph.nodes}
    names: dict[str, str] = getattr(gm, PACKED_ATTR, {})
    for op, dtype in packed.items():
        node = nodes.get(op)
        if node is None or node.target is not _LINEAR:
            raise HetpartError(f"{plan.source}: precision.weights lists {op!r}, which is not an aten.linear of "
                               f"the captured graph; re-plan the model with --precision weights=...")
        fetch = _streamed_fetch(node.args[1])
        weight = fetch.args[1] if fetch is not None else node.args[1]
        if fetch is None and (not isinstance(weight, torch.fx.Node) or weight.op != "get_attr"
                              or len(weight.users) != 1):
            raise HetpartError(f"{plan.source}: {op!r} packs its weight, but its weight is not a parameter it "
                               f"reads alone; re-plan the model with --precision weights=...")
        target = str(weight.target) if fetch is None else str(weight)
        value = attribute(gm, target)
        owner, _, attr = target.rpartition(".")
        # a streamed weight is packed for the device computing with it and kept where it lives (the host)
        tensors = _packed(quantized_ops, value, dtype, fetch.args[2] if fetch is not None else None) \
            if shared_from is None else _shared(shared_from, target, f"{attr}_{dtype}_", op, dtype)
        module = gm.get_submodule(owner) if owner else gm
        getters, fulls = [], []
        with gm.graph.inserting_before(node):
            for key, tensor in tensors.items():
                name = f"{attr}_{dtype}_{key}"
                module.register_buffer(name, tensor, persistent=False)
                full = f"{owner}.{name}" if owner else name
                names[full] = target
                fulls.append(full)
                if fetch is not None:  # fetched each call through the streamer, like the weight it replaces
                    getter = gm.graph.call_method("get", (fetch.args[0], full, fetch.args[2]), {})
                else:
                    getter = gm.graph.get_attr(full)
                    if "hetpart_device" in weight.meta:
                        getter.meta["hetpart_device"] = weight.meta["hetpart_device"]
                getters.append(getter)
            x, bias = node.args[0], node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
            kwargs = {"group": quantized_ops.int4_group(value.shape[1])} if dtype == "int4" else {}
        # the node keeps its name (the plan's op name: casts and strict devices find it by it) and meta
        node.target, node.args, node.kwargs = quantized_ops.LINEAR[dtype], (x, *getters, bias), kwargs
        if fetch is not None:
            getattr(gm, STREAMER_ATTR).replace(target, fulls)
            gm.graph.erase_node(fetch)
            for dead in [n for n in gm.graph.nodes if n.op == "get_attr" and str(n.target) == target and not n.users]:
                gm.graph.erase_node(dead)  # the float weight's read, left by the fetch that replaced it
        else:
            gm.graph.erase_node(weight)
        delattr(module, attr)
    setattr(gm, PACKED_ATTR, names)
    gm.graph.lint()
    gm.recompile()


def _shared(source: torch.nn.Module, target: str, prefix: str, op: str, dtype: str) -> dict[str, torch.Tensor]:
    """``source``'s packed buffers of weight ``target`` in ``dtype`` (key -> tensor, in packing order)."""
    owner = target.rpartition(".")[0]
    out = {}
    for full, weight in getattr(source, PACKED_ATTR, {}).items():
        name = full.rpartition(".")[2]
        if weight == target and full.rpartition(".")[0] == owner and name.startswith(prefix):
            out[name.removeprefix(prefix)] = attribute(source, full)
    if not out:
        raise PlanMismatch(f"{op} packs {target} in {dtype}, but the module it shares weights with holds no {dtype} "
                           f"form of it: the phases store it differently; re-plan both phases together "
                           f"(hetpart plan MODEL --generate --precision ...)")
    return out


def _streamed_fetch(arg: Any) -> torch.fx.Node | None:
    """The streamer's fetch ``self._hetpart_streamer.get(target, device)`` that ``arg`` is, or None."""
    if isinstance(arg, torch.fx.Node) and arg.op == "call_method" and arg.target == "get" and len(arg.args) == 3:
        holder = arg.args[0]
        if isinstance(holder, torch.fx.Node) and holder.op == "get_attr" and holder.target == STREAMER_ATTR:
            return arg
    return None


def _packed(quantized_ops: Any, value: torch.Tensor, dtype: str, streamed_to: str | None = None) -> dict[str, torch.Tensor]:
    """``value`` packed where it lives. Packing is part of building, not of the planned step: under
    strict devices (a :class:`~backends.strict_devices.StrictDevices` mode active while the module
    is built) it runs outside the mode and its tensors are placed where the weight was.

    A weight streamed to physical device ``streamed_to`` is packed in that device's layout (int4's
    differs between cpu and cuda), computed there, and its tensors brought back beside the weight
    (host memory, pinned by the streamer where it feeds a GPU): packed once when loaded."""
    from torch.utils._python_dispatch import _disable_current_modes, _get_current_dispatch_mode

    mode = _get_current_dispatch_mode()
    strict = mode if isinstance(mode, StrictDevices) else None
    home = strict.device_of(value) if strict is not None else None
    with _disable_current_modes():
        if streamed_to is None:
            tensors = quantized_ops.pack_weight(value.detach(), dtype, value.device)
        else:
            target = torch.device(streamed_to)
            target = target if target.type == "cuda" else torch.device(target.type)  # a strict cpu:i tag: the cpu
            tensors = {k: t.to(value.device) for k, t in quantized_ops.pack_weight(value.detach(), dtype, target).items()}
    if strict is not None:
        for tensor in tensors.values():
            strict.place(tensor, home)
    return tensors
