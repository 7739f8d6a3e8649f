"""The accuracy budget in the cost semantics: the output error a placement's packed weights are
estimated to cost, against ``precision.max_error``.

In: a :class:`~partitioner.solvers.problem.Problem` planned with ``precision`` that carries a budget
(``Precision.max_error``) and the measured error of each packed weight alone
(``Precision.weight_errors[param][dtype]``: the relative L2 error of the model's outputs with that
one weight packed, :mod:`backends.torch.weight_errors`), and the dtype each node computes in.
Out: the estimate, and the violation :func:`~partitioner.solvers.problem.evaluate` reports when it
is over the budget.

The estimate is the root sum of squares of the packed weights' own errors::

    error(placement) = sqrt( sum over ops v packing their weight in w of  e[v, w]^2 )

(rounding noise of independent weights adds in quadrature), so the ILP bounds a linear sum,
``sum_v,d,a  e2[v,a] * r[v,d,a] <= budget^2`` (:mod:`partitioner.solvers.formulation`). It is an
estimate: the planner measures the whole plan afterwards and tightens the budget it gives the
solver when the measurement is over (:mod:`partitioner.error_budget`).

Example:
    >>> estimated_error(problem, node_dtypes(problem, placement))     # doctest: +SKIP
    0.0123
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from cost_models.precision import weights
from partitioner.errors import HetpartError

if TYPE_CHECKING:
    from partitioner.solvers.problem import Problem

__all__ = ["error_squares", "estimated_error", "op_errors", "budget_violation"]


def error_squares(problem: Problem) -> dict[str, dict[str, float]]:
    """Per node, per packed choice it may make anywhere: the sum of its member ops' squared errors
    (empty without a budget). Every packable member must have been measured.

    Raises:
        HetpartError: a packable op whose weight has no measured error (the planner measures them all).
    """
    precision = problem.precision
    if precision is None or precision.max_error is None:
        return {}
    out: dict[str, dict[str, float]] = {}
    for n in problem.nodes:
        for choice in {a for per in problem.choices[n].values() for a in per if weights(a)}:
            total = 0.0
            for op in problem.members[n]:
                w = weights(problem.op_dtype(op, choice))
                if w is None:
                    continue
                param = problem.quantizable[op]
                measured = precision.weight_errors.get(param, {}).get(w)
                if measured is None:
                    raise HetpartError(f"op {op} may pack its weight {param!r} in {w}, but its error was not "
                                       f"measured: plan the model itself (with its weights), not a graph, to give "
                                       f"precision a max_error")
                total += measured * measured
            out.setdefault(n, {})[choice] = total
    return out


def estimated_error(problem: Problem, dtype: Mapping[str, str]) -> float:
    """The estimated relative output error of the nodes computing in ``dtype`` (0.0 without a budget)."""
    squares = problem.error_squares
    return math.sqrt(sum(squares.get(n, {}).get(dtype[n], 0.0) for n in problem.nodes))


def op_errors(problem: Problem, dtype: Mapping[str, str]) -> dict[str, float]:
    """Each op packing its weight under ``dtype`` -> its own measured error, largest first."""
    precision = problem.precision
    if precision is None or precision.max_error is None:
        return {}
    out: dict[str, float] = {}
    for n in problem.nodes:
        for op in problem.members[n]:
            w = weights(problem.op_dtype(op, dtype[n]))
            if w is not None:
                out[op] = precision.weight_errors.get(problem.quantizable[op], {}).get(w, math.inf)
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def budget_violation(problem: Problem, dtype: Mapping[str, str]) -> str | None:
    """Why ``dtype`` breaks the accuracy budget (None: it keeps it, or there is none)."""
    precision = problem.precision
    budget = precision.estimate_budget if precision is not None else None
    if budget is None:
        return None
    error = estimated_error(problem, dtype)
    if error <= budget * (1 + 1e-9):
        return None
    worst = ", ".join(f"{op} {e:.2g}" for op, e in list(op_errors(problem, dtype).items())[:3])
    return (f"packed weights are estimated to cost a relative output error of {error:.3g}, over the budget of "
            f"{budget:.3g} (precision max_error; largest: {worst})")
