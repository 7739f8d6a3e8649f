"""ONNX front end: a ``.onnx`` file (or ``ModelProto``) → the same OpGraph the torch front end makes.

In: a model path or ``ModelProto`` and, for symbolic dimensions, input shapes
(``{"input": (1, 3, 224, 224)}``). Out: an :class:`~partitioner.ir.OpGraph` whose ops are the
model's nodes, so every solver, the plan file, the report and ``explain`` work unchanged, with
``graph.source`` an :class:`OnnxSource` (what the onnxruntime backend needs to write the parts).

The passes, in order:

1. :func:`~partitioner.frontends.onnx_load.load_onnx`: read the file (external data stays on disk,
   its files are checked), check domains, order the nodes, bind the input shapes;
2. :func:`~partitioner.frontends.onnx_fold.analyse`: shape inference iterated with constant
   folding, as onnxruntime folds when a session starts;
3. here: one op per node that is not folded, or per chain onnxruntime fuses into one kernel
   (:mod:`partitioner.frontends.onnx_fusion`: Conv + BatchNormalization + Relu, ...; the op is named
   after the chain's first node and lists the chain's op types in ``Op.aten_ops``). Its cost class
   and FLOPs come from :mod:`partitioner.frontends.onnx_costs`; it reads activations (graph inputs, other ops' outputs,
   and the names its If/Loop/Scan bodies take from the enclosing graph) and parameters (initializers
   and folded constants, counted once: an ``Identity`` of a weight is the same weight; the first
   reader owns it). Bytes moved are those of the tensors it reads and writes (0 for views; the rows
   it gathers for a Gather). Module paths (:func:`node_module`) come from the metadata torch's
   default exporter (``torch.onnx.export(..., dynamo=True)``) writes on every node
   (``pkg.torch.onnx.name_scopes`` ``['', 'layers.0', 'layers.0.fc1', 'linear']`` → ``layers.0.fc1``,
   with its class from ``pkg.torch.onnx.class_hierarchy``, or else from ``namespace``), or from the
   TorchScript exporter's node names (``/layer1/layer1.0/conv1/Conv`` → ``layer1.0.conv1``), so
   pins, ``--align-modules`` and ``explain`` take the module globs they take on the torch model.

Unknown (data-dependent) dimensions of intermediate tensors are written ``-1`` and weigh 0 bytes.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

import numpy as np
import onnx

from partitioner.frontends.onnx_costs import CONTROL_FLOW, NodeShapes, has_entry, node_flops, op_class
from partitioner.frontends.onnx_fold import Analysis, analyse, static_shape
from partitioner.frontends.onnx_fusion import fusion_groups
from partitioner.frontends.onnx_input import is_onnx_graph, is_onnx_model  # noqa: F401  (re-exported)
from partitioner.frontends.onnx_load import LoadedOnnx, itemsize, load_onnx, outer_references
from partitioner.ir import NOT_A_TENSOR, Op, OpClass, OpGraph, Param, Tensor

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, eq=False)
class OnnxSource:
    """What the ONNX front end captured, kept as ``OpGraph.source`` for the onnxruntime backend."""

    loaded: LoadedOnnx                      # the model (inputs bound), its file and node order
    analysis: Analysis                      # types, constants, folded nodes, small constant values
    op_nodes: Mapping[str, tuple[int, ...]]  # op name -> its nodes' indices in the model's graph (a fused chain)
    input_shapes: Mapping[str, tuple[int, ...]]  # the static shape of every tensor graph input
    fallback_ops: tuple[str, ...]           # op types without a cost entry (bytes at memory bandwidth)

    @property
    def model(self) -> onnx.ModelProto:
        return self.loaded.model


def from_onnx(
    path_or_model: str | os.PathLike[str] | onnx.ModelProto,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    *,
    name: str | None = None,
) -> OpGraph:
    """Import an ONNX model as an OpGraph (see the module docstring).

    Parameters:
        path_or_model: a ``.onnx`` path (external data is read from beside it) or a ``ModelProto``.
        input_shapes: static shapes for inputs with symbolic dimensions, ``{"input": (1, 3, 224, 224)}``.
        name: the graph's name (default: the file's stem or the graph's name).

    Raises:
        OnnxError: the file, a node or an input is at fault; the message says which and the fix.

    Example:
        >>> graph = from_onnx("resnet50.onnx", {"data": (1, 3, 224, 224)})   # doctest: +SKIP
        >>> graph.source.fallback_ops
        ()
    """
    loaded = load_onnx(path_or_model, input_shapes)
    analysis = analyse(loaded)
    return _Builder(loaded, analysis, name or loaded.name).build()


class _Builder:
    """Ops, tensors and parameters from the analysed model."""

    def __init__(self, loaded: LoadedOnnx, analysis: Analysis, name: str) -> None:
        self.loaded, self.analysis, self.name = loaded, analysis, name
        self.graph = loaded.model.graph
        self.types = analysis.types
        self.kept = [i for i in loaded.order if i not in analysis.folded]
        self.op_names = _op_names(self.graph, self.kept)
        self.alias = _aliases(self.graph, analysis)

    def build(self) -> OpGraph:
        outputs = [o.name for o in self.graph.output]
        shapes = {name: static_shape(t) for name, t in self.analysis.types.items()}
        groups = fusion_groups(self.graph, self.kept, self.analysis.constant, set(outputs), shapes)
        attention = attention_matmuls(self.graph, self.kept, self.analysis.constant)
        units, consumers, param_users = [], {}, {}
        for index, (head, members) in enumerate(groups.items()):
            name = self.op_names[head]
            inside = {o for i in members[:-1] for o in self.graph.node[i].output}
            reads = _dedup(n for i in members for n in [*self.graph.node[i].input,
                                                         *outer_references(self.graph.node[i])]
                           if n and n not in inside)
            acts = [t for t in reads if t not in self.analysis.constant]
            params = _dedup(self.alias.get(t, t) for t in reads if t in self.analysis.constant)
            for t in acts:
                consumers.setdefault(t, []).append(name)
            for p in params:
                param_users.setdefault(p, []).append(name)
            units.append((index, members, name, acts, params))
        built = [self._op(index, members, name, acts, params, param_users, members[0] in attention)
                 for index, members, name, acts, params in units]
        tensors = self._tensors(built, consumers)
        params = [self._param(p, users) for p, users in param_users.items()]
        module_types = {"": self.name, **{op.module_path: "" for op in built if op.module_path}}
        for i in self.kept:  # the exporter's metadata names every enclosing module's class
            module_types.update((path, kind) for path, kind in module_scopes(self.graph.node[i]) if kind)
        fallback = sorted({op.kind for op in built if not has_entry(*_type_and_domain(op.kind))})
        if fallback:
            log.warning("%s: no cost entry for op types %s: costed by the bytes they move", self.name,
                        ", ".join(fallback))
        source = OnnxSource(self.loaded, self.analysis,
                            MappingProxyType({self.op_names[head]: members for head, members in groups.items()}),
                            MappingProxyType(self._input_shapes()), tuple(fallback))
        return OpGraph(self.name, built, tensors, params, self.loaded.inputs, outputs, source=source,
                       module_types=module_types)

    # -- records -------------------------------------------------------------------------------

    def _op(self, index: int, members: tuple[int, ...], name: str, acts: list[str], params: list[str],
            param_users: dict[str, list[str]], attention: bool) -> Op:
        head = self.graph.node[members[0]]
        domain = "" if head.domain == "ai.onnx" else head.domain
        cls = OpClass.ATTENTION if attention else op_class(head.op_type, domain)
        outputs = [o for o in self.graph.node[members[-1]].output if o]
        if head.op_type in CONTROL_FLOW and not domain:
            flops, read, written = _body_cost(self.analysis.inferred.node[members[0]], self.types,
                                              self.analysis.values)
        else:
            flops = sum(node_flops(self._shapes(self.graph.node[i]), cls if i == members[0] else
                                   op_class(self.graph.node[i].op_type)) for i in members)
            read, written = self._bytes(cls, acts, params, outputs)
        owned = [p for p in params if param_users[p][0] == name]
        kind = head.op_type if not domain else f"{domain}.{head.op_type}"
        path, module_type = node_module(head)
        return Op(name=name, kind=kind, op_class=cls, index=index, module_path=path,
                  module_type=module_type, dtype=self._dtype(outputs + acts), inputs=tuple(acts),
                  outputs=tuple(outputs),
                  params=tuple(params), owned_params=tuple(owned), flops=int(flops), bytes_read=int(read),
                  bytes_written=int(written), param_bytes=sum(self._nbytes(p) for p in owned),
                  trainable_param_bytes=0,
                  aten_ops=tuple(self.graph.node[i].op_type for i in members) if len(members) > 1 else (),
                  groups=_groups(head) if cls is OpClass.CONV else 1)

    def _tensors(self, ops: list[Op], consumers: dict[str, list[str]]) -> list[Tensor]:
        producers = {t: op.name for op in ops for t in op.outputs}
        names = [*self.loaded.inputs, *producers]
        extra = [o.name for o in self.graph.output if o.name not in producers and o.name not in self.loaded.inputs]
        out = []
        for t in [*names, *extra]:
            shape, dtype, nbytes = self._describe(t)
            out.append(Tensor(t, producers.get(t), tuple(consumers.get(t, ())), shape, dtype, nbytes))
        return out

    def _param(self, name: str, users: list[str]) -> Param:
        shape, dtype, nbytes = self._describe(name)
        aliases = tuple(a for a, target in self.alias.items() if target == name)
        return Param(name, shape, dtype, nbytes, trainable=False, owner=users[0], users=tuple(users), aliases=aliases)

    # -- shapes and bytes ------------------------------------------------------------------------

    def _describe(self, tensor: str) -> tuple[tuple[int, ...], str, int]:
        """(shape with -1 for unknown dims, dtype name, bytes; 0 when unknown or not a tensor)."""
        return describe(self.types.get(tensor))

    def _nbytes(self, tensor: str) -> int:
        return self._describe(tensor)[2]

    def _shapes(self, node: onnx.NodeProto) -> NodeShapes:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute
                 if a.type not in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)}
        attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
        shape = lambda n: static_shape(self.types.get(n)) if n else None  # noqa: E731
        return NodeShapes(node.op_type, node.domain, attrs, [shape(n) for n in node.input],
                          [shape(n) for n in node.output])

    def _bytes(self, cls: OpClass, acts: list[str], params: list[str], outputs: list[str]) -> tuple[int, int]:
        if cls is OpClass.VIEW:
            return 0, 0
        written = sum(self._nbytes(t) for t in outputs)
        if cls is OpClass.GATHER:
            indices = sum(self._nbytes(t) for t in [*acts, *params] if not _is_float(self._describe(t)[1]))
            return written + indices, written
        return sum(self._nbytes(t) for t in [*acts, *params]), written

    def _dtype(self, tensors: list[str]) -> str:
        dtypes = [self._describe(t)[1] for t in tensors]
        dtypes = [d for d in dtypes if d != NOT_A_TENSOR]
        floating = [d for d in dtypes if _is_float(d)]
        return (floating or dtypes or [NOT_A_TENSOR])[0]

    def _input_shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: shape for name in self.loaded.inputs
                if (shape := static_shape(self.types.get(name))) is not None}


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def describe(t: onnx.TypeProto | None) -> tuple[tuple[int, ...], str, int]:
    """(shape, dtype name, bytes) of a tensor type: unknown dims are -1 and weigh 0 bytes.

    Example:
        >>> describe(onnx.helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, [2, 3]))
        ((2, 3), 'float32', 24)
    """
    if t is None or t.WhichOneof("value") != "tensor_type":
        return (), NOT_A_TENSOR, 0
    tt = t.tensor_type
    dtype = dtype_name(tt.elem_type)
    if not tt.HasField("shape"):
        return (), dtype, 0
    shape = tuple(int(d.dim_value) if d.HasField("dim_value") else -1 for d in tt.shape.dim)
    if any(d < 0 for d in shape):
        return shape, dtype, 0
    return shape, dtype, math.prod(shape) * itemsize(tt.elem_type)  # Python ints: never wraps


def dtype_name(elem_type: int) -> str:
    """The IR's dtype name of an ONNX element type: ``FLOAT`` → ``"float32"``, ``BFLOAT16`` → ``"bfloat16"``.

    Example:
        >>> dtype_name(onnx.TensorProto.INT64), dtype_name(onnx.TensorProto.BFLOAT16)
        ('int64', 'bfloat16')
    """
    if elem_type == onnx.TensorProto.UNDEFINED:
        return NOT_A_TENSOR
    name = onnx.TensorProto.DataType.Name(elem_type).lower()
    special = {"float": "float32", "double": "float64", "bool": "bool", "string": "string"}
    return special.get(name, name)


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat", "complex"))


def _dedup(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _type_and_domain(kind: str) -> tuple[str, str]:
    domain, _, op_type = kind.rpartition(".")
    return op_type, domain


def _op_names(graph: onnx.GraphProto, kept: list[int]) -> dict[int, str]:
    """Node name when present and unique, else ``{op_type}_{index}``; always unique."""
    counts: dict[str, int] = {}
    for i in kept:
        counts[graph.node[i].name] = counts.get(graph.node[i].name, 0) + 1
    names: dict[int, str] = {}
    taken: set[str] = set()
    for i in kept:
        node = graph.node[i]
        name = node.name if node.name and counts[node.name] == 1 else f"{node.op_type}_{i}"
        while name in taken:
            name = f"{name}_{i}"
        taken.add(name)
        names[i] = name
    return names


def _aliases(graph: onnx.GraphProto, analysis: Analysis) -> dict[str, str]:
    """Folded ``Identity`` outputs → the constant they copy (tied weights are one parameter)."""
    alias: dict[str, str] = {}
    for i in sorted(analysis.folded):
        node = graph.node[i]
        if node.op_type == "Identity" and node.domain in ("", "ai.onnx"):
            alias[node.output[0]] = alias.get(node.input[0], node.input[0])
    return alias


def module_path(node_name: str) -> str:
    """The module path in a torch exporter's node name; ``""`` for other names.

    Example:
        >>> module_path("/layer1/layer1.0/conv1/Conv"), module_path("Conv_12")
        ('layer1.0.conv1', '')
    """
    if not node_name.startswith("/"):
        return ""
    path = ""
    for part in node_name.strip("/").split("/")[:-1]:
        path = part if not path or part.startswith(path + ".") else f"{path}.{part}"
    return path


#: node metadata torch's default (dynamo) exporter writes: reprs of lists, one entry per enclosing
#: module from the root (path ``""``) in, then the node itself
NAME_SCOPES = "pkg.torch.onnx.name_scopes"        # "['', 'layers.0', 'layers.0.fc1', 'linear']"
CLASS_HIERARCHY = "pkg.torch.onnx.class_hierarchy"  # "['m.Net', 'm.Block', 'torch.nn...Linear', 'aten.linear.default']"
NAMESPACE = "namespace"                           # ": m.Net/layers.0: m.Block/layers.0.fc1: t...Linear/linear: aten..."


def module_scopes(node: onnx.NodeProto) -> list[tuple[str, str]]:
    """(module path, class name) of every module enclosing ``node``, outermost (the root, ``""``)
    first, from the dynamo exporter's metadata; ``[]`` when the node has none.

    ``pkg.torch.onnx.name_scopes`` and ``pkg.torch.onnx.class_hierarchy`` are read first (their last
    entry, the node itself, dropped), then ``namespace``. Malformed metadata counts as none.

    Example:
        >>> node = onnx.helper.make_node("Gemm", ["x", "w"], ["y"])
        >>> onnx.helper.set_metadata_props(node, {NAME_SCOPES: "['', 'layers.0', 'layers.0.fc1', 'linear']",
        ...     CLASS_HIERARCHY: "['m.Net', 'm.Block', 'torch.nn.modules.linear.Linear', 'aten.linear.default']"})
        >>> module_scopes(node)
        [('', 'Net'), ('layers.0', 'Block'), ('layers.0.fc1', 'Linear')]
    """
    meta = {p.key: p.value for p in node.metadata_props}
    scopes = _string_list(meta.get(NAME_SCOPES))
    if scopes is not None and len(scopes) >= 2:
        classes = _string_list(meta.get(CLASS_HIERARCHY))
        classes = classes if classes is not None and len(classes) == len(scopes) else [""] * len(scopes)
        return [(path, _class_name(kind)) for path, kind in zip(scopes[:-1], classes[:-1])]
    entries = [e.partition(": ") for e in meta.get(NAMESPACE, "").split("/")]
    if len(entries) >= 2 and all(sep for _, sep, _ in entries):
        return [(path, _class_name(kind)) for path, _, kind in entries[:-1]]
    return []


def node_module(node: onnx.NodeProto) -> tuple[str, str]:
    """(module path, class name) of the innermost module that issued ``node``: from the dynamo
    exporter's metadata (:func:`module_scopes`), else the TorchScript exporter's node name
    (:func:`module_path`; no class then); ``("", "")`` when neither says.

    Example:
        >>> node_module(onnx.helper.make_node("Conv", ["x", "w"], ["y"], name="/layer1/layer1.0/conv1/Conv"))
        ('layer1.0.conv1', '')
    """
    scopes = module_scopes(node)
    if scopes:
        return scopes[-1]
    return module_path(node.name), ""


def _string_list(text: str | None) -> list[str] | None:
    """The list of strings a metadata value is the repr of (None when it is not one)."""
    import ast

    if not text or not text.startswith("[") or len(text) > 1 << 16:
        return None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


def _class_name(qualified: str) -> str:
    """``torch.nn.modules.linear.Linear`` → ``Linear`` (a module class as the torch front end names it)."""
    return qualified.strip().rsplit(".", 1)[-1]


def attention_matmuls(graph: onnx.GraphProto, kept: Sequence[int], constant: frozenset[str],
                      hops: int = 4) -> set[int]:
    """MatMuls of two activations that feed a Softmax or read one within ``hops`` pointwise or view
    nodes: the score and weighted-sum products of an attention written as plain MatMuls.

    Example:
        >>> attention_matmuls(model.graph, range(len(model.graph.node)), frozenset())   # doctest: +SKIP
        {12, 17}
    """
    passthrough = {OpClass.ELEMENTWISE, OpClass.VIEW, OpClass.DATA_MOVEMENT}
    producer = {o: i for i in kept for o in graph.node[i].output}
    users: dict[str, list[int]] = {}
    for i in kept:
        for name in graph.node[i].input:
            users.setdefault(name, []).append(i)

    def reaches_softmax(start: int, forward: bool) -> bool:
        frontier, seen = [start], {start}
        for _ in range(hops):
            nxt = []
            for i in frontier:
                node = graph.node[i]
                names = node.output if forward else [n for n in node.input if n and n not in constant]
                for n in (users.get(x, []) if forward else [producer[x]] if x in producer else [] for x in names):
                    for j in n:
                        if j in seen:
                            continue
                        seen.add(j)
                        kind = graph.node[j].op_type
                        if kind in ("Softmax", "LogSoftmax"):
                            return True
                        if op_class(kind, graph.node[j].domain) in passthrough:
                            nxt.append(j)
            frontier = nxt
        return False

    found = set()
    for i in kept:
        node = graph.node[i]
        if node.op_type != "MatMul" or any(n in constant for n in node.input):
            continue
        if reaches_softmax(i, forward=True) or reaches_softmax(i, forward=False):
            found.add(i)
    return found


def _body_cost(node: onnx.NodeProto, outer: Mapping[str, onnx.TypeProto],
               values: Mapping[str, np.ndarray]) -> tuple[int, int, int]:
    """(FLOPs, bytes read, bytes written) of an If/Loop/Scan from its bodies (module docstring of
    :mod:`partitioner.frontends.onnx_costs`): the costlier If branch, a Loop's body × its constant
    trip count (once when unknown), a Scan's body × the scanned length."""
    bodies = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
    costs = [_graph_cost(g, outer, values) for g in bodies.values()]
    if not costs:
        return 0, 0, 0
    if node.op_type == "If":
        return max(costs)
    trips = 1
    if node.op_type == "Loop" and node.input and node.input[0] in values:
        trips = max(1, int(np.asarray(values[node.input[0]]).reshape(-1)[0]))
    elif node.op_type == "Scan":
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        n_scan = int(attrs.get("num_scan_inputs", 0))
        axes = list(attrs.get("scan_input_axes", [])) or [0]
        first = node.input[len(node.input) - n_scan] if n_scan else ""
        shape = static_shape(outer.get(first))
        if shape:
            trips = shape[axes[0] % len(shape)]
    flops, read, written = costs[0]
    return flops * trips, read * trips, written * trips


def _graph_cost(graph: onnx.GraphProto, outer: Mapping[str, onnx.TypeProto],
                values: Mapping[str, np.ndarray]) -> tuple[int, int, int]:
    types = dict(outer)
    for v in [*graph.input, *graph.value_info, *graph.output]:
        types[v.name] = v.type
    flops = read = written = 0
    for node in graph.node:
        if node.op_type in CONTROL_FLOW:
            f, r, w = _body_cost(node, types, values)
        else:
            cls = op_class(node.op_type, node.domain)
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute
                     if a.type not in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)}
            shape = lambda n: static_shape(types.get(n)) if n else None  # noqa: E731
            f = node_flops(NodeShapes(node.op_type, node.domain, attrs, [shape(n) for n in node.input],
                                      [shape(n) for n in node.output]), cls)
            r = 0 if cls is OpClass.VIEW else sum(describe(types.get(n))[2] for n in node.input if n)
            w = 0 if cls is OpClass.VIEW else sum(describe(types.get(n))[2] for n in node.output if n)
        flops, read, written = flops + f, read + r, written + w
    return flops, read, written


__all__ = ["OnnxSource", "attention_matmuls", "describe", "dtype_name", "from_onnx", "is_onnx_graph",
           "is_onnx_model", "module_path", "module_scopes", "node_module"]


def _groups(node: onnx.NodeProto) -> int:
    """A Conv's ``group`` attribute (1 when absent)."""
    value = next((a.i for a in node.attribute if a.name == "group"), 1)
    return int(value) if value > 0 else 1
