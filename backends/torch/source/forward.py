"""The forward of a generated file: the lifted graph printed in the plan's issue order, part by part.

In: the plan, the exported program, the :class:`~backends.torch.source.layout.Layout` and the
file's :class:`~backends.torch.source.template.Names`. Out: a :class:`Body` (forward's inputs, the
lines reading weights, the parts with their ``.to(DEVICE_...)`` copies and streamed fetches, the
return). Each part is one run of ops on one logical device; values no later part reads are freed.
The ops a training plan recomputes become checkpointed nested functions
(:mod:`backends.torch.source.recompute`); the ops whose saved activations the host holds are
called through hetpart's ``run_holding`` (:mod:`backends.torch.saved_on_host`).
"""

from __future__ import annotations

import dataclasses
import keyword
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.export.graph_signature import OutputKind

from backends.strict_devices import Site, schema_name
from backends.torch.source.layout import Layout, tensor_placeholders
from backends.torch.saved_on_host import held_ops
from backends.torch.source.recompute import Statement, checkpoint_runs
from backends.torch.source.template import (
    IDENT, Names, comment_text, device_literal, device_tag, joined, literal, torch_name, wrapped,
)
from backends.torch.streaming import STREAMER_ATTR
from partitioner.errors import HetpartError, PlanMismatch, UnsupportedOp


_BINARY = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/",
           operator.floordiv: "//", operator.mod: "%", operator.pow: "**", operator.eq: "==",
           operator.ne: "!=", operator.lt: "<", operator.le: "<=", operator.gt: ">",
           operator.ge: ">=", operator.and_: "&", operator.or_: "|"}


@dataclasses.dataclass(frozen=True)
class Body:
    """What the printer made of the graph."""

    inputs: list[str]         # forward's parameters after self
    weights: list[str]        # lines reading parameters and buffers
    lines: list[str]          # the parts, buffer updates and the return
    out_spec: str | None      # the output's tree spec (JSON) when the return needs it
    sites: dict[int, Site] = dataclasses.field(default_factory=dict)  # index in lines -> what it does
    checkpoints: bool = False  # recomputed runs call torch.utils.checkpoint
    holds: bool = False        # ops whose saved activations the host holds call hetpart's run_holding


@dataclasses.dataclass
class _Part:
    device: str
    lines: list[str] = dataclasses.field(default_factory=list)
    sites: list[Site | None] = dataclasses.field(default_factory=list)  # beside lines
    defined: list[str] = dataclasses.field(default_factory=list)   # values to free after the part
    used: set[str] = dataclasses.field(default_factory=set)
    statements: list[Statement] = dataclasses.field(default_factory=list)  # one per op, in order


class ForwardPrinter:
    """Prints the forward of the lifted graph in the plan's issue order (see the module docstring)."""

    def __init__(self, plan: Any, program: Any, layout: Layout, names: Names) -> None:
        self.plan, self.program, self.layout, self.names = plan, program, layout, names
        self.graph = program.graph_module.graph
        self.targets = tensor_placeholders(program)
        self.target_of = {node: target for target, node in self.targets.items()}
        self.streamed = {t for t, _ in layout.streamed}
        self.var: dict[torch.fx.Node, str] = {}
        self.copies: dict[tuple[torch.fx.Node, str, bool], str] = {}
        self.inputs: list[str] = []
        self.weights: list[str] = []
        self.held = held_ops(plan)

    def lines(self) -> Body:
        """The forward's parameters, its weights block and its body, part by part."""
        self._name_placeholders()
        parts = self._parts(_issue_order(self.graph, self.plan.schedule))
        tail = _Part("")
        tail.lines, out_spec = self._epilogue(tail)
        checkpoints = checkpoint_runs(parts, tail.used, self.plan, lambda: self.names.make("recompute", "recompute_"))
        body: list[str] = []
        sites: dict[int, Site] = {}
        freed: set[str] = set()
        for i, part in enumerate(parts):
            body += [""] if body else []
            sites.update({len(body) + j: site for j, site in enumerate(part.sites) if site is not None})
            body += part.lines
            if i + 1 == len(parts):
                break
            later = set().union(tail.used, *(p.used for p in parts[i + 1:]))
            dead = [v for p in parts[: i + 1] for v in p.defined if v not in later and v not in freed]
            freed.update(dead)
            if dead:  # values no later part reads: free them, as the fx code of plan.emit does
                body += wrapped("del ", dead)
        return Body(self.inputs, self.weights, body + [""] + tail.lines, out_spec, sites, checkpoints, bool(self.held))

    # -- naming ----------------------------------------------------------------------------------

    def _name_placeholders(self) -> None:
        for node in self.graph.nodes:
            if node.op != "placeholder":
                continue
            target = self.target_of.get(node)
            if target is None:
                self.var[node] = self.names.make(node.name, "x")
                self.inputs.append(self.var[node])
            elif node.users and (target not in self.streamed or  # read in place, or copied by a tied reader
                                 any(u.name not in self.plan.weights for u in node.users if u.op != "output")):
                self.var[node] = self.names.make(joined(target), "w")
                self.weights.append(f"{self.var[node]} = _get(self, {ascii(target)})")
        _check_inputs(self.program, len(self.inputs))

    # -- the parts -------------------------------------------------------------------------------

    def _parts(self, order: Sequence[torch.fx.Node]) -> list[_Part]:
        parts: list[_Part] = []
        module = None
        for node in order:
            device = self.plan.placement.get(node.name, parts[-1].device if parts else "")
            if not parts or device != parts[-1].device:
                parts.append(_Part(device, [self._header(len(parts) + 1, device)], [None]))
                module = None
            part = parts[-1]
            start, first, outer = len(part.lines), len(part.defined), part.used
            part.used = set()
            self._statement(node, part)  # any transfers, then the call: the module comment goes between
            path = self.plan.modules.get(node.name, "")
            if path and path != module:
                part.lines.insert(len(part.lines) - 1, f"# {comment_text(path)}")
                part.sites.insert(len(part.sites) - 1, None)
            module = path or module
            part.statements.append(Statement(node, start, len(part.lines), part.defined[first:], part.used))
            part.used = outer | part.used
        return parts

    def _header(self, index: int, device: str) -> str:
        physical = self.layout.binding.get(device, device)
        bound = "" if physical == device else f" (bound to {comment_text(physical)})"
        return f"# --- part {index} on {comment_text(device)}{bound} ---"

    def _statement(self, node: torch.fx.Node, part: _Part) -> None:
        device = self.plan.placement.get(node.name)
        args = {a: self.var[a] if device is None else self._fetch(a, device, part, node.name in self.plan.weights)
                for a in node.all_input_nodes}
        expr = self._call(node, args, device)
        if node.name in self.held and device is not None:
            expr = self._holding(node, expr, device)
        site = Site(op=node.name, call=schema_name(node.target)) if device is not None else None
        item = _item_of(node)
        if item is not None and device is not None and self.plan.placement.get(item[0].name, device) != device:
            # an item of a multi-output op placed elsewhere: copied to its own device as it is taken
            expr = f"{expr}.to({self.layout.device_var[device]})"
            source, index = item
            many = len(pytree.tree_leaves(source.meta.get("val"))) > 1
            site = site._replace(tensor=f"{source.name}.{index}" if many else source.name)
        out = self.names.make(node.name, "v")
        self.var[node] = out
        part.lines.append(f"{out} = {expr}")
        part.sites.append(site)
        part.defined.append(out)
        part.used.update(args.values())

    def _holding(self, node: torch.fx.Node, expr: str, device: str) -> str:
        """``torch.ops.a.b.c(x, y)`` as ``run_holding(DEVICE_CPU, DEVICE_CUDA_0, torch.ops.a.b.c, x, y)``: the
        op under saved-tensor hooks that keep what autograd saves on the host (:mod:`backends.torch.saved_on_host`)."""
        if not expr.startswith("torch.ops.") or not expr.endswith(")"):
            raise UnsupportedOp(f"node {node.name} ({ascii(str(node.target))}) holds its saved activations on the host, "
                                f"which the generated file writes for aten operators only; use plan.emit instead")
        fn, _, inner = expr.partition("(")
        host = self.layout.device_var[self.plan.devices.host_device().name]
        return f"run_holding({host}, {self.layout.device_var[device]}, {fn}{', ' if inner != ')' else ''}{inner}"

    def _fetch(self, arg: torch.fx.Node, device: str, part: _Part, streams: bool) -> str:
        """The name of ``arg`` on ``device``: itself, or a copy made once per value and device (a
        streamed weight is fetched by the op streaming it; another reader copies it from the host)."""
        target = self.target_of.get(arg)
        streamed = streams and target is not None and target in self.streamed
        if not streamed and (not _is_tensor(arg) or self._device_of(arg, target) == device):
            return self.var[arg]
        key = (arg, device, streamed)
        if key not in self.copies:
            device_var = self.layout.device_var[device]
            tag = device_tag(device)
            if streamed:
                name = self.names.make(f"{joined(target)}_{tag}" if joined(target) and tag else "", "w")
                part.lines.append(f"{name} = self.{STREAMER_ATTR}.get({ascii(target)}, {device_var})")
            else:
                source = self.var[arg]
                name = self.names.make(f"{source}_{tag}" if tag else "", "v")
                part.lines.append(f"{name} = {source}.to({device_var})")
                part.used.add(source)
            part.sites.append(Site(tensor=target if target is not None else arg.name, kind="weights" if streamed else ""))
            part.defined.append(name)
            self.copies[key] = name
        return self.copies[key]

    def _device_of(self, node: torch.fx.Node, target: str | None) -> str | None:
        if node.op == "placeholder":  # inputs arrive wherever the caller keeps them: always copied
            return self.layout.target_device.get(target) if target is not None else None
        return self.plan.placement.get(node.name)

    def _call(self, node: torch.fx.Node, names: Mapping[torch.fx.Node, str], device: str | None) -> str:
        def arg(value: Any, key: str | None = None) -> str:
            return self._arg(value, names, device if key == "device" else None)

        target = node.target
        if target is operator.getitem:
            return f"{arg(node.args[0])}[{arg(node.args[1])}]"
        if target in _BINARY and len(node.args) == 2 and not node.kwargs:
            return f"{arg(node.args[0])} {_BINARY[target]} {arg(node.args[1])}"
        if not isinstance(target, torch._ops.OpOverload):
            raise UnsupportedOp(f"node {node.name} calls {ascii(str(target))}, which emit_source cannot write "
                                f"as source (only aten operators and getitem); use plan.emit instead")
        spelled = str(target).split(".")
        if len(spelled) != 3 or not all(IDENT.fullmatch(p) and not keyword.iskeyword(p) for p in spelled):
            raise UnsupportedOp(f"node {node.name} calls operator {ascii(str(target))}, whose name is not "
                                f"namespace.op.overload; use plan.emit instead")
        items = [arg(a, "device" if isinstance(a, torch.device) else None) for a in node.args]
        for key, value in node.kwargs.items():
            if not IDENT.fullmatch(key) or keyword.iskeyword(key):
                raise UnsupportedOp(f"node {node.name} passes keyword {ascii(key)}, not an identifier")
            items.append(f"{key}={arg(value, key)}")
        return f"torch.ops.{'.'.join(spelled)}({', '.join(items)})"

    def _arg(self, value: Any, names: Mapping[torch.fx.Node, str], device: str | None) -> str:
        """An argument: a value's name, a literal, or a torch constant; ``device`` rebinds factories."""
        if isinstance(value, torch.fx.Node):
            return names[value]
        if isinstance(value, torch.device):
            return self.layout.device_var[device] if device is not None else device_literal(value)
        if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
            return torch_name(value)
        if isinstance(value, (list, tuple)):
            inner = [self._arg(v, names, None) for v in value]
            if isinstance(value, list):
                return f"[{', '.join(inner)}]"
            return f"({inner[0]},)" if len(inner) == 1 else f"({', '.join(inner)})"
        if isinstance(value, slice):
            return f"slice({', '.join(self._arg(v, names, None) for v in (value.start, value.stop, value.step))})"
        if value is Ellipsis:
            return "..."
        return literal(value)

    # -- the end: buffer updates and the return --------------------------------------------------

    def _epilogue(self, tail: _Part) -> tuple[list[str], str | None]:
        """Buffer updates and the return; the output's tree spec as JSON when a plain return cannot say it."""
        outputs = self.graph.output_node().args[0]
        lines: list[str] = []
        user: list[str] = []
        for spec, value in zip(self.program.graph_signature.output_specs, outputs, strict=True):
            expr = self._arg(value, self.var, None)
            if isinstance(value, torch.fx.Node):
                tail.used.add(expr)
            if spec.kind is OutputKind.BUFFER_MUTATION:
                lines.append(f"_get(self, {ascii(spec.target)}).copy_({expr})  # the graph updates this buffer")
            elif spec.kind is OutputKind.USER_OUTPUT:
                user.append(expr)
            else:
                raise UnsupportedOp(f"the captured graph has a {spec.kind.name.lower()} output, which "
                                    f"emit_source cannot write; use plan.emit")
        line, spec = _return(user, self.program.call_spec.out_spec)
        return lines + [line], spec


def _issue_order(graph: torch.fx.Graph, schedule: Sequence[str]) -> list[torch.fx.Node]:
    """Calls in the plan's schedule order; a call the plan does not list comes right after its inputs."""
    calls = {n.name: n for n in graph.nodes if n.op == "call_function"}
    scheduled = {name for name in schedule if name in calls}
    done: set[torch.fx.Node] = set()
    order: list[torch.fx.Node] = []

    def issue(node: torch.fx.Node) -> None:
        for arg in node.all_input_nodes:
            if arg.op == "call_function" and arg not in done:
                if arg.name in scheduled:
                    raise PlanMismatch(f"the plan's schedule runs {node.name} before its input {arg.name}")
                issue(arg)
        order.append(node)
        done.add(node)

    for name in schedule:
        if name in calls and calls[name] not in done:
            issue(calls[name])
    for node in calls.values():
        if node not in done:
            scheduled.discard(node.name)
            issue(node)
    return order


def _item_of(node: torch.fx.Node) -> tuple[torch.fx.Node, int] | None:
    """(multi-output node, index) when ``node`` takes an item of a tuple; None otherwise."""
    if node.target is not operator.getitem or not isinstance(node.args[0], torch.fx.Node):
        return None
    source, index = node.args[0], node.args[1]
    return (source, index) if not _is_tensor(source) and isinstance(index, int) else None


def _is_tensor(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    return node.op in ("placeholder", "call_function") if val is None else isinstance(val, torch.Tensor)


def _check_inputs(program: Any, count: int) -> None:
    """The file's forward takes positional tensors: the capture's input spec must say just that."""
    spec = program.call_spec.in_spec
    args, kwargs = spec.children() if spec is not None and spec.num_children == 2 else (None, None)
    flat = args is not None and not kwargs.num_leaves and all(c.is_leaf() for c in args.children())
    if not flat or args.num_leaves != count:
        raise HetpartError("emit_source writes forward(self, *tensors): the model's forward takes nested or "
                           "keyword inputs; wrap it in a module whose forward takes tensors positionally")


def _return(values: list[str], spec: Any) -> tuple[str, str | None]:
    """The return statement, and the tree spec (JSON) it needs when the output is nested."""
    if spec is None or spec.is_leaf():
        return (f"return {values[0]}" if len(values) == 1 else f"return ({', '.join(values)})"), None
    if spec.type in (tuple, list) and all(c.is_leaf() for c in spec.children()):
        inner = ", ".join(values)
        if spec.type is list:
            return f"return [{inner}]", None
        return (f"return ({inner},)" if len(values) == 1 else f"return ({inner})"), None
    try:
        dumped = pytree.treespec_dumps(spec)
    except Exception as err:  # torch raises several types for unregistered node types
        raise HetpartError(f"the model returns a {spec.type.__name__}, which emit_source cannot rebuild: "
                           f"{err}; return tensors, tuples, lists or dicts") from err
    return f"return pytree.tree_unflatten([{', '.join(values)}], _OUT_SPEC)", dumped
