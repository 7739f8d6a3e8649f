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
                   Div with a constant operand (any number), then one residual Add or
                   two-input Sum (two computed inputs of the output's shape: the CPU
                   provider's NCHWc convolution adds it as its "Sum"), then one activation
Gemm               one activation
MatMul             one Add of a constant (the bias)
=================  =====================================================================

Activations: Relu, LeakyRelu, Clip, Sigmoid, Tanh, HardSigmoid. A residual Add joins the chain of
the first of its inputs that ends a Conv chain read by the Add alone (as onnxruntime picks it); the
other input is read by the fused kernel. Without the Add in the chain, a plan may put a ResNet
block's Add and Relu on another device than its Conv, and the part holding the Conv writes its
output for them: one more pass over the activation each, and a layout conversion.

A tensor inside a chain is read by no other node and is not a graph output, so no part boundary
can fall inside one.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import onnx

ACTIVATIONS = frozenset({"Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh", "HardSigmoid"})
AFFINE = frozenset({"BatchNormalization", "Add", "Mul", "Sub", "Div"})


def fusion_groups(graph: onnx.GraphProto, kept: Sequence[int], constant: Collection[str],
                  outputs: Collection[str], shapes: Mapping[str, tuple[int, ...] | None] | None = None,
                  ) -> dict[int, tuple[int, ...]]:
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
        if source is None and shapes is not None:
            source = _summed_input(graph, i, constant, shapes, producer, head_of, groups, readers)
        p = producer.get(source) if source is not None else None
        if p is not None and readers.get(source) == [i] and source not in outputs and _default(node):
            head = head_of[p]
            if groups[head][-1] == p and _extends([graph.node[k] for k in groups[head]], node, constant):
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


def _summed_input(graph: onnx.GraphProto, i: int, constant: Collection[str],
                  shapes: Mapping[str, tuple[int, ...] | None], producer: Mapping[str, int],
                  head_of: Mapping[int, int], groups: Mapping[int, list[int]],
                  readers: Mapping[str, list[int]]) -> str | None:
    """The input of a residual ``Add`` (node ``i``: two live inputs of its own shape) that a Conv
    chain takes as its sum: the first one made by the last node of a Conv chain without a sum or
    an activation yet, and read by this Add alone (None when there is none)."""
    node = graph.node[i]
    if not _default(node) or not _is_sum(node, constant):
        return None
    out = shapes.get(node.output[0])
    if out is None or any(shapes.get(name) != out for name in node.input):
        return None  # a broadcast: not a sum the convolution can take
    for name in node.input:
        p = producer.get(name)
        if p is None or readers.get(name) != [i]:
            continue
        chain = groups.get(head_of.get(p, -1), [])
        if chain and chain[-1] == p and graph.node[chain[0]].op_type == "Conv" and not any(
                graph.node[k].op_type in ACTIVATIONS or _is_sum(graph.node[k], constant) for k in chain[1:]):
            return name
    return None


def _is_sum(node: onnx.NodeProto, constant: Collection[str]) -> bool:
    """An ``Add`` (or a two-input ``Sum``, as old models write it) of two computed tensors: a
    residual connection, not the addition of a constant."""
    live = [name for name in node.input if name and name not in constant]
    return node.op_type in ("Add", "Sum") and len(node.input) == 2 and len(live) == 2


def _extends(chain: list[onnx.NodeProto], node: onnx.NodeProto, constant: Collection[str]) -> bool:
    """Whether ``node`` may follow ``chain`` (head first) in one fused kernel."""
    head, kinds = chain[0], [n.op_type for n in chain[1:]]
    if not _default(head) or any(kind in ACTIVATIONS for kind in kinds):
        return False  # an activation ends a chain
    t = node.op_type
    if head.op_type == "Conv":
        if any(_is_sum(n, constant) for n in chain[1:]):
            return t in ACTIVATIONS  # after the residual sum only the activation: a constant can no
            #                          longer be folded into the convolution's weights and bias
        if t == "Sum":
            return _is_sum(node, constant)
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
