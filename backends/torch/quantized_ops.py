"""Weight-only quantized linears: torchao quantizes a float weight, torch's kernels multiply by it.

In: a float weight ``[out_features, in_features]``, a storage dtype (:data:`WEIGHT_DTYPES`) and the
device the weight will live on. Out: :func:`pack_weight`'s named tensors, packed for that device's
kernel; :data:`LINEAR`'s function for the dtype, called with them, computes
``y = x @ dequant(W)^T + b`` in ``x``'s dtype (these functions are the ``call_function`` targets of
emitted GraphModules, see :mod:`backends.torch.packed`).

=======  ===============================================  =================================  =========================
dtype    tensors (in this order)                          kernel (cpu / cuda)                bytes (packed_bytes)
=======  ===============================================  =================================  =========================
int8     ``qweight`` int8 [out, in] (symmetric per row),  ``_weight_int8pack_mm`` on both    out*in + 2*out
         ``scales`` bfloat16 [out]
int4     ``qweight`` (cpu: uint8 [out, in/2]; cuda:       ``_weight_int4pack_mm_for_cpu`` /  out*in/2 + 4*out*in/group
         int32 tiles), ``scales_and_zeros`` bfloat16      ``_weight_int4pack_mm`` (sm_80+)
         [in/group, out, 2] (asymmetric per group)
float8   ``qweight`` float8_e4m3fn [out, in],             none: ``F.linear`` on its values   out*in + 4*out
         ``scales`` float32 [out]                         in bf16, scaled (cuda, sm_89+)
=======  ===============================================  =================================  =========================

Activations reach the kernels in bfloat16 (torch's CPU int8 kernel is about 10x slower with
float32 ones) and the result is cast back. Shape rules (:func:`can_quantize`) come from the
kernels: int8 needs ``in % 16 == 0`` (the CPU kernel reads 16 columns at a time and returns
garbage or crashes otherwise), int4 ``in % 32 == 0`` and ``out % 16 == 0`` (CPU packing; the
CUDA tiles need ``out % 8`` and ``in % 32``). Quantized weights are for inference: a call that
would need a gradient is refused.

torchao is imported on first use, not with this module; the two log lines its import writes
on a torch without its CUDA extensions (``Failed to load .../_C_*.so`` from the ``torchao``
logger, the Enum ``register_constant`` deprecation from ``torch.utils._pytree``) are demoted to
debug records of this module's logger.

Example:
    >>> w = torch.randn(256, 512)
    >>> packed = pack_weight(w, "int8", "cpu")
    >>> sorted(packed), packed["qweight"].dtype
    (['qweight', 'scales'], torch.int8)
    >>> with torch.no_grad():
    ...     y = linear_int8(torch.randn(3, 512), **packed)
    >>> y.shape, y.dtype
    (torch.Size([3, 256]), torch.float32)
"""

from __future__ import annotations

import contextlib
import logging
import types
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from cost_models.precision import WEIGHT_DTYPES, int4_group, packed_weight_bytes, weight_shape_problem
from partitioner.errors import HetpartError

__all__ = ["WEIGHT_DTYPES", "int4_group", "can_quantize", "packed_bytes", "pack_weight",
           "linear_int8", "linear_int4", "linear_float8", "LINEAR", "dequantized"]

log = logging.getLogger(__name__)

_CUDA_INT4_CAPABILITY = (8, 0)      # _weight_int4pack_mm's tensor-core tiles
_CUDA_FP8_CAPABILITY = (8, 9)       # float8 on Ada / Hopper and later
_DISPATCH_KEYS = {"cpu": "CPU", "cuda": "CUDA"}


# ---------------------------------------------------------------- shape rules and sizes
# (the planner's rules: cost_models.precision prices and admits exactly what packs here)


def can_quantize(weight_shape: tuple[int, ...], dtype: str) -> str | None:
    """None when a 2-D float weight ``[out, in]`` of this shape can be quantized to ``dtype``;
    else the reason, in words (:func:`~cost_models.precision.weight_shape_problem`).

    Example:
        >>> can_quantize((256, 512), "int4") is None
        True
        >>> can_quantize((256, 100), "int4")
        'int4 needs in_features divisible by 32 and out_features by 16 (this weight is 256x100)'
    """
    if dtype not in WEIGHT_DTYPES:
        return f"unknown weight dtype {dtype!r} (known: {', '.join(WEIGHT_DTYPES)})"
    return weight_shape_problem(tuple(int(d) for d in weight_shape), dtype)


def packed_bytes(out_features: int, in_features: int, dtype: str) -> int:
    """Bytes the packed weight and its scales (and zeros) take; equals the ``nbytes`` of the
    tensors :func:`pack_weight` returns (:func:`~cost_models.precision.packed_weight_bytes`).

    Raises:
        HetpartError: the shape cannot be quantized to ``dtype`` (:func:`can_quantize`).

    Example:
        >>> packed_bytes(256, 512, "int8"), packed_bytes(256, 512, "int4"), packed_bytes(256, 512, "float8")
        (131584, 69632, 132096)
    """
    _require_quantizable((out_features, in_features), dtype)
    return packed_weight_bytes(out_features, in_features, dtype)


# ---------------------------------------------------------------- packing


def pack_weight(weight: torch.Tensor, dtype: str, device: torch.device | str) -> dict[str, torch.Tensor]:
    """The tensors (name -> tensor, on ``device``) that stand for ``weight`` in ``dtype``, in the
    order the :data:`LINEAR` function takes them (see the module docstring's table).

    ``weight`` may have any float dtype and live on any device; qparams are computed in float32 on
    ``device``'s type, and the values packed with torch's op for it (cpu or cuda).

    Raises:
        HetpartError: the shape cannot be quantized to ``dtype``, the weight is not float, or
            ``device`` has no kernel for it (float8 on cpu, int4 on a CUDA GPU before sm_80).

    Example:
        >>> packed = pack_weight(torch.randn(96, 160), "int4", "cpu")
        >>> {k: (v.dtype, tuple(v.shape)) for k, v in packed.items()}
        {'qweight': (torch.uint8, (96, 80)), 'scales_and_zeros': (torch.bfloat16, (5, 96, 2))}
    """
    _require_quantizable(tuple(weight.shape), dtype)
    if not weight.is_floating_point():
        raise HetpartError(f"cannot quantize a {weight.dtype} weight of shape {tuple(weight.shape)} to {dtype}: "
                           f"it is not a float weight; pass the float weight the layer was trained with")
    target = torch.device(device)
    _require_device(target, dtype)
    with torch.no_grad():
        w32 = weight.detach().to(device=target, dtype=torch.float32)
        return _PACKERS[dtype](w32)


def _require_quantizable(shape: tuple[int, ...], dtype: str) -> None:
    reason = can_quantize(shape, dtype)
    if reason is not None:
        raise HetpartError(f"cannot quantize a weight of shape {tuple(shape)} to {dtype}: {reason}; "
                           f"keep this layer in 16 bits or pick another weight dtype")


def _require_device(device: torch.device, dtype: str) -> None:
    """Raise unless ``device`` has what ``dtype``'s weights need (see the module docstring)."""
    if device.type not in _DISPATCH_KEYS:
        raise HetpartError(f"no {dtype} weight kernel for device {device}: quantized weights live on cpu or "
                           f"cuda; keep this layer's weight in 16 bits there")
    if device.type == "cpu":
        if dtype == "float8":
            raise HetpartError("float8 weights need a CUDA GPU with fp8 (sm_89+), and this one goes to cpu: "
                               "use int8 or int4 there")
        return
    if not torch.cuda.is_available():
        raise HetpartError(f"{dtype} weights for {device}, but this torch sees no CUDA GPU "
                           f"(torch {torch.__version__}); pack them on the machine that runs the module")
    capability = torch.cuda.get_device_capability(device)
    if dtype == "float8" and torch.version.hip is None and capability < _CUDA_FP8_CAPABILITY:
        raise HetpartError(f"float8 weights need a CUDA GPU with fp8 (sm_89+); {device} is "
                           f"sm_{capability[0]}{capability[1]}: use int8 or int4 there")
    if dtype == "int4" and not (_has_kernel("_weight_int4pack_mm", device)
                                and (torch.version.hip is not None or capability >= _CUDA_INT4_CAPABILITY)):
        raise HetpartError(f"int4 weights on {device} need torch's _weight_int4pack_mm on a GPU of sm_80+ "
                           f"(this is sm_{capability[0]}{capability[1]}, torch {torch.__version__}): use int8 there")


def _pack_int8(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """Symmetric per-row int8; the values are quantized with the bfloat16-rounded scales the kernel reads."""
    ao = _torchao()
    block = (1, w.shape[1])
    scales, zeros = ao.choose_qparams_affine(w, ao.MappingType.SYMMETRIC, block, torch.int8)
    scales = scales.to(torch.bfloat16)
    qweight = ao.quantize_affine(w, block, scales.float(), zeros, torch.int8)
    return {"qweight": qweight.contiguous(), "scales": scales.contiguous()}


def _pack_int4(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """Asymmetric per-group int4 (tinygemm's scales and float zeros), packed for ``w``'s device type."""
    ao = _torchao()
    group = int4_group(w.shape[1])
    # torchao returns int32 values 0..15 on cpu, and uint8 pairs (the CUDA op's input) elsewhere
    values, scales_and_zeros = ao.groupwise_affine_quantize_tensor(w, 4, group, torch.bfloat16)
    if w.device.type == "cpu":
        qweight = torch.ops.aten._convert_weight_to_int4pack_for_cpu(values.contiguous(), 1)
    else:
        if values.dtype != torch.uint8:
            raise HetpartError(f"torchao's groupwise_affine_quantize_tensor gave {values.dtype} int4 values on "
                               f"{w.device}, not the uint8 pairs _convert_weight_to_int4pack takes; "
                               f"use the torchao version this project pins")
        qweight = torch.ops.aten._convert_weight_to_int4pack(values.contiguous(), _inner_k_tiles(w.shape[1]))
    return {"qweight": qweight, "scales_and_zeros": scales_and_zeros.contiguous()}


def _pack_float8(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-row float8_e4m3fn with float32 scales (torchao's Float8WeightOnlyConfig, PerRow)."""
    ao = _torchao()
    scale = ao.choose_scale_float8(w, [1, w.shape[1]], torch.float8_e4m3fn,
                                   hp_value_lb=torch.finfo(torch.float32).tiny)   # all-zero rows: no 0/0
    qweight = ao.quantize_affine_float8(w, scale, torch.float8_e4m3fn)
    return {"qweight": qweight.contiguous(), "scales": scale.reshape(-1).contiguous()}


_PACKERS = {"int8": _pack_int8, "int4": _pack_int4, "float8": _pack_float8}


def _inner_k_tiles(in_features: int) -> int:
    """The CUDA int4 layout's k-tiles per 16-byte load: the largest of 8, 4, 2 that ``in_features`` allows."""
    return next(t for t in (8, 4, 2) if in_features % (16 * t) == 0)


# ---------------------------------------------------------------- the linears


def linear_int8(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ dequant(W)^T + bias`` for an int8 weight of :func:`pack_weight`, in ``x.dtype``.

    cpu and cuda run ``_weight_int8pack_mm`` on bfloat16 activations; a CUDA torch without that
    kernel multiplies by the bfloat16 int8 values and scales the output per row (the same numbers).

    Example:
        >>> packed = pack_weight(torch.randn(256, 512), "int8", "cpu")
        >>> with torch.no_grad():
        ...     linear_int8(torch.randn(2, 7, 512, dtype=torch.bfloat16), **packed).shape
        torch.Size([2, 7, 256])
    """
    rows = _rows(x, qweight, qweight.shape[1], "int8")
    if x.device.type == "cpu" and qweight.shape[1] % 16:  # (weight_shape_problem: the CPU kernel is wrong otherwise)
        raise HetpartError(f"int8 weight of shape {tuple(qweight.shape)} on cpu: "
                           f"{can_quantize(tuple(qweight.shape), 'int8')}; pack it with pack_weight")
    if _has_kernel("_weight_int8pack_mm", x.device):
        y = torch.ops.aten._weight_int8pack_mm(rows, qweight, scales.to(torch.bfloat16))
    else:
        y = F.linear(rows, qweight.to(torch.bfloat16)) * scales.to(torch.bfloat16)
    return _finish(y, x, bias)


def linear_int4(x: torch.Tensor, qweight: torch.Tensor, scales_and_zeros: torch.Tensor,
                bias: torch.Tensor | None = None, *, group: int) -> torch.Tensor:
    """``x @ dequant(W)^T + bias`` for an int4 weight of :func:`pack_weight` (``group``:
    :func:`int4_group` of its in_features), in ``x.dtype``.

    cpu runs ``_weight_int4pack_mm_for_cpu``, cuda ``_weight_int4pack_mm``; each reads only the
    layout its own packing op wrote, so there is no dequantizing fallback.

    Example:
        >>> packed = pack_weight(torch.randn(96, 160), "int4", "cpu")
        >>> with torch.no_grad():
        ...     linear_int4(torch.randn(3, 160), **packed, group=int4_group(160)).shape
        torch.Size([3, 96])
    """
    rows = _rows(x, qweight, _int4_in_features(qweight), "int4")
    szs = scales_and_zeros.to(torch.bfloat16)
    if x.device.type == "cpu":
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, qweight, group, szs)
    elif _has_kernel("_weight_int4pack_mm", x.device):
        y = torch.ops.aten._weight_int4pack_mm(rows, qweight, group, szs)
    else:
        raise HetpartError(f"int4 weights on {x.device} need torch's _weight_int4pack_mm, which torch "
                           f"{torch.__version__} lacks there; use int8 weights on this device")
    return _finish(y, x, bias)


def linear_float8(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ dequant(W)^T + bias`` for a float8_e4m3fn weight with per-row float32 ``scales``, in
    ``x.dtype`` (weight-only, as torchao's Float8WeightOnlyConfig).

    The e4m3 values are exact in bfloat16: the product runs on them with ``F.linear`` and each
    output column is scaled by its row's float32 scale (the same as dequantizing first).

    Example:
        >>> w = torch.randn(16, 32)
        >>> s = w.abs().amax(dim=1) / 448
        >>> q = (w / s[:, None]).to(torch.float8_e4m3fn)
        >>> with torch.no_grad():
        ...     linear_float8(torch.randn(2, 32), q, s).shape
        torch.Size([2, 16])
    """
    rows = _rows(x, qweight, qweight.shape[1], "float8")
    y = F.linear(rows, qweight.to(torch.bfloat16)).float() * scales.float()
    return _finish(y, x, bias)


LINEAR = {"int8": linear_int8, "int4": linear_int4, "float8": linear_float8}


def _rows(x: torch.Tensor, qweight: torch.Tensor, in_features: int, dtype: str) -> torch.Tensor:
    """``x`` as contiguous bfloat16 rows ``[-1, in_features]``, after checking it fits the weight."""
    if torch.is_grad_enabled() and x.requires_grad:
        raise HetpartError(f"quantized weights are for inference; this {dtype} linear got an input that "
                           f"requires grad: run the module under torch.no_grad() or torch.inference_mode(), "
                           f"or plan without packed weights to train it")
    if not x.is_floating_point():
        raise HetpartError(f"{dtype} linear got a {x.dtype} input; it multiplies float activations")
    if x.shape[-1] != in_features:
        raise HetpartError(f"{dtype} linear got an input of shape {tuple(x.shape)}, but its weight has "
                           f"{in_features} in_features; the packed weight does not belong to this layer")
    if x.device.type != qweight.device.type:
        raise HetpartError(f"{dtype} linear got an input on {x.device} and its weight on {qweight.device}; "
                           f"pack the weight for the device the layer runs on")
    return x.reshape(-1, in_features).to(torch.bfloat16).contiguous()


def _finish(y: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The kernel's rows ``y`` cast to ``x.dtype``, plus ``bias``, in ``x``'s leading shape."""
    y = y.to(x.dtype)
    if bias is not None:
        y = y + bias.to(x.dtype)
    return y.reshape(*x.shape[:-1], y.shape[-1])


def _int4_in_features(qweight: torch.Tensor) -> int:
    """in_features of an int4 weight in either layout (cpu [out, in/2]; cuda [out/8, in/(16t), 32, t/2])."""
    if qweight.dim() == 2:
        return qweight.shape[1] * 2
    if qweight.dim() == 4:
        return qweight.shape[1] * qweight.shape[3] * 2 * 16
    raise HetpartError(f"int4 weight of shape {tuple(qweight.shape)} is in neither torch's cpu nor its cuda "
                       f"int4 layout; pack it with pack_weight")


def _has_kernel(op: str, device: torch.device) -> bool:
    """Whether this torch registers a kernel of ``aten::op`` for ``device``'s type."""
    key = _DISPATCH_KEYS.get(device.type)
    return key is not None and torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", key)


# ---------------------------------------------------------------- back to float


def dequantized(tensors: dict[str, torch.Tensor], dtype: str, shape: tuple[int, int]) -> torch.Tensor:
    """The float32 weight ``[out, in]`` the packed ``tensors`` stand for (for error reports and tests).

    int4 weights are read back through their own kernel (an identity matrix times the weight, as
    torchao's HQQ linear does), so the values are rounded to bfloat16 as the kernel computes them.

    Raises:
        HetpartError: ``dtype`` is unknown, or the tensors are not of a weight of ``shape``.

    Example:
        >>> w = torch.randn(256, 512)
        >>> back = dequantized(pack_weight(w, "int8", "cpu"), "int8", (256, 512))
        >>> bool((back - w).abs().max() < 0.05)
        True
    """
    if dtype not in LINEAR:
        raise HetpartError(f"unknown weight dtype {dtype!r} (known: {', '.join(WEIGHT_DTYPES)})")
    out_features, in_features = shape
    with torch.no_grad():
        if dtype == "int4":
            weight = _int4_read_back(tensors, in_features)
        else:
            weight = tensors["qweight"].float() * tensors["scales"].float()[:, None]
    if tuple(weight.shape) != (out_features, in_features):
        raise HetpartError(f"the packed {dtype} tensors hold a weight of shape {tuple(weight.shape)}, "
                           f"not {tuple(shape)}; pass the shape they were packed from")
    return weight


def fake_quantized(weight: torch.Tensor, dtype: str) -> torch.Tensor:
    """``weight`` packed in ``dtype`` and read back to float32, on the host: the values a
    weight-only kernel multiplies by (how much packing alone moves a layer, without its kernel).
    float8 is packed by its host arithmetic too, though only GPUs have its kernel.

    Example:
        >>> w = torch.randn(64, 128)
        >>> bool((fake_quantized(w, "int8") - w).abs().max() < 0.05)
        True
    """
    _require_quantizable(tuple(weight.shape), dtype)
    with torch.no_grad():
        w32 = weight.detach().to(device="cpu", dtype=torch.float32)
        if dtype == "int4":  # torchao's own inverse, rounded to bfloat16 as the kernel computes (no read-back
            ao = _torchao()  # through the kernel: that costs a matmul of the weight's width)
            group = int4_group(w32.shape[1])
            values, scales_and_zeros = ao.groupwise_affine_quantize_tensor(w32, 4, group, torch.bfloat16)
            back = ao.groupwise_affine_dequantize_tensor(values, scales_and_zeros, 4, group)
            return back.to(torch.bfloat16).float()
        if dtype == "float8":  # dequantized() reads it back as qweight * scale
            tensors = _pack_float8(w32)
        else:
            tensors = pack_weight(w32, dtype, "cpu")
        return dequantized(tensors, dtype, tuple(weight.shape))


def _int4_read_back(tensors: dict[str, torch.Tensor], in_features: int, chunk: int = 1024) -> torch.Tensor:
    """``W`` of an int4 pack, ``chunk`` identity rows at a time (so the identity stays small)."""
    qweight, szs = tensors["qweight"], tensors["scales_and_zeros"]
    group = in_features // szs.shape[0]
    parts = []
    for start in range(0, in_features, chunk):
        n = min(chunk, in_features - start)
        eye = torch.zeros(n, in_features, dtype=torch.bfloat16, device=qweight.device)
        eye[torch.arange(n), torch.arange(start, start + n)] = 1
        parts.append(linear_int4(eye, qweight, szs, group=group).float())
    return torch.cat(parts).t().contiguous()


# ---------------------------------------------------------------- torchao, quietly


def _torchao() -> types.SimpleNamespace:
    """The torchao primitives this module uses, imported on first call (see the module docstring)."""
    with _quiet_torchao_import():
        from torchao.quantization.quant_primitives import (MappingType, _choose_scale_float8,
                                                           _quantize_affine_float8, choose_qparams_affine,
                                                           quantize_affine)
        from torchao.quantization.utils import groupwise_affine_dequantize_tensor, groupwise_affine_quantize_tensor
    return types.SimpleNamespace(
        MappingType=MappingType, choose_qparams_affine=choose_qparams_affine, quantize_affine=quantize_affine,
        groupwise_affine_quantize_tensor=groupwise_affine_quantize_tensor,
        groupwise_affine_dequantize_tensor=groupwise_affine_dequantize_tensor,
        choose_scale_float8=_choose_scale_float8, quantize_affine_float8=_quantize_affine_float8)


class _TorchaoImportNoise(logging.Filter):
    """Demotes the two records importing torchao logs on a torch its CUDA extensions do not fit."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        noise = ((record.name == "torchao" and text.startswith("Failed to load ") and "_C" in text)
                 or (record.name == "torch.utils._pytree" and "is an Enum subclass and is now natively" in text))
        if noise:
            log.debug("importing torchao: %s", text)
        return not noise


@contextlib.contextmanager
def _quiet_torchao_import() -> Iterator[None]:
    """While importing torchao, its ``Failed to load`` and torch's pytree Enum warnings go to debug."""
    loggers = [logging.getLogger("torchao"), logging.getLogger("torch.utils._pytree")]
    noise = _TorchaoImportNoise()
    for logger in loggers:
        logger.addFilter(noise)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(noise)
