"""Plans with linears split by hand, for the tensor-parallel tests (valid plans, saved and loaded).

:func:`split_plan` offers the splits of ``fractions`` on ``profile``, lets ``choose`` pick one (or
none) for each splittable linear, leaves the rest on the host, checks the placement (``evaluate``,
``verify_placement``, the plan's own checks on save and load) and returns the loaded plan.
:func:`alternating` splits every one in halves, cycling through both axes and both homes;
:func:`even_over` splits every one evenly over ``n`` devices, cycling through both axes and the homes.
:func:`region_plan` forms every split region (a model's MLPs) instead.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from partitioner import Plan, from_module, load_profile
from partitioner.solvers.problem import Options, Placement, Problem, Solution, Status, evaluate
from partitioner.solvers.splits import Split, SplitOptions
from partitioner.verify import verify_placement

Chooser = Callable[[str, Sequence[Split], str], "Split | None"]  # (node, its choices, the host) -> a split or none


def alternating() -> Chooser:
    """Every linear split in halves: cols at home on the host, rows away, cols away, rows at home, ..."""
    kinds = itertools.cycle([("cols", False), ("rows", True), ("cols", True), ("rows", False)])

    def choose(_node: str, choices: Sequence[Split], host: str) -> Split:
        axis, away = next(kinds)
        return next(s for s in choices if s.axis == axis and s.fractions[0] == 0.5 and (s.home != host) == away)

    return choose


def even_over(n: int) -> Chooser:
    """Every linear split evenly over ``n`` devices: cols then rows, each home of the offered groups in turn."""
    from partitioner.solvers.splits import even_shares

    turn = itertools.count()

    def choose(_node: str, choices: Sequence[Split], _host: str) -> Split:
        even = [s for s in choices if len(s.devices) == n and s.fractions == even_shares(n)]
        homes = sorted({s.home for s in even})
        i = next(turn)
        axis, home = ("cols", "rows")[i % 2], homes[(i // 2) % len(homes)]
        return next(s for s in even if s.axis == axis and s.home == home)

    return choose


def split_plan(module: torch.nn.Module, inputs: tuple, path: Path, choose: Chooser | None = None, *,
               profile: str = "h200-host", fractions: tuple[float, ...] = (0.5,), **plan_keywords: Any) -> Plan:
    """A plan of ``module`` with the splits ``choose`` picks (default :func:`alternating`), saved to
    ``path`` and loaded from it."""
    choose = choose or alternating()
    problem = Problem(from_module(module, inputs), load_profile(profile),
                      Options(streaming=False, splits=SplitOptions(fractions=fractions, proportional=False)))
    host = problem.host
    device = {n: host for n in problem.nodes}
    split = {}
    for n, choices in problem.split_choices.items():
        sp = choose(n, choices, host)
        if sp is not None:
            split[n], device[n] = sp, sp.home
    placement = Placement(device, split=split)
    ev = evaluate(problem, placement)
    assert ev.feasible, ev.violations
    verify_placement(problem, placement, ev)
    Plan.from_solution(problem, Solution("by hand", placement, Status.HEURISTIC), ev, **plan_keywords).save(path)
    return Plan.load(path)


def region_plan(module: torch.nn.Module, inputs: tuple, path: Path | None = None, *,
                fractions: Sequence[float] = (0.25, 0.5, 0.75), disagree: bool = False, heads: bool = True,
                **plan_keywords: Any) -> tuple[Plan, Problem, Placement]:
    """A plan with every split region of ``module`` (:mod:`partitioner.solvers.split_regions`: its
    MLPs) formed: each region's cols split ``cols`` and its row ``rows`` over one pair of devices at
    one fraction, its interior ops on the home (homes alternating between cuda:0 and cpu, fractions
    cycling through ``fractions``), everything else on the host. With ``disagree`` each row off the
    fraction 0.5 takes 0.5 instead (no region forms there); without ``heads`` regions cut by heads
    (attention) are left whole. Checked like :func:`split_plan`; saved
    to ``path`` and loaded from it when given. Returns the plan, its problem and placement."""
    problem = Problem(from_module(module, inputs), load_profile("h200-host"),
                      Options(streaming=False, splits=SplitOptions(fractions=tuple(fractions), proportional=False,
                                                                   balanced=False)))
    offer = problem.region_offer
    device = {n: problem.host for n in problem.nodes}
    split = {}
    kinds = zip(itertools.cycle([("cuda:0", "cpu"), ("cpu", "cuda:0")]), itertools.cycle(fractions))
    for region in offer.regions:
        if region.granule > 1 and not heads:
            continue
        devices, f = next(kinds)
        cols = Split("cols", devices, (f, round(1.0 - f, 10)))
        row = Split("rows", devices, (0.5, 0.5) if disagree and f != 0.5 else cols.fractions)
        for op in region.cols:
            split[offer.node_of[op]] = cols
        split[offer.node_of[region.row]] = row
        for op in region.members:
            device[offer.node_of[op]] = devices[0]
    placement = Placement(device, split=split)
    ev = evaluate(problem, placement)
    assert ev.feasible, ev.violations
    verify_placement(problem, placement, ev)
    plan = Plan.from_solution(problem, Solution("by hand", placement, Status.HEURISTIC), ev, **plan_keywords)
    if path is not None:
        plan.save(path)
        plan = Plan.load(path)
    return plan, problem, placement
