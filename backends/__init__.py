"""Where a plan runs: the execution targets, one sub-package or module each.

``partitioner`` makes a plan; a backend runs it. Every backend implements the same small
interface (:class:`backends.interface.Backend`)::

    name          str: the backend's name ("torch")
    runs          str: one sentence saying what it runs
    unsupported(graph) -> {op: reason}     the ops of a graph it cannot run ({} = all of them)
    bind(plan, device_map) -> {logical: physical}
                  bind the plan's logical devices to present ones ({"cuda:0": "cpu"} runs any
                  plan on a CPU-only machine); an error names a missing device and the fix
    build(plan, model, device_map, **options) -> the runnable thing
    check(plan, model, inputs, device_map, **options) -> backends.compare.CheckReport
                  run the built thing beside the original and compare outputs (and gradients)

Shared by all: :mod:`backends.binding` (device binding), :mod:`backends.compare` (dtype-aware
tolerances and the check report), :mod:`backends.strict_devices` (logical devices that really
differ on a CPU-only machine: each bound to its own CPU tag, every tensor tagged, the first op
reading across devices fails) and :mod:`backends.strict_report` (that run's copies and resident
bytes beside the plan's). A backend's tests run its programs under strict devices. A new backend is one module or sub-package here that defines
a ``BACKEND`` object with the interface, plus one line in :data:`BACKENDS`.

=============  ================================================================================
backend        what it runs
=============  ================================================================================
``torch``      the plan as an ``nn.Module`` (the captured graph with explicit transfers, weights
               on their devices, streamed weights prefetched) or as one readable Python file
``compile``    a model under ``torch.compile(model, backend="hetpart")``: every graph dynamo hands
               over is planned (plans cached per graph, shapes and options) and runs placed
``onnx``       the plan for an ONNX model as ONNX parts, one onnxruntime session per part with its
               device's execution provider, chained (``backends.onnx_parts``)
``pipeline``   a pipeline plan's stages as ``torch.distributed.pipelining`` ``PipelineStage`` objects,
               one rank each, driven by ``ScheduleGPipe`` or ``Schedule1F1B`` under torchrun
=============  ================================================================================

Example:
    >>> from backends import get_backend
    >>> get_backend("torch").name
    'torch'
"""

from __future__ import annotations

import importlib

from backends.interface import Backend
from partitioner.errors import HetpartError

#: backend name -> the module that defines its ``BACKEND``
BACKENDS: dict[str, str] = {
    "torch": "backends.torch",
    "compile": "backends.compile",
    "onnx": "backends.onnx_parts",
    "pipeline": "backends.pipeline",
}


def get_backend(name: str) -> Backend:
    """The backend called ``name`` (see :data:`BACKENDS`).

    Raises:
        HetpartError: no backend has that name; the message lists the known ones.
    """
    if name not in BACKENDS:
        raise HetpartError(f"unknown backend {name!r}: use one of {', '.join(BACKENDS)}")
    return importlib.import_module(BACKENDS[name]).BACKEND


__all__ = ["BACKENDS", "Backend", "get_backend"]
