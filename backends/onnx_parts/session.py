"""Running placed ONNX parts: one ``onnxruntime.InferenceSession`` per part, chained.

In: a :class:`~backends.onnx_parts.manifest.Manifest` and each part's model (bytes, or a file in a
parts folder), a binding of the plan's devices (``{"cuda:0": "cpu"}``). Out: a
:class:`PartitionedSession` whose :meth:`~PartitionedSession.run` takes the graph inputs as numpy
arrays and returns the graph outputs, like ``InferenceSession.run`` on the whole model.

Tensors pass between parts as ``OrtValue`` objects, never through numpy: their exact type is kept
(float8, bfloat16) and a CPU tensor is handed over without a copy. Parts run with I/O binding: their
inputs are put on their device (a tensor made on the same GPU is bound in place, so a GPU→GPU
hand-over does not go through the host) and their outputs stay there. A part that
reads or writes a sequence, optional, map or string (``python_io``) is run with python values, as a
whole-model session is. A tensor is released after the last part that reads it. Ctrl-C stops a
running part and raises ``KeyboardInterrupt`` (:mod:`backends.onnx_parts.interrupt`).

:func:`load_parts` opens a folder written by :func:`~backends.onnx_parts.emit.emit_onnx`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from backends.onnx_parts.folder import read_manifest
from backends.onnx_parts.interrupt import Interruptible
from backends.onnx_parts.manifest import Manifest
from backends.onnx_parts.providers import Provider, bind_providers, session_options
from partitioner.errors import OnnxError

log = logging.getLogger(__name__)


class PartitionedSession:
    """The parts of a placed ONNX model, each in its own session, run one after another.

    Example:
        >>> parts = load_parts("parts/", {"cuda:0": "cpu"})   # doctest: +SKIP
        >>> outputs = parts.run({"input": x})                  # {output name: numpy array}
    """

    def __init__(self, manifest: Manifest, models: Sequence[bytes | str], device_map: Mapping[str, str] | None = None,
                 *, where: str = "<parts>") -> None:
        self.manifest = manifest
        self.providers: dict[str, Provider] = bind_providers(
            manifest.devices, [p.device for p in manifest.parts], device_map)
        self.sessions = [_session(model, self.providers[part.device], f"{where}: part {k} ({part.file})")
                         for k, (part, model) in enumerate(zip(manifest.parts, models))]
        # I/O binding for every tensor part, CPU ones too: run_with_ort_values validates each OrtValue in
        # Python (~60 us a call measured, against ~10 us for a bound run)
        self._bindings = [None if p.python_io else s.io_binding() for s, p in zip(self.sessions, manifest.parts)]
        self._raw = [None if b is None else _raw_binding(s, b, self.providers[p.device])
                     for s, b, p in zip(self.sessions, self._bindings, manifest.parts)]
        self._last_use = _last_use(manifest)
        self._dtypes = {name: dtype for name, dtype, _ in manifest.inputs}
        self._interruptible = Interruptible()

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(name for name, _, _ in self.manifest.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return self.manifest.outputs

    def binding(self) -> dict[str, str]:
        """Logical device -> the provider its parts run on."""
        return {d: p.name + (f":{p.device_id}" if p.device_type == "cuda" else "") for d, p in self.providers.items()}

    def run(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """Run every part on ``feeds`` ({graph input: numpy array}); returns {graph output: value}.

        Raises:
            OnnxError: an input is missing or unknown, or a part fails; the message names it.
            KeyboardInterrupt: Ctrl-C while a part ran: the part was stopped.
        """
        missing = [n for n in self.input_names if n not in feeds]
        unknown = [n for n in feeds if n not in self.input_names]
        if missing or unknown:
            what = f"input {missing[0]!r} is missing" if missing else f"{unknown[0]!r} is not an input"
            raise OnnxError(f"{self.manifest.name}: {what}; the inputs are {', '.join(self.input_names)}")
        return self._interruptible(lambda options: self._run(feeds, options))

    def _run(self, feeds: Mapping[str, Any], options: ort.RunOptions) -> dict[str, Any]:
        """Every part in turn, each run with ``options`` (which Ctrl-C sets to terminate)."""
        values: dict[str, Any] = dict(feeds)
        where: dict[str, tuple[str, int]] = {}  # tensor -> (device type, id) of the OrtValue holding it
        for k, (part, session) in enumerate(zip(self.manifest.parts, self.sessions)):
            provider = self.providers[part.device]
            here = (provider.device_type, provider.device_id)
            try:
                if part.python_io:
                    outs = session.run(list(part.outputs), {n: _python(values[n]) for n in part.inputs}, options)
                else:
                    inputs = {n: self._ort_value(n, values[n], here, where.get(n, ("cpu", 0))) for n in part.inputs}
                    outs = self._run_bound(k, inputs, part.outputs, provider, options)
            except Exception as exc:  # onnxruntime's own exception types derive from Exception only
                raise OnnxError(f"{self.manifest.name}: part {k} ({part.file} on {provider.name}) failed: "
                                f"{str(exc).splitlines()[0][:300]}") from exc
            values.update(zip(part.outputs, outs))
            where.update((name, here) for name in part.outputs)
            for name in part.inputs:
                if self._last_use.get(name) == k:
                    del values[name]
        return {name: _python(values[name]) for name in self.output_names}

    def _run_bound(self, k: int, inputs: Mapping[str, ort.OrtValue], outputs: Sequence[str],
                   provider: Provider, options: ort.RunOptions) -> list[Any]:
        raw = self._raw[k]
        if raw is not None:
            session, bound, device = raw
            bound.clear_binding_inputs()
            bound.clear_binding_outputs()
            for name, value in inputs.items():
                bound.bind_ortvalue_input(name, value._ortvalue)
            for name in outputs:
                bound.bind_output(name, device)
            session.run_with_iobinding(bound, options)
            got = bound.get_outputs()
            return [ort.OrtValue(got[i]) for i in range(len(outputs))]
        binding = self._bindings[k]
        binding.clear_binding_inputs()
        binding.clear_binding_outputs()
        for name, value in inputs.items():
            binding.bind_ortvalue_input(name, value)
        for name in outputs:
            binding.bind_output(name, provider.device_type, provider.device_id)
        self.sessions[k].run_with_iobinding(binding, options)
        return list(binding.get_outputs())

    def _ort_value(self, name: str, value: Any, target: tuple[str, int], at: tuple[str, int]) -> ort.OrtValue:
        """``value`` as an OrtValue on device ``target`` (in place when it is already there, at ``at``)."""
        if isinstance(value, ort.OrtValue):
            if at == target:
                return value
            value = value.numpy()
        array = np.asarray(value)
        if not array.flags["C_CONTIGUOUS"]:  # (np.ascontiguousarray would make a scalar 1-d)
            array = array.copy(order="C")
        onnx_type = _onnx_type(self._dtypes.get(name))
        if onnx_type is not None and onnx.helper.tensor_dtype_to_np_dtype(onnx_type) != array.dtype:
            return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array, onnx_type)
        return ort.OrtValue.ortvalue_from_numpy(array, *target)


def load_parts(folder: str | os.PathLike[str], device_map: Mapping[str, str] | None = None) -> PartitionedSession:
    """Open a parts folder written by ``plan.emit_onnx`` / ``hetpart emit``, one session per part.

    Raises:
        OnnxError: the folder, its manifest or a part file is missing or broken, a part's file or data
            file is a link or differs from the one the manifest recorded (its sha256), or a device's
            provider is not installed; the message names it and the fix.

    Example:
        >>> parts = load_parts("parts/", {"cuda:0": "cpu"})   # doctest: +SKIP
        >>> sorted(parts.run({"input": x}))
        ['output']
    """
    folder = Path(folder)
    manifest = read_manifest(folder)  # every part's files are the ones it recorded
    files = [str(folder / p.file) for p in manifest.parts]
    session = PartitionedSession(manifest, files, device_map, where=str(folder))
    log.debug("opened %d parts of %s from %s", len(manifest.parts), manifest.name, folder)
    return session


def _session(model: bytes | str, provider: Provider, where: str) -> ort.InferenceSession:
    try:
        return ort.InferenceSession(model, session_options(), providers=provider.session_providers())
    except Exception as exc:  # onnxruntime raises its own exception types (Fail, InvalidGraph, ...)
        raise OnnxError(f"{where}: onnxruntime cannot load it on {provider.name}: "
                        f"{str(exc).splitlines()[0][:300]}") from exc


def _raw_binding(session: ort.InferenceSession, binding: ort.IOBinding, provider: Provider) -> tuple | None:
    """The C-level session, binding and output device of a part, for :meth:`PartitionedSession._run_bound`.

    onnxruntime's Python wrappers check and wrap every call (OrtValue compatibility, WebGPU capture,
    one ``OrtDevice`` made per output): between two parts, after a part's kernels have filled the
    caches, they took ~40-50 us a part on this 2-core machine (0.3-0.4 ms of ``bert:small`` placed
    in 8 parts, interleaved runs of both paths). The bound run calls the C binding they wrap
    instead; None (the public path) where this onnxruntime names them otherwise."""
    try:
        from onnxruntime.capi.onnxruntime_inference_collection import OrtDevice

        device = OrtDevice.make(provider.device_type, provider.device_id)._get_c_device()
        raw = (session._sess, binding._iobinding, device)
    except (AttributeError, ImportError, TypeError, ValueError):
        return None
    if not all(hasattr(raw[1], f) for f in ("clear_binding_inputs", "clear_binding_outputs", "bind_ortvalue_input",
                                             "bind_output", "get_outputs")) or not hasattr(raw[0], "run_with_iobinding"):
        return None
    return raw


def _python(value: Any) -> Any:
    """An OrtValue as onnxruntime's ``run`` would return it (numpy array); other values unchanged."""
    if isinstance(value, ort.OrtValue) and value.is_tensor():
        return value.numpy()
    return value


def _onnx_type(dtype: str | None) -> int | None:
    if dtype is None:
        return None
    name = {"float32": "FLOAT", "float64": "DOUBLE"}.get(dtype, dtype.upper())
    return getattr(onnx.TensorProto, name, None)


def _last_use(manifest: Manifest) -> dict[str, int]:
    """Tensor -> index of the last part that reads it (graph outputs are kept to the end)."""
    last: dict[str, int] = {}
    for k, part in enumerate(manifest.parts):
        for name in part.inputs:
            last[name] = k
    for name in manifest.outputs:
        last.pop(name, None)
    return last


__all__ = ["PartitionedSession", "load_parts"]
