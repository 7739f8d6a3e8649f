"""Multilevel solving: place a coarser copy of the problem first, and start the real ILP from it.

In: a :class:`~partitioner.solvers.problem.Problem`, a warm start (the best baseline), limits.
Out: the :class:`~partitioner.solvers.problem.Solution` of ``solve_ilp`` on *that* problem (its
status, bound and gap are the problem's own), reached faster: an ILP proves its gap quickly once
it holds a near-optimal incumbent (measured: 0.4-1.5 s from an optimal start against 5-65 s
cold on the zoo's encoder-decoders with two capped GPUs), and a coarse problem gives one cheaply.

Levels: the problem's graph is coarsened by module (:func:`~partitioner.coarsen.auto_coarsen`)
to about a third of its nodes, and that again, until a level has at most ``SMALLEST`` nodes;
each level's groups are unions of the next finer level's nodes, so a placement of a level is a
placement of every finer one, with the same cost (``Problem`` costs a group as its member ops).
From the coarsest level down, each level is improved by local search and solved by the ILP
within a share of the time left, and its answer, expanded, starts the next. Pinned nodes stay
groups of their own.

A coarse level's share is of at most ``LEVEL_HORIZON`` seconds, however long the limit: its job
is a start, and a longer coarse solve rarely gave a better one. Measured with a 60 s limit and a
1% gap (``bench/solve_scaling.py``, the slowest rows): without the horizon a coarse level spent up
to 10-12 s proving its own gap (bart-base on cpu-gpu-npu: 10 s on its 99-node level for a start
the finest level then proved in 8 s); with it, seconds to 1% went 11.8 -> 7.3 (t5-base, two
H200s), 18.7 -> 11.5 (bart-base), 30.4 -> 24.9 (the MoE decoder), 12.2 -> 10.0 (bert-base, two
H200s), 7.0 -> 6.6 (48 GPT blocks), and the 60 s gap of the 1,000- and 3,000-op DAGs 5.2 -> 3.9%
and 5.0 -> 3.9%. A horizon of 1 s was worse on the 48 blocks (11.6 s), whose finest level needs
a well-solved coarse start. The horizon is 5 s (1 s a level) since the stream-order rows: with
2.5 s, whether the MoE decoder's 87-node level found its better plan (a root sub-MIP, about
0.45 s in) depended on the machine's moment, and the row took 6 s or 50 s with the same code;
``bench/solve_scaling.py --seeds 3``, 2.5 s -> 5 s: 48 GPT blocks 14.3/13.3/14.2 -> 3.6/3.8/3.7 s,
the MoE decoder 25.5/28.8/21.5 -> 7.2/51.2/25.3 s, the 3,000-op DAG at 1% in 0/3 -> 1/3 seeds,
the 1,000-op DAG 2/3 both, every other row within 0.5 s.

The finest level is solved by a proving and a searching run (``proof_first``, see
:mod:`~partitioner.solvers.highs`): from the coarse levels' start, one HiGHS run works on the
bound with its sub-MIP heuristics off while the other (or, on one core, the one after) searches
with them. Coarse levels make one run with them on: their job is finding a start (with the two
phases there too, bert-base on two H200s took 3.4 s instead of 1.6 s, t5-base 2.5 s instead of
2.3 s, the MoE decoder and bart-base about the same).
"""

from __future__ import annotations

import logging
import time

from partitioner.coarsen import auto_coarsen
from partitioner.solvers.ilp import ProgressFn, solve_ilp
from partitioner.solvers.local_search import improve
from partitioner.solvers.makespan import check_size
from partitioner.solvers.problem import Objective, Placement, Problem, Solution, StreamMode, evaluate

log = logging.getLogger(__name__)

SMALLEST = 40        # stop coarsening at this many nodes
SHRINK = 2           # each level has at most half the nodes of the one below
MIN_SHRINK = 0.8     # a coarsening that keeps more than this share of the nodes is not a level
LEVEL_SHARE = 0.2    # a coarse level may use this share of the time left ...
LEVEL_HORIZON = 5.0  # ... counted as at most this many seconds (so at most 1 s a level)
SEARCH_SHARE = 0.05  # local search at a level may use this share of the time left


def coarser_levels(problem: Problem) -> list[tuple[Problem, dict[str, str]]]:
    """Coarser copies of ``problem``, coarsest first, each with the map from the next finer
    level's nodes (the problem's own, for the last one) to its groups."""
    levels: list[tuple[Problem, dict[str, str]]] = []
    current = problem
    while len(current.nodes) > SMALLEST:
        keep = frozenset(current.pins)
        c = auto_coarsen(current.graph, max(SMALLEST, len(current.nodes) // SHRINK), keep_separate=keep)
        if len(c.graph) > MIN_SHRINK * len(current.nodes):
            break
        members = {g: tuple(op for n in c.members[g] for op in current.members[n]) for g in c.members}
        pins = {op: d for n, d in current.pins.items() for op in current.members[n]}
        coarse = Problem(c.graph, current.devices, current.options, pins=pins, members=members,
                         original=current.original)
        levels.append((coarse, dict(c.group_of)))
        current = coarse
    levels.reverse()
    return levels


def expand(finer: Problem, group_of: dict[str, str], placement: Placement) -> Placement:
    """A coarse level's placement as a placement of the next finer level (same cost)."""
    device = {n: placement.device[group_of[n]] for n in finer.nodes}
    streamed = {n: finer.host for n in finer.nodes
                if group_of[n] in placement.streamed and n in finer.streamable and device[n] != finer.host}
    precision = {n: a for n in finer.nodes if (a := placement.precision.get(group_of[n])) is not None
                 and n not in streamed and a in finer.choices[n].get(device[n], ())}  # a member may need float32
    return Placement(device, streamed, StreamMode.PREFETCH, precision=precision)


def solve_multilevel(
    problem: Problem,
    start: Solution | None,
    *,
    solver: str = "auto",
    time_limit: float = 60.0,
    gap: float = 0.01,
    progress: ProgressFn | None = None,
) -> tuple[Solution, Solution | None]:
    """The ILP's solution of ``problem`` (started from the coarser levels' answers) and the best
    warm start it was given (``start`` improved by local search and the levels; None without
    one), both within ``time_limit`` seconds in all.

    Example:
        >>> sol, warm = solve_multilevel(problem, solve_heft(problem), time_limit=5)   # doctest: +SKIP
        >>> sol.status.value, sol.bound <= evaluate(problem, sol.placement).total_s
    """
    if problem.options.objective is Objective.MAKESPAN:
        check_size(problem)  # refuse at once rather than after solving the coarser levels
    began = time.perf_counter()
    deadline = began + time_limit
    levels = coarser_levels(problem)
    chain = [lv for lv, _ in levels] + [problem]
    maps = [m for _, m in levels]
    warm = start
    if levels:  # the warm start lives on the finest level: project it up, or start from baselines
        warm = _coarsest_start(problem, levels, start)
    for i, level in enumerate(chain):
        final = level is problem
        if warm is not None:
            left = deadline - time.perf_counter()
            warm = improve(level, warm, deadline=time.perf_counter() + SEARCH_SHARE * max(left, 0.0))
        left = deadline - time.perf_counter()
        budget = left if final else LEVEL_SHARE * min(left, LEVEL_HORIZON)
        placement = warm.placement if warm is not None and evaluate(level, warm.placement).feasible else None
        sol = solve_ilp(level, solver=solver, time_limit=max(budget, 0.05), gap=gap, warm_start=placement,
                        progress=progress if final else None, proof_first=final)
        log.info("level %d (%d nodes): %s %s in %.2f s", i, len(level.nodes), sol.status.value,
                 f"{sol.objective:.6g} s" if sol.objective is not None else "-", sol.seconds)
        if final:
            return sol, warm
        best = _better(level, sol, warm)
        if best is None:
            warm = None
            continue
        finer = chain[i + 1]
        warm = Solution(best.solver, expand(finer, maps[i], best.placement), best.status, seconds=best.seconds)
    raise AssertionError("unreachable: the last level is the problem itself")


def _better(level: Problem, sol: Solution, warm: Solution | None) -> Solution | None:
    """The feasible one of ``sol`` and ``warm`` with the lower objective (None if neither fits)."""
    options = []
    for candidate in (sol, warm):
        if candidate is not None and candidate.placement.device:
            ev = evaluate(level, candidate.placement)
            if ev.feasible:
                options.append((ev.total_s, candidate is warm, candidate))
    return min(options, key=lambda o: (o[0], o[1]))[2] if options else None


def _coarsest_start(problem: Problem, levels: list[tuple[Problem, dict[str, str]]],
                    start: Solution | None) -> Solution | None:
    """The best of ``start`` projected on the coarsest level and the baselines run there."""
    from partitioner.solvers import BASELINE_NAMES, run_baseline
    from partitioner.solvers.local_search import rank

    coarsest = levels[0][0]
    candidates = [_project(problem, levels, start)] if start is not None else []
    candidates += [run_baseline(name, coarsest) for name in
                   [f"single:{d}" for d in coarsest.device_names] + list(BASELINE_NAMES)]
    found = [c for c in candidates if c is not None]
    return min(found, key=lambda c: rank(coarsest, c.placement)) if found else None


def _project(problem: Problem, levels: list[tuple[Problem, dict[str, str]]], start: Solution) -> Solution | None:
    """The finest level's start on the coarsest level, if every group's members agree on a device
    (otherwise the coarsest level starts cold)."""
    group_of = {n: n for n in problem.nodes}
    for coarse, mapping in reversed(levels):
        group_of = {n: mapping[g] for n, g in group_of.items()}
    coarsest = levels[0][0]
    device: dict[str, str] = {}
    for n, g in group_of.items():
        d = start.placement.device[n]
        if device.setdefault(g, d) != d:
            return None
    streamed = {g: coarsest.host for n, g in group_of.items() if n in start.placement.streamed
                and g in coarsest.streamable and device[g] != coarsest.host}
    return Solution(start.solver, Placement(device, streamed, StreamMode.PREFETCH), start.status, seconds=start.seconds)
