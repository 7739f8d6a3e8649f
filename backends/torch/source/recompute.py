"""Recomputed runs in a generated file: nested functions called through ``torch.utils.checkpoint``.

In: the printed parts of a forward (:mod:`backends.torch.source.forward`: each op's
:class:`Statement`, with the names it defines and reads), the names the return reads, the plan and
a maker of the file's fresh identifiers. Out: the parts with every maximal run of recomputed
ops (:func:`backends.torch.recompute.region_runs`, the grouping ``plan.emit`` uses: consecutive
in issue order on one device, with their copies and fetches) written as::

    def recompute(v_layer_norm, w_weight):          # what the run reads, passed explicitly
        v_linear = torch.ops.aten.linear.default(...)
        ...
        return (v_gelu,)                              # what later lines read
    (v_gelu,) = torch.utils.checkpoint.checkpoint(recompute, v_layer_norm, w_weight, use_reentrant=False)

The lines inside keep their sites (a nested function's code has the file's line numbers, so
strict devices check it as they check ``forward``); names the run defines and nothing after it
reads stay local to it and are never freed by forward's ``del``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch.fx

from backends.torch.recompute import check_recomputable, recomputed_ops, region_runs

__all__ = ["Statement", "checkpoint_runs"]


@dataclasses.dataclass
class Statement:
    """The lines one op added to its part: ``lines[start:end]`` (its copies, fetches, module
    comment and call), the names they define and the names they read."""

    node: torch.fx.Node
    start: int
    end: int
    defined: list[str]
    used: set[str]


def checkpoint_runs(parts: Sequence[Any], tail_used: set[str], plan: Any, new_name: Callable[[], str]) -> bool:
    """Rewrite the recomputed runs of ``parts`` (the printer's parts: ``lines``, ``sites``,
    ``defined``, ``used`` and their :class:`Statement` list) in place; ``new_name()`` gives each
    run's function a fresh identifier of the file; returns whether there were any."""
    recompute = recomputed_ops(plan)
    if not recompute:
        return False
    runs = [region_runs(part.statements, plan.placement, recompute,
                        lambda s: s.node.name if s.node.name in plan.placement else "") for part in parts]
    for part_runs in runs:
        for statement in (s for run in part_runs for s in run if s.node.name in recompute):
            check_recomputable(statement.node)
    functions = iter([new_name() for part_runs in runs for _ in part_runs])
    named = [[next(functions) for _ in part_runs] for part_runs in runs]  # in the file's order
    for index, part in enumerate(parts):
        later_parts = set(tail_used).union(*(p.used for p in parts[index + 1:]))
        for run, fn in reversed(list(zip(runs[index], named[index]))):  # from the end: earlier indices stay valid
            after = later_parts.union(*(s.used for s in part.statements if s.start >= run[-1].end))
            _rewrite(part, run, after, fn)
    return any(runs)


def _rewrite(part: Any, run: list[Statement], after: set[str], fn: str) -> None:
    defined = [n for s in run for n in s.defined]
    inside = set(defined)
    free = sorted({n for s in run for n in s.used} - inside)
    outputs = [n for n in defined if n in after]
    start, end = run[0].start, run[-1].end
    returned = f"({outputs[0]},)" if len(outputs) == 1 else f"({', '.join(outputs)})"
    call = f"torch.utils.checkpoint.checkpoint({', '.join([fn, *free])}, use_reentrant=False)"
    lines = [f"def {fn}({', '.join(free)}):  # recomputed in backward",
             *(f"    {line}" for line in part.lines[start:end]),
             f"    return {returned}",
             f"{returned} = {call}" if outputs else call]
    part.lines[start:end] = lines
    part.sites[start:end] = [None, *part.sites[start:end], None, None]
    part.defined = [n for n in part.defined if n not in inside or n in after]
