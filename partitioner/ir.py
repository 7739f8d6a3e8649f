"""The graph types of hetpart: Op, Tensor, Param and OpGraph (nothing else defines graph types).

OpClass below is the one op enum: every op, whatever front end captured it, falls in one class,
and the cost model keys its efficiencies by class.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from types import MappingProxyType
from typing import Any, Iterable, Iterator, Mapping

import networkx as nx

from partitioner.errors import GraphError


class OpClass(str, enum.Enum):
    """What an op does, as far as its cost is concerned."""

    MATMUL = "matmul"              # mm, addmm, bmm, linear, matmul, baddbmm
    CONV = "conv"                  # convolution in any dimension
    ATTENTION = "attention"        # scaled dot-product attention kernels
    ELEMENTWISE = "elementwise"    # pointwise unary / binary / ternary ops (add, mul, relu, gelu, ...)
    NORM = "norm"                  # layer_norm, batch_norm, group_norm, rms_norm
    SOFTMAX = "softmax"            # softmax, log_softmax
    REDUCTION = "reduction"        # sum, mean, amax, argmax, ...
    POOL = "pool"                  # max/avg/adaptive pooling
    GATHER = "gather"              # embedding, embedding_bag, index_select, gather, index
    DATA_MOVEMENT = "data_movement"  # cat, stack, clone, contiguous, copy, pad: read + write, no math
    VIEW = "view"                  # views, getitem, reshape of contiguous data: zero cost
    OTHER = "other"                # anything else (costed as memory-bound)


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


#: dtype names used across the IR: torch's names without the "torch." prefix ("float32", "int64", ...).
#: A value that is not a tensor (an int from ``x.size(0)``, a torch.Size) has dtype ``NOT_A_TENSOR``.
NOT_A_TENSOR = "none"


@dataclasses.dataclass(frozen=True)
class Tensor:
    """A value flowing along graph edges.

    ``producer`` is the op that computes it (``None`` for a graph input); ``consumers`` are the ops
    that read it, in program order. ``nbytes`` is what the value occupies when materialised
    (numel × element size; 0 for non-tensor values).
    """

    name: str
    producer: str | None
    consumers: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


@dataclasses.dataclass(frozen=True)
class Param:
    """A parameter or buffer of the model, counted once however many names it has.

    ``name`` is the first qualified name (``named_parameters(remove_duplicate=False)`` order);
    ``aliases`` are the other names of the same storage (tied weights). ``owner`` is the op the
    bytes are attributed to (the first op in program order that reads it); ``users`` are all ops
    that read it. ``trainable`` is False for buffers and parameters with ``requires_grad=False``.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    trainable: bool
    owner: str | None
    users: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Op:
    """One operator of the graph (an fx ``call_*`` node, or an ONNX node).

    Fields:
      name          unique, stable name (the fx node name)
      kind          what runs: ``aten.linear.default``, ``torch.nn.Linear``, ``operator.getitem``, ONNX op type
      op_class      the cost class (:class:`OpClass`)
      index         position in program order (ties in topological order are broken by it)
      module_path   qualified name of the innermost module that issued it (``"layers.0.attn.q_proj"``; ``""`` = top)
      module_type   class name of that module (``"Linear"``)
      dtype         the dtype it computes in (its first floating output, else its first output)
      inputs        names of the activation tensors it reads (graph inputs and other ops' outputs)
      outputs       names of the tensors it produces
      params        names of the parameters and buffers it reads (including ones owned by other ops)
      owned_params  the subset whose bytes are attributed to this op (each parameter is owned once)
      flops         floating-point operations of one forward call
      bytes_read    bytes it actually reads (0 for views; gathered rows, not whole tables, for gathers)
      bytes_written bytes it actually writes
      param_bytes   bytes of ``owned_params``
      trainable_param_bytes  the trainable part of ``param_bytes`` (gradients and optimizer state follow it)
      aten_ops      the aten operators it dispatched to when captured (documentation and cost classing)
      groups        a convolution's groups (1 for every other op): a grouped (depthwise) convolution's
                    backward has its own rate on a CPU (``Device.grouped_backward_flops``)
    """

    name: str
    kind: str
    op_class: OpClass
    index: int
    module_path: str
    module_type: str
    dtype: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    params: tuple[str, ...]
    owned_params: tuple[str, ...]
    flops: int
    bytes_read: int
    bytes_written: int
    param_bytes: int
    trainable_param_bytes: int
    aten_ops: tuple[str, ...] = ()
    groups: int = 1

    @property
    def is_view(self) -> bool:
        """True for zero-cost ops (views, getitem, shape queries)."""
        return self.op_class is OpClass.VIEW


class OpGraph:
    """A captured model: ops and tensors as a networkx DAG, plus the parameters.

    Nodes of :attr:`dag` are op names; an edge ``u -> v`` carries ``tensors`` (the names of the
    tensors ``u`` produces and ``v`` reads) and ``bytes`` (their total size). Graph inputs and
    outputs are tensor names. The graph is immutable once built: stages return new values.

    ``module_types`` maps every module path of the model (``""`` for the root) to its class name,
    in registration order: what a module-level view (accelerate's device map, no-split classes)
    needs. ``source`` holds what the front end captured (an ``fx.GraphModule`` or ``ExportedProgram``) for
    code generation; it is not part of the graph's identity or fingerprint.

    Example:
        >>> g = OpGraph.build("tiny", ops=[...], tensors=[...], params=[...], inputs=("x",), outputs=("relu",))
        >>> [op.name for op in g.topological_order()]
    """

    def __init__(
        self,
        name: str,
        ops: Iterable[Op],
        tensors: Iterable[Tensor],
        params: Iterable[Param],
        inputs: Iterable[str],
        outputs: Iterable[str],
        source: Any = None,
        module_types: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.ops: Mapping[str, Op] = MappingProxyType(_unique("op", ((o.name, o) for o in ops)))
        self.tensors: Mapping[str, Tensor] = MappingProxyType(_unique("tensor", ((t.name, t) for t in tensors)))
        self.params: Mapping[str, Param] = MappingProxyType(_unique("parameter", ((p.name, p) for p in params)))
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.source = source
        self.module_types: Mapping[str, str] = MappingProxyType(dict(module_types or {}))
        self.dag = self._build_dag()
        self._order = tuple(nx.lexicographical_topological_sort(self.dag, key=lambda n: self.ops[n].index))

    # -- construction -------------------------------------------------------------------------

    def _build_dag(self) -> nx.DiGraph:
        dag = nx.DiGraph()
        for op in sorted(self.ops.values(), key=lambda o: o.index):
            dag.add_node(op.name)
        for op in self.ops.values():
            for t in op.inputs:
                tensor = self.tensors.get(t)
                if tensor is None:
                    raise GraphError(f"op {op.name!r} reads tensor {t!r}, which the graph does not define")
                if tensor.producer is None:
                    continue
                if tensor.producer not in self.ops:
                    raise GraphError(f"tensor {t!r} names producer {tensor.producer!r}, which is not an op")
                if dag.has_edge(tensor.producer, op.name):
                    data = dag.edges[tensor.producer, op.name]
                    data["tensors"] = data["tensors"] + (t,)
                    data["bytes"] += tensor.nbytes
                else:
                    dag.add_edge(tensor.producer, op.name, tensors=(t,), bytes=tensor.nbytes)
            for p in op.params:
                if p not in self.params:
                    raise GraphError(f"op {op.name!r} reads parameter {p!r}, which the graph does not define")
        for t in self.inputs + self.outputs:
            if t not in self.tensors:
                raise GraphError(f"graph input/output {t!r} is not a tensor of the graph")
        if not nx.is_directed_acyclic_graph(dag):
            cycle = nx.find_cycle(dag)
            raise GraphError(f"the graph has a cycle through {' -> '.join(u for u, _ in cycle)}: ops must form a DAG")
        return dag

    # -- queries ------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.ops)

    def __iter__(self) -> Iterator[Op]:
        return (self.ops[n] for n in self._order)

    def __repr__(self) -> str:
        return f"OpGraph({self.name!r}, {len(self.ops)} ops, {len(self.params)} params, {self.total_flops():.3g} flops)"

    def op(self, name: str) -> Op:
        """The op called ``name``; a KeyError names the closest ops when it does not exist."""
        try:
            return self.ops[name]
        except KeyError:
            import difflib

            close = difflib.get_close_matches(name, list(self.ops), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise KeyError(f"no op named {name!r} in graph {self.name!r}{hint}") from None

    def topological_order(self) -> tuple[Op, ...]:
        """Ops in a deterministic topological order (ties broken by program order)."""
        return tuple(self.ops[n] for n in self._order)

    def predecessors(self, name: str) -> tuple[str, ...]:
        return tuple(sorted(self.dag.predecessors(name), key=lambda n: self.ops[n].index))

    def successors(self, name: str) -> tuple[str, ...]:
        return tuple(sorted(self.dag.successors(name), key=lambda n: self.ops[n].index))

    def output_shapes(self, name: str) -> tuple[tuple[int, ...], ...]:
        """Shapes of the tensors op ``name`` produces."""
        return tuple(self.tensors[t].shape for t in self.ops[name].outputs)

    def total_flops(self) -> int:
        return sum(op.flops for op in self.ops.values())

    def total_param_bytes(self) -> int:
        """Bytes of all parameters and buffers, shared ones counted once."""
        return sum(p.nbytes for p in self.params.values())

    def trainable_param_bytes(self) -> int:
        return sum(p.nbytes for p in self.params.values() if p.trainable)

    def fingerprint(self) -> str:
        """A hash of the op names, kinds and tensor shapes: equal for the same model and inputs."""
        h = hashlib.sha256()
        for op in self.topological_order():
            shapes = [list(self.tensors[t].shape) for t in op.outputs]
            h.update(json.dumps([op.name, op.kind, shapes, list(op.params)]).encode())
        return h.hexdigest()[:16]


def _unique(what: str, items: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in items:
        if key in out:
            raise GraphError(f"two {what}s are named {key!r}: names must be unique")
        out[key] = value
    return out
