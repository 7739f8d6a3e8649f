"""Do the chained part sessions compute what one session of the whole model computes?

In: a :class:`~partitioner.plan.Plan` made for an ONNX model, the model (path or ``ModelProto``),
inputs (``{name: numpy array}``, or seeded random ones of the plan's shapes), a binding
(``{"cuda:0": "cpu"}``). Out: a :class:`~backends.compare.CheckReport`: every graph output of the
parts compared with the whole-model session's (CPU provider, the same session options) under its
dtype's tolerance (:func:`~backends.compare.compare`), and the median wall time of both, interleaved.

Random inputs (:func:`example_feeds`): floating inputs standard normal, integer inputs 0 or 1 (valid
indices for any table with two rows), booleans fair coins; seed 0. Nothing here prints.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch

from backends.compare import EXACT, CheckReport, TensorError, compare, interleaved_medians
from backends.onnx_parts.emit import build_parts
from backends.onnx_parts.external import external_tensor
from backends.onnx_parts.interrupt import Interruptible
from backends.onnx_parts.providers import CPU, session_options
from partitioner.errors import HetpartError, OnnxError

__all__ = ["check_parts", "example_feeds", "whole_session"]

log = logging.getLogger(__name__)


def check_parts(plan: Any, model: str | os.PathLike[str] | onnx.ModelProto, inputs: Mapping[str, Any] | None = None,
                device_map: Mapping[str, str] | None = None, *, repeat: int = 5,
                input_shapes: Mapping[str, Sequence[int]] | None = None) -> CheckReport:
    """Run the parts and the whole model on the same inputs and compare every output.

    Raises:
        PlanMismatch: the model is not the one the plan was made for.
        OnnxError: a provider is missing, or a session fails; the message names the part.
        KeyboardInterrupt: Ctrl-C: the running session (the whole model's or a part's) was stopped.

    Example:
        >>> report = check_parts(plan, "model.onnx", device_map={"cuda:0": "cpu"})   # doctest: +SKIP
        >>> report.passed
        True
    """
    if repeat < 1:
        raise HetpartError(f"repeat must be at least 1, got {repeat}")
    parts = build_parts(plan, model, device_map, input_shapes=input_shapes)
    whole, interruptible = whole_session(model), Interruptible()  # Ctrl-C stops it, as it stops the parts
    feeds = dict(inputs) if inputs is not None else example_feeds(parts.manifest.inputs)

    def run_whole() -> list[Any]:
        return interruptible(lambda options: whole.run(None, feeds, options))

    log.debug("running %d parts of %s beside the whole model", len(parts.manifest.parts), plan.model_name)
    reference = dict(zip([o.name for o in whole.get_outputs()], run_whole()))
    got = parts.run(feeds)
    outputs = tuple(e for name in parts.output_names for e in _compare(name, got[name], reference[name]))
    whole_s, parts_s = interleaved_medians([run_whole, lambda: parts.run(feeds)], repeat)
    return CheckReport(model_name=plan.model_name, binding=parts.binding(), training=False, repeat=repeat,
                       outputs=outputs, loss=None, grads=(), original_s=whole_s, emitted_s=parts_s,
                       passed=all(e.passed for e in outputs))


def whole_session(model: str | os.PathLike[str] | onnx.ModelProto) -> ort.InferenceSession:
    """One CPU-provider session of the whole model, with the part sessions' options.

    Raises:
        OnnxError: onnxruntime cannot load the model, or a ``ModelProto`` keeps a tensor's data in an
            external file (give its path: it is read from the model's folder, never the current one).

    Example:
        >>> whole_session("model.onnx").get_inputs()[0].name  # doctest: +SKIP
        'input'
    """
    if isinstance(model, onnx.ModelProto) and (tensor := external_tensor(model)) is not None:
        # onnxruntime would read it relative to the current folder: a file planted there changes the result
        raise OnnxError(f"tensor {tensor.name or '<unnamed>'!r} keeps its data in an external file, and a model "
                        "given in memory has no folder to read it from: pass the model's path")
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    try:
        return ort.InferenceSession(source, session_options(), providers=[CPU])
    except Exception as exc:  # onnxruntime's exception types derive from Exception only
        raise OnnxError(f"onnxruntime cannot load the whole model: {str(exc).splitlines()[0][:300]}") from exc


def example_feeds(inputs: Sequence[tuple[str, str, Sequence[int]]], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random inputs for ``(name, dtype, shape)`` triples (see the module docstring).

    Raises:
        OnnxError: an input is not a numeric or boolean tensor; give the inputs instead.

    Example:
        >>> example_feeds([("x", "float32", (2, 3))])["x"].shape
        (2, 3)
    """
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, dtype, shape in inputs:
        if dtype == "bool":
            feeds[name] = rng.random(shape) < 0.5
        elif dtype in ("float16", "float32", "float64"):
            feeds[name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.startswith(("int", "uint")):
            feeds[name] = rng.integers(0, 2, size=shape).astype(dtype)
        else:
            raise OnnxError(f"input {name!r} is {dtype}: hetpart makes random inputs only for numeric and bool "
                            f"tensors; give it (CLI: --input {name}=FILE.npy)")
    return feeds


def _compare(name: str, got: Any, want: Any) -> list[TensorError]:
    """compare() for numpy values; sequences element by element; other dtypes exactly."""
    if isinstance(want, list):
        got = got if isinstance(got, list) else []
        if len(got) != len(want):
            return [TensorError(name, "sequence", (len(want),), float("inf"), float("inf"), EXACT, False,
                                f"{len(got)} elements")]
        return [e for i, (g, w) in enumerate(zip(got, want)) for e in _compare(f"{name}[{i}]", g, w)]
    want, got = np.asarray(want), np.asarray(got)
    try:
        return [compare(name, torch.from_numpy(got.copy(order="C")), torch.from_numpy(want.copy(order="C")))]
    except TypeError:  # strings and dtypes torch has no type for: must be equal
        same = got.shape == want.shape and got.dtype == want.dtype and bool(np.all(got == want))
        return [TensorError(name, str(want.dtype), tuple(want.shape), 0.0 if same else float("inf"),
                            0.0 if same else float("inf"), EXACT, same, "" if same else "values differ")]
