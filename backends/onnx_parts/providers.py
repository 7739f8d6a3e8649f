"""Which onnxruntime execution provider runs each part, and the session options every part gets.

In: the logical devices of a plan (their kind and the profile's ``onnx_provider``) and a binding
(``{"cuda:0": "cpu"}``). Out: a :class:`Provider` per logical device — the provider's name, its
options (``device_id``) and where its tensors live for I/O binding — or an
:class:`~partitioner.errors.OnnxError` naming the device, the provider that is missing and the fix.

A device runs on, in order: the CPU provider when it is bound to ``cpu``; the CUDA provider with
``device_id`` N when it is (bound to) ``cuda:N``; else the provider its profile names
(``onnx_provider = "OpenVINOExecutionProvider"``). The provider must be one this onnxruntime build
has (``onnxruntime.get_available_providers()``).

Session options: every part session has intra-op thread spinning off. Several sessions in one
process each own a thread pool; with spinning on, the pool of the part that just ran keeps its
cores busy while the next part runs (measured on 2 cores: a light ResNet-50 session ran 4x slower
beside two idle-spinning ones, 32 ms without spinning). A session alone runs as fast without it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

import onnxruntime as ort

from partitioner.errors import OnnxError

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"


@dataclasses.dataclass(frozen=True)
class Provider:
    """How one logical device's parts run."""

    name: str                            # "CPUExecutionProvider", "CUDAExecutionProvider", ...
    options: Mapping[str, str]           # provider options, e.g. {"device_id": "0"}
    device_type: str                     # where its inputs and outputs live: "cpu" or "cuda"
    device_id: int

    def session_providers(self) -> list:
        """The ``providers=`` list of an ``InferenceSession``: this provider, then the CPU for the rest."""
        first = (self.name, dict(self.options)) if self.options else self.name
        return [first] if self.name == CPU else [first, CPU]


def provider_for(logical: str, kind: str, profile_provider: str | None, physical: str) -> Provider:
    """The provider of a logical device bound to ``physical`` (see the module docstring).

    Example:
        >>> provider_for("cuda:0", "gpu", None, "cpu").name
        'CPUExecutionProvider'
    """
    if physical == "cpu":
        provider = Provider(CPU, {}, "cpu", 0)
    elif physical.startswith("cuda"):
        index = physical.partition(":")[2] or "0"
        if not index.isdigit():
            raise OnnxError(f"device {logical!r} is bound to {physical!r}, which is not a CUDA device name; "
                            "use cuda:N")
        provider = Provider(CUDA, {"device_id": index}, "cuda", int(index))
    elif profile_provider:
        provider = Provider(profile_provider, {}, "cpu", 0)
    else:
        raise OnnxError(f"device {logical!r} ({kind}) names no onnxruntime provider: give one in the profile "
                        f"(onnx_provider = \"...ExecutionProvider\") or bind it to the CPU: "
                        f"device_map={{'{logical}': 'cpu'}} (CLI: --bind {logical}=cpu)")
    available = ort.get_available_providers()
    if provider.name not in available:
        hint = " (pip install onnxruntime-gpu)" if provider.name == CUDA else ""
        raise OnnxError(f"device {logical!r} runs on {provider.name}, which this onnxruntime ({ort.__version__}; "
                        f"providers {', '.join(available)}) does not have: install the build that provides it"
                        f"{hint}, or run the device's parts on the CPU provider: device_map={{'{logical}': 'cpu'}} "
                        f"(CLI: --bind {logical}=cpu)")
    return provider


def bind_providers(devices: Mapping[str, tuple[str, str | None]], used: Iterable[str],
                   device_map: Mapping[str, str] | None) -> dict[str, Provider]:
    """Logical device -> :class:`Provider` for each ``used`` device, given every device of the
    profile as ``devices`` = {logical: (kind, profile's onnx_provider)}.

    Raises:
        OnnxError: ``device_map`` names a device the profile does not have, or a provider is missing.

    Example:
        >>> bind_providers({"cpu": ("cpu", None), "cuda:0": ("gpu", None)}, ["cuda:0"], {"cuda:0": "cpu"})["cuda:0"].name
        'CPUExecutionProvider'
    """
    device_map = dict(device_map or {})
    unknown = [d for d in device_map if d not in devices]
    if unknown:
        raise OnnxError(f"device_map names {', '.join(unknown)}, which the plan's profile does not have "
                        f"({', '.join(devices)})")
    return {d: provider_for(d, *devices[d], str(device_map.get(d, d))) for d in dict.fromkeys(used)}


def session_options() -> ort.SessionOptions:
    """Options of every part session (and of the whole-model session it is compared with)."""
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: onnxruntime warns about every unused initializer
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


__all__ = ["CPU", "CUDA", "Provider", "bind_providers", "provider_for", "session_options"]
