"""Run a :class:`~partitioner.solvers.milp.Milp` on HiGHS (highspy), as a MIP or as its LP relaxation.

In: the program, a time limit, a relative gap, an optional start vector and progress callback.
Out: a :class:`RunResult` with HiGHS's status, the incumbent's values and objective (model units)
and the proven bound.

With a start and ``proof_seconds``, two runs share the work: a *proving* run, with HiGHS's
sub-MIP heuristics (RINS, RENS, root reduced-cost: small MIPs solved to find a better
incumbent) off, so that from a good start the solver spends its time on the bound, and a
*searching* run with them on. The answer is the better incumbent of the two and the larger of
their bounds (both are proven). Measured on the finest levels of ``bench/solve_scaling.py``'s
slowest rows (the level's model and start saved, HiGHS alone, 1% gap): sub-MIPs on took 10.6 /
4.3 / 4.7 / 2.4 s (the MoE decoder on cpu-gpu-npu, bart-base on cpu-gpu-npu, bert-base and
t5-base on two H200s; 11 sub-MIPs were 2.5 of bart's 3.7 s), off 6.8 / 1.1 / 0.35 / 0.44 s; on
the 1,000-op random DAG, whose start is far from the optimum, the sub-MIPs found every better
incumbent (50 s: 2.8% gap with them, 8.9% without). The searching run gives HiGHS's primal
heuristics more of its work (``SEARCH_EFFORT``, ``mip_heuristic_effort`` 0.3 against the
default 0.05; the 60 s runs of the 1,000- and 3,000-op DAGs reached: default 2.3% / 3.0% at the
limit; 0.15: 1% in 53.7 s / 1.5%; 0.3: 1% in 43.5 s / 1% in 47.6 s; 0.5: 2.3% / 2.0%; the same
effort on the coarse levels made the 1,000-op DAG worse, so they keep the default), and drops
the program's ordering rows (``Milp.without_ordering``: symmetry-breaking rows, which keep the
optimum but can forbid a sub-MIP's improving move); the proving run's bound stays valid for it.

Where the process may use two cores the runs go side by side (:class:`SideBySide`), one thread
each (highspy lets go of Python's lock while HiGHS works): each posts its incumbent and bound on
a shared :class:`_Board` at every MIP check, and all stop as soon as the best incumbent and the
best bound prove the gap, or the proving run ends. A run beside another is about as fast as
alone (the MoE decoder's finest level: proving run 4.5 s alone, 4.6-4.9 s beside the searching
run), and a gap that only the two together prove comes sooner: ``bench/solve_scaling.py --seeds
3``, seconds by seed, one after the other -> side by side: the 1,000-op DAG 43.1 / 58.3 / 54.9
(2 of 3 seeds at 1% in 60 s) -> 57.0 / 37.8 / 56.6 (3 of 3), the 3,000-op DAG 0 of 3 -> 1 of 3.

The searching run starts only after ``SEARCH_AFTER`` seconds, so that a proof that comes soon is
not kept waiting for a sub-MIP to end (HiGHS asks no callback inside one). Until then its thread
runs a second proving run under another seed (``RACE_SEED``): how long a branch and bound takes
to a gap depends on its seed far more than on anything else (the MoE decoder's finest level, one
proving run under seeds 0-11: 3.8 to over 15 s, median 6.1 s; two seeds side by side: 3.8 to 7.7
s, median 4.7 s), and the two runs share the board. ``bench/solve_scaling.py --seeds 3``, the
thread idle until the search -> the second proving run: the MoE decoder on cpu-gpu-npu 5.5 /
10.7 / 13.9 -> 5.6 / 9.9 / 5.1 s, the 1,000-op DAG 55.5 / 43.4 / 42.3 -> 30.4 / 45.8 / 43.8 s,
every other row within 0.4 s.

A better start found elsewhere while the runs go on (the coarse levels of
:mod:`~partitioner.solvers.multilevel`, solved beside the finest level's proof) is
:meth:`SideBySide.offer`-ed: the board keeps the best offer, and each run takes it as an
incumbent at its next user-solution callback *after its root node*. When it arrives matters:
the MoE decoder's finest level from the coarse levels' start, its optimum handed to the proving
run at 0-0.6 s (during the root) took 5.3-20 s to 1% over seeds 0-4, at the first callback after
the root 3.2-4.5 s over seeds 0-6 (and from the optimum as the start itself 10-23 s). An offer no
run took up still counts as an incumbent of the answer. On one core the runs go one after the
other: the proving run first, for ``proof_seconds``, and if the gap is not reached the searching
run from its incumbent for the time left.

The answer is checked before it is returned: the values read back must reproduce the objective
HiGHS reports and satisfy every row. HiGHS 1.16 can hand back the *start* vector while reporting
the objective of a better incumbent it found in presolve's reduced space (seen on small pinned
models); when that happens the solve is repeated without presolve in the time left, so the
placement read back is the one the objective belongs to.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from partitioner.solvers.milp import Milp

log = logging.getLogger(__name__)

#: A solution must reproduce the reported objective within this relative tolerance, and break no
#: row by more than FEASIBILITY (relative to the row's numbers), to be accepted.
OBJECTIVE_TOLERANCE = 1e-6
FEASIBILITY = 1e-6

#: HiGHS's heuristics that solve sub-MIPs, off in the proving run of a run from a start.
SUB_MIP_HEURISTICS = ("mip_heuristic_run_rins", "mip_heuristic_run_rens", "mip_heuristic_run_root_reduced_cost")
#: The searching run's ``mip_heuristic_effort`` (HiGHS's default: 0.05): its job is a better incumbent.
SEARCH_EFFORT = 0.3
#: Side by side, the searching run starts once the proving run has had this many seconds (at most
#: half the limit) without proving the gap. A searching run cannot be stopped at once: HiGHS asks
#: no callback inside a sub-MIP, so after the proof it went on for up to a step (t5-base on two
#: H200s: proof at 0.4 s, answer at 2.1 s; the MoE decoder on cpu-gpu-npu: 4.7 -> 5.1-5.4 s).
#: Most finest levels are proven within 5 s from the coarse levels' start and never start it.
SEARCH_AFTER = 5.0
#: HiGHS's ``random_seed`` for every run. How long a branch and bound takes to a gap can depend on
#: it more than on anything else (the MoE decoder's finest level: 4.2 to 8.2 s over seeds 0-3), so
#: ``bench/solve_scaling.py --seeds K`` runs each row under seeds 0..K-1.
SEED = 0
#: Side by side, the second thread's proving run (until ``SEARCH_AFTER``) uses ``SEED + RACE_SEED``,
#: any seed far from those of ``bench/solve_scaling.py --seeds K``; it runs only when at least
#: ``MIN_RACE`` seconds are left before the search (a shorter run would not get past its root).
RACE_SEED = 7919
MIN_RACE = 0.5
#: ... and it starts only once the proving run has had ``RACE_AFTER`` seconds: most proofs end sooner,
#: and a second run started beside a quick one kept the answer waiting for its presolve and root LP.
RACE_AFTER = 0.5


@dataclasses.dataclass(frozen=True)
class Progress:
    """A solver progress report: elapsed seconds, best objective found, best bound, relative gap
    (objective and bound in the caller's units, see ``scale`` in :func:`run_highs`)."""

    seconds: float
    incumbent: float | None
    bound: float | None
    gap: float | None


ProgressFn = Callable[[Progress], None]


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What a MIP run produced (objective and bound in model units)."""

    state: str                      # "optimal" (the requested gap proven) | "stopped" | "infeasible" | "error"
    values: list[float] | None      # the incumbent, one value per column
    objective: float | None
    bound: float | None
    note: str = ""


def available() -> bool:
    """Whether highspy can be imported."""
    try:
        import highspy  # noqa: F401
    except ImportError:
        return False
    return True


_STDOUT = threading.Lock()  # two runs side by side must not interleave their saves and restores of fd 1


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """HiGHS prints a banner on stdout when created; keep the CLI's stdout clean (e.g. --json)."""
    with _STDOUT:
        try:
            fd = os.dup(1)
        except OSError:
            yield
            return
        try:
            with open(os.devnull, "w") as null:
                os.dup2(null.fileno(), 1)
                yield
        finally:
            os.dup2(fd, 1)
            os.close(fd)


def _lp(milp: Milp, relax: bool):  # noqa: ANN202 - a highspy.HighsLp
    import highspy

    lp = highspy.HighsLp()
    lp.num_col_ = milp.num_cols
    lp.num_row_ = milp.num_rows
    lp.col_cost_ = np.asarray(milp.cost, dtype=float)
    lp.col_lower_ = np.asarray(milp.lower, dtype=float)
    lp.col_upper_ = np.asarray(milp.upper, dtype=float)
    lp.row_lower_ = np.asarray(milp.row_lower, dtype=float)
    lp.row_upper_ = np.asarray(milp.row_upper, dtype=float)
    lengths, index, coef = milp.rows_csr()
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    lp.a_matrix_.index_ = index.astype(np.int32)
    lp.a_matrix_.value_ = coef
    if not relax and any(milp.integer):
        kinds = highspy.HighsVarType
        lp.integrality_ = [kinds.kInteger if i else kinds.kContinuous for i in milp.integer]
    return lp


def run_highs(
    milp: Milp,
    *,
    time_limit: float,
    gap: float,
    start: Sequence[float] | None = None,
    progress: ProgressFn | None = None,
    scale: float = 1.0,
    relax: bool = False,
    proof_seconds: float | None = None,
    side_by_side: bool | None = None,
) -> RunResult:
    """Solve ``milp`` (its LP relaxation when ``relax``) within ``time_limit`` seconds.

    ``scale`` converts model units to the units ``progress`` reports in (divides).
    ``proof_seconds``: with a ``start``, a run that proves first (see the module docstring): its
    two runs side by side where ``side_by_side`` (None: where the machine has two cores), else
    one after the other, the first for at most ``proof_seconds``; None: one run with HiGHS's
    defaults.

    Example:
        >>> result = run_highs(formulation.milp, time_limit=5, gap=0.01)   # doctest: +SKIP
        >>> result.state, result.objective, result.bound
    """
    if proof_seconds is None or start is None or relax or not any(milp.integer):
        return _run_checked(milp, time_limit, gap, start, progress, scale, relax, sub_mips=True)
    if side_by_side if side_by_side is not None else side_by_side_here():
        return SideBySide(milp, time_limit=time_limit, gap=gap, start=start, progress=progress, scale=scale).finish()
    started = time.perf_counter()
    first = _run_checked(milp, min(proof_seconds, time_limit), gap, start, progress, scale, relax, sub_mips=False)
    left = time_limit - (time.perf_counter() - started)
    if first.state in ("optimal", "infeasible") or left <= 0.05:
        return first
    log.debug("HiGHS without sub-MIPs stopped at bound %s; searching with them for %.2f s", first.bound, left)
    later = _later(progress, time.perf_counter() - started, first.bound, scale)
    again = first.values if first.values is not None else start
    second = _run_checked(milp.without_ordering(), left, gap, again, later, scale, relax, sub_mips=True,
                          effort=SEARCH_EFFORT)
    bounds = [b for b in (first.bound, second.bound) if b is not None]
    bound = max(bounds) if bounds else None
    if second.values is None:
        return dataclasses.replace(first, bound=bound)
    return dataclasses.replace(second, bound=bound)


def side_by_side_here() -> bool:
    """Whether runs from a start go side by side here (the process may use two cores)."""
    return _cores() >= 2


def _cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class _Board:
    """What runs side by side share: the best incumbent objective and bound any has found (model
    units), whether all should stop (together they prove ``gap``, or one ended), and the best
    incumbent *offered* from outside (a vector found by other means while the runs go on)."""

    def __init__(self, gap: float, incumbent: float) -> None:
        self._lock = threading.Lock()
        self.gap = gap
        self.primal = incumbent
        self.dual = -math.inf
        self._stopped = threading.Event()
        self._offer: tuple[int, list[float] | None, float] = (0, None, math.inf)  # (version, values, objective)

    def post(self, primal: float, dual: float) -> bool:
        """Record one run's incumbent and bound; whether the runs should stop."""
        with self._lock:
            if math.isfinite(primal):
                self.primal = min(self.primal, primal)
            if math.isfinite(dual):
                self.dual = max(self.dual, dual)
            if self.primal - self.dual <= self.gap * abs(self.primal):
                self._stopped.set()
        return self._stopped.is_set()

    def offer(self, values: list[float], objective: float) -> bool:
        """Keep ``values`` (objective ``objective``) for the runs if it beats every offer so far;
        whether it did."""
        with self._lock:
            version, _, best = self._offer
            if objective >= best:
                return False
            self._offer = (version + 1, values, objective)
        self.post(objective, -math.inf)
        return True

    def offered(self) -> tuple[int, list[float] | None, float]:
        """The best offer: (how many offers were kept so far, its values, its objective)."""
        with self._lock:
            return self._offer

    def stop(self) -> None:
        self._stopped.set()

    def stopped(self) -> bool:
        return self._stopped.is_set()

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for a run to stop the board; whether one did."""
        return self._stopped.wait(seconds)

    def figures(self) -> tuple[float, float]:
        with self._lock:
            return self.primal, self.dual


class SideBySide:
    """A proving run that starts at once in its own thread, better incumbents offered to it while
    it runs (:meth:`offer`), and :meth:`finish`, which adds the second run and returns the answer
    of all of them (see the module docstring).

    Example:
        >>> runs = SideBySide(milp, time_limit=60, gap=0.01, start=vector)   # doctest: +SKIP
        >>> runs.offer(better_vector)   # found meanwhile, by other means
        >>> result = runs.finish()
    """

    def __init__(self, milp: Milp, *, time_limit: float, gap: float, start: Sequence[float],
                 progress: ProgressFn | None = None, scale: float = 1.0) -> None:
        self.milp, self.time_limit, self.gap, self.start = milp, time_limit, gap, list(start)
        self.progress, self.scale = progress, scale
        self.started = time.perf_counter()
        self.board = _Board(gap, milp.objective_of(start))
        self.results: dict[str, RunResult | BaseException] = {}
        self.threads = [self._thread("proof", self._prove)]

    def _thread(self, name: str, target: Callable[[], None]) -> threading.Thread:
        def work() -> None:
            try:
                target()
            except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
                self.results[name] = exc
                self.board.stop()

        thread = threading.Thread(target=work, name=f"highs-{name}", daemon=True)
        thread.start()
        return thread

    def _prove(self) -> None:
        self.results["proof"] = _run_checked(self.milp, self.time_limit, self.gap, self.start, None, self.scale,
                                             False, sub_mips=False, board=self.board)
        self.board.stop()  # it ended (proved the gap, or could not go on): the others stop too

    def _second(self) -> None:
        """A second proving run under another seed until ``SEARCH_AFTER`` seconds, then the searching run."""
        board, milp = self.board, self.milp
        if board.wait(max(RACE_AFTER - (time.perf_counter() - self.started), 0.0)):
            return  # the proving run ended first (most do within RACE_AFTER): nothing left to do
        wait = min(SEARCH_AFTER, self.time_limit / 2) - (time.perf_counter() - self.started)
        if wait >= MIN_RACE:
            second = _run_checked(milp, wait, self.gap, self.best_start(), None, self.scale, False, sub_mips=False,
                                  board=board, seed=SEED + RACE_SEED)
            self.results["proof2"] = second
            if second.state in ("optimal", "infeasible"):
                board.stop()
        elif board.wait(max(wait, 0.0)):
            return
        left = self.time_limit - (time.perf_counter() - self.started)
        if board.stopped() or left <= 0.05:
            return
        self.results["search"] = _run_checked(milp.without_ordering(), left, self.gap, self.best_start(), None,
                                              self.scale, False, sub_mips=True, effort=SEARCH_EFFORT, board=board)
        board.stop()

    def best_start(self) -> list[float]:
        """The best vector known here: the start, an offer, or the second proving run's incumbent."""
        options = [(self.milp.objective_of(self.start), self.start)]
        _, values, objective = self.board.offered()
        if values is not None:
            options.append((objective, values))
        second = self.results.get("proof2")
        if isinstance(second, RunResult) and second.values is not None and second.objective is not None:
            options.append((second.objective, second.values))
        return min(options, key=lambda o: o[0])[1]

    def offer(self, values: Sequence[float]) -> bool:
        """A better start found while the runs go on: the runs take it at their next chance after
        their root node (see ``_attach_callbacks``). Whether it was better than every earlier offer
        (a vector that breaks a row is refused)."""
        values = list(values)
        if self.milp.violation(values) > FEASIBILITY:
            log.debug("an offered start breaks a row by %.3g; ignored", self.milp.violation(values))
            return False
        return self.board.offer(values, self.milp.objective_of(values))

    def done(self) -> bool:
        """Whether the runs have stopped (the gap is proven, or the proving run ended)."""
        return self.board.stopped()

    def cancel(self) -> None:
        """Stop the runs and wait for them (the caller gave up: an error, an interrupt)."""
        self.board.stop()
        for thread in self.threads:
            thread.join()

    def finish(self) -> RunResult:
        """Start the second run, wait for all, and return the better incumbent with the larger bound."""
        self.threads.append(self._thread("search", self._second))
        board, scale, progress = self.board, self.scale, self.progress
        try:
            while alive := [thread for thread in self.threads if thread.is_alive()]:
                # Block (or wake once a second for a report): this thread waking every 0.1 s to look
                # slowed the proving run by 20% (the MoE decoder's finest level, 4.7 -> 5.7 s).
                alive[0].join(None if progress is None else 1.0)
                if progress is not None and alive[0].is_alive():
                    primal, dual = board.figures()
                    found = math.isfinite(dual)
                    progress(Progress(time.perf_counter() - self.started, primal / scale,
                                      dual / scale if found else None,
                                      (primal - dual) / abs(primal) if found and primal else None))
        finally:
            board.stop()
            for thread in self.threads:
                thread.join()
        return self._combined()

    def _combined(self) -> RunResult:
        for outcome in self.results.values():
            if isinstance(outcome, BaseException):
                raise outcome
        runs = [run for run in self.results.values() if isinstance(run, RunResult)]
        log.debug("side by side: %s", ", ".join(f"{name} {run.state} {run.objective} / {run.bound}"
                                                for name, run in self.results.items() if isinstance(run, RunResult)))
        for run in runs:
            if run.state == "infeasible":
                return run
        proof = self.results["proof"]
        assert isinstance(proof, RunResult)
        _, values, objective = self.board.offered()
        if values is not None:  # an offer no run took up is still an incumbent
            runs.append(RunResult("stopped", values, objective, None, proof.note))
        bounds = [run.bound for run in runs if run.bound is not None]
        bound = max(bounds) if bounds else None
        found = [run for run in runs if run.values is not None and run.objective is not None]
        best = min(found, key=lambda run: run.objective) if found else proof
        gap = self.gap
        if best.objective is not None and bound is not None and best.objective - bound <= gap * abs(best.objective):
            note = "" if best.note.startswith("HiGHS stopped") else best.note  # stopped by the board, at the gap
            return dataclasses.replace(best, state="optimal", bound=bound, note=note)
        return dataclasses.replace(best, bound=bound)


def _later(progress: ProgressFn | None, offset: float, bound: float | None, scale: float) -> ProgressFn | None:
    """``progress`` for a second run: seconds counted from the first run's start, and the first
    run's bound kept where it is the higher one."""
    if progress is None:
        return None
    known = bound / scale if bound is not None else None

    def report(p: Progress) -> None:
        bounds = [b for b in (p.bound, known) if b is not None]
        best = max(bounds) if bounds else None
        gap = (p.incumbent - best) / abs(p.incumbent) if p.incumbent and best is not None else p.gap
        progress(Progress(p.seconds + offset, p.incumbent, best, gap))

    return report


def _run_checked(milp: Milp, time_limit: float, gap: float, start: Sequence[float] | None,
                 progress: ProgressFn | None, scale: float, relax: bool, *, sub_mips: bool,
                 effort: float | None = None, board: _Board | None = None, seed: int | None = None) -> RunResult:
    """One run, its answer checked (see the module docstring)."""
    started = time.perf_counter()
    result = _run_once(milp, time_limit, gap, start, progress, scale, relax, presolve=True, sub_mips=sub_mips,
                       effort=effort, board=board, seed=seed)
    if result.state in ("optimal", "stopped") and result.values is not None and not _consistent(milp, result):
        left = time_limit - (time.perf_counter() - started)
        log.info("HiGHS returned values that do not match its objective %.6g; solving again without presolve",
                 result.objective)
        again = _run_once(milp, max(left, 0.5), gap, start, progress, scale, relax, presolve=False, sub_mips=sub_mips,
                          effort=effort, board=board, seed=seed)
        if again.values is not None and _consistent(milp, again):
            bounds = [b for b in (result.bound, again.bound) if b is not None]  # both are valid
            return dataclasses.replace(again, bound=max(bounds) if bounds else None)
        note = "HiGHS's values did not match its objective; the start is kept"
        if start is None:
            return RunResult("error", None, None, result.bound, note)
        return RunResult("stopped", list(start), milp.objective_of(start), result.bound, note)
    return result


def _consistent(milp: Milp, result: RunResult) -> bool:
    values = result.values
    assert values is not None
    own = milp.objective_of(values)
    close = abs(own - (result.objective or 0.0)) <= OBJECTIVE_TOLERANCE * max(1.0, abs(own))
    return close and milp.violation(values) <= FEASIBILITY


def _run_once(milp: Milp, time_limit: float, gap: float, start: Sequence[float] | None,
              progress: ProgressFn | None, scale: float, relax: bool, *, presolve: bool, sub_mips: bool,
              effort: float | None = None, board: _Board | None = None, seed: int | None = None) -> RunResult:
    import highspy

    with _quiet_stdout():
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    h.setOptionValue("random_seed", SEED if seed is None else seed)
    h.setOptionValue("time_limit", float(max(time_limit, 0.05)))
    h.setOptionValue("mip_rel_gap", float(gap))
    h.setOptionValue("presolve", "on" if presolve else "off")
    for name in () if sub_mips else SUB_MIP_HEURISTICS:
        h.setOptionValue(name, False)
    if effort is not None:
        h.setOptionValue("mip_heuristic_effort", float(effort))
    h.passModel(_lp(milp, relax))
    if start is not None and not relax:
        sol = highspy.HighsSolution()
        sol.col_value = list(start)
        sol.value_valid = True
        h.setSolution(sol)
    _attach_callbacks(h, time.perf_counter() + time_limit, None if relax else progress, scale, board)
    h.run()
    status = h.getModelStatus()
    info = h.getInfo()
    statuses = highspy.HighsModelStatus
    if status in (statuses.kInfeasible, statuses.kUnboundedOrInfeasible):
        return RunResult("infeasible", None, None, None, "HiGHS proved the model infeasible")
    has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
    values = list(h.getSolution().col_value) if has_solution else None
    objective = float(info.objective_function_value) if has_solution else None
    if relax:
        if status == statuses.kOptimal:
            return RunResult("optimal", values, objective, objective)
        return RunResult("error", None, None, None, f"HiGHS stopped the LP: {h.modelStatusToString(status)}")
    if not any(milp.integer):  # an LP (every node pinned, say): HiGHS reports no MIP bound, 0 or inf
        bound = objective if status == statuses.kOptimal else None
    else:
        bound = float(info.mip_dual_bound) if math.isfinite(info.mip_dual_bound) else None
    if status == statuses.kOptimal:
        if bound is None and objective is not None:  # no integers left after presolve: an LP
            bound = objective
        return RunResult("optimal", values, objective, bound)
    return RunResult("stopped", values, objective, bound, f"HiGHS stopped: {h.modelStatusToString(status)}")


def _attach_callbacks(h, deadline: float, progress: ProgressFn | None, scale: float,  # noqa: ANN001
                      board: _Board | None = None) -> None:
    """Interrupt HiGHS at ``deadline`` (perf_counter seconds) and report ``progress`` about once a second.

    HiGHS checks its time limit, and asks its MIP interrupt callback, only between steps of its
    search; one step can be long: on a 1,000-op DAG (16,000 rows) a round of cuts at the root took
    1.6 s after a root LP that ended just inside a 2 s limit, and the run returned at 3.4 s; on a
    3,000-op DAG rounds of cuts took 5-7 s each (a sub-MIP inside one), and a 51 s limit ended at
    53 s. So the MIP callback stops the search at the last check after which a step as long as
    the longest one so far (between two checks, or from the start to the first) would pass the
    deadline; the simplex and interior-point callbacks (iterations of a plain LP) stop at the
    deadline itself. The incumbent and the dual bound stay valid after an interrupt.

    With a ``board`` (a run beside another), each MIP check also posts the run's incumbent and
    bound there and stops when the board says so. Such a run has no simplex or interior-point
    callback: those are asked at every LP iteration, and two runs taking Python's lock that often
    slowed each other by 40% (the MoE decoder's finest level, 4.6 s alone, took 6.6 s beside a
    second run; asked in the searching run only, they did not stop it sooner either: t5-base on
    two H200s, its step after the proof ended at 2.1 s both ways); HiGHS's own time limit, set to
    the same deadline, bounds the LPs inside a MIP.
    """
    import highspy

    started = time.perf_counter()
    last = [0.0]
    checked = [started, 0.0]  # the last check, the longest step between two checks
    kinds = highspy.cb.HighsCallbackType

    taken = [0]  # the board's offers this run has seen

    def on_event(callback_type, message, data_out, data_in, user_data):  # noqa: ANN001, ARG001
        now = time.perf_counter()
        if callback_type == kinds.kCallbackMipUserSolution:
            assert board is not None
            version, values, objective = board.offered()
            if version > taken[0] and data_out.mip_node_count > 0 and objective < data_out.mip_primal_bound:
                taken[0] = version
                data_in.setSolution(np.asarray(values, dtype=float))
                log.debug("a run took the offered start %.9g (its own incumbent: %.9g)", objective,
                          data_out.mip_primal_bound)
            return
        if callback_type == kinds.kCallbackMipInterrupt:
            checked[1], checked[0] = max(checked[1], now - checked[0]), now
            if now + checked[1] >= deadline:
                data_in.user_interrupt = True
            if board is not None and board.post(data_out.mip_primal_bound, data_out.mip_dual_bound):
                data_in.user_interrupt = True
        elif now >= deadline:
            data_in.user_interrupt = True
        if progress is None or callback_type != kinds.kCallbackMipInterrupt or now - started - last[0] < 1.0:
            return
        last[0] = now - started
        primal, dual, gap = data_out.mip_primal_bound, data_out.mip_dual_bound, data_out.mip_gap
        progress(Progress(
            now - started,
            float(primal) / scale if math.isfinite(primal) else None,
            float(dual) / scale if math.isfinite(dual) else None,
            float(gap) if math.isfinite(gap) else None,
        ))

    h.setCallback(on_event, None)
    lp_kinds = (kinds.kCallbackMipUserSolution,) if board is not None else (
        kinds.kCallbackSimplexInterrupt, kinds.kCallbackIpmInterrupt)
    for kind in (kinds.kCallbackMipInterrupt, *lp_kinds):
        h.startCallback(kind)
