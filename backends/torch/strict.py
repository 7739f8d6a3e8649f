"""The torch backend under strict devices: an emitted module run on logical devices that differ.

In: a plan, then modules built for it with the strict binding (``plan.emit(model,
run.device_map)``, or a ``plan.emit_source`` file built with the same binding). Out: the module's
outputs, computed under :class:`~backends.strict_devices.StrictDevices` (every tensor tagged by
the logical device it lives on; the first op reading a tensor from another logical device, or
running away from its planned device, raises :class:`~partitioner.errors.DeviceMismatch`), and a
:class:`~backends.strict_devices.DeviceReport`: the step's copies per link and the bytes resident
per device beside the plan's transfers and parameter bytes.

How the plan's logical devices reach the mode: :attr:`StrictRun.device_map` binds each logical
device to its own CPU tag (``{"cpu": "cpu:1", "cuda:0": "cpu:2", ...}``). Emitting with it puts
every ``.to(device)``, factory ``device=`` and parameter move on a distinct tag, so the mode sees
each of them (building under the mode tags every parameter where the emitter put it);
:meth:`StrictRun.watch` hands the mode the module's ``forward`` code with the op of each line
(the fx code of ``plan.emit``; for a generated file, :func:`backends.torch.source.op_lines`) and
names its parameters and buffers as the plan does; :meth:`StrictRun.step` names the inputs after
the forward's arguments and counts one step's copies. Backward runs outside the mode: gradients
flow back through the same copies.

Example:
    >>> run = StrictRun(plan)                                        # doctest: +SKIP
    >>> with run:
    ...     emitted = run.watch(plan.emit(model, run.device_map))
    ...     outputs = run.step(emitted, *inputs)
    >>> run.report().passed
    True
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from types import CodeType
from typing import Any

import torch
import torch.utils._pytree as pytree

from backends.strict_devices import Site, StrictDevices, schema_name, strict_binding
from backends.torch.attributes import attribute
from backends.torch.packed import PACKED_ATTR
from backends.torch.recompute import recompute_regions
from backends.torch.split_regions import region_sites
from backends.torch.splits import SPLIT_ATTR, planned_shards
from backends.torch.saved_on_host import TARGET_META, HoldOnHost
from backends.strict_report import DeviceReport, compare_with_plan
from partitioner.errors import HetpartError

__all__ = ["StrictRun", "canonical_names", "fx_sites"]

_ASSIGNED = re.compile(r"^\s+([A-Za-z_][A-Za-z0-9_]*)\s*=\s")


class StrictRun:
    """One plan's emitted modules under strict devices (see the module docstring)."""

    def __init__(self, plan: Any, mode: StrictDevices | None = None) -> None:
        """``mode``: share another run's mode (plans of one model on one device set, such as a
        generation plan's two phases: tensors keep the devices they were tagged with, and each run
        checks its own plan's placement while it is entered)."""
        self.plan = plan
        if mode is not None and mode.binding != strict_binding(plan.devices.names()):
            raise HetpartError(f"a shared strict mode binds {', '.join(mode.binding)}; this plan is placed on "
                               f"{', '.join(plan.devices.names())}")
        self.mode = mode if mode is not None else StrictDevices(plan.devices.names(), plan.devices.host_device().name,
                                                                plan.placement)
        self.device_map: dict[str, str] = dict(self.mode.binding)
        self._state: list[tuple[str, torch.Tensor]] = []
        self._inputs: dict[Any, list[str]] = {}
        self._packed: dict[str, str] = {}  # a packed weight's tensor -> the weight it stands for
        self._region_sites: dict[str, str] = {}  # a split region's interior shards -> their devices

    def __enter__(self) -> StrictRun:
        self.mode.planned = {**self.plan.placement, **planned_shards(self.plan), **self._region_sites}
        self.mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.mode.__exit__(*exc)

    def watch(self, module: torch.nn.Module, sites: Mapping[int, Site] | None = None) -> torch.nn.Module:
        """Check ``module``'s forward op by op; name its parameters and buffers as the plan does.

        ``sites`` says what each line of the forward does (:class:`~backends.strict_devices.Site`);
        by default it comes from the fx code of a module ``plan.emit`` built
        (:func:`fx_sites`); for a generated file use :func:`backends.torch.source.op_lines`.
        """
        forward = type(module).forward
        canonical = canonical_names(module, self.plan)
        self._region_sites.update(region_sites(module))  # the emitter's interior shards, each on its shard's device
        self.mode.planned = {**self.mode.planned, **self._region_sites}
        if sites is None:  # plan.emit's module, and the checkpointed regions it calls (their own fx code)
            watched = [(forward.__code__, fx_sites(module, self.plan))]
            watched += [(type(r).forward.__code__, fx_sites(r, self.plan)) for r in recompute_regions(module)]
        else:  # a generated file: its line map covers the functions nested in forward (recomputed runs)
            watched = [(code, sites) for code in _nested_codes(forward.__code__)]
        watched.append((HoldOnHost.pack.__code__, _saved_sites()))  # an op's saved tensors copied to the host
        for code, found in watched:
            self.mode.watch(code, {n: s._replace(tensor=canonical.get(s.tensor, s.tensor)) for n, s in found.items()})
        self._inputs[forward.__code__] = list(inspect.signature(forward).parameters)[1:]
        state = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
        known = {n for names in self.plan.param_names.values() for n in names}
        self._packed = dict(getattr(module, PACKED_ATTR, {}))
        known |= set(self._packed)  # packed weights stand for the weights they replace
        known |= {n for _, names in getattr(module, SPLIT_ATTR, {}).values() for n in names}  # split shards
        state += _plain_tensors(module, known - {n for n, _ in state})  # constants the capture lifted
        for name, tensor in state:
            self.mode.name(tensor, canonical.get(name, name))
        # resident bytes count the tensors the plan places; one the forward never reads (a batch
        # norm's counter in eval mode) stays where the model had it, outside the plan
        self._state = [(n, t) for n, t in state if n in known or not known]
        return module

    def step(self, module: torch.nn.Module, *inputs: Any) -> Any:
        """``module(*inputs)`` as one step: inputs named after the forward's arguments, copies counted anew."""
        names = self._inputs.get(type(module).forward.__code__)
        if names is None:
            raise HetpartError("StrictRun.step runs a module it watches: call run.watch(module) first")
        for name, value in zip(names, inputs):
            if isinstance(value, torch.Tensor):
                self.mode.name(value, name)
        self.mode.reset()
        return module(*inputs)

    def report(self, error: str = "") -> DeviceReport:
        """The last step's copies and the watched module's resident bytes beside the plan."""
        return compare_with_plan(self.plan, self.device_map, self.mode.copies, self.mode.resident(self._state), error,
                                 self._packed)


def _saved_sites() -> dict[int, Site]:
    """Every line of :meth:`HoldOnHost.pack`: a copy of a saved tensor to the host (kind ``saved``)."""
    import dis

    code = HoldOnHost.pack.__code__
    return {line: Site(kind="saved") for _, line in dis.findlinestarts(code) if line is not None}


def _nested_codes(code: CodeType) -> list[CodeType]:
    """``code`` and the code of every function defined inside it, at any depth."""
    out = [code]
    for const in code.co_consts:
        if isinstance(const, CodeType):
            out += _nested_codes(const)
    return out


def _plain_tensors(module: torch.nn.Module, names: set[str]) -> list[tuple[str, torch.Tensor]]:
    """The plan's tensors that are plain tensor attributes of ``module`` (neither parameter nor
    buffer: a constant torch.export lifted, such as ``model.lifted_tensor_0``), by name."""
    out = []
    for name in sorted(names):
        try:
            value = attribute(module, name)
        except AttributeError:
            continue
        if isinstance(value, torch.Tensor):
            out.append((name, value))
    return out


def canonical_names(module: torch.nn.Module, plan: Any) -> dict[str, str]:
    """Every parameter and buffer name of ``module`` → the plan's name of its tensor.

    Tied names share one tensor; the plan lists an owned tensor's canonical name before its
    aliases (``plan.param_names``), so the first of them there names it (else the first name).
    """
    order = {name: i for i, name in enumerate(n for names in plan.param_names.values() for n in names)}
    groups: dict[int, list[str]] = {}
    for name, tensor in [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]:
        groups.setdefault(id(tensor), []).append(name)
    out = {}
    for names in groups.values():
        first = min(names, key=lambda n: (order.get(n, len(order)), names.index(n)))
        out.update({n: first for n in names})
    return out


def fx_sites(module: torch.nn.Module, plan: Any) -> dict[int, Site]:
    """Line of ``module.code`` (the forward ``plan.emit`` built) → what its statement does.

    A statement assigns one node: an op of the plan (with its aten call), or a transfer the
    emitter added (``.to`` or a streamed fetch: the plan's name of what it copies). The copy that
    settles a ``getitem`` item on its device carries its op in ``meta["hetpart_op"]``.
    """
    if not isinstance(module, torch.fx.GraphModule):
        raise HetpartError(f"strict devices read the fx code of a module plan.emit built, not a "
                           f"{type(module).__name__}; for a generated file pass backends.torch.source.op_lines(...)")
    code = type(module).forward.__code__
    text = module.code.splitlines()
    if code.co_firstlineno > len(text) or not text[code.co_firstlineno - 1].startswith("def forward"):
        raise HetpartError("the fx code of the emitted module does not line up with its compiled forward; "
                           "strict devices cannot tell its ops apart with this torch")
    nodes = {n.name: n for n in module.graph.nodes}
    out = {}
    for number, line in enumerate(text, start=1):
        match = _ASSIGNED.match(line)
        node = nodes.get(match.group(1)) if match else None
        if node is not None:
            site = _fx_site(node, plan)
            if site is not None:
                out[number] = site
    return out


def _fx_site(node: torch.fx.Node, plan: Any) -> Site | None:
    split = node.meta.get("hetpart_split")
    if split is not None:  # a split op's shard (its own site) or split copy (backends/torch/splits.py)
        if "op" in split:
            return Site(op=split["op"], call=schema_name(node.target))
        return Site(tensor=split["tensor"], kind=split["kind"])
    if node.name in plan.placement:  # (an op holding its saved activations on the host: its own target)
        return Site(op=node.name, call=schema_name(node.meta.get(TARGET_META, node.target)))
    if "hetpart_op" in node.meta:  # the copy of a getitem item to the getitem's device
        item = node.args[0]
        source, index = item.args[0], item.args[1]
        leaves = pytree.tree_leaves(source.meta.get("val"))
        return Site(op=node.meta["hetpart_op"], tensor=f"{source.name}.{index}" if len(leaves) > 1 else source.name)
    if node.op == "call_method" and node.target == "to":
        return Site(tensor=_tensor_name(node.args[0], plan))
    if node.op == "call_method" and node.target == "get":  # self._hetpart_streamer.get(target, device)
        return Site(tensor=str(node.args[1]), kind="weights")
    return None


def _tensor_name(node: torch.fx.Node, plan: Any) -> str:
    """The plan's name of the value of ``node``: a parameter's target, an op's or input's name (an
    output of a checkpointed region, and its placeholder inside a later one, carries the op's name
    in ``meta["hetpart_value"]``)."""
    if node.op == "get_attr":
        return str(node.target)
    return node.meta.get("hetpart_op", node.meta.get("hetpart_value", node.name))
