"""The ONNX case of ``bench/gpu_check.py``: the seed case exported to ONNX, placed, run on providers.

The calibration model (``emb-transformer``, the size ``gpu_check`` runs at) is exported with
``torch.onnx.export`` (``dynamo=False``; at ``base`` its 4 GiB embedding goes to an external data
file beside the model), imported with ``from_onnx`` and placed on ``h200-host`` with ``cuda:0``
capped at "embedding + half the layers" (the cap of ``gpu_check``'s ``ILP[emb+half]``; ONNX plans
do not stream weights, so what does not fit runs on the CPU). Its parts are written with
``plan.emit_onnx`` and run with ``load_parts``: ``cuda:0``'s parts on the CUDA execution provider
when this onnxruntime has it (``onnxruntime-gpu``), else on the CPU provider. Rows:

* ``onnx whole CPU``: one CPU-provider session of the whole model — the reference for outputs;
* ``onnx ILP[emb+half]``: the parts; the note gives measured / predicted and whole-CPU / parts.

    python bench/gpu_check.py            # runs it after the torch cases; --skip-onnx leaves it out
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from backends.onnx_parts import example_feeds, load_parts, whole_session
from models.onnx_models import export_zoo
from partitioner import from_onnx, partition

MODEL = "emb-transformer"


def onnx_rows(env: Any, cap: int, row_type: Any, timed: Any) -> list[Any]:
    """The rows of the ONNX case (see the module docstring); ``row_type`` and ``timed`` are
    ``gpu_check``'s ``Row`` and ``timed``, so the rows join its table."""
    cuda = "CUDAExecutionProvider" in ort.get_available_providers()
    binding = None if env.cuda and cuda else {"cuda:0": "cpu"}
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        path = export_zoo(MODEL, env.size, Path(tmp) / f"{MODEL}.onnx")
        graph = from_onnx(path, name=f"{MODEL}:{env.size}")
        plan = partition(graph, devices="h200-host", memory={"cuda:0": cap}, time_limit=30)
        folder = plan.emit_onnx(Path(tmp) / "parts", graph)
        parts = load_parts(folder, binding)
        whole = whole_session(path)
        feeds = example_feeds(parts.manifest.inputs)
        reference = dict(zip(parts.output_names, whole.run(None, feeds)))
        outputs = parts.run(feeds)
        err = max(float(np.abs(outputs[n] - reference[n]).max()) for n in parts.output_names)
        clock = _HostClock(env.repeat)  # run() returns when its outputs are on the host: nothing to wait for
        whole_s = timed(lambda: whole.run(None, feeds), clock)
        parts_s = timed(lambda: parts.run(feeds), clock)
    predicted = plan.predicted["total_s"]
    placed = " / ".join(f"{d}->{p}" for d, p in parts.binding().items())
    why = "" if binding is None else ("; no CUDA provider in this onnxruntime (pip install onnxruntime-gpu)"
                                      if not cuda else "; no CUDA device")
    return [
        row_type("onnx whole CPU", "one session, CPUExecutionProvider", plan.baselines["single:cpu"].total_s,
                 whole_s, None, None, 0.0, "", "the reference for outputs"),
        row_type("onnx ILP[emb+half]", f"{len(parts.manifest.parts)} parts: {placed}", predicted, parts_s, None,
                 None, err, "", f"measured/predicted {parts_s / predicted:.2f}x, whole CPU/parts "
                 f"{whole_s / parts_s:.2f}x{why}"),
    ]


class _HostClock:
    """What ``gpu_check.timed`` reads from its environment: the repeat count and a sync (a no-op)."""

    def __init__(self, repeat: int) -> None:
        self.repeat = repeat

    def sync(self) -> None:
        return None
