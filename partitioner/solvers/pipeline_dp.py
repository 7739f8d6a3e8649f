"""An exact dynamic program for pipeline stages on chain-shaped graphs.

In: a :class:`~partitioner.solvers.problem.Problem` with a :class:`~partitioner.solvers.pipeline.PipelineSpec`
(and optionally an upper bound on the step time, e.g. the best baseline's). Out: a
:class:`~partitioner.solvers.problem.Solution` whose placement cuts the nodes, in topological
order, into contiguous segments on devices taken in profile order (devices may be skipped), and
whose value is the step time of :func:`~partitioner.solvers.pipeline.pipeline_cost`.

When the graph is *chain-shaped* (its topological order is unique: every two consecutive nodes
are joined by an edge) every pipeline placement is such a segmentation, so the result is optimal
(status ``optimal``, bound = value); tests check it against the ILP. On other graphs it is the
best segmentation of one topological order: a heuristic and a warm start for the ILP.

The step time ``(M - 1) * max(t, c) + sum(t) + sum(c) + max(optimizer)`` is not separable, so
the program keeps, for every suffix of the order, first device and number of stages, the Pareto
set of (bottleneck, sum, optimizer) triples of the suffix's best segmentations; a triple that
cannot beat the upper bound is dropped. Complexity: ``O(n^2 D^2 P F)`` for ``n`` nodes, ``D``
devices, ``P`` stage counts (only tracked when 1F1B memory or an exact stage count needs it)
and Pareto sets of size ``F`` (small in practice).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from partitioner.solvers.pipeline import PipelineSpec, Schedule
from partitioner.solvers.problem import Placement, Problem, Solution, Status

__all__ = ["is_chain", "solve_pipeline_dp"]


def is_chain(problem: Problem) -> bool:
    """Whether the graph's topological order is unique (consecutive nodes joined by an edge).

    Example:
        >>> is_chain(problem)            # doctest: +SKIP
        True
    """
    dag = problem.graph.dag
    return all(dag.has_edge(u, v) for u, v in zip(problem.nodes, problem.nodes[1:]))


def solve_pipeline_dp(problem: Problem, *, upper_bound: float = math.inf) -> Solution:
    """The best segmentation of the topological order into pipeline stages (see the docstring).

    Parameters:
        problem: a problem whose ``options.pipeline`` is set.
        upper_bound: a step time known to be reachable; partial segmentations that cannot beat
            it are dropped (the answer is unchanged when one at least as good exists).

    Returns:
        A Solution: ``optimal`` with ``bound`` = its value on chain-shaped graphs, ``heuristic``
        otherwise; ``infeasible`` (empty placement) when no segmentation fits.

    Example:
        >>> sol = solve_pipeline_dp(problem)                          # doctest: +SKIP
        >>> evaluate(problem, sol.placement).total_s == sol.bound
        True
    """
    spec = problem.options.pipeline
    if spec is None:
        raise ValueError("solve_pipeline_dp needs a problem with options.pipeline set")
    start = time.perf_counter()
    table = _Tables(problem)
    best = _solve(problem, spec, table, upper_bound * (1 + 1e-9) if math.isfinite(upper_bound) else math.inf)
    seconds = time.perf_counter() - start
    chain = is_chain(problem)
    if best is None:
        return Solution("pipeline-dp", Placement({}), Status.INFEASIBLE if chain else Status.HEURISTIC,
                        None, seconds, "no segmentation into stages fits the devices' memory")
    value, segments = best
    device = {problem.nodes[v]: problem.device_names[j] for i, k, j in segments for v in range(i, k)}
    note = "" if chain else "not chain-shaped: best segmentation of one topological order"
    return Solution("pipeline-dp", Placement(device), Status.OPTIMAL if chain else Status.HEURISTIC,
                    value if chain else None, seconds, note)


# --------------------------------------------------------------------------------------------


class _Tables:
    """Prefix sums and boundary costs over the topological order, per device."""

    def __init__(self, p: Problem) -> None:
        n, names = len(p.nodes), p.device_names
        self.n, self.D = n, len(names)
        pos = {v: i for i, v in enumerate(p.nodes)}
        self.time = [[0.0] * (n + 1) for _ in names]
        self.opt = [[0.0] * (n + 1) for _ in names]
        self.bad = [[0] * (n + 1) for _ in names]
        for j, d in enumerate(names):
            for i, v in enumerate(p.nodes):
                ok = d in p.allowed[v]
                self.time[j][i + 1] = self.time[j][i] + (p.compute[v][d] if ok else 0.0)
                self.opt[j][i + 1] = self.opt[j][i] + p.opt_step[v][d]
                self.bad[j][i + 1] = self.bad[j][i] + (0 if ok else 1)
        self.params = [0] * (n + 1)
        self.saved = [0] * (n + 1)
        for i, v in enumerate(p.nodes):
            self.params[i + 1] = self.params[i] + p.param_mem[v]
            self.saved[i + 1] = self.saved[i] + p.saved[v]
        self.work = [p.work_mem[v] for v in p.nodes]
        factor = 1
        if p.options.training:
            from cost_models.training import parse_optimizer

            factor = 2 + parse_optimizer(p.options.optimizer).state_copies
        self.shared = [(pos[sp.owner], sorted(pos[u] for u in sp.users), factor * sp.bytes) for sp in p.shared]
        live: list[list[int]] = [[] for _ in range(n + 1)]  # cut k (between k-1 and k): bytes alive
        outputs = set(p.graph.outputs)
        for t in p.graph.tensors.values():
            if t.nbytes <= 0:
                continue
            first = pos[t.producer] if t.producer is not None else -1
            last = max((pos[c] for c in t.consumers if c in pos), default=first)
            if t.name in outputs:
                last = n
            for k in range(max(first + 1, 1), min(last, n - 1) + 1):
                live[k].append(t.nbytes)
        self.link: dict[tuple[int, int, int], float] = {}
        for k in range(1, n):
            for a in range(self.D):
                for b in range(a + 1, self.D):
                    self.link[(k, a, b)] = sum(p.transfer_s(nb, names[a], names[b]) for nb in live[k])

    def copies(self, i: int, k: int) -> int:
        """Bytes of tied parameters segment [i, k) reads but does not own."""
        return sum(nbytes for owner, users, nbytes in self.shared
                   if not i <= owner < k and any(i <= u < k for u in users))


def _solve(p: Problem, spec: PipelineSpec, tb: _Tables, bound: float) -> tuple[float, Sequence] | None:
    n, D, M = tb.n, tb.D, spec.micro_batches
    most = spec.max_stages(D)
    track = spec.schedule is Schedule.ONE_F_ONE_B or spec.stages is not None
    counts = range(1, most + 1) if track else (0,)
    cap = [p.capacity[d] for d in p.device_names]

    def score(e: tuple) -> float:
        return e[1] + (M - 1) * e[0] + e[2]

    # F[(i, j, c)] = Pareto list of entries (bottleneck, sum, optimizer, k, j2, child)
    F: dict[tuple[int, int, int], list[tuple]] = {}
    for i in range(n - 1, -1, -1):
        for j in range(D - 1, -1, -1):
            for c in counts:
                in_flight = spec.in_flight(0, c) if track else spec.in_flight(0, 1)
                front: list[tuple] = []
                work = 0
                for k in range(i + 1, n + 1):
                    work = max(work, tb.work[k - 1])
                    if tb.bad[j][k] - tb.bad[j][i]:
                        break
                    mem = tb.params[k] - tb.params[i] + work + in_flight * (tb.saved[k] - tb.saved[i])
                    if mem + (tb.copies(i, k) if tb.shared else 0) > cap[j]:
                        continue
                    t = tb.time[j][k] - tb.time[j][i]
                    o = tb.opt[j][k] - tb.opt[j][i]
                    if k == n:
                        if c in (0, 1):
                            _insert(front, (t, t, o, n, -1, None), score, bound)
                        continue
                    for j2 in range(j + 1, D):
                        link = tb.link[(k, j, j2)]
                        for e in F.get((k, j2, c - 1 if track else 0), ()):
                            _insert(front, (max(e[0], t, link), e[1] + t + link, max(e[2], o), k, j2, e),
                                    score, bound)
                if front:
                    F[(i, j, c)] = front
    best: tuple[float, tuple] | None = None
    for j in range(D):
        for c in counts:
            if spec.stages is not None and c != spec.stages:
                continue
            for e in F.get((0, j, c), ()):
                if best is None or score(e) < best[0]:
                    best = (score(e), (j, e))
    if best is None:
        return None
    value, (j, e) = best
    segments, i = [], 0
    while e is not None:
        segments.append((i, e[3], j))
        i, j, e = e[3], e[4], e[5]
    return value, segments


def _insert(front: list[tuple], entry: tuple, score, bound: float) -> None:  # noqa: ANN001
    """Add ``entry`` unless an entry dominates it (<= in all three) or it cannot beat ``bound``."""
    if score(entry) > bound:
        return
    for e in front:
        if e[0] <= entry[0] and e[1] <= entry[1] and e[2] <= entry[2]:
            return
    front[:] = [e for e in front if not (entry[0] <= e[0] and entry[1] <= e[1] and entry[2] <= e[2])]
    front.append(entry)
