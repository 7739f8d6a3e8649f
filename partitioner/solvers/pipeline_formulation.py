"""The pipeline-stage ILP: the semantics of :mod:`partitioner.solvers.pipeline` as linear rows.

In: a :class:`~partitioner.solvers.problem.Problem` whose ``options.pipeline`` is set, the units
to write it in and an optional cutoff (as for :class:`~partitioner.solvers.formulation.Formulation`).
Out: :class:`PipelineFormulation`, a :class:`~partitioner.solvers.milp.Milp` with the same
handles as the placement formulation (``start_values``, ``placement``, ``canonical``), so
:func:`~partitioner.solvers.ilp.solve_ilp` runs it on HiGHS or CBC and checks its answer
against :func:`~partitioner.solvers.problem.evaluate` like any other.

Columns and rows (devices ``a < b`` in profile order; time ``units.time`` per second, memory
``units.memory`` per byte):

* ``x[v,d]`` binary and ``assign[v]`` as in the placement formulation, with ``stage_order``:
  every edge goes to the same or a later device;
* ``used[d]`` binary, the device holds a node; ``first[a]`` / ``after[a]``: some used device at or
  before / after ``a``;
* ``cross[t,a]`` in [0, 1], tensor ``t`` is alive across the cut after device ``a``:
  ``>= P[producer,a] - P[consumer,a]`` with ``P[v,a] = sum_{d <= a} x[v,d]`` (graph inputs are
  produced at the first stage, graph outputs read by the last);
* ``next[a,b]`` in [0, 1], ``a`` and ``b`` are consecutive stages:
  ``>= used[a] + used[b] - 1 - sum_{a<m<b} used[m]``; ``send[t,a,b] >= cross[t,a] + next[a,b] - 1``:
  the tensor is sent from ``a`` to ``b``;
* ``bottleneck >=`` every stage time and every boundary time (and the work over the most stages
  allowed, a cut that tightens the relaxation), ``optimizer_step >=`` every stage's optimizer
  step, and ``T >= (M - 1) bottleneck + sum of stage times + sum of boundary times + optimizer_step``;
* ``mem_cap[d]``: parameters + tied copies (``tied[p,d]``) + working set (``work[d]``) + in-flight
  activations ``<= capacity``, with GPipe's ``M`` or, for 1F1B, ``k`` = the stages from this one
  to the last, chosen by binaries ``in_flight[d,k]`` (``sum_k in_flight[d,k] >=`` that count; the
  cap ``mem_cap[d][k]`` holds for the largest ``k`` with ``in_flight = 1``);
* ``stage_count``: ``sum used`` equals the stage count asked for, or is at most the devices
  (1F1B: at most ``M``).

The objective is the step time exactly (no term is approximated), so the solver's bound is a
bound on every pipeline placement of the problem. A cutoff leaves out a node's device only when
its compute alone costs more than the cutoff (a step takes at least each stage's time), and a
device the node cannot fit on alone (a stage holds at least the node's parameters, working set
and one micro-batch of its activations): every placement at least as good as the cutoff stays.
"""

from __future__ import annotations

from cost_models.training import parse_optimizer
from partitioner.solvers.formulation import Formulation, Units, _name
from partitioner.solvers.milp import Column, Milp, Term
from partitioner.solvers.pipeline import Schedule
from partitioner.solvers.problem import Placement, Problem

__all__ = ["PipelineFormulation"]


class PipelineFormulation(Formulation):
    """The pipeline ILP of one problem (see the module docstring). It shares the placement
    formulation's assignment columns, stage-order rows, cutoff and warm-start propagation, and
    builds its own rows instead of the placement objective's.

    Example:
        >>> f = PipelineFormulation(problem, Units())          # doctest: +SKIP
        >>> f.placement(f.start_values(placement)) == placement
        True
    """

    def __init__(self, problem: Problem, units: Units = Units(), *, cutoff: float | None = None,
                 deadline: float | None = None) -> None:
        if problem.options.pipeline is None:
            raise ValueError("PipelineFormulation needs a problem with options.pipeline set")
        # not Formulation.__init__: that builds the placement objective's rows
        self.p = problem
        self.units = units
        self.cutoff = cutoff
        self.spec = problem.options.pipeline
        self.allowed = self._allowed()
        self.milp = Milp(deadline)
        self.defined: dict[int, list[int]] = {}
        self.sv: dict[str, dict[str, Column]] = {}  # no weight streaming in a pipeline
        self.qv: dict[str, dict[str, dict[str, Column]]] = {}
        self.forms: dict[str, dict[str, tuple[str, ...]]] = {}
        self.symmetric_pairs: list[tuple[str, str]] = []  # stage order tells devices apart
        self.stream_classes: list[tuple[str, list[str]]] = []
        self.D = list(problem.device_names)
        self._assignment()
        self.stage_order()
        self._used()
        self._crossings()
        self._boundaries()
        self._pipeline_memory()
        self._pipeline_objective()

    def _prefix(self, node: str, a: int) -> list[Term]:
        """``P[node, a]``: the node sits on device ``a`` or before."""
        return [(1.0, self.x(node, d)) for d in self.D[: a + 1] if d in self.allowed[node]]

    def _used(self) -> None:
        p, D, m = self.p, self.D, self.milp
        self.used = {d: m.column(_name("used", d), upper=1.0, integer=True) for d in D}
        for d in D:
            holders = [n for n in p.nodes if d in self.allowed[n]]
            for n in holders:
                self.ge(_name("used_ge", d, n), self.used[d], [(1.0, self.x(n, d))])
            m.row(_name("used_le", d), [(1.0, self.x(n, d)) for n in holders] + [(-1.0, self.used[d])], lower=0.0)
        count = [(1.0, self.used[d]) for d in D]
        if self.spec.stages is not None:
            m.equal("stage_count", count, float(self.spec.stages))
        else:
            m.at_most("stage_count", count, float(self.spec.max_stages(len(D))))
        self.first = {a: m.column(_name("first", D[a]), upper=1.0) for a in range(len(D) - 1)}
        self.after = {a: m.column(_name("after", D[a]), upper=1.0) for a in range(len(D) - 1)}
        for a in range(len(D) - 1):
            for d in D[: a + 1]:
                self.ge(_name("first_ge", D[a], d), self.first[a], [(1.0, self.used[d])])
            for d in D[a + 1:]:
                self.ge(_name("after_ge", D[a], d), self.after[a], [(1.0, self.used[d])])

    def _crossings(self) -> None:
        """cross[t,a]: tensor t alive across the cut after device a (relayed through every stage)."""
        p, D = self.p, self.D
        outputs = set(p.graph.outputs)
        self.cross: dict[tuple[str, int], Column] = {}
        self.crossing: list[tuple[str, int]] = []
        for t in p.graph.tensors.values():
            readers = list(dict.fromkeys(c for c in t.consumers if c in p.index))
            if t.nbytes <= 0 or (not readers and t.name not in outputs):
                continue
            self.crossing.append((t.name, t.nbytes))
            for a in range(len(D) - 1):
                source = self._prefix(t.producer, a) if t.producer is not None else [(1.0, self.first[a])]
                var = self.cross[(t.name, a)] = self.milp.column(_name("cross", t.name, D[a]), upper=1.0)
                for c in readers:
                    self.ge(_name("cross_ge", t.name, c, D[a]), var,
                            source + [(-coef, v) for coef, v in self._prefix(c, a)])
                if t.name in outputs:
                    self.ge(_name("cross_out", t.name, D[a]), var, source + [(1.0, self.after[a]), (-1.0, 1.0)])

    def _boundaries(self) -> None:
        """next[a,b]: consecutive stages; send[t,a,b]: t sent from a to b; the boundary times."""
        p, D, tu = self.p, self.D, self.units.time
        self.e: dict[tuple[int, int], Column] = {}
        self.h: dict[tuple[str, int, int], Column] = {}
        self.boundary: dict[tuple[int, int], list[Term]] = {}
        for a in range(len(D)):
            for b in range(a + 1, len(D)):
                e = self.e[(a, b)] = self.milp.column(_name("next", D[a], D[b]), upper=1.0)
                self.ge(_name("next_ge", D[a], D[b]), e,
                        [(1.0, self.used[D[a]]), (1.0, self.used[D[b]]), (-1.0, 1.0)]
                        + [(-1.0, self.used[D[k]]) for k in range(a + 1, b)])
                pairs: list[Term] = []
                for t, nbytes in self.crossing:
                    h = self.h[(t, a, b)] = self.milp.column(_name("send", t, D[a], D[b]), upper=1.0)
                    self.ge(_name("send_ge", t, D[a], D[b]), h, [(1.0, self.cross[(t, a)]), (1.0, e), (-1.0, 1.0)])
                    pairs.append((tu * p.transfer_s(nbytes, D[a], D[b]), h))
                self.boundary[(a, b)] = pairs

    def _pipeline_memory(self) -> None:
        p, D, m, mu = self.p, self.D, self.milp, self.units.memory
        factor = 2 + parse_optimizer(p.options.optimizer).state_copies if p.options.training else 1
        self.work: dict[str, Column] = {}
        self.z: dict[tuple[str, str], Column] = {}
        self.r: dict[tuple[str, int], Column] = {}
        most = self.spec.max_stages(len(D))
        gpipe = self.spec.schedule is Schedule.GPIPE
        for i, d in enumerate(D):
            terms: list[Term] = [(mu * p.param_mem[n], self.x(n, d)) for n in p.nodes]
            work = self.work[d] = m.column(_name("work", d))
            terms.append((1.0, work))
            for n in p.nodes:
                if p.work_mem[n] > 0 and d in self.allowed[n]:
                    self.ge(_name("working_set", n, d), work, [(mu * p.work_mem[n], self.x(n, d))])
            for sp in p.shared:
                z = self.z[(sp.name, d)] = m.column(_name("tied", sp.name, d), upper=1.0)
                for u in dict.fromkeys(sp.users):
                    self.ge(_name("tied_ge", sp.name, u, d), z, [(1.0, self.x(u, d)), (-1.0, self.x(sp.owner, d))])
                terms.append((mu * factor * sp.bytes, z))
            saved = [(mu * p.saved[n], self.x(n, d)) for n in p.nodes if p.saved[n]]
            cap = mu * p.capacity[d]
            if not saved:
                m.at_most(_name("mem_cap", d), terms, cap)
            elif gpipe:
                m.at_most(_name("mem_cap", d), terms + [(self.spec.micro_batches * c, v) for c, v in saved], cap)
            else:  # 1F1B: k = stages from this one to the last, via in_flight[d,k] (see the docstring)
                r = {k: m.column(_name("in_flight", d, str(k)), upper=1.0, integer=True) for k in range(1, most + 1)}
                self.r.update({(d, k): v for k, v in r.items()})
                for k in range(1, most):
                    m.row(_name("in_flight_order", d, str(k)), [(1.0, r[k]), (-1.0, r[k + 1])], lower=0.0)
                m.row(_name("in_flight_count", d), [(1.0, v) for v in r.values()]
                      + [(-1.0, self.used[later]) for later in D[i:]] + [(-float(most), self.used[d])],
                      lower=-float(most))
                big = mu * most * sum(p.saved[n] for n in p.nodes if d in self.allowed[n])
                for k, v in r.items():
                    m.at_most(_name("mem_cap", d, str(k)),
                              terms + [(min(k, self.spec.micro_batches) * c, x) for c, x in saved]
                              + [(big, v), (-big, 1.0)], cap)

    def _pipeline_objective(self) -> None:
        p, D, m, tu = self.p, self.D, self.milp, self.units.time
        self.tau = m.column("bottleneck")
        self.omega = m.column("optimizer_step")
        total: list[Term] = []
        for d in D:
            stage = [(tu * p.compute[n][d], self.x(n, d)) for n in p.nodes if d in self.allowed[n]]
            self.ge(_name("stage_time", d), self.tau, stage)
            total += stage
            if p.options.training:
                self.ge(_name("optimizer", d), self.omega,
                        [(tu * p.opt_step[n][d], self.x(n, d)) for n in p.nodes if p.opt_step[n][d]])
        # at most `most` stages, each at most the bottleneck: a cut that tightens the LP relaxation
        most = self.spec.max_stages(len(D))
        self.ge("bottleneck_share", self.tau, [(c / most, v) for c, v in total])
        for (a, b), pairs in self.boundary.items():
            if pairs:
                self.ge(_name("boundary_time", D[a], D[b]), self.tau, pairs)
                total += pairs
        self.T = m.column("T", cost=1.0)
        self.ge("step", self.T, total + [(float(self.spec.micro_batches - 1), self.tau), (1.0, self.omega)])

    # -- warm start and answer ----------------------------------------------------------------

    def start_values(self, placement: Placement) -> list[float]:
        """The value of every column under ``placement``: the assignment and 1F1B's in-flight
        counts set, every other column at the least value its rows allow."""
        dev = placement.device
        values = [v if v > -float("inf") else 0.0 for v in self.milp.lower]
        for n, per_d in self.xv.items():
            for d, v in per_d.items():
                values[v.index] = 1.0 if dev[n] == d else 0.0
        stages = [d for d in self.D if any(dev[n] == d for n in self.p.nodes)]
        for (d, k), r in self.r.items():
            count = len(stages) - stages.index(d) if d in stages else 0
            values[r.index] = 1.0 if k <= count else 0.0
        self._propagate(values)
        return values

    def placement(self, values: list[float]) -> Placement:
        """The placement a solution vector describes (no streaming, no issue order)."""
        return Placement(self.devices(values))
