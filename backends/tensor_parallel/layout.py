"""Which ``nn.Linear`` each split of a plan is, and the tensor-parallel style that runs it.

In: a plan with a ``splits`` section (:mod:`partitioner.plan.splits`: op -> axis, ``[home, d1, ...]``,
fractions), the model it was made for and its example inputs. Out: :class:`Layout`: the mesh's
devices (rank ``r`` of the tensor-parallel group of ``n`` ranks runs ``devices[r]``; the plan's
split devices, two or more, in the profile's order) and, per split op, the model's ``nn.Linear`` it is and its
``torch.distributed.tensor.parallel`` style:

==========  ==================================================================  =====================
plan axis   what each rank holds and does                                       style
==========  ==================================================================  =====================
``cols``    a block of the weight's rows (output features) and of the bias;     ``ColwiseParallel(
            the whole input, its block of the output, all-gathered              output_layouts=
                                                                                Replicate())``
``rows``    a block of the weight's columns (input features); its block of the  ``RowwiseParallel(
            input, a partial output, all-reduced (the bias added once)          input_layouts=
                                                                                Replicate())``
==========  ==================================================================  =====================

A split region (:mod:`partitioner.solvers.split_regions`: column splits feeding a row split over
the same devices and fractions through elementwise ops, as in Megatron's MLP) runs as Megatron
does: its cols ``ColwiseParallel()`` (output left sharded, the local block), the ops between on
each rank's block, its row ``RowwiseParallel()`` (input sharded: no all-gather before it, one
all-reduce after). A region cut by heads (attention: q/k/v cols, views, attention, o_proj row) runs
the same way, the module computing with the rank's heads: its views use ``-1`` heads (HF Llama), or
its head count attribute (the zoo's ``n_heads``) is set to the rank's count on each rank
(:mod:`~backends.tensor_parallel.heads`, :attr:`Layout.heads`), or its code derives the count from
a tensor's shape (HF Llama's grouped key/value heads: a copy holding each rank's shards captures,
:mod:`~backends.tensor_parallel.shard_shapes`); a module whose count is set none of these ways is
refused by name. Inside a pipeline grid (:mod:`~backends.tensor_parallel.grid`, which
runs the stage graphs, head counts written in) a region cut by heads runs as separate splits.

Every other op is replicated: each rank runs it whole on the same values (as Megatron-LM does for
the layers it does not split), so those parameters' gradients are the same on every rank.

What is refused (:class:`~partitioner.errors.PlanMismatch`, naming the op and the fix):

* a split op that is not the one call of an ``nn.Linear`` that owns its weight (a functional
  linear, a linear called twice, a weight tied to another module): the styles shard modules;
* fractions other than the even blocks ``torch.distributed.tensor`` shards into (``Shard(d)``
  cuts like ``torch.chunk``): its collectives pad and unpad by those sizes, so an uneven cut cannot
  be gathered (tried on torch 2.13 with gloo: ``DTensor.from_local`` of a 12/4 row split with the
  global shape and stride given, a linear, then ``full_tensor()``, aborts a rank). Re-plan with ``splits={"fractions": [0.5]}`` (CLI ``--split cols:0.5``), or
  run the plan in one process (``plan.emit``), which takes any fractions;
* splits over different sets of devices (one tensor-parallel group runs them all);
* time splits (``axis: time``: one device streams the weight in chunks), which run in one process;
* table splits of an embedding and batch splits of elementwise ops and norms (``axis: table`` or
  ``batch``, :mod:`partitioner.solvers.split_axes`): the ranks shard linears only; these run in one
  process (``plan.emit``).

Example:
    >>> layout = layout_of(plan, model, inputs)                          # doctest: +SKIP
    >>> layout.devices, [(s.op, s.module, s.axis) for s in layout.linears]  # doctest: +SKIP
    (('cpu', 'cuda:0'), [('linear_4', 'blocks.0.mlp.ff1', 'cols'), ...])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx

from backends.tensor_parallel.heads import HeadCount, head_counts
from backends.tensor_parallel.shard_shapes import shard_capture_error
from partitioner.errors import PlanMismatch
from partitioner.solvers.split_regions import Region
from partitioner.solvers.splits import shard_sizes

__all__ = ["Layout", "SplitLinear", "dtensor_sizes", "layout_of", "mesh_devices", "sharded_regions", "split_linears"]

_FIX = ('re-plan with even fractions (two devices: splits={"fractions": [0.5]}, CLI --split cols,rows:0.5; more: '
        'splits over like devices are offered in even shares, CLI --split cols,rows@4) or set this op\'s fractions '
        "to even shares (1/n each) in the plan file; or run the plan in one process (plan.emit), which takes any "
        "fractions")


@dataclasses.dataclass(frozen=True)
class SplitLinear:
    """One split op of the plan as the model's ``nn.Linear``."""

    op: str                       # the plan's op name (an aten linear of the captured graph)
    module: str                   # the nn.Linear's path in the model, e.g. "blocks.0.mlp.ff1"
    axis: str                     # "cols" (output features) or "rows" (the reduction dimension)
    devices: tuple[str, ...]      # the plan's (home, d1, ...)
    fractions: tuple[float, ...]
    sizes: tuple[int, ...]        # the rows (cols) or columns (rows) of the weight each mesh rank holds
    region: bool = False          # a col or the row of a split region: its output (cols) or input (row) stays sharded

    def style(self) -> Any:
        """The ``torch.distributed.tensor.parallel`` style that runs this split (module docstring)."""
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        if self.axis == "cols":
            return ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1) if self.region else Replicate())
        return RowwiseParallel(input_layouts=Shard(-1) if self.region else Replicate(), output_layouts=Replicate())


@dataclasses.dataclass(frozen=True)
class Layout:
    """A plan's splits over one tensor-parallel group (see the module docstring)."""

    devices: tuple[str, ...]          # rank r of the group runs devices[r]
    linears: tuple[SplitLinear, ...]  # in the plan's order
    heads: tuple[HeadCount, ...] = () # attention modules' head counts per rank (regions cut by heads)

    @property
    def world_size(self) -> int:
        """How many ranks the group has (one per device of the splits)."""
        return len(self.devices)

    def plan(self, prefix: str = "") -> dict[str, Any]:
        """``parallelize_module``'s plan: module path (under ``prefix``) -> style."""
        return {prefix + s.module: s.style() for s in self.linears}


def mesh_devices(plan: Any) -> tuple[str, ...]:
    """The devices of the plan's splits, in the profile's order: rank ``r`` runs the ``r``-th.

    Raises:
        PlanMismatch: the plan has no splits, or its splits are over different sets of devices.

    Example:
        >>> mesh_devices(plan)                 # doctest: +SKIP
        ('cpu', 'cuda:0')
    """
    splits = getattr(plan, "splits", None) or {}
    if not splits:
        raise PlanMismatch(f"{plan.source} has no splits section: tensor-parallel ranks run a plan's split linears; "
                           f"plan with splits (partition(..., splits=True), CLI --split)")
    timed = [op for op, e in splits.items() if e["axis"] == "time"]
    if timed:
        raise PlanMismatch(f"{plan.source} splits op {timed[0]!r} in time (its weight streamed to one device in chunks, "
                           f"partitioner/solvers/chunked_streaming.py): tensor-parallel ranks run splits over devices "
                           f"only; run the plan in one process (plan.emit), or re-plan without time splits "
                           f"(--split cols,rows)")
    others = [(op, e["axis"]) for op, e in splits.items() if e["axis"] in ("table", "batch")]
    if others:
        op, axis = others[0]
        what = "an embedding by table rows" if axis == "table" else "an elementwise op or norm by batch"
        raise PlanMismatch(f"{plan.source} splits op {op!r} along {axis} ({what}, partitioner/solvers/split_axes.py): "
                           f"tensor-parallel ranks shard linears only (cols, rows); run the plan in one process "
                           f"(plan.emit, CLI hetpart run), or re-plan without {axis} splits (--split cols,rows)")
    experts = [op for op, e in splits.items() if e["axis"] == "experts"]
    if experts:
        raise PlanMismatch(f"{plan.source} divides the experts of op {experts[0]!r} between devices "
                           f"(partitioner/solvers/expert_devices.py): tensor-parallel ranks run split linears only; "
                           f"run the plan in one process (plan.emit), or re-plan with --split cols,rows")
    sets = {op: frozenset(e["devices"]) for op, e in splits.items()}
    first_op, first = next(iter(sets.items()))
    for op, devices in sets.items():
        if devices != first:
            raise PlanMismatch(
                f"{plan.source}: op {op!r} is split over {sorted(devices)} but {first_op!r} over {sorted(first)}: one "
                f"tensor-parallel group runs every split of a plan, so they must all be over the same devices; "
                f"re-plan with the other devices pinned away, or run the plan in one process (plan.emit)")
    order = {d: i for i, d in enumerate(plan.devices.names())}
    return tuple(sorted(first, key=lambda d: order.get(d, len(order))))


def dtensor_sizes(length: int, world: int) -> tuple[int, ...]:
    """The block each rank holds when ``torch.distributed.tensor`` shards ``length`` over ``world``
    ranks (``torch.chunk``'s cut: blocks of ``ceil(length / world)``, the last ones smaller or empty).

    Example:
        >>> dtensor_sizes(10, 2), dtensor_sizes(7, 2)
        ((5, 5), (4, 3))
    """
    blocks = [len(c) for c in torch.arange(length).chunk(world)]
    return tuple(blocks + [0] * (world - len(blocks)))


def layout_of(plan: Any, model: torch.nn.Module, inputs: Sequence[Any] | None = None) -> Layout:
    """Each split op of ``plan`` as ``model``'s ``nn.Linear`` with its style (see the module docstring).

    The model is captured as the plan was (:func:`~backends.torch.module.capture_for`; the
    caller's model is not changed) to find the parameters each op reads.

    Raises:
        PlanMismatch: a split the tensor-parallel styles cannot run exactly (named, with the fix).
    """
    from backends.torch.module import capture_for, unlifted_module

    devices = mesh_devices(plan)
    groups = {op: devices for op in plan.splits}
    gm = unlifted_module(capture_for(plan, model, tuple(inputs) if inputs is not None else None))
    linears = split_linears(plan, model, inputs, groups, captured=gm, heads=True)
    sizes = {s.op: s.sizes for s in linears if s.axis == "rows"}
    heads, unset = head_counts(gm, sharded_regions(plan, gm, groups, heads=True), sizes, model)
    if unset and (failed := shard_capture_error(plan, model, inputs, linears, heads)) is not None:
        rank, error = failed
        raise PlanMismatch(
            f"{unset[0].refusal}, and the model's code does not compute with rank {rank}'s heads either: a copy of "
            f"the model holding rank {rank}'s shards does not capture ({error}); write the view with -1 heads "
            f"(x.view(*shape, -1, head_dim)) or keep the count in an n_heads attribute, or plan without this region "
            f"(its linears split separately), or run the plan in one process (plan.emit)")
    return Layout(devices, linears, heads)


def sharded_regions(plan: Any, gm: torch.fx.GraphModule, groups: Mapping[str, Sequence[str]], *,
                    heads: bool) -> tuple[Region, ...]:
    """The regions of ``plan`` (:func:`~backends.torch.split_regions.plan_regions` on ``gm``) whose
    every member is sharded in ``groups``: nothing rejoined between them across ranks. Without
    ``heads``, only regions of elementwise ops (the module's code runs unchanged)."""
    from backends.torch.split_regions import fx_steps, plan_regions
    from partitioner.solvers.split_regions import ELEMENTWISE

    steps = fx_steps(gm)
    return tuple(r for r in plan_regions(gm, plan) if set(r.cols) | {r.row} <= set(groups)
                 and (heads or all(steps[e].kind in ELEMENTWISE for e in r.interior)))


def split_linears(plan: Any, model: torch.nn.Module, inputs: Sequence[Any] | None,
                  groups: Mapping[str, Sequence[str]], *,
                  captured: torch.fx.GraphModule | None = None, heads: bool = False) -> tuple[SplitLinear, ...]:
    """The split ops ``groups`` names as ``model``'s ``nn.Linear`` modules, each sharded over the
    devices ``groups`` gives it (its tensor-parallel group, in rank order), checked as
    :func:`layout_of` says. ``captured``: the model's graph as the plan captured it, with the
    parameter names (default: captured here from ``inputs``). ``heads``: a region cut by heads
    keeps its shards across ranks too (the caller sets the head counts, :func:`layout_of`);
    without it such a region's linears run as separate splits.

    Raises:
        PlanMismatch: a split the tensor-parallel styles cannot run exactly (named, with the fix).
    """
    from backends.torch.module import capture_for, unlifted_module

    if captured is None:
        captured = unlifted_module(capture_for(plan, model, tuple(inputs) if inputs is not None else None))
    gm = captured
    nodes = {n.name: n for n in gm.graph.nodes}
    in_region = {op for r in sharded_regions(plan, gm, groups, heads=heads) for op in (*r.cols, r.row)}
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    linears = []
    for op, group in groups.items():
        entry, devices = plan.splits[op], tuple(group)
        module, weight = _linear_module(plan, op, entry, nodes.get(op), model, names)
        axis, fractions = entry["axis"], tuple(float(f) for f in entry["fractions"])
        length = weight.shape[0] if axis == "cols" else weight.shape[1]
        planned = dict(zip(entry["devices"], shard_sizes(length, fractions)))
        if set(planned) != set(devices):
            raise PlanMismatch(f"op {op!r} is split over {list(entry['devices'])}, but its tensor-parallel group is "
                               f"{list(devices)}: each rank of the group holds one shard; re-plan with the split "
                               f"over the group's devices, or run the plan in one process (plan.emit)")
        sizes = tuple(planned[d] for d in devices)
        even = dtensor_sizes(length, len(devices))
        if sizes != even:
            what = "rows (output features)" if axis == "cols" else "columns (input features)"
            raise PlanMismatch(
                f"op {op!r} ({module}, weight {tuple(weight.shape)}) is split {axis} with fractions {list(fractions)}: "
                f"{', '.join(f'{k} on {d}' for d, k in zip(devices, sizes))} of its {length} {what}; "
                f"torch.distributed.tensor shards into even blocks ({', '.join(map(str, even))} on ranks "
                f"{', '.join(map(str, range(len(devices))))}) and its collectives gather by those sizes, so this "
                f"split cannot run across ranks: {_FIX}")
        linears.append(SplitLinear(op, module, axis, tuple(entry["devices"]), fractions, sizes, op in in_region))
    return tuple(linears)


def _linear_module(plan: Any, op: str, entry: Mapping[str, Any], node: torch.fx.Node | None, model: torch.nn.Module,
                   names: Mapping[int, list[str]]) -> tuple[str, torch.Tensor]:
    """The path of the ``nn.Linear`` whose one call is ``op``, and its weight."""
    what = f"op {op!r} (split {entry['axis']} over {list(entry['devices'])})"
    if node is None or node.op != "call_function" or node.target is not torch.ops.aten.linear.default:
        raise PlanMismatch(f"{what}: the captured graph's {op!r} is {getattr(node, 'target', 'missing')}, not an aten "
                           f"linear; the plan was made for another model: re-plan it")
    w_node = node.args[1]
    b_node = node.kwargs.get("bias", node.args[2] if len(node.args) > 2 else None)
    target = str(getattr(w_node, "target", ""))
    owner, _, leaf = target.rpartition(".")
    try:
        module = model.get_submodule(owner) if owner else model
    except AttributeError:
        module = None
    if getattr(w_node, "op", None) != "get_attr" or leaf != "weight" or not isinstance(module, torch.nn.Linear):
        raise PlanMismatch(f"{what} reads {target or 'a computed weight'!r}, not the weight of an nn.Linear: the "
                           f"tensor-parallel styles (ColwiseParallel, RowwiseParallel) shard nn.Linear modules; "
                           f"drop this split from the plan, or run the plan in one process (plan.emit)")
    readers = sorted(u.name for u in w_node.users)
    tied = [n for n in names.get(id(module.weight), []) if n != target]
    if len(readers) > 1 or tied:
        also = f"also read by {', '.join(r for r in readers if r != op)}" if len(readers) > 1 else \
            f"tied to {', '.join(tied)}"
        raise PlanMismatch(f"{what}: {target} is {also}; sharding the module {owner!r} would shard every use of "
                           f"it, and the plan splits only {op!r}: drop this split from the plan, or run the plan in "
                           f"one process (plan.emit)")
    bias_ok = (b_node is None and module.bias is None) or (
        module.bias is not None and getattr(b_node, "op", None) == "get_attr" and str(b_node.target) == f"{owner}.bias")
    if not bias_ok:
        raise PlanMismatch(f"{what}: its bias is not {owner}.bias of the same nn.Linear; the module's style would "
                           f"shard the wrong bias: drop this split from the plan, or run it in one process (plan.emit)")
    return owner, module.weight
