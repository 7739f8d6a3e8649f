"""Shapes, types and constants of an ONNX graph: shape inference iterated with constant folding.

In: a :class:`~partitioner.frontends.onnx_load.LoadedOnnx` (inputs bound to static shapes).
Out: an :class:`Analysis`: the type of every tensor of the top-level graph, which tensors are
constant (initializers, and the outputs of nodes folded away), which nodes are folded, and the
values of the small constants.

onnxruntime folds, once when a session is created, every node whose inputs are all constants, and
every ``Shape``/``Size`` of a tensor whose shape is static. Exported models lean on this: weights
made by ``ConstantOfShape``/``Identity``/``Transpose`` chains (old and "light" models, tied
weights), attention reshapes computed by ``Shape → Gather → Concat`` chains. hetpart folds the same
nodes, so they are neither costed as work repeated every call nor placed as ops; the tensors they
make are weights (parameters) of the ops that read them.

``onnx.shape_inference`` (strict mode, with data propagation) gives the types; it cannot follow a
``Slice`` of a shape, so shapes behind such chains stay unknown. The loop evaluates every folded node
whose outputs are small (at most :data:`VALUE_LIMIT` elements; ``onnx.reference`` runs one node at a
time, ``Shape``/``Size`` are read from the static shapes), adds the values as initializers of a
skeleton of the model (large initializers replaced by typed inputs: inference needs their shapes,
not their bytes) and infers again, until nothing new is learnt. A node keeps its place as an op when
an output of it is a graph output, when it is random, or when it has a subgraph.

Tensors held by top-level nodes (a ``Constant``'s ``value``) in external data files are read into
the skeleton when small (at most :data:`SKELETON_BYTES`), from the model's folder (checked by
:mod:`partitioner.frontends.onnx_external`), so that their values fold; larger ones keep their
reference (inference needs their shape only, and their outputs are too large to evaluate).

Sparse initializers enter the skeleton as typed inputs of their dense shape, and the small ones
(at most :data:`VALUE_LIMIT` elements) as their dense value, so folding reads them as onnxruntime
does once it has densified them.

Every tensor's inferred shape (subgraph bodies' too) passes
:func:`~partitioner.frontends.onnx_load.check_size` after each round (its known dimensions; ``-1``
counts as unknown, as onnxruntime reads it): a negative dimension that overflowed or a size over a
petabyte is an :class:`~partitioner.errors.OnnxError` naming the tensor, its node
and its shape, before anything is evaluated or costed.

A top-level node output without any type after inference (an op with no shape-inference function:
a custom op, an onnxruntime contrib op) is an :class:`~partitioner.errors.OnnxError` naming the
node and op type: the model must then give the output's type as ``value_info``.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import numpy as np
import onnx
from onnx import numpy_helper, shape_inference

from partitioner.errors import OnnxError
from partitioner.frontends.onnx_external import inline_external_data
from partitioner.frontends.onnx_load import LoadedOnnx, check_size, sparse_name

log = logging.getLogger(__name__)

#: a folded tensor with at most this many elements gets its value computed (shape arithmetic, scales)
VALUE_LIMIT = 4096
#: initializers above this many bytes are replaced by typed inputs in the inference skeleton
SKELETON_BYTES = 1 << 16
#: ops that must not be folded: their outputs change from call to call
RANDOM_OPS = frozenset("RandomNormal RandomUniform RandomNormalLike RandomUniformLike Multinomial Bernoulli "
                       "Dropout".split())
#: ops whose output may be far larger than their inputs: evaluated only when inference gives a small shape
GROWING_OPS = frozenset("ConstantOfShape Expand Tile Range Resize Upsample Pad OneHot EyeLike".split())
MAX_ROUNDS = 8


@dataclasses.dataclass(frozen=True)
class Analysis:
    """What the front end and the runner need to know about every tensor of the top-level graph."""

    types: dict[str, onnx.TypeProto]    # tensor name -> inferred type (shapes bound)
    constant: frozenset[str]            # initializers and folded node outputs
    folded: frozenset[int]              # indices of the nodes folded away
    values: dict[str, np.ndarray]       # computed values of small folded tensors (and small initializers)
    strict: bool                        # strict shape inference succeeded
    inferred: onnx.GraphProto           # the last inference's graph: subgraph bodies carry their value_info


def analyse(loaded: LoadedOnnx) -> Analysis:
    """Infer types and fold constants (see the module docstring).

    Example:
        >>> a = analyse(load_onnx("model.onnx"))          # doctest: +SKIP
        >>> a.types["logits"].tensor_type.elem_type
        1
    """
    model = loaded.model
    graph = model.graph
    opsets = {o.domain or "": o.version for o in model.opset_import}
    skeleton, values = _skeleton(model, loaded.constant_initializers)
    _inline_small_node_tensors(skeleton, loaded)
    outputs = {o.name for o in graph.output}
    folded: set[int] = set()
    constant = set(loaded.constant_initializers)
    tried: set[int] = set()
    strict = True
    where = _where(loaded)
    for _ in range(MAX_ROUNDS):
        types, ok, inferred = _infer(skeleton)
        strict &= ok
        _check_sizes(inferred, where)
        learnt = False
        for i in loaded.order:
            node = graph.node[i]
            if i not in folded and _foldable(node, constant, types, outputs):
                folded.add(i)
                constant.update(o for o in node.output if o)
            if i in folded and i not in tried and _evaluable(node, types, values):
                new = _evaluate(skeleton.graph.node[i], types, values, opsets)  # external bytes read in
                if new is not None:
                    tried.add(i)
                    values.update(new)
                    _add_initializers(skeleton, new)
                    learnt = True
        if not learnt:
            break
    _require_types(loaded, types, folded)
    return Analysis(types, frozenset(constant), frozenset(folded), values, strict, inferred)


# --------------------------------------------------------------------------------------------
# Inference on a skeleton of the model
# --------------------------------------------------------------------------------------------


def _skeleton(model: onnx.ModelProto, constant: frozenset[str]) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The model without its large initializers (typed inputs instead), and the small ones' values."""
    skeleton = onnx.ModelProto()
    skeleton.CopyFrom(model)
    graph = skeleton.graph
    keep, values = [], {}
    declared = {i.name for i in graph.input}
    for tensor in graph.initializer:
        external = tensor.data_location == onnx.TensorProto.EXTERNAL
        size = math.prod(tensor.dims) if tensor.dims else 1
        if not external and size <= VALUE_LIMIT:
            keep.append(tensor)
            if tensor.name in constant:
                values[tensor.name] = numpy_helper.to_array(tensor)
            continue
        if external or tensor.ByteSize() > SKELETON_BYTES:
            if tensor.name not in declared:
                graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims))
            continue
        keep.append(tensor)
    for sparse in graph.sparse_initializer:
        name = sparse_name(sparse)
        external = any(t.data_location == onnx.TensorProto.EXTERNAL for t in (sparse.values, sparse.indices))
        if not external and math.prod(sparse.dims) <= VALUE_LIMIT:
            dense = densify(sparse)
            keep.append(numpy_helper.from_array(dense, name))
            if name in constant:
                values[name] = dense
        elif name not in declared:
            graph.input.append(onnx.helper.make_tensor_value_info(name, sparse.values.data_type, sparse.dims))
    del graph.sparse_initializer[:]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    return skeleton, values


def _inline_small_node_tensors(skeleton: onnx.ModelProto, loaded: LoadedOnnx) -> None:
    """Read into the skeleton the external tensors of top-level nodes that hold small ones (a
    ``Constant`` of a shape or a scale), from the model's folder: inference and folding then see
    their values, and nothing reads a location against the current folder."""
    small = {t.node for t in loaded.external if t.node is not None and t.length <= SKELETON_BYTES}
    large = {t.node for t in loaded.external if t.node is not None and t.length > SKELETON_BYTES}
    for i in sorted(small - large):
        node = skeleton.graph.node[i]
        if not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            node.CopyFrom(inline_external_data(node, loaded.base_dir))


def densify(sparse: onnx.SparseTensorProto) -> np.ndarray:
    """The dense value of a sparse tensor (COO indices: linear ``[NNZ]`` or ``[NNZ, rank]``).

    Example:
        >>> values = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "w")
        >>> indices = numpy_helper.from_array(np.array([1, 6], np.int64), "w_idx")
        >>> densify(onnx.helper.make_sparse_tensor(values, indices, [2, 4])).tolist()
        [[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 2.0, 0.0]]
    """
    values = numpy_helper.to_array(sparse.values).reshape(-1)
    indices = numpy_helper.to_array(sparse.indices).astype(np.int64)
    dims = tuple(int(d) for d in sparse.dims)
    dense = np.zeros(math.prod(dims), dtype=values.dtype)
    bound = np.array(dims if indices.ndim == 2 else [dense.size], np.int64)
    if indices.size and (indices.min() < 0 or (indices.reshape(-1, len(bound)) >= bound).any()):
        raise OnnxError(f"sparse tensor {sparse.values.name!r} ({'x'.join(map(str, dims))}) has an index out of "
                        "range: export the model again")
    if indices.ndim == 2:
        indices = np.ravel_multi_index(tuple(indices.T), dims) if indices.size else indices.reshape(-1)
    dense[indices.reshape(-1)] = values
    return dense.reshape(dims)


def _infer(skeleton: onnx.ModelProto) -> tuple[dict[str, onnx.TypeProto], bool, onnx.GraphProto]:
    """Types of every top-level tensor; strict mode first, then the lenient one."""
    strict = True
    try:
        inferred = shape_inference.infer_shapes(skeleton, check_type=True, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        log.warning("strict shape inference failed (%s); using the lenient mode", str(exc).splitlines()[0][:200])
        strict = False
        inferred = shape_inference.infer_shapes(skeleton, check_type=False, strict_mode=False, data_prop=True)
    g = inferred.graph
    types: dict[str, onnx.TypeProto] = {}
    for v in [*g.input, *g.value_info, *g.output]:
        if v.type.WhichOneof("value") is not None:
            types.setdefault(v.name, v.type)
    for t in g.initializer:
        types.setdefault(t.name, onnx.helper.make_tensor_type_proto(t.data_type, t.dims))
    return types, strict, g


def _add_initializers(skeleton: onnx.ModelProto, values: dict[str, np.ndarray]) -> None:
    for name, value in values.items():
        skeleton.graph.initializer.append(numpy_helper.from_array(value, name))


# --------------------------------------------------------------------------------------------
# Folding
# --------------------------------------------------------------------------------------------


def static_shape(t: onnx.TypeProto | None) -> tuple[int, ...] | None:
    """The shape of a tensor type when every dimension is known, else None.

    Example:
        >>> static_shape(onnx.helper.make_tensor_type_proto(1, [2, 3]))
        (2, 3)
    """
    if t is None or t.WhichOneof("value") != "tensor_type" or not t.tensor_type.HasField("shape"):
        return None
    dims = t.tensor_type.shape.dim
    if any(not d.HasField("dim_value") for d in dims):
        return None
    return tuple(int(d.dim_value) for d in dims)


def _foldable(node: onnx.NodeProto, constant: set[str], types: dict[str, onnx.TypeProto], outputs: set[str]) -> bool:
    if any(o in outputs for o in node.output) or node.op_type in RANDOM_OPS:
        return False
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        return False
    if any(types.get(o) is not None and types[o].WhichOneof("value") != "tensor_type" for o in node.output if o):
        return False  # sequences, optionals and maps stay values computed at run time
    if node.op_type in ("Shape", "Size") and node.domain in ("", "ai.onnx"):
        return static_shape(types.get(node.input[0])) is not None
    return all(not name or name in constant for name in node.input)


def _evaluable(node: onnx.NodeProto, types: dict[str, onnx.TypeProto], values: dict[str, np.ndarray]) -> bool:
    """Whether a folded node's outputs are surely small and its inputs' values are known."""
    if node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type in ("Shape", "Size"):
        return True
    if not all(not name or name in values for name in node.input):
        return False
    if sum(values[n].size for n in node.input if n) > 16 * VALUE_LIMIT:
        return False  # a pool or reduction of a large constant: onnx.reference is slow, onnxruntime folds it
    shapes = [static_shape(types.get(out)) for out in node.output if out]
    if all(s is not None for s in shapes):
        return all(math.prod(s) <= VALUE_LIMIT for s in shapes)
    # shape inference could not say (a Slice of a shape): ops that do not grow their inputs are safe
    return node.op_type not in GROWING_OPS and sum(values[n].size for n in node.input if n) <= VALUE_LIMIT


def _evaluate(node: onnx.NodeProto, types: dict[str, onnx.TypeProto], values: dict[str, np.ndarray],
              opsets: dict[str, int]) -> dict[str, np.ndarray] | None:
    """The values of one folded node's outputs (None when onnx's reference evaluator cannot run it)."""
    if node.op_type in ("Shape", "Size"):
        shape = np.array(static_shape(types[node.input[0]]), dtype=np.int64)
        if node.op_type == "Size":  # a Python product: the shape passed check_size, it fits in int64
            return {node.output[0]: np.array(math.prod(static_shape(types[node.input[0]])), dtype=np.int64)}
        attrs = {a.name: a.i for a in node.attribute}
        start, end = attrs.get("start", 0), attrs.get("end", len(shape))
        return {node.output[0]: shape[start:end] if "end" in attrs else shape[start:]}
    sparse = next((a.sparse_tensor for a in node.attribute if a.name == "sparse_value"), None)
    if node.op_type == "Constant" and sparse is not None:  # onnx's evaluator returns it sparse
        return {node.output[0]: densify(sparse)}
    from onnx.reference import ReferenceEvaluator

    feeds = {name: values[name] for name in node.input if name}
    try:
        results = ReferenceEvaluator(node, opsets=opsets).run(None, feeds)
    except Exception as exc:  # the reference evaluator raises many types; the node is then kept unevaluated
        log.debug("cannot evaluate folded node %s (%s): %s", node.name, node.op_type, exc)
        return None
    out = {name: np.asarray(value) for name, value in zip(node.output, results) if name}
    return out if all(v.size <= VALUE_LIMIT for v in out.values()) else None


def _where(loaded: LoadedOnnx) -> str:
    return str(loaded.path) if loaded.path is not None else f"model {loaded.name!r}"


def _check_sizes(graph: onnx.GraphProto, where: str) -> None:
    """Every static (or partly static) shape inference gave, in ``graph`` and its bodies, is a sane size."""
    producer = {o: n for n in graph.node for o in n.output if o}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        if value.type.WhichOneof("value") != "tensor_type" or not value.type.tensor_type.HasField("shape"):
            continue
        # -1 is how some exporters write an unknown dimension (onnxruntime reads it so): skipped
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim if d.HasField("dim_value") and d.dim_value != -1]
        node = producer.get(value.name)
        made = f" (made by node {node.name or node.op_type!r}, {node.op_type})" if node is not None else ""
        check_size(f"tensor {value.name!r}{made}", dims, value.type.tensor_type.elem_type, where,
                   "give the input shapes the model is run with (a smaller batch or "
                   "sequence length), or fix the shapes the model computes")
    for node in graph.node:
        for attr in node.attribute:
            for body in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                _check_sizes(body, where)


def _require_types(loaded: LoadedOnnx, types: dict[str, onnx.TypeProto], folded: set[int]) -> None:
    """Every output of a node kept as an op needs at least a type (the parts' inputs and outputs do)."""
    graph = loaded.model.graph
    opsets = {o.domain or "": o.version for o in loaded.model.opset_import}
    where = _where(loaded)
    for i in loaded.order:
        node = graph.node[i]
        missing = [o for o in node.output if o and o not in types]
        if missing and i not in folded:
            domain = node.domain or ""
            raise OnnxError(
                f"{where}: node {node.name or f'#{i}'!r} ({node.op_type}, domain {domain!r} opset "
                f"{opsets.get(domain, '?')}) has no shape inference in onnx, so the type of its output "
                f"{missing[0]!r} is unknown: give its outputs' types as value_info in the model "
                "(onnx.helper.make_tensor_value_info), or replace the op")


__all__ = ["Analysis", "VALUE_LIMIT", "analyse", "densify", "static_shape"]
