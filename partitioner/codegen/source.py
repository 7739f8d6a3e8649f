"""Code generation as source: a plan becomes one readable Python file that runs its placement.

In: a :class:`~partitioner.plan.Plan`, the model it was made for, and a binding of the plan's
logical devices to real ones (as for :func:`~partitioner.codegen.torch_module.emit_module`).
Out: the text of a Python module (:func:`source_text`) or that file written atomically
(:func:`emit_source`). The file holds

* a header comment with the plan's metadata (model, fingerprint, profile, objective, prediction,
  binding), one ``DEVICE_*`` constant per logical device (edit it to re-bind), a few helpers;
* ``class PartitionedModel(torch.nn.Module)``: ``__init__`` re-creates the model's parameter and
  buffer tree under the same qualified names (empty tensors on their devices; tied tensors
  registered once and aliased), so ``load_state_dict(model.state_dict())`` fills it; ``forward``
  is the captured aten graph in the plan's issue order, one commented part per device run, with
  an explicit ``.to(DEVICE_...)`` wherever a value crosses logical devices and streamed weights
  fetched through hetpart's :class:`~partitioner.codegen.prefetch.WeightStreamer`;
* ``def build() -> PartitionedModel``.

It behaves as ``plan.emit(model, device_map)``: same parameter homes, streamed weights, issue
order and factory devices; transfers are written per *logical* device pair, so a copy between
two devices bound to one physical device is a no-op rather than absent.

Safety: nothing the model or the plan file supplies (module and parameter names, node names, the
model name, device names) is pasted into code. Identifiers are generated or pass a strict
``[A-Za-z_][A-Za-z0-9_]*`` filter with a uniqueness suffix; names appear only as ``ascii()``
string literals, and in comments only when they are plain (``[A-Za-z0-9_.:/+-]``) or else as an
``ascii()`` literal, so no newline can end a comment. The file is generated from the exported
program's *lifted* graph, never from ``ExportedProgram.module()``, whose fx-generated code
embeds attribute names between quotes unescaped.
"""

from __future__ import annotations

import builtins
import dataclasses
import keyword
import logging
import math
import operator
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.export.graph_signature import InputKind, OutputKind

from partitioner.codegen.binding import bind_devices
from partitioner.codegen.torch_module import STREAMER_ATTR, capture_for
from partitioner.files import refuse_overwrite, write_atomic
from partitioner.errors import HetpartError, PlanMismatch, UnsupportedOp, VerificationError

log = logging.getLogger(__name__)

CLASS_NAME = "PartitionedModel"
LITERAL_LIMIT = 4096  # largest non-persistent buffer or constant written out element by element

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PLAIN_TEXT = re.compile(r"[A-Za-z0-9_.:/+\-]+")   # safe in a comment as is
_TORCH_NAME = re.compile(r"torch\.[A-Za-z_][A-Za-z0-9_]*")  # str() of a dtype, layout, memory format
_HELPERS = ("_submodule", "_parameter", "_buffer", "_alias", "_get")
_RESERVED = frozenset(
    set(dir(builtins)) | {"self", "torch", "pytree", "WeightStreamer", CLASS_NAME, "build", "_OUT_SPEC", *_HELPERS}
)
_BINARY = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/",
           operator.floordiv: "//", operator.mod: "%", operator.pow: "**", operator.eq: "==",
           operator.ne: "!=", operator.lt: "<", operator.le: "<=", operator.gt: ">",
           operator.ge: ">=", operator.and_: "&", operator.or_: "|"}


def emit_source(
    plan: Any,
    model: torch.nn.Module,
    path: str | os.PathLike[str],
    device_map: Mapping[str, str] | None = None,
    *,
    example_inputs: Any = None,
    force: bool = False,
) -> Path:
    """Write the Python file that runs ``plan`` (see the module docstring); returns its path.

    Raises:
        HetpartError: ``path`` exists and ``force`` is false, or it cannot be written; a device is
            not present and not bound; the plan was not captured with torch.export.
        PlanMismatch: the model is not the one the plan was made for.
        UnsupportedOp: the graph holds a call the file cannot spell (a higher-order op).

    Example:
        >>> emit_source(plan, model, "placed.py", {"cuda:0": "cpu"})   # doctest: +SKIP
        PosixPath('placed.py')
    """
    path = Path(path)
    refuse_overwrite([path], force=force)
    text = source_text(plan, model, device_map, example_inputs=example_inputs)
    write_atomic(path, text.encode("utf-8"))
    log.info("wrote %s (%d lines)", path, text.count("\n"))
    return path


def source_text(
    plan: Any,
    model: torch.nn.Module,
    device_map: Mapping[str, str] | None = None,
    *,
    example_inputs: Any = None,
) -> str:
    """The text of the file :func:`emit_source` writes, checked to compile.

    Example:
        >>> "class PartitionedModel" in source_text(plan, model, {"cuda:0": "cpu"})   # doctest: +SKIP
        True
    """
    if plan.capture != "export":
        raise HetpartError(f"emit_source needs a plan captured with torch.export, not {plan.capture!r}: "
                           f"re-plan with capture='export' (CLI: --capture export)")
    binding = bind_devices(plan, device_map)
    program = capture_for(plan, model, example_inputs).source
    names = _Names()
    layout = _layout(plan, model, program, binding, names)
    text = _render(plan, layout, _Forward(plan, program, layout, names).lines())
    try:
        compile(text, "<hetpart source>", "exec", dont_inherit=True)
    except SyntaxError as err:  # a generator bug, never the user's: say where
        raise VerificationError(f"generated source does not compile at line {err.lineno}: {err.msg}") from err
    return text


# --------------------------------------------------------------------------------------------
# Names and literals
# --------------------------------------------------------------------------------------------


class _Names:
    """Identifiers of one generated file: strict, unique, never a keyword, builtin or helper."""

    def __init__(self) -> None:
        self._used: set[str] = set()
        self._counters: dict[str, int] = {}

    def make(self, candidate: str, prefix: str) -> str:
        """``candidate`` if it is a plain identifier (plus ``_1``... when taken), else ``prefix<n>``."""
        if not _IDENT.fullmatch(candidate) or candidate.startswith("__") or len(candidate) > 64:
            n = self._counters.get(prefix, 0)
            self._counters[prefix] = n + 1
            candidate = f"{prefix}{n}"
        name, i = candidate, 1
        while name in self._used or name in _RESERVED or keyword.iskeyword(name):
            name, i = f"{candidate}_{i}", i + 1
        self._used.add(name)
        return name


def _text(value: Any) -> str:
    """``value`` for a comment: as is when plain, else its ``ascii()`` literal (no line breaks)."""
    value = str(value)
    return value if _PLAIN_TEXT.fullmatch(value) else ascii(value)


def _joined(qualified: str) -> str:
    """``blocks.0.ln1.weight`` → ``blocks_0_ln1_weight``; "" when a component is not plain."""
    parts = qualified.split(".")
    return "_".join(parts) if all(re.fullmatch(r"[A-Za-z0-9_]+", p) for p in parts) else ""


def _device_tag(device: str) -> str:
    """``cuda:0`` → ``cuda_0`` for identifiers; "" when the name holds anything else."""
    return device.replace(":", "_") if re.fullmatch(r"[A-Za-z0-9_:]+", device) else ""


def _literal(value: Any) -> str:
    """A Python literal for a number, bool, None or (nested) list / tuple of them."""
    if value is None or isinstance(value, (bool, int)):
        return repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else f'float("{value}")'
    if isinstance(value, str):
        return ascii(value)
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_literal(v) for v in value)
        if isinstance(value, tuple):
            return f"({inner},)" if len(value) == 1 else f"({inner})"
        return f"[{inner}]"
    raise HetpartError(f"cannot write {type(value).__name__} value {value!r} as a literal")


def _torch_name(value: Any) -> str:
    """``torch.float32``, ``torch.strided``, ``torch.contiguous_format`` (checked, never pasted)."""
    text = str(value)
    if not _TORCH_NAME.fullmatch(text):
        raise HetpartError(f"cannot spell {type(value).__name__} {text!r} in generated source")
    return text


# --------------------------------------------------------------------------------------------
# Layout: devices, the tensor tree, homes and streamed weights
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Tensor:
    """One line of ``__init__``: a parameter or buffer (or an alias of one) at a qualified name."""

    qualified: str
    value: torch.Tensor
    kind: str                 # "parameter" | "buffer"
    persistent: bool          # buffers: saved in the state_dict
    device: str | None        # logical home; None: the tensor's own device (no op reads it)
    alias_of: str | None      # the first name of a tied tensor


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Where everything lives, in the plan's logical devices."""

    binding: Mapping[str, str]           # logical device -> physical device
    device_var: Mapping[str, str]        # logical device -> DEVICE_* identifier
    tensors: tuple[_Tensor, ...]         # __init__'s registrations, in state_dict order
    target_device: Mapping[str, str]     # placeholder target -> logical device of its tensor
    streamed: tuple[tuple[str, str], ...]  # (target, logical device computing with it), issue order


def _layout(plan: Any, model: torch.nn.Module, program: Any, binding: Mapping[str, str], names: _Names) -> _Layout:
    device_var = {d: names.make(f"DEVICE_{_device_tag(d).upper()}" if _device_tag(d) else "", "DEVICE_")
                  for d in binding}
    targets = _tensor_placeholders(program)
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
    return _Layout(binding, device_var, tensors + constants, target_device, _streamed(plan, targets))


def _tensor_placeholders(program: Any) -> dict[str, torch.fx.Node]:
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
    """Each read tensor's logical home: its first reader's device, or where its streamed weights live."""
    homes: dict[str, str] = {}
    for target, node in targets.items():
        readers = [u.name for u in node.users if u.op != "output" and u.name in plan.placement]
        if readers:
            owner = readers[0]
            homes[target] = plan.weights.get(owner, plan.placement[owner])
    return homes


def _streamed(plan: Any, targets: Mapping[str, torch.fx.Node]) -> tuple[tuple[str, str], ...]:
    position = {op: i for i, op in enumerate(plan.schedule)}
    out: list[tuple[int, str, str]] = []
    for target, node in targets.items():
        for user in node.users:
            if user.name in plan.weights:
                out.append((position.get(user.name, 0), target, plan.placement[user.name]))
                break
    return tuple((t, d) for _, t, d in sorted(out))


def _tensor_tree(model: torch.nn.Module, home_by_id: Mapping[int, str]) -> tuple[_Tensor, ...]:
    """Every parameter and buffer in state_dict order; a tensor seen before becomes an alias."""
    first_name: dict[int, str] = {}
    out: list[_Tensor] = []
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
            out.append(_Tensor(qualified, tensor, kind, persistent, home_by_id.get(id(tensor)),
                               alias if alias != qualified else None))
    return tuple(out)


def _constants(program: Any, by_name: Mapping[str, torch.Tensor], homes: Mapping[str, str]) -> tuple[_Tensor, ...]:
    """Tensors the capture lifted that the model does not list: registered as non-persistent buffers."""
    out = []
    for spec in program.graph_signature.input_specs:
        if spec.kind is InputKind.CONSTANT_TENSOR and spec.target not in by_name:
            value = program.constants[spec.target]
            out.append(_Tensor(spec.target, value, "buffer", False, homes.get(spec.target), None))
    return tuple(out)


# --------------------------------------------------------------------------------------------
# __init__: the tensor tree
# --------------------------------------------------------------------------------------------


def _init_lines(layout: _Layout) -> list[str]:
    lines = []
    for t in layout.tensors:
        device = layout.device_var[t.device] if t.device else _device_literal(t.value.device)
        name = ascii(t.qualified)
        if t.alias_of is not None:
            extra = "" if t.kind == "parameter" or t.persistent else ", persistent=False"
            lines.append(f"_alias(self, {name}, {ascii(t.alias_of)}{extra})")
        elif t.kind == "parameter":
            grad = "" if t.value.requires_grad else ", requires_grad=False"
            lines.append(f"_parameter(self, {name}, {_empty(t.value, device)}{grad})")
        elif t.persistent:
            lines.append(f"_buffer(self, {name}, {_empty(t.value, device)})")
        else:  # not in the state_dict: its value is part of the file
            lines.append(f"_buffer(self, {name}, {_value(t.qualified, t.value, device)}, persistent=False)")
    if layout.streamed:
        pairs = ", ".join(f"({ascii(t)}, str({layout.device_var[d]}))" for t, d in layout.streamed)
        lines.append(f"self.{STREAMER_ATTR} = WeightStreamer(self, [{pairs}])")
    return lines


def _device_literal(device: torch.device) -> str:
    """A tensor no op reads stays on the model's device (the host when the model is on meta)."""
    return f'torch.device({ascii("cpu" if device.type == "meta" else str(device))})'


def _empty(value: torch.Tensor, device: str) -> str:
    return f"torch.empty({_literal(tuple(value.shape))}, dtype={_torch_name(value.dtype)}, device={device})"


def _value(qualified: str, value: torch.Tensor, device: str) -> str:
    """An expression for a tensor's value: ``arange``, ``full`` or the elements written out."""
    if value.is_meta:
        raise HetpartError(f"buffer {ascii(qualified)} is not saved in the state_dict and the model is on "
                           f"the meta device: its value must be written into the file; build the model "
                           f"with real tensors")
    flat = value.detach().to("cpu").reshape(-1)
    shape, dtype, n = _literal(tuple(value.shape)), _torch_name(value.dtype), flat.numel()
    tail = f"dtype={dtype}, device={device}"
    counting = n and value.dtype != torch.bool and not value.is_complex()
    if counting and torch.equal(flat, torch.arange(n, dtype=value.dtype)):
        return f"torch.arange({n}, {tail}).reshape({shape})"
    if n > 1 and not value.is_complex() and bool((flat == flat[0]).all()):
        return f"torch.full({shape}, {_literal(flat[0].item())}, {tail})"
    if n > LITERAL_LIMIT or value.is_complex():
        raise HetpartError(f"buffer {ascii(qualified)} ({n} elements) is not saved in the state_dict, so "
                           f"its value must be written into the file, and it is too large (over "
                           f"{LITERAL_LIMIT}) or complex; register it as a persistent buffer")
    return f"torch.tensor({_literal(value.detach().to('cpu').tolist())}, {tail})"


# --------------------------------------------------------------------------------------------
# forward: the graph, part by part
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Body:
    """What the printer made of the graph."""

    inputs: list[str]         # forward's parameters after self
    weights: list[str]        # lines reading parameters and buffers
    lines: list[str]          # the parts, buffer updates and the return
    out_spec: str | None      # the output's tree spec (JSON) when the return needs it


@dataclasses.dataclass
class _Part:
    device: str
    lines: list[str] = dataclasses.field(default_factory=list)
    defined: list[str] = dataclasses.field(default_factory=list)   # values to free after the part
    used: set[str] = dataclasses.field(default_factory=set)


class _Forward:
    """Prints the forward of the lifted graph in the plan's issue order (see the module docstring)."""

    def __init__(self, plan: Any, program: Any, layout: _Layout, names: _Names) -> None:
        self.plan, self.program, self.layout, self.names = plan, program, layout, names
        self.graph = program.graph_module.graph
        self.targets = _tensor_placeholders(program)
        self.target_of = {node: target for target, node in self.targets.items()}
        self.streamed = {t for t, _ in layout.streamed}
        self.var: dict[torch.fx.Node, str] = {}
        self.copies: dict[tuple[torch.fx.Node, str], str] = {}
        self.inputs: list[str] = []
        self.weights: list[str] = []

    def lines(self) -> _Body:
        """The forward's parameters, its weights block and its body, part by part."""
        self._name_placeholders()
        parts = self._parts(_issue_order(self.graph, self.plan.schedule))
        tail = _Part("")
        tail.lines, out_spec = self._epilogue(tail)
        body: list[str] = []
        freed: set[str] = set()
        for i, part in enumerate(parts):
            body += ([""] if body else []) + part.lines
            if i + 1 == len(parts):
                break
            later = set().union(tail.used, *(p.used for p in parts[i + 1:]))
            dead = [v for p in parts[: i + 1] for v in p.defined if v not in later and v not in freed]
            freed.update(dead)
            if dead:  # values no later part reads: free them, as the fx code of plan.emit does
                body += _wrapped("del ", dead)
        return _Body(self.inputs, self.weights, body + [""] + tail.lines, out_spec)

    # -- naming ----------------------------------------------------------------------------------

    def _name_placeholders(self) -> None:
        for node in self.graph.nodes:
            if node.op != "placeholder":
                continue
            target = self.target_of.get(node)
            if target is None:
                self.var[node] = self.names.make(node.name, "x")
                self.inputs.append(self.var[node])
            elif target not in self.streamed and node.users:
                self.var[node] = self.names.make(_joined(target), "w")
                self.weights.append(f"{self.var[node]} = _get(self, {ascii(target)})")
        _check_inputs(self.program, len(self.inputs))

    # -- the parts -------------------------------------------------------------------------------

    def _parts(self, order: Sequence[torch.fx.Node]) -> list[_Part]:
        parts: list[_Part] = []
        module = None
        for node in order:
            device = self.plan.placement.get(node.name, parts[-1].device if parts else "")
            if not parts or device != parts[-1].device:
                parts.append(_Part(device, [self._header(len(parts) + 1, device)]))
                module = None
            part = parts[-1]
            self._statement(node, part)  # any transfers, then the call: the module comment goes between
            path = self.plan.modules.get(node.name, "")
            if path and path != module:
                part.lines.insert(len(part.lines) - 1, f"# {_text(path)}")
            module = path or module
        return parts

    def _header(self, index: int, device: str) -> str:
        physical = self.layout.binding.get(device, device)
        bound = "" if physical == device else f" (bound to {_text(physical)})"
        return f"# --- part {index} on {_text(device)}{bound} ---"

    def _statement(self, node: torch.fx.Node, part: _Part) -> None:
        device = self.plan.placement.get(node.name)
        args = {a: self.var[a] if device is None else self._fetch(a, device, part) for a in node.all_input_nodes}
        expr = self._call(node, args, device)
        out = self.names.make(node.name, "v")
        self.var[node] = out
        part.lines.append(f"{out} = {expr}")
        part.defined.append(out)
        part.used.update(args.values())

    def _fetch(self, arg: torch.fx.Node, device: str, part: _Part) -> str:
        """The name of ``arg`` on ``device``: itself, or a copy made once per value and device."""
        target = self.target_of.get(arg)
        streamed = target is not None and target in self.streamed
        if not streamed and (not _is_tensor(arg) or self._device_of(arg, target) == device):
            return self.var[arg]
        key = (arg, device)
        if key not in self.copies:
            device_var = self.layout.device_var[device]
            tag = _device_tag(device)
            if streamed:
                name = self.names.make(f"{_joined(target)}_{tag}" if _joined(target) and tag else "", "w")
                part.lines.append(f"{name} = self.{STREAMER_ATTR}.get({ascii(target)}, {device_var})")
            else:
                source = self.var[arg]
                name = self.names.make(f"{source}_{tag}" if tag else "", "v")
                part.lines.append(f"{name} = {source}.to({device_var})")
                part.used.add(source)
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
        if len(spelled) != 3 or not all(_IDENT.fullmatch(p) and not keyword.iskeyword(p) for p in spelled):
            raise UnsupportedOp(f"node {node.name} calls operator {ascii(str(target))}, whose name is not "
                                f"namespace.op.overload; use plan.emit instead")
        items = [arg(a) for a in node.args]
        for key, value in node.kwargs.items():
            if not _IDENT.fullmatch(key) or keyword.iskeyword(key):
                raise UnsupportedOp(f"node {node.name} passes keyword {ascii(key)}, not an identifier")
            items.append(f"{key}={arg(value, key)}")
        return f"torch.ops.{'.'.join(spelled)}({', '.join(items)})"

    def _arg(self, value: Any, names: Mapping[torch.fx.Node, str], device: str | None) -> str:
        """An argument: a value's name, a literal, or a torch constant; ``device`` rebinds factories."""
        if isinstance(value, torch.fx.Node):
            return names[value]
        if isinstance(value, torch.device):
            return self.layout.device_var[device] if device is not None else _device_literal(value)
        if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
            return _torch_name(value)
        if isinstance(value, (list, tuple)):
            inner = [self._arg(v, names, None) for v in value]
            if isinstance(value, list):
                return f"[{', '.join(inner)}]"
            return f"({inner[0]},)" if len(inner) == 1 else f"({', '.join(inner)})"
        if isinstance(value, slice):
            return f"slice({', '.join(self._arg(v, names, None) for v in (value.start, value.stop, value.step))})"
        if value is Ellipsis:
            return "..."
        return _literal(value)

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


def _wrapped(head: str, names: list[str], width: int = 88) -> list[str]:
    lines, line = [], head
    for i, name in enumerate(names):
        piece = name + (", " if i + 1 < len(names) else "")
        if len(line) + len(piece) > width and line != head:
            lines.append(line.rstrip() + " \\")
            line = "    "
        line += piece
    return lines + [line]


# --------------------------------------------------------------------------------------------
# The file
# --------------------------------------------------------------------------------------------

_HELPER_SOURCE = '''
def _submodule(root: torch.nn.Module, path: str) -> torch.nn.Module:
    """The module at a dotted path, creating empty containers on the way."""
    module = root
    for name in path.split(".") if path else ():
        if module._modules.get(name) is None:
            module.add_module(name, torch.nn.Module())
        module = module._modules[name]
    return module


def _parameter(root: torch.nn.Module, qualified: str, value: torch.Tensor, requires_grad: bool = True) -> None:
    """Register a parameter under its qualified name (names are data here, never code)."""
    owner, _, name = qualified.rpartition(".")
    _submodule(root, owner).register_parameter(name, torch.nn.Parameter(value, requires_grad=requires_grad))


def _buffer(root: torch.nn.Module, qualified: str, value: torch.Tensor, persistent: bool = True) -> None:
    """Register a buffer under its qualified name."""
    owner, _, name = qualified.rpartition(".")
    _submodule(root, owner).register_buffer(name, value, persistent=persistent)


def _alias(root: torch.nn.Module, qualified: str, source: str, persistent: bool = True) -> None:
    """Register the tensor already held at ``source`` under a second name (tied weights)."""
    tensor = _get(root, source)
    owner, _, name = qualified.rpartition(".")
    if isinstance(tensor, torch.nn.Parameter):
        _submodule(root, owner).register_parameter(name, tensor)
    else:
        _submodule(root, owner).register_buffer(name, tensor, persistent=persistent)


def _get(root: torch.nn.Module, qualified: str) -> torch.Tensor:
    """The parameter or buffer at a qualified name."""
    owner, _, name = qualified.rpartition(".")
    return getattr(root.get_submodule(owner), name)
'''


def _header(plan: Any, layout: _Layout) -> list[str]:
    total = plan.predicted.get("total_s")
    binding = ", ".join(f"{_text(d)} -> {_text(p)}" for d, p in layout.binding.items())
    mode = "training step" if plan.training else "inference"
    lines = [
        "# Generated by hetpart: the model placed by hand, as its plan says.",
        "#",
        f"# model        {_text(plan.model_name)}",
        f"# fingerprint  {_text(plan.fingerprint)}",
        f"# profile      {_text(plan.devices.name)}",
        f"# objective    {_text(plan.objective)} ({mode})",
        f"# predicted    {'unknown' if total is None else f'{total:.4g} s'} per step",
        f"# solver       {_text(plan.solver.name)} ({_text(plan.solver.status)})",
        f"# binding      {binding}",
        "#",
        "# Parameters are created empty: load the model's weights before use, e.g.",
        "#     module = build()",
        "#     module.load_state_dict(model.state_dict())",
        "#     outputs = module(*inputs)",
        "# The forward is the graph torch.export captured (in the mode the model was in then).",
    ]
    if layout.streamed:
        lines.append("# Streamed weights are fetched by hetpart's WeightStreamer: hetpart must be installed.")
    else:
        lines.append("# Needs only torch.")
    return lines


def _render(plan: Any, layout: _Layout, body: _Body) -> str:
    out = _header(plan, layout) + ['"""A model placed on several devices by hetpart (see the comment above)."""',
                                   "", "import torch"]
    if body.out_spec is not None:
        out.append("import torch.utils._pytree as pytree")
    if layout.streamed:
        out.append("from partitioner.codegen.prefetch import WeightStreamer  # hetpart's streamer")
    out += ["", "# The plan's devices and the devices they run on here (edit to re-bind)."]
    for device, var in layout.device_var.items():
        note = "" if layout.binding[device] == device else f"  # plan device {_text(device)}"
        out.append(f"{var} = torch.device({ascii(layout.binding[device])}){note}")
    if body.out_spec is not None:
        out.append(f"_OUT_SPEC = pytree.treespec_loads({ascii(body.out_spec)})")
    out += ["", *_HELPER_SOURCE.strip("\n").split("\n"), "", "",
            f"class {CLASS_NAME}(torch.nn.Module):",
            '    """Parameters on the devices that use them; forward issues the parts in order."""', "",
            "    def __init__(self) -> None:", "        super().__init__()",
            "        # parameters and buffers under the model's names, each created on its device"]
    out += [f"        {line}" for line in _init_lines(layout)]
    out += ["", f"    def forward({', '.join(['self', *body.inputs])}):"]
    if body.weights:
        out += ["        # parameters and buffers read in place (streamed weights are fetched per part)"]
        out += [f"        {line}" for line in body.weights] + [""]
    out += [f"        {line}" if line else "" for line in body.lines]
    out += ["", "", f"def build() -> {CLASS_NAME}:",
            f'    """A new {CLASS_NAME} with empty parameters: load the model\'s state_dict into it."""',
            f"    return {CLASS_NAME}()", ""]
    return "\n".join(out)
