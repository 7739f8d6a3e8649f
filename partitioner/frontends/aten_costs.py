"""Cost classing and FLOP counting of the aten operators a node dispatches to.

In: one aten call (the ``OpOverload``, its fake-tensor arguments and output), recorded while the
front end runs a node on fake tensors. Out: its :class:`OpClass` and its FLOPs.

FLOPs come from ``torch.utils.flop_counter`` where it has a formula (matmuls, convolutions,
attention: 2·m·n·k for a product). For the ops it does not count, a small table gives FLOPs per
element of the output (per element of the first input for norms, softmax, reductions and pools):

================================  =====  ==============================================
ops                               FLOPs  why
================================  =====  ==============================================
pointwise arithmetic (add, mul…)  1      one operation per element
relu, neg, abs, clamp, where      1      one compare or select
transcendental (exp, tanh, erf…)  4      a short polynomial per element
sigmoid, silu                     4      exp, add, divide (and a multiply)
gelu                              8      erf or tanh approximation plus scaling
layer/group/rms norm              5      mean, variance, subtract, scale, shift
batch norm (inference)            2      scale and shift with running statistics
batch norm (training)             5      as layer norm
softmax, log_softmax              5      max, subtract, exp, sum, divide
reductions, pooling               1      one operation per input element
gathers, copies, views            0      they move data, no arithmetic
================================  =====  ==============================================

Memory-bound ops are costed by the bytes they move, so these counts matter little for time;
they keep FLOP totals honest and hand-checkable.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from partitioner.ir import OpClass

# Priority when a node dispatches to several classes of aten op: the costliest kind names the node.
CLASS_PRIORITY: tuple[OpClass, ...] = (
    OpClass.ATTENTION,
    OpClass.CONV,
    OpClass.MATMUL,
    OpClass.GATHER,
    OpClass.NORM,
    OpClass.SOFTMAX,
    OpClass.POOL,
    OpClass.REDUCTION,
    OpClass.ELEMENTWISE,
    OpClass.OTHER,
    OpClass.DATA_MOVEMENT,
    OpClass.VIEW,
)

_BY_NAME: dict[OpClass, frozenset[str]] = {
    OpClass.MATMUL: frozenset(
        "mm addmm bmm baddbmm matmul linear _scaled_mm addmv mv dot vdot einsum addbmm".split()
    ),
    OpClass.CONV: frozenset(
        "convolution _convolution conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d "
        "mkldnn_convolution cudnn_convolution _slow_conv2d_forward slow_conv3d_forward".split()
    ),
    OpClass.ATTENTION: frozenset(
        "scaled_dot_product_attention _scaled_dot_product_flash_attention _scaled_dot_product_flash_attention_for_cpu "
        "_scaled_dot_product_efficient_attention _scaled_dot_product_cudnn_attention _flash_attention_forward "
        "_efficient_attention_forward _scaled_dot_product_attention_math".split()
    ),
    OpClass.NORM: frozenset(
        "layer_norm native_layer_norm batch_norm native_batch_norm _native_batch_norm_legit "
        "_native_batch_norm_legit_no_training _native_batch_norm_legit_functional group_norm native_group_norm "
        "rms_norm _fused_rms_norm instance_norm".split()
    ),
    OpClass.SOFTMAX: frozenset("softmax _softmax log_softmax _log_softmax _safe_softmax".split()),
    OpClass.POOL: frozenset(
        "max_pool1d max_pool2d max_pool3d max_pool2d_with_indices max_pool3d_with_indices avg_pool1d avg_pool2d "
        "avg_pool3d adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d _adaptive_avg_pool2d "
        "_adaptive_avg_pool3d adaptive_max_pool1d adaptive_max_pool2d adaptive_max_pool3d".split()
    ),
    OpClass.GATHER: frozenset(
        "embedding embedding_bag _embedding_bag _embedding_bag_forward_only index_select gather index take "
        "take_along_dim".split()
    ),
    OpClass.DATA_MOVEMENT: frozenset(
        "cat stack clone copy copy_ _to_copy contiguous constant_pad_nd pad repeat repeat_interleave flip roll "
        "index_put index_put_ scatter scatter_ scatter_add scatter_add_ masked_fill masked_fill_ zeros ones full "
        "empty empty_like zeros_like ones_like full_like arange new_zeros new_ones new_empty new_full tril triu "
        "tril_indices triu_indices fill fill_ zero_ _unsafe_index expand_copy".split()
    ),
    OpClass.VIEW: frozenset(
        "_unsafe_view alias detach lift_fresh lift_fresh_copy sym_size sym_numel sym_stride sym_storage_offset "
        "dropout feature_dropout alpha_dropout _assert_tensor_metadata _assert_scalar".split()
    ),
    OpClass.REDUCTION: frozenset(
        "sum mean amax amin max min argmax argmin prod var std var_mean std_mean norm linalg_vector_norm "
        "logsumexp cumsum cumprod topk sort any all count_nonzero".split()
    ),
}

_TRANSCENDENTAL = frozenset(
    "exp exp2 expm1 log log2 log10 log1p tanh erf erfc sin cos tan asin acos atan sinh cosh rsqrt sqrt "
    "pow reciprocal softplus mish elu selu celu hardswish".split()
)
_SIGMOID_LIKE = frozenset("sigmoid silu logsigmoid".split())
_PER_ELEMENT_OF_INPUT = {OpClass.NORM, OpClass.SOFTMAX, OpClass.REDUCTION, OpClass.POOL}
_NORM_FLOPS = {"batch_norm_inference": 2, "default": 5}


#: grouped matmuls of routed experts (torch's ``_grouped_mm``, transformers' fallback custom op): ``input``
#: ``[S, K]`` rows sorted by expert, ``weight`` ``[E, K, N]``, ``offs`` where each expert's rows end
GROUPED_MM = frozenset({"_grouped_mm", "grouped_mm", "grouped_mm_fallback"})


def is_grouped_mm(func: Any) -> bool:
    """Whether an aten or custom op is a grouped (per-expert) matmul."""
    return op_name(func) in GROUPED_MM


def grouped_mm_flops(args: tuple) -> int:
    """2·S·K·N: every row is multiplied by its own expert's ``[K, N]`` weight once."""
    x, w = args[0], args[1]
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor) or x.dim() != 2 or w.dim() != 3:
        return 0
    return 2 * int(x.shape[0]) * int(w.shape[1]) * int(w.shape[2])


def grouped_weight_share(rows: int, experts: int) -> float:
    """The share of a grouped matmul's expert weights it reads: at most one expert per row
    (a decode step with top-2 routing reads 2 of 8), all of them once the rows outnumber them."""
    return min(experts, max(rows, 0)) / experts if experts > 0 else 1.0


def op_name(func: Any) -> str:
    """``aten.addmm.default`` → ``addmm``: the packet name of an aten overload."""
    packet = getattr(func, "_overloadpacket", None)
    name = getattr(packet, "__name__", None) or getattr(func, "__name__", str(func))
    return name.split(".")[-1]


def classify(func: Any) -> OpClass:
    """The cost class of one aten operator."""
    name = op_name(func)
    for cls, names in _BY_NAME.items():
        if name in names:
            return cls
    if getattr(func, "is_view", False):
        return OpClass.VIEW
    tags = getattr(func, "tags", ())
    if torch.Tag.pointwise in tags:
        return OpClass.ELEMENTWISE
    if torch.Tag.reduction in tags:
        return OpClass.REDUCTION
    return OpClass.OTHER


def dominant_class(classes: list[OpClass]) -> OpClass:
    """The class that names a node which dispatched to ``classes`` (VIEW when it dispatched nothing)."""
    present = set(classes)
    for cls in CLASS_PRIORITY:
        if cls in present:
            return cls
    return OpClass.VIEW


def _numel(value: Any) -> int:
    tensors = [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]
    return sum(t.numel() for t in tensors[:1])


def table_flops(func: Any, cls: OpClass, args: tuple, out: Any) -> int:
    """FLOPs of an op that ``FlopCounterMode`` does not count, from the per-element table above."""
    name = op_name(func)
    if cls in (OpClass.VIEW, OpClass.DATA_MOVEMENT, OpClass.GATHER, OpClass.OTHER):
        return 0
    if cls in _PER_ELEMENT_OF_INPUT:
        n = _numel(args)
        if cls is OpClass.NORM:
            inference = name == "_native_batch_norm_legit_no_training" or (
                name in ("batch_norm", "native_batch_norm") and len(args) > 5 and args[5] is False
            )
            return n * (_NORM_FLOPS["batch_norm_inference"] if inference else _NORM_FLOPS["default"])
        if cls is OpClass.SOFTMAX:
            return 5 * n
        return n
    n = _numel(out)
    if name == "gelu":
        return 8 * n
    if name.rstrip("_") in _SIGMOID_LIKE:
        return 4 * n
    if name.rstrip("_") in _TRANSCENDENTAL:
        return 4 * n
    return n


class FlopTable:
    """FLOPs of one aten call: torch's flop-counter formulas first, the table above for the rest."""

    def __init__(self) -> None:
        registry = dict(FlopCounterMode(display=False).flop_registry)
        aten = torch.ops.aten
        # The CPU flash kernel takes (query, key, value, ...) like the CUDA one, which has a formula.
        flash = registry.get(aten._scaled_dot_product_flash_attention)
        if flash is not None and hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
            registry.setdefault(aten._scaled_dot_product_flash_attention_for_cpu, flash)
        self._registry = registry

    def flops(self, func: Any, cls: OpClass, args: tuple, kwargs: dict, out: Any) -> int:
        if is_grouped_mm(func):
            return grouped_mm_flops(args)
        formula = self._registry.get(getattr(func, "_overloadpacket", None))
        if formula is not None:
            return int(formula(*args, **kwargs, out_val=out))
        return int(table_flops(func, cls, args, out))


def conv_groups(func: Any, args: tuple, kwargs: dict) -> int:
    """The ``groups`` argument of a convolution call (1 when the op has none)."""
    schema = getattr(func, "_schema", None)
    for i, arg in enumerate(schema.arguments if schema is not None else ()):
        if arg.name == "groups":
            value = args[i] if i < len(args) else kwargs.get("groups", arg.default_value)
            return int(value) if isinstance(value, int) and value > 0 else 1
    return 1
