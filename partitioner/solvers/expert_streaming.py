"""Time splits by expert: a fused experts op computed on an accelerator, its experts streamed group by group.

In: an op of the original graph that multiplies routed rows by a fused stack of expert weights (a
grouped matmul: torch's ``aten._grouped_mm``, or transformers' ``transformers.grouped_mm_fallback``
custom op that ``torch.export`` captures in float32), the problem's devices and cost model, and the
chunk counts offered (``SplitOptions.chunks``). Out: the :class:`ExpertTimeSplit` choices the op may
take (:func:`expert_split_choices`) and each one's :class:`~partitioner.solvers.splits.SplitPrice`,
read by :func:`~partitioner.solvers.problem.evaluate`, the ILP, the bounds and the oracle like any
split's; and :func:`fold_expert_weights`, the grouping that puts each such op and the view owning
its weight in one node (the captured form below), which every problem offering these splits is
built on.

The captured form (transformers 5, ``experts_implementation="grouped_mm"``, the default): a Mixtral
layer's experts are two grouped matmuls ``y = op(x, W, offs)`` with ``x`` ``[S, K]`` the routed rows
(``S = tokens * top_k``) sorted by expert, ``offs`` ``[E]`` (int32) where each expert's rows end,
and ``W`` ``[E, K, N]`` an ``aten.transpose`` view of the fused parameter (``gate_up_proj``
``[E, 2I, H]``, ``down_proj`` ``[E, H, I]``); the view is the parameter's first reader, so it owns
it, and it has no tensor input. A split of the op therefore needs the view in its node.

A time split by expert is a time split (``axis: time``, :mod:`partitioner.solvers.chunked_streaming`)
whose chunks are groups of whole experts instead of weight rows. With ``devices = (home, host)``
and ``chunks = n``:

* chunk ``i`` is experts ``[e_i, e_{i+1})`` of ``W`` (``n`` near-equal groups, the larger first,
  :func:`~partitioner.solvers.chunked_streaming.chunk_sizes`); ``home`` computes the rows routed to
  them, ``x[offs[e_i - 1]:offs[e_{i+1} - 1]]``, from the chunk copied in, and ``y`` is the rows'
  concatenation in order (the experts' rows are contiguous: ``x`` is sorted by expert);
* routing is unknown when planning: each chunk is priced with the **uniform routing assumption**,
  ``S / E`` rows per expert (``tokens * top_k / num_experts``), so chunk ``i``'s compute is the op's
  time scaled to its experts' share of the flops, of ``x`` and of ``y``, reading the experts its
  rows can touch (at most one per row, :func:`~partitioner.frontends.aten_costs.grouped_weight_share`);
  every expert's weights are copied whatever the routing (a step's routing is known only on the
  device, after the router ran);
* memory, copies and time as for a time split of a linear: the host holds ``W``; ``home`` the
  op's other tensors and its working set ``x + offs + 2 y`` (never the view of ``W``, which only the
  whole op reads: the ILP counts the node's whole working set only while it is whole) plus
  :data:`~partitioner.solvers.chunked_streaming.SLOTS` chunk buffers of the largest chunk; each chunk
  one pinned ``"split"`` copy host -> home; the op takes ``K_n`` of the two-stage flow-shop
  recursion (:func:`~partitioner.solvers.chunked_streaming.pipeline_s`), equal chunks giving
  ``c + k + (n - 1) max(c, k)``.

Chunk counts offered: ``SplitOptions.chunks`` up to the number of experts, on every accelerator the
op may run on, when ``time`` is among the split axes; a pinned op keeps its pin.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from partitioner.coarsen import CoarsenOptions, Coarsening, coarsen
from partitioner.errors import HetpartError
from partitioner.frontends.aten_costs import GROUPED_MM, grouped_weight_share
from partitioner.solvers.chunked_streaming import AXIS, SLOTS, TimeSplit, chunk_sizes, pipeline_s
from partitioner.solvers.splits import SplitPrice

__all__ = ["BY", "ExpertTimeSplit", "cuts_experts", "entry_cuts_experts", "expert_split_choices", "experts_weight",
           "fold_expert_weights", "is_experts_op", "node_experts", "price_expert_split", "weight_views"]

#: The ``by`` word of a time split whose chunks are groups of experts (a linear's are rows).
BY = "expert"


@dataclasses.dataclass(frozen=True)
class ExpertTimeSplit(TimeSplit):
    """A fused experts op computed on ``devices[0]`` (home) from ``chunks`` groups of experts held on
    ``devices[1]`` (the host) and streamed in one after another: a :class:`TimeSplit` whose chunks
    are groups of whole experts (``by``), priced by :func:`price_expert_split`."""

    by: str = BY

    def __post_init__(self) -> None:
        if self.axis != AXIS or self.by != BY:
            raise HetpartError(f"a time split by expert has axis {AXIS!r} and by {BY!r}, not {self.axis!r} and "
                               f"{self.by!r}")
        if self.chunks < 2:
            raise HetpartError(f"a time split by expert streams its experts in at least 2 groups, not {self.chunks}")

    @property
    def host(self) -> str:
        return self.devices[1]

    @property
    def label(self) -> str:
        """``time[cuda:0<-cpu,4,by=expert]``: the split in one word (row and column names use it)."""
        return f"{AXIS}[{self.home}<-{self.host},{self.chunks},by={BY}]"

    def to_dict(self) -> dict[str, Any]:
        return {"axis": AXIS, "by": BY, "devices": list(self.devices), "chunks": self.chunks}


def is_experts_op(op: Any) -> bool:
    """Whether ``op`` is a grouped matmul (``aten._grouped_mm`` or ``transformers.grouped_mm_fallback``)."""
    parts = op.kind.split(".")
    return len(parts) >= 2 and parts[1] in GROUPED_MM


def experts_weight(graph: Any, op: Any) -> tuple[str, str] | None:
    """``(view op, parameter)`` of ``op``'s fused expert weight, or None: ``op`` is a grouped matmul
    whose second input is the output of a view op with no tensor input, owning one 3-D parameter
    that nothing else reads, and read by ``op`` alone (the captured form in the module docstring)."""
    if not is_experts_op(op) or len(op.inputs) < 3:
        return None
    tensor = graph.tensors[op.inputs[1]]
    view = graph.ops.get(tensor.producer) if tensor.producer else None
    if view is None or not view.is_view or view.inputs or tuple(tensor.consumers) != (op.name,):
        return None
    owned = [p for p in view.owned_params if p in graph.params]
    if len(owned) != 1:
        return None
    param = graph.params[owned[0]]
    if len(param.shape) != 3 or tuple(param.users) != (view.name,) or len(tensor.shape) != 3:
        return None
    return view.name, param.name


def cuts_experts(split: Any) -> bool:
    """Whether ``split`` (a split choice) cuts a fused experts op: a time split by expert, or an experts split
    (:mod:`partitioner.solvers.expert_devices`)."""
    return getattr(split, "by", None) == BY or split.axis == "experts"


def entry_cuts_experts(entry: Any) -> bool:
    """Whether a plan's ``splits`` entry cuts a fused experts op (``by: expert``, or axis ``experts``)."""
    return entry.get("by") == BY or entry.get("axis") == "experts"


def weight_views(graph: Any) -> dict[str, str]:
    """Every grouped matmul of ``graph`` that can take a time split by expert -> the view owning its weight."""
    out = {}
    for op in graph.ops.values():
        found = experts_weight(graph, op)
        if found is not None:
            out[op.name] = found[0]
    return out


def fold_expert_weights(graph: Any) -> Coarsening | None:
    """``graph`` with each experts op and its weight's view in one group (named after the view, the
    first in program order), every other op alone; None when ``graph`` has no experts op to fold.

    Example:
        >>> c = fold_expert_weights(graph)                               # doctest: +SKIP
        >>> c.members["transpose_4"]
        ('transpose_4', 'grouped_mm_fallback')
    """
    views = weight_views(graph)
    if not views:
        return None
    folded = set(views) | set(views.values())
    keep = frozenset(n for n in graph.ops if n not in folded)
    return coarsen(graph, CoarsenOptions(fold_views=True, merge_chains=False, keep_separate=keep))


def node_experts(problem: Any, node: str) -> tuple[Any, Any] | None:
    """``(experts op, its weight parameter)`` when ``node`` is exactly one experts op and its weight's view."""
    g = problem.original
    ops = [g.ops[m] for m in problem.members[node]]
    computing = [op for op in ops if not op.is_view]
    if len(computing) != 1:
        return None
    found = experts_weight(g, computing[0])
    if found is None or found[0] not in problem.members[node] or len(ops) != 2:
        return None
    return computing[0], g.params[found[1]]


def price_expert_split(problem: Any, node: str, split: ExpertTimeSplit) -> SplitPrice:
    """The price of ``split`` for ``node`` in ``problem`` (see the module docstring)."""
    found = node_experts(problem, node)
    if found is None:
        raise HetpartError(f"node {node!r} is not a fused experts op with its weight's view: it takes no time "
                           f"split by expert")
    op, weight = found
    g = problem.original
    experts = weight.shape[0]
    x_bytes = g.tensors[op.inputs[0]].nbytes
    rows = g.tensors[op.inputs[0]].shape[0] if g.tensors[op.inputs[0]].shape else 0
    offs_bytes = sum(g.tensors[t].nbytes for t in op.inputs[2:])
    y_bytes = sum(g.tensors[t].nbytes for t in op.outputs)
    expert_bytes = weight.nbytes // experts
    device = problem.devices.device(split.home)
    copies, computes, chunk_bytes = [], [], []
    for count in chunk_sizes(experts, split.chunks):
        share = count / experts  # uniform routing: S / E rows per expert
        w = expert_bytes * count
        touched = grouped_weight_share(round(rows * share), count)  # the experts its rows can reach
        chunk = dataclasses.replace(op, flops=int(op.flops * share), param_bytes=w,
                                    bytes_read=int(x_bytes * share) + offs_bytes + round(w * touched),
                                    bytes_written=int(y_bytes * share))
        computes.append(problem.costs.op_time(chunk, device).seconds)
        copies.append(problem.costs.transfer_time(w, split.host, split.home, problem.devices, pinned=True).seconds)
        chunk_bytes.append(w)
    seconds = pipeline_s(copies, computes)
    resident = problem.param_bytes[node] - weight.nbytes
    work = x_bytes + offs_bytes + 2 * y_bytes + SLOTS * max(chunk_bytes)
    return SplitPrice(
        devices=split.devices, shard_s=(seconds, 0.0), param_bytes=(resident, weight.nbytes), work_bytes=(work, 0),
        latency_s=max(seconds, sum(copies)),
        copies=tuple((split.host, split.home, b, c) for b, c in zip(chunk_bytes, copies)))


def expert_split_choices(problem: Any, node: str, chunks: Sequence[int]) -> tuple[ExpertTimeSplit, ...]:
    """Every time split by expert ``node`` may take: one experts op and its weight's view, each
    accelerator that can run it, each offered chunk count up to its number of experts."""
    found = node_experts(problem, node)
    if found is None:
        return ()
    experts = found[1].shape[0]
    host = problem.host
    return tuple(ExpertTimeSplit(AXIS, (d, host), n) for d in problem.allowed[node] if d != host
                 for n in sorted(set(chunks)) if 2 <= n <= experts)

