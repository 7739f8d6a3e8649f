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
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from partitioner.errors import HetpartError

FLOAT32 = "float32"
LOW = ("bfloat16", "float16")        # the 16-bit dtypes an op may compute in
DTYPES = (FLOAT32, *LOW)
WEIGHT_DTYPES = ("int8", "int4", "float8")  # packed weight-only formats of a linear's weight
KERNEL_ACTIVATIONS = "bfloat16"     # what the weight-only kernels read (torch's int8/int4 ops, fp8 dequant)

#: names accepted for a dtype (case-insensitive) -> the torch name
ALIASES = {
    "fp32": FLOAT32, "float32": FLOAT32, "float": FLOAT32, "torch.float32": FLOAT32,
    "bf16": "bfloat16", "bfloat16": "bfloat16", "torch.bfloat16": "bfloat16",
    "fp16": "float16", "float16": "float16", "half": "float16", "torch.float16": "float16",
}
#: names accepted for a weight dtype (case-insensitive)
WEIGHT_ALIASES = {"int8": "int8", "i8": "int8", "w8": "int8", "int4": "int4", "i4": "int4", "w4": "int4",
                  "float8": "float8", "fp8": "float8", "float8_e4m3fn": "float8", "e4m3": "float8"}

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
    return _alias(name, ALIASES, f"{where}: {name!r} is not a dtype hetpart computes in; use one of "
                                 f"fp32 (float32), bf16 (bfloat16), fp16 (float16)")


def _alias(name: Any, aliases: Mapping[str, str], refusal: str) -> str:
    """``aliases[name]`` (case and spaces aside), else a PrecisionError saying ``refusal``."""
    key = str(name).strip().lower()
    if key not in aliases:
        raise PrecisionError(refusal)
    return aliases[key]


def itemsize_factor(dtype: str) -> float:
    """Bytes of a float32 activation held in ``dtype`` (a compute choice: its activation part), as a
    fraction of its float32 bytes."""
    return 0.5 if activations(dtype) in LOW else 1.0


# -- compute choices: an activation dtype, and optionally a packed weight dtype -------------------
#
# A node's choice is a string: ``"float32"``, ``"bfloat16"``, ``"float16"`` (activations and
# weights in that dtype) or ``"<activations>+<weights>"`` (``"float32+int8"``, ``"bfloat16+int4"``):
# its quantizable linears keep their weight packed in ``<weights>`` and run a weight-only kernel
# (bfloat16 activations inside it, cast in and out), its other members compute in ``<activations>``.


def compose(activation: str, weight: str | None) -> str:
    """The choice of ``activation`` compute with weights packed in ``weight`` (None: unpacked).

    Example:
        >>> compose("float32", "int8"), compose("bfloat16", None)
        ('float32+int8', 'bfloat16')
    """
    return f"{activation}+{weight}" if weight else activation


def activations(choice: str) -> str:
    """The activation dtype of a compute choice (``"float32+int8"`` -> ``"float32"``)."""
    return choice.partition("+")[0]


def weights(choice: str) -> str | None:
    """The packed weight dtype of a compute choice, or None (``"bfloat16+int4"`` -> ``"int4"``)."""
    return choice.partition("+")[2] or None


def parse_weight_dtype(name: Any, where: str = "precision.weights") -> str:
    """The name of a packed weight dtype given as ``int8``, ``int4`` or ``fp8``/``float8``.

    Example:
        >>> parse_weight_dtype("fp8")
        'float8'
    """
    return _alias(name, WEIGHT_ALIASES, f"{where}: {name!r} is not a weight dtype hetpart packs; use one of "
                                        f"{', '.join(WEIGHT_DTYPES)} (or auto)")


def int4_group(in_features: int) -> int | None:
    """The int4 group size of a weight with ``in_features`` columns: the largest of 128, 64, 32 dividing it."""
    return next((g for g in (128, 64, 32) if in_features % g == 0), None) if in_features > 0 else None


def weight_shape_problem(shape: tuple[int, ...], weight: str) -> str | None:
    """Why a ``[out, in]`` weight cannot be packed in ``weight`` (None: it can)."""
    if len(shape) != 2 or min(shape) <= 0:
        return f"{weight} packs 2-D [out, in] linear weights (this one is {list(shape)})"
    if weight == "int4" and (int4_group(shape[1]) is None or shape[0] % 16):
        return (f"int4 needs in_features divisible by 32 and out_features by 16 (this weight is "
                f"{shape[0]}x{shape[1]})")
    if weight == "int8" and shape[1] % 16:  # torch's CPU int8 kernel is wrong for other widths
        return f"int8 needs in_features divisible by 16 (this weight is {shape[0]}x{shape[1]})"
    return None


def packed_weight_bytes(out_features: int, in_features: int, weight: str) -> int:
    """Bytes a ``[out, in]`` weight packed in ``weight`` takes with its scales: int8 one byte per
    value and a bfloat16 scale per row; int4 half a byte per value and a bfloat16 scale and zero per
    group of :func:`int4_group` values; float8 one byte per value and a float32 scale per row.

    Example:
        >>> packed_weight_bytes(4096, 4096, "int4")
        8912896
    """
    values = out_features * in_features
    if weight == "int8":
        return values + 2 * out_features
    if weight == "int4":
        group = int4_group(in_features) or in_features
        return values // 2 + (in_features // group) * out_features * 4
    if weight == "float8":
        return values + 4 * out_features
    raise PrecisionError(f"{weight!r} is not a packed weight dtype; use one of {', '.join(WEIGHT_DTYPES)}")


def device_weight_dtypes(device: Any) -> tuple[str, ...]:
    """The packed weight dtypes ``device`` has a weight-only kernel for (its profile's ``weight_only``
    rates; a kernel reads bfloat16 activations, so the device must run bfloat16 too)."""
    if KERNEL_ACTIVATIONS not in device_dtypes(device):
        return ()
    return tuple(w for w in WEIGHT_DTYPES if w in getattr(device, "weight_only", {}))


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
    """The dtypes each device may compute its flexible ops in, the packed weight dtypes its
    quantizable linears may hold, the accuracy budget, and the setting they came from.

    ``dtypes[device]`` lists activation dtypes with the default first (what a baseline uses there:
    float32, or the device's first dtype when it cannot run float32). ``weights[device]`` lists
    the packed weight dtypes offered there (empty: weights stay as computed); with
    ``float_weights`` the unpacked weight stays a choice beside them (``weights="auto"``), else a
    quantizable linear on that device packs its weight. ``keep`` lists module paths or op names
    (globs) whose weights stay unpacked. ``setting`` is what the user asked for, as the plan
    records it: ``"auto"`` or a mapping.

    ``max_error`` is the user's accuracy budget: the relative L2 error of the plan's outputs against
    the float model on the example inputs, measured. ``weight_errors[param][dtype]`` is the error
    measured with that one weight packed in ``dtype`` (:mod:`backends.torch.weight_errors`); the
    solver bounds their root sum of squares (independent rounding noise adds in quadrature) by
    ``error_budget`` (``max_error`` unless the planner tightened it after measuring a whole plan
    over it: :mod:`partitioner.error_budget`).
    """

    dtypes: Mapping[str, tuple[str, ...]]
    setting: Any
    can_fp32: Mapping[str, bool]  # whether the device runs float32 (fixed ops need it)
    weights: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    float_weights: bool = True
    keep: tuple[str, ...] = ()
    max_error: float | None = None
    weight_errors: Mapping[str, Mapping[str, float]] = dataclasses.field(
        default_factory=lambda: MappingProxyType({}))
    error_budget: float | None = None  # the bound on the estimate (None: max_error)

    @property
    def estimate_budget(self) -> float | None:
        """What the solver bounds the estimated error by (None: no budget)."""
        return self.error_budget if self.error_budget is not None else self.max_error

    @property
    def auto(self) -> bool:
        return self.setting == "auto" or isinstance(self.setting, Mapping) and (
            self.setting.get("activations") == "auto" or self.setting.get("weights") == "auto")

    @property
    def packs(self) -> bool:
        """Whether some device may hold packed weights."""
        return any(self.weights.values())

    def choices(self, kinds: set[str], device: str, quantizable: bool = False) -> tuple[str, ...]:
        """The compute choices of a node whose member ops have precision ``kinds`` on ``device``
        (empty: it cannot run there). Fixed members need float32 on the device; a node without
        flexible members computes "as traced", written float32; a node with a ``quantizable``
        linear may pack its weight in each of ``weights[device]``."""
        if "fixed" in kinds and not self.can_fp32[device]:
            return ()
        packed = self.weights.get(device, ()) if quantizable else ()
        base = self.dtypes[device] if "flexible" in kinds else (FLOAT32,)  # float32: as traced
        if "flexible" not in kinds and not packed:
            return (FLOAT32,)
        if not packed:
            return base
        composed = tuple(compose(a, w) for w in packed for a in base)
        return (*base, *composed) if self.float_weights else composed


#: keys of a precision mapping that are not device names
SETTING_KEYS = ("activations", "weights", "max_error", "keep")


def resolve_precision(value: Any, devices: Any) -> Precision | None:
    """The :class:`Precision` of a setting over ``devices`` (None: every op as traced).

    ``value`` is ``"auto"`` (each device's fast 16-bit dtypes), or a mapping of device names to
    dtypes with optional keys ``activations`` (``"auto"``), ``weights`` (a packed weight dtype for
    every device with a kernel for it, a mapping of device to one, or ``"auto"``: the solver
    chooses per op), ``max_error`` (the accuracy budget: the relative output error against the
    float model the packed weights may cost, measured on the example inputs) and ``keep`` (module paths or op names, globs, whose weights stay unpacked).

    Raises:
        PrecisionError: an unknown dtype, device or key, or a dtype the device's profile does not run.

    Example:
        >>> from cost_models.profiles import load_profile
        >>> resolve_precision({"weights": "int8"}, load_profile("h200-host")).weights["cpu"]
        ('int8',)
    """
    if value is None:  # as traced: a profile's dtypes limit only plans that ask for precision
        return None
    names = devices.names()
    can_fp32 = MappingProxyType({d.name: FLOAT32 in device_dtypes(d) for d in devices.devices})
    auto_dtypes = MappingProxyType({d.name: runs_well(d) for d in devices.devices})
    if isinstance(value, str) and value.strip().lower() == "auto":
        return Precision(auto_dtypes, "auto", can_fp32)
    if isinstance(value, str):
        value = parse_precision_text(value)
    if not isinstance(value, Mapping):
        raise PrecisionError(f"precision={value!r}: give \"auto\" or a mapping of device to dtype, "
                             f"e.g. {{\"cuda:0\": \"bf16\", \"cpu\": \"fp32\"}} or {{\"weights\": \"int8\"}}")
    chosen: dict[str, tuple[str, ...]] = {}
    setting: dict[str, Any] = {}
    for name, dtype in value.items():
        if name in SETTING_KEYS:
            continue
        if name not in names:
            raise PrecisionError(f"precision: {name!r} is not a device of profile {devices.name!r}; "
                                 f"its devices are {', '.join(names)} (other keys: {', '.join(SETTING_KEYS)})")
        dt = parse_dtype(dtype, f"precision[{name!r}]")
        runs = device_dtypes(devices.device(name))
        if dt not in runs:
            raise PrecisionError(f"precision: device {name} cannot compute in {dt} (its profile's dtypes are "
                                 f"{', '.join(runs)}); choose one of those for it")
        chosen[name] = (dt,)
        setting[name] = dt
    act = value.get("activations")
    if act is not None:
        if str(act).strip().lower() != "auto" or chosen:
            raise PrecisionError(f"precision['activations']={act!r}: give \"auto\" (the solver chooses each op's "
                                 f"dtype), or name a dtype per device instead, e.g. {{\"cuda:0\": \"bf16\"}}")
        setting["activations"] = "auto"
    for d in devices.devices:
        if d.name not in chosen:
            runs = device_dtypes(d)
            chosen[d.name] = auto_dtypes[d.name] if act is not None else (FLOAT32,) if FLOAT32 in runs else (runs[0],)
    packed, float_weights = _resolve_weights(value.get("weights"), devices, setting)
    max_error = _budget(value.get("max_error"), setting)
    keep = _keep(value.get("keep"), setting)
    if keep and not packed:
        raise PrecisionError("precision: keep bounds packed weights; add weights=int8, int4, float8 or auto")
    if max_error is not None and not packed:
        raise PrecisionError(f"precision: max_error={max_error:g} bounds the error packed weights cost; add "
                             f"weights=auto (the solver packs what the budget allows) or weights=int8/int4")
    return Precision(MappingProxyType(chosen), setting, can_fp32, MappingProxyType(packed), float_weights, keep,
                     max_error)


def _resolve_weights(raw: Any, devices: Any, setting: dict[str, Any]) -> tuple[dict[str, tuple[str, ...]], bool]:
    """Per device the packed weight dtypes offered, and whether unpacked weights stay a choice."""
    if raw is None:
        return {}, True
    kernels = {d.name: device_weight_dtypes(d) for d in devices.devices}
    have = "; ".join(f"{n}: {', '.join(k) or 'none'}" for n, k in kernels.items())
    if isinstance(raw, str) and raw.strip().lower() == "auto":
        setting["weights"] = "auto"
        if not any(kernels.values()):
            raise PrecisionError(f"precision: weights=auto, but no device of profile {devices.name!r} lists a "
                                 f"weight-only kernel (its profile's weight_only rates); calibrate one with "
                                 f"hetpart calibrate, or drop weights")
        return kernels, True
    if isinstance(raw, Mapping):
        out: dict[str, tuple[str, ...]] = {}
        for name, dtype in raw.items():
            if name not in kernels:
                raise PrecisionError(f"precision['weights']: {name!r} is not a device of profile "
                                     f"{devices.name!r}; its devices are {', '.join(kernels)}")
            w = parse_weight_dtype(dtype, f"precision['weights'][{name!r}]")
            if w not in kernels[name]:
                raise PrecisionError(f"precision: device {name} has no {w} weight-only kernel (it runs "
                                     f"{', '.join(kernels[name]) or 'no packed weights'}); choose one of those "
                                     f"for it, or leave it out")
            out[name] = (w,)
        setting["weights"] = {n: a[0] for n, a in out.items()}
        return out, False
    w = parse_weight_dtype(raw)
    out = {n: (w,) for n, k in kernels.items() if w in k}
    if not out:
        raise PrecisionError(f"precision: weights={w}, but no device of profile {devices.name!r} has a {w} "
                             f"weight-only kernel ({have}); choose a dtype one of them runs")
    setting["weights"] = w
    return out, False


def _budget(raw: Any, setting: dict[str, Any]) -> float | None:
    """The accuracy budget ``max_error``: a relative output error, a number above 0 (None: no budget)."""
    if raw is None:
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = float("nan")
    if isinstance(raw, bool) or not math.isfinite(value) or value <= 0:
        raise PrecisionError(f"precision['max_error']={raw!r}: give the relative output error the packed weights "
                             f"may cost against the float model, a number above 0 (e.g. max_error=0.02: 2%)")
    setting["max_error"] = value
    return value


def _keep(raw: Any, setting: dict[str, Any]) -> tuple[str, ...]:
    if raw is None:
        return ()
    items = raw.split(";") if isinstance(raw, str) else raw
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) and i.strip() for i in items):
        raise PrecisionError(f"precision['keep']={raw!r}: give module paths or op names (globs), e.g. "
                             f"[\"lm_head\", \"*.mlp.down_proj\"] (CLI: keep=lm_head;*.down_proj)")
    setting["keep"] = [i.strip() for i in items]
    return tuple(setting["keep"])


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


#: aten operators whose weight operand a weight-only kernel replaces (``linear(x, weight, bias)``)
PACKABLE_OPS = frozenset({"linear"})


def quantizable_weight(op: Any, params: Mapping[str, Any]) -> str | None:
    """The parameter of ``op`` a weight-only kernel may pack, or None: ``op`` is an aten linear whose
    own 2-D floating weight (float32, or a model traced in 16 bits) (its second operand) no other op reads (a tied embedding table is read
    by its gather too, so it stays), with a shape every packed dtype takes except for int4's
    divisibility (checked per dtype by :func:`weight_shape_problem`)."""
    if op.kind.split(".")[0] != "aten" or op_base_name(op.kind) not in PACKABLE_OPS:
        return None
    for name in op.owned_params:
        param = params.get(name)
        if param is None or len(param.shape) != 2 or param.dtype not in DTYPES:
            continue
        if tuple(param.users) != (op.name,):
            return None
        return name
    return None


def cast_bytes(nbytes_fp32: int) -> float:
    """Bytes a cast between float32 and a 16-bit dtype moves: it reads one and writes the other
    (1.5x the float32 bytes; between two 16-bit dtypes it moves 1x, priced alike for one linear rule)."""
    return 1.5 * nbytes_fp32
