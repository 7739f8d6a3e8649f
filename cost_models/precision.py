"""Precision per device: the dtypes each device may compute in, and the accuracy policy.

In: a user's ``precision`` setting (``"auto"``, or ``{"cuda:0": "bf16", "cpu": "fp32"}``) and a
:class:`~cost_models.profiles.DeviceSet`. Out: a :class:`Precision` (the dtypes each device may
compute in) and, per op, which of them it may use (:func:`op_precision`).

The accuracy policy follows torch autocast's lists (``torch/csrc/autograd/autocast_mode.cpp``):

* ``fixed`` ops always compute in float32: softmax and log-softmax (their statistics), every
  norm (layer, group, batch, RMS: their reductions), ``exp``/``log``/``pow`` and friends,
  ``sum``/``mean``/``prod``/``cumsum``/``var``/``std``/norms (reductions), every loss
  (``cross_entropy``, ``nll_loss``, ``mse_loss``, ...), and explicit dtype conversions;
* ``flexible`` ops (matmul, linear, conv, attention, elementwise, views, embeddings) may compute
  in a 16-bit dtype when they compute in float32 as traced and read a floating tensor or weight;
* ``native`` ops (integer ops, ops creating tensors from nothing) run as traced anywhere.

The optimizer update is always float32: training keeps float32 master weights (and their gradients
and optimizer state) and casts a low-precision op's weights on every call (priced as a cast).

A device runs the dtypes its profile lists in ``dtypes`` (``dtypes = ["bfloat16", "float16"]``:
an NPU without float32) or, when it lists none, every dtype. With ``"auto"`` a device is offered
float32 (when it runs it) and each 16-bit dtype whose peak rate in the profile is above its
float32 peak ("runs well"), float16 only where it is faster than bfloat16 too (bfloat16 keeps
float32's exponent range, so it needs no loss scaling; a device limited to ``dtypes`` is offered
them under the same rule); with a mapping, each named device computes its flexible ops in the
dtype given, ``fixed`` ops in float32, and unnamed devices in float32 (or their first dtype
when they cannot run float32).
Without a ``precision`` setting (None) every op computes as traced and ``dtypes`` is not
consulted, so plans made before precision existed stay as they were.

Example:
    >>> from cost_models.profiles import load_profile
    >>> p = resolve_precision("auto", load_profile("cpu-gpu-npu"))
    >>> p.dtypes["npu:0"]
    ('bfloat16',)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from partitioner.errors import HetpartError

FLOAT32 = "float32"
LOW = ("bfloat16", "float16")        # the 16-bit dtypes an op may compute in
DTYPES = (FLOAT32, *LOW)

#: names accepted for a dtype (case-insensitive) -> the torch name
ALIASES = {
    "fp32": FLOAT32, "float32": FLOAT32, "float": FLOAT32, "torch.float32": FLOAT32,
    "bf16": "bfloat16", "bfloat16": "bfloat16", "torch.bfloat16": "bfloat16",
    "fp16": "float16", "float16": "float16", "half": "float16", "torch.float16": "float16",
}

#: aten operator names (``aten.<name>.<overload>``) and module types that stay in float32
FP32_OPS = frozenset({
    "softmax", "_softmax", "log_softmax", "_log_softmax", "softmin",
    "layer_norm", "native_layer_norm", "group_norm", "native_group_norm", "batch_norm",
    "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
    "_native_batch_norm_legit_functional", "instance_norm", "rms_norm", "_fused_rms_norm",
    "exp", "expm1", "exp2", "log", "log1p", "log2", "log10", "pow", "rsqrt", "reciprocal",
    "acos", "asin", "cosh", "sinh", "tan", "erfinv", "softplus", "logsumexp",
    "sum", "mean", "prod", "cumsum", "cumprod", "var", "std", "var_mean", "std_mean", "norm",
    "linalg_vector_norm", "frobenius_norm", "nuclear_norm", "renorm", "dist", "cdist",
    "cross_entropy", "cross_entropy_loss", "nll_loss", "nll_loss_forward", "nll_loss2d",
    "nll_loss_nd", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div",
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "soft_margin_loss",
    "multilabel_margin_loss", "multi_margin_loss", "poisson_nll_loss", "cosine_embedding_loss",
    "margin_ranking_loss", "hinge_embedding_loss", "triplet_margin_loss", "cosine_similarity",
    "_to_copy", "to", "type_as", "_to_dtype",
})
FP32_MODULES = frozenset({
    "LayerNorm", "GroupNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "RMSNorm", "InstanceNorm1d",
    "InstanceNorm2d", "Softmax", "LogSoftmax", "CrossEntropyLoss", "NLLLoss", "MSELoss", "L1Loss",
    "BCELoss", "BCEWithLogitsLoss", "KLDivLoss", "SmoothL1Loss",
})


class PrecisionError(HetpartError, ValueError):
    """A ``precision`` setting that names an unknown dtype or device, or a dtype a device cannot run."""


def parse_dtype(name: Any, where: str = "precision") -> str:
    """The torch name of a dtype given as ``fp32``/``float32``, ``bf16``/``bfloat16`` or ``fp16``/``float16``.

    Example:
        >>> parse_dtype("bf16")
        'bfloat16'
    """
    key = str(name).strip().lower()
    if key not in ALIASES:
        raise PrecisionError(f"{where}: {name!r} is not a dtype hetpart computes in; use one of "
                             f"fp32 (float32), bf16 (bfloat16), fp16 (float16)")
    return ALIASES[key]


def itemsize_factor(dtype: str) -> float:
    """Bytes of a float32 tensor held in ``dtype``, as a fraction of its float32 bytes."""
    return 0.5 if dtype in LOW else 1.0


def device_dtypes(device: Any) -> tuple[str, ...]:
    """The dtypes ``device`` can compute in (its profile's ``dtypes``, else all of them)."""
    return tuple(device.dtypes) if device.dtypes else DTYPES


def runs_well(device: Any) -> tuple[str, ...]:
    """The dtypes ``auto`` offers on ``device``: float32 when it runs it, and each 16-bit dtype it
    runs faster than float32 (its ``peak_flops`` entry above the float32 one), float32 first."""
    runs = device_dtypes(device)
    if device.dtypes:  # the profile says what the device runs: offer it (float16 as below)
        offered = tuple(d for d in DTYPES if d in runs)
    else:
        offered = (FLOAT32, *(d for d in LOW if d in device.peak_flops and device.peak(d) > device.peak(FLOAT32)))
    if "bfloat16" in offered and "float16" in offered and not _faster(device, "float16", "bfloat16"):
        offered = tuple(d for d in offered if d != "float16")  # bfloat16 keeps float32's range: no loss scaling
    return offered


def _faster(device: Any, a: str, b: str) -> bool:
    """Whether ``device``'s profile lists a higher peak rate for ``a`` than for ``b``."""
    return a in device.peak_flops and (b not in device.peak_flops or device.peak(a) > device.peak(b))


@dataclasses.dataclass(frozen=True)
class Precision:
    """The dtypes each device may compute its flexible ops in, and the setting they came from.

    ``dtypes[device]`` lists them with the default first (what a baseline uses there: float32,
    or the device's first dtype when it cannot run float32). ``setting`` is what the user asked
    for, as the plan records it: ``"auto"`` or ``{device: dtype}``.
    """

    dtypes: Mapping[str, tuple[str, ...]]
    setting: Any
    can_fp32: Mapping[str, bool]  # whether the device runs float32 (fixed ops need it)

    @property
    def auto(self) -> bool:
        return self.setting == "auto"

    def choices(self, kinds: set[str], device: str) -> tuple[str, ...]:
        """The dtypes a node whose member ops have precision ``kinds`` may compute in on ``device``
        (empty: it cannot run there). Fixed members need float32 on the device; a node without
        flexible members computes "as traced", written float32."""
        if "fixed" in kinds and not self.can_fp32[device]:
            return ()
        if "flexible" not in kinds:
            return (FLOAT32,)
        return self.dtypes[device]


def resolve_precision(value: Any, devices: Any) -> Precision | None:
    """The :class:`Precision` of a setting over ``devices`` (None: every op as traced).

    Raises:
        PrecisionError: an unknown dtype or device, or a dtype the device's profile does not run.
    """
    if value is None:  # as traced: a profile's dtypes limit only plans that ask for precision
        return None
    names = devices.names()
    can_fp32 = {d.name: FLOAT32 in device_dtypes(d) for d in devices.devices}
    if isinstance(value, str) and value.strip().lower() == "auto":
        return Precision(MappingProxyType({d.name: runs_well(d) for d in devices.devices}), "auto",
                         MappingProxyType(can_fp32))
    if isinstance(value, str):
        value = parse_precision_text(value)
    if not isinstance(value, Mapping):
        raise PrecisionError(f"precision={value!r}: give \"auto\" or a mapping of device to dtype, "
                             f"e.g. {{\"cuda:0\": \"bf16\", \"cpu\": \"fp32\"}}")
    chosen: dict[str, tuple[str, ...]] = {}
    setting: dict[str, str] = {}
    for name, dtype in value.items():
        if name not in names:
            raise PrecisionError(f"precision: {name!r} is not a device of profile {devices.name!r}; "
                                 f"its devices are {', '.join(names)}")
        dt = parse_dtype(dtype, f"precision[{name!r}]")
        runs = device_dtypes(devices.device(name))
        if dt not in runs:
            raise PrecisionError(f"precision: device {name} cannot compute in {dt} (its profile's dtypes are "
                                 f"{', '.join(runs)}); choose one of those for it")
        chosen[name] = (dt,)
        setting[name] = dt
    for d in devices.devices:
        if d.name not in chosen:
            runs = device_dtypes(d)
            chosen[d.name] = (FLOAT32,) if FLOAT32 in runs else (runs[0],)
    return Precision(MappingProxyType(chosen), setting, MappingProxyType(can_fp32))


def parse_precision_text(text: str) -> dict[str, str]:
    """``"cuda:0=bf16,cpu=fp32"`` -> ``{"cuda:0": "bf16", "cpu": "fp32"}`` (the CLI's form)."""
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        device, sep, dtype = item.rpartition("=")
        if not sep or not device.strip() or not dtype.strip():
            raise PrecisionError(f"precision item {item!r}: write DEVICE=DTYPE, e.g. cuda:0=bf16,cpu=fp32 "
                                 f"(or auto)")
        out[device.strip()] = dtype.strip()
    if not out:
        raise PrecisionError("precision is empty: write auto or DEVICE=DTYPE pairs, e.g. cuda:0=bf16,cpu=fp32")
    return out


def op_base_name(kind: str) -> str:
    """``aten.softmax.int`` -> ``softmax``; ``torch.nn.LayerNorm`` -> ``LayerNorm``."""
    parts = kind.split(".")
    if parts[0] == "aten" and len(parts) >= 2:
        return parts[1]
    return parts[-1]


def op_precision(op: Any, tensors: Mapping[str, Any], params: Mapping[str, Any] | None = None) -> str:
    """``"fixed"``, ``"flexible"`` or ``"native"`` for one op (see the module docstring)."""
    name = op_base_name(op.kind)
    if name in FP32_OPS or op.module_type in FP32_MODULES and name in FP32_MODULES \
            or any(op_base_name(a) in FP32_OPS for a in op.aten_ops):
        return "fixed"
    if op.dtype != FLOAT32:
        return "native"
    float_inputs = any(tensors[t].dtype == FLOAT32 for t in op.inputs)
    float_params = bool(op.params) and any(getattr((params or {}).get(p), "dtype", FLOAT32) == FLOAT32
                                           for p in op.params)
    return "flexible" if float_inputs or float_params else "native"


def cast_bytes(nbytes_fp32: int) -> float:
    """Bytes a cast between float32 and a 16-bit dtype moves: it reads one and writes the other
    (1.5x the float32 bytes; between two 16-bit dtypes it moves 1x, priced alike for one linear rule)."""
    return 1.5 * nbytes_fp32
