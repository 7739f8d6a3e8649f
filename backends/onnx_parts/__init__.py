"""The onnxruntime-parts backend: a plan for an ONNX model runs as one session per part, chained.

Each part of the placement (the ops of one device that run back to back) becomes its own ONNX
model, run by an ``onnxruntime.InferenceSession`` with its device's execution provider; tensors
pass between sessions as ``OrtValue`` objects (I/O binding on the CUDA provider). A device bound to
the CPU here (``{"cuda:0": "cpu"}``) runs its parts on the CPU provider, so any plan is checked on a
CPU-only machine. Splitting keeps onnxruntime's optimisations: every part carries the constant
subgraphs its weights come from, so they are folded once per session, never recomputed per call.

Modules:

=============  =====================================================================================
module         what it does
=============  =====================================================================================
``parts``      :func:`split` the placement into parts, :func:`part_model` builds each part's model
``manifest``   the ``manifest.json`` of a parts folder: run order, inputs and outputs, providers, digests
``folder``     a parts folder on disk: what ``force`` may replace, each part's files checked (sha256, no links)
``external``   tensors the model keeps in external files (``Constant`` values too), read into the parts
``providers``  which execution provider runs each device; the part sessions' options
``interrupt``  runs that Ctrl-C stops (``RunOptions.terminate``)
``session``    :class:`PartitionedSession` (``run``) and :func:`load_parts` (open a written folder)
``emit``       :func:`build_parts` (in memory) and :func:`emit_onnx` (a folder; ``Plan.emit_onnx``)
``check``      :func:`check_parts`: the parts against one whole-model session
=============  =====================================================================================

Example:
    >>> from backends.onnx_parts import load_parts
    >>> plan.emit_onnx("parts", "model.onnx")                   # doctest: +SKIP
    >>> load_parts("parts", {"cuda:0": "cpu"}).run({"input": x})  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from backends.compare import CheckReport
from backends.onnx_parts.check import check_parts, example_feeds, whole_session
from backends.onnx_parts.emit import build_parts, emit_onnx, graph_for
from backends.onnx_parts.manifest import Manifest
from backends.onnx_parts.parts import Part, part_model, split
from backends.onnx_parts.providers import bind_providers
from backends.onnx_parts.session import PartitionedSession, load_parts
from partitioner.frontends.onnx import is_onnx_graph
from partitioner.ir import OpGraph


class OnnxBackend:
    """ONNX parts on onnxruntime execution providers (see the package docstring)."""

    name = "onnx"
    runs = ("the plan as ONNX parts, one onnxruntime session per part with its device's execution provider "
            "(CPU, CUDA, or the profile's), tensors handed between sessions as OrtValues")

    def unsupported(self, graph: OpGraph) -> dict[str, str]:
        """Every op of a graph imported from ONNX runs here; a graph captured from torch does not."""
        if is_onnx_graph(graph):
            return {}
        return {op: "the graph was not imported from ONNX (use partitioner.from_onnx)" for op in graph.ops}

    def bind(self, plan: Any, device_map: Mapping[str, str] | None = None) -> dict[str, str]:
        """Logical device -> the execution provider its parts run on (``CUDAExecutionProvider:0``)."""
        providers = bind_providers({d.name: (d.kind.value, d.onnx_provider) for d in plan.devices.devices},
                                   plan.placement.values(), device_map)
        return {d: p.name + (f":{p.device_id}" if p.device_type == "cuda" else "") for d, p in providers.items()}

    def build(self, plan: Any, model: Any, device_map: Mapping[str, str] | None = None,
              **options: Any) -> PartitionedSession:
        """:func:`build_parts` (``options``: ``input_shapes``)."""
        return build_parts(plan, model, device_map, **options)

    def check(self, plan: Any, model: Any, inputs: Any, device_map: Mapping[str, str] | None = None,
              **options: Any) -> CheckReport:
        """:func:`check_parts` (``options``: ``repeat``, ``input_shapes``)."""
        return check_parts(plan, model, inputs, device_map, **options)


BACKEND = OnnxBackend()

__all__ = ["BACKEND", "Manifest", "OnnxBackend", "Part", "PartitionedSession", "build_parts", "check_parts",
           "emit_onnx", "example_feeds", "graph_for", "load_parts", "part_model", "split", "whole_session"]
