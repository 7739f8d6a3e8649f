"""A small, solver-neutral mixed-integer linear program: columns, rows, an objective to minimise.

In: columns and rows added one at a time by a formulation (``partitioner.solvers.formulation``).
Out: the arrays a solver back end passes on (``highs.py`` to highspy, ``cbc.py`` to PuLP's CBC),
and the helpers that read a solution vector back.

A row is ``lower <= sum(coef * column) <= upper`` with ``-inf``/``inf`` for a missing side. Terms
are given as ``(coefficient, column or constant)`` pairs: a plain number stands for a constant
and is moved to the bounds, so formulations can write ``y >= x_a + x_b - 1`` without caring
which of ``x_a``, ``x_b`` a pin has fixed. Row names must be unique (a second row of the same
name is refused), so no constraint can silently replace another.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import time
from collections.abc import Iterable, Sequence

import numpy as np

INF = math.inf
DEADLINE_EVERY = 256  # rows between two looks at the clock while a deadline is set


class BuildTimeout(Exception):
    """A program was still being built at its deadline (:attr:`Milp.deadline`): the caller's time ran out."""

    def __init__(self, rows: int, columns: int) -> None:
        super().__init__(f"the time limit ran out while building the model ({rows:,} rows, {columns:,} columns so far)")
        self.rows, self.columns = rows, columns

Term = tuple[float, "int | float"]  # (coefficient, column index or constant); see Column below


@dataclasses.dataclass(frozen=True)
class Column:
    """A handle on a column: its index into the program's arrays."""

    index: int


class Milp:
    """Columns (bounds, cost, integrality, name) and rows (a sparse linear form and two bounds).

    Example:
        >>> m = Milp()
        >>> x = m.column("x", upper=1, integer=True)
        >>> t = m.column("T", cost=1.0)
        >>> m.at_least("T_ge_x", t, [(3.0, x), (1.0, 2.0)])   # T >= 3 x + 2
        >>> m.num_rows
        1
    """

    def __init__(self, deadline: float | None = None) -> None:
        #: ``time.perf_counter()`` past which adding a row raises :class:`BuildTimeout` (None: never):
        #: a model whose build would outlast its caller's time limit is given up, not finished late
        self.deadline = deadline
        self.names: list[str] = []
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.cost: list[float] = []
        self.integer: list[bool] = []
        self.row_names: list[str] = []
        self.row_lower: list[float] = []
        self.row_upper: list[float] = []
        self.row_index: list[list[int]] = []
        self.row_value: list[list[float]] = []
        self._row_seen: set[str] = set()
        self.ordering_rows: list[int] = []  # rows that only break a symmetry (see ``without_ordering``)

    # -- building -----------------------------------------------------------------------------

    @property
    def num_cols(self) -> int:
        return len(self.names)

    @property
    def num_rows(self) -> int:
        return len(self.row_names)

    def column(self, name: str, *, lower: float = 0.0, upper: float = INF, integer: bool = False,
               cost: float = 0.0) -> Column:
        """A new column; binary when ``integer`` with bounds 0 and 1."""
        self.names.append(name)
        self.lower.append(lower)
        self.upper.append(upper)
        self.cost.append(cost)
        self.integer.append(integer)
        return Column(len(self.names) - 1)

    def row(self, name: str, terms: Iterable[Term], lower: float = -INF, upper: float = INF, *,
            ordering: bool = False) -> None:
        """``lower <= sum(terms) <= upper``; constants in ``terms`` move to the bounds. An
        ``ordering`` row only chooses among solutions of equal cost (a symmetry-breaking row):
        :meth:`without_ordering` drops it.

        Raises:
            ValueError: a row called ``name`` exists already.
        """
        if name in self._row_seen:
            raise ValueError(f"two constraints are called {name!r}: a formulation bug")
        if self.deadline is not None and len(self.row_names) % DEADLINE_EVERY == 0 \
                and time.perf_counter() > self.deadline:
            raise BuildTimeout(len(self.row_names), len(self.names))
        self._row_seen.add(name)
        coef: dict[int, float] = {}
        const = 0.0
        for c, v in terms:
            if c == 0:
                continue
            if isinstance(v, Column):
                coef[v.index] = coef.get(v.index, 0.0) + c
            else:
                const += c * float(v)
        if ordering:
            self.ordering_rows.append(len(self.row_names))
        self.row_names.append(name)
        self.row_lower.append(lower - const)
        self.row_upper.append(upper - const)
        self.row_index.append([i for i, c in coef.items() if c != 0])
        self.row_value.append([c for c in coef.values() if c != 0])

    def at_least(self, name: str, lhs: Column, terms: Sequence[Term]) -> None:
        """``lhs >= sum(terms)``."""
        self.row(name, [(1.0, lhs)] + [(-c, v) for c, v in terms], lower=0.0)

    def at_most(self, name: str, terms: Sequence[Term], bound: float) -> None:
        """``sum(terms) <= bound``."""
        self.row(name, terms, upper=bound)

    def equal(self, name: str, terms: Sequence[Term], value: float) -> None:
        """``sum(terms) == value``."""
        self.row(name, terms, lower=value, upper=value)

    def without_ordering(self) -> Milp:
        """The same program with its ordering rows free (bounds -inf..inf): every solution of this
        one has an equal-cost solution of ``self``, so both have the same optimum and a bound of
        either bounds both. Columns and rows are shared, not copied; only the row bounds are."""
        if not self.ordering_rows:
            return self
        free = copy.copy(self)
        free.row_lower, free.row_upper = list(self.row_lower), list(self.row_upper)
        for i in self.ordering_rows:
            free.row_lower[i], free.row_upper[i] = -INF, INF
        free.ordering_rows = []
        return free

    # -- reading ------------------------------------------------------------------------------

    def rows_csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows as compressed sparse arrays: each row's number of terms, then every term's
        column index and coefficient, row after row."""
        lengths = np.fromiter(map(len, self.row_index), dtype=np.int64, count=self.num_rows)
        nonzeros = int(lengths.sum())
        index = np.fromiter(itertools.chain.from_iterable(self.row_index), dtype=np.int64, count=nonzeros)
        coef = np.fromiter(itertools.chain.from_iterable(self.row_value), dtype=float, count=nonzeros)
        return lengths, index, coef

    def objective_of(self, values: Sequence[float]) -> float:
        """The objective at ``values`` (one value per column)."""
        return sum(c * values[i] for i, c in enumerate(self.cost) if c)

    def violation(self, values: Sequence[float]) -> float:
        """The largest amount by which ``values`` break a bound or a row (0 when feasible), each
        relative to the size of the numbers involved (at least 1): solvers print and round."""
        x = np.asarray(values, dtype=float)
        scale = np.maximum(1.0, np.abs(x))
        worst = max(0.0, float(np.max((np.asarray(self.lower) - x) / scale, initial=0.0)),
                    float(np.max((x - np.asarray(self.upper)) / scale, initial=0.0)))
        if not self.num_rows:
            return worst
        lengths, index, coef = self.rows_csr()
        terms = coef * x[index]
        row_of = np.repeat(np.arange(self.num_rows), lengths)
        sums = np.bincount(row_of, weights=terms, minlength=self.num_rows)
        size = np.maximum(1.0, np.abs(sums))
        np.maximum.at(size, row_of, np.abs(terms))
        return max(worst, float(np.max((np.asarray(self.row_lower) - sums) / size)),
                   float(np.max((sums - np.asarray(self.row_upper)) / size)))


def value(values: Sequence[float], term: Column | float) -> float:
    """The value of a column (or the constant itself) in a solution vector."""
    return values[term.index] if isinstance(term, Column) else float(term)
