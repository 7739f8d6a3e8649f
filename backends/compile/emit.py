"""The graph dynamo hands the backend, rewritten to run a plan: the compiled callable.

In: dynamo's ``GraphModule`` (parameters and buffers lifted to placeholders), the example inputs
it came with, the :class:`~partitioner.plan.Plan` made for it and the binding of the plan's logical
devices to physical ones. Out: a new ``GraphModule`` (dynamo's is never modified) that
:func:`backends.torch.module.place_module` has placed, plus three things only a compiled graph
needs:

* inputs arrive on known devices (dynamo guards on them), so a copy goes only before an op on
  another physical device;
* model state read on another device is copied once and kept (:class:`StateCopies`) where no
  gradient can flow to it, streamed through :class:`ArgumentStreamer` where the plan streams it,
  and copied with a differentiable ``.to`` on each call otherwise (so ``backward`` reaches the
  caller's parameter, on the parameter's own device);
* an input the graph updates in place (BatchNorm's running statistics in training,
  :mod:`backends.compile.mutation`) and copies to another device is copied back at the end of
  the graph, so the caller's buffer gets the update (with copies on several devices, the last
  one's);
* the model's own moves (``x.to(device)``, ``x.to(device=..., dtype=...)``, ``x.cuda()``,
  ``x.cpu()``, ``x.to(other)``) land on the device the plan places their op on, as a factory's
  ``device=`` does; only the copies ``place_module`` inserted are kept or streamed as model state;
* every output is returned on the device eager execution returns it on (a real copy, even
  between two logical devices bound to one physical device).

Under autograd each op's backward runs where its forward ran (autograd's rule), so a training
plan's placement holds for both passes.

Example:
    >>> compiled = emit_graph(gm, example_inputs, plan, {"cpu": "cpu", "cuda:0": "cpu"})  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx

from backends.compile.mutation import mutated_inputs
from backends.compile.state import ArgumentStreamer, StateCopies
from backends.torch.module import place_module

STATE_ATTR = "_hetpart_state"        # the StateCopies of one compiled graph
STREAM_ATTR = "_hetpart_arg_streamer"  # its ArgumentStreamer


def emit_graph(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], plan: Any, binding: Mapping[str, str]
) -> torch.fx.GraphModule:
    """A private copy of ``gm`` that runs ``plan`` on the bound devices (see the module docstring)."""
    from partitioner.plan.precision import refuse_precision

    refuse_precision(plan, "the torch.compile backend")
    private = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    placeholders = [n for n in private.graph.nodes if n.op == "placeholder"]
    for node in private.graph.nodes:
        if "val" not in node.meta and "example_value" in node.meta:
            node.meta["val"] = node.meta["example_value"]   # what place_module reads
    values = dict(zip((n.name for n in placeholders), example_inputs))
    arrivals = {name: v.device for name, v in values.items() if isinstance(v, torch.Tensor)}
    original = _output_devices(private, arrivals)
    own = set(private.graph.nodes)
    place_module(private, plan, binding, arrivals)
    node_device = {op: torch.device(binding[d]) for op, d in plan.placement.items()}
    _rebind_moves(private, node_device)
    # the copies place_module inserted (the model's own .to ops are ops of the plan, not copies)
    copied = [n for n in private.graph.nodes if n not in own and _is_copy_of_input(n)]
    mutated = mutated_inputs(gm, example_inputs) if copied else set()
    _write_back(private, [n for n in copied if n.args[0].name in mutated])
    _specialise_state_copies(private, plan, values, [n for n in copied if n.args[0].name not in mutated])
    _return_where_eager_does(private, node_device, arrivals, original)
    private.graph.lint()
    private.recompile()
    return private


def is_state(node: torch.fx.Node, value: Any) -> bool:
    """Whether a placeholder is a module's parameter or buffer (dynamo names its source)."""
    if isinstance(value, torch.nn.Parameter):
        return True
    source = getattr(node.meta.get("grapharg"), "source", None)
    name = getattr(source, "name", "")
    name = name() if callable(name) else str(name)
    return "._parameters[" in name or "._buffers[" in name


# --------------------------------------------------------------------------------------------


def _output_devices(gm: torch.fx.GraphModule, arrivals: Mapping[str, torch.device]) -> dict[str, torch.device]:
    """Output node name -> the device eager execution returns it on (from dynamo's fake values)."""
    out: dict[str, torch.device] = {}
    for node in _output_nodes(gm):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            out[node.name] = val.device
        elif node.name in arrivals:
            out[node.name] = arrivals[node.name]
    return out


def _output_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    output = next(n for n in gm.graph.nodes if n.op == "output")
    return list(dict.fromkeys(output.all_input_nodes))


def _is_copy_of_input(node: torch.fx.Node) -> bool:
    """``placeholder.to(device)``: the form of every copy ``place_module`` inserts for an input."""
    return (node.op == "call_method" and node.target == "to" and len(node.args) == 2 and not node.kwargs
            and isinstance(node.args[0], torch.fx.Node) and node.args[0].op == "placeholder"
            and isinstance(node.args[1], torch.device))


#: Tensor methods of the model's own that move their tensor to a device (dynamo records them as ``call_method``)
MOVES = ("to", "cpu", "cuda")


def _rebind_moves(gm: torch.fx.GraphModule, node_device: Mapping[str, torch.device]) -> None:
    """A model's own move (``x.to(d)``, ``x.to(d, dtype)``, ``x.to(device=d, dtype=t)``, ``x.cuda()``,
    ``x.cpu()``) lands on the physical device its op is placed on, as a factory's ``device=`` does:
    the plan decides where every op's output lives, and the device the model wrote is the one it
    ran on in eager. Its dtype and other arguments (``copy=``, ``non_blocking=``) are kept; a
    tensor to match (``x.to(other)``) becomes its dtype and the op's device."""
    for node in gm.graph.nodes:
        device = node_device.get(node.name)
        if device is None or node.op != "call_method" or node.target not in MOVES:
            continue
        if node.target != "to":  # x.cuda(device=None, non_blocking=False) / x.cpu(): a .to(device)
            kept = {k: v for k, v in node.kwargs.items() if k in ("non_blocking", "memory_format")}
            node.target, node.args, node.kwargs = "to", (node.args[0], device), kept
            continue
        args = list(node.args)
        if len(args) > 1 and _names_device(args[1]):
            args[1] = device
        elif len(args) > 1 and isinstance(args[1], torch.fx.Node):  # x.to(other): other's device and dtype
            other = _fake_value(args[1])
            if isinstance(other, torch.Tensor):
                args[1:2] = [device, other.dtype]
        if "device" in node.kwargs:
            node.kwargs = {**node.kwargs, "device": device}
        node.args = tuple(args)


def _fake_value(node: torch.fx.Node) -> Any:
    """dynamo's fake value of ``node``, through the copies ``place_module`` inserted (they carry none)."""
    while "val" not in node.meta and node.op == "call_method" and node.target == "to" \
            and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node.meta.get("val")


def _names_device(value: Any) -> bool:
    """Whether a positional argument of ``Tensor.to`` is its device (not a dtype or a tensor)."""
    return isinstance(value, (torch.device, str, int)) and not isinstance(value, bool)


def _write_back(gm: torch.fx.GraphModule, copies: list[torch.fx.Node]) -> None:
    """``input.copy_(its copy)`` at the end of the graph, for inputs updated on another device."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    for copy_node in copies:
        with gm.graph.inserting_before(output):
            gm.graph.call_method("copy_", (copy_node.args[0], copy_node))


def _specialise_state_copies(gm: torch.fx.GraphModule, plan: Any, values: Mapping[str, Any],
                             copied: list[torch.fx.Node]) -> None:
    """Turn the per-call copies of model state (``placeholder.to(device)``, inserted by
    ``place_module``) into kept copies or streamed fetches where allowed. ``copied`` holds no copy
    of state the graph updates: that copy is written back each call, never kept."""
    copies = StateCopies()
    grad = torch.is_grad_enabled()
    streamed: list[tuple[torch.fx.Node, str, torch.fx.Node]] = []  # (placeholder, device, its .to node)
    kept: list[tuple[torch.fx.Node, str, torch.fx.Node]] = []
    for node in copied:
        ph = node.args[0]
        value = values.get(ph.name)
        if not isinstance(value, torch.Tensor) or not is_state(ph, value):
            continue
        device = str(node.args[1])
        if any(u.name in plan.weights for u in node.users):
            streamed.append((ph, device, node))
        elif not (grad and value.requires_grad):
            kept.append((ph, device, node))
    if not streamed and not kept:
        return
    first = next(n for n in gm.graph.nodes if n.op != "placeholder")
    setattr(gm, STATE_ATTR, copies)
    with gm.graph.inserting_before(first), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a plain attribute, not a tensor or submodule
        state = gm.graph.get_attr(STATE_ATTR)
    for ph, device, to_node in kept:
        with gm.graph.inserting_before(to_node):
            to_node.replace_all_uses_with(gm.graph.call_method("get", (state, ph, ph.name, device)))
        gm.graph.erase_node(to_node)
    if streamed:
        order = {name: i for i, name in enumerate(plan.schedule)}
        streamed.sort(key=lambda item: min(order.get(u.name, 0) for u in item[2].users))
        streamer = ArgumentStreamer([(ph.name, device) for ph, device, _ in streamed], copies)
        setattr(gm, STREAM_ATTR, streamer)
        with gm.graph.inserting_after(state), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            handle = gm.graph.get_attr(STREAM_ATTR)
        with gm.graph.inserting_after(handle):
            gm.graph.call_method("bind", (handle, *(ph for ph, _, _ in streamed)))
        for ph, device, to_node in streamed:
            with gm.graph.inserting_before(to_node):
                to_node.replace_all_uses_with(gm.graph.call_method("get", (handle, ph.name, device)))
            gm.graph.erase_node(to_node)


def _return_where_eager_does(
    gm: torch.fx.GraphModule,
    node_device: Mapping[str, torch.device],
    arrivals: Mapping[str, torch.device],
    original: Mapping[str, torch.device],
) -> None:
    output = next(n for n in gm.graph.nodes if n.op == "output")
    for node in _output_nodes(gm):
        want = original.get(node.name)
        have = node_device.get(node.name, arrivals.get(node.name))
        if want is None or have is None or _same(want, have):
            continue
        with gm.graph.inserting_before(output):
            # copy=True: a real copy even where both devices are one physical device (strict CPU tags)
            moved = gm.graph.call_method("to", (node, want), {"copy": True})
        output.replace_input_with(node, moved)


def _same(a: torch.device, b: torch.device) -> bool:
    """Equal devices, with ``cuda`` and ``cuda:<current>`` the same."""
    if a.type != b.type:
        return False
    if a.index is None or b.index is None:
        current = torch.cuda.current_device() if a.type == "cuda" and torch.cuda.is_available() else 0
        return (a.index if a.index is not None else current) == (b.index if b.index is not None else current)
    return a.index == b.index


__all__ = ["STATE_ATTR", "STREAM_ATTR", "emit_graph", "is_state"]
