"""Cost classing and FLOP counting of ONNX operators (the ONNX front end's table).

In: one ONNX node's op type (and domain), attributes, and the static shapes of its inputs and
outputs (``None`` where shape inference left a dimension unknown). Out: its
:class:`~partitioner.ir.OpClass` and its FLOPs for one call (:func:`node_cost`).

FLOPs (a multiply-add counts 2):

===================================  ===========================================================
op types                             FLOPs
===================================  ===========================================================
MatMul, FusedMatMul, MatMulInteger   2 · batch · m · n · k (numpy broadcasting over the batch)
Gemm, FusedGemm                      2 · m · n · k, plus m · n for the ``C`` term
Einsum                               2 · (product of every index's extent)
Conv, FusedConv, ConvInteger         2 · N · C_out · spatial_out · (C_in / group) · kernel
ConvTranspose                        2 · N · C_in · spatial_in · (C_out / group) · kernel
Attention (opset 23, com.microsoft)  4 · batch · heads · q_len · kv_len · head_dim (+ projections
                                     for com.microsoft ``Attention``: 2 · tokens · hidden · 3·hidden)
elementwise, activations             1 per output element; 4 for transcendental ones (Exp, Tanh,
                                     Sigmoid, Erf, ...), 8 for Gelu
LayerNorm, GroupNorm, RMSNorm, ...   5 per input element; BatchNormalization 2 (inference)
Softmax, LogSoftmax                  5 per input element
Reduce*, ArgMax, CumSum, TopK        1 per input element
MaxPool, AveragePool, LpPool         kernel elements per output element; global pools 1 per input
Gather*, Reshape, Transpose, Concat  0 (they move data: costed by bytes)
===================================  ===========================================================

A MatMul of two activations that feeds a Softmax, or reads one (the ``Q·Kᵀ`` and ``P·V`` of an
attention written as plain MatMuls), is classed :attr:`~partitioner.ir.OpClass.ATTENTION` by the
front end (:func:`partitioner.frontends.onnx.attention_matmuls`), so devices refuse or favour it as they do fused attention.

Operators without an entry are :attr:`~partitioner.ir.OpClass.OTHER` with 0 FLOPs: the cost model
then charges the bytes they move at the device's memory bandwidth (the documented fallback), and
the front end lists their types (:attr:`OnnxSource.fallback_ops`). If / Loop / Scan are OTHER too,
costed by their bodies (a Loop's body times its trip count when that is a constant, else once; a
Scan's body times the scanned length; an If's costlier branch), so that accelerators whose
``supported_ops`` lack ``other`` refuse control flow.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from partitioner.ir import OpClass

Shape = tuple[int, ...] | None  # None: rank or a dimension unknown


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


#: op type -> class, for the default ONNX domain and onnxruntime's ``com.microsoft`` contrib ops.
CLASSES: dict[OpClass, frozenset[str]] = {
    OpClass.MATMUL: _names("MatMul Gemm MatMulInteger QLinearMatMul FusedMatMul FusedGemm MatMulNBits "
                           "MatMulIntegerToFloat Einsum"),
    OpClass.CONV: _names("Conv ConvTranspose ConvInteger QLinearConv DeformConv FusedConv NhwcConv"),
    OpClass.ATTENTION: _names("Attention MultiHeadAttention GroupQueryAttention PackedAttention "
                              "SparseAttention"),
    OpClass.NORM: _names("BatchNormalization LayerNormalization InstanceNormalization GroupNormalization "
                         "RMSNormalization LpNormalization MeanVarianceNormalization LRN SkipLayerNormalization "
                         "SimplifiedLayerNormalization SkipSimplifiedLayerNormalization EmbedLayerNormalization"),
    OpClass.SOFTMAX: _names("Softmax LogSoftmax Hardmax"),
    OpClass.REDUCTION: _names("ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 "
                              "ReduceLogSum ReduceLogSumExp ReduceSumSquare ArgMax ArgMin CumSum CumProd TopK"),
    OpClass.POOL: _names("MaxPool AveragePool GlobalAveragePool GlobalMaxPool LpPool GlobalLpPool MaxRoiPool "
                         "RoiAlign MaxUnpool QLinearAveragePool QLinearGlobalAveragePool"),
    OpClass.GATHER: _names("Gather GatherElements GatherND"),
    OpClass.ELEMENTWISE: _names(
        "Add Sub Mul Div Pow Mod Neg Abs Sign Ceil Floor Round Reciprocal Sqrt Relu LeakyRelu PRelu ThresholdedRelu "
        "Clip Max Min Mean Sum Where Equal Less Greater LessOrEqual GreaterOrEqual And Or Xor Not IsNaN IsInf "
        "BitShift BitwiseAnd BitwiseOr BitwiseXor BitwiseNot Cast CastLike QuantizeLinear DequantizeLinear "
        "DynamicQuantizeLinear Shrink HardSigmoid HardSwish Softsign Elu Selu Celu BiasAdd BiasGelu QuickGelu "
        "Exp Log Tanh Sigmoid Erf Sin Cos Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh Softplus Mish Gelu "
        "FastGelu QLinearAdd QLinearMul QLinearSigmoid QLinearLeakyRelu Swish"),
    OpClass.DATA_MOVEMENT: _names(
        "Concat Split Slice Pad Tile Expand Transpose DepthToSpace SpaceToDepth Resize Upsample ScatterND "
        "ScatterElements Scatter Trilu ReverseSequence Compress OneHot Range ConstantOfShape EyeLike Col2Im "
        "CenterCropPad GridSample ImageDecoder NonZero Unique QLinearConcat"),
    OpClass.VIEW: _names("Reshape Squeeze Unsqueeze Flatten Identity Shape Size Dropout Constant "
                         "Optional OptionalGetElement OptionalHasElement"),
}
_CLASS_OF: dict[str, OpClass] = {op: cls for cls, ops in CLASSES.items() for op in ops}

#: elementwise ops costing 4 FLOPs per element (a short polynomial or an exp), and Gelu's 8
TRANSCENDENTAL = _names("Exp Log Tanh Sigmoid Erf Sin Cos Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh "
                        "Softplus Mish Elu Selu Celu HardSwish Swish QuickGelu Pow Sqrt Reciprocal")
GELU = _names("Gelu FastGelu BiasGelu")
#: ops with subgraphs: one op each, costed by their body
CONTROL_FLOW = _names("If Loop Scan")


@dataclasses.dataclass(frozen=True)
class NodeShapes:
    """What costing one node needs: its type, attributes, and the shapes around it."""

    op_type: str
    domain: str
    attrs: Mapping[str, object]        # attribute name -> python value (ints, floats, lists)
    inputs: Sequence[Shape]            # one per input ("" inputs: None)
    outputs: Sequence[Shape]


def op_class(op_type: str, domain: str = "") -> OpClass:
    """The cost class of an ONNX op type (``OTHER`` for types without an entry and control flow).

    Example:
        >>> op_class("Conv"), op_class("Reshape"), op_class("MyCustomOp", "my.domain")
        (<OpClass.CONV: 'conv'>, <OpClass.VIEW: 'view'>, <OpClass.OTHER: 'other'>)
    """
    if domain not in ("", "ai.onnx", "com.microsoft"):
        return OpClass.OTHER
    return _CLASS_OF.get(op_type, OpClass.OTHER)


def has_entry(op_type: str, domain: str = "") -> bool:
    """Whether the table knows ``op_type`` (control flow counts as known: its body is costed)."""
    return op_type in CONTROL_FLOW or op_class(op_type, domain) is not OpClass.OTHER


def numel(shape: Shape) -> int:
    """Elements of a static shape (0 when it is unknown)."""
    return math.prod(shape) if shape is not None else 0


def node_flops(node: NodeShapes, cls: OpClass) -> int:
    """FLOPs of one call of ``node`` (see the module docstring); 0 when shapes are unknown.

    Example:
        >>> node_flops(NodeShapes("MatMul", "", {}, [(2, 8, 16), (16, 4)], [(2, 8, 4)]), OpClass.MATMUL)
        2048
    """
    t = node.op_type
    cls = op_class(t, node.domain) if cls is OpClass.ATTENTION and t == "MatMul" else cls  # a Q·Kᵀ is a product
    out = numel(node.outputs[0]) if node.outputs else 0
    first = numel(node.inputs[0]) if node.inputs else 0
    if t in ("Gemm", "FusedGemm"):
        return _gemm(node)
    if t == "Einsum":
        return _einsum(node)
    if cls is OpClass.MATMUL:
        return _matmul(node)
    if cls is OpClass.CONV:
        return _conv(node)
    if cls is OpClass.ATTENTION:
        return _attention(node)
    if cls is OpClass.NORM:
        return first * (2 if t == "BatchNormalization" and not node.attrs.get("training_mode") else 5)
    if cls is OpClass.SOFTMAX:
        return 5 * first
    if cls is OpClass.REDUCTION:
        return first
    if cls is OpClass.POOL:
        if t.startswith("Global"):
            return first
        kernel = node.attrs.get("kernel_shape")
        return out * (math.prod(kernel) if isinstance(kernel, (list, tuple)) else 1)
    if cls is OpClass.ELEMENTWISE:
        if t in GELU:
            return 8 * out
        return (4 if t in TRANSCENDENTAL else 1) * out
    return 0


def _matmul(node: NodeShapes) -> int:
    a, b = (node.inputs + [None, None])[:2]
    out = node.outputs[0] if node.outputs else None
    if a is None or b is None or out is None or not a or not b:
        return 0
    k = a[-1]
    return 2 * numel(out) * k


def _gemm(node: NodeShapes) -> int:
    a, b = (list(node.inputs) + [None, None])[:2]
    if a is None or b is None or len(a) != 2:
        return 0
    k = a[0] if node.attrs.get("transA") else a[1]
    m, n = node.outputs[0] if node.outputs and node.outputs[0] is not None and len(node.outputs[0]) == 2 else (0, 0)
    bias = m * n if len(node.inputs) > 2 and node.inputs[2] is not None else 0
    return 2 * m * n * k + bias


def _einsum(node: NodeShapes) -> int:
    equation = str(node.attrs.get("equation", "")).replace(" ", "")
    lhs = equation.split("->")[0].split(",")
    extent: dict[str, int] = {}
    for term, shape in zip(lhs, node.inputs):
        if shape is None or "..." in term or len(term) != len(shape):
            return 0
        extent.update(zip(term, shape))
    return 2 * math.prod(extent.values()) if extent else 0


def _conv(node: NodeShapes) -> int:
    x, w = (list(node.inputs) + [None, None])[:2]
    out = node.outputs[0] if node.outputs else None
    if x is None or w is None or out is None or len(w) < 3:
        return 0
    group = int(node.attrs.get("group", 1) or 1)
    kernel = math.prod(w[2:])
    if node.op_type == "ConvTranspose":  # weight (C_in, C_out/group, k...): every input pixel scatters
        return 2 * numel(x) * w[1] * kernel
    return 2 * numel(out) * (x[1] // group if len(x) > 1 else 1) * kernel


def _attention(node: NodeShapes) -> int:
    q = node.inputs[0] if node.inputs else None
    out = node.outputs[0] if node.outputs else None
    if q is None or out is None:
        return 0
    if node.domain == "com.microsoft" and node.op_type == "Attention" and len(q) == 3 and len(node.inputs) > 1:
        w = node.inputs[1]
        batch, seq, hidden = q
        proj = 2 * batch * seq * hidden * (w[1] if w is not None and len(w) == 2 else 3 * hidden)
        return proj + 4 * batch * seq * seq * hidden
    k = node.inputs[1] if len(node.inputs) > 1 else None
    kv_len = k[-2] if k is not None and len(k) == 4 else (k[1] if k is not None and len(k) == 3 else 0)
    # Q (batch, heads, q_len, head_dim) or (batch, q_len, hidden): scores and weighted sum, 2 · 2 · ...
    return 4 * numel(q) * kv_len


__all__ = ["CLASSES", "CONTROL_FLOW", "NodeShapes", "has_entry", "node_flops", "numel", "op_class"]
