"""Code generation for torch: a plan becomes an ``nn.Module`` that runs its placement.

In: a :class:`~partitioner.plan.Plan`, the model it was made for, and a binding of the plan's
logical devices to real ones (``{"cuda:0": "cpu"}`` runs any plan on a CPU-only machine). Out: an
``nn.Module`` whose ``forward`` is the captured graph with every op on its device:

* the graph is re-captured from the model (the same capture as the plan's) and checked against
  the plan's fingerprint; its unlifted form keeps the model's parameter names, so ``state_dict``
  keys equal the original's and ``load_state_dict`` of the original's state works;
* parameters and buffers are copied once to the device that holds them (the caller's model is
  never touched); parameters shared between ops stay one parameter, homed with the op that owns
  them in the plan (``plan.param_names``), tensor constants the capture lifted on the host;
* transfers follow the plan's *logical* devices, never the physical ones they are bound to: an
  explicit ``.to(device)`` is inserted before the first op on a logical device that reads a tensor
  living on another one (once per tensor and logical device: the plan's transfers), even where
  both are bound to one physical device (the copy is then a no-op at run time). An item of a
  multi-output op (``getitem``) placed away from its producer is copied to its own device right
  after it is taken. Ops that create tensors get their ``device=`` argument rebound;
* ops are issued in the plan's schedule order, so asynchronous GPU work goes out before
  independent CPU work;
* streamed weights stay in (pinned) host memory and are fetched through a
  :class:`~backends.torch.streaming.WeightStreamer`: on CUDA, copies run on a side stream a
  few ops ahead, ordered by events; on a CPU binding the same path makes plain copies.

A plan with a ``splits`` section has each split linear cut into its shards, each on its device, with
the copies and the concatenation or sum that rejoin them (:mod:`backends.torch.splits`). A plan with a
``precision`` section gets its casts from :mod:`backends.torch.precision`. A training
plan's ``training_state`` section (:mod:`partitioner.plan.training_state`) is followed by three
passes: row-sparse tables (:mod:`backends.torch.sparse_grads`), streamed weights fetched again in
backward rather than kept (:mod:`backends.torch.train_streaming`; any training plan that streams),
recomputed runs under ``torch.utils.checkpoint`` (:mod:`backends.torch.recompute`) and ops whose
saved activations the host holds under saved-tensor hooks (:mod:`backends.torch.saved_on_host`).

The generated ``forward`` is ordinary fx Python code (``module.code``): no interpreter at run time.
"""

from __future__ import annotations

import copy
import inspect
import logging
import operator
import warnings
from collections.abc import Callable, Collection, Mapping
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

from backends.binding import bind_devices
from backends.torch.attributes import attribute, rebind_tensor
from backends.torch.optim.from_plan import mark_emitted
from backends.torch.precision import apply_precision
from backends.torch.recompute import checkpoint_recomputed
from backends.torch.replaced import remember
from backends.torch.saved_on_host import hold_saved_on_host
from backends.torch.sparse_grads import mark_sparse_gradients
from backends.torch.chunked import chunk_linears, label_fetches
from backends.torch.expert_chunks import chunk_experts
from backends.torch.expert_devices import split_experts
from backends.torch.split_regions import ANCHOR_META
from backends.torch.splits import split_linears
from partitioner.plan.splits import refuse_splits
from backends.torch.streaming import STREAMER_ATTR, WeightStreamer
from backends.torch.train_streaming import TrainingStreamer, install_refetch
from partitioner.errors import HetpartError, PlanMismatch
from partitioner.frontends.fx import capture_mode, from_module
from partitioner.frontends.inputs import check_call, examples
from partitioner.frontends.names import check_fx_names, check_graph_targets
from partitioner.ir import NOT_A_TENSOR, OpGraph

log = logging.getLogger(__name__)

#: ``move_state(gm, home, physical, streamed)``: puts each attribute tensor in its home (see :func:`place_module`)
StateMover = Callable[[torch.fx.GraphModule, Mapping[str, str], Mapping[str, torch.device], list[tuple[str, str]]], None]


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
    graph = captured_as_planned(plan, model, example_inputs)
    plan.check_graph(graph)
    return graph


def captured_as_planned(plan: Any, model: torch.nn.Module, example_inputs: Any = None, *,
                        on_meta: bool = False) -> OpGraph:
    """``model`` captured as the plan's model was (its capture, mode and dynamic dimensions), not
    checked against the plan's fingerprint: :func:`capture_for` checks it; a tensor-parallel rank's
    shard copy (:mod:`backends.tensor_parallel.shard_shapes`, ``on_meta``: a model on the ``meta``
    device, its inputs moved there) is not the plan's model."""
    dynamic = [spec.dynamic_names() for spec in plan.inputs]
    if any(dynamic):
        inputs = example_inputs_for(plan)
    else:
        inputs = example_inputs if example_inputs is not None else example_inputs_for(plan)
    if on_meta:
        inputs = pytree.tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, inputs)
    with capture_mode(model, training=plan.training):
        return from_module(model, inputs, capture=plan.capture, name=type(model).__name__,
                           dynamic_shapes=dynamic if any(dynamic) else None)


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
        model: the model the plan was made for (its weights are copied, never moved: train the
            emitted module's ``parameters()``; an optimizer step over the original's, which get
            no gradients, is refused, see :mod:`backends.torch.replaced`).
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
    gm = unlifted_module(graph)
    _match_persistence(gm, model)
    tensors = {name for name, t in graph.tensors.items() if t.dtype != NOT_A_TENSOR}
    if plan.training_state:  # row-sparse tables (a no-op without sparse updates)
        mark_sparse_gradients(plan, {n.name: n for n in gm.graph.nodes}, _param_readers(gm))
    gm = place_module(gm, plan, binding, tensors=tensors)
    apply_precision(gm, plan)  # casts where the plan computes in 16 bits (a no-op without a precision section)
    if plan.training:
        _train_streamed(gm)
    checkpoint_recomputed(gm, plan)  # a no-op without training_state.recompute
    hold_saved_on_host(gm, plan, binding)  # a no-op without training_state.saved_on_host
    if plan.inputs:
        gm.register_forward_pre_hook(PlannedInputs(plan.inputs, _input_names(model)), prepend=True)
    remember(model, gm)  # an optimizer over model.parameters() would train nothing: refused at its step
    mark_emitted(gm, plan, {**dict(device_map or {}), **binding})  # plan.optimizer(gm) reads it
    return gm


def place_module(
    gm: torch.fx.GraphModule,
    plan: Any,
    binding: Mapping[str, str],
    arrivals: Mapping[str, torch.device] | None = None,
    *,
    tensors: Collection[str] = (),
    move_state: StateMover | None = None,
) -> torch.fx.GraphModule:
    """Make ``gm`` run ``plan``, in place: the steps of :func:`emit_module` after capture.

    ``gm`` is a private GraphModule whose op nodes carry the plan's op names (the graph the plan
    was made for). Its attribute tensors move to their devices, ops are issued in schedule order,
    a transfer goes before each op that reads a value from another logical device, and factory
    ops create on their own device. ``arrivals`` names the physical device on which a
    placeholder's value arrives when the caller knows it (a torch.compile graph's inputs; dynamo
    guards on their devices): no copy is inserted for a consumer bound to that device. Other
    placeholders are copied to each consuming device (``.to`` is free when the value is already
    there). ``tensors`` names the nodes whose values are single tensors where the graph carries no
    fake values (a symbolic trace). ``move_state(gm, home, physical, streamed)`` puts the attribute
    tensors in their homes (default: copies of the model's; a checkpoint load reads them from disk,
    :mod:`backends.torch.from_checkpoint`).

    Example:
        >>> gm = place_module(private_gm, plan, {"cpu": "cpu", "cuda:0": "cpu"})   # doctest: +SKIP
    """
    placed = {op: d for op, d in plan.placement.items()}  # op -> logical device
    physical = {d: torch.device(p) for d, p in binding.items()}
    physical.setdefault(plan.devices.host_device().name, torch.device("cpu"))
    # split linears first: their shards are made on their devices, the whole weight never lands on one
    if move_state is not None:  # weights read from a checkpoint (or shared) are never cut into shards here
        refuse_splits(plan, "a module built from a checkpoint or sharing its weights")
    shard_nodes, shard_homes = split_linears(gm, plan, physical)
    expert_nodes, expert_homes = split_experts(gm, plan, physical)  # fused experts ops divided between devices
    shard_nodes.update(expert_nodes)
    shard_homes.update(expert_homes)
    chunk_nodes, chunk_homes, chunk_fetches = chunk_linears(gm, plan, physical)
    for part, more in zip((chunk_nodes, chunk_homes, chunk_fetches), chunk_experts(gm, plan, physical)):
        part.update(more)  # fused experts ops split in time by expert: their expert groups, streamed alike
    shard_nodes.update(chunk_nodes)
    shard_homes.update(chunk_homes)
    home = _parameter_homes(gm, plan)
    for target in chunk_homes:  # made on their devices already, like split shards
        home.pop(target, None)
    streamed = _streamed_attrs(gm, plan, home, chunk_fetches)
    if move_state is None:
        _move_state(gm, home, physical)
    else:
        move_state(gm, home, physical, streamed)
    setattr(gm, STREAMER_ATTR, WeightStreamer(gm, [(t, str(physical[d])) for t, d in streamed]))
    home.update(shard_homes)
    _reorder(gm, plan.schedule)
    _settle_items(gm, placed, physical, set(tensors))
    _insert_transfers(gm, {**placed, **shard_nodes}, home, streamed, physical, set(plan.weights) | set(chunk_nodes),
                      set(tensors), arrivals or {})
    label_fetches(gm)
    rebind_factory_devices(gm, placed, physical)
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


def unlifted_module(graph: OpGraph, *, weights_to_load: bool = False) -> torch.fx.GraphModule:
    """A private GraphModule with the model's parameter names (``get_attr`` nodes), deep-copied.
    Weights without values (on the meta device, or the hollow ones of a model folder opened for
    planning) are refused unless ``weights_to_load`` (a checkpoint fills them)."""
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
        # weights a checkpoint fills are shared as they are, valueless (Parameter.__deepcopy__ would
        # clone a hollow one into real memory); each is rebound before the module is used
        memo = {id(p): p for p in gm.parameters()} if weights_to_load else {}
        gm = copy.deepcopy(gm, memo)  # never share tensors or graph with the caller's model
    for p in () if weights_to_load else gm.parameters():
        if p.is_meta or p.untyped_storage().nbytes() < p.numel() * p.element_size():
            raise HetpartError(
                "the model's weights are on the meta device (or hollow: a model folder opened for planning): "
                "emit needs real weights (build the model normally, or emit from the folder itself: "
                "plan.emit('./folder', ...); planning alone can use device='meta')"
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
    """Attribute tensor (qualified name) → the op nodes that read it: the users of a ``get_attr``,
    and a module called whole (``call_module``, from a symbolic trace) for its own tensors."""
    uses: dict[str, list[torch.fx.Node]] = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            uses.setdefault(str(node.target), []).extend(u for u in node.users if u.op != "output")
        elif node.op == "call_module":
            module = gm.get_submodule(str(node.target))
            for name, _ in [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]:
                uses.setdefault(f"{node.target}.{name}", []).append(node)
    return uses


def _param_readers(gm: torch.fx.GraphModule) -> dict[str, list[torch.fx.Node]]:
    """Attribute tensor (each of its names) → every op node reading it under any name (tied weights)."""
    uses = _param_uses(gm)
    groups: dict[int, list[str]] = {}
    for target in uses:
        groups.setdefault(id(attribute(gm, target)), []).append(target)
    out: dict[str, list[torch.fx.Node]] = {}
    for targets in groups.values():
        readers = list(dict.fromkeys(u for t in targets for u in uses[t]))
        out.update({t: readers for t in targets})
    return out


def _train_streamed(gm: torch.fx.GraphModule) -> None:
    """A training module's streamed weights: fetched again in backward, not kept between the
    passes, gradients copied back to the host weights as they are (:mod:`backends.torch.train_streaming`)."""
    streamer = getattr(gm, STREAMER_ATTR)
    if streamer.order:
        setattr(gm, STREAMER_ATTR, TrainingStreamer(gm, list(streamer.devices.items())))
        install_refetch(gm)


def _parameter_homes(gm: torch.fx.GraphModule, plan: Any) -> dict[str, str]:
    """The logical device each attribute tensor lives on (get_attr target → device).

    A parameter or buffer lives with the op that owns it in the plan (``plan.param_names``; the
    first op reading it for plans that do not record owners), on the host when that op streams
    its weights; every name of a tied tensor gets the same home. A tensor the capture lifted
    as a constant is a graph input to the plan: it lives on the host.
    """
    owner_of = {name: op for op, names in plan.param_names.items() for name in names}
    host = plan.devices.host_device().name
    groups: dict[int, list[str]] = {}
    uses = _param_uses(gm)
    for target in uses:
        groups.setdefault(id(attribute(gm, target)), []).append(target)
    home: dict[str, str] = {}
    for targets in groups.values():
        readers = [u.name for t in targets for u in uses[t] if u.name in plan.placement]
        if not readers:
            continue
        owners = [owner_of[t] for t in targets if owner_of.get(t) in plan.placement]
        if owners:
            owner = owners[0]
        elif plan.param_names:  # a lifted constant: an input of the plan, on the host
            for t in targets:
                home[t] = host
            continue
        else:
            owner = readers[0]
        for t in targets:
            home[t] = plan.weights.get(owner, plan.placement[owner])
    return home


def _move_state(gm: torch.fx.GraphModule, home: Mapping[str, str], physical: Mapping[str, torch.device]) -> None:
    """Put each parameter / buffer on its home's physical device, keeping shared tensors shared.

    Every name of a tied tensor has a home (an unlifted module reads each name with a ``get_attr``,
    used or not; a module a trace calls whole brings all of its own), so each name is rebound."""
    moved: dict[int, torch.Tensor] = {}
    originals: list[torch.Tensor] = []  # keep the old tensors alive so their ids are not reused
    for target, logical in home.items():
        device = physical[logical]
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
        rebind_tensor(module, attr, moved[key])


def _streamed_attrs(gm: torch.fx.GraphModule, plan: Any, home: Mapping[str, str],
                    chunks: Mapping[str, list[tuple[str, str]]] | None = None) -> list[tuple[str, str]]:
    """(attribute target, logical device it is streamed to), in schedule order; a time-split op's
    chunks (``chunks``: op -> its chunks in order) in its place."""
    position = {op: i for i, op in enumerate(plan.schedule)}
    out: list[tuple[int, int, str, str]] = [(position.get(op, 0), i, target, device)
                                            for op, fetched in (chunks or {}).items()
                                            for i, (target, device) in enumerate(fetched)]
    for target, users in _param_uses(gm).items():
        for u in users:
            if u.name in plan.weights and home.get(target) == plan.weights[u.name]:
                if u.op == "call_module":
                    raise HetpartError(f"plan.emit cannot stream the weights of {u.name}, a module called whole "
                                       f"(symbolic_trace capture): re-plan with capture 'export' or without "
                                       f"streaming (--no-streaming)")
                out.append((position.get(u.name, 0), 0, target, plan.placement[u.name]))
                break
    return [(t, d) for _, _, t, d in sorted(out)]


def _reorder(gm: torch.fx.GraphModule, schedule: tuple[str, ...]) -> None:
    """Issue ops in the plan's schedule order (placeholders and attributes stay in front)."""
    nodes = {n.name: n for n in gm.graph.nodes}
    ops = [nodes[name] for name in schedule if name in nodes]
    if not ops:
        return
    anchor = next(n for n in gm.graph.nodes if n.op not in ("placeholder", "get_attr"))
    for attr in [n for n in gm.graph.nodes if n.op == "get_attr"]:  # a symbolic trace reads them mid-graph
        anchor.prepend(attr)
    anchor.prepend(ops[0]) if anchor is not ops[0] else None
    for prev, node in zip(ops, ops[1:]):
        prev.append(node)
    by_op: dict[str, list[torch.fx.Node]] = {}  # a split op's shards, copies and slices go right before it
    for node in gm.graph.nodes:
        if ANCHOR_META in node.meta:  # a split region's part: before its row op (backends/torch/split_regions.py)
            by_op.setdefault(node.meta[ANCHOR_META], []).append(node)
        elif "hetpart_split" in node.meta:  # sites "<op>.shard<i>", copies "<op>" or "<op>.part<i>"
            site = node.meta["hetpart_split"].get("op", node.meta["hetpart_split"].get("tensor", ""))
            by_op.setdefault(site.split(".shard")[0].split(".part")[0], []).append(node)
    for op, parts in by_op.items():
        for part in parts:
            nodes[op].prepend(part)
    # nodes the plan does not list (none expected) keep their relative place after their inputs
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    for node in gm.graph.nodes:
        for arg in node.all_input_nodes:
            if order[arg] > order[node]:
                raise PlanMismatch(f"the plan's schedule runs {node.name} before its input {arg.name}")


def _settle_items(gm: torch.fx.GraphModule, placed: Mapping[str, str], physical: Mapping[str, torch.device],
                  tensors: set[str]) -> None:
    """An item taken from a multi-output op (``getitem`` of a tuple) on another logical device than
    the op is copied there as it is taken: the plan's transfer of that output. The copy counts as
    part of the ``getitem`` op (``meta["hetpart_op"]``)."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not operator.getitem or node.name not in placed:
            continue
        source = node.args[0]
        if not isinstance(source, torch.fx.Node) or _is_tensor_node(source, tensors):
            continue
        device = placed[node.name]
        if placed.get(source.name, device) == device:
            continue
        with graph.inserting_after(node):
            copy_node = graph.call_method("to", (node, physical[device]), {})
        node.replace_all_uses_with(copy_node, delete_user_cb=lambda user: user is not copy_node)
        copy_node.meta["hetpart_op"] = node.name
        copy_node.meta["hetpart_device"] = device


def _insert_transfers(
    gm: torch.fx.GraphModule,
    placed: Mapping[str, str],
    home: Mapping[str, str],
    streamed: list[tuple[str, str]],
    physical: Mapping[str, torch.device],
    streaming: set[str],
    tensors: set[str],
    arrivals: Mapping[str, torch.device],
) -> None:
    """Before the first consumer on another logical device, copy the value there (once per
    tensor and logical device). An op that streams its weights (``streaming``) fetches them
    through ``self._hetpart_streamer.get(target, device)`` instead; another reader of a streamed
    tensor (a tied weight) copies it from the host, as the plan's ``param`` transfer says."""
    graph = gm.graph
    streamed_targets = {t for t, _ in streamed}
    streamer: torch.fx.Node | None = None
    copies: dict[tuple[torch.fx.Node, str, bool], torch.fx.Node] = {}
    for node in list(graph.nodes):
        if node.name not in placed:
            continue
        device = placed[node.name]
        if node.op == "call_module":
            _check_module_state(gm, node, device, home)
        for arg in list(node.all_input_nodes):
            if not _is_tensor_node(arg, tensors):
                continue
            fetch = arg.op == "get_attr" and str(arg.target) in streamed_targets and node.name in streaming
            key = (arg, device, fetch)
            if key not in copies:
                if fetch:
                    if streamer is None:
                        first = next(n for n in graph.nodes if n.op != "placeholder")
                        with graph.inserting_before(first), warnings.catch_warnings():
                            # the streamer is a plain attribute, not a submodule or tensor: fx warns
                            warnings.simplefilter("ignore", UserWarning)
                            streamer = graph.get_attr(STREAMER_ATTR)
                    with graph.inserting_before(node):
                        copies[key] = graph.call_method("get", (streamer, str(arg.target), str(physical[device])), {})
                else:
                    if arg.op == "placeholder" and arrivals.get(arg.name) == physical[device]:
                        continue  # the caller's value arrives there (a compiled graph's input)
                    src = _device_of(arg, placed, home)
                    if src is not None and src == device:
                        continue
                    with graph.inserting_before(node):
                        copies[key] = graph.call_method("to", (arg, physical[device]), {})
            node.replace_input_with(arg, copies[key])


def _check_module_state(gm: torch.fx.GraphModule, node: torch.fx.Node, device: str, home: Mapping[str, str]) -> None:
    """A module called whole reads its own tensors inside the call, where no copy can go: they must
    live on its device."""
    module = gm.get_submodule(str(node.target))
    for name, _ in [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]:
        target = f"{node.target}.{name}"
        if home.get(target, device) != device:
            raise HetpartError(f"op {node.name} runs module {node.target} whole on {device}, but the plan keeps its "
                               f"tensor {target} on {home[target]} (a tied weight owned elsewhere): no copy can go "
                               f"inside the call; re-plan with capture 'export', or pin both readers to one device")


def _is_tensor_node(node: torch.fx.Node, tensors: set[str]) -> bool:
    """Whether ``node``'s value is one tensor: its fake value says so (export), or the captured
    graph's record of it (a symbolic trace); attributes and the emitter's copies are tensors."""
    val = node.meta.get("val")
    if val is not None:
        return isinstance(val, torch.Tensor)
    return node.op == "get_attr" or "hetpart_device" in node.meta or node.name in tensors


def _device_of(node: torch.fx.Node, placed: Mapping[str, str], home: Mapping[str, str]) -> str | None:
    """The logical device ``node``'s value lives on (None: a graph input, wherever the caller keeps it)."""
    if node.op == "get_attr":
        return home.get(str(node.target))
    if node.op == "placeholder":
        return None  # inputs arrive wherever the caller keeps them: always copy (a no-op when there)
    return node.meta.get("hetpart_device", placed.get(node.name))


_FACTORY_KWARGS = ("device",)


def rebind_factory_devices(gm: torch.fx.GraphModule, placed: Mapping[str, str],
                           physical: Mapping[str, torch.device]) -> None:
    """Ops that create tensors (``arange``, ``zeros``, ``_to_copy``) create them on their own device;
    a device passed positionally (``aten.to.device(x, device)``, a model's ``x.to(y.device)``) is the
    device everything was on when captured (the host, or meta), so it becomes the op's too."""
    for node in gm.graph.nodes:
        if node.name not in placed:
            continue
        device = physical[placed[node.name]]
        if "device" in node.kwargs:
            kwargs = dict(node.kwargs)
            kwargs["device"] = device
            node.kwargs = kwargs
        if any(isinstance(a, torch.device) for a in node.args):
            node.args = tuple(device if isinstance(a, torch.device) else a for a in node.args)
