"""Is a value an ONNX model, or a graph imported from one? Answered without importing ``onnx``.

``import onnx`` costs over a second (its ``ml_dtypes`` extension), so the planner and the CLI ask
here and import the ONNX front end only for ONNX input: a value cannot be a ``ModelProto`` before
``onnx`` is imported, nor a graph from :func:`~partitioner.frontends.onnx.from_onnx` before that
module is.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def is_onnx_model(value: Any) -> bool:
    """Whether ``value`` is an ONNX model ``from_onnx`` takes: a ``ModelProto`` or a ``.onnx`` path.

    Example:
        >>> is_onnx_model("resnet50.onnx"), is_onnx_model("gpt:tiny")
        (True, False)
    """
    onnx = sys.modules.get("onnx")
    if onnx is not None and isinstance(value, onnx.ModelProto):
        return True
    return isinstance(value, (str, os.PathLike)) and str(value).lower().endswith(".onnx")


def is_onnx_graph(graph: Any) -> bool:
    """Whether ``graph`` (an OpGraph) came from ``from_onnx``."""
    front_end = sys.modules.get("partitioner.frontends.onnx")
    return front_end is not None and isinstance(getattr(graph, "source", None), front_end.OnnxSource)
