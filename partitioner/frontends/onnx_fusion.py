"""The node chains onnxruntime fuses into one kernel, kept as one op by the ONNX front end.

In: an ONNX graph, the nodes kept as ops (in topological order), the constant tensors and the
graph outputs. Out: :func:`fusion_groups` — ``{head node: (head, epilogue nodes...)}`` for every
node, single nodes as groups of one.

onnxruntime's graph optimisations (basic and extended levels, on both its CPU and CUDA providers)
fold a BatchNormalization or a multiply / add by a constant into the Conv before it (ConvBNFusion,
ConvMulFusion, ConvAddFusion), fuse the activation after a Conv or Gemm into it (FusedConv,
FusedGemm), and a bias Add after a MatMul into a Gemm (MatMulAddFusion). Costing those nodes
separately would charge memory passes that never happen, and placing them on two devices would
undo the fusion (a split ResNet runs a Conv, then a separate BatchNormalization and Relu, each
reading and writing the whole activation). So a chain is one op:

=================  =====================================================================
head               epilogue nodes, in this order, each the only reader of the one before
=================  =====================================================================
Conv               BatchNormalization (inference, constant statistics) / Add / Mul / Sub /
                   Div with a constant operand (any number), then one activation
Gemm               one activation
MatMul             one Add of a constant (the bias)
=================  =====================================================================

Activations: Relu, LeakyRelu, Clip, Sigmoid, Tanh, HardSigmoid. A tensor inside a chain is read
by no other node and is not a graph output, so no part boundary can fall inside one.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import onnx

ACTIVATIONS = frozenset({"Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh", "HardSigmoid"})
AFFINE = frozenset({"BatchNormalization", "Add", "Mul", "Sub", "Div"})


def fusion_groups(graph: onnx.GraphProto, kept: Sequence[int], constant: Collection[str],
                  outputs: Collection[str]) -> dict[int, tuple[int, ...]]:
    """Every kept node's group, keyed by its head, in topological order (see the module docstring).

    Example:
        >>> fusion_groups(resnet.graph, kept, constants, {"prob"})[12]   # doctest: +SKIP
        (12, 13, 14)
    """
    readers: dict[str, list[int]] = {}
    for i in kept:
        for name in graph.node[i].input:
            readers.setdefault(name, []).append(i)
    head_of: dict[int, int] = {}
    groups: dict[int, list[int]] = {}
    producer = {o: i for i in kept for o in graph.node[i].output if o}
    for i in kept:
        node = graph.node[i]
        source = _live_input(node, constant)
        p = producer.get(source) if source is not None else None
        if p is not None and readers.get(source) == [i] and source not in outputs and _default(node):
            head = head_of[p]
            if groups[head][-1] == p and _extends(graph, [graph.node[k] for k in groups[head]], node):
                head_of[i] = head
                groups[head].append(i)
                continue
        head_of[i] = i
        groups[i] = [i]
    return {head: tuple(members) for head, members in groups.items()}


def _default(node: onnx.NodeProto) -> bool:
    return node.domain in ("", "ai.onnx")


def _live_input(node: onnx.NodeProto, constant: Collection[str]) -> str | None:
    """The one non-constant input of ``node``: its first, or either for Add and Mul (None otherwise)."""
    live = [name for name in node.input if name and name not in constant]
    if len(live) != 1 or not (node.input[0] == live[0] or node.op_type in ("Add", "Mul")):
        return None
    return live[0]


def _extends(graph: onnx.GraphProto, chain: list[onnx.NodeProto], node: onnx.NodeProto) -> bool:
    """Whether ``node`` may follow ``chain`` (head first) in one fused kernel."""
    head, kinds = chain[0], [n.op_type for n in chain[1:]]
    if not _default(head) or any(kind in ACTIVATIONS for kind in kinds):
        return False  # an activation ends a chain
    t = node.op_type
    if head.op_type == "Conv":
        if t == "BatchNormalization":
            return len([o for o in node.output if o]) == 1 and not _attr(node, "training_mode")
        return t in AFFINE or t in ACTIVATIONS
    if head.op_type == "Gemm":
        return not kinds and t in ACTIVATIONS
    if head.op_type == "MatMul":
        return not kinds and t == "Add"
    return False


def _attr(node: onnx.NodeProto, name: str) -> int:
    return next((a.i for a in node.attribute if a.name == name), 0)


__all__ = ["ACTIVATIONS", "AFFINE", "fusion_groups"]
