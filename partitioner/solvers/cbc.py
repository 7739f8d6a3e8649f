"""Run a :class:`~partitioner.solvers.milp.Milp` on CBC through PuLP. The only module that imports pulp.

In: the program, a time limit, a relative gap, an optional start vector. Out: a
:class:`~partitioner.solvers.highs.RunResult` (objective and bound in model units).

PuLP writes the program as MPS and reads CBC's solution file back; the CBC process is started
here so that the time limit holds from outside as well: CBC gets ``-sec`` in wall-clock time
(``timeMode elapsed``), and if it is still running a second after that it is interrupted
(SIGINT: CBC stops and writes its incumbent) and then killed. CBC has been seen to overrun its
own limit by minutes on large models.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import tempfile
import warnings
from collections.abc import Sequence

import pulp

from partitioner.solvers.highs import FEASIBILITY, RunResult
from partitioner.solvers.milp import Milp

_BOUND = re.compile(r"^(?:Lower bound|Best possible):\s*(-?[\d.eE+]+)", re.MULTILINE)
_RESULT = re.compile(r"^Result - (.+)$", re.MULTILINE)
_UNSAFE = re.compile(r"[^A-Za-z0-9_]")
GRACE_S = 1.0  # seconds past the limit before CBC is interrupted


def _cbc() -> pulp.PULP_CBC_CMD:
    with warnings.catch_warnings():  # PuLP 3 deprecates the bundled CBC; it is the one we want
        warnings.simplefilter("ignore", DeprecationWarning)
        return pulp.PULP_CBC_CMD(msg=False)


def available() -> bool:
    """Whether PuLP's bundled CBC can run here."""
    return bool(_cbc().available())


def to_pulp(milp: Milp, name: str = "placement") -> tuple[pulp.LpProblem, list[pulp.LpVariable]]:
    """The program as a PuLP problem (names sanitised and numbered, so they stay unique)."""
    prob = pulp.LpProblem(_UNSAFE.sub("_", name)[:60] or "placement", pulp.LpMinimize)
    cols = []
    for i, col_name in enumerate(milp.names):
        lower = milp.lower[i] if math.isfinite(milp.lower[i]) else None
        upper = milp.upper[i] if math.isfinite(milp.upper[i]) else None
        cat = pulp.LpBinary if milp.integer[i] and lower == 0 and upper == 1 else (
            pulp.LpInteger if milp.integer[i] else pulp.LpContinuous)
        cols.append(prob.add_variable(f"{_UNSAFE.sub('_', col_name)[:60]}_{i}", lowBound=lower, upBound=upper, cat=cat))
    prob.setObjective(pulp.LpAffineExpression({cols[i]: c for i, c in enumerate(milp.cost) if c}))
    rows = {}
    for r, row_name in enumerate(milp.row_names):
        expr = pulp.LpAffineExpression({cols[i]: c for i, c in zip(milp.row_index[r], milp.row_value[r])})
        key = f"{_UNSAFE.sub('_', row_name)[:60]}_{r}"
        lo, hi = milp.row_lower[r], milp.row_upper[r]
        if lo == hi:
            rows[key] = pulp.LpConstraint(expr, pulp.LpConstraintEQ, rhs=lo)
            continue
        if math.isfinite(lo):
            rows[key] = pulp.LpConstraint(expr, pulp.LpConstraintGE, rhs=lo)
        if math.isfinite(hi):
            rows[key + "_le" if math.isfinite(lo) else key] = pulp.LpConstraint(expr, pulp.LpConstraintLE, rhs=hi)
    prob.extend(rows)
    return prob, cols


def run_cbc(milp: Milp, *, time_limit: float, gap: float, start: Sequence[float] | None = None) -> RunResult:
    """Solve ``milp`` with CBC within ``time_limit`` seconds of wall-clock time.

    Example:
        >>> run_cbc(formulation.milp, time_limit=5, gap=0.01).state        # doctest: +SKIP
        'optimal'
    """
    prob, cols = to_pulp(milp)
    solver = _cbc()
    limit = max(1, int(math.ceil(time_limit)))
    with tempfile.TemporaryDirectory(prefix="hetpart-cbc-") as tmp:
        mps, sol, mst, log_path = (os.path.join(tmp, f) for f in ("model.mps", "model.sol", "start.mst", "cbc.log"))
        vs, var_names, con_names, _ = prob.writeMPS(mps, rename=1)
        args = [solver.path, mps]
        if start is not None:
            for col, v in zip(cols, start):
                col.setInitialValue(v, check=False)
            solver.writesol(mst, prob, vs, var_names, con_names)
            args += ["-mips", mst]
        args += ["-sec", str(limit), "-timeMode", "elapsed", "-ratio", repr(float(gap)), "-threads", "1",
                 "-solve", "-printingOptions", "all", "-solution", sol]
        with open(log_path, "w") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=out, stdin=subprocess.DEVNULL)
            interrupted = _wait(proc, limit + GRACE_S)
        text = open(log_path).read()
        if not os.path.exists(sol):
            tail = text.strip()[-120:]
            return RunResult("error", None, None, None, f"CBC wrote no solution (exit {proc.returncode}); log ends: {tail}")
        with open(sol) as f:
            first = f.readline().strip()  # "Optimal - objective value 12", "Stopped on time - ...", "Infeasible - ..."
        _, values, *_ = solver.readsol_MPS(sol, prob, vs, var_names, con_names)
    result = _RESULT.search(text)
    result_text = result.group(1).strip() if result else first
    if interrupted:
        result_text += " (interrupted at the time limit)"
    bound_match = _BOUND.search(text)
    bound = float(bound_match.group(1)) if bound_match else None
    if first.lower().startswith("infeasible") or "infeasible" in result_text.lower():
        return RunResult("infeasible", None, None, None, f"CBC: {result_text}")
    vector = [float(values.get(c.name, 0.0) or 0.0) for c in cols]
    feasible = milp.violation(vector) <= FEASIBILITY
    objective = milp.objective_of(vector) if feasible else None
    if first.startswith("Optimal") and feasible:
        bound = objective if bound is None else min(bound, objective)
        return RunResult("optimal", vector, objective, bound)
    return RunResult("stopped", vector if feasible else None, objective, bound, f"CBC: {result_text}")


def _wait(proc: subprocess.Popen, seconds: float) -> bool:
    """Wait for CBC; interrupt it (then kill it) past ``seconds``. True if it had to be stopped."""
    try:
        proc.wait(timeout=seconds)
        return False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return True
