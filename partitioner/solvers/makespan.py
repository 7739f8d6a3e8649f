"""The makespan rows of the placement ILP: start and finish times, precedence, no overlap.

In: a :class:`~partitioner.solvers.formulation.Formulation` under construction (its assignment,
streaming and copy columns exist). Out: :class:`MakespanRows`, which adds to its program

* ``start[v]``, ``finish[v]``; ``duration[v]``: finish = start + compute + stream issue;
* ``input_ready[t,v]``: a node starts after its graph inputs reached its device;
  ``after[t,v]``: after each producer's finish plus the copy's time when the two ends differ
  (``cut[t,v,a,b] >= x[producer,a] + x[v,b] - 1``); ``order[u,v]`` on every edge;
* ``u_then_v`` / ``v_then_u``: two independent nodes on one device do not overlap (big-M, with
  ``before[u,v]`` binary);
* ``T >= makespan + optimizer step + shared-parameter copies``, as
  :func:`~partitioner.solvers.problem.evaluate` adds them;

and reads back the issue order (by start time, repaired to a topological order). The model grows
with the number of independent pairs, so it takes at most ``MAX_NODES`` nodes: coarsen above.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import networkx as nx

from partitioner.errors import SolverUnavailable
from partitioner.solvers.milp import Column, Term
from partitioner.solvers.problem import Placement

if TYPE_CHECKING:
    from partitioner.solvers.formulation import Formulation

MAX_NODES = 400


def _name(kind: str, *parts: str) -> str:
    return kind + "".join(f"[{p}]" for p in parts)


def check_size(problem) -> None:  # noqa: ANN001 - a Problem
    """Refuse a makespan problem too large for the disjunctive model, before any work is done."""
    if len(problem.nodes) > MAX_NODES:
        raise SolverUnavailable(
            f"the makespan ILP takes at most {MAX_NODES} nodes, {problem.graph.name!r} has {len(problem.nodes)}: "
            f"coarsen the graph (partition(..., coarsen=True)) or use objective 'latency'"
        )


class MakespanRows:
    """Start/finish columns and the rows tying them to the placement (see the module docstring)."""

    def __init__(self, f: Formulation) -> None:
        p, tu, m = f.p, f.units.time, f.milp
        check_size(p)
        if p.precision is not None:
            raise SolverUnavailable("the makespan ILP does not price precision (16-bit copies and casts): "
                                    "plan precision with objective 'latency' or 'throughput'")
        self.f = f
        # a list schedule ends by the sum of all durations and one copy of each tensor (the chain of
        # waits behind the last node meets each node and each tensor at most once)
        horizon = tu * sum(max(p.compute[n][d] + (p.node_stream_issue_s(n, d) if n in f.sv else 0.0)
                               for d in f.allowed[n]) for n in p.nodes)
        horizon += tu * sum(max((p.transfer_s(t.bytes, a, b) for a in p.device_names for b in p.device_names
                                 if a != b and not f.too_dear(p.transfer_s(t.bytes, a, b))), default=0.0)
                            for t in p.tensors)
        self.horizon = horizon * (1 + 1e-6) + 1.0  # room for rounding in a warm start's times
        self.big_m = self.horizon * 1.01
        self.S = {n: m.column(_name("start", n), upper=self.horizon) for n in p.nodes}
        self.F = {n: m.column(_name("finish", n), upper=self.horizon) for n in p.nodes}
        for n in p.nodes:
            terms: list[Term] = [(1.0, self.F[n]), (-1.0, self.S[n])]
            terms += [(-tu * p.compute[n][d], f.x(n, d)) for d in f.allowed[n]]
            terms += [(-tu * p.node_stream_issue_s(n, d), s) for d, s in f.sv.get(n, {}).items()]
            m.equal(_name("duration", n), terms, 0.0)
        self._precedence()
        self._no_overlap()
        self.end = m.column("makespan")
        for n in p.nodes:
            f.ge(_name("ends_after", n), self.end, [(1.0, self.F[n])])
        opt = m.column("optimizer_step")
        for d in p.device_names:
            terms = [(tu * p.opt_step[n][d] * c, v) for n in p.nodes if p.opt_step[n][d] for c, v in f.resident(n, d)]
            if terms:
                f.ge(_name("optimizer", d), opt, terms)
        f.ge("total", f.T, [(1.0, self.end), (1.0, opt)] + f.shared_terms())

    def _precedence(self) -> None:
        f, p, tu, m = self.f, self.f.p, self.f.units.time, self.f.milp
        self.cut: dict[tuple[str, str, str, str], Column] = {}
        for t in p.tensors:
            for c in t.consumers:
                if t.producer is None:
                    terms = [(tu * p.transfer_s(t.bytes, p.host, b), f.x(c, b)) for b in f.allowed[c]
                             if b != p.host and not f.too_dear(p.transfer_s(t.bytes, p.host, b))]
                    m.row(_name("input_ready", t.name, c), [(1.0, self.S[c])] + [(-k, v) for k, v in terms], lower=0.0)
                    continue
                terms: list[Term] = [(1.0, self.F[t.producer])]
                for a in f.allowed[t.producer]:
                    for b in f.allowed[c]:
                        if a == b or f.too_dear(p.transfer_s(t.bytes, a, b)):
                            continue  # the same device, or a copy the formulation refuses
                        both = [(1.0, f.x(t.producer, a)), (1.0, f.x(c, b)), (-1.0, 1.0)]
                        if all(not isinstance(v, Column) for _, v in both):
                            if sum(k * float(v) for k, v in both) >= 1:
                                terms.append((tu * p.transfer_s(t.bytes, a, b), 1.0))
                            continue
                        e = self.cut[(t.name, c, a, b)] = m.column(_name("cut", t.name, c, a, b), upper=1.0)
                        f.ge(_name("cut_def", t.name, c, a, b), e, both)
                        terms.append((tu * p.transfer_s(t.bytes, a, b), e))
                m.row(_name("after", t.name, c), [(1.0, self.S[c])] + [(-k, v) for k, v in terms], lower=0.0)
        for u, v in p.graph.dag.edges:  # edges whose tensors carry no bytes still order the nodes
            m.row(_name("order", u, v), [(1.0, self.S[v]), (-1.0, self.F[u])], lower=0.0)

    def _no_overlap(self) -> None:
        f, p, m, big = self.f, self.f.p, self.f.milp, self.big_m
        closure = nx.transitive_closure_dag(p.graph.dag)
        self.before: dict[tuple[str, str], Column] = {}
        for i, u in enumerate(p.nodes):
            for v in p.nodes[i + 1:]:
                if closure.has_edge(u, v) or closure.has_edge(v, u):
                    continue
                shared = [d for d in f.allowed[u] if d in f.allowed[v]]
                if not shared:
                    continue
                o = self.before[(u, v)] = m.column(_name("before", u, v), upper=1.0, integer=True)
                for d in shared:
                    xu, xv = f.x(u, d), f.x(v, d)
                    # S_v >= F_u - M(1 - o) - M(2 - xu - xv)
                    m.row(_name("u_then_v", u, v, d), [(1.0, self.S[v]), (-1.0, self.F[u]), (-big, o), (3 * big, 1.0),
                                                       (-big, xu), (-big, xv)], lower=0.0)
                    # S_u >= F_v - M o - M(2 - xu - xv)
                    m.row(_name("v_then_u", u, v, d), [(1.0, self.S[u]), (-1.0, self.F[v]), (big, o), (2 * big, 1.0),
                                                       (-big, xu), (-big, xv)], lower=0.0)

    def start_values(self, values: list[float], placement: Placement, times: dict[str, tuple[float, float]]) -> None:
        """Start, finish and order columns of ``placement`` scheduled as ``times`` (seconds)."""
        tu = self.f.units.time
        dev = placement.device
        for n, (start, finish) in times.items():
            values[self.S[n].index] = min(tu * start, self.horizon)
            values[self.F[n].index] = min(tu * finish, self.horizon)
        for (t, c, a, b), e in self.cut.items():
            producer = self.f.p.graph.tensors[t].producer
            values[e.index] = 1.0 if dev[producer] == a and dev[c] == b else 0.0
        for (u, v), o in self.before.items():
            values[o.index] = 1.0 if times[u][0] <= times[v][0] else 0.0

    def order(self, values: list[float]) -> tuple[str, ...]:
        """Nodes by start, then finish (a zero-length node at the same instant goes first), never
        before a predecessor (rounding in the solver's times)."""
        p = self.f.p
        ranked = sorted(p.nodes, key=lambda n: (round(values[self.S[n].index], 6), round(values[self.F[n].index], 6),
                                                p.index[n]))
        rank = {n: i for i, n in enumerate(ranked)}
        return tuple(nx.lexicographical_topological_sort(p.graph.dag, key=lambda n: (rank[n], p.index[n])))


def add_makespan(f: Formulation) -> MakespanRows:
    """Add the makespan rows to ``f``'s program; the returned object reads the order back."""
    return MakespanRows(f)
