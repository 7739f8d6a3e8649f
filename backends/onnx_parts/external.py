"""Tensors a part carries whose data the original model keeps in external files, read in.

In: a node, initializer or model-local function of the original model, and the folder of the model
file (``LoadedOnnx.base_dir``). Out: the same value where no tensor in it uses external data, else a
copy with every such tensor's bytes read in: initializers, sparse initializers, and the tensors that
nodes hold in attributes (a ``Constant``'s ``value``, a ``ConstantOfShape``'s ``value``, any ``TENSOR``,
``TENSORS`` or sparse attribute), inside subgraphs (``Loop`` / ``If`` / ``Scan`` bodies) and
functions too.

A part is run from bytes or from another folder, where a reference to ``weights.bin`` would be read
relative to the current folder (onnxruntime, for a model loaded from bytes) or the parts folder: so a
part never keeps one. Data is read from the model's folder only, never the current one: a location
outside it, a missing file, or a model given in memory (no folder) is a one-line
:class:`~partitioner.errors.OnnxError` naming the tensor.

Example:
    >>> node = inlined_node(model.graph.node[0], Path("model"), "part 0")   # doctest: +SKIP
    >>> node.attribute[0].t.data_location == onnx.TensorProto.DEFAULT
    True
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import onnx
from onnx.external_data_helper import ExternalDataInfo, load_external_data_for_tensor, uses_external_data

from partitioner.errors import OnnxError

Message = TypeVar("Message", onnx.NodeProto, onnx.TensorProto, onnx.SparseTensorProto, onnx.FunctionProto)


def inlined(value: Message, base_dir: Path | None, where: str) -> Message:
    """``value`` itself when no tensor in it uses external data, else a copy with their data read in.

    Raises:
        OnnxError: a tensor's data file is outside ``base_dir``, missing or short, or ``base_dir`` is
            None (a model given in memory); the message names the tensor and the fix.

    Example:
        >>> inlined(initializer, Path("model"), "part 1").HasField("raw_data")   # doctest: +SKIP
        True
    """
    if not any(uses_external_data(t) for t in _tensors(value)):
        return value
    copy = type(value)()
    copy.CopyFrom(value)
    for tensor in _tensors(copy):
        if uses_external_data(tensor):
            _read_in(tensor, base_dir, where)
    return copy


def external_tensor(model: onnx.ModelProto) -> onnx.TensorProto | None:
    """The first tensor of ``model`` (graph, subgraphs, functions) whose data is in an external file.

    Example:
        >>> external_tensor(onnx.load("model.onnx", load_external_data=False)).name   # doctest: +SKIP
        'c'
    """
    for value in (model.graph, *model.functions):
        for tensor in _tensors(value):
            if uses_external_data(tensor):
                return tensor
    return None


def _read_in(tensor: onnx.TensorProto, base_dir: Path | None, where: str) -> None:
    info = ExternalDataInfo(tensor)
    name = tensor.name or "<unnamed>"
    if base_dir is None:
        raise OnnxError(f"{where}: tensor {name!r} keeps its data in {info.location!r}, and a model given in memory "
                        "has no folder to read it from: pass the model's path")
    folder = base_dir.resolve()
    file = (folder / info.location).resolve()
    if folder not in file.parents:
        raise OnnxError(f"{where}: tensor {name!r} names external data {info.location!r} outside the model's folder "
                        f"{base_dir}: keep the data files beside the model")
    if not file.is_file():
        raise OnnxError(f"{where}: tensor {name!r} keeps its data in {info.location!r}, which is not in {base_dir}: "
                        "copy that file beside the model")
    try:
        load_external_data_for_tensor(tensor, str(folder))
    except (OSError, ValueError, onnx.checker.ValidationError) as exc:  # onnx's own checks (bounds, links)
        raise OnnxError(f"{where}: cannot read tensor {name!r} from {info.location!r} in {base_dir}: "
                        f"{str(exc).splitlines()[0][:200]}") from None
    tensor.data_location = onnx.TensorProto.DEFAULT
    del tensor.external_data[:]


def _tensors(value: onnx.NodeProto | onnx.TensorProto | onnx.SparseTensorProto | onnx.FunctionProto
             | onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every TensorProto in ``value``, subgraphs and sparse tensors' values and indices included."""
    if isinstance(value, onnx.TensorProto):
        yield value
    elif isinstance(value, onnx.SparseTensorProto):
        yield value.values
        yield value.indices
    elif isinstance(value, onnx.GraphProto):
        yield from value.initializer
        for sparse in value.sparse_initializer:
            yield from _tensors(sparse)
        for node in value.node:
            yield from _tensors(node)
    elif isinstance(value, onnx.FunctionProto):
        for node in value.node:
            yield from _tensors(node)
    else:
        for attr in value.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("sparse_tensor"):
                yield from _tensors(attr.sparse_tensor)
            for sparse in attr.sparse_tensors:
                yield from _tensors(sparse)
            if attr.HasField("g"):
                yield from _tensors(attr.g)
            for g in attr.graphs:
                yield from _tensors(g)


__all__ = ["external_tensor", "inlined"]
