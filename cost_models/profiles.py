"""Device profiles: the devices a graph can be placed on and the links between them.

In: a TOML profile (a built-in name such as ``"h200-host"`` or a path), a dict of the same
shape, or :func:`cost_models.detect.detect_local`.
Out: a frozen :class:`DeviceSet` of :class:`Device` and :class:`Link` values in SI units
(bytes, bytes/s, seconds, FLOP/s) that the cost models and solvers read.

The TOML shape (see DESIGN.md, "Devices and costs")::

    name = "h200-host"                       # optional; defaults to the file name

    [devices."cuda:0"]
    kind = "gpu"                             # cpu | gpu | npu
    memory = "141GB"
    peak_flops = { float32 = 51e12, bfloat16 = 790e12 }   # dtypes not listed use float32
    mem_bandwidth = "4.1TB/s"
    launch_overhead = "8us"
    efficiency = { matmul = 0.9, "conv.bfloat16" = 0.15 } # optional, per op class [.dtype]
    mem_efficiency = { norm = 0.6 }          # optional, fraction of mem_bandwidth
    fixed_latency = { matmul = "17us" }      # optional, seconds beyond launch_overhead
    supported_ops = ["matmul", "aten.conv*"] # optional: op classes or globs over op kinds
    host = "host0"                           # optional
    onnx_provider = "OpenVINOExecutionProvider"  # optional: the onnxruntime provider of its ONNX parts
                                             # (default: CPU for cpu devices, CUDA for cuda:N)
    alloc_threshold = "32MiB"                # optional (host CPUs): outputs this large are fresh pages
    first_touch_bandwidth = "5.7GB/s"        #   every call, faulted in at this rate (needs both)
    matmul_half_rows = 35                    # optional: a matmul over this many rows per weight
                                             #   reaches half its efficiency (0: no such loss)
    grouped_backward_flops = 3.9e9           # optional: FLOP/s of a grouped (depthwise) convolution's
                                             #   backward, when slower than its class (0: as its class)
    update_bandwidth = "40GB/s"              # optional: bytes/s an optimizer step and a dense gradient
                                             #   fill stream at (0: the elementwise rate)
    weight_only = { int8 = 190e9, int4 = 190e9 }  # optional: FLOP/s of weight-only quantized matmul
                                             #   kernels per packed weight dtype (int8, int4, float8);
                                             #   a dtype not listed has no kernel there
    weight_unpack = { int8 = 67e9 }          # optional: weight values such a kernel unpacks per second,
                                             #   once per call whatever its rows (not listed: free)

    [[links]]
    between = ["cpu", "cuda:0"]              # links are bidirectional
    bandwidth = "55GB/s"                     # pinned host memory
    pageable_bandwidth = "9GB/s"             # optional
    latency = "17us"
    kind = "pcie"                            # optional, informational

Every validation error is a :class:`~partitioner.errors.ProfileError` (or its subclass
``UnitError``) naming the file, the key path and the form expected.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import fnmatch
import functools
import json
import re
import tomllib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from cost_models.units import (
    format_bytes, format_rate, format_seconds, parse_bandwidth, parse_bytes, parse_flops,
    parse_seconds,
)
from partitioner.errors import HetpartError, ProfileError
from partitioner.ir import OpClass

__all__ = [
    "DeviceKind", "Device", "Link", "DeviceSet", "DEFAULT_EFFICIENCY", "DEFAULT_MEM_EFFICIENCY",
    "DTYPE_NAMES", "load_profile", "load_profile_text", "builtin_profiles", "builtin_profile_path",
]

_BUILTIN_DIR = Path(__file__).with_name("profiles")

#: torch dtype names accepted as keys of ``peak_flops`` and as ``.dtype`` suffixes of
#: efficiency keys (typo protection: ``"flaot32"`` is an error, not a silent fallback).
DTYPE_NAMES: tuple[str, ...] = (
    "float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2",
    "float8_e4m3fnuz", "float8_e5m2fnuz", "int64", "int32", "int16", "int8", "uint8", "bool",
    "complex64", "complex128",
)
_OP_CLASSES: tuple[str, ...] = tuple(c.value for c in OpClass)


class DeviceKind(str, enum.Enum):
    """What kind of processor a device is; selects the default efficiency tables.

    Example:
        >>> DeviceKind("gpu") is DeviceKind.GPU
        True
    """

    CPU = "cpu"
    GPU = "gpu"
    NPU = "npu"


def _table(**values: float) -> Mapping[str, float]:
    assert set(values) == set(_OP_CLASSES), set(_OP_CLASSES) ^ set(values)
    return MappingProxyType(values)


#: Fraction of ``peak_flops`` an op class reaches when a profile does not say. Starting
#: points only: dense matmul/conv/attention run near peak, everything else is memory-bound,
#: where this number matters little. Built-in profiles override them from measurements.
DEFAULT_EFFICIENCY: Mapping[DeviceKind, Mapping[str, float]] = MappingProxyType({
    DeviceKind.CPU: _table(matmul=0.8, conv=0.5, attention=0.6, elementwise=0.5, norm=0.5,
                           softmax=0.5, reduction=0.5, pool=0.5, gather=0.5, data_movement=0.5,
                           view=1.0, other=0.3),
    DeviceKind.GPU: _table(matmul=0.9, conv=0.7, attention=0.6, elementwise=0.5, norm=0.5,
                           softmax=0.5, reduction=0.5, pool=0.5, gather=0.5, data_movement=0.5,
                           view=1.0, other=0.3),
    DeviceKind.NPU: _table(matmul=0.7, conv=0.6, attention=0.4, elementwise=0.3, norm=0.3,
                           softmax=0.3, reduction=0.3, pool=0.3, gather=0.2, data_movement=0.3,
                           view=1.0, other=0.2),
})

#: Fraction of ``mem_bandwidth`` an op class streams at when a profile does not say.
DEFAULT_MEM_EFFICIENCY: Mapping[DeviceKind, Mapping[str, float]] = MappingProxyType({
    DeviceKind.CPU: _table(matmul=0.8, conv=0.6, attention=0.6, elementwise=0.7, norm=0.6,
                           softmax=0.55, reduction=0.7, pool=0.5, gather=0.5, data_movement=0.7,
                           view=1.0, other=0.5),
    DeviceKind.GPU: _table(matmul=0.8, conv=0.7, attention=0.7, elementwise=0.9, norm=0.65,
                           softmax=0.6, reduction=0.7, pool=0.6, gather=0.5, data_movement=0.9,
                           view=1.0, other=0.5),
    DeviceKind.NPU: _table(matmul=0.7, conv=0.6, attention=0.5, elementwise=0.7, norm=0.5,
                           softmax=0.5, reduction=0.5, pool=0.5, gather=0.3, data_movement=0.7,
                           view=1.0, other=0.3),
})

_EMPTY: Mapping[str, float] = MappingProxyType({})


def _none_listed() -> Any:
    """A dataclass field defaulting to the empty read-only table."""
    return dataclasses.field(default_factory=lambda: _EMPTY)


_NAME = re.compile(r"[A-Za-z0-9_.:/@+-]+")
Where = Callable[[str], str]  # key -> "file: devices.\"cuda:0\".key" (key "" = the table)


# ----------------------------------------------------------------------------- small helpers

def _tkey(key: str) -> str:
    """A TOML key: bare when it can be, quoted otherwise (``cpu``, ``"cuda:0"``)."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _class_key(op_class: OpClass | str) -> str:
    return op_class.value if isinstance(op_class, enum.Enum) else str(op_class)


def _dtype_key(dtype: object) -> str:
    """``"float32"``, ``torch.float32`` and ``"torch.float32"`` all give ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def _suggest(word: str, choices: tuple[str, ...] | list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _number(value: Any, where: str, form: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProfileError(f"{where}: {value!r} is not a number; expected {form}")
    return float(value)


def _positive(x: float, where: str, what: str, example: str) -> float:
    if x <= 0:
        raise ProfileError(f"{where}: {what} must be positive, got {x!r}; e.g. {example}")
    return x


#: The largest profile file read (256 devices with every field take about 100 KB).
MAX_PROFILE_BYTES = 16 * 2**20

#: The most devices a profile may list: the ILP's transfer terms grow with the square of it.
MAX_DEVICES = 256
#: a matmul with at most this many rows per weight is a matrix-vector product: no rows factor
GEMV_ROWS = 2

#: The ranges hetpart can cost (outside them the solver's numbers break down: a bandwidth of
#: 1e-10 B/s makes a copy last 1e19 s, a 1e9 s launch overhead swamps every other term).
LIMITS: Mapping[str, tuple[float, float]] = MappingProxyType({
    "memory": (1, 2.0**60),                 # bytes: 1 B to 1 EiB
    "bandwidth": (1e3, 1e16),               # bytes/s: 1 KB/s to 10 PB/s
    "flops": (1e3, 1e19),                   # FLOP/s: 1 KFLOP/s to 10 EFLOP/s
    "seconds": (0.0, 10.0),                 # launch overhead, latencies: 0 to 10 s
})


def _in_range(x: float, where: str, what: str, example: str, raw: Any = None) -> float:
    """``x`` when it lies in ``LIMITS[what]``; else a ProfileError naming the field, the value as
    written (``raw``), and the range."""
    lo, hi = LIMITS[what]
    if lo <= x <= hi:
        return x
    unit = {"memory": "bytes", "bandwidth": "bytes/s", "seconds": "s", "flops": "FLOP/s"}[what]
    value = repr(raw) if isinstance(raw, str) else f"{x:g} {unit}"
    raise ProfileError(f"{where}: {value} is outside the range hetpart can cost ({lo:g} to {hi:g} {unit}); "
                       f"check the number and its unit, e.g. {example}")


def _check_keys(raw: Mapping[str, Any], allowed: tuple[str, ...], where: Where) -> None:
    for key in raw:
        if key not in allowed:
            raise ProfileError(f"{where(key)}: unknown field{_suggest(key, allowed)}; the allowed "
                               f"fields are: {', '.join(allowed)}")


def _require(raw: Mapping[str, Any], required: Mapping[str, str], where: Where) -> None:
    for key, example in required.items():
        if key not in raw:
            raise ProfileError(f"{where(key)}: missing required field; add it, e.g. {example}")


def _mapping(raw: Any, where: str, example: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise ProfileError(f"{where}: expected a table, got {raw!r}; e.g. {example}")
    return raw


# ----------------------------------------------------------------------------- field parsers

def _peak_table(raw: Any, where: str) -> Mapping[str, float]:
    example = "peak_flops = { float32 = 51e12, bfloat16 = 790e12 }"
    if not isinstance(raw, Mapping):   # a single number or string: the float32 peak
        raw = {"float32": raw}
    out = {}
    for key, value in raw.items():
        dtype = _dtype_key(key)   # torch.float32 keys are accepted from Python callers
        if dtype not in DTYPE_NAMES:
            raise ProfileError(f"{where}.{_tkey(dtype)}: {dtype!r} is not a dtype name"
                               f"{_suggest(dtype, DTYPE_NAMES)}; use one of {', '.join(DTYPE_NAMES)}")
        sub = f"{where}.{_tkey(dtype)}"
        out[dtype] = _in_range(_positive(parse_flops(value, where=sub), sub, "peak FLOP/s", example),
                               sub, "flops", example, value)
    if "float32" not in out:
        raise ProfileError(f"{where}: give a float32 peak (used for dtypes not listed); e.g. {example}")
    return MappingProxyType(out)


def _fraction(value: Any, where: str) -> float:
    x = _number(value, where, "a fraction in (0, 1], e.g. 0.8")
    if not 0 < x <= 1:
        raise ProfileError(f"{where}: {x!r} is outside (0, 1]; an efficiency is the fraction of "
                           f"the peak rate reached, e.g. 0.8")
    return x


def _class_table(raw: Any, where: str, parse: Callable[[Any, str], float],
                 example: str) -> Mapping[str, float]:
    """A table keyed by op class, or by ``"class.dtype"`` (also written as nested tables)."""
    if raw is None:
        return _EMPTY
    flat: dict[str, Any] = {}
    for key, value in _mapping(raw, where, example).items():
        if isinstance(value, Mapping):   # conv = { bfloat16 = 0.15 } -> "conv.bfloat16"
            flat.update({f"{key}.{dtype}": v for dtype, v in value.items()})
        else:
            flat[key] = value
    out = {}
    for key, value in flat.items():
        sub = f"{where}.{_tkey(key)}"
        op_class, _, dtype = key.partition(".")
        if op_class not in _OP_CLASSES:
            raise ProfileError(f"{sub}: {op_class!r} is not an op class"
                               f"{_suggest(op_class, _OP_CLASSES)}; valid op classes are: "
                               f"{', '.join(_OP_CLASSES)} (optionally with a dtype: \"conv.bfloat16\")")
        if dtype and dtype not in DTYPE_NAMES:
            raise ProfileError(f"{sub}: {dtype!r} is not a dtype name{_suggest(dtype, DTYPE_NAMES)}; "
                               f"use one of {', '.join(DTYPE_NAMES)}")
        out[key] = parse(value, sub)
    return MappingProxyType(out)


def _supported_ops(raw: Any, where: str) -> tuple[str, ...] | None:
    """Op classes, or globs over op kinds (recognised by '.', a glob character or a capital)."""
    if raw is None:
        return None
    if isinstance(raw, str) or not isinstance(raw, (list, tuple)):
        raise ProfileError(f"{where}: expected a list, got {raw!r}; "
                           f"e.g. supported_ops = [\"matmul\", \"conv\", \"aten.linear*\"]")
    if not raw:
        raise ProfileError(f"{where}: an empty list would let the device run nothing; list what it "
                           f"runs, or leave supported_ops out to let it run every op")
    for i, entry in enumerate(raw):
        if not isinstance(entry, str) or not entry:
            raise ProfileError(f"{where}[{i}]: {entry!r} is not an op class or op-kind pattern")
        if entry not in _OP_CLASSES and not re.search(r"[.*?\[A-Z]", entry):
            raise ProfileError(f"{where}[{i}]: {entry!r} is not an op class"
                               f"{_suggest(entry, _OP_CLASSES)}; valid op classes are: "
                               f"{', '.join(_OP_CLASSES)}; op-kind globs look like \"aten.linear*\"")
    return tuple(raw)


def _device_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ProfileError(f"{where}: {name!r} is not a valid device name; use letters, digits "
                           f"and _ . : / @ + -, e.g. \"cpu\", \"cuda:0\", \"npu:0\"")
    return name


_DEVICE_REQUIRED = {
    "kind": 'kind = "gpu"', "memory": 'memory = "80GB"',
    "peak_flops": "peak_flops = { float32 = 51e12, bfloat16 = 790e12 }",
    "mem_bandwidth": 'mem_bandwidth = "4.1TB/s"', "launch_overhead": 'launch_overhead = "8us"',
}
_DEVICE_FIELDS = (*_DEVICE_REQUIRED, "efficiency", "mem_efficiency", "fixed_latency",
                  "supported_ops", "host", "cache_size", "cache_bandwidth", "onnx_provider", "alloc_threshold",
                  "first_touch_bandwidth", "dtypes", "matmul_half_rows", "grouped_backward_flops",
                  "update_bandwidth", "weight_only", "weight_unpack")
_LINK_REQUIRED = {"between": 'between = ["cpu", "cuda:0"]', "bandwidth": 'bandwidth = "55GB/s"',
                  "latency": 'latency = "17us"'}
_LINK_FIELDS = (*_LINK_REQUIRED, "pageable_bandwidth", "kind")


def _device_fields(name: str, raw: Mapping[str, Any], where: Where) -> dict[str, Any]:
    """Validate one device table (unit strings or numbers) into Device field values."""
    _check_keys(raw, _DEVICE_FIELDS, where)
    _require(raw, _DEVICE_REQUIRED, where)
    try:
        kind = DeviceKind(_class_key(raw["kind"]))
    except ValueError:
        raise ProfileError(f"{where('kind')}: {raw['kind']!r} is not a device kind; expected one of "
                           f"{', '.join(repr(k.value) for k in DeviceKind)}") from None
    memory = parse_bytes(raw["memory"], where=where("memory"))
    if memory == 0:
        raise ProfileError(f"{where('memory')}: device {name} has zero memory: give its capacity, "
                           f"e.g. memory = \"80GB\"")
    _in_range(memory, where("memory"), "memory", 'memory = "80GB"', raw["memory"])
    host = raw.get("host", "host0")
    if not isinstance(host, str) or not _NAME.fullmatch(host):
        raise ProfileError(f"{where('host')}: {host!r} is not a host name; e.g. host = \"host0\"")
    seconds = lambda v, w: _in_range(parse_seconds(v, where=w), w, "seconds",  # noqa: E731
                                     'fixed_latency = { matmul = "17us" }', v)
    cache_size = parse_bytes(raw.get("cache_size", 0), where=where("cache_size"))
    cache_bandwidth = parse_bandwidth(raw.get("cache_bandwidth", 0), where=where("cache_bandwidth"))
    if cache_size and not cache_bandwidth:
        raise ProfileError(f"{where('cache_size')}: a cache size needs its bandwidth too; "
                           f"e.g. cache_bandwidth = \"250GB/s\"")
    if cache_size:
        _in_range(cache_size, where("cache_size"), "memory", 'cache_size = "64MB"', raw.get("cache_size"))
    if cache_bandwidth:
        _in_range(cache_bandwidth, where("cache_bandwidth"), "bandwidth", 'cache_bandwidth = "250GB/s"',
                  raw.get("cache_bandwidth"))
    provider = raw.get("onnx_provider")
    if provider is not None and (not isinstance(provider, str) or not provider.endswith("ExecutionProvider")):
        raise ProfileError(f"{where('onnx_provider')}: {provider!r} is not an onnxruntime execution provider "
                           f"name; e.g. onnx_provider = \"OpenVINOExecutionProvider\"")
    alloc_threshold = parse_bytes(raw.get("alloc_threshold", 0), where=where("alloc_threshold"))
    first_touch = parse_bandwidth(raw.get("first_touch_bandwidth", 0), where=where("first_touch_bandwidth"))
    if bool(alloc_threshold) != bool(first_touch):
        missing = "first_touch_bandwidth" if alloc_threshold else "alloc_threshold"
        raise ProfileError(f"{where(missing)}: alloc_threshold and first_touch_bandwidth go together; "
                           f"give both, e.g. alloc_threshold = \"32MiB\", first_touch_bandwidth = \"5GB/s\"")
    half_rows = raw.get("matmul_half_rows", 0)
    if isinstance(half_rows, bool) or not isinstance(half_rows, (int, float)) or not 0 <= half_rows <= 1e6:
        raise ProfileError(f"{where('matmul_half_rows')}: {half_rows!r} is not a row count from 0 to 1e6; "
                           f"e.g. matmul_half_rows = 35 (0: a matmul's efficiency does not depend on its rows)")
    grouped = raw.get("grouped_backward_flops", 0)
    if isinstance(grouped, bool) or not isinstance(grouped, (int, float)) or not (
            grouped == 0 or LIMITS["flops"][0] <= grouped <= LIMITS["flops"][1]):
        raise ProfileError(f"{where('grouped_backward_flops')}: {grouped!r} is not a FLOP/s rate from "
                           f"{LIMITS['flops'][0]:g} to {LIMITS['flops'][1]:g}; e.g. grouped_backward_flops = 3.9e9 "
                           f"(0: a grouped convolution's backward runs as its class)")
    update = parse_bandwidth(raw.get("update_bandwidth", 0), where=where("update_bandwidth"))
    if update:
        _in_range(update, where("update_bandwidth"), "bandwidth", 'update_bandwidth = "40GB/s"',
                  raw.get("update_bandwidth"))
    return dict(
        kind=kind,
        memory=memory,
        update_bandwidth=update,
        weight_only=_weight_only(raw.get("weight_only"), where("weight_only")),
        weight_unpack=_weight_only(raw.get("weight_unpack"), where("weight_unpack")),
        matmul_half_rows=float(half_rows),
        grouped_backward_flops=float(grouped),
        peak_flops=_peak_table(raw["peak_flops"], where("peak_flops")),
        mem_bandwidth=_in_range(
            _positive(parse_bandwidth(raw["mem_bandwidth"], where=where("mem_bandwidth")),
                      where("mem_bandwidth"), "bandwidth", 'mem_bandwidth = "4.1TB/s"'),
            where("mem_bandwidth"), "bandwidth", 'mem_bandwidth = "4.1TB/s"', raw["mem_bandwidth"]),
        launch_overhead=_in_range(parse_seconds(raw["launch_overhead"], where=where("launch_overhead")),
                                  where("launch_overhead"), "seconds", 'launch_overhead = "8us"',
                                  raw["launch_overhead"]),
        efficiency=_class_table(raw.get("efficiency"), where("efficiency"), _fraction,
                                "efficiency = { matmul = 0.9 }"),
        mem_efficiency=_class_table(raw.get("mem_efficiency"), where("mem_efficiency"), _fraction,
                                    "mem_efficiency = { norm = 0.6 }"),
        fixed_latency=_class_table(raw.get("fixed_latency"), where("fixed_latency"), seconds,
                                   'fixed_latency = { matmul = "17us" }'),
        supported_ops=_supported_ops(raw.get("supported_ops"), where("supported_ops")),
        host=host,
        cache_size=cache_size,
        cache_bandwidth=cache_bandwidth,
        onnx_provider=provider,
        alloc_threshold=alloc_threshold,
        first_touch_bandwidth=first_touch,
        dtypes=_dtypes(raw.get("dtypes"), where("dtypes")),
    )


def _weight_only(raw: Any, where: str) -> Mapping[str, float]:
    """FLOP/s of the device's weight-only quantized matmul kernels per packed weight dtype
    (``weight_only = { int8 = 190e9, int4 = 190e9 }``; a dtype not listed: no kernel)."""
    from cost_models.precision import PrecisionError, parse_weight_dtype

    if not raw:
        return MappingProxyType({})
    example = "weight_only = { int8 = 190e9, int4 = 190e9 }"
    if not isinstance(raw, Mapping):
        raise ProfileError(f"{where}: {raw!r} is not a table of weight dtype to FLOP/s; e.g. {example}")
    out = {}
    for key, rate in raw.items():
        try:
            name = parse_weight_dtype(key, where)
        except PrecisionError as exc:
            raise ProfileError(f"{exc}; e.g. {example}") from None
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not (
                LIMITS["flops"][0] <= rate <= LIMITS["flops"][1]):
            raise ProfileError(f"{where}.{key}: {rate!r} is not a FLOP/s rate from {LIMITS['flops'][0]:g} to "
                               f"{LIMITS['flops'][1]:g}; e.g. {example}")
        out[name] = float(rate)
    return MappingProxyType(out)


def _dtypes(raw: Any, where: str) -> tuple[str, ...] | None:
    """The dtypes a device computes in (``dtypes = ["bfloat16", "float16"]``; None: all of them)."""
    if raw is None:
        return None
    example = 'dtypes = ["bfloat16", "float16"]'
    if isinstance(raw, str) or not isinstance(raw, (list, tuple)) or not raw:
        raise ProfileError(f"{where}: {raw!r} is not a non-empty list of dtype names; e.g. {example}")
    from cost_models.precision import DTYPES, PrecisionError, parse_dtype

    out = []
    for item in raw:
        try:
            out.append(parse_dtype(item, where))
        except PrecisionError as exc:
            raise ProfileError(f"{exc}; e.g. {example}") from None
    return tuple(d for d in DTYPES if d in out)


def _link_fields(raw: Mapping[str, Any], where: Where) -> dict[str, Any]:
    """Validate one ``[[links]]`` table into Link field values."""
    _check_keys(raw, _LINK_FIELDS, where)
    _require(raw, _LINK_REQUIRED, where)
    between = raw["between"]
    if (isinstance(between, str) or not isinstance(between, (list, tuple)) or len(between) != 2
            or not all(isinstance(x, str) for x in between) or between[0] == between[1]):
        raise ProfileError(f"{where('between')}: {between!r} is not a pair of two different device "
                           f"names; e.g. between = [\"cpu\", \"cuda:0\"]")
    bandwidth = _in_range(_positive(parse_bandwidth(raw["bandwidth"], where=where("bandwidth")),
                                    where("bandwidth"), "bandwidth", 'bandwidth = "55GB/s"'),
                          where("bandwidth"), "bandwidth", 'bandwidth = "55GB/s"', raw["bandwidth"])
    pageable = raw.get("pageable_bandwidth")
    if pageable is not None:
        pageable = _in_range(_positive(parse_bandwidth(pageable, where=where("pageable_bandwidth")),
                                       where("pageable_bandwidth"), "bandwidth", 'pageable_bandwidth = "9GB/s"'),
                             where("pageable_bandwidth"), "bandwidth", 'pageable_bandwidth = "9GB/s"', pageable)
    kind = raw.get("kind", "")
    if not isinstance(kind, str):
        raise ProfileError(f"{where('kind')}: {kind!r} is not a string; e.g. kind = \"pcie\"")
    return dict(between=(between[0], between[1]), bandwidth=bandwidth,
                latency=_in_range(parse_seconds(raw["latency"], where=where("latency")), where("latency"),
                                  "seconds", 'latency = "17us"', raw["latency"]),
                pageable_bandwidth=pageable, kind=kind)


def _plain(value: Any) -> Any:
    """mappingproxy -> dict, tuple -> list, enum -> value: JSON/TOML-ready."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value.value if isinstance(value, enum.Enum) else value


# ----------------------------------------------------------------------------- value types

@dataclasses.dataclass(frozen=True)
class Device:
    """One processor with its own memory, and what it can do.

    Rates are in SI units: ``memory`` bytes, ``peak_flops`` FLOP/s per dtype name,
    ``mem_bandwidth`` bytes/s, ``launch_overhead`` seconds per op. ``efficiency`` /
    ``mem_efficiency`` / ``fixed_latency`` are keyed by op class (an ``OpClass`` value) or by
    ``"class.dtype"``; classes not listed use ``DEFAULT_EFFICIENCY`` /
    ``DEFAULT_MEM_EFFICIENCY`` for the device kind, and no fixed latency. The constructor
    accepts unit strings and dicts and normalises them (mappings become read-only).

    Example:
        >>> d = Device("cpu", DeviceKind.CPU, "64GiB", {"float32": 1.5e12}, "30GB/s", "2us")
        >>> d.memory, d.peak("bfloat16"), d.eff("matmul"), d.supports("aten.mm", "matmul")
        (68719476736, 1500000000000.0, 0.8, True)
    """

    name: str                                    # "cpu", "cuda:0", "npu:0"
    kind: DeviceKind                             # selects the default efficiency tables
    memory: int                                  # capacity in bytes
    peak_flops: Mapping[str, float]              # dtype name -> FLOP/s; must include float32
    mem_bandwidth: float                         # bytes/s
    launch_overhead: float                       # seconds added to every op
    efficiency: Mapping[str, float] = _none_listed()      # fraction of peak_flops reached
    mem_efficiency: Mapping[str, float] = _none_listed()  # fraction of mem_bandwidth reached
    fixed_latency: Mapping[str, float] = _none_listed()   # seconds beyond launch_overhead
    supported_ops: tuple[str, ...] | None = None  # None = runs every op
    host: str = "host0"                          # the machine the device sits in
    cache_size: int = 0                          # bytes an op may move at cache_bandwidth (0: none)
    cache_bandwidth: float = 0.0                 # bytes/s for ops whose traffic fits in cache_size
    onnx_provider: str | None = None             # onnxruntime provider of its ONNX parts (None: by kind)
    alloc_threshold: int = 0                     # bytes: outputs this large are fresh pages each call (0: none)
    first_touch_bandwidth: float = 0.0           # bytes/s at which fresh pages are faulted in
    dtypes: tuple[str, ...] | None = None        # dtypes it computes in (None: all; cost_models.precision)
    matmul_half_rows: float = 0.0                # rows per weight at which a matmul reaches half its efficiency
    grouped_backward_flops: float = 0.0          # FLOP/s of a grouped convolution's backward (0: as its class)
    update_bandwidth: float = 0.0                # bytes/s of an optimizer step and a dense gradient fill
                                                 # (0: the elementwise streaming rate)
    weight_only: Mapping[str, float] = _none_listed()  # packed weight dtype -> FLOP/s of its weight-only
                                                       # matmul kernel (none listed: no packed weights)
    weight_unpack: Mapping[str, float] = _none_listed()  # packed weight dtype -> weight values its kernel
                                                         # unpacks per second, once per call (none: free)

    def __post_init__(self) -> None:
        name = _device_name(self.name, "Device.name")
        where: Where = lambda key: f"device {name!r}" + (f": {key}" if key else "")  # noqa: E731
        raw = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "name"}
        for key, value in _device_fields(name, raw, where).items():
            object.__setattr__(self, key, value)

    def __hash__(self) -> int:
        return hash(("Device", self.name))

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:  # mappingproxy does not pickle
        return (type(self), tuple(_plain(getattr(self, f.name)) for f in dataclasses.fields(self)))

    def peak(self, dtype: object = "float32") -> float:
        """Peak FLOP/s for ``dtype`` (a name or ``torch.dtype``); unlisted dtypes use float32."""
        return self.peak_flops.get(_dtype_key(dtype), self.peak_flops["float32"])

    def _lookup(self, table: Mapping[str, float], op_class: OpClass | str, dtype: object,
                default: Mapping[str, float] | None) -> float:
        key = _class_key(op_class)
        if key not in _OP_CLASSES:
            raise ProfileError(f"device {self.name!r}: {key!r} is not an op class; valid op "
                               f"classes are: {', '.join(_OP_CLASSES)}")
        if dtype is not None and f"{key}.{_dtype_key(dtype)}" in table:
            return table[f"{key}.{_dtype_key(dtype)}"]
        if key in table:
            return table[key]
        return default[key] if default is not None else 0.0

    def eff(self, op_class: OpClass | str, dtype: object = None) -> float:
        """Fraction of ``peak(dtype)`` that ops of ``op_class`` reach (``"class.dtype"`` first)."""
        return self._lookup(self.efficiency, op_class, dtype, DEFAULT_EFFICIENCY[self.kind])

    def mem_eff(self, op_class: OpClass | str, dtype: object = None) -> float:
        """Fraction of ``mem_bandwidth`` that ops of ``op_class`` stream at."""
        return self._lookup(self.mem_efficiency, op_class, dtype, DEFAULT_MEM_EFFICIENCY[self.kind])

    def fixed(self, op_class: OpClass | str, dtype: object = None) -> float:
        """Seconds an op of ``op_class`` costs beyond ``launch_overhead`` (0 when not listed)."""
        return self._lookup(self.fixed_latency, op_class, dtype, None)

    def stream_bandwidth(self, nbytes: float) -> float:
        """Bytes/s an op moving ``nbytes`` streams at: the cache's rate when it fits, else memory's."""
        if self.cache_size and nbytes <= self.cache_size:
            return self.cache_bandwidth
        return self.mem_bandwidth

    def first_touch(self, nbytes: float) -> float:
        """Seconds of page faults for a freshly allocated output of ``nbytes`` (0 below the threshold)."""
        if not self.alloc_threshold or nbytes < self.alloc_threshold:
            return 0.0
        return nbytes / self.first_touch_bandwidth

    def rows_factor(self, rows: float) -> float:
        """Share of its efficiency a matmul reaches when each weight is used by ``rows`` rows
        (``rows / (rows + matmul_half_rows)``; 1 without ``matmul_half_rows`` or weights).

        A CPU's matmul kernel packs the weight and keeps blocks of rows in registers: with few rows
        (a batch of 64 through a Linear) the packing and the partial blocks are a larger share of
        the work (measured on the 2-core test machine: 36-42 GFLOP/s at 64 rows, 64 at 512 or more).
        With at most :data:`GEMV_ROWS` rows (a decode step of one or two sequences) the kernel is a
        matrix-vector product that packs nothing: it streams the weight once, and the factor is 1
        (the same machine: a 512x32000 Linear at 1 and at 2 rows takes 1.2 ms, the weight's bytes at
        55 GB/s, where the factor at 1 row would price it at 7 ms; measured in a Llama decode step,
        the factor put the step at 23 ms against 11 ms measured).
        """
        if not self.matmul_half_rows or rows == float("inf") or rows <= GEMV_ROWS:
            return 1.0
        return rows / (rows + self.matmul_half_rows)

    def supports(self, kind: str, op_class: OpClass | str) -> bool:
        """Whether the device runs an op of this kind (e.g. ``"aten.linear"``) and class."""
        if self.supported_ops is None:
            return True
        cls = _class_key(op_class)
        return any(entry == cls or fnmatch.fnmatchcase(kind, entry) for entry in self.supported_ops)

    def to_dict(self) -> dict[str, Any]:
        """The device's TOML table as plain values in SI units (no ``name``)."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)
                if f.name != "name"}


@dataclasses.dataclass(frozen=True)
class Link:
    """A bidirectional connection between two devices.

    ``bandwidth`` (bytes/s) is for pinned host memory on host links; ``pageable_bandwidth``
    is the rate for copies from pageable host memory (None = same as ``bandwidth``).

    Example:
        >>> link = Link(("cpu", "cuda:0"), "55GB/s", "17us", "9GB/s", "pcie")
        >>> link.bandwidth, link.connects("cuda:0", "cpu"), link.label
        (55000000000.0, True, 'cpu<->cuda:0')
    """

    between: tuple[str, str]                 # the two device names
    bandwidth: float                         # bytes/s (pinned host memory for host links)
    latency: float                           # seconds per transfer
    pageable_bandwidth: float | None = None  # bytes/s from pageable host memory
    kind: str = ""                           # informational: "pcie", "nvlink", "network"

    def __post_init__(self) -> None:
        where: Where = lambda key: f"link {self.between!r}" + (f": {key}" if key else "")  # noqa: E731
        raw = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for key, value in _link_fields(raw, where).items():
            object.__setattr__(self, key, value)

    @property
    def label(self) -> str:
        """``"cpu<->cuda:0"``, for tables and constraint names."""
        return f"{self.between[0]}<->{self.between[1]}"

    @property
    def pageable(self) -> float:
        """The bandwidth of copies from pageable host memory."""
        return self.bandwidth if self.pageable_bandwidth is None else self.pageable_bandwidth

    def connects(self, a: str, b: str) -> bool:
        """Whether this link joins ``a`` and ``b`` (in either order)."""
        return {a, b} == set(self.between)

    def to_dict(self) -> dict[str, Any]:
        """The ``[[links]]`` table as plain values in SI units."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


@dataclasses.dataclass(frozen=True)
class DeviceSet:
    """The devices of one placement problem and the links between them.

    Every host has exactly one ``kind = "cpu"`` device, and a device named ``"cpu"``
    exists (or, in a flattened cluster, every device is named ``hostN/...`` after its host and
    ``host0`` exists); transfers without a direct link go through the host CPUs (:meth:`route`).
    ``source`` and ``notes`` (provenance lines written as comments by :meth:`to_toml`)
    do not take part in equality.

    Example:
        >>> ds = load_profile("h200-host")
        >>> ds.names(), [l.label for l in ds.route("cuda:0", "cpu")]
        (('cpu', 'cuda:0'), ['cpu<->cuda:0'])
    """

    name: str
    devices: tuple[Device, ...]
    links: tuple[Link, ...] = ()
    source: str = dataclasses.field(default="<dict>", compare=False)
    notes: tuple[str, ...] = dataclasses.field(default=(), compare=False)
    # the live-memory probe that capped it (cost_models.live_memory.Probe), None for a static profile
    probe: Any = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", tuple(self.devices))
        object.__setattr__(self, "links", tuple(self.links))
        object.__setattr__(self, "notes", tuple(self.notes))
        src = self.source
        if not self.devices:
            raise ProfileError(f"{src}: the profile has no devices; add a [devices.cpu] table")
        names = [d.name for d in self.devices]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ProfileError(f"{src}: device names must be unique; repeated: {', '.join(dupes)}")
        self._check_cpus(names)
        seen: dict[frozenset[str], int] = {}
        for i, link in enumerate(self.links):
            for end in link.between:
                if end not in names:
                    raise ProfileError(f"{src}: links[{i}].between: unknown device {end!r}"
                                       f"{_suggest(end, names)}; the profile's devices are: "
                                       f"{', '.join(names)}")
            pair = frozenset(link.between)
            if pair in seen:
                raise ProfileError(f"{src}: links[{i}].between: duplicate link between "
                                   f"{link.between[0]} and {link.between[1]} (also links[{seen[pair]}]); "
                                   f"give each pair of devices one link")
            seen[pair] = i
        self._check_routes()

    def _check_routes(self) -> None:
        """Every device reaches its host's CPU directly and host CPUs reach each other, as
        :meth:`route` needs: inputs arrive from the host, and copies without a direct link go
        through it. (Plain lookups: the cached views must not be filled here, they do not pickle.)"""
        pairs = {frozenset(link.between) for link in self.links}
        cpu_of = {d.host: d.name for d in self.devices if d.kind is DeviceKind.CPU}
        for d in self.devices:
            host = cpu_of[d.host]
            if d.name != host and frozenset((d.name, host)) not in pairs:
                raise ProfileError(f"{self.source}: device {d.name!r} has no link to its host CPU {host!r}: inputs "
                                   f"arrive from the host and copies without a direct link go through it; add "
                                   f"[[links]] between = [\"{host}\", \"{d.name}\"]")
        cpus = list(cpu_of.values())
        for i, a in enumerate(cpus):
            for b in cpus[i + 1:]:
                if frozenset((a, b)) not in pairs:
                    raise ProfileError(f"{self.source}: host CPUs {a!r} and {b!r} have no link between them; "
                                       f"add [[links]] between = [\"{a}\", \"{b}\"]")

    def _check_cpus(self, names: list[str]) -> None:
        example = ('[devices.cpu] kind = "cpu", memory = "64GiB", peak_flops = { float32 = 1e12 }, '
                   'mem_bandwidth = "30GB/s", launch_overhead = "2us"')
        cpu = next((d for d in self.devices if d.name == "cpu"), None)
        # a flattened cluster (cost_models.cluster) names devices "host0/cpu", "host1/cuda:0"
        clustered = all(d.name.startswith(f"{d.host}/") for d in self.devices) and "host0" in self.hosts()
        if (cpu is None or cpu.kind is not DeviceKind.CPU) and not clustered:
            raise ProfileError(f"{self.source}: no cpu device: every profile needs one host CPU named "
                               f"\"cpu\" with kind = \"cpu\" (or one cpu-kind device per host); devices: "
                               f"{', '.join(names)}; add e.g. {example}")
        for host in self.hosts():
            cpus = [d.name for d in self.devices if d.host == host and d.kind is DeviceKind.CPU]
            if len(cpus) != 1:
                raise ProfileError(f"{self.source}: host {host!r} has {len(cpus)} cpu devices "
                                   f"({', '.join(cpus) or 'none'}); every host needs exactly one "
                                   f"kind = \"cpu\" device, through which its transfers are routed")

    def __iter__(self) -> Iterator[Device]:
        return iter(self.devices)

    def __len__(self) -> int:
        return len(self.devices)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    @functools.cached_property
    def _by_name(self) -> Mapping[str, Device]:
        return MappingProxyType({d.name: d for d in self.devices})

    @functools.cached_property
    def _by_pair(self) -> Mapping[frozenset[str], Link]:
        return MappingProxyType({frozenset(link.between): link for link in self.links})

    def names(self) -> tuple[str, ...]:
        """Device names in profile order."""
        return tuple(d.name for d in self.devices)

    def hosts(self) -> tuple[str, ...]:
        """Host names in order of first appearance."""
        return tuple(dict.fromkeys(d.host for d in self.devices))

    def device(self, name: str) -> Device:
        """The device called ``name``; raises ProfileError listing the devices if none is."""
        try:
            return self._by_name[name]
        except (KeyError, TypeError):
            raise ProfileError(f"no device {name!r}{_suggest(str(name), self.names())} in profile "
                               f"{self.name!r}; its devices are: {', '.join(self.names())}") from None

    def host_device(self, host: str = "host0") -> Device:
        """The cpu-kind device of ``host``."""
        for d in self.devices:
            if d.host == host and d.kind is DeviceKind.CPU:
                return d
        raise ProfileError(f"profile {self.name!r} has no host {host!r}; its hosts are: "
                           f"{', '.join(self.hosts())}")

    def link(self, a: str, b: str) -> Link | None:
        """The direct link between ``a`` and ``b``, or None."""
        return self._by_pair.get(frozenset((a, b)))

    def route(self, a: str, b: str) -> tuple[Link, ...]:
        """The links a tensor crosses from ``a`` to ``b``: none for a == b, the direct link if
        there is one, otherwise a -> host cpu of a [-> host cpu of b] -> b."""
        da, db = self.device(a), self.device(b)
        if a == b:
            return ()
        direct = self.link(a, b)
        if direct is not None:
            return (direct,)
        hops = [a, self.host_device(da.host).name, self.host_device(db.host).name, b]
        path = [hops[0]] + [h for prev, h in zip(hops, hops[1:]) if h != prev]
        route = []
        for x, y in zip(path, path[1:]):
            link = self.link(x, y)
            if link is None:
                raise ProfileError(f"profile {self.name!r}: no route from {a} to {b}: no link between "
                                   f"{x} and {y} (transfers without a direct link go through the "
                                   f"host CPU); add [[links]] between = [\"{x}\", \"{y}\"]")
            route.append(link)
        return tuple(route)

    @classmethod
    def detect(cls, base: str | DeviceSet | None = None, *, margin: float | int | str = 0.05) -> DeviceSet:
        """This machine's profile (or ``base``) with each accelerator capped at the memory free
        now minus ``margin`` (a fraction of the device, or a size such as ``"2GiB"``); the probe
        (NVML, else ``torch.cuda.mem_get_info``, else the profile's figure, each fallback said) is
        kept in ``probe`` and recorded by the plan. See :mod:`cost_models.live_memory`.

        Example:
            >>> DeviceSet.detect("h200-host").probe.readings[0].device
            'cuda:0'
        """
        from cost_models.live_memory import detect_devices  # it imports this module

        return detect_devices(base, margin=margin)

    def with_memory(self, caps: Mapping[str, int | str]) -> DeviceSet:
        """A copy with the memory of some devices lowered, e.g. ``{"cuda:0": "8GiB"}``.

        Raises ProfileError for an unknown device, a cap above the device's memory, or zero.
        """
        new = {}
        for name, cap in caps.items():
            device = self.device(name)
            nbytes = parse_bytes(cap, where=f"memory cap for {name}")
            if nbytes <= 0:
                raise ProfileError(f"memory cap for {name}: {cap!r} is not positive; give the "
                                   f"capacity to use, e.g. \"8GiB\"")
            if nbytes > device.memory:
                raise ProfileError(f"memory cap for {name}: {cap!r} ({format_bytes(nbytes)}) is above "
                                   f"the device's {format_bytes(device.memory)}; caps can only "
                                   f"lower a device's memory")
            new[name] = dataclasses.replace(device, memory=nbytes)
        return dataclasses.replace(self, devices=tuple(new.get(d.name, d) for d in self.devices))

    def to_dict(self) -> dict[str, Any]:
        """Plain values in SI units, the shape of the TOML file (JSON-serialisable)."""
        return {"name": self.name,
                "devices": {d.name: d.to_dict() for d in self.devices},
                "links": [link.to_dict() for link in self.links]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "<dict>", *,
                  name: str | None = None, notes: tuple[str, ...] = ()) -> DeviceSet:
        """Build a set from the TOML-shaped mapping (unit strings or SI numbers).

        ``name`` is the default when ``d`` has no ``"name"`` key.
        """
        d = _mapping(d, source, "{ \"devices\": { \"cpu\": {...} } }")
        _check_keys(d, ("name", "devices", "links"), lambda key: f"{source}: {key}")
        set_name = d.get("name", name if name is not None else "profile")
        if not isinstance(set_name, str) or not set_name:
            raise ProfileError(f"{source}: name: {set_name!r} is not a string; e.g. name = \"my-host\"")
        if "devices" not in d:
            raise ProfileError(f"{source}: devices: missing; add at least [devices.cpu]")
        raw_devices = _mapping(d["devices"], f"{source}: devices", "[devices.cpu]")
        if len(raw_devices) > MAX_DEVICES:
            raise ProfileError(f"{source}: devices: {len(raw_devices):,} devices, over the {MAX_DEVICES} a profile "
                               f"may list (a plan places every op on each of them); list the devices "
                               f"you mean to plan for")
        devices = []
        for dev_name, raw in raw_devices.items():
            where: Where = (lambda key, n=dev_name:
                            f"{source}: devices.{_tkey(n)}" + (f".{key}" if key else ""))
            _device_name(dev_name, where(""))
            fields = _device_fields(dev_name, _mapping(raw, where(""), "[devices.cpu]"), where)
            devices.append(Device(dev_name, **fields))
        raw_links = d.get("links", [])
        if not isinstance(raw_links, (list, tuple)):
            raise ProfileError(f"{source}: links: expected an array of tables ([[links]]), got "
                               f"{raw_links!r}")
        links = []
        for i, raw in enumerate(raw_links):
            where = lambda key, i=i: f"{source}: links[{i}]" + (f".{key}" if key else "")  # noqa: E731
            links.append(Link(**_link_fields(_mapping(raw, where(""), "[[links]]"), where)))
        return cls(set_name, tuple(devices), tuple(links), source=source, notes=tuple(notes))

    def to_toml(self) -> str:
        """The set as a TOML profile that :func:`load_profile_text` reads back to an equal set."""
        out = [f"# device profile {self.name!r}, written by hetpart from {self.source}"]
        out += [f"# {line}" for note in self.notes for line in note.splitlines()]
        out.append(f"name = {json.dumps(self.name)}")
        for d in self.devices:
            out += ["", f"[devices.{_tkey(d.name)}]",
                    f"kind = {json.dumps(d.kind.value)}",
                    f"memory = {d.memory}  # {format_bytes(d.memory)}",
                    f"peak_flops = {_toml_inline(d.peak_flops)}",
                    f"mem_bandwidth = {_toml_num(d.mem_bandwidth)}  # {format_rate(d.mem_bandwidth)}",
                    f"launch_overhead = {_toml_num(d.launch_overhead)}  "
                    f"# {format_seconds(d.launch_overhead)}"]
            if d.supported_ops is not None:
                out.append(f"supported_ops = [{', '.join(json.dumps(s) for s in d.supported_ops)}]")
            out.append(f"host = {json.dumps(d.host)}")
            if d.dtypes is not None:
                out.append(f"dtypes = [{', '.join(json.dumps(t) for t in d.dtypes)}]")
            if d.onnx_provider is not None:
                out.append(f"onnx_provider = {json.dumps(d.onnx_provider)}")
            if d.cache_size:
                out += [f"cache_size = {d.cache_size}  # {format_bytes(d.cache_size)}",
                        f"cache_bandwidth = {_toml_num(d.cache_bandwidth)}  # {format_rate(d.cache_bandwidth)}"]
            if d.matmul_half_rows:
                out.append(f"matmul_half_rows = {_toml_num(d.matmul_half_rows)}  "
                           f"# a matmul over this many rows per weight reaches half its efficiency")
            if d.grouped_backward_flops:
                out.append(f"grouped_backward_flops = {_toml_num(d.grouped_backward_flops)}  "
                           f"# {d.grouped_backward_flops / 1e9:.2f} GFLOP/s in a grouped convolution's backward")
            if d.weight_only:
                out.append(f"weight_only = {_toml_inline(d.weight_only)}")
            if d.weight_unpack:
                out.append(f"weight_unpack = {_toml_inline(d.weight_unpack)}")
            if d.update_bandwidth:
                out.append(f"update_bandwidth = {_toml_num(d.update_bandwidth)}  "
                           f"# {format_rate(d.update_bandwidth)} in an optimizer step")
            if d.alloc_threshold:
                out += [f"alloc_threshold = {d.alloc_threshold}  # {format_bytes(d.alloc_threshold)}",
                        f"first_touch_bandwidth = {_toml_num(d.first_touch_bandwidth)}  "
                        f"# {format_rate(d.first_touch_bandwidth)}"]
            for key in ("efficiency", "mem_efficiency", "fixed_latency"):
                if getattr(d, key):
                    out += ["", f"[devices.{_tkey(d.name)}.{key}]"]
                    out += [f"{_tkey(k)} = {_toml_num(v)}" for k, v in getattr(d, key).items()]
        for link in self.links:
            out += ["", "[[links]]", f"between = [{json.dumps(link.between[0])}, "
                                     f"{json.dumps(link.between[1])}]",
                    f"bandwidth = {_toml_num(link.bandwidth)}  # {format_rate(link.bandwidth)}",
                    f"latency = {_toml_num(link.latency)}  # {format_seconds(link.latency)}"]
            if link.pageable_bandwidth is not None:
                out.append(f"pageable_bandwidth = {_toml_num(link.pageable_bandwidth)}  "
                           f"# {format_rate(link.pageable_bandwidth)}")
            if link.kind:
                out.append(f"kind = {json.dumps(link.kind)}")
        return "\n".join(out) + "\n"


def _toml_num(x: float) -> str:
    """The shortest decimal that reads back as exactly ``x`` (``5.5e+10``, ``1.7e-06``)."""
    for digits in range(1, 18):
        text = f"{x:.{digits}g}"
        if float(text) == x:
            return text
    return repr(x)


def _toml_inline(table: Mapping[str, float]) -> str:
    """An inline table: ``{ float32 = 5.1e+13, bfloat16 = 7.9e+14 }``."""
    return "{ " + ", ".join(f"{_tkey(k)} = {_toml_num(v)}" for k, v in table.items()) + " }"


# ----------------------------------------------------------------------------- loading

def builtin_profiles() -> list[str]:
    """Names of the profiles shipped in ``cost_models/profiles/``.

    Example:
        >>> "h200-host" in builtin_profiles()
        True
    """
    return sorted(p.stem for p in _BUILTIN_DIR.glob("*.toml"))


def builtin_profile_path(name: str) -> Path:
    """The TOML file of a built-in profile.

    Example:
        >>> builtin_profile_path("cpu").name
        'cpu.toml'
    """
    if name not in builtin_profiles():
        raise ProfileError(f"no built-in profile {name!r}{_suggest(name, builtin_profiles())}; "
                           f"built-in profiles: {', '.join(builtin_profiles())}")
    return _BUILTIN_DIR / f"{name}.toml"


def load_profile_text(text: str, source: str = "<text>") -> DeviceSet:
    """Parse a TOML profile; ``source`` names it in errors and becomes ``DeviceSet.source``.

    Example:
        >>> ds = load_profile_text('[devices.cpu]\\nkind = "cpu"\\nmemory = "8GiB"\\n'
        ...                        'peak_flops = 1e11\\nmem_bandwidth = "10GB/s"\\n'
        ...                        'launch_overhead = "2us"\\n', "tiny.toml")
        >>> ds.name, ds.device("cpu").memory
        ('tiny', 8589934592)
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ProfileError(f"{source}: TOML syntax error: {err}; see the profile format in "
                           f"cost_models/profiles.py or DESIGN.md") from None
    except RecursionError:
        raise ProfileError(f"{source}: arrays or tables are nested too deeply (thousands of levels) for a "
                           f"profile; see the profile format in cost_models/profiles.py") from None
    except ValueError as err:  # an integer of more digits than Python converts (4300 by default)
        raise ProfileError(f"{source}: a number in the file is too long to read "
                           f"({str(err).split(';')[0]}); write it with a unit, e.g. memory = \"80GB\"") from None
    stem = source.removeprefix("builtin:")
    default_name = Path(stem).stem if stem.endswith(".toml") or source.startswith("builtin:") \
        else "profile"
    if "hosts" in data:  # a cluster profile (cost_models.cluster): hosts joined by a network
        from cost_models.cluster import cluster_from_dict

        base_dir = _BUILTIN_DIR if source.startswith("builtin:") else Path(source).parent
        return cluster_from_dict(data, source, name=default_name, base_dir=base_dir).flatten()
    return DeviceSet.from_dict(data, source, name=default_name)


def load_profile(name_or_path: str | Path) -> DeviceSet:
    """Load a built-in profile by name (see :func:`builtin_profiles`) or a TOML file by path.

    Example:
        >>> load_profile("2xh200-host").names()
        ('cpu', 'cuda:0', 'cuda:1')
    """
    spec = str(name_or_path)
    if not isinstance(name_or_path, Path) and spec in builtin_profiles():
        path, source = builtin_profile_path(spec), f"builtin:{spec}"
    else:
        path, source = Path(spec), spec
        if path.suffix == ".toml" and not path.exists():
            raise ProfileError(f"profile file {spec!r} does not exist")
        if not path.exists():
            raise ProfileError(f"no profile {spec!r}{_suggest(spec, builtin_profiles())}: built-in "
                               f"profiles are {', '.join(builtin_profiles())}; a path to a TOML "
                               f"file also works, e.g. ./my-host.toml")
    from partitioner.files import read_text  # partitioner imports this module: a late import

    try:
        text = read_text(path, what="profile", max_bytes=MAX_PROFILE_BYTES)
    except HetpartError as err:
        raise ProfileError(str(err)) from None
    except OSError as err:
        raise ProfileError(f"{source}: cannot read the profile: {err.strerror or err}") from None
    return load_profile_text(text, source)
