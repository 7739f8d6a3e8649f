"""The head counts an attention region's module must hold on each tensor-parallel rank.

In: the captured graph of the model (:func:`~backends.torch.module.capture_for`, with each node's
``nn_module_stack``), a split region cut by heads (:mod:`partitioner.solvers.split_regions`: q/k/v
``cols`` -> views, transposes, attention -> ``o_proj`` ``rows``) and the features each rank holds.
Out: :class:`HeadCount` records, one per module attribute to set, and :func:`set_head_counts`, which
sets them on one rank's model.

Across ranks the region runs as Megatron runs attention: q, k, v ``ColwiseParallel()`` (each rank's
block of heads stays local), o_proj ``RowwiseParallel()`` (its input sharded), and the module's own
code in between, on the rank's block. That code must compute with the rank's head count, as
Megatron's attention computes with its per-partition head count:

* a view whose size at the heads dim is ``-1`` (HF Llama: ``hidden_shape = (*input_shape, -1,
  self.head_dim)``) needs nothing;
* a view whose size there is written from an attribute (the zoo's ``SelfAttention``:
  ``x.unflatten(-1, (self.n_heads, self.head_dim))``) needs that attribute set to the rank's count:
  the innermost module that issues the view (its ``nn_module_stack``) must have one of
  :data:`HEAD_ATTRIBUTES` equal to the graph's literal (the global head count); it is set to
  ``literal * rank's features / region features`` on that rank after ``parallelize_module``;
* a literal that no such attribute holds (or one of another value) may be one the module's code
  derives from a tensor's shape: HF Llama with grouped key/value heads, whose ``repeat_kv`` expands
  by ``hidden_states.shape`` and whose attention reshapes by it, all recorded as numbers. It is
  returned as an :class:`UnsetCount`, and :mod:`~backends.tensor_parallel.shard_shapes` decides: the
  model's code captured on each rank's shard shapes either computes with them (nothing to set) or
  fails, and the region is refused (:class:`~partitioner.errors.PlanMismatch`, naming the op, the
  module, the error and the fix).

Example:
    >>> heads, unset = head_counts(gm, regions, {"linear": ("cpu", "cuda:0"), ...}, model)   # doctest: +SKIP
    >>> heads[0]                                                                            # doctest: +SKIP
    HeadCount(module='blocks.0.attn', attribute='n_heads', counts=(4, 4))
    >>> set_head_counts(model, heads, rank=1)                                        # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx

from backends.torch.split_regions import cut_literal
from partitioner.errors import PlanMismatch
from partitioner.solvers.split_regions import Region

__all__ = ["HEAD_ATTRIBUTES", "HeadCount", "UnsetCount", "head_counts", "set_head_counts"]

#: the attribute names an attention module's head count goes by (zoo, HF, Megatron-style code)
HEAD_ATTRIBUTES = ("n_heads", "num_heads", "num_attention_heads", "n_head", "num_heads_per_partition")


@dataclasses.dataclass(frozen=True)
class HeadCount:
    """One module attribute that holds a head count, and its value on each rank."""

    module: str                # the module's path in the model, e.g. "blocks.0.attn"
    attribute: str             # e.g. "n_heads"
    counts: tuple[int, ...]    # its value on rank r (the heads of the rank's block)


@dataclasses.dataclass(frozen=True)
class UnsetCount:
    """A head count a view writes as a literal that its module holds in no head count attribute:
    the module's code must derive it from a tensor's shape (:mod:`~backends.tensor_parallel.shard_shapes`
    decides), or the region cannot run across ranks."""

    op: str          # the view's op in the captured graph, e.g. "expand_3"
    module: str      # the module that issues it ("" for the model itself)
    literal: int     # the count the graph holds
    refusal: str     # the refusal to raise, should the rank's shard shapes not capture


def head_counts(gm: torch.fx.GraphModule, regions: Sequence[Region], sizes: Mapping[str, Sequence[int]],
                model: torch.nn.Module) -> tuple[tuple[HeadCount, ...], tuple[UnsetCount, ...]]:
    """The head counts to set for ``regions``, and the ones no attribute holds (see the module docstring).

    ``sizes``: each region row's features per rank (rank order). Returns one record per module
    attribute, in program order, and one per view whose literal no attribute holds.

    Raises:
        PlanMismatch: one module's attribute would take two counts on a rank.
    """
    nodes = {n.name: n for n in gm.graph.nodes}
    out: dict[tuple[str, str], HeadCount] = {}
    unset: list[UnsetCount] = []
    for region in regions:
        ranks = tuple(sizes[region.row])
        for e, (dim, unit) in zip(region.interior, region.layouts):
            node = nodes[e]
            literal = cut_literal(node, dim)
            if literal is None or literal == -1:
                continue
            path = _owner(node)
            module = _submodule(model, path)
            names = [a for a in HEAD_ATTRIBUTES if isinstance(getattr(module, a, None), int)]
            held = [a for a in names if getattr(module, a) == literal]
            if not held:
                what = (f"its {', '.join(f'{a}={getattr(module, a)}' for a in names)}" if names
                        else f"no attribute named {' / '.join(HEAD_ATTRIBUTES)}")
                unset.append(UnsetCount(e, path, literal, (
                    f"op {e!r} of the attention region {region.cols} -> {region.row} writes {literal} heads into its "
                    f"view, issued by module {path or '(the model)'!r} ({type(module).__name__}), which has {what}: "
                    f"across tensor-parallel ranks each rank holds {', '.join(str(s // unit) for s in ranks)} of "
                    f"those heads and the module's code must compute with that count, which no attribute sets")))
                continue
            counts = tuple(s // unit for s in ranks)
            key = (path, held[0])
            if key in out and out[key].counts != counts:
                raise PlanMismatch(f"module {path!r}'s {held[0]} would be {out[key].counts} and {counts} per rank "
                                   f"(op {e!r}): its views cut its heads differently; run the plan in one process "
                                   f"(plan.emit)")
            out[key] = HeadCount(path, held[0], counts)
    return tuple(out.values()), tuple(unset)


def set_head_counts(model: torch.nn.Module, heads: Sequence[HeadCount], rank: int) -> None:
    """Set each of ``heads`` on ``model`` (this rank's copy, changed in place) to rank ``rank``'s count."""
    for h in heads:
        setattr(model.get_submodule(h.module), h.attribute, h.counts[rank])


def _owner(node: torch.fx.Node) -> str:
    """The path of the innermost module that issued ``node`` (``""``: the model itself)."""
    stack: dict[str, Any] = node.meta.get("nn_module_stack") or {}
    return str(list(stack.values())[-1][0]) if stack else ""


def _submodule(model: torch.nn.Module, path: str) -> torch.nn.Module:
    try:
        return model.get_submodule(path) if path else model
    except AttributeError:
        raise PlanMismatch(f"the captured graph names module {path!r}, which the model has not: the plan was made "
                           f"for another model; re-plan it") from None
