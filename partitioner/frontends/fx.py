"""Torch front end: an ``nn.Module`` (or the GraphModule a torch.compile backend receives) → OpGraph.

In: a model and example inputs. Out: an :class:`~partitioner.ir.OpGraph` whose ops are the fx
``call_*`` nodes, with shapes, dtypes, FLOPs, bytes moved, module paths and parameter bytes.

Capture is ``torch.export`` (aten-level graph, the default) or ``torch.fx.symbolic_trace``
(module-level graph: one op per leaf module). Either way the graph is then run once on fake
tensors (no real compute, no memory for activations) while a dispatch mode records the aten
operators each node reaches; those give the node's cost class, its FLOPs and whether it is a
view. The caller's model and graph are never modified.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import operator
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from partitioner.errors import CaptureError
from partitioner.frontends.inputs import dynamic_dims, export_dynamic_shapes
from partitioner.frontends.names import check_fx_names
from partitioner.frontends.aten_costs import (
    GROUPED_MM, FlopTable, classify, conv_groups, dominant_class, grouped_weight_share, is_grouped_mm, op_name,
)
from partitioner.ir import NOT_A_TENSOR, Op, OpClass, OpGraph, Param, Tensor

log = logging.getLogger(__name__)


class Capture(str, enum.Enum):
    """How a module is turned into an fx graph."""

    EXPORT = "export"                  # torch.export.export (non-strict): aten ops, works on HF-style models
    SYMBOLIC_TRACE = "symbolic_trace"  # torch.fx.symbolic_trace: one node per leaf module / function call


# --------------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------------


def from_module(
    model: torch.nn.Module,
    example_inputs: Any,
    capture: Capture | str = Capture.EXPORT,
    *,
    name: str | None = None,
    dynamic_shapes: Any = None,
) -> OpGraph:
    """Capture ``model`` called on ``example_inputs`` as an OpGraph.

    Parameters:
        model: the module; it is not modified (not even put in eval mode).
        example_inputs: a tensor or a tuple of positional arguments.
        capture: ``"export"`` (torch.export, the default) or ``"symbolic_trace"``.
        name: the graph's name (default: the model's class name).
        dynamic_shapes: dimensions that may vary at run time (export only), in any form
            :func:`partitioner.frontends.inputs.dynamic_dims` reads, e.g. ``("batch", "seq")``;
            costs are those of the example sizes.

    Returns:
        The OpGraph, with ``graph.source`` holding the ExportedProgram or GraphModule.

    Raises:
        CaptureError: the capture failed; the message names the mode and suggests the other one.

    Example:
        >>> import models
        >>> model, inputs = models.get("mlp")
        >>> graph = from_module(model, inputs)
        >>> graph.total_flops() > 0
        True
    """
    mode = _capture_mode(capture)
    args = _as_args(example_inputs)
    name = name or type(model).__name__
    params = _ParamTable.of_module(model)
    dims = dynamic_dims(dynamic_shapes, args)
    if any(dims) and mode is not Capture.EXPORT:
        raise CaptureError("dynamic shapes need capture='export' (torch.export's Dim); "
                           "symbolic_trace records one shape")
    if mode is Capture.EXPORT:
        program = _export(model, args, export_dynamic_shapes(dims))
        source = _export_source(program, params, args)
    else:
        check_fx_names(model, "capture='symbolic_trace'",  # fx writes these names as code while tracing
                       hint="or capture with torch.export (capture='export', the default)")
        gm = _symbolic_trace(model)
        source = _Source(gm, program=gm, params=params, inputs=dict(zip(_placeholders(gm), args)), root=model)
        _check_arity(gm, args, "symbolic_trace")
    source.module_types = {path: type(m).__name__ for path, m in model.named_modules(remove_duplicate=False)}
    other = Capture.SYMBOLIC_TRACE if mode is Capture.EXPORT else Capture.EXPORT
    return _lower(source, name, f"{mode.value} captured {type(model).__name__}, but", f"try capture='{other.value}'")


def from_graph_module(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, name: str | None = None) -> OpGraph:
    """Lower the GraphModule a ``torch.compile`` backend receives (dynamo's graph) to an OpGraph.

    Placeholders whose example input is an ``nn.Parameter`` (dynamo lifts parameters to inputs)
    become parameters named after their module path; ``get_attr`` nodes read the module's own
    parameters and buffers; the other placeholders are the graph inputs.

    Example:
        >>> def backend(gm, example_inputs):
        ...     graph = from_graph_module(gm, example_inputs)
        ...     return gm.forward
    """
    args = tuple(example_inputs)
    _check_arity(gm, args, "the torch.compile graph")
    params = _ParamTable.of_module(gm)
    inputs: dict[str, Any] = {}
    param_placeholders: dict[str, str] = {}
    for ph, value in zip(_placeholders(gm), args):
        if isinstance(value, torch.nn.Parameter):
            param_placeholders[ph] = params.add(_dynamo_param_name(ph), value, trainable=value.requires_grad)
        else:
            inputs[ph] = value
    source = _Source(gm, program=gm, params=params, inputs=inputs, param_placeholders=param_placeholders, root=gm)
    return _lower(source, name or "compiled", "in the torch.compile graph,", "")


@contextlib.contextmanager
def capture_mode(model: Any, *, training: bool) -> Iterator[None]:
    """Capture a training plan's model in train mode, whatever mode the caller left it in.

    torch.export records the mode (batch norm and dropout become other ops), so ``plan
    --training``, ``emit`` of a training plan and ``check --training`` must all capture in train
    mode; each submodule's own flag is put back afterwards. For inference the model is captured
    in the mode it is in.

    Example:
        >>> with capture_mode(model, training=True):          # doctest: +SKIP
        ...     graph = from_module(model, inputs)
    """
    if not training or not isinstance(model, torch.nn.Module):
        yield
        return
    modes = [(m, m.training) for m in model.modules()]
    model.train()
    try:
        yield
    finally:
        for module, mode in modes:
            module.training = mode


# --------------------------------------------------------------------------------------------
# Capture
# --------------------------------------------------------------------------------------------


def _capture_mode(capture: Capture | str) -> Capture:
    try:
        return Capture(capture)
    except ValueError:
        raise CaptureError(
            f"unknown capture mode {capture!r}: use one of {', '.join(c.value for c in Capture)}"
        ) from None


def _as_args(example_inputs: Any) -> tuple:
    if isinstance(example_inputs, tuple):
        return example_inputs
    if isinstance(example_inputs, list):
        return tuple(example_inputs)
    return (example_inputs,)


def _export(model: torch.nn.Module, args: tuple, dynamic_shapes: Any = None) -> torch.export.ExportedProgram:
    try:
        return torch.export.export(model, args, dynamic_shapes=dynamic_shapes, strict=False)
    except Exception as exc:  # torch raises many types here; re-raised with the capture named
        raise CaptureError(
            f"torch.export could not capture {type(model).__name__}: {_first_line(exc)}\n"
            f"  try capture='symbolic_trace' (CLI: --capture symbolic_trace), which traces at module level"
        ) from exc


def _symbolic_trace(model: torch.nn.Module) -> torch.fx.GraphModule:
    try:
        return torch.fx.symbolic_trace(model)
    except Exception as exc:  # fx raises TraceError, TypeError, RuntimeError...; re-raised with the capture named
        raise CaptureError(
            f"torch.fx.symbolic_trace could not trace {type(model).__name__}: {_first_line(exc)}\n"
            f"  symbolic tracing cannot follow data-dependent Python control flow; "
            f"try capture='export' (CLI: --capture export)"
        ) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


def _placeholders(gm: torch.fx.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes if n.op == "placeholder"]


def _check_arity(gm: torch.fx.GraphModule, args: tuple, what: str) -> None:
    expected = len(_placeholders(gm))
    if expected != len(args):
        raise CaptureError(f"{what} takes {expected} inputs but {len(args)} example inputs were given")


def _export_source(program: torch.export.ExportedProgram, params: _ParamTable, args: tuple) -> _Source:
    from torch.export.graph_signature import InputKind

    user_values = iter(tree_leaves(args))
    inputs: dict[str, Any] = {}
    param_placeholders: dict[str, str] = {}
    for spec in program.graph_signature.input_specs:
        ph = spec.arg.name
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            canonical = params.canonical(spec.target)
            if canonical is None:  # a buffer export lifted that the module does not list (non-persistent)
                value = program.constants.get(spec.target, program.state_dict.get(spec.target))
                canonical = params.add(spec.target, value, trainable=False)
            param_placeholders[ph] = canonical
        elif spec.kind is InputKind.USER_INPUT:
            inputs[ph] = next(user_values)
        elif spec.kind is InputKind.CONSTANT_TENSOR:  # a plain tensor attribute: held like a buffer
            value = program.constants.get(spec.target)
            param_placeholders[ph] = params.canonical(spec.target) or params.add(spec.target, value, trainable=False)
        else:  # custom objects, tokens
            inputs[ph] = program.constants.get(spec.target)
    return _Source(
        program.graph_module, program=program, params=params, inputs=inputs, param_placeholders=param_placeholders
    )


# the frame's local the model came from (``l_self_``, ``l_args_0_`` under a decorator, ``l_mod_``):
# everything before the first ``_modules_`` / ``_parameters_`` / ``_buffers_``
_DYNAMO_PARAM = re.compile(r"^[LlGg]_.*?(?=_(?:modules|parameters|buffers)_)")


def _dynamo_param_name(placeholder: str) -> str:
    """``L_self_modules_layers_modules_0_modules_fc_parameters_weight_`` → ``layers.0.fc.weight``
    (``l_args_0_modules_...`` when a decorator's wrapper took the model as ``*args``)."""
    name = _DYNAMO_PARAM.sub("", placeholder).rstrip("_")
    name = re.sub(r"_(modules|parameters|buffers)_", ".", "_" + name)
    return name.lstrip("._") or placeholder


# --------------------------------------------------------------------------------------------
# Parameters: one record per storage, whatever its names
# --------------------------------------------------------------------------------------------


@dataclass
class _ParamEntry:
    name: str
    tensor: Any
    trainable: bool
    aliases: list[str] = field(default_factory=list)


class _ParamTable:
    """Parameters and buffers keyed by canonical name, with every alias (tied weights) resolved."""

    def __init__(self) -> None:
        self.entries: dict[str, _ParamEntry] = {}
        self._alias: dict[str, str] = {}
        self._by_id: dict[int, str] = {}

    @classmethod
    def of_module(cls, module: torch.nn.Module) -> _ParamTable:
        table = cls()
        for qual, p in module.named_parameters(remove_duplicate=False):
            table.add(qual, p, trainable=p.requires_grad)
        for qual, b in module.named_buffers(remove_duplicate=False):
            table.add(qual, b, trainable=False)
        return table

    def add(self, qual: str, tensor: Any, *, trainable: bool) -> str:
        """Register ``qual`` (an alias when its tensor is already known); returns the canonical name."""
        if qual in self._alias:
            return self._alias[qual]
        canonical = self._by_id.get(id(tensor))
        if canonical is None:
            self.entries[qual] = _ParamEntry(qual, tensor, trainable)
            self._by_id[id(tensor)] = qual
            canonical = qual
        elif qual != canonical:
            self.entries[canonical].aliases.append(qual)
        self._alias[qual] = canonical
        return canonical

    def canonical(self, qual: str) -> str | None:
        return self._alias.get(qual)


@dataclass
class _Source:
    """What a capture produced, in the form the lowering pass reads."""

    gm: torch.fx.GraphModule
    program: Any                      # the ExportedProgram or GraphModule kept as OpGraph.source
    params: _ParamTable
    inputs: dict[str, Any]            # placeholder name → example value (graph inputs)
    param_placeholders: dict[str, str] = field(default_factory=dict)  # placeholder → canonical param
    root: torch.nn.Module | None = None  # the module whose submodules call_module / get_attr name
    module_types: dict[str, str] = field(default_factory=dict)  # module path -> class name


# --------------------------------------------------------------------------------------------
# Lowering: run on fake tensors, record aten calls, build the IR
# --------------------------------------------------------------------------------------------


@dataclass
class _NodeRecord:
    value: Any
    classes: list[OpClass]
    flops: int
    aten_ops: list[str]
    groups: int = 1


class _Recorder(TorchDispatchMode):
    """Records every aten call made while one node runs: class, FLOPs, name."""

    def __init__(self, table: FlopTable) -> None:
        super().__init__()
        self.table = table
        self.classes: list[OpClass] = []
        self.flops = 0
        self.aten_ops: list[str] = []
        self.groups = 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's signature
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        namespace = getattr(func, "namespace", "aten")
        if namespace == "prim":  # prim.device and friends: metadata queries
            return out
        # an op of another library (a custom op) has no cost class: the documented fallback, OTHER
        cls = classify(func) if namespace == "aten" else OpClass.MATMUL if is_grouped_mm(func) else OpClass.OTHER
        self.classes.append(cls)
        self.aten_ops.append(op_name(func) if namespace == "aten" else f"{namespace}::{op_name(func)}")
        self.flops += self.table.flops(func, cls, args, kwargs, out)
        if cls is OpClass.CONV:
            self.groups = max(self.groups, conv_groups(func, args, kwargs))
        return out


class _FakeRunner(torch.fx.Interpreter):
    """Runs a GraphModule on fake tensors, one recorder per node."""

    def __init__(self, source: _Source, fake_mode: FakeTensorMode) -> None:
        super().__init__(source.gm, garbage_collect_values=False)
        self.source = source
        self.fake_mode = fake_mode
        self.table = FlopTable()
        self.records: dict[str, _NodeRecord] = {}
        self._fakes: dict[int, Any] = {}

    def fake(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor) and not isinstance(value, torch._subclasses.FakeTensor):
            key = id(value)
            if key not in self._fakes:
                self._fakes[key] = self.fake_mode.from_tensor(value, static_shapes=True)
            return self._fakes[key]
        return value

    def run_node(self, node: torch.fx.Node) -> Any:
        if node.op == "placeholder":
            canonical = self.source.param_placeholders.get(node.name)
            if canonical is not None:
                return self.fake(self.source.params.entries[canonical].tensor)
            return self.fake(self.source.inputs.get(node.name))
        if node.op == "get_attr":
            return self.fake(_fetch_attr(self.source.gm, node.target))
        if node.op == "output":
            return super().run_node(node)
        recorder = _Recorder(self.table)
        try:
            with self.fake_mode, recorder:
                value = super().run_node(node)
        except Exception as exc:  # any failure of a node on fake tensors: say which node
            raise CaptureError(
                f"node {node.name!r} ({_kind_of(node, self.source.gm)}) cannot run on fake tensors "
                f"(data-dependent values are not supported): {_first_line(exc)}"
            ) from exc
        self.records[node.name] = _NodeRecord(value, recorder.classes, recorder.flops, recorder.aten_ops,
                                              recorder.groups)
        return value

    def call_module(self, target: str, args: tuple, kwargs: dict) -> Any:
        submod = self.fetch_attr(target)
        state = {k: self.fake(v) for k, v in _module_state(submod).items()}
        return torch.func.functional_call(submod, state, args, kwargs, tie_weights=False)


def _module_state(module: torch.nn.Module) -> dict[str, Any]:
    state: dict[str, Any] = dict(module.named_parameters(remove_duplicate=False))
    state.update(module.named_buffers(remove_duplicate=False))
    return state


def _fetch_attr(gm: torch.nn.Module, target: str) -> Any:
    value: Any = gm
    for atom in target.split("."):
        value = getattr(value, atom)
    return value


def _lower(source: _Source, name: str, context: str, hint: str) -> OpGraph:
    fake_mode = _fake_mode_for(source.inputs.values())
    runner = _FakeRunner(source, fake_mode)
    fake_inputs = [None] * len(_placeholders(source.gm))
    try:
        runner.run(*fake_inputs)
    except CaptureError as exc:
        suffix = f"\n  {hint}" if hint else ""
        # fx's Interpreter appends the graph position to the message; our first line says it all
        raise CaptureError(f"{context} {_first_line(exc)}{suffix}") from exc.__cause__
    return _GraphBuilder(source, runner.records, name).build()


def _fake_mode_for(values: Any) -> FakeTensorMode:
    existing = torch._guards.detect_fake_mode(list(values))
    if existing is not None:
        return existing
    return FakeTensorMode(allow_non_fake_inputs=True)


class _GraphBuilder:
    """Turns the fx graph plus the per-node records into Op / Tensor / Param records."""

    def __init__(self, source: _Source, records: dict[str, _NodeRecord], name: str) -> None:
        self.source = source
        self.records = records
        self.name = name
        self.gm = source.gm
        self.tensors: dict[str, Tensor] = {}
        self.node_tensors: dict[str, list[str]] = {}  # fx node → its tensor names (one per leaf)
        self.node_params: dict[str, str] = {}        # fx node (param placeholder / get_attr) → canonical
        self.consumers: dict[str, list[str]] = {}
        self.param_users: dict[str, list[str]] = {}

    def build(self) -> OpGraph:
        self._classify_placeholders()
        calls = [n for n in self.gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
        op_inputs: dict[str, tuple[list[str], list[str]]] = {}
        for node in calls:
            self._define_outputs(node)
            op_inputs[node.name] = self._inputs_of(node)
        ops = [self._make_op(i, node, *op_inputs[node.name]) for i, node in enumerate(calls)]
        outputs = self._graph_outputs()
        tensors = [
            Tensor(t.name, t.producer, tuple(self.consumers.get(t.name, ())), t.shape, t.dtype, t.nbytes)
            for t in self.tensors.values()
        ]
        owned = {op.name: set(op.owned_params) for op in ops}
        params = [self._make_param(canon, entry, owned) for canon, entry in self.source.params.entries.items()]
        params = [p for p in params if p.users]  # parameters the forward never reads take no memory here
        inputs = [t for ph in self._user_placeholders() for t in self.node_tensors[ph]]
        return OpGraph(
            self.name, ops, tensors, params, inputs, outputs, source=self.source.program,
            module_types=self.source.module_types or self._module_types_from_stacks(),
        )

    # -- placeholders and attributes ----------------------------------------------------------

    def _classify_placeholders(self) -> None:
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                canonical = self.source.param_placeholders.get(node.name)
                if canonical is not None:
                    self.node_params[node.name] = canonical
                else:
                    self._define_tensor_values(node.name, None, self.source.inputs.get(node.name))
            elif node.op == "get_attr":
                value = _fetch_attr(self.gm, node.target)
                if isinstance(value, torch.Tensor):
                    qual = str(node.target)
                    canonical = self.source.params.canonical(qual) or self.source.params.add(
                        qual, value, trainable=isinstance(value, torch.nn.Parameter) and value.requires_grad
                    )
                    self.node_params[node.name] = canonical

    def _module_types_from_stacks(self) -> dict[str, str]:
        """Module path -> class name from the nodes' ``nn_module_stack`` (graphs without their model)."""
        found: dict[str, str] = {"": type(self.source.root).__name__ if self.source.root is not None else ""}
        for node in self.gm.graph.nodes:
            for path, mtype in _model_stack(node.meta.get("nn_module_stack") or {}):
                found.setdefault(_clean_module_path(str(path)), _type_name(mtype))
        return found

    def _user_placeholders(self) -> list[str]:
        return [n.name for n in self.gm.graph.nodes if n.op == "placeholder" and n.name not in self.node_params]

    # -- tensors ------------------------------------------------------------------------------

    def _define_tensor_values(self, node_name: str, producer: str | None, value: Any) -> None:
        leaves = tree_leaves(value) if isinstance(value, (tuple, list, dict)) else [value]
        if not leaves:
            leaves = [None]
        names = [node_name] if len(leaves) == 1 else [f"{node_name}.{i}" for i in range(len(leaves))]
        for tname, leaf in zip(names, leaves):
            self.tensors[tname] = _tensor_record(tname, producer, leaf)
        self.node_tensors[node_name] = names

    def _define_outputs(self, node: torch.fx.Node) -> None:
        self._define_tensor_values(node.name, node.name, self.records[node.name].value)

    def _inputs_of(self, node: torch.fx.Node) -> tuple[list[str], list[str]]:
        """(activation tensor names, canonical parameter names) that ``node`` reads, in argument order."""
        tensors: list[str] = []
        params: list[str] = []
        if node.op == "call_function" and node.target is operator.getitem and isinstance(node.args[1], int):
            src = node.args[0]
            if isinstance(src, torch.fx.Node) and src.name in self.node_tensors:
                names = self.node_tensors[src.name]
                tensors = [names[node.args[1]]] if len(names) > 1 and node.args[1] < len(names) else list(names)
        else:
            for arg in _arg_nodes(node):
                if arg.name in self.node_params:
                    params.append(self.node_params[arg.name])
                else:
                    tensors.extend(self.node_tensors.get(arg.name, ()))
        if node.op == "call_module":
            prefix = str(node.target)
            for local in _module_state(_fetch_attr(self.gm, prefix)):
                canonical = self.source.params.canonical(f"{prefix}.{local}")
                if canonical is not None:
                    params.append(canonical)
        tensors, params = _dedup(tensors), _dedup(params)
        for t in tensors:
            self.consumers.setdefault(t, []).append(node.name)
        for p in params:
            self.param_users.setdefault(p, []).append(node.name)
        return tensors, params

    def _graph_outputs(self) -> list[str]:
        out_node = next(n for n in self.gm.graph.nodes if n.op == "output")
        names: list[str] = []
        for arg in _arg_nodes(out_node):
            names.extend(self.node_tensors.get(arg.name, ()))
        return _dedup(names)

    # -- ops and params -----------------------------------------------------------------------

    def _make_op(self, index: int, node: torch.fx.Node, inputs: list[str], params: list[str]) -> Op:
        record = self.records[node.name]
        op_class = dominant_class(record.classes + _named_class(node))
        outputs = self.node_tensors[node.name]
        owned = [p for p in params if self.param_users[p][0] == node.name]
        entries = self.source.params.entries
        param_bytes = sum(_nbytes(entries[p].tensor) for p in owned)
        trainable = sum(_nbytes(entries[p].tensor) for p in owned if entries[p].trainable)
        read, written = self._bytes_moved(op_class, inputs, params, outputs)
        if any(name.rsplit(":", 1)[-1] in GROUPED_MM for name in record.aten_ops):
            read = self._grouped_read(read, inputs)
        module_path, module_type = self._module_of(node)
        return Op(
            name=node.name,
            kind=_kind_of(node, self.gm),
            op_class=op_class,
            index=index,
            module_path=module_path,
            module_type=module_type,
            dtype=self._dtype_of(outputs, inputs),
            inputs=tuple(inputs),
            outputs=tuple(outputs),
            params=tuple(params),
            owned_params=tuple(owned),
            flops=record.flops,
            bytes_read=read,
            bytes_written=written,
            param_bytes=param_bytes,
            trainable_param_bytes=trainable,
            aten_ops=tuple(record.aten_ops),
            groups=record.groups,
        )

    def _bytes_moved(self, op_class: OpClass, inputs: list[str], params: list[str], outputs: list[str]) -> tuple[int, int]:
        """Bytes read and written: 0 for views; a gather reads the rows it returns plus its indices."""
        if op_class is OpClass.VIEW:
            return 0, 0
        written = sum(self.tensors[t].nbytes for t in outputs)
        if op_class is OpClass.GATHER:
            indices = sum(self.tensors[t].nbytes for t in inputs if not _is_float(self.tensors[t].dtype))
            return written + indices, written
        entries = self.source.params.entries
        read = sum(self.tensors[t].nbytes for t in inputs) + sum(_nbytes(entries[p].tensor) for p in params)
        return read, written

    def _grouped_read(self, read: int, inputs: list[str]) -> int:
        """A grouped matmul reads only the experts its rows are routed to: at most one per row."""
        rows = [self.tensors[t].shape for t in inputs if len(self.tensors[t].shape) == 2]
        weights = [t for t in inputs if len(self.tensors[t].shape) == 3]
        if not rows or not weights:
            return read
        for t in weights:
            shape, nbytes = self.tensors[t].shape, self.tensors[t].nbytes
            read -= round(nbytes * (1.0 - grouped_weight_share(int(rows[0][0]), int(shape[0]))))
        return read

    def _dtype_of(self, outputs: list[str], inputs: list[str]) -> str:
        candidates = [self.tensors[t].dtype for t in outputs + inputs if self.tensors[t].dtype != NOT_A_TENSOR]
        floating = [d for d in candidates if _is_float(d)]
        return (floating or candidates or [NOT_A_TENSOR])[0]

    def _module_of(self, node: torch.fx.Node) -> tuple[str, str]:
        if node.op == "call_module":
            return str(node.target), type(_fetch_attr(self.gm, node.target)).__name__
        stack = _model_stack(node.meta.get("nn_module_stack") or {})
        if stack:
            path, mtype = stack[-1]
            return _clean_module_path(path), _type_name(mtype)
        root = self.source.root
        return "", type(root).__name__ if root is not None else ""

    def _make_param(self, canonical: str, entry: _ParamEntry, owned: dict[str, set[str]]) -> Param:
        users = tuple(self.param_users.get(canonical, ()))
        owner = next((u for u in users if canonical in owned.get(u, ())), None)
        return Param(
            name=canonical,
            shape=tuple(int(s) for s in entry.tensor.shape),
            dtype=_dtype_name(entry.tensor.dtype),
            nbytes=_nbytes(entry.tensor),
            trainable=entry.trainable,
            owner=owner,
            users=users,
            aliases=tuple(entry.aliases),
        )


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------


# Classes a node's own target can lend it: sdpa may decompose into bmm + softmax on some devices,
# yet the node is attention; a no-op ``contiguous`` must not become data movement, so only these.
_TARGET_CLASSES = {
    OpClass.ATTENTION, OpClass.CONV, OpClass.MATMUL, OpClass.NORM, OpClass.SOFTMAX, OpClass.POOL, OpClass.GATHER
}


def _named_class(node: torch.fx.Node) -> list[OpClass]:
    if node.op != "call_function":
        return []
    cls = classify(node.target)
    return [cls] if cls in _TARGET_CLASSES else []


def _arg_nodes(node: torch.fx.Node) -> list[torch.fx.Node]:
    found: list[torch.fx.Node] = []
    torch.fx.node.map_arg((node.args, node.kwargs), lambda n: found.append(n) or n)
    return found


def _dedup(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _tensor_record(name: str, producer: str | None, value: Any) -> Tensor:
    if isinstance(value, torch.Tensor):
        return Tensor(name, producer, (), tuple(int(s) for s in value.shape), _dtype_name(value.dtype), _nbytes(value))
    return Tensor(name, producer, (), (), NOT_A_TENSOR, 0)


def _nbytes(t: Any) -> int:
    return int(t.numel()) * t.dtype.itemsize if isinstance(t, torch.Tensor) else 0


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat", "complex"))


def _type_name(mtype: Any) -> str:
    if isinstance(mtype, type):
        return mtype.__name__
    return str(mtype).rsplit(".", 1)[-1].strip("'>")


# dynamo's source of the root module: the frame's local (``L['self']``, ``L['args'][0]`` under a
# decorator such as transformers', ``L['mod']``) or a global (``G['model']``), with its subscripts
_DYNAMO_ROOT = re.compile(r"^[LG]\['[^']*'\](?:\[\d+\]|\['[^']*'\])*")


def _dynamo_root(path: str) -> str:
    found = _DYNAMO_ROOT.match(path)
    return found.group(0) if found else ""


def _model_stack(stack: dict[str, Any]) -> list[tuple[str, Any]]:
    """A node's ``nn_module_stack`` entries under the outermost one's root: modules of the model
    itself, not modules dynamo reached elsewhere (transformers wraps some functions as global
    modules, ``G['__import_transformers_...'].apply_rotary_pos_emb``)."""
    entries = [(str(path), mtype) for path, mtype in stack.values()]
    root = _dynamo_root(entries[0][0]) if entries else ""
    return [(path, mtype) for path, mtype in entries if _dynamo_root(path) == root]


def _clean_module_path(path: str) -> str:
    """``L['self'].layers[0].fc``, ``L['args'][0]._modules['layers']._modules['0'].fc`` (dynamo)
    or ``layers.0.fc`` (export) → ``layers.0.fc``: the model's own qualified name."""
    path = _DYNAMO_ROOT.sub("", path)
    path = re.sub(r"\[(\d+)\]", r".\1", path)
    path = re.sub(r"\['([^']*)'\]", r".\1", path)
    path = re.sub(r"(^|\.)_modules\.", r"\1", "." + path.lstrip("."))
    return path.strip(".")


def _kind_of(node: torch.fx.Node, gm: torch.nn.Module) -> str:
    target = node.target
    if node.op == "call_module":
        cls = type(_fetch_attr(gm, str(target)))
        return f"{cls.__module__}.{cls.__qualname__}"
    if node.op == "call_method":
        return f"Tensor.{target}"
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    module = getattr(target, "__module__", None) or ""
    qual = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or str(target)
    if module in ("_operator", "operator"):
        module = "operator"
    if module.startswith("torch._C._nn"):
        module = "torch.nn.functional"
    return f"{module}.{qual}" if module else qual


__all__ = ["Capture", "capture_mode", "from_module", "from_graph_module"]
