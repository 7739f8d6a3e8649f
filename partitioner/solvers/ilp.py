"""``solve_ilp``: the placement ILP, built, scaled, solved on HiGHS or CBC, and checked.

In: a :class:`~partitioner.solvers.problem.Problem`, limits and an optional warm start. Out: a
:class:`~partitioner.solvers.problem.Solution` whose ``objective`` is the solver's value of its
placement (checked against :func:`~partitioner.solvers.problem.evaluate`) and whose ``bound`` is
the solver's proven lower bound, both in seconds.

The model is :mod:`partitioner.solvers.formulation` (the rows, once), or for pipeline stages
(``Options.pipeline``) :mod:`partitioner.solvers.pipeline_formulation`; this module chooses the
units and runs a back end: :mod:`~partitioner.solvers.highs` (highspy) or
:mod:`~partitioner.solvers.cbc` (PuLP's CBC, the only module that imports pulp).

Numerics. Solvers' tolerances are absolute (about 1e-6 to 1e-9) and HiGHS reads 1e20 as
infinity, so the numbers must stay in a sane range whatever the profile says:

* time is written in units that put the reference cost (the warm start's objective, else the
  physical lower bound) near ``REFERENCE``; memory in megabytes;
* an option that alone would cost more than the warm start's whole objective (a node on a
  device with a launch of 1e9 s, a copy over a link of 1e-10 B/s) cannot be in a better
  placement, so it is left out of the model (``Formulation.cutoff``): the model keeps every
  placement at least as good as the warm start, and its coefficients stay within a factor
  ``REFERENCE`` of the objective;
* without a warm start, the time unit shrinks until the largest coefficient is at most
  ``MAX_COEFFICIENT``.
"""

from __future__ import annotations

import logging
import math
import time

from partitioner.errors import HetpartError, SolverUnavailable
from partitioner.solvers import cbc, highs
from partitioner.solvers.bounds import physical_lower_bound
from partitioner.solvers.formulation import Formulation, Units
from partitioner.solvers.highs import Progress, ProgressFn, RunResult
from partitioner.solvers.makespan import MAX_NODES as MAKESPAN_MAX_NODES
from partitioner.solvers.milp import BuildTimeout
from partitioner.solvers.pipeline_formulation import PipelineFormulation
from partitioner.solvers.problem import Placement, Problem, Solution, Status, evaluate

__all__ = ["MAKESPAN_MAX_NODES", "Progress", "ProgressFn", "RunningIlp", "available_solvers", "resolve_solver",
           "solve_ilp", "start_ilp", "status_for_gap"]

log = logging.getLogger(__name__)

REFERENCE = 1e4          # model time units of the reference cost
MAX_COEFFICIENT = 1e12   # the largest time coefficient allowed without a warm start
OPTIMAL_GAP = 1e-6       # a relative gap this small is "optimal"
AGREEMENT = 1e-6         # relative difference allowed between the solver's objective and evaluate()
PROOF_SHARE = 0.5        # HiGHS from a warm start: this share of the time without sub-MIP heuristics first,
PROOF_MOST = 14.0        # ... and at most this many seconds (see solve_ilp's proof_first)


def available_solvers() -> list[str]:
    """Names of the ILP solvers installed here (``"highs"``, ``"cbc"``)."""
    return [name for name, ok in (("highs", highs.available()), ("cbc", cbc.available())) if ok]


def resolve_solver(name: str) -> str:
    """``"auto"`` → HiGHS when highspy is installed, else CBC; checks that the solver exists."""
    have = available_solvers()
    if name == "auto":
        if not have:
            raise SolverUnavailable("no ILP solver is installed: pip install highspy (or PuLP's bundled CBC)")
        return have[0]
    if name not in ("highs", "cbc"):
        raise SolverUnavailable(f"unknown ILP solver {name!r}: use 'highs', 'cbc' or 'auto'")
    if name not in have:
        hint = "pip install highspy" if name == "highs" else "reinstall PuLP, which bundles CBC"
        raise SolverUnavailable(f"the {name} solver is not available here: {hint}")
    return name


def status_for_gap(gap: float | None, requested: float) -> Status:
    """The words for a proven gap: "optimal" (about 0), "within gap" (at most the requested gap)
    or "time limit" (the solver stopped further away, or proved nothing).

    Example:
        >>> status_for_gap(0.004, 0.01).value
        'within gap'
    """
    if gap is None or not math.isfinite(gap):
        return Status.TIME_LIMIT
    if gap <= OPTIMAL_GAP:
        return Status.OPTIMAL
    if gap <= requested * (1 + 1e-9) + 1e-12:
        return Status.WITHIN_GAP
    return Status.TIME_LIMIT


def relative_gap(objective: float | None, bound: float | None) -> float | None:
    """``(objective - bound) / objective`` (0 when both are 0); None when either is unknown."""
    if objective is None or bound is None or not math.isfinite(objective) or not math.isfinite(bound):
        return None
    if objective <= 0:
        return 0.0 if bound >= objective else None
    return max(0.0, (objective - bound) / objective)


def check_limits(time_limit: float, gap: float) -> None:
    """Refuse a time limit that is not a positive number of seconds and a gap that is negative
    or not a number (the last guard; the CLI and ``partition`` check their own arguments)."""
    if not isinstance(time_limit, (int, float)) or not math.isfinite(time_limit) or time_limit <= 0:
        raise HetpartError(f"time_limit must be a positive number of seconds, not {time_limit!r}")
    if not isinstance(gap, (int, float)) or not math.isfinite(gap) or gap < 0:
        raise HetpartError(f"gap must be a relative gap >= 0 (0.01 for 1%), not {gap!r}")


def solve_ilp(
    problem: Problem,
    *,
    solver: str = "auto",
    time_limit: float = 60.0,
    gap: float = 0.01,
    warm_start: Placement | None = None,
    progress: ProgressFn | None = None,
    proof_first: bool = True,
    build_by: float | None = None,
) -> Solution:
    """Solve the placement ILP for ``problem`` within ``time_limit`` seconds, building included.

    Parameters:
        solver: ``"highs"``, ``"cbc"`` or ``"auto"``.
        time_limit: seconds for everything this call does; a feasible incumbent at the limit is
            returned with its gap.
        gap: relative optimality gap at which the solver stops.
        warm_start: a feasible placement to start from (the best baseline); it also bounds the
            model (options dearer than it are left out) and sets its units. Without one, the best
            feasible of HEFT and the single-device placements is used.
        progress: called about once a second with the incumbent and bound (HiGHS only).
        proof_first: HiGHS from a warm start runs a proving run (sub-MIP heuristics off) and a
            searching run (on), side by side on two cores
            (:func:`~partitioner.solvers.highs.run_highs`); on one core the proving run goes
            first, for ``PROOF_SHARE`` of the time and at most ``PROOF_MOST`` seconds, then the
            searching run from its incumbent if the gap is not reached. The cap: a proof that has
            not come in 14 s needs a better incumbent, which the sub-MIPs find (the 1,000-op
            random DAG of ``bench/solve_scaling.py``: 6.6% gap in 60 s with half the time spent
            without them, 2.2% with none). 14 s rather than 8 s since the stream-order rows
            (``bench/solve_scaling.py --seeds 3``, one after the other): the MoE decoder on
            cpu-gpu-npu 7.2 / 51.2 / 25.3 s -> 6.6 / 10.3 / 14.4 s (its finest level alone, 8 s
            proving runs under seeds 1-3 stopped at bounds 9,297-9,315 where 9,690 was needed),
            the 1,000-op DAG at 1% under 2 of 3 seeds either way, the 3,000-op DAG 1 -> 0 of 3
            (3.1% at the limit); 20 s: the MoE decoder 6.5 / 8.3 / 15.1 s.
            False: one run with HiGHS's defaults.
        build_by: the ``time.perf_counter()`` by which the model must be built (default: the
            end of ``time_limit``); a build still going then is given up (status "time limit",
            the warm start kept, no bound), so a large model begun just before a deadline does
            not run past it. A coarse level of :mod:`~partitioner.solvers.multilevel` passes the
            whole solve's deadline here, its own share only to the solver.

    Returns:
        A Solution: ``status`` says "optimal" (proven gap about 0), "within gap" or "time limit";
        ``bound`` is a proven lower bound on the objective of every placement of ``problem``;
        ``objective`` is the solver's value of its placement, equal to ``evaluate``'s.

    Raises:
        HetpartError: a time limit that is not positive, or a gap that is negative or not a number.

    Example:
        >>> sol = solve_ilp(problem, time_limit=10, gap=0.0)   # doctest: +SKIP
        >>> sol.status, sol.bound
    """
    check_limits(time_limit, gap)
    name = resolve_solver(solver)
    start = time.perf_counter()
    try:
        model, warm_start, start_vector = _build(problem, warm_start, start + time_limit if build_by is None
                                                 else build_by)
    except BuildTimeout as out:
        return _unbuilt(problem, warm_start, f"ilp:{name}", out, time.perf_counter() - start)
    left = time_limit - (time.perf_counter() - start)
    if name == "highs":
        run = highs.run_highs(model.milp, time_limit=max(left, 0.05), gap=gap, start=start_vector,
                              progress=progress, scale=model.units.time,
                              proof_seconds=min(PROOF_SHARE * left, PROOF_MOST) if proof_first else None)
    else:
        run = cbc.run_cbc(model.milp, time_limit=max(left, 0.05), gap=gap, start=start_vector)
    return _solution(problem, model, run, f"ilp:{name}", warm_start, gap, time.perf_counter() - start)


def _unbuilt(problem: Problem, warm_start: Placement | None, name: str, out: BuildTimeout, seconds: float) -> Solution:
    """The answer of a solve whose model was not built in time: the warm start, if it fits, and no bound."""
    log.info("%s for %s: %s", name, problem.graph.name, out)
    return _kept_start(problem, name, warm_start, None, seconds, str(out))


def _kept_start(problem: Problem, name: str, warm_start: Placement | None, bound: float | None, seconds: float,
                note: str) -> Solution:
    """A "time limit" answer with no incumbent of the solver's own: ``warm_start`` where it fits
    (its objective evaluated, the note saying it is kept), else no placement."""
    if warm_start is not None and (ev := evaluate(problem, warm_start)).feasible:
        return Solution(name, warm_start, Status.TIME_LIMIT, bound, seconds, f"{note}; keeping the start", ev.total_s)
    return Solution(name, Placement({}), Status.TIME_LIMIT, bound, seconds, f"{note}; no placement")


def _build(problem: Problem, warm_start: Placement | None,
           deadline: float | None = None) -> tuple[Formulation, Placement | None, list[float] | None]:
    """The model of ``problem`` in units (and under a cutoff) set by the warm start (or a quick one),
    the warm start kept (None if it does not fit) and its value vector.

    Raises:
        BuildTimeout: the model was still being built at ``deadline`` (``time.perf_counter()``).
    """
    started = time.perf_counter()
    incumbent = None
    if warm_start is None:
        warm_start = _quick_start(problem)
    if warm_start is not None:
        ev = evaluate(problem, warm_start)
        incumbent = ev.total_s if ev.feasible and math.isfinite(ev.total_s) else None
        if incumbent is None:
            warm_start = None
    units = _units(problem, incumbent)
    if problem.options.pipeline is not None:
        model: Formulation = PipelineFormulation(problem, units, cutoff=incumbent, deadline=deadline)
    else:
        model = Formulation(problem, units, cutoff=incumbent, deadline=deadline)
    start_vector = model.start_values(model.canonical(warm_start)) if warm_start is not None else None
    log.debug("ILP for %s: %d columns, %d rows, built in %.2f s", problem.graph.name, model.milp.num_cols,
              model.milp.num_rows, time.perf_counter() - started)
    return model, warm_start, start_vector


class RunningIlp:
    """The ILP of a problem whose HiGHS proving run is already going (on a machine with two cores,
    see :class:`~partitioner.solvers.highs.SideBySide`): better placements found meanwhile are
    :meth:`offer`-ed to it, and :meth:`finish` returns the Solution ``solve_ilp`` would.

    Example:
        >>> running = start_ilp(problem, warm_start=placement, time_limit=5)   # doctest: +SKIP
        >>> running.offer(better_placement)
        >>> sol = running.finish()
    """

    def __init__(self, problem: Problem, model: Formulation, warm_start: Placement | None, start_vector: list[float],
                 *, started: float, time_limit: float, gap: float, progress: ProgressFn | None) -> None:
        self.problem, self.model, self.warm_start, self.gap, self.started = problem, model, warm_start, gap, started
        left = time_limit - (time.perf_counter() - started)
        self.runs = highs.SideBySide(model.milp, time_limit=max(left, 0.05), gap=gap, start=start_vector,
                                     progress=progress, scale=model.units.time)

    def offer(self, placement: Placement) -> bool:
        """A placement found while the solver runs: the runs take it as an incumbent if it is better
        than every earlier offer and fits (whether it was taken)."""
        if not placement.device or not evaluate(self.problem, placement).feasible:
            return False
        return self.runs.offer(self.model.start_values(self.model.canonical(placement)))

    def done(self) -> bool:
        """Whether the runs have already stopped (the gap proven, or the proving run ended)."""
        return self.runs.done()

    def cancel(self) -> None:
        """Stop the runs and wait for them (the caller gave up)."""
        self.runs.cancel()

    def finish(self) -> Solution:
        """Wait for the runs (adding the second one) and return the Solution of the ILP."""
        run = self.runs.finish()
        return _solution(self.problem, self.model, run, "ilp:highs", self.warm_start, self.gap,
                         time.perf_counter() - self.started)


def start_ilp(problem: Problem, *, warm_start: Placement, time_limit: float = 60.0, gap: float = 0.01,
              progress: ProgressFn | None = None) -> RunningIlp | None:
    """Build the ILP of ``problem`` and start its HiGHS proving run in the background, where HiGHS
    is installed, two cores are free and ``warm_start`` fits; None otherwise (then call
    :func:`solve_ilp`). Limits as in :func:`solve_ilp`, counted from this call."""
    check_limits(time_limit, gap)
    if "highs" not in available_solvers() or not highs.side_by_side_here():
        return None
    started = time.perf_counter()
    try:
        model, kept, start_vector = _build(problem, warm_start, started + time_limit)
    except BuildTimeout as out:
        log.info("ilp:highs for %s: %s", problem.graph.name, out)
        return None
    if kept is None or start_vector is None or not any(model.milp.integer):
        return None
    return RunningIlp(problem, model, kept, start_vector, started=started, time_limit=time_limit, gap=gap,
                      progress=progress)


def _quick_start(problem: Problem) -> Placement | None:
    """A start when the caller gives none: the best feasible of HEFT (pipelines: the stage
    dynamic program) and every single device. It bounds the model (and so its numbers) as a
    caller's warm start would."""
    from partitioner.solvers.heft import solve_heft
    from partitioner.solvers.pipeline_dp import solve_pipeline_dp
    from partitioner.solvers.single import solve_single

    first = solve_pipeline_dp(problem) if problem.options.pipeline is not None else solve_heft(problem)
    best, best_total = None, math.inf
    for sol in [first] + [solve_single(problem, d) for d in problem.device_names]:
        if not sol.placement.device:
            continue
        ev = evaluate(problem, sol.placement)
        if ev.feasible and ev.total_s < best_total:
            best, best_total = sol.placement, ev.total_s
    return best


def _units(problem: Problem, incumbent: float | None) -> Units:
    """Time units that put the reference cost near REFERENCE (see the module docstring)."""
    reference = incumbent if incumbent else physical_lower_bound(problem)
    if not reference or not math.isfinite(reference) or reference <= 0:
        return Units()
    time_unit = REFERENCE / reference
    if incumbent is None:
        largest = _largest_time(problem)
        if largest * time_unit > MAX_COEFFICIENT:
            time_unit = MAX_COEFFICIENT / largest
    return Units(time=time_unit)


def _largest_time(problem: Problem) -> float:
    """The largest time any single option of ``problem`` costs (compute or one copy), seconds."""
    p = problem
    largest = max((t for n in p.nodes for per_d in p.compute_in[n].values() for t in per_d.values()), default=0.0)
    for t in p.tensors:
        for a in p.device_names:
            for b in p.device_names:
                if a != b:
                    largest = max(largest, p.transfer_s(t.bytes, a, b))
    return largest


def _solution(problem: Problem, model: Formulation, run: RunResult, name: str, warm_start: Placement | None,
              gap: float, seconds: float) -> Solution:
    tu = model.units.time
    bound = run.bound / tu if run.bound is not None else None
    if run.state == "infeasible":
        if warm_start is not None:  # the start is feasible: the solver's "infeasible" is numerical noise
            return Solution(name, warm_start, Status.TIME_LIMIT, None, seconds,
                            "the solver called the model infeasible although the warm start fits; keeping the start")
        return Solution(name, Placement({}), Status.INFEASIBLE, None, seconds, run.note)
    if run.values is None:
        return _kept_start(problem, name, warm_start, bound, seconds, f"{run.note}; no incumbent found".lstrip("; "))
    placement = model.placement(run.values)
    objective = run.objective / tu if run.objective is not None else None
    ev = evaluate(problem, placement)
    note = run.note
    slack = AGREEMENT * max(abs(ev.total_s), 1e-300) + 1e-15
    if objective is not None and ev.total_s < objective - slack and run.state != "optimal":
        objective = ev.total_s  # an incumbent stopped early need not be tight: its placement costs less
    if objective is None or abs(ev.total_s - objective) > slack:
        # the model and evaluate() disagree (a bug): say so; the status follows evaluate()
        note = (f"{note}; the solver's objective {objective!r} s differs from the evaluation "
                f"{ev.total_s!r} s of its placement").lstrip("; ")
        log.warning("%s: %s", name, note)
        start = evaluate(problem, warm_start) if warm_start is not None else None
        if start is not None and start.feasible and start.total_s < ev.total_s - slack:
            # never worse than the start it was given (a makespan schedule the model orders
            # differently from evaluate's list schedule: seed 6472 of tests/property/test_solvers.py)
            note = f"{note}; keeping the warm start, which evaluates to {start.total_s!r} s"
            placement, ev, objective = warm_start, start, start.total_s
    status = status_for_gap(relative_gap(ev.total_s, bound), gap)
    return Solution(name, placement, status, bound, seconds, note, objective)
