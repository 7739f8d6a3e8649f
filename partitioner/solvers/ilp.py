"""The placement ILP (PuLP; HiGHS or CBC). The only module that imports pulp.

In: a :class:`~partitioner.solvers.problem.Problem` and an optional warm-start placement. Out: a
:class:`~partitioner.solvers.problem.Solution` with the solver's status and proven bound.

The model is :func:`~partitioner.solvers.problem.evaluate` written as linear constraints
(``DESIGN.md``, "Solvers"):

* ``x[v,d]`` binary, one device per node (pins and unsupported pairs are simply absent);
* ``s[v,d]`` binary, node ``v`` computes on accelerator ``d`` with its weights streamed from the
  host (``s <= x``; inference only);
* ``y[t,a,b]`` in [0, 1], tensor ``t`` crosses from ``a`` to ``b`` once however many consumers
  it has there: ``y[t,a,b] >= x[producer,a] + x[consumer,b] - 1``;
* ``z[p,d]`` in [0, 1], a shared parameter is copied to ``d`` where it is not resident;
* memory per device: parameters resident + stream buffers + activations ``<= capacity``;
* latency: ``T >= compute + transfers``, ``T >=`` each link's load (streamed weights overlap);
  throughput: ``T >=`` each device's and link's load; makespan: start/finish times with
  precedence (transfer delays on cut edges) and no overlap of independent nodes on a device
  (big-M disjunctions), ``T >=`` every finish and link load.

Constraint names carry node and device names (``mem_cap[cuda:0]``, ``assign[layers_3_attn]``),
sanitised to letters, digits and ``_``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import networkx as nx
import pulp

from partitioner.errors import SolverUnavailable
from partitioner.solvers.problem import (
    Objective,
    Placement,
    Problem,
    Solution,
    Status,
    StreamMode,
    list_schedule,
)

log = logging.getLogger(__name__)

MAKESPAN_MAX_NODES = 400
# Units inside the model: solvers' tolerances are absolute (about 1e-7 to 1e-9), op times are
# micro- to milliseconds and memory is up to 1e11 bytes, so time is in microseconds and memory in
# megabytes there; solutions and bounds are converted back to seconds.
TS = 1e6    # model time units per second
MS = 1e-6   # model memory units per byte  # the disjunctive model grows with independent pairs; coarsen above this


@dataclass(frozen=True)
class Progress:
    """A solver progress report: elapsed seconds, best objective found, best bound, relative gap."""

    seconds: float
    incumbent: float | None
    bound: float | None
    gap: float | None


ProgressFn = Callable[[Progress], None]


def available_solvers() -> list[str]:
    """Names of the ILP solvers installed here (``"highs"``, ``"cbc"``)."""
    names = []
    if pulp.HiGHS().available():
        names.append("highs")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        if pulp.PULP_CBC_CMD(msg=False).available():
            names.append("cbc")
    return names


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


def solve_ilp(
    problem: Problem,
    *,
    solver: str = "auto",
    time_limit: float = 60.0,
    gap: float = 0.01,
    warm_start: Placement | None = None,
    progress: ProgressFn | None = None,
) -> Solution:
    """Solve the placement ILP for ``problem``.

    Parameters:
        solver: ``"highs"``, ``"cbc"`` or ``"auto"``.
        time_limit: seconds; a feasible incumbent at the limit is returned with its gap.
        gap: relative optimality gap at which the solver stops.
        warm_start: a placement to start from (the best baseline).
        progress: called about once a second with the incumbent and bound (HiGHS only).

    Returns:
        A Solution whose ``bound`` is the solver's proven lower bound on the objective.

    Example:
        >>> sol = solve_ilp(problem, time_limit=10, gap=0.0)   # doctest: +SKIP
        >>> sol.status, sol.bound
    """
    name = resolve_solver(solver)
    start = time.perf_counter()
    model = _Model(problem)
    if warm_start is not None:
        model.set_start(warm_start)
    log.debug("ILP for %s: %d variables, %d constraints", problem.graph.name,
              len(model.prob.variables()), len(model.cons))
    if name == "highs":
        outcome = _run_highs(model, time_limit, gap, warm_start is not None, progress)
    else:
        outcome = _run_cbc(model, time_limit, gap, warm_start is not None)
    seconds = time.perf_counter() - start
    bound = outcome.bound / TS if outcome.bound is not None else None
    objective = outcome.objective / TS if outcome.objective is not None else None
    if outcome.status is Status.INFEASIBLE:
        return Solution(f"ilp:{name}", Placement({}), Status.INFEASIBLE, None, seconds, outcome.note)
    if not outcome.has_solution:
        note = f"{outcome.note}; no incumbent within {time_limit:g} s".lstrip("; ")
        return Solution(f"ilp:{name}", warm_start or Placement({}), Status.FEASIBLE, bound, seconds, note)
    return Solution(f"ilp:{name}", model.placement(), outcome.status, bound, seconds, outcome.note, objective)


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


def _name(kind: str, *parts: str) -> str:
    return kind + "".join("[" + _UNSAFE.sub("_", p) + "]" for p in parts)


def _safe(text: str) -> str:
    return _UNSAFE.sub("_", text)


class _Model:
    """The PuLP model of one problem, with handles on its variables."""

    def __init__(self, problem: Problem) -> None:
        self.p = problem
        self.prob = pulp.LpProblem(_safe(f"place_{problem.graph.name}"), pulp.LpMinimize)
        self.cons: dict[str, pulp.LpConstraint] = {}
        self._counter = 0
        self._assignment()
        self._streaming()
        self._transfers()
        self._shared()
        self._memory()
        self._link_budgets()
        self._stages()
        self._objective()
        self.prob.extend(self.cons)

    # -- helpers ------------------------------------------------------------------------------

    def _var(self, name: str, cat: str = pulp.LpContinuous, low: float = 0.0, up: float | None = None) -> pulp.LpVariable:
        self._counter += 1
        return self.prob.add_variable(f"{_safe(name)}_{self._counter}", lowBound=low, upBound=up, cat=cat)

    def _add(self, name: str, terms: dict, sense: int, rhs: float = 0.0) -> None:
        """Add ``sum(coef * var) (sense) rhs`` named ``name`` (made unique)."""
        key = _safe(name)
        if key in self.cons:  # unique after sanitising: "a.b" and "a_b" must not overwrite each other
            key = f"{key}_{len(self.cons)}"
            while key in self.cons:
                key += "_"
        expr = pulp.LpAffineExpression(terms)
        self.cons[key] = pulp.LpConstraint(expr, sense, rhs=rhs)

    def x(self, node: str, device: str) -> pulp.LpVariable | float:
        """The assignment variable, or 1.0 / 0.0 where the node has one allowed device or none here."""
        if device not in self.p.allowed[node]:
            return 0.0
        return self.xv[node].get(device, 1.0)

    # -- variables and constraints ------------------------------------------------------------

    def _assignment(self) -> None:
        self.xv: dict[str, dict[str, pulp.LpVariable]] = {}
        for n in self.p.nodes:
            allowed = self.p.allowed[n]
            if len(allowed) == 1:
                self.xv[n] = {}
                continue
            self.xv[n] = {d: self._var(_name("x", n, d), pulp.LpBinary, 0, 1) for d in allowed}
            self._add(_name("assign", n), {v: 1.0 for v in self.xv[n].values()}, pulp.LpConstraintEQ, 1.0)

    def _streaming(self) -> None:
        self.sv: dict[str, dict[str, pulp.LpVariable]] = {}
        host = self.p.host
        for n in self.p.streamable:
            targets = [d for d in self.p.allowed[n] if d != host]
            if not targets:
                continue
            self.sv[n] = {d: self._var(_name("s", n, d), pulp.LpBinary, 0, 1) for d in targets}
            for d, s in self.sv[n].items():
                xv = self.x(n, d)
                if isinstance(xv, pulp.LpVariable):
                    self._add(_name("stream_le_x", n, d), {s: 1.0, xv: -1.0}, pulp.LpConstraintLE)

    def _lin(self, *pairs: tuple[float, object]) -> dict:
        """Terms of ``sum(coef * (var or constant))`` as a dict; constants are returned under None."""
        terms: dict = {}
        for coef, v in pairs:
            if coef == 0:
                continue
            if isinstance(v, pulp.LpVariable):
                terms[v] = terms.get(v, 0.0) + coef
            else:
                terms[None] = terms.get(None, 0.0) + coef * float(v)
        return terms

    def _ge_sum(self, name: str, lhs: pulp.LpVariable, pairs: list[tuple[float, object]]) -> None:
        """``lhs >= sum(coef * (var or constant))``."""
        terms = self._lin(*pairs)
        const = terms.pop(None, 0.0)
        row = {lhs: 1.0}
        for v, c in terms.items():
            row[v] = row.get(v, 0.0) - c
        self._add(name, row, pulp.LpConstraintGE, const)

    def _transfers(self) -> None:
        """y[t,a,b] >= x[producer,a] + x[consumer,b] - 1 for every consumer on b.

        A copy whose two ends are fixed (pins, single allowed device, graph inputs on the host)
        is a constant, and then no variable stands for the same copy: the copy happens once,
        however many consumers, fixed or free, read the tensor on ``b``.
        """
        self.yv: dict[tuple[str, str, str], pulp.LpVariable] = {}
        self.y_const: list[tuple[str, str, str]] = []  # transfers forced by fixed placements
        p = self.p
        for t in p.tensors:
            sources = p.allowed[t.producer] if t.producer is not None else (p.host,)
            forced = set()
            for c in t.consumers:
                for b in p.allowed[c]:
                    for a in sources:
                        xa = self.x(t.producer, a) if t.producer is not None else 1.0
                        if a != b and not isinstance(xa, pulp.LpVariable) and not isinstance(self.x(c, b), pulp.LpVariable) \
                                and xa + self.x(c, b) >= 2:
                            forced.add((a, b))
            self.y_const += [(t.name, a, b) for a, b in sorted(forced)]
            for c in t.consumers:
                for b in p.allowed[c]:
                    for a in sources:
                        if a == b or (a, b) in forced:
                            continue
                        xa = self.x(t.producer, a) if t.producer is not None else 1.0
                        xb = self.x(c, b)
                        if not isinstance(xa, pulp.LpVariable) and not isinstance(xb, pulp.LpVariable):
                            continue  # 0 + x <= 1: never a copy
                        key = (t.name, a, b)
                        y = self.yv.get(key)
                        if y is None:
                            y = self.yv[key] = self._var(_name("y", t.name, a, b), up=1.0)
                        self._ge_sum(_name("send", t.name, c, a, b), y, [(1.0, xa), (1.0, xb), (-1.0, 1.0)])
        self.tensor_bytes = {t.name: t.bytes for t in p.tensors}

    def resident(self, node: str, device: str) -> list[tuple[float, object]]:
        """Linear terms of 'node's own parameters live on device'."""
        if device == self.p.host:
            return [(1.0, self.x(node, device))] + [(1.0, s) for s in self.sv.get(node, {}).values()]
        terms: list[tuple[float, object]] = [(1.0, self.x(node, device))]
        s = self.sv.get(node, {}).get(device)
        if s is not None:
            terms.append((-1.0, s))
        return terms

    def _shared(self) -> None:
        self.zv: dict[tuple[str, str], pulp.LpVariable] = {}
        for sp in self.p.shared:
            for u in sp.users:
                for d in self.p.allowed[u]:
                    z = self.zv.get((sp.name, d))
                    if z is None:
                        z = self.zv[(sp.name, d)] = self._var(_name("z", sp.name, d), up=1.0)
                    pairs = [(1.0, self.x(u, d))] + [(-c, v) for c, v in self.resident(sp.owner, d)]
                    self._ge_sum(_name("shared", sp.name, u, d), z, pairs)

    def _memory(self) -> None:
        """Parameters resident + saved activations + largest working set + stream buffer <= capacity."""
        p = self.p
        for d in p.device_names:
            pairs: list[tuple[float, object]] = []
            for n in p.nodes:
                pairs += [(MS * coef * p.param_mem[n], v) for coef, v in self.resident(n, d)]
                if p.saved[n]:
                    pairs.append((MS * p.saved[n], self.x(n, d)))
            work = self._var(_name("work", d))
            pairs.append((1.0, work))
            for n in p.nodes:
                if p.work_mem[n] > 0 and d in p.allowed[n]:
                    self._ge_sum(_name("working_set", n, d), work, [(MS * p.work_mem[n], self.x(n, d))])
            streamed = [(n, self.sv[n][d]) for n in self.sv if d in self.sv[n]]
            if streamed:
                buffer = self._var(_name("stream_buffer", d))
                pairs.append((1.0, buffer))
                for n, s in streamed:
                    self._ge_sum(_name("buffer", n, d), buffer, [(MS * p.stream_buffer_bytes(n, StreamMode.PREFETCH), s)])
            terms = self._lin(*pairs)
            const = terms.pop(None, 0.0)
            self._add(_name("mem_cap", d), terms, pulp.LpConstraintLE, MS * p.capacity[d] - const)

    def _link_terms(self, label: str, *, budget: bool = False) -> list[tuple[float, object]]:
        """Load on link ``label``: seconds (or bytes when ``budget``) of transfers and streams over it."""
        p = self.p
        pairs: list[tuple[float, object]] = []
        factor = 2 if p.options.training else 1
        for (t, a, b), y in self.yv.items():
            if label in p.hops(a, b):
                nbytes = self.tensor_bytes[t]
                pairs.append((MS * nbytes if budget else TS * factor * p.hop_s(nbytes, a, b, label), y))
        for (t, a, b) in self.y_const:
            if label in p.hops(a, b):
                nbytes = self.tensor_bytes[t]
                pairs.append((MS * nbytes if budget else TS * factor * p.hop_s(nbytes, a, b, label), 1.0))
        for n, per_d in self.sv.items():
            for d, s in per_d.items():
                if label in p.hops(p.host, d):
                    pairs.append((MS * p.param_bytes[n] if budget else TS * p.node_stream_hop_s(n, p.host, d, label), s))
        return pairs

    def _link_budgets(self) -> None:
        for label, limit in self.p.options.link_budget.items():
            if label not in self.p.link_labels:
                continue
            terms = self._lin(*self._link_terms(label, budget=True))
            const = terms.pop(None, 0.0)
            self._add(_name("link_budget", label), terms, pulp.LpConstraintLE, MS * limit - const)

    def _stages(self) -> None:
        if not self.p.options.contiguous_stages:
            return
        stage = {d: i for i, d in enumerate(self.p.device_names)}
        for t in self.p.tensors:
            if t.producer is None:
                continue
            for c in t.consumers:
                pairs = [(float(stage[d]), self.x(c, d)) for d in self.p.allowed[c]]
                pairs += [(-float(stage[d]), self.x(t.producer, d)) for d in self.p.allowed[t.producer]]
                terms = self._lin(*pairs)
                const = terms.pop(None, 0.0)
                self._add(_name("stage_order", t.producer, c), terms, pulp.LpConstraintGE, -const)

    # -- objectives ---------------------------------------------------------------------------

    def _compute_terms(self, device: str | None = None) -> list[tuple[float, object]]:
        p = self.p
        pairs: list[tuple[float, object]] = []
        for n in p.nodes:
            for d in p.allowed[n]:
                if device is None or d == device:
                    pairs.append((TS * p.compute[n][d], self.x(n, d)))
            for d in p.device_names:  # the optimizer step runs where the parameters live
                if p.opt_step[n][d] and (device is None or d == device):
                    pairs += [(TS * p.opt_step[n][d] * c, v) for c, v in self.resident(n, d)]
        return pairs

    def _stream_issue_terms(self, device: str | None = None) -> list[tuple[float, object]]:
        """Each prefetched copy's issue latency, charged to the node that waits for it."""
        return [
            (TS * self.p.node_stream_issue_s(n, d), s)
            for n, per_d in self.sv.items() for d, s in per_d.items() if device is None or d == device
        ]

    def _transfer_terms(self) -> list[tuple[float, object]]:
        p = self.p
        pairs = [(TS * p.transfer_s(self.tensor_bytes[t], a, b), y) for (t, a, b), y in self.yv.items()]
        pairs += [(TS * p.transfer_s(self.tensor_bytes[t], a, b), 1.0) for (t, a, b) in self.y_const]
        return pairs

    def _shared_terms(self, device: str | None = None) -> list[tuple[float, object]]:
        shared = {sp.name: sp for sp in self.p.shared}
        return [
            (TS * self.p.shared_param_s(shared[name], d), z)
            for (name, d), z in self.zv.items() if device is None or d == device
        ]

    def _objective(self) -> None:
        p = self.p
        self.T = self._var("T")
        objective = p.options.objective
        if objective is Objective.LATENCY:
            self._ge_sum("critical_path", self.T, self._compute_terms() + self._transfer_terms()
                         + self._shared_terms() + self._stream_issue_terms())
        elif objective is Objective.THROUGHPUT:
            for d in p.device_names:
                self._ge_sum(_name("device_load", d), self.T, self._compute_terms(d) + self._shared_terms(d)
                             + self._stream_issue_terms(d))
        else:
            self._makespan()
        for label in p.link_labels:
            pairs = self._link_terms(label)
            if pairs:
                self._ge_sum(_name("link_load", label), self.T, pairs)
        self.prob.setObjective(pulp.LpAffineExpression({self.T: 1.0}))

    def _makespan(self) -> None:
        p = self.p
        if len(p.nodes) > MAKESPAN_MAX_NODES:
            raise SolverUnavailable(
                f"the makespan ILP takes at most {MAKESPAN_MAX_NODES} nodes, {p.graph.name!r} has {len(p.nodes)}: "
                f"coarsen the graph (partition(..., coarsen=True)) or use objective 'latency'"
            )
        horizon = TS * sum(max(p.compute[n][d] + (p.node_stream_issue_s(n, d) if n in self.sv else 0.0)
                               for d in p.allowed[n]) for n in p.nodes) + TS * sum(
            max((p.transfer_s(t.bytes, a, b) for a in p.device_names for b in p.device_names if a != b), default=0.0)
            for t in p.tensors
        )
        horizon = horizon * (1 + 1e-6) + 1.0  # room for rounding in a warm start's times
        self.big_m = horizon * 1.01 + 1e-6
        self.S = {n: self._var(_name("start", n), up=horizon) for n in p.nodes}
        self.F = {n: self._var(_name("finish", n), up=horizon) for n in p.nodes}
        for n in p.nodes:
            pairs = [(TS * p.compute[n][d], self.x(n, d)) for d in p.allowed[n]]
            pairs += [(TS * p.node_stream_issue_s(n, d), s) for d, s in self.sv.get(n, {}).items()]
            terms = self._lin(*pairs)
            const = terms.pop(None, 0.0)
            row = {self.F[n]: 1.0, self.S[n]: -1.0}
            for v, c in terms.items():
                row[v] = row.get(v, 0.0) - c
            self._add(_name("duration", n), row, pulp.LpConstraintEQ, const)
        self._precedence()
        self._no_overlap()
        makespan = self._var("makespan")
        for n in p.nodes:
            self._add(_name("ends_after", n), {makespan: 1.0, self.F[n]: -1.0}, pulp.LpConstraintGE)
        opt = self._var("optimizer_step")
        for d in p.device_names:
            pairs = [(TS * p.opt_step[n][d] * c, v) for n in p.nodes if p.opt_step[n][d] for c, v in self.resident(n, d)]
            if pairs:
                self._ge_sum(_name("optimizer", d), opt, pairs)
        pairs = [(1.0, makespan), (1.0, opt)] + self._shared_terms()
        self._ge_sum("total", self.T, pairs)

    def _precedence(self) -> None:
        p = self.p
        self.edge_vars: dict[tuple[str, str, str, str], pulp.LpVariable] = {}
        for t in p.tensors:
            for c in t.consumers:
                if t.producer is None:
                    pairs = [(1.0, 0.0)] + [
                        (TS * p.transfer_s(t.bytes, p.host, b), self.x(c, b)) for b in p.allowed[c] if b != p.host
                    ]
                    self._ge_sum(_name("input_ready", t.name, c), self.S[c], pairs)
                    continue
                pairs: list[tuple[float, object]] = [(1.0, self.F[t.producer])]
                for a in p.allowed[t.producer]:
                    for b in p.allowed[c]:
                        if a == b:
                            continue
                        e = self._var(_name("cut", t.name, c, a, b), up=1.0)
                        self.edge_vars[(t.name, c, a, b)] = e
                        self._ge_sum(_name("cut_def", t.name, c, a, b), e,
                                     [(1.0, self.x(t.producer, a)), (1.0, self.x(c, b)), (-1.0, 1.0)])
                        pairs.append((TS * p.transfer_s(t.bytes, a, b), e))
                self._ge_sum(_name("after", t.producer, c), self.S[c], pairs)
        for u, v in p.graph.dag.edges:  # edges whose tensors carry no bytes still order the nodes
            self._add(_name("order", u, v), {self.S[v]: 1.0, self.F[u]: -1.0}, pulp.LpConstraintGE)

    def _no_overlap(self) -> None:
        p = self.p
        closure = nx.transitive_closure_dag(p.graph.dag)
        self.ov: dict[tuple[str, str], pulp.LpVariable] = {}
        m = self.big_m
        for i, u in enumerate(p.nodes):
            for v in p.nodes[i + 1:]:
                if closure.has_edge(u, v) or closure.has_edge(v, u):
                    continue
                shared = [d for d in p.allowed[u] if d in p.allowed[v]]
                if not shared:
                    continue
                o = self._var(_name("before", u, v), pulp.LpBinary, 0, 1)
                self.ov[(u, v)] = o
                for d in shared:
                    xu, xv = self.x(u, d), self.x(v, d)
                    # S_v >= F_u - M(1 - o) - M(2 - xu - xv)
                    self._ge_sum(_name("u_then_v", u, v, d), self.S[v],
                                 [(1.0, self.F[u]), (m, o), (-3 * m, 1.0), (m, xu), (m, xv)])
                    # S_u >= F_v - M o - M(2 - xu - xv)
                    self._ge_sum(_name("v_then_u", u, v, d), self.S[u],
                                 [(1.0, self.F[v]), (-m, o), (-2 * m, 1.0), (m, xu), (m, xv)])

    # -- warm start and reading the answer ------------------------------------------------------

    def set_start(self, placement: Placement) -> None:
        """Give every variable the value ``placement`` implies."""
        p = self.p
        dev = placement.device
        for n, per_d in self.xv.items():
            for d, v in per_d.items():
                v.setInitialValue(1.0 if dev.get(n) == d else 0.0)
        for n, per_d in self.sv.items():
            for d, v in per_d.items():
                v.setInitialValue(1.0 if n in placement.streamed and dev.get(n) == d else 0.0)
        producer = {t.name: t.producer for t in p.tensors}
        consumers = {t.name: t.consumers for t in p.tensors}
        for (t, a, b), y in self.yv.items():
            src = dev[producer[t]] if producer[t] is not None else p.host
            y.setInitialValue(1.0 if src == a and any(dev[c] == b for c in consumers[t]) else 0.0)
        owner = {sp.name: sp for sp in p.shared}
        for (name, d), z in self.zv.items():
            sp = owner[name]
            home = placement.residence(sp.owner)
            z.setInitialValue(1.0 if home != d and any(dev[u] == d for u in sp.users) else 0.0)
        if p.options.objective is Objective.MAKESPAN:
            times = list_schedule(p, placement)
            for n in p.nodes:
                self.S[n].setInitialValue(TS * times[n][0])
                self.F[n].setInitialValue(TS * times[n][1])
            for (t, c, a, b), e in self.edge_vars.items():
                e.setInitialValue(1.0 if dev[producer[t]] == a and dev[c] == b else 0.0)
            for (u, v), o in self.ov.items():
                o.setInitialValue(1.0 if times[u][0] <= times[v][0] else 0.0)
        for var in self.prob.variables():  # auxiliaries (T, work, buffers...) start at zero
            if var.varValue is None:
                var.setInitialValue(0.0)

    def placement(self) -> Placement:
        p = self.p
        device: dict[str, str] = {}
        for n in p.nodes:
            if not self.xv[n]:
                device[n] = p.allowed[n][0]
            else:
                device[n] = max(self.xv[n], key=lambda d: (self.xv[n][d].varValue or 0.0))
        streamed = {
            n: p.host for n, per_d in self.sv.items()
            if device[n] in per_d and (per_d[device[n]].varValue or 0.0) > 0.5
        }
        order: tuple[str, ...] = ()
        if p.options.objective is Objective.MAKESPAN:
            # by start, then end: a zero-length node at the same instant goes before a long one
            order = tuple(sorted(p.nodes, key=lambda n: (round(self.S[n].varValue or 0.0, 6),
                                                         round(self.F[n].varValue or 0.0, 6), p.index[n])))
            order = _topological_repair(p, order)
        return Placement(device, streamed, StreamMode.PREFETCH, order)


def _topological_repair(p: Problem, order: tuple[str, ...]) -> tuple[str, ...]:
    """Sort by start time but never before a predecessor (rounding in the solver's times)."""
    rank = {n: i for i, n in enumerate(order)}
    return tuple(nx.lexicographical_topological_sort(p.graph.dag, key=lambda n: (rank[n], p.index[n])))


# --------------------------------------------------------------------------------------------
# Running the solvers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Outcome:
    status: Status
    has_solution: bool
    bound: float | None
    note: str = ""
    objective: float | None = None  # the incumbent's objective as the solver computed it (model units)


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """HiGHS prints a banner on stdout when created; keep the CLI's stdout clean (e.g. --json)."""
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


def _run_highs(model: _Model, time_limit: float, gap: float, warm: bool, progress: ProgressFn | None) -> _Outcome:
    import highspy

    prob = model.prob
    with _quiet_stdout():
        solver = pulp.HiGHS(msg=False, timeLimit=time_limit, gapRel=gap, threads=1)
        solver.createAndConfigureSolver(prob)
    h = prob.solverModel
    solver.buildSolverModel(prob)
    if warm:
        values = [float(v.varValue) if v.varValue is not None else 0.0 for v in prob.variables()]
        sol = highspy.HighsSolution()
        sol.col_value = values
        sol.value_valid = True
        h.setSolution(sol)
    if progress is not None:
        _attach_progress(h, progress)
    solver.callSolver(prob)
    status, _ = solver.findSolutionValues(prob)
    info = h.getInfo()
    model_status = h.getModelStatus()
    has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
    bound = float(info.mip_dual_bound) if math.isfinite(info.mip_dual_bound) else None
    objective = float(info.objective_function_value) if has_solution else None
    if model_status == highspy.HighsModelStatus.kInfeasible:
        return _Outcome(Status.INFEASIBLE, False, None, "HiGHS proved the model infeasible")
    if model_status == highspy.HighsModelStatus.kOptimal:
        if bound is None:  # an LP (no integers left after fixing): the objective is the bound
            bound = float(info.objective_function_value)
        return _Outcome(Status.OPTIMAL, has_solution, bound, objective=objective)
    note = f"HiGHS stopped: {h.modelStatusToString(model_status)}"
    return _Outcome(Status.FEASIBLE, has_solution, bound, note, objective)


def _attach_progress(h, progress: ProgressFn) -> None:  # noqa: ANN001 - a highspy.Highs
    import highspy

    started = time.perf_counter()
    last = [0.0]

    def on_event(callback_type, message, data_out, data_in, user_data):  # noqa: ANN001, ARG001
        now = time.perf_counter() - started
        if now - last[0] < 1.0:
            return
        last[0] = now
        primal = data_out.mip_primal_bound
        dual = data_out.mip_dual_bound
        progress(Progress(
            now,
            float(primal) / TS if math.isfinite(primal) else None,
            float(dual) / TS if math.isfinite(dual) else None,
            float(data_out.mip_gap) if math.isfinite(data_out.mip_gap) else None,
        ))

    h.setCallback(on_event, None)
    h.startCallback(highspy.cb.HighsCallbackType.kCallbackMipInterrupt)


_CBC_BOUND = re.compile(r"^(?:Lower bound|Best possible):\s*(-?[\d.eE+]+)", re.MULTILINE)
_CBC_RESULT = re.compile(r"^Result - (.+)$", re.MULTILINE)


def _run_cbc(model: _Model, time_limit: float, gap: float, warm: bool) -> _Outcome:
    prob = model.prob
    with tempfile.TemporaryDirectory(prefix="hetpart-cbc-") as tmp:
        log_path = os.path.join(tmp, "cbc.log")
        with warnings.catch_warnings():  # PuLP 3 deprecates the bundled CBC; it is the one we want
            warnings.simplefilter("ignore", DeprecationWarning)
            solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=max(1, int(math.ceil(time_limit))), gapRel=gap,
                                       warmStart=warm, logPath=log_path, threads=1)
            try:
                prob.solve(solver)
            except pulp.PulpSolverError as exc:  # CBC died (seen on 10,000-op graphs): no incumbent to read
                tail = open(log_path).read()[-300:] if os.path.exists(log_path) else ""
                return _Outcome(Status.FEASIBLE, False, None, f"CBC failed: {exc}; log ends: {tail.strip()[-120:]}")
        text = open(log_path).read() if os.path.exists(log_path) else ""
    result = _CBC_RESULT.search(text)
    result_text = result.group(1).strip() if result else pulp.LpStatus[prob.status]
    bound_match = _CBC_BOUND.search(text)
    objective = pulp.value(prob.objective)
    if prob.status == pulp.LpStatusInfeasible:
        return _Outcome(Status.INFEASIBLE, False, None, f"CBC: {result_text}")
    has_solution = prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    if prob.sol_status == pulp.LpSolutionOptimal:
        bound = float(bound_match.group(1)) if bound_match else (float(objective) if objective is not None else None)
        if bound is not None and objective is not None:
            bound = min(bound, float(objective))
        return _Outcome(Status.OPTIMAL, has_solution, bound, objective=_float(objective))
    bound = float(bound_match.group(1)) if bound_match else None
    return _Outcome(Status.FEASIBLE, has_solution, bound, f"CBC: {result_text}", _float(objective) if has_solution else None)


def _float(value: object) -> float | None:
    return None if value is None else float(value)
