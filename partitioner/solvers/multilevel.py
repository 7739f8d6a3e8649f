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

On two cores, with two coarse levels or more, the finest level's proof does not wait for them
(``_beside``): the coarsest level is solved, its answer is carried down by local search alone to
a first start of the finest level, and the finest level's HiGHS proving run starts at once
(:func:`~partitioner.solvers.ilp.start_ilp`), its model cut off at that start. Meanwhile this
thread solves the finer coarse levels as above, and the last one's answer, carried to the finest
level and improved by local search, is offered to the running solver, which takes it after its
root node (:class:`~partitioner.solvers.highs.SideBySide`); then the second thread's runs start.
The proof's root and first branchings (3 s on the MoE decoder) overlap the coarse levels (1.2 s
there) instead of following them. ``bench/solve_scaling.py --seeds 3``, one level after the
other -> beside: the MoE decoder on cpu-gpu-npu 5.6 / 9.9 / 5.1 -> 4.6 / 4.7 / 6.3 s (seeds 0-11:
0 -> 6 of 12 at 1% within 5 s, median 6.1 -> 5.0 s), the 1,000-op DAG 30.4 / 45.8 / 43.8 -> 46.0 /
38.8 / 37.8 s, every other row within 0.6 s (t5-base 0.6 -> 0.9 s, 48 GPT blocks 2.8 -> 3.3 s).
Starting the proof from the best baseline instead (before any level) was slower: its model,
cut off at a start twice the optimum, took 6-15 s on the MoE decoder.
"""

from __future__ import annotations

import logging
import time

from partitioner.coarsen import auto_coarsen
from partitioner.solvers.highs import side_by_side_here
from partitioner.solvers.ilp import ProgressFn, RunningIlp, resolve_solver, solve_ilp, start_ilp
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
                 and a in finer.choices[n].get(device[n], ())  # a member may need float32
                 and (n not in streamed or a in finer.stream_forms(n, device[n]))}
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
    deadline = time.perf_counter() + time_limit
    levels = coarser_levels(problem)
    chain = [lv for lv, _ in levels] + [problem]
    maps = [m for _, m in levels]
    warm = start
    if levels:  # the warm start lives on the finest level: project it up, or start from baselines
        warm = _coarsest_start(problem, levels, start)
    if len(levels) >= 2 and resolve_solver(solver) == "highs" and side_by_side_here():
        warm = _solve_level(chain, 0, warm, deadline, solver, gap)
        if warm is not None:
            return _beside(chain, maps, warm, deadline, gap, progress)
        levels, chain, maps = [], [problem], []  # nothing fits on the coarsest level: the finest starts cold
    for i, level in enumerate(chain):
        if level is problem:
            if warm is not None:
                warm = _search(level, warm, deadline)
            placement = warm.placement if warm is not None and evaluate(level, warm.placement).feasible else None
            sol = solve_ilp(level, solver=solver, time_limit=max(deadline - time.perf_counter(), 0.05), gap=gap,
                            warm_start=placement, progress=progress, proof_first=True)
            log.info("finest level (%d nodes): %s in %.2f s", len(level.nodes), sol.status.value, sol.seconds)
            return sol, warm
        best = _solve_level(chain, i, warm, deadline, solver, gap)
        warm = _down(chain, maps, i, best) if best is not None else None
    raise AssertionError("unreachable: the last level is the problem itself")


def _search(level: Problem, warm: Solution, deadline: float) -> Solution:
    """``warm`` improved by local search on ``level`` within its share of the time left."""
    left = deadline - time.perf_counter()
    return improve(level, warm, deadline=time.perf_counter() + SEARCH_SHARE * max(left, 0.0))


def _solve_level(chain: list[Problem], i: int, warm: Solution | None, deadline: float, solver: str,
                 gap: float, *, searched: bool = False) -> Solution | None:
    """Coarse level ``i``: ``warm`` improved by local search (unless ``searched`` already), then the
    ILP within the level's share of the time; the better of the two (None if neither fits)."""
    level = chain[i]
    if warm is not None and not searched:
        warm = _search(level, warm, deadline)
    left = deadline - time.perf_counter()
    budget = LEVEL_SHARE * min(left, LEVEL_HORIZON)
    placement = warm.placement if warm is not None and evaluate(level, warm.placement).feasible else None
    sol = solve_ilp(level, solver=solver, time_limit=max(budget, 0.05), gap=gap, warm_start=placement,
                    proof_first=False, build_by=deadline)  # its share for the solver; the build may use more
    log.info("level %d (%d nodes): %s %s in %.2f s", i, len(level.nodes), sol.status.value,
             f"{sol.objective:.6g} s" if sol.objective is not None else "-", sol.seconds)
    return _better(level, sol, warm)


def _down(chain: list[Problem], maps: list[dict[str, str]], i: int, best: Solution) -> Solution:
    """Level ``i``'s answer as a placement of level ``i + 1``."""
    return Solution(best.solver, expand(chain[i + 1], maps[i], best.placement), best.status, seconds=best.seconds)


def _beside(chain: list[Problem], maps: list[dict[str, str]], coarsest: Solution, deadline: float, gap: float,
            progress: ProgressFn | None) -> tuple[Solution, Solution | None]:
    """The finest level's proving run started early, beside the finer coarse levels (two cores).

    The coarsest level's answer is carried down by local search alone to a first start of the
    finest level, whose HiGHS proving run starts at once
    (:func:`~partitioner.solvers.ilp.start_ilp`); on this thread the finer coarse levels are
    solved as usual from those local-search starts, and the last one's answer, carried to the
    finest level, is offered to the running solver (see the module docstring).
    """
    problem = chain[-1]
    starts = [coarsest]
    for i in range(len(chain) - 1):  # the coarsest answer carried down, local search at each level
        starts.append(_search(chain[i + 1], _down(chain, maps, i, starts[-1]), deadline))
    first = starts[-1]
    running = start_ilp(problem, warm_start=first.placement, time_limit=max(deadline - time.perf_counter(), 0.05),
                        gap=gap, progress=progress)  # None when the start does not fit
    if running is None:  # the start does not fit: the finest level on its own, from HEFT and single devices
        sol = solve_ilp(problem, time_limit=max(deadline - time.perf_counter(), 0.05), gap=gap, progress=progress)
        return sol, None
    try:
        best_warm = _offer_levels(chain, maps, starts, running, deadline, gap) or first
    except BaseException:
        running.cancel()  # an error or an interrupt here: leave no solver running behind
        raise
    sol = running.finish()
    log.info("finest level (%d nodes), proved beside the coarse levels: %s in %.2f s", len(problem.nodes),
             sol.status.value, sol.seconds)
    return sol, best_warm


def _offer_levels(chain: list[Problem], maps: list[dict[str, str]], starts: list[Solution], running: RunningIlp,
                  deadline: float, gap: float) -> Solution | None:
    """The finer coarse levels solved from their local-search ``starts`` while ``running`` proves
    the finest level; the last one's answer, carried down and improved, is offered to it. The
    offered placement (None if none was better than the running solver's start)."""
    problem = chain[-1]
    warm = starts[1]
    for i in range(1, len(chain) - 1):
        if running.done():
            return None
        best = _solve_level(chain, i, warm, deadline, "highs", gap, searched=warm is starts[i])
        if best is None:
            return None
        warm = _down(chain, maps, i, best)
    warm = _search(problem, warm, deadline)
    if not running.offer(warm.placement):
        return None
    log.info("finest level: the coarse levels' answer offered to the running solver")
    return warm


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
