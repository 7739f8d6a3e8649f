"""A plan's placement of an ONNX graph → consecutive parts, each its own ONNX model.

In: a :class:`~partitioner.plan.Plan` and the OpGraph of the model it was made for (from
:func:`~partitioner.frontends.onnx.from_onnx`, so ``graph.source`` is its
:class:`~partitioner.frontends.onnx.OnnxSource`). Out: :class:`Part` records in run order, each
with its ``ModelProto``.

Parts. The ops of one device that can run back to back form a part; parts run one after another,
each reading graph inputs and earlier parts' outputs. :func:`split` orders the ops topologically,
staying on the current device while it has a ready op (lowest place in the plan's schedule first),
so a device's ops that do not depend on another device's land in one part, and a placement of
``k`` device changes along its dependency chains gives about ``k + 1`` parts, not one per op.

Each part's model (:func:`part_model`) holds its nodes, in the original model's order, and:

* the initializers they read; an initializer read from two parts is copied into both (only where
  the plan puts its readers on two devices or in two runs of a device); external data is read from
  beside the original file, and written again beside the parts;
* every tensor its nodes hold whose data the original keeps in an external file (a ``Constant``'s
  value, a subgraph's initializer) read in (:mod:`backends.onnx_parts.external`), from the model's
  folder, never the current one: a part runs from bytes or from the parts folder;
* the constants they read that the front end folded (``ConstantOfShape`` / ``Identity`` chains,
  ``Shape`` arithmetic) as the nodes that make them, down to initializers, so onnxruntime folds
  them once when the part's session starts, as it does for the whole model; a ``Shape`` or
  ``Size`` of a tensor the part does not hold becomes an initializer holding its (static) value.
  A part never receives a weight as an input;
* initializers are never listed as graph inputs, and the IR version is at least 4, so onnxruntime
  treats them as constants even when the original model (IR version 3) listed them as inputs;
* its inputs and outputs typed with the shapes the plan was made for, the model's opsets and
  functions.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
from collections.abc import Iterable, Mapping

import onnx
from onnx import numpy_helper

from backends.onnx_parts.external import inlined
from partitioner.errors import OnnxError
from partitioner.frontends.onnx import OnnxSource
from partitioner.frontends.onnx_fold import SKELETON_BYTES
from partitioner.frontends.onnx_load import outer_references
from partitioner.ir import OpGraph

log = logging.getLogger(__name__)

#: the lowest IR version whose initializers are constants without being listed as graph inputs
MIN_IR_VERSION = 4


@dataclasses.dataclass(frozen=True)
class Part:
    """One part of a placed graph: the ops of one device that run back to back."""

    index: int
    device: str                    # the plan's (logical) device
    ops: tuple[str, ...]           # op names, in the order they were grouped
    inputs: tuple[str, ...]        # tensors read from graph inputs or earlier parts
    outputs: tuple[str, ...]       # tensors later parts, or the graph's outputs, need


def split(plan_placement: Mapping[str, str], schedule: Iterable[str], graph: OpGraph) -> list[Part]:
    """Group the placed ops into parts that run one after another (see the module docstring).

    Example:
        >>> [(p.device, len(p.ops)) for p in split(plan.placement, plan.schedule, graph)]   # doctest: +SKIP
        [('cpu', 12), ('cuda:0', 160), ('cpu', 4)]
    """
    rank = {op: k for k, op in enumerate(schedule)}
    rank.update({op: len(rank) + op_.index for op_ in graph.topological_order() if (op := op_.name) not in rank})
    waiting = {n: graph.dag.in_degree(n) for n in graph.ops}
    ready: dict[str, list[tuple[int, str]]] = {}

    def push(op: str) -> None:
        heapq.heappush(ready.setdefault(plan_placement[op], []), (rank[op], op))

    for op, count in waiting.items():
        if count == 0:
            push(op)
    groups: list[tuple[str, list[str]]] = []
    current = None
    while any(ready.values()):
        if not ready.get(current):
            current = min((heap[0][0], d) for d, heap in ready.items() if heap)[1]
            groups.append((current, []))
        _, op = heapq.heappop(ready[current])
        groups[-1][1].append(op)
        for succ in graph.dag.successors(op):
            waiting[succ] -= 1
            if waiting[succ] == 0:
                push(succ)
    return _with_boundaries(groups, graph)


def _with_boundaries(groups: list[tuple[str, list[str]]], graph: OpGraph) -> list[Part]:
    part_of = {op: k for k, (_, ops) in enumerate(groups) for op in ops}
    wanted = set(graph.outputs)
    parts = []
    for k, (device, ops) in enumerate(groups):
        inputs = dict.fromkeys(t for op in ops for t in graph.ops[op].inputs
                               if graph.tensors[t].producer is None or part_of[graph.tensors[t].producer] != k)
        outputs = [t for op in ops for t in graph.ops[op].outputs
                   if t in wanted or any(part_of[c] != k for c in graph.tensors[t].consumers)]
        parts.append(Part(k, device, tuple(ops), tuple(inputs), tuple(outputs)))
    return parts


def part_model(source: OnnxSource, part: Part, name: str) -> onnx.ModelProto:
    """The ONNX model of one part (see the module docstring); external data is read in.

    Raises:
        OnnxError: a tensor the part reads or writes has no type (the front end should have said so).

    Example:
        >>> model = part_model(graph.source, parts[0], "resnet50")   # doctest: +SKIP
        >>> [i.name for i in model.graph.input]
        ['gpu_0/data_0']
    """
    original = source.model
    graph = original.graph
    analysis = source.analysis
    position = {i: k for k, i in enumerate(source.loaded.order)}
    nodes = {i for op in part.ops for i in source.op_nodes[op]}
    producer = {o: i for i in analysis.folded for o in graph.node[i].output if o}
    initializers = {t.name: t for t in graph.initializer}
    sparse = {t.values.name: t for t in graph.sparse_initializer}
    held = set(part.inputs) | {o for i in nodes for o in graph.node[i].output}
    base_dir, where = source.loaded.base_dir, f"part {part.index} ({part.device})"
    made: dict[str, onnx.TensorProto] = {}
    made_sparse: dict[str, onnx.SparseTensorProto] = {}
    pending = [n for i in sorted(nodes) for n in [*graph.node[i].input, *outer_references(graph.node[i])]
               if n and n in analysis.constant]
    while pending:
        name = pending.pop()
        if name in made or name in made_sparse:
            continue
        if name in initializers:
            made[name] = inlined(initializers[name], base_dir, where)
        elif name in sparse:
            made_sparse[name] = inlined(sparse[name], base_dir, where)
        elif name in producer and graph.node[producer[name]].op_type in ("Shape", "Size") \
                and graph.node[producer[name]].input[0] not in held:
            made[name] = numpy_helper.from_array(analysis.values[name], name)  # of a tensor the part does not hold
        elif name in producer:
            i = producer[name]
            if i not in nodes:
                nodes.add(i)
                pending.extend(n for n in [*graph.node[i].input, *outer_references(graph.node[i])]
                               if n and n in analysis.constant)  # a Shape's input is held, not constant
        else:
            raise OnnxError(f"part {part.index}: constant {name!r} has no initializer or producer")
    out = onnx.helper.make_graph(
        nodes=[inlined(graph.node[i], base_dir, where) for i in sorted(nodes, key=position.__getitem__)],
        name=f"{graph.name or name}.part{part.index}",
        inputs=[_value_info(source, t, part) for t in part.inputs],
        outputs=[_value_info(source, t, part) for t in part.outputs],
        initializer=list(made.values()),
        sparse_initializer=list(made_sparse.values()),
    )
    model = onnx.helper.make_model(out, opset_imports=list(original.opset_import),
                                   producer_name="hetpart", doc_string=f"part {part.index} of {name}")
    model.ir_version = max(original.ir_version, MIN_IR_VERSION)
    model.functions.extend(inlined(f, base_dir, where) for f in original.functions)
    if not _infers(model):
        # onnx's (and onnxruntime's) inference can be stricter on a declared shape than the kernel is at
        # run time (a Range reading a [1]-shaped tensor made by an If); the whole model never declared it
        log.info("part %d of %s: inputs declared without shapes (shape inference rejects them)", part.index, name)
        for value in model.graph.input:
            if value.type.HasField("tensor_type"):
                value.type.tensor_type.ClearField("shape")
    return model


def _infers(model: onnx.ModelProto) -> bool:
    """Whether strict shape inference accepts the part (checked on a copy without large initializers)."""
    graph = model.graph
    small = [t for t in graph.initializer if t.ByteSize() <= SKELETON_BYTES]
    large = [onnx.helper.make_tensor_value_info(t.name, t.data_type, t.dims)
             for t in graph.initializer if t.ByteSize() > SKELETON_BYTES]
    skeleton = onnx.helper.make_model(
        onnx.helper.make_graph(graph.node, graph.name, [*graph.input, *large], graph.output, small,
                               sparse_initializer=graph.sparse_initializer),
        opset_imports=model.opset_import)
    skeleton.ir_version = model.ir_version
    skeleton.functions.extend(model.functions)
    try:
        onnx.shape_inference.infer_shapes(skeleton, check_type=True, strict_mode=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        return False
    return True


def _value_info(source: OnnxSource, tensor: str, part: Part) -> onnx.ValueInfoProto:
    t = source.analysis.types.get(tensor)
    if t is None:
        raise OnnxError(f"part {part.index} ({part.device}): tensor {tensor!r} crosses parts but its type is "
                        "unknown: give it as value_info in the model")
    return onnx.helper.make_value_info(tensor, t)


__all__ = ["MIN_IR_VERSION", "Part", "part_model", "split"]
