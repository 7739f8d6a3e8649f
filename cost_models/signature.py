"""What identifies a measurement: an op call's signature and the environment it ran in.

In: the target and the real argument values of one fx ``call_*`` node (or a named micro-benchmark),
and the device it ran on. Out: a signature string (the op, every tensor argument's shape, dtype and
strides, every other argument's value) and a :class:`Environment` (device, torch version, intra-op
thread count); together they are the key of a cached measurement
(:mod:`cost_models.measure_cache`). Two calls with the same key do the same work on the same
machine setup, so one measurement serves both; a measurement from another torch version or thread
count is a different key and is never used.

Example::

    >>> node_signature(torch.ops.aten.addmm.default, (bias, x, w_t), {})   # doctest: +SKIP
    'aten.addmm.default(f32[1024]/1, f32[64,512]/512.1, f32[512,1024]/1.512)'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["Environment", "node_signature", "target_name", "environment"]

_DTYPE_SHORT = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
    torch.bool: "b1", torch.complex64: "c64", torch.complex128: "c128",
}


@dataclasses.dataclass(frozen=True)
class Environment:
    """Where a measurement was taken: the physical device, torch's version and its thread count."""

    device: str         # "cpu", "cuda:0"
    torch: str          # torch.__version__
    threads: int        # torch.get_num_threads() while measuring

    def key(self) -> str:
        """``cpu|torch=2.13.0+cpu|threads=2``."""
        return f"{self.device}|torch={self.torch}|threads={self.threads}"


def environment(device: str) -> Environment:
    """The environment a measurement on ``device`` would be taken in now.

    Example:
        >>> environment("cpu").threads == torch.get_num_threads()
        True
    """
    return Environment(str(torch.device(device)), torch.__version__, torch.get_num_threads())


def target_name(target: Any) -> str:
    """``aten.linear.default`` for an OpOverload, ``torch.nn.modules.linear.Linear`` for a module
    class, ``operator.getitem`` for a function, the method name for ``call_method``."""
    if isinstance(target, str):
        return target
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or type(target).__name__
    return f"{module}.{name}" if module else name


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        dtype = _DTYPE_SHORT.get(value.dtype, str(value.dtype).removeprefix("torch."))
        shape = ",".join(str(s) for s in value.shape)
        stride = ".".join(str(s) for s in value.stride()) if value.layout is torch.strided else "-"
        grad = "g" if value.requires_grad else ""
        return f"{dtype}[{shape}]/{stride}{grad}"
    if isinstance(value, (list, tuple)):
        inner = ",".join(_describe(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}={_describe(v)}" for k, v in value.items()) + "}"
    if isinstance(value, torch.nn.Module):
        params = ",".join(_describe(p) for p in value.parameters(recurse=True))
        return f"{type(value).__name__}<{params}>"
    if isinstance(value, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str, complex, slice, type(Ellipsis))):
        return repr(value)
    return type(value).__name__


def node_signature(target: Any, args: tuple, kwargs: Mapping[str, Any], module: torch.nn.Module | None = None) -> str:
    """The signature of one call: the op, its tensor arguments' shapes, dtypes and strides, and
    its other arguments' values. ``module`` is the called submodule of a ``call_module`` node
    (its parameters' shapes are part of the work).

    Example:
        >>> node_signature(torch.ops.aten.relu.default, (torch.ones(2, 3),), {})
        'aten.relu.default(f32[2,3]/3.1)'
    """
    name = target_name(target) if module is None else f"{type(module).__module__}.{type(module).__qualname__}"
    parts = [_describe(a) for a in args] + [f"{k}={_describe(v)}" for k, v in kwargs.items()]
    if module is not None:
        parts.insert(0, _describe(module))
    return f"{name}({', '.join(parts)})"
