"""The Megatron-LM baseline: every linear split evenly over one group of like accelerators.

In: a :class:`~partitioner.solvers.problem.Problem` with splits offered (``Options.splits``) over a
group of like accelerators (``SplitOptions.degrees``: an 8-GPU host is offered degree 8). Out: a
:class:`~partitioner.solvers.problem.Solution` named ``megatron``, costed like every plan by
:func:`~partitioner.solvers.problem.evaluate`.

Megatron-LM (Shoeybi et al. 2019) runs a transformer with a tensor-parallel degree the user sets for
identical GPUs: each attention block's q/k/v projections split by output columns (whole heads per
GPU), its output projection by rows; each MLP's first linear by columns, its second by rows, nothing
gathered between a column split and the row split after it; the rest of the layer computed on every
GPU. Here that is: every node on the group's first device (its fallback the host, as
:func:`~partitioner.solvers.single.solve_single` does; a replicated op costs one GPU's time, as it
does here), every split region (:mod:`partitioner.solvers.split_regions`: column splits into a row
split) formed with the group's even split, and every other splittable linear split by columns over
the group. The degree is the largest of the problem's offered groups of like accelerators with even
shares (Megatron's usual choice: every GPU of the host). The ILP starts from it and offers the same
splits, so a plan is never slower than it.
"""

from __future__ import annotations

import time

from partitioner.solvers.problem import Placement, Problem, Solution, Status, accelerator_devices
from partitioner.solvers.single import solve_single
from partitioner.solvers.splits import Split, even_shares

#: The name plans and benches list it under.
NAME = "megatron"


def tensor_parallel_group(problem: Problem) -> tuple[str, ...]:
    """The widest group of like accelerators some node is offered an even split over (home first),
    or ``()``: the devices Megatron's uniform degree would use."""
    accelerators = set(accelerator_devices(problem.devices))
    best: tuple[str, ...] = ()
    for choices in problem.split_choices.values():
        for sp in choices:
            if (isinstance(sp, Split) and sp.axis == "cols" and len(sp.devices) > len(best)
                    and set(sp.devices) <= accelerators and sp.fractions == even_shares(len(sp.devices))
                    and sp.home == min(sp.devices, key=problem.device_names.index)):
                best = sp.devices
    return best


def solve_megatron(problem: Problem) -> Solution:
    """Megatron's placement of ``problem`` (see the module docstring).

    Returns an empty, infeasible solution (with a note) when no node is offered an even split over
    two or more like accelerators.

    Example:
        >>> sol = solve_megatron(problem)                                 # doctest: +SKIP
        >>> {len(sp.devices) for sp in sol.placement.split.values()}
        {8}
    """
    start = time.perf_counter()
    group = tensor_parallel_group(problem)
    if not group:
        return Solution(NAME, Placement({}), Status.INFEASIBLE, None, time.perf_counter() - start,
                        "no op is offered an even split over two or more like accelerators (plan with splits "
                        "over a host of like GPUs, e.g. --split cols,rows@8 on 8xh100-nvlink)")
    home = group[0]
    device = dict(solve_single(problem, home).placement.device)
    even = even_shares(len(group))
    offered = {n: set(choices) for n, choices in problem.split_choices.items() if device.get(n) == home}
    split: dict[str, Split] = {}

    def take(node: str, axis: str) -> bool:
        sp = Split(axis, group, even)
        if sp in offered.get(node, ()):
            split[node] = sp
            return True
        return False

    offer = problem.region_offer
    in_region = 0
    for i, region in enumerate(offer.regions):
        cols = [offer.node_of[c] for c in region.cols]
        row = offer.node_of[region.row]
        interior = offer.interior_nodes(i)
        if (any(n in split for n in (*cols, row)) or any(device.get(e) != home for e in interior)
                or (i, Split("cols", group, even)) not in offer.price):
            continue
        if all(Split("cols", group, even) in offered.get(n, ()) for n in cols) \
                and Split("rows", group, even) in offered.get(row, ()):
            for n in cols:
                take(n, "cols")
            take(row, "rows")
            in_region += 1
    for node in offered:
        if node not in split:
            take(node, "cols")
    note = (f"{len(split)} linears split evenly over {len(group)} devices ({', '.join(group)}), {in_region} "
            f"column/row pairs not rejoined between")
    return Solution(NAME, Placement(device, split=split), Status.HEURISTIC, None, time.perf_counter() - start, note)
