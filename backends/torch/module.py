"""Code generation for torch: a plan becomes an ``nn.Module`` that runs its placement.

In: a :class:`~partitioner.plan.Plan`, the model it was made for, and a binding of the plan's
logical devices to real ones (``{"cuda:0": "cpu"}`` runs any plan on a CPU-only machine). Out: an
``nn.Module`` whose ``forward`` is the captured graph with every op on its device:

* the graph is re-captured from the model (the same capture as the plan's) and checked against
  the plan's fingerprint; its unlifted form keeps the model's parameter names, so ``state_dict``
  keys equal the original's and ``load_state_dict`` of the original's state works;
* parameters and buffers are copied once to the device that holds them (the caller's model is
  never touched); parameters shared between ops stay one parameter;
* an explicit ``.to(device)`` is inserted before the first op on a device that reads a tensor
  produced elsewhere (once per tensor and device: the plan's transfers); ops that create tensors
  get their ``device=`` argument rebound;
* ops are issued in the plan's schedule order, so asynchronous GPU work goes out before
  independent CPU work;
* streamed weights stay in (pinned) host memory and are fetched through a
  :class:`~backends.torch.streaming.WeightStreamer`: on CUDA, copies run on a side stream a
  few ops ahead, ordered by events; on a CPU binding the same path makes plain copies.

The generated ``forward`` is ordinary fx Python code (``module.code``): no interpreter at run time.
"""

from __future__ import annotations

import copy
import inspect
import logging
import warnings
from collections.abc import Mapping
from typing import Any

import torch
import torch.fx

from backends.binding import bind_devices
from backends.torch.streaming import WeightStreamer
from partitioner.errors import HetpartError, PlanMismatch
from partitioner.frontends.fx import capture_mode, from_module
from partitioner.frontends.inputs import check_call, examples
from partitioner.frontends.names import check_fx_names, check_graph_targets
from partitioner.ir import OpGraph

log = logging.getLogger(__name__)

STREAMER_ATTR = "_hetpart_streamer"


def example_inputs_for(plan: Any) -> tuple[Any, ...]:
    """Inputs of the recorded shapes and dtypes (zeros) and recorded values: enough to re-capture."""
    if not plan.inputs:
        raise HetpartError(f"{plan.source} records no example inputs (the model takes inputs a plan "
                           f"cannot record, or the plan was made from an OpGraph): pass example_inputs "
                           f"to emit(...)")
    return examples(plan.inputs)


def capture_for(plan: Any, model: torch.nn.Module, example_inputs: Any = None) -> OpGraph:
    """Re-capture ``model`` as the plan did and check it is the model the plan was made for.

    A plan with dynamic dimensions is re-captured at its recorded sizes with the same dimensions
    declared (its fingerprint is of those sizes); a training plan captures the model in train mode.
    """
    dynamic = [spec.dynamic_names() for spec in plan.inputs]
    if any(dynamic):
        inputs = example_inputs_for(plan)
    else:
        inputs = example_inputs if example_inputs is not None else example_inputs_for(plan)
    with capture_mode(model, training=plan.training):
        graph = from_module(model, inputs, capture=plan.capture, name=type(model).__name__,
                            dynamic_shapes=dynamic if any(dynamic) else None)
    plan.check_graph(graph)
    return graph


def emit_module(
    plan: Any,
    model: torch.nn.Module,
    device_map: Mapping[str, str] | None = None,
    *,
    example_inputs: Any = None,
) -> torch.fx.GraphModule:
    """Build the module that runs ``plan`` (see the module docstring).

    Parameters:
        plan: the Plan.
        model: the model the plan was made for (its weights are copied, never moved).
        device_map: logical device → physical device, e.g. ``{"cuda:0": "cpu"}``.
        example_inputs: inputs to re-capture with (default: zeros of the plan's input shapes).

    Raises:
        PlanMismatch: the model is not the one the plan was made for.
        HetpartError: a device of the plan is not present and not bound elsewhere.

    Example:
        >>> emitted = emit_module(plan, model, {"cuda:0": "cpu"})   # doctest: +SKIP
        >>> torch.testing.assert_close(emitted(*inputs), model(*inputs))
    """
    binding = bind_devices(plan, device_map)
    check_fx_names(model, "plan.emit")
    graph = capture_for(plan, model, example_inputs)
    gm = _unlifted(graph)
    _match_persistence(gm, model)
    gm = place_module(gm, plan, binding)
    if plan.inputs:
        gm.register_forward_pre_hook(PlannedInputs(plan.inputs, _input_names(model)), prepend=True)
    return gm


def place_module(
    gm: torch.fx.GraphModule,
    plan: Any,
    binding: Mapping[str, str],
    arrivals: Mapping[str, torch.device] | None = None,
) -> torch.fx.GraphModule:
    """Make ``gm`` run ``plan``, in place: the steps of :func:`emit_module` after capture.

    ``gm`` is a private GraphModule whose op nodes carry the plan's op names (the graph the plan
    was made for). Its attribute tensors move to their devices, ops are issued in schedule order,
    a transfer goes before each op that reads a value from another device, and factory ops create
    on their own device. ``arrivals`` names the device on which a placeholder's value arrives
    when the caller knows it (a torch.compile graph's inputs; dynamo guards on their devices): no
    copy is inserted for a consumer on that device. Other placeholders are copied to each consuming
    device (``.to`` is free when the value is already there).

    Example:
        >>> gm = place_module(private_gm, plan, {"cpu": "cpu", "cuda:0": "cpu"})   # doctest: +SKIP
    """
    node_device = {op: torch.device(binding[d]) for op, d in plan.placement.items()}
    home = _parameter_homes(gm, plan, node_device, binding)
    _move_state(gm, home)
    streamed = _streamed_attrs(gm, plan, binding)
    setattr(gm, STREAMER_ATTR, WeightStreamer(gm, streamed))
    _reorder(gm, plan.schedule)
    _insert_transfers(gm, node_device, home, streamed, arrivals or {})
    _rebind_factory_devices(gm, node_device)
    gm.graph.lint()
    check_graph_targets(gm, "plan.emit")
    gm.recompile()
    return gm


class PlannedInputs:
    """A forward pre-hook: a call with inputs the plan was not made for fails with a sentence
    naming the input and the planned shape (instead of a guard deep inside torch)."""

    def __init__(self, specs: tuple[Any, ...], names: list[str]) -> None:
        self.specs, self.names = specs, names

    def __call__(self, module: torch.nn.Module, args: tuple) -> None:
        check_call(self.specs, self.names, args)


def _input_names(model: torch.nn.Module) -> list[str]:
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


# --------------------------------------------------------------------------------------------


def _unlifted(graph: OpGraph) -> torch.fx.GraphModule:
    """A private GraphModule with the model's parameter names (``get_attr`` nodes), deep-copied."""
    source = graph.source
    if isinstance(source, torch.export.ExportedProgram):
        # module() sets every lifted name back as an attribute and generates code that reads it
        lifted = [("lifted constant", str(name)) for name in source.constants]
        lifted += [("lifted input", str(spec.target)) for spec in source.graph_signature.input_specs
                   if spec.target is not None]
        check_fx_names(torch.nn.Module(), "plan.emit", lifted)
        gm = source.module()
    elif isinstance(source, torch.fx.GraphModule):
        check_graph_targets(source, "plan.emit")
        gm = source
    else:
        raise HetpartError(f"cannot emit code for a graph captured as {type(source).__name__}")
    with warnings.catch_warnings():  # torch 2.13 warns about its own pytree specs when they are copied
        warnings.simplefilter("ignore", FutureWarning)
        gm = copy.deepcopy(gm)  # never share tensors or graph with the caller's model
    for p in gm.parameters():
        if p.is_meta:
            raise HetpartError(
                "the model's weights are on the meta device: emit needs real weights "
                "(build the model normally; planning alone can use device='meta')"
            )
    return gm


def _match_persistence(gm: torch.fx.GraphModule, model: torch.nn.Module) -> None:
    """Buffers the model does not save (non-persistent) are not saved by the emitted module either."""
    keys = set(model.state_dict().keys())
    for qual, _ in list(gm.named_buffers()):
        if qual not in keys:
            owner, _, attr = qual.rpartition(".")
            (gm.get_submodule(owner) if owner else gm)._non_persistent_buffers_set.add(attr)


def _param_uses(gm: torch.fx.GraphModule) -> dict[str, list[torch.fx.Node]]:
    """get_attr target → the op nodes that read it."""
    uses: dict[str, list[torch.fx.Node]] = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            uses.setdefault(str(node.target), []).extend(u for u in node.users if u.op != "output")
    return uses


def _parameter_homes(
    gm: torch.fx.GraphModule, plan: Any, node_device: Mapping[str, torch.device], binding: Mapping[str, str]
) -> dict[str, torch.device]:
    """Where each attribute tensor lives: its owner op's device, or the host for streamed weights."""
    home: dict[str, torch.device] = {}
    for target, users in _param_uses(gm).items():
        ops = [u for u in users if u.name in node_device]
        if not ops:
            continue
        owner = ops[0].name
        if owner in plan.weights:
            home[target] = torch.device(binding[plan.weights[owner]])
        else:
            home[target] = node_device[owner]
    return home


def _move_state(gm: torch.fx.GraphModule, home: Mapping[str, torch.device]) -> None:
    """Put each parameter / buffer on its home device, keeping shared tensors shared."""
    moved: dict[int, torch.Tensor] = {}
    originals: list[torch.Tensor] = []  # keep the old tensors alive so their ids are not reused
    for target, device in home.items():
        owner, _, attr = target.rpartition(".")
        module = gm.get_submodule(owner) if owner else gm
        value = getattr(module, attr)
        key = id(value)
        originals.append(value)
        if key not in moved:
            if isinstance(value, torch.nn.Parameter):
                data = value.detach().to(device)
                moved[key] = torch.nn.Parameter(data, requires_grad=value.requires_grad)
            elif isinstance(value, torch.Tensor):
                moved[key] = value.to(device)
            else:
                continue
        new = moved[key]
        if isinstance(new, torch.nn.Parameter):
            module._parameters[attr] = new
        elif attr in module._buffers:
            module._buffers[attr] = new
        else:
            setattr(module, attr, new)
    # tied names that no op reads directly (e.g. lm_head.weight when tok_emb.weight is read)
    for module in gm.modules():
        for name, p in list(module._parameters.items()):
            if p is not None and id(p) in moved:
                module._parameters[name] = moved[id(p)]


def _streamed_attrs(gm: torch.fx.GraphModule, plan: Any, binding: Mapping[str, str]) -> list[tuple[str, str]]:
    """(attribute target, physical device it is streamed to), in schedule order."""
    position = {op: i for i, op in enumerate(plan.schedule)}
    out: list[tuple[int, str, str]] = []
    for target, users in _param_uses(gm).items():
        for u in users:
            if u.name in plan.weights:
                out.append((position.get(u.name, 0), target, binding[plan.placement[u.name]]))
                break
    return [(t, d) for _, t, d in sorted(out)]


def _reorder(gm: torch.fx.GraphModule, schedule: tuple[str, ...]) -> None:
    """Issue ops in the plan's schedule order (placeholders and attributes stay in front)."""
    nodes = {n.name: n for n in gm.graph.nodes}
    ops = [nodes[name] for name in schedule if name in nodes]
    if not ops:
        return
    anchor = next(n for n in gm.graph.nodes if n.op not in ("placeholder", "get_attr"))
    anchor.prepend(ops[0]) if anchor is not ops[0] else None
    for prev, node in zip(ops, ops[1:]):
        prev.append(node)
    # nodes the plan does not list (none expected) keep their relative place after their inputs
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    for node in gm.graph.nodes:
        for arg in node.all_input_nodes:
            if order[arg] > order[node]:
                raise PlanMismatch(f"the plan's schedule runs {node.name} before its input {arg.name}")


def _insert_transfers(
    gm: torch.fx.GraphModule,
    node_device: Mapping[str, torch.device],
    home: Mapping[str, torch.device],
    streamed: list[tuple[str, str]],
    arrivals: Mapping[str, torch.device],
) -> None:
    """Before the first consumer on another device, copy the value there (once per device).

    A streamed weight is fetched through ``self._hetpart_streamer.get(target, device)`` instead.
    """
    graph = gm.graph
    streamed_targets = {t for t, _ in streamed}
    streamer: torch.fx.Node | None = None
    copies: dict[tuple[torch.fx.Node, torch.device], torch.fx.Node] = {}
    for node in list(graph.nodes):
        if node.name not in node_device:
            continue
        device = node_device[node.name]
        for arg in list(node.all_input_nodes):
            if not _is_tensor_node(arg):
                continue
            key = (arg, device)
            if key not in copies:
                if arg.op == "get_attr" and str(arg.target) in streamed_targets:
                    if streamer is None:
                        first = next(n for n in graph.nodes if n.op != "placeholder")
                        with graph.inserting_before(first), warnings.catch_warnings():
                            # the streamer is a plain attribute, not a submodule or tensor: fx warns
                            warnings.simplefilter("ignore", UserWarning)
                            streamer = graph.get_attr(STREAMER_ATTR)
                    with graph.inserting_before(node):
                        copies[key] = graph.call_method("get", (streamer, str(arg.target), str(device)), {})
                else:
                    src = _device_of(arg, node_device, home, arrivals)
                    if src is not None and src == device:
                        continue
                    with graph.inserting_before(node):
                        copies[key] = graph.call_method("to", (arg, device), {})
            node.replace_input_with(arg, copies[key])


def _is_tensor_node(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    if val is None:
        return node.op in ("placeholder", "get_attr") or node.op.startswith("call")
    return isinstance(val, torch.Tensor)


def _device_of(
    node: torch.fx.Node, node_device: Mapping[str, torch.device], home: Mapping[str, torch.device],
    arrivals: Mapping[str, torch.device],
) -> torch.device | None:
    if node.op == "get_attr":
        return home.get(str(node.target))
    if node.op == "placeholder":
        # inputs arrive wherever the caller keeps them: copy (a no-op when there) unless known
        return arrivals.get(node.name)
    return node_device.get(node.name)


_FACTORY_KWARGS = ("device",)


def _rebind_factory_devices(gm: torch.fx.GraphModule, node_device: Mapping[str, torch.device]) -> None:
    """Ops that create tensors (``arange``, ``zeros``, ``_to_copy``) create them on their own device."""
    for node in gm.graph.nodes:
        if node.name in node_device and "device" in node.kwargs:
            kwargs = dict(node.kwargs)
            kwargs["device"] = node_device[node.name]
            node.kwargs = kwargs
