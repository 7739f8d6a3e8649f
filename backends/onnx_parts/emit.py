"""A plan for an ONNX model → its parts: built in memory as chained sessions, or written to a folder.

In: a :class:`~partitioner.plan.Plan` made for an ONNX model (``capture == "onnx"``), that model (a
``.onnx`` path or ``ModelProto``). Out: :func:`build_parts` — a
:class:`~backends.onnx_parts.session.PartitionedSession`; :func:`emit_onnx` — a folder holding
``part_0.onnx`` … and ``manifest.json`` (:mod:`backends.onnx_parts.manifest`), which
:func:`~backends.onnx_parts.session.load_parts` runs.

The model is imported again with the input shapes the plan records and checked against the plan's
fingerprint, so parts are never cut from a model the plan was not made for. The folder appears
whole or not at all: the parts are built in memory, written to a temporary folder beside the target
and swapped into place (:func:`~partitioner.files.write_folder`); an existing folder is replaced only
with ``force``, and only when it is a parts folder (:data:`~backends.onnx_parts.folder.PARTS`: its
manifest and parts, nothing else). A part whose original initializers lived in external data files
(or that is larger than :data:`EXTERNAL_ABOVE`) keeps its weights in ``part_K.onnx.data`` beside it.
The manifest records the sha256 of every file it writes, which
:func:`~backends.onnx_parts.session.load_parts` checks.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx
from onnx.external_data_helper import uses_external_data

from backends.onnx_parts.folder import PARTS, digests
from backends.onnx_parts.manifest import Manifest, PartEntry
from backends.onnx_parts.parts import Part, part_model, split
from backends.onnx_parts.session import PartitionedSession
from partitioner.errors import InputShapeError, OnnxError, PlanMismatch
from partitioner.files import check_folder, write_folder
from partitioner.frontends.onnx import OnnxSource, from_onnx, is_onnx_graph
from partitioner.ir import OpGraph

log = logging.getLogger(__name__)

#: parts above this size are written with their weights in an external data file
EXTERNAL_ABOVE = 1 << 30


def graph_for(plan: Any, model: str | os.PathLike[str] | onnx.ModelProto | OpGraph,
              input_shapes: Mapping[str, Sequence[int]] | None = None) -> OpGraph:
    """Import ``model`` with the plan's input shapes and check it is the model the plan was made for
    (an OpGraph from :func:`~partitioner.frontends.onnx.from_onnx` is checked as it is).

    Raises:
        PlanMismatch: the model (or its input shapes) differs from the plan's.
        OnnxError: the plan was not made for an ONNX model.

    Example:
        >>> graph = graph_for(plan, "resnet50.onnx")          # doctest: +SKIP
    """
    from partitioner.plan.precision import refuse_precision

    refuse_precision(plan, "the onnxruntime backend (emit_onnx)")
    if plan.capture != "onnx":
        raise OnnxError(f"{plan.source} was made for a torch model ({plan.capture} capture), not an ONNX model: "
                        "run it with plan.emit(module) / `hetpart emit MODEL.py`, or plan the .onnx file")
    if isinstance(model, OpGraph):
        if not is_onnx_graph(model):
            raise OnnxError(f"graph {model.name!r} was not imported from ONNX: give the .onnx model")
        graph = model
    else:
        shapes: Any = input_shapes if input_shapes is not None else [shape for shape, _ in plan.inputs]
        try:
            graph = from_onnx(model, shapes, name=plan.model_name)
        except InputShapeError as exc:
            if input_shapes is not None:
                raise
            recorded = ", ".join("x".join(map(str, s)) or "scalar" for s in shapes)
            raise PlanMismatch(f"{plan.source} was made for inputs of shapes {recorded}, which do not fit this "
                               f"model ({exc}); make the plan again for it") from None
    plan.check_graph(graph)
    return graph


def build_parts(plan: Any, model: str | os.PathLike[str] | onnx.ModelProto | OpGraph,
                device_map: Mapping[str, str] | None = None, *,
                input_shapes: Mapping[str, Sequence[int]] | None = None) -> PartitionedSession:
    """The plan's parts as chained onnxruntime sessions, built in memory.

    Raises:
        PlanMismatch: ``model`` is not the model the plan was made for.
        OnnxError: a provider is missing, or a part is over protobuf's 2 GB (write it with
            :func:`emit_onnx` and open it with ``load_parts``).

    Example:
        >>> session = build_parts(plan, "model.onnx", {"cuda:0": "cpu"})   # doctest: +SKIP
        >>> session.run({"input": x})["output"].shape
        (1, 1000)
    """
    graph = graph_for(plan, model, input_shapes)
    parts, models, manifest = _parts(plan, graph)
    blobs = []
    for part, proto in zip(parts, models):
        try:
            blobs.append(proto.SerializeToString())
        except ValueError as exc:  # protobuf refuses messages over 2 GB
            raise OnnxError(f"part {part.index} ({part.device}) is over 2 GB ({exc}): write the parts with "
                            "plan.emit_onnx(DIR, model) and run them with backends.onnx_parts.load_parts(DIR)") from None
    return PartitionedSession(manifest, blobs, device_map, where=f"parts of {plan.model_name}")


def emit_onnx(plan: Any, model: str | os.PathLike[str] | onnx.ModelProto | OpGraph, folder: str | os.PathLike[str], *,
              input_shapes: Mapping[str, Sequence[int]] | None = None, force: bool = False) -> Path:
    """Write the plan's parts and their manifest into ``folder`` (see the module docstring).

    Raises:
        HetpartError: ``folder`` exists and ``force`` is false, it holds anything but parts (a model, a
            plan: it is never replaced), or it cannot be written.
        PlanMismatch: ``model`` is not the model the plan was made for.

    Example:
        >>> emit_onnx(plan, "model.onnx", "parts")            # doctest: +SKIP
        PosixPath('parts')
    """
    folder = Path(folder)
    check_folder(folder, force=force, kind=PARTS)  # before the work
    graph = graph_for(plan, model, input_shapes)
    parts, models, manifest = _parts(plan, graph)
    source = graph.source

    def fill(tmp: Path) -> None:
        entries = []
        for entry, proto in zip(manifest.parts, models):
            external = _had_external_data(source, proto) or proto.ByteSize() > EXTERNAL_ABOVE
            onnx.save_model(proto, str(tmp / entry.file), save_as_external_data=external,
                            all_tensors_to_one_file=True, location=f"{entry.file}.data", size_threshold=1024,
                            convert_attribute=external)
            entries.append(dataclasses.replace(entry, files=digests(tmp, entry.file)))
        dataclasses.replace(manifest, parts=tuple(entries)).save(tmp)

    write_folder(folder, fill, force=force, kind=PARTS)
    log.info("wrote %d parts of %s to %s", len(parts), plan.model_name, folder)
    return folder


def _parts(plan: Any, graph: OpGraph) -> tuple[list[Part], list[onnx.ModelProto], Manifest]:
    if not is_onnx_graph(graph):
        raise OnnxError(f"graph {graph.name!r} was not imported from ONNX")
    source: OnnxSource = graph.source
    parts = split(plan.placement, plan.schedule, graph)
    models = [part_model(source, part, plan.model_name) for part in parts]
    types = source.analysis.types
    devices = {d.name: (d.kind.value, d.onnx_provider) for d in plan.devices.devices}
    manifest = Manifest(
        name=plan.model_name, fingerprint=plan.fingerprint, predicted_s=plan.predicted.get("total_s"),
        devices=devices,
        inputs=tuple((t, graph.tensors[t].dtype, graph.tensors[t].shape) for t in graph.inputs),
        outputs=graph.outputs,
        parts=tuple(PartEntry(f"part_{p.index}.onnx", p.device, len(p.ops), p.inputs, p.outputs,
                              python_io=any(_not_plain(types.get(t)) for t in (*p.inputs, *p.outputs)))
                    for p in parts),
    )
    manifest.check(f"parts of {plan.model_name}")
    return parts, models, manifest


def _not_plain(t: onnx.TypeProto | None) -> bool:
    """A value OrtValues cannot carry between sessions from numpy: not a tensor, or strings."""
    return t is None or t.WhichOneof("value") != "tensor_type" or t.tensor_type.elem_type == onnx.TensorProto.STRING


def _had_external_data(source: OnnxSource, proto: onnx.ModelProto) -> bool:
    external = {t.name for t in source.model.graph.initializer if uses_external_data(t)}
    return any(t.name in external for t in proto.graph.initializer)


__all__ = ["EXTERNAL_ABOVE", "build_parts", "emit_onnx", "graph_for"]
