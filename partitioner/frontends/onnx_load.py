"""Reading an ONNX model for the front end, and every check that makes its errors one line.

In: a path to a ``.onnx`` file or a ``ModelProto``, and optional input shapes. Out: a
:class:`LoadedOnnx`: the model's structure (tensors whose data lives in external files keep
only their reference: planning needs their shapes, not their bytes), the folder external data is
read from and every external tensor, checked (:mod:`partitioner.frontends.onnx_external`:
initializers and tensors held by nodes such as ``Constant`` alike), the nodes in a topological
order, and the graph inputs with every dimension bound.

Each problem is an :class:`~partitioner.errors.OnnxError` naming the file, node or input and the fix:
a truncated or corrupt file, an external-data file that is missing or too short, a domain neither
onnx nor onnxruntime knows, a cycle, a node reading a tensor nothing defines, an input shape that
contradicts the model, a dimension still unknown after binding, a tensor whose shape is absurd.

Sizes are Python integers (``math.prod`` of the dimensions), never numpy ``int64`` products, which
wrap: a dimension of 2**62 would weigh 0 bytes and "fit" anywhere. A tensor with a negative
dimension, or larger than :data:`MAX_TENSOR_BYTES`, is refused (:func:`check_size`).

Sparse initializers (``graph.sparse_initializer``) are parameters named after their ``values``
tensor, as onnx and onnxruntime name them; onnxruntime densifies them when a session starts, so
they weigh their dense bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import onnx
import onnx.defs
from google.protobuf.message import DecodeError

from partitioner.errors import HetpartError, InputShapeError, OnnxError
from partitioner.files import read_bytes
from partitioner.frontends.onnx_external import ExternalTensor, external_tensors

#: the most bytes one tensor may weigh (1 PiB); a larger one is a mistyped or overflowed shape
MAX_TENSOR_BYTES = 1 << 50

#: domains onnxruntime implements beyond onnx's own (contrib and internal ops)
MAX_ONNX_BYTES = 1 << 31  # protobuf cannot hold a larger message: the weights of a larger model are external data
ORT_DOMAINS = frozenset({"com.microsoft", "com.microsoft.nchwc", "com.ms.internal.nhwc", "com.microsoft.dml"})


@dataclasses.dataclass(frozen=True)
class LoadedOnnx:
    """A model ready for shape inference (see the module docstring)."""

    model: onnx.ModelProto                 # external initializers keep their reference, not their data
    name: str                              # the file's stem, else the graph's name
    path: Path | None                      # the file it came from (None: given as a ModelProto)
    base_dir: Path | None                  # where external data files are read from
    order: tuple[int, ...]                 # node indices in a topological order (program order kept)
    inputs: tuple[str, ...]                # graph inputs that are not initializers
    constant_initializers: frozenset[str]  # initializers onnxruntime treats as constants
    external: tuple[ExternalTensor, ...] = ()  # every tensor kept in a data file, checked (onnx_external)

    @property
    def external_nodes(self) -> frozenset[int]:
        """Top-level nodes holding an external tensor in an attribute or a body (a ``Constant``'s
        ``value``): a part copying one must read its bytes in (:func:`inline_external_data`)."""
        return frozenset(t.node for t in self.external if t.node is not None)


def load_onnx(source: str | os.PathLike[str] | onnx.ModelProto,
              input_shapes: Mapping[str, Sequence[int]] | Sequence[Sequence[int]] | None = None) -> LoadedOnnx:
    """Read, check and bind an ONNX model (see the module docstring).

    ``input_shapes`` maps input names to shapes, or lists one shape per input (initializers
    excluded) in the model's order, as a plan records them.

    Example:
        >>> loaded = load_onnx("model.onnx", {"input": (1, 3, 224, 224)})   # doctest: +SKIP
        >>> loaded.inputs
        ('input',)
    """
    if isinstance(source, onnx.ModelProto):
        model, path = _copy(source), None
        where = f"model {source.graph.name or '<unnamed>'!r}"
    else:
        path = Path(source)
        model, where = _read(path), str(path)
    base_dir = path.parent if path is not None else None
    if not model.graph.node and not model.graph.output:
        raise OnnxError(f"{where}: not an ONNX model (no graph, ir_version {model.ir_version}): "
                        "the file is empty, truncated or of another format; export it again")
    _check_initializer_sizes(model.graph, where)
    external = external_tensors(model, base_dir, where)
    _check_domains(model, where)
    order = _topological_order(model.graph, where)
    constant = _constant_initializers(model)
    inputs = tuple(i.name for i in model.graph.input if i.name not in constant)
    _bind_shapes(model.graph, inputs, _named(input_shapes, inputs, where), where)
    name = path.stem if path is not None else (model.graph.name or "onnx-model")
    return LoadedOnnx(model, name, path, base_dir, order, inputs, constant, external)


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


def _read(path: Path) -> onnx.ModelProto:
    try:
        data = read_bytes(path, what="ONNX model", max_bytes=MAX_ONNX_BYTES)   # a regular file, not a FIFO
        return onnx.load_from_string(data)   # external data stays on disk, checked below
    except FileNotFoundError:
        raise OnnxError(f"{path}: no such ONNX file; give the path of a .onnx model") from None
    except HetpartError as exc:
        raise OnnxError(str(exc)) from None
    except DecodeError as exc:
        raise OnnxError(f"{path}: not a readable ONNX model ({exc}): the file is truncated or corrupt; "
                        "copy or export it again") from None
    except OSError as exc:
        raise OnnxError(f"{path}: cannot read the file: {exc.strerror or exc}") from None


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _check_initializer_sizes(graph: onnx.GraphProto, where: str) -> None:
    """Every initializer's declared shape is a sane size; a sparse one's values and indices agree."""
    fix = "the file is corrupt or was exported wrong: export it again"
    for tensor in graph.initializer:
        check_size(f"initializer {tensor.name!r}", tensor.dims, tensor.data_type, where, fix)
    for sparse in graph.sparse_initializer:
        name = sparse_name(sparse)
        check_size(f"sparse initializer {name!r}", sparse.dims, sparse.values.data_type, where, fix)
        nnz = sparse.values.dims[0] if len(sparse.values.dims) == 1 else None
        index_dims = tuple(sparse.indices.dims)
        if nnz is None or index_dims not in ((nnz,), (nnz, len(sparse.dims))) or not name:
            raise OnnxError(f"{where}: sparse initializer {name!r} ({_dims(sparse.dims)}) has values of shape "
                            f"{_dims(sparse.values.dims)} and indices of shape {_dims(index_dims)}: a sparse tensor "
                            "needs named values of shape [NNZ] and indices of shape [NNZ] or [NNZ, rank]; export "
                            "it again")


@functools.cache
def _onnx_domains() -> frozenset[str]:
    """The domains onnx has schemas for (read once: listing every schema takes ~25 ms)."""
    return frozenset(s.domain for s in onnx.defs.get_all_schemas_with_history())


def _check_domains(model: onnx.ModelProto, where: str) -> None:
    """Imported and used domains must be known to onnx, onnxruntime, or defined by the model's functions."""
    known = set(_onnx_domains()) | {"ai.onnx"} | ORT_DOMAINS | {f.domain for f in model.functions}
    imported = {o.domain: o.version for o in model.opset_import}
    for domain, version in imported.items():
        if domain not in known:
            users = [n.name or n.op_type for n in model.graph.node if n.domain == domain][:3]
            used = f"; nodes {', '.join(map(repr, users))} use it" if users else ""
            raise OnnxError(f"{where}: imports domain {domain!r} (version {version}), which neither onnx nor "
                            f"onnxruntime knows{used}: replace those ops, or register the custom-op library "
                            "that implements them and give their outputs' types as value_info")
    for node in model.graph.node:
        domain = "" if node.domain == "ai.onnx" else node.domain
        if domain not in imported and not (domain == "ai.onnx" and "" in imported):
            raise OnnxError(f"{where}: node {node.name or node.op_type!r} ({node.op_type}) uses domain "
                            f"{node.domain!r}, which the model does not import: add it to opset_import")


def _constant_initializers(model: onnx.ModelProto) -> frozenset[str]:
    """Initializers onnxruntime treats as constants: all of them up to IR version 3, where they are
    also listed as graph inputs; from version 4 those listed as inputs may be overridden, and
    hetpart still plans them as weights (a partitioned run keeps the stored value)."""
    return frozenset(t.name for t in model.graph.initializer) | frozenset(
        sparse_name(t) for t in model.graph.sparse_initializer)


def sparse_name(tensor: onnx.SparseTensorProto) -> str:
    """The name a sparse initializer goes by: its ``values`` tensor's (onnx and onnxruntime read it there).

    Example:
        >>> sparse_name(onnx.helper.make_sparse_tensor(values, indices, [4, 4]))   # doctest: +SKIP
        'w'
    """
    return tensor.values.name


def _topological_order(graph: onnx.GraphProto, where: str) -> tuple[int, ...]:
    """Node indices with every producer before its consumers, program order kept among ready nodes."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {
        sparse_name(t) for t in graph.sparse_initializer} | {""}
    producer: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        for out in node.output:
            if out and out in producer:
                raise OnnxError(f"{where}: tensor {out!r} is produced by two nodes, "
                                f"{_node_label(graph, producer[out])} and {_node_label(graph, i)}: "
                                "every tensor must have one producer")
            if out:
                producer[out] = i
    deps: list[set[int]] = []
    for i, node in enumerate(graph.node):
        need = set()
        for name in [*node.input, *outer_references(node)]:
            if name in producer:
                need.add(producer[name])
            elif name not in defined:
                raise OnnxError(f"{where}: node {_node_label(graph, i)} reads {name!r}, which no node produces "
                                "and which is neither a graph input nor an initializer: add it as an input or "
                                "fix the name")
        deps.append(need)
    for out in graph.output:
        if out.name not in producer and out.name not in defined:
            raise OnnxError(f"{where}: graph output {out.name!r} is produced by no node: fix the output's name")
    if all(d < i for i, need in enumerate(deps) for d in need):
        return tuple(range(len(graph.node)))
    return _kahn(graph, deps, where)


def _kahn(graph: onnx.GraphProto, deps: list[set[int]], where: str) -> tuple[int, ...]:
    """A topological order of nodes listed out of order; the lowest ready index goes first."""
    import heapq

    users: list[list[int]] = [[] for _ in deps]
    for i, need in enumerate(deps):
        for d in need:
            users[d].append(i)
    missing = [len(need) for need in deps]
    ready = [i for i, m in enumerate(missing) if m == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            missing[u] -= 1
            if missing[u] == 0:
                heapq.heappush(ready, u)
    if len(order) < len(deps):
        done = set(order)
        cycle = _find_cycle([i for i in range(len(deps)) if i not in done], deps)
        raise OnnxError(f"{where}: the graph has a cycle through nodes "
                        f"{' -> '.join(_node_label(graph, i) for i in cycle)}: an ONNX graph must be acyclic")
    return tuple(order)


def _find_cycle(pending: list[int], deps: list[set[int]]) -> list[int]:
    """One cycle among the nodes left when no node is ready."""
    left = set(pending)
    node, seen = pending[0], []
    while node not in seen:
        seen.append(node)
        node = min(d for d in deps[node] if d in left)
    return seen[seen.index(node):] + [node]


def _node_label(graph: onnx.GraphProto, i: int) -> str:
    node = graph.node[i]
    return f"{node.name!r} ({node.op_type})" if node.name else f"#{i} ({node.op_type})"


def outer_references(node: onnx.NodeProto) -> list[str]:
    """Names a node's subgraphs read from the enclosing scope (If/Loop/Scan bodies), in first-use order.

    Example:
        >>> outer_references(loop_node)                   # doctest: +SKIP
        ['weight', 'hidden']
    """
    found: dict[str, None] = {}
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for g in graphs:
            for name in _free_names(g):
                found.setdefault(name)
    return list(found)


def _free_names(graph: onnx.GraphProto) -> list[str]:
    local = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    local |= {sparse_name(t) for t in graph.sparse_initializer}
    free: dict[str, None] = {}
    for node in graph.node:
        for name in [*node.input, *outer_references(node)]:
            if name not in local:
                free.setdefault(name)
        local.update(node.output)
    for out in graph.output:
        if out.name not in local:
            free.setdefault(out.name)
    return list(free)


# --------------------------------------------------------------------------------------------
# Sizes
# --------------------------------------------------------------------------------------------


def itemsize(elem_type: int) -> int:
    """Bytes of one element of an ONNX element type (0 for strings and undefined: no fixed size).

    Example:
        >>> itemsize(onnx.TensorProto.FLOAT16), itemsize(onnx.TensorProto.STRING)
        (2, 0)
    """
    import numpy as np

    if elem_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        return 0
    return max(1, np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).itemsize)


def check_size(what: str, dims: Sequence[int], elem_type: int, where: str, fix: str,
               error: type[OnnxError] = OnnxError) -> None:
    """Refuse a shape with a negative dimension or over :data:`MAX_TENSOR_BYTES` (strings: 1 byte an element).

    ``what`` names the tensor (``"input 'x'"``), ``fix`` says what the user can do.

    Example:
        >>> check_size("input 'x'", (2**62, 4), onnx.TensorProto.FLOAT, "m.onnx", "fix")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        partitioner.errors.OnnxError: m.onnx: input 'x' has shape 4611686018427387904x4 (... tensor: fix
    """
    dims = [int(d) for d in dims]
    for axis, d in enumerate(dims):
        if d < 0:
            raise error(f"{where}: {what} has shape {_dims(dims)}, whose dimension {axis} is negative: {fix}")
    size = math.prod(dims) * max(1, itemsize(elem_type))
    if size > MAX_TENSOR_BYTES:
        raise error(f"{where}: {what} has shape {_dims(dims)} ({size:,} bytes), over the {MAX_TENSOR_BYTES:,} "
                    f"bytes (1 PiB) hetpart takes for one tensor: {fix}")


# --------------------------------------------------------------------------------------------
# Binding the input shapes
# --------------------------------------------------------------------------------------------


def _named(shapes: Mapping[str, Sequence[int]] | Sequence[Sequence[int]] | None, inputs: tuple[str, ...],
           where: str) -> dict[str, Sequence[int]]:
    if shapes is None:
        return {}
    if isinstance(shapes, Mapping):
        return dict(shapes)
    shapes = list(shapes)
    if len(shapes) != len(inputs):
        raise InputShapeError(f"{where}: {len(shapes)} input shapes given for {len(inputs)} inputs "
                        f"({', '.join(map(repr, inputs))}): give one per input, or name them")
    return dict(zip(inputs, shapes))


def _bind_shapes(graph: onnx.GraphProto, inputs: tuple[str, ...], shapes: dict[str, Sequence[int]],
                 where: str) -> None:
    """Write ``shapes`` into the graph inputs' types; every tensor input must end fully static."""
    unknown = [name for name in shapes if name not in inputs]
    if unknown:
        raise InputShapeError(f"{where}: input shape given for {unknown[0]!r}, which is not an input of the model; "
                        f"its inputs are: {', '.join(map(repr, inputs)) or 'none'}")
    by_name = {i.name: i for i in graph.input}
    for name in inputs:
        value = by_name[name]
        if not value.type.HasField("tensor_type"):
            continue  # sequences, maps, optionals: shapes are those of the values fed at run time
        tensor = value.type.tensor_type
        template = "x".join(str(d.dim_value) if _known(d) else "N" for d in tensor.shape.dim)
        flag = f"input_shapes={{{name!r}: (...)}} (CLI: --input-shape {name}={template or 'AxBxC'})"
        if name in shapes:
            given = tuple(int(d) for d in shapes[name])
            if any(d < 0 for d in given):
                raise InputShapeError(f"{where}: input {name!r}: shape {given} has a negative dimension")
            check_size(f"input {name!r}", given, tensor.elem_type, where,
                       "give the shape the model is run with", InputShapeError)
            if tensor.HasField("shape") and len(tensor.shape.dim) != len(given):
                raise InputShapeError(f"{where}: input {name!r} has rank {len(tensor.shape.dim)} "
                                f"({_shape_text(tensor.shape)}), but the given shape {_dims(given)} has rank "
                                f"{len(given)}: give {len(tensor.shape.dim)} dimensions")
            if not tensor.HasField("shape"):
                tensor.shape.SetInParent()
                tensor.shape.dim.extend(onnx.TensorShapeProto.Dimension() for _ in given)
            declared = _shape_text(tensor.shape)
            for axis, (dim, size) in enumerate(zip(tensor.shape.dim, given)):
                if _known(dim) and dim.dim_value != size:
                    raise InputShapeError(f"{where}: input {name!r} is {declared} in the model, but "
                                    f"the given shape is {_dims(given)} (dimension {axis}: {dim.dim_value} vs "
                                    f"{size}): give a shape the model accepts")
                dim.Clear()
                dim.dim_value = size
            continue
        if not tensor.HasField("shape"):
            raise InputShapeError(f"{where}: input {name!r} has no shape in the model: give it with {flag}")
        for axis, dim in enumerate(tensor.shape.dim):
            if not _known(dim):
                label = f" ({dim.dim_param!r})" if dim.dim_param else ""
                raise InputShapeError(f"{where}: input {name!r} ({_shape_text(tensor.shape)}) has dimension {axis}"
                                f"{label} unknown: give it with {flag}")
        rank_template = "x".join("N" for _ in tensor.shape.dim) or "AxBxC"
        check_size(f"input {name!r}", [d.dim_value for d in tensor.shape.dim], tensor.elem_type, where,
                   f"give the shape the model is run with, input_shapes={{{name!r}: (...)}} (CLI: --input-shape "
                   f"{name}={rank_template})", InputShapeError)


def _known(dim: onnx.TensorShapeProto.Dimension) -> bool:
    """A dimension with a value; a negative ``dim_value`` (written by some exporters) is unknown too."""
    return dim.HasField("dim_value") and dim.dim_value >= 0


def _shape_text(shape: onnx.TensorShapeProto) -> str:
    return "x".join(str(d.dim_value) if _known(d) else (d.dim_param or "?") for d in shape.dim) or "scalar"


def _dims(shape: Sequence[int]) -> str:
    return "x".join(map(str, shape)) or "scalar"


__all__ = ["LoadedOnnx", "MAX_TENSOR_BYTES", "ORT_DOMAINS", "check_size", "itemsize", "load_onnx",
           "outer_references", "sparse_name"]
