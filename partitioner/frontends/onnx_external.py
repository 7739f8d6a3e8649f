"""Tensors an ONNX model keeps in files beside it (external data): found, checked, read in.

In: a model and the folder it was read from. Out: :func:`external_tensors`, every tensor whose
bytes live outside the ``.onnx`` file, as an :class:`ExternalTensor`: initializers, the values and
indices of sparse initializers, and tensors held by node attributes (a ``Constant``'s ``value``,
a ``ConstantOfShape``'s ``value``, a sparse ``Constant``'s parts), in If/Loop/Scan bodies too.
Each one is checked, with a one-line :class:`~partitioner.errors.OnnxError` naming it:

* the model has a folder (a ``ModelProto`` given in memory has none to read from);
* its ``external_data`` entries are well formed (a location, integer offset and length);
* the file resolves inside the model's folder (no absolute path, ``..`` or symlink out of it);
* the file exists and is a regular file;
* the bytes its shape needs (or its ``length``) lie within the file.

Every location is resolved against the model's folder, never the current one: onnx's reference
evaluator, and onnxruntime given a model as bytes, read a relative location from the current folder,
so a file planted there would change a folded constant. :func:`read_external` and
:func:`inline_external_data` read the bytes from the checked file for whoever needs them (constant
folding here; a part model, which must not keep a reference into the model's folder).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path

import onnx
from onnx.external_data_helper import uses_external_data

from partitioner.errors import OnnxError

#: element types stored two to a byte
_PACKED = frozenset(getattr(onnx.TensorProto, n) for n in ("INT4", "UINT4", "FLOAT4E2M1")
                    if hasattr(onnx.TensorProto, n))


@dataclasses.dataclass(frozen=True)
class ExternalTensor:
    """One tensor whose bytes live in a file beside the model, checked (see the module docstring)."""

    what: str          # how errors name it: "initializer 'w'", "node 'c' (Constant) attribute 'value'"
    name: str          # the tensor's name (a node attribute's: the tensor's own name, else the node's output)
    node: int | None   # the top-level node holding it (in an attribute or a body); None: a top-level initializer
    file: Path         # the data file, resolved, inside the model's folder
    offset: int        # where its bytes start in ``file``
    length: int        # how many bytes it takes from ``file``


def external_tensors(model: onnx.ModelProto, base_dir: Path | None, where: str) -> tuple[ExternalTensor, ...]:
    """Every tensor of ``model`` stored in an external file, each checked (see the module docstring).

    Raises:
        OnnxError: a tensor's data is missing, outside the model's folder, malformed or too short.

    Example:
        >>> [t.what for t in external_tensors(onnx.load("m.onnx", load_external_data=False),
        ...                                    Path("."), "m.onnx")]   # doctest: +SKIP
        ["initializer 'w'", "node 'scale' (Constant) attribute 'value'"]
    """
    found = []
    for what, name, node, tensor in _stored(model.graph, None, ""):
        if uses_external_data(tensor):
            found.append(_checked(what, name, node, tensor, base_dir, where))
    return tuple(found)


def read_external(tensor: onnx.TensorProto, base_dir: Path) -> onnx.TensorProto:
    """A copy of ``tensor`` with its bytes read from its file in ``base_dir`` (checked as above).

    Example:
        >>> read_external(model.graph.node[0].attribute[0].t, Path("models")).HasField("raw_data")  # doctest: +SKIP
        True
    """
    if not uses_external_data(tensor):
        return tensor
    record = _checked(f"tensor {tensor.name!r}", tensor.name, None, tensor, base_dir, str(base_dir))
    copy = onnx.TensorProto()
    copy.CopyFrom(tensor)
    with open(record.file, "rb") as f:
        f.seek(record.offset)
        copy.raw_data = f.read(record.length)
    copy.data_location = onnx.TensorProto.DEFAULT
    del copy.external_data[:]
    return copy


def inline_external_data(node: onnx.NodeProto, base_dir: Path) -> onnx.NodeProto:
    """``node`` with the bytes of every external tensor its attributes (and bodies) hold read in.

    The node itself is returned when it holds none; otherwise a copy (the model keeps its references).

    Example:
        >>> inline_external_data(constant_node, loaded.base_dir).attribute[0].t.data_location   # doctest: +SKIP
        0
    """
    if not any(uses_external_data(t) for _, _, _, t in _node_tensors(node, None, "")):
        return node
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    for attr in copy.attribute:
        _inline_attribute(attr, base_dir)
    return copy


# --------------------------------------------------------------------------------------------
# Finding them
# --------------------------------------------------------------------------------------------

_Found = tuple[str, str, "int | None", onnx.TensorProto]


def _stored(graph: onnx.GraphProto, top: int | None, prefix: str) -> Iterator[_Found]:
    """(what, name, top-level node, tensor) for every tensor a graph stores, bodies included."""
    for t in graph.initializer:
        yield f"{prefix}initializer {t.name!r}", t.name, top, t
    for s in graph.sparse_initializer:
        yield f"{prefix}sparse initializer {s.values.name!r} (values)", s.values.name, top, s.values
        yield f"{prefix}sparse initializer {s.values.name!r} (indices)", s.values.name, top, s.indices
    for i, node in enumerate(graph.node):
        yield from _node_tensors(node, i if top is None else top, prefix)


def _node_tensors(node: onnx.NodeProto, top: int | None, prefix: str) -> Iterator[_Found]:
    label = f"{prefix}node {node.name or node.op_type!r} ({node.op_type})"
    output = next((o for o in node.output if o), "")
    for attr in node.attribute:
        what = f"{label} attribute {attr.name!r}"
        tensors: list[onnx.TensorProto] = []
        if attr.type == onnx.AttributeProto.TENSOR:
            tensors = [attr.t]
        elif attr.type == onnx.AttributeProto.TENSORS:
            tensors = list(attr.tensors)
        elif attr.type == onnx.AttributeProto.SPARSE_TENSOR:
            tensors = [attr.sparse_tensor.values, attr.sparse_tensor.indices]
        elif attr.type == onnx.AttributeProto.SPARSE_TENSORS:
            tensors = [t for s in attr.sparse_tensors for t in (s.values, s.indices)]
        for t in tensors:
            yield what, t.name or output, top, t
        for body in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
            yield from _stored(body, top, f"{label} body {attr.name!r}: ")


def _inline_attribute(attr: onnx.AttributeProto, base_dir: Path) -> None:
    """Read in, in place, the external tensors of one attribute of a copied node."""
    tensors = [attr.t] if attr.type == onnx.AttributeProto.TENSOR else list(attr.tensors)
    for s in [attr.sparse_tensor] if attr.type == onnx.AttributeProto.SPARSE_TENSOR else attr.sparse_tensors:
        tensors += [s.values, s.indices]
    for t in tensors:
        if uses_external_data(t):
            t.CopyFrom(read_external(t, base_dir))
    for body in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
        for t in [*body.initializer, *(x for s in body.sparse_initializer for x in (s.values, s.indices))]:
            if uses_external_data(t):
                t.CopyFrom(read_external(t, base_dir))
        for inner in body.node:
            for a in inner.attribute:
                _inline_attribute(a, base_dir)


# --------------------------------------------------------------------------------------------
# Checking one
# --------------------------------------------------------------------------------------------


def _checked(what: str, name: str, node: int | None, tensor: onnx.TensorProto, base_dir: Path | None,
             where: str) -> ExternalTensor:
    entries = {e.key: e.value for e in tensor.external_data}
    location = entries.get("location", "")
    if base_dir is None:
        raise OnnxError(f"{where}: {what} keeps its data in {location!r}, and a ModelProto given in memory has no "
                        "folder to read it from: pass the model's path")
    try:
        offset, length = int(entries.get("offset") or 0), entries.get("length")
        length = int(length) if length is not None and length != "" else None
    except ValueError:
        raise OnnxError(f"{where}: {what} has malformed external_data (offset {entries.get('offset')!r}, length "
                        f"{entries.get('length')!r}): offsets and lengths are integers; save the model again") from None
    if not location or offset < 0 or (length is not None and length < 0):
        raise OnnxError(f"{where}: {what} has malformed external_data (location {location!r}, offset {offset}, "
                        f"length {length}): save the model again")
    folder = base_dir.resolve()
    file = (base_dir / location).resolve()
    if folder not in file.parents:
        raise OnnxError(f"{where}: {what} names external data {location!r} outside the model's folder {base_dir}: "
                        "keep the data files beside the model")
    if not file.is_file():
        raise OnnxError(f"{where}: {what} keeps its data in {location!r}, which is not in {base_dir}: copy that "
                        "file beside the model")
    size = file.stat().st_size
    needed = _stored_bytes(tensor)
    if length is not None and needed is not None and length < needed:
        raise OnnxError(f"{where}: {what} has shape {_dims(tensor.dims)}, {needed} bytes, but its external_data "
                        f"gives a length of {length}: save the model again")
    take = length if length is not None else (needed if needed is not None else size - offset)
    if offset + take > size:
        raise OnnxError(f"{where}: {what} needs bytes {offset}-{offset + take} of {location!r}, which has only "
                        f"{size}: the data file is truncated; copy it again")
    return ExternalTensor(what, name, node, file, offset, take)


def _stored_bytes(tensor: onnx.TensorProto) -> int | None:
    """Bytes a tensor of this shape and type takes in raw form (None: strings, no fixed size)."""
    import numpy as np

    if tensor.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        return None
    n = math.prod(tensor.dims)
    if tensor.data_type in _PACKED:
        return (n + 1) // 2
    try:
        return n * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return None  # an element type this onnx cannot size: the file's length is all we can check


def _dims(dims: list[int] | tuple[int, ...]) -> str:
    return "x".join(map(str, dims)) or "scalar"


__all__ = ["ExternalTensor", "external_tensors", "inline_external_data", "read_external"]
