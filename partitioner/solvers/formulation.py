"""The placement ILP: :func:`~partitioner.solvers.problem.evaluate` written as linear constraints.

In: a :class:`~partitioner.solvers.problem.Problem` and the units to write it in. Out: a
:class:`Formulation` holding the :class:`~partitioner.solvers.milp.Milp`, the value vector of a
placement (a warm start) and the placement of a value vector (the answer).

Columns and rows (``DESIGN.md``, "Solvers"), in the model's units (time ``unit.time`` per second,
memory ``unit.memory`` per byte, chosen by ``ilp.py`` so that the numbers stay well scaled):

* ``x[v,d]`` binary, node ``v`` runs on ``d``; ``assign[v]``: one device each. Pins and
  unsupported pairs are not columns: ``x`` is then the constant 0 or 1;
* ``s[v,d]`` binary, ``v`` runs on accelerator ``d`` with its weights streamed from the host,
  ``s <= x``; where ``v`` may stream in several forms there (inference with precision: every
  choice it has on ``d``, packed ones included), ``q[v,d,a]`` binary, it streams them held in
  choice ``a``'s form: ``stream_forms[v,d]``: ``sum_a q = s``, ``stream_in[v,d,a]``:
  ``q <= r[v,d,a]``; host memory, link load, link budget and the device's buffer are priced per
  ``q`` (a packed linear's stream is its packed bytes);
* copies of activations, once per tensor and destination however many consumers read it there
  (the *arrival* form, tighter than one row per (consumer, source, destination)):
  ``sum_a y[t,a,b] >= x[consumer,b] - x[producer,b]`` for each consumer, and
  ``y[t,a,b] <= x[producer,a]`` where the producer has several possible sources. A copy whose two
  ends are fixed is a constant and no column stands for it (so it is counted once);
* ``z[p,d]``: a shared parameter is copied to ``d`` where a reader runs and it is not resident;
* training state (:mod:`partitioner.solvers.train_state_rows`): ``o[v,d]`` (optimizer state on the
  host, weights on ``d``), ``c[v,d]`` (recompute), and with ``latency`` the host worker's chain
  (``S``, ``Q``, ``W``); in training ``s[v,d]`` streams the weights in both passes;
* ``mem_cap[d]``: resident parameters + saved activations + largest working set + largest stream
  buffer ``<= capacity``; each largest as a staircase of binaries ``work[d][k]`` /
  ``stream_buffer[d][k]`` ("something of at least the k-th size is on d", see
  :meth:`Formulation.largest`); no row where everything that could be on ``d`` fits at once;
* ``link_budget[l]``, ``stage_order``: the optional byte budgets and pipeline order;
* latency: ``T >=`` compute + copies + shared-parameter copies + stream issue; throughput: ``T >=``
  each device's load; makespan: see :mod:`partitioner.solvers.makespan`; every objective:
  ``T >=`` each link's load;
* precision (``Options.precision``): where node ``v`` may compute in several dtypes on ``d``,
  ``r[v,d,a]`` binary with ``dtype[v,d]``: ``sum_a r[v,d,a] = x[v,d]`` (elsewhere ``r`` is ``x`` for
  the one dtype, or 0): the decision is (device, dtype). Compute, parameters, working set and
  saved activations are priced per ``r``; a stream in one form only (training: float32) needs it
  (``stream_form``: ``s[v,d] <= r[v,d,form]``);
  a copy is sized by the largest dtype its producer may hold it in on the source, and
  ``half[t,a,b] <= y[t,a,b]``, ``half <= sum_low r[producer,a,low]`` takes back the bytes saved
  when it crosses in 16 bits; ``cast[t,c,d] >= [c reads in a on d] - [t held in a]`` for each
  dtype ``a`` prices a reader's cast, and ``r[v,d,low]`` the cast of a 16-bit graph output;
  ``error_budget``: with ``precision.max_error``, ``sum e2[v,a] r[v,d,a] <= budget^2`` over packed
  choices (:mod:`partitioner.solvers.packing_error`);
* ``symmetry[d1,d2,k]``: between two interchangeable devices (same figures, same links, same
  cap, no pins, the same nodes allowed) the first node placed on either goes to the first one;
* ``stream_order[a,b,d]``: nodes whose weights are interchangeable when streamed to ``d`` (same
  bytes and stream copies, no shared parameter, one dtype: the 96 expert projections of the MoE
  decoder) stream in a fixed order, ``s[b,d] >= s[a,d] + x[b,d] - 1`` for consecutive members
  ``a``, ``b``; which of them streams changes no cost and no memory, and without the order the
  search went through each equal choice (MoE decoder on cpu-gpu-npu, its finest level alone:
  HiGHS seeds 0-3 took 6.3 / 16.7 / 12.6 / 12.8 s to 1%, with the rows 4.2 / 8.2 / 5.5 / 4.6 s).
  They are *ordering* rows (``Milp.row(ordering=True)``): the incumbent-seeking (searching) run of
  a HiGHS run drops them (:meth:`Milp.without_ordering`); a warm start obeys both kinds after
  :meth:`Formulation.canonical`.

* splits (``Options.splits``, :mod:`partitioner.solvers.splits`): ``k[v,split]`` binary, ``v`` is
  split so; ``split_home[v,split]``: ``k <= x[v,home]`` (``x`` then means "``v``'s home is ``d``");
  ``split_or_stream[v]``: ``sum k + sum s <= 1``. Each ``k`` replaces the whole op's compute on its
  home by the split's (latency: its path; throughput: each shard on its device), its parameters on
  its home by the home shard's and adds each other shard's parameters and working set to that
  device's ``mem_cap``, and loads the links with its copies. Row and column names carry the
  split's label (``k[lm_head][cols[cuda:0=0.75,cpu=0.25]]``). A time split
  (:mod:`partitioner.solvers.chunked_streaming`, ``k[lm_head][time[cuda:0<-cpu,8]]``) is one more
  such column: its pipelined chunks' time on its home, the bias resident there and the weight on
  the host, its working set with its chunk buffers one more ``work`` item of the home's staircase,
  and one copy per chunk on the link;
* split regions (:mod:`partitioner.solvers.split_region_rows`): ``g[row][split]``, the AND of a
  region's members' ``k`` and its interior nodes' ``x``, with the region's saving in the time,
  link and memory rows;

With a ``cutoff`` (the objective of a known placement, seconds), an option that alone would add
more than that to the objective (a node on a device, a copy over a route, a stream, a shared
parameter copy) cannot be part of a better placement and is left out: no column, and a row
``x[producer,a] + x[consumer,b] <= 1`` where a copy is refused. Every placement at least as good
as the cutoff stays in the model, and no coefficient is much larger than the objective.

Row names carry node and device names (``mem_cap[cuda:0]``, ``assign[layers.3.attn]``) so an
infeasible model can be explained; they are unique by construction (:class:`Milp` refuses a
duplicate).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping

from partitioner.solvers.milp import Column, Milp, Term, value
from cost_models.precision import FLOAT32, LOW, activations
from partitioner.solvers.problem import Objective, Placement, Problem, StreamMode, list_schedule, node_dtypes
from partitioner.solvers.split_region_rows import RegionColumns
from partitioner.solvers.train_state_rows import TrainStateColumns


@dataclasses.dataclass(frozen=True)
class Units:
    """Model units: ``time`` per second, ``memory`` per byte."""

    time: float = 1e6
    memory: float = 1e-6


@dataclasses.dataclass(frozen=True)
class Copy:
    """Tensor ``tensor`` crosses ``src -> dst`` when ``term`` is 1 (a column, or the constant 1)."""

    tensor: str
    src: str
    dst: str
    nbytes: int
    term: Column | float


def _name(kind: str, *parts: str) -> str:
    return kind + "".join(f"[{p}]" for p in parts)


class Formulation:
    """The ILP of one problem, with handles on its columns.

    Example:
        >>> f = Formulation(problem, Units())
        >>> f.milp.num_cols > 0, f.placement(f.start_values(placement)) == placement   # doctest: +SKIP
    """

    def __init__(self, problem: Problem, units: Units = Units(), *, symmetry: bool = True,
                 cutoff: float | None = None, deadline: float | None = None) -> None:
        self.p = problem
        self.units = units
        self.cutoff = cutoff
        self.allowed = self._allowed()
        self.milp = Milp(deadline)  # past ``deadline`` (perf_counter) the build raises milp.BuildTimeout
        self.defined: dict[int, list[int]] = {}  # column -> rows "column >= ..." that define it
        self._assignment()
        self._dtypes()
        self._error_budget()
        self._streaming()
        self._splits()
        self.regions = RegionColumns(self)
        self.ts = TrainStateColumns(self)
        self._copies()
        self._halves()
        self._casts()
        self._shared()
        self._memory()
        self._link_budgets()
        self._stages()
        # a split names its devices: renaming devices (symmetry) or moving streams (stream order) would
        # have to move splits too, so neither kind of ordering row is written where splits are offered
        ordered = symmetry and not problem.split_choices
        self.symmetric_pairs = interchangeable_devices(problem) if ordered else []
        self._symmetry()
        self.stream_classes = self._stream_classes() if ordered else []
        self._stream_symmetry()
        self.T = self.milp.column("T", cost=1.0)
        objective = problem.options.objective
        if objective is Objective.MAKESPAN:
            from partitioner.solvers.makespan import add_makespan

            self.makespan = add_makespan(self)
        elif objective is Objective.LATENCY and problem.train_state:
            accelerators = [d for d in problem.device_names if d != problem.host]
            sequential = self.compute_terms(steps=accelerators) + self.copy_terms() + self.shared_terms() \
                + self.issue_terms() + self.ts.recompute_terms() + self.ts.saved_issue_terms()
            self.ts.latency_rows(self.T, sequential)
        elif objective is Objective.LATENCY:
            self.ge("critical_path", self.T, self.compute_terms() + self.copy_terms() + self.shared_terms()
                    + self.issue_terms() + self.split_terms())
        else:
            for d in problem.device_names:
                self.ge(_name("device_load", d), self.T,
                        self.compute_terms(d) + self.shared_terms(d) + self.issue_terms(d)
                        + self.ts.recompute_terms(d) + self.split_terms(d) + self.ts.saved_issue_terms(d))
        for label in problem.link_labels:
            terms = self.link_terms(label)
            if terms:
                self.ge(_name("link_load", label), self.T, terms)

    # -- helpers ------------------------------------------------------------------------------

    def too_dear(self, seconds: float) -> bool:
        """Whether an option costing ``seconds`` on its own cannot be in a placement under the cutoff."""
        return self.cutoff is not None and seconds > self.cutoff * (1 + 1e-9) + 1e-300

    def _allowed(self) -> dict[str, tuple[str, ...]]:
        """The devices each node may use here: not too dear, and with room for the node alone."""
        out = {}
        p = self.p
        for n in p.nodes:
            homed = {d: [sp for sp in p.split_choices.get(n, ()) if sp.home == d and p.split_fits(n, sp)]
                     for d in p.allowed[n]}
            cheap = tuple(d for d in p.allowed[n]
                          if (not self.too_dear(min(p.compute_in[n][d].values())) and p.fits_alone(n, d))
                          or any(not self.too_dear(p.split_floor(n, sp)) for sp in homed[d]))
            out[n] = cheap or p.allowed[n]
        return out

    def copy_cost(self, nbytes: int, src: str, dst: str) -> float:
        """The least a copy adds to the objective: its time (latency, makespan), or its busiest hop."""
        p = self.p
        if p.options.objective is Objective.THROUGHPUT:
            factor = 2 if p.options.training else 1
            return max((factor * p.hop_s(nbytes, src, dst, label) for label in p.hops(src, dst)), default=0.0)
        return p.transfer_s(nbytes, src, dst)

    def ge(self, name: str, lhs: Column, terms: list[Term]) -> None:
        """``lhs >= sum(terms)``, remembered as one of the rows defining ``lhs``."""
        self.defined.setdefault(lhs.index, []).append(self.milp.num_rows)
        self.milp.at_least(name, lhs, terms)

    def x(self, node: str | None, device: str) -> Column | float:
        """The assignment column, or 1.0 / 0.0 where the node is fixed (``None``: the host input)."""
        if node is None:
            return 1.0 if device == self.p.host else 0.0
        if device not in self.allowed[node]:
            return 0.0
        return self.xv[node].get(device, 1.0)

    def r(self, node: str, device: str, dtype: str) -> Column | float:
        """The (device, dtype) column: ``node`` runs on ``device`` in ``dtype`` (or a constant)."""
        if device not in self.allowed[node] or dtype not in self.p.choices[node][device]:
            return 0.0
        per = self.rv.get(node, {}).get(device)
        return per[dtype] if per else self.x(node, device)

    def held_in(self, node: str | None, act: str) -> list[Term]:
        """Terms of "``node`` holds its activations in ``act``" (any choice of that activation dtype)."""
        if node is None:
            return [(1.0 if act == FLOAT32 else 0.0, 1.0)]
        return [(1.0, self.r(node, d, a)) for d in self.allowed[node] for a in self.dtypes_on(node, d)
                if activations(a) == act]

    def dtypes_on(self, node: str, device: str) -> tuple[str, ...]:
        return self.p.choices[node].get(device, ()) if device in self.allowed[node] else ()

    def copy_nbytes(self, t, src: str) -> int:  # noqa: ANN001 - a CrossTensor
        """Bytes a copy of ``t`` from ``src`` carries at most: held in its producer's largest dtype there."""
        if t.producer is None or not t.follows:
            return t.bytes
        dtypes = self.dtypes_on(t.producer, src) or (FLOAT32,)
        return max(self.p.copy_bytes(t, a) for a in dtypes)

    def resident(self, node: str, device: str) -> list[Term]:
        """Terms of "``node``'s own parameters live on ``device``"."""
        terms: list[Term] = [(1.0, self.x(node, device))]
        if device == self.p.host:
            return terms + [(1.0, s) for s in self.sv.get(node, {}).values()]
        s = self.sv.get(node, {}).get(device)
        return terms + ([(-1.0, s)] if s is not None else [])

    # -- columns and rows ---------------------------------------------------------------------

    def _assignment(self) -> None:
        self.xv: dict[str, dict[str, Column]] = {}
        for n in self.p.nodes:
            allowed = self.allowed[n]
            if len(allowed) == 1:
                self.xv[n] = {}
                continue
            self.xv[n] = {d: self.milp.column(_name("x", n, d), upper=1.0, integer=True) for d in allowed}
            self.milp.equal(_name("assign", n), [(1.0, v) for v in self.xv[n].values()], 1.0)

    def _dtypes(self) -> None:
        self.rv: dict[str, dict[str, dict[str, Column]]] = {}
        for n in self.p.nodes:
            for d in self.allowed[n]:
                dtypes = self.p.choices[n][d]
                if len(dtypes) < 2:
                    continue
                cols = self.rv.setdefault(n, {})[d] = {
                    a: self.milp.column(_name("r", n, d, a), upper=1.0, integer=True) for a in dtypes}
                self.milp.equal(_name("dtype", n, d), [(1.0, c) for c in cols.values()]
                                + [(-1.0, self.x(n, d))], 0.0)

    def _error_budget(self) -> None:
        """``error_budget``: the packed weights' squared errors sum to at most the budget squared
        (:mod:`partitioner.solvers.packing_error`), written divided by it (a right-hand side of 1)."""
        budget = self.p.precision.estimate_budget if self.p.precision is not None else None
        if budget is None:
            return
        terms: list[Term] = [(e2 / budget ** 2, self.r(n, d, a))
                             for n, per in self.p.error_squares.items() for d in self.allowed[n]
                             for a, e2 in per.items() if e2 > 0 and a in self.dtypes_on(n, d)]
        if terms:
            self.milp.at_most("error_budget", terms, 1.0 + 1e-9)

    def _streaming(self) -> None:
        self.sv: dict[str, dict[str, Column]] = {}
        self.qv: dict[str, dict[str, dict[str, Column]]] = {}  # node -> device -> stream form -> column
        self.forms: dict[str, dict[str, tuple[str, ...]]] = {}  # node -> device -> forms it may stream in
        p = self.p
        for n in p.streamable:
            for d in self.allowed[n]:
                if d == p.host or self.too_dear(p.node_stream_issue_s(n, d)):
                    continue
                forms = tuple(a for a in p.stream_forms(n, d) if a in self.dtypes_on(n, d) and not any(
                    self.too_dear(p.node_stream_hop_s(n, p.host, d, lbl, choice=a)) for lbl in p.hops(p.host, d)))
                if forms:
                    self.forms.setdefault(n, {})[d] = forms
            for d, forms in self.forms.get(n, {}).items():
                s = self.sv.setdefault(n, {})[d] = self.milp.column(_name("s", n, d), upper=1.0, integer=True)
                if isinstance(self.x(n, d), Column):
                    self.milp.at_most(_name("stream_le_x", n, d), [(1.0, s), (-1.0, self.x(n, d))], 0.0)
                if d not in self.rv.get(n, {}):
                    continue  # one dtype there: the stream's form
                if len(forms) == 1:  # the host holds streamed weights in one form: the node computes in it
                    self.milp.at_most(_name("stream_form", n, d), [(1.0, s), (-1.0, self.r(n, d, forms[0]))], 0.0)
                    continue
                # several forms: q[v,d,a] = "streams in a's form", one of them when s, each only with r[v,d,a]
                q = self.qv.setdefault(n, {})[d] = {
                    a: self.milp.column(_name("q", n, d, a), upper=1.0, integer=True) for a in forms}
                self.milp.equal(_name("stream_forms", n, d), [(1.0, c) for c in q.values()] + [(-1.0, s)], 0.0)
                for a, c in q.items():
                    self.milp.at_most(_name("stream_in", n, d, a), [(1.0, c), (-1.0, self.r(n, d, a))], 0.0)

    def streams(self, n: str, d: str) -> list[tuple[str, Column]]:
        """``(form, column)``: ``n`` streams its weights to ``d`` held in ``form`` when the column is 1."""
        per = self.qv.get(n, {}).get(d)
        if per:
            return list(per.items())
        s = self.sv.get(n, {}).get(d)
        return [(self.forms[n][d][0], s)] if s is not None else []

    def _splits(self) -> None:
        """``k[v,split]`` columns for the splits each node may take (home allowed here, fits alone)."""
        p = self.p
        self.kv: dict[str, dict] = {}
        for n, choices in p.split_choices.items():
            cols = {}
            for sp in choices:
                home = self.x(n, sp.home)
                if isinstance(home, float) and home == 0.0 or not p.split_fits(n, sp) \
                        or self.too_dear(p.split_floor(n, sp)):
                    continue
                k = cols[sp] = self.milp.column(_name("k", n, sp.label), upper=1.0, integer=True)
                if isinstance(home, Column):
                    self.milp.at_most(_name("split_home", n, sp.label), [(1.0, k), (-1.0, home)], 0.0)
            if not cols:
                continue
            self.kv[n] = cols
            streams = [(1.0, s) for s in self.sv.get(n, {}).values()]
            self.milp.at_most(_name("split_or_stream", n), [(1.0, k) for k in cols.values()] + streams, 1.0)

    def split_terms(self, device: str | None = None) -> list[Term]:
        """What the chosen splits change in the time rows: with ``latency`` (``device`` None) each
        split's path in place of its whole op's compute on its home; per device (throughput) each
        shard in place of the whole op on the home and beside it on each other device."""
        p, tu = self.p, self.units.time
        terms: list[Term] = []
        for n, cols in self.kv.items():
            for sp, k in cols.items():
                price = p.split_price[(n, sp)]
                whole = p.compute[n][sp.home]
                if device is None:
                    terms.append((tu * (price.latency_s - whole), k))
                elif device == sp.home:
                    terms.append((tu * (price.shard_s[0] - whole), k))
                elif device in sp.others:
                    terms.append((tu * price.shard_s[sp.devices.index(device)], k))
        return terms + self.regions.time_terms(device)

    def split_memory_terms(self, device: str) -> list[Term]:
        """Parameter bytes the chosen splits move on ``device``: the home shard in place of the whole
        weight, each other shard added."""
        p, mu = self.p, self.units.memory
        terms: list[Term] = []
        for n, cols in self.kv.items():
            for sp, k in cols.items():
                price = p.split_price[(n, sp)]
                if device == sp.home:
                    terms.append((mu * (price.param_bytes[0] - p.param_mem[n]), k))
                elif device in sp.others:
                    terms.append((mu * price.param_bytes[sp.devices.index(device)], k))
        return terms

    def split_link_terms(self, label: str, budget: bool) -> list[Term]:
        """Each chosen split's copies on link ``label`` (seconds, or bytes for a budget)."""
        p, tu, mu = self.p, self.units.time, self.units.memory
        terms: list[Term] = []
        for n, cols in self.kv.items():
            for sp, k in cols.items():
                for src, dst, nbytes, _ in p.split_price[(n, sp)].copies:  # a time split: one per chunk
                    if label in p.hops(src, dst):
                        terms.append((mu * nbytes if budget else tu * p.hop_s(nbytes, src, dst, label), k))
        return terms + self.regions.link_terms(label, budget)

    def _copies(self) -> None:
        """One ``Copy`` per (tensor, source, destination) that may happen; see the module docstring."""
        p, allowed = self.p, self.allowed
        self.copies: list[Copy] = []
        self.y_multi: dict[tuple[str, str], list[tuple[str, Column]]] = {}  # (tensor, dst) -> sources
        for t in p.tensors:
            sources = allowed[t.producer] if t.producer is not None else (p.host,)
            destinations = dict.fromkeys(b for c in t.consumers for b in allowed[c])
            for b in destinations:
                origins = [a for a in sources if a != b]
                if not origins:
                    continue
                readers = [c for c in t.consumers if b in allowed[c]]
                demands = [(self.x(c, b), c) for c in readers]
                stay = self.x(t.producer, b)
                if isinstance(stay, float) and any(isinstance(xc, float) and xc >= 1 for xc, _ in demands) \
                        and stay == 0 and len(origins) == 1:
                    self.copies.append(Copy(t.name, origins[0], b, self.copy_nbytes(t, origins[0]), 1.0))  # both ends fixed
                    continue
                dear = [a for a in origins if self.too_dear(self.copy_cost(self.least_bytes(t, a), a, b))]
                for a in dear:  # never both: the copy alone costs more than the cutoff
                    for xc, c in demands:
                        self.milp.at_most(_name("no_copy", t.name, c, a, b), [(1.0, self.x(t.producer, a)), (1.0, xc)], 1.0)
                origins = [a for a in origins if a not in dear]
                if not origins:
                    continue
                if len(origins) == 1 and not dear:
                    (a,) = origins
                    y = self.milp.column(_name("y", t.name, a, b), upper=1.0)
                    for xc, c in demands:
                        self.ge(_name("send", t.name, c, b), y, [(1.0, xc), (-1.0, stay)])
                    self.copies.append(Copy(t.name, a, b, self.copy_nbytes(t, a), y))
                    continue
                ys = [(a, self.milp.column(_name("y", t.name, a, b), upper=1.0)) for a in origins]
                for xc, c in demands:
                    self.milp.row(_name("send", t.name, c, b),
                                  [(1.0, y) for _, y in ys] + [(-1.0, xc), (1.0, stay)]
                                  + [(1.0, self.x(t.producer, a)) for a in dear], lower=0.0)
                for a, y in ys:
                    self.milp.at_most(_name("from", t.name, a, b), [(1.0, y), (-1.0, self.x(t.producer, a))], 0.0)
                    self.copies.append(Copy(t.name, a, b, self.copy_nbytes(t, a), y))
                self.y_multi[(t.name, b)] = ys

    def least_bytes(self, t, src: str) -> int:  # noqa: ANN001 - a CrossTensor
        """Bytes a copy of ``t`` from ``src`` carries at least (its producer's smallest dtype there)."""
        if t.producer is None or not t.follows:
            return t.bytes
        return min(self.p.copy_bytes(t, a) for a in (self.dtypes_on(t.producer, src) or (FLOAT32,)))

    def _halves(self) -> None:
        """``half`` columns: a copy that crosses in 16 bits carries half its float32 bytes."""
        p = self.p
        self.halves: list[tuple[Copy, Column, int]] = []  # (copy, column, bytes saved)
        info = p.tensor_info
        for k, cp in enumerate(self.copies):
            t = info[cp.tensor]
            saved = cp.nbytes - self.least_bytes(t, cp.src)
            if saved <= 0:
                continue
            low = [(1.0, self.r(t.producer, cp.src, a)) for a in self.dtypes_on(t.producer, cp.src) if activations(a) in LOW]
            u = self.milp.column(_name("half", cp.tensor, cp.src, cp.dst), upper=1.0)
            if isinstance(cp.term, Column):
                self.milp.at_most(_name("half_le_copy", cp.tensor, cp.src, cp.dst), [(1.0, u), (-1.0, cp.term)], 0.0)
            self.milp.at_most(_name("half_le_low", cp.tensor, cp.src, cp.dst), [(1.0, u)] + [(-c, v) for c, v in low], 0.0)
            self.halves.append((cp, u, saved))

    def _casts(self) -> None:
        """``cast`` columns (a reader casts a tensor held in another dtype) and 16-bit outputs' casts."""
        p = self.p
        self.cast_cols: list[tuple[str, str, float, Column | float]] = []  # (node, device, seconds, term)
        if p.precision is None:
            return
        for t in p.tensors:
            if not t.float32:
                continue
            follows = t.follows and t.producer is not None
            if follows:
                held_as = {activations(a) for d in self.allowed[t.producer] for a in self.dtypes_on(t.producer, d)}
            else:
                held_as = {FLOAT32}
            holder = t.producer if follows else None  # a tensor that does not follow is held in float32
            for c, (in_node_dtype, in_float32) in zip(t.consumers, t.reads):
                for d in self.allowed[c]:
                    for count, in_own in ((in_node_dtype, True), (in_float32, False)):
                        if count:
                            self._cast(t.name, held_as, holder, c, d, count, in_own)
        for name, u, nbytes in p.output_casts:
            for d in self.allowed[u]:
                for a in self.dtypes_on(u, d):
                    if activations(a) != FLOAT32:
                        self.cast_cols.append((u, d, p.cast_s(nbytes, d), self.r(u, d, a)))

    def _cast(self, tensor: str, held_as: set[str], holder: str | None, c: str, d: str, count: int,
              in_own: bool) -> None:
        """The cast ``count`` member ops of ``c`` on ``d`` make of ``tensor`` (held by ``holder``'s dtype,
        or float32 without one) when they read it in ``c``'s dtype (``in_own``) or in float32."""
        options: dict[str, list[str]] = {}  # activation dtype -> the reader's choices reading in it
        for a in (self.dtypes_on(c, d) if in_own else (FLOAT32,)):
            options.setdefault(activations(a), []).append(a)
        rows = []
        for act, choices in options.items():
            if held_as == {act}:
                continue  # never a mismatch in act
            reader = [(1.0, self.r(c, d, a)) for a in choices] if in_own else [(1.0, self.x(c, d))]
            rows.append((act, reader + [(-k, v) for k, v in self.held_in(holder, act)]))
        if not rows:
            return
        seconds = count * self.p.cast_s(self.p.tensor_info[tensor].bytes, d)
        if all(not isinstance(v, Column) for _, terms in rows for _, v in terms):
            if any(sum(k * float(v) for k, v in terms) >= 1 for _, terms in rows):
                self.cast_cols.append((c, d, seconds, 1.0))
            return
        reading = "own" if in_own else FLOAT32
        k = self.milp.column(_name("cast", tensor, c, d, reading), upper=1.0)
        for a, terms in rows:
            self.ge(_name("cast_need", tensor, c, d, reading, a), k, terms)
        self.cast_cols.append((c, d, seconds, k))

    def cast_terms(self, device: str | None = None, node: str | None = None) -> list[Term]:
        """Cast time, on ``device`` or of ``node`` only when given."""
        tu = self.units.time
        return [(tu * s, v) for n, d, s, v in self.cast_cols
                if (device is None or d == device) and (node is None or n == node)]

    def _shared(self) -> None:
        self.zv: dict[tuple[str, str], Column] = {}
        for sp in self.p.shared:
            for u in sp.users:
                for d in self.allowed[u]:
                    terms = [(1.0, self.x(u, d))] + [(-c, v) for c, v in self.resident(sp.owner, d)]
                    if all(not isinstance(v, Column) for _, v in terms) and sum(c * float(v) for c, v in terms) <= 0:
                        continue  # never copied there
                    if self.too_dear(self.p.shared_param_s(sp, d)):
                        self.milp.at_most(_name("no_shared_copy", sp.name, u, d), terms, 0.0)
                        continue
                    z = self.zv.get((sp.name, d))
                    if z is None:
                        z = self.zv[(sp.name, d)] = self.milp.column(_name("z", sp.name, d), upper=1.0)
                    self.ge(_name("shared", sp.name, u, d), z, terms)

    def _memory(self) -> None:
        p, mu = self.p, self.units.memory
        for d in p.device_names:
            terms: list[Term] = []
            for n in p.nodes:
                terms += self.param_terms(n, d)
                for a in self.dtypes_on(n, d):
                    if p.saved_at[n][a]:
                        terms.append((mu * p.saved_at[n][a], self.r(n, d, a)))
                terms += self.ts.memory_terms(n, d)
            terms += self.split_memory_terms(d)
            work = [(n, mu * p.work_mem_at[n][a], self._whole_work(n, d, a)) for n in p.nodes
                    for a in self.dtypes_on(n, d)]
            work += [(n, mu * p.split_price[(n, sp)].work_bytes[sp.devices.index(d)], k)
                     for n, cols in self.kv.items() for sp, k in cols.items() if d in sp.others]
            work += [(n, mu * p.split_price[(n, sp)].work_bytes[0], k)  # a time split's chunk buffers
                     for n, cols in self.kv.items() for sp, k in cols.items()
                     if sp.home == d and p.split_price[(n, sp)].work_bytes[0] > p.work_mem[n]]
            work += self.regions.work_items(d)  # a region's interior shards
            work = [(n, w, z) for n, w, z in work if w > 0]
            streamed = [(n, mu * p.stream_buffer_bytes(n, StreamMode.PREFETCH, d, a), q)
                        for n in self.sv if d in self.sv[n] for a, q in self.streams(n, d)]
            states = self.ts.state_buffers(d)
            saved = self.ts.saved_buffers(d)
            most = (self._most(terms) + max((w for _, w, _ in work), default=0.0)
                    + max((w for _, w, _ in streamed), default=0.0) + max((w for _, w, _ in states), default=0.0)
                    + max((w for _, w, _ in saved), default=0.0))
            if most <= mu * p.capacity[d]:
                continue  # everything fits on d at once: the cap cannot bind, and no row stands for it
            terms += self.largest("work", d, work) + self.largest("stream_buffer", d, streamed) \
                + self.largest("state_buffer", d, states) + self.largest("saved_buffer", d, saved)
            self.milp.at_most(_name("mem_cap", d), terms, mu * p.capacity[d])

    def _whole_work(self, n: str, d: str, a: str) -> Column | float:
        """What says ``n``'s own working set is on ``d``: ``r[n,d,a]``, or, where a split homed on ``d``
        needs less than the whole op (a time split by expert holds expert groups, not the fused weight's
        view), a column ``whole_work[n,d] >= r - sum k`` (1 only while ``n`` is whole there; its split's
        working set is the split's item)."""
        p, z = self.p, self.r(n, d, a)
        ks = [k for sp, k in self.kv.get(n, {}).items()
              if sp.home == d and p.split_price[(n, sp)].work_bytes[0] < p.work_mem[n]]
        if not ks or not isinstance(z, Column):
            return z
        whole = self.milp.column(_name("whole_work", n, d), upper=1.0)
        self.ge(_name("whole_work", n, d), whole, [(1.0, z)] + [(-1.0, k) for k in ks])
        return whole

    def _most(self, terms: list[Term]) -> float:
        """The largest value ``terms`` can take (columns at their bounds)."""
        m = self.milp
        return sum(c * (m.upper[t.index] if c > 0 else m.lower[t.index]) if isinstance(t, Column) else c * t
                   for c, t in terms)

    def largest(self, kind: str, d: str, items: list[tuple[str, float, Column | float]]) -> list[Term]:
        """Terms worth the largest weight ``w`` among the ``(node, w, z)`` items whose ``z`` is 1 on
        ``d`` (0 if none), written as a staircase: with the distinct weights ``w_1 < ... < w_K``
        above the floor (the largest weight already fixed at 1), ``level[k]`` is 1 when some item of
        weight ``>= w_k`` is present (``level[k] >= z`` for the items of weight ``w_k``,
        ``level[k-1] >= level[k]``) and the value is ``floor + sum_k (w_k - w_{k-1}) level[k]``.
        Exact at integer points, like one column ``>= w z`` per item, but tighter in the relaxation
        (several fractional items add up step by step instead of only the largest ``w z``
        counting), and each level is a binary the solver can branch on ("is anything that large on
        ``d``"), which the single maximum was not."""
        floor = max((w for _, w, z in items if not isinstance(z, Column) and z == 1.0), default=0.0)
        present = [(n, w, z) for n, w, z in items if isinstance(z, Column) and w > floor]
        weights = sorted({w for _, w, _ in present})
        at: dict[float, dict[str, list[Term]]] = {w: {} for w in weights}
        for n, w, z in present:  # a node's dtypes of one weight: at most one of them is 1
            at[w].setdefault(n, []).append((1.0, z))
        terms: list[Term] = [(floor, 1.0)] if floor else []
        above: Column | None = None
        for k in range(len(weights) - 1, -1, -1):  # top down, so each level's rows follow the next one's
            level = self.milp.column(_name(kind, d, str(k)), upper=1.0, integer=True)
            terms.append((weights[k] - (weights[k - 1] if k else floor), level))
            if above is not None:
                self.ge(_name(f"{kind}_step", d, str(k)), level, [(1.0, above)])
            for n, zs in at[weights[k]].items():
                self.ge(_name(f"{kind}_of", n, d, str(k)), level, zs)
            above = level
        return terms

    def param_terms(self, n: str, d: str) -> list[Term]:
        """Memory of ``n``'s own parameters on ``d`` (in the choice it computes in; streamed: on the host, in
        the form it is streamed in, :meth:`~partitioner.solvers.problem.Problem.stream_forms`)."""
        p, mu = self.p, self.units.memory
        if p.precision is None:
            return [(mu * c * p.param_mem[n], v) for c, v in self.resident(n, d)]
        terms: list[Term] = [(mu * p.param_mem_at[n][a], self.r(n, d, a)) for a in self.dtypes_on(n, d)]
        if d == p.host:
            return terms + [(mu * p.stream_mem(n, t, a), q) for t in self.sv.get(n, {}) for a, q in self.streams(n, t)]
        return terms + [(-mu * p.param_mem_at[n][a], q) for a, q in self.streams(n, d)]

    def link_terms(self, label: str, *, budget: bool = False) -> list[Term]:
        """Load on link ``label``: model time (or memory units of bytes when ``budget``)."""
        p, tu, mu = self.p, self.units.time, self.units.memory
        factor = 2 if p.options.training else 1
        terms: list[Term] = []
        for cp in self.copies:
            if label in p.hops(cp.src, cp.dst):
                terms.append((mu * cp.nbytes if budget else tu * factor * p.hop_s(cp.nbytes, cp.src, cp.dst, label),
                              cp.term))
        for cp, u, saved in self.halves:
            if label in p.hops(cp.src, cp.dst):
                less = cp.nbytes - saved
                terms.append((-mu * saved if budget else
                              -tu * factor * (p.hop_s(cp.nbytes, cp.src, cp.dst, label)
                                              - p.hop_s(less, cp.src, cp.dst, label)), u))
        for n, per_d in self.sv.items():
            for d in per_d:
                if label in p.hops(p.host, d):
                    terms += [(mu * p.stream_bytes(n, d, a) if budget
                               else tu * p.node_stream_hop_s(n, p.host, d, label, choice=a), q)
                              for a, q in self.streams(n, d)]
        return terms + self.ts.link_terms(label, budget) + self.split_link_terms(label, budget)

    def _link_budgets(self) -> None:
        for label, limit in self.p.options.link_budget.items():
            if label in self.p.link_labels:
                self.milp.at_most(_name("link_budget", label), self.link_terms(label, budget=True),
                                  self.units.memory * limit)

    def _stages(self) -> None:
        if self.p.options.contiguous_stages:
            self.stage_order()

    def stage_order(self) -> None:
        """Devices form a pipeline in profile order: no edge goes back to an earlier device."""
        stage = {d: i for i, d in enumerate(self.p.device_names)}
        for t in self.p.tensors:
            if t.producer is None:
                continue
            for c in t.consumers:
                terms = [(float(stage[d]), self.x(c, d)) for d in self.allowed[c]]
                terms += [(-float(stage[d]), self.x(t.producer, d)) for d in self.allowed[t.producer]]
                self.milp.row(_name("stage_order", t.name, c), terms, lower=0.0)

    def _symmetry(self) -> None:
        """For interchangeable devices d1 < d2: a node may use d2 only if an earlier node uses d1."""
        self.used_before: list[tuple[str, str, list[tuple[str, Column | None]]]] = []
        for d1, d2 in self.symmetric_pairs:
            nodes = [n for n in self.p.nodes if isinstance(self.x(n, d1), Column)]
            cols: list[tuple[str, Column | None]] = []
            used: Column | None = None  # "d1 runs a node before this one", at most 1
            for k, n in enumerate(nodes):
                cols.append((n, used))
                if used is None:
                    self.milp.at_most(_name("symmetry", d1, d2, n), [(1.0, self.x(n, d2))], 0.0)
                else:
                    self.milp.at_most(_name("symmetry", d1, d2, n), [(1.0, self.x(n, d2)), (-1.0, used)], 0.0)
                if k + 1 < len(nodes):
                    nxt = self.milp.column(_name("used_before", d1, d2, nodes[k + 1]), upper=1.0)
                    prev = [(-1.0, used)] if used is not None else []
                    self.milp.at_most(_name("used_sum", d1, d2, n), [(1.0, nxt), (-1.0, self.x(n, d1))] + prev, 0.0)
                    used = nxt
            self.used_before.append((d1, d2, cols))

    def _stream_classes(self) -> list[tuple[str, list[str]]]:
        """(device, nodes in topological order) whose weights are interchangeable when streamed to
        the device: same bytes, same stream copies, no shared parameter, one dtype there. Of two such
        nodes on the device, which one streams changes no cost and no memory. (None in training:
        where a node sits in backward decides when its host step can start.)"""
        p = self.p
        if p.options.training:
            return []
        with_shared = {n for sp in p.shared for n in (sp.owner, *sp.users)}
        classes: dict[tuple, list[str]] = {}
        for n, per_d in self.sv.items():
            if n in with_shared:
                continue
            for d in per_d:
                if d in self.rv.get(n, {}):
                    continue
                key = (d, p.param_mem[n], p.param_bytes[n], tuple(sorted(p.stream_parts_to(n, d))), p.opt_step[n][d])
                classes.setdefault(key, []).append(n)
        order = {n: i for i, n in enumerate(p.nodes)}
        return [(key[0], sorted(ns, key=order.__getitem__)) for key, ns in classes.items() if len(ns) > 1]

    def _stream_symmetry(self) -> None:
        """Within a class of interchangeable streamed nodes on ``d``: of two consecutive members both
        on ``d``, the earlier one streams only if the later one does (``s2 >= s1 + x2 - 1``), so the
        streamed members on ``d`` are its last ones. (The other direction, the first ones streamed,
        measured slower on the MoE decoder: 25 s to 1% against 4.3 s.)"""
        for d, nodes in self.stream_classes:
            for a, b in itertools.pairwise(nodes):
                self.milp.row(_name("stream_order", a, b, d),
                              [(1.0, self.sv[b][d]), (-1.0, self.sv[a][d]), (-1.0, self.x(b, d))], lower=-1.0,
                              ordering=True)

    def _canonical_streams(self, placement: Placement) -> Placement:
        """``placement`` with the streamed members of each class moved to the class's last members on
        the device (same cost and memory), so that it obeys the ``stream_order`` rows."""
        streamed = dict(placement.streamed)
        for d, nodes in self.stream_classes:
            on = [n for n in nodes if placement.device[n] == d]
            k = sum(n in streamed for n in on)
            for i, n in enumerate(on):
                if i >= len(on) - k:
                    streamed[n] = self.p.host
                else:
                    streamed.pop(n, None)
        return dataclasses.replace(placement, streamed=streamed)

    def canonical(self, placement: Placement) -> Placement:
        """``placement`` made to obey the ordering rows, at the same cost and feasibility: the
        interchangeable devices renamed (among each class, devices are first used in profile
        order), then the streamed members of each stream class moved to its last members."""
        return self._canonical_streams(self._canonical_devices(placement))

    def _canonical_devices(self, placement: Placement) -> Placement:
        if not self.symmetric_pairs:
            return placement
        classes: list[list[str]] = []
        for d1, d2 in self.symmetric_pairs:
            for cls in classes:
                if d1 in cls:
                    cls.append(d2)
                    break
            else:
                classes.append([d1, d2])
        rename: dict[str, str] = {}
        for cls in classes:
            first = {d: len(self.p.nodes) for d in cls}
            for i, n in enumerate(self.p.nodes):
                d = placement.device[n]
                if d in first and first[d] == len(self.p.nodes):
                    first[d] = i
            used_order = sorted(cls, key=lambda d: (first[d], cls.index(d)))
            rename.update(dict(zip(used_order, cls)))
        device = {n: rename.get(d, d) for n, d in placement.device.items()}
        return dataclasses.replace(placement, device=device)

    # -- objective terms ----------------------------------------------------------------------

    def compute_terms(self, device: str | None = None, *, steps: list[str] | None = None) -> list[Term]:
        """Compute time of every node (on ``device`` only, when given) and the optimizer steps (on
        the devices ``steps`` only, when given)."""
        p, tu = self.p, self.units.time
        terms: list[Term] = []
        for n in p.nodes:
            for d in self.allowed[n]:
                if device is None or d == device:
                    terms += [(tu * p.compute_in[n][d][a], self.r(n, d, a)) for a in self.dtypes_on(n, d)]
            for d in p.device_names:  # the optimizer step runs where the optimizer state lives
                if p.opt_step[n][d] and (device is None or d == device) and (steps is None or d in steps):
                    terms += [(tu * p.opt_step[n][d] * c, v) for c, v in self.ts.state_terms(n, d)]
        return terms + self.cast_terms(device)

    def issue_terms(self, device: str | None = None) -> list[Term]:
        """Each prefetched copy's issue latency, charged to the node that waits for it."""
        return [(self.units.time * self.p.node_stream_issue_s(n, d), s)
                for n, per_d in self.sv.items() for d, s in per_d.items() if device is None or d == device]

    def copy_terms(self) -> list[Term]:
        p, tu = self.p, self.units.time
        return [(tu * p.transfer_s(cp.nbytes, cp.src, cp.dst), cp.term) for cp in self.copies] + [
            (-tu * (p.transfer_s(cp.nbytes, cp.src, cp.dst) - p.transfer_s(cp.nbytes - saved, cp.src, cp.dst)), u)
            for cp, u, saved in self.halves]

    def shared_terms(self, device: str | None = None) -> list[Term]:
        shared = {sp.name: sp for sp in self.p.shared}
        return [(self.units.time * self.p.shared_param_s(shared[name], d), z)
                for (name, d), z in self.zv.items() if device is None or d == device]

    # -- warm start and answer ----------------------------------------------------------------

    def start_values(self, placement: Placement) -> list[float]:
        """The value of every column under ``placement`` (auxiliary columns at their least)."""
        p, dev = self.p, placement.device
        values = list(self.milp.lower)
        values = [v if v > -float("inf") else 0.0 for v in values]
        for n, per_d in self.xv.items():
            for d, v in per_d.items():
                values[v.index] = 1.0 if dev[n] == d else 0.0
        dtype = node_dtypes(p, placement)
        for n, per_d in self.rv.items():
            for d, cols in per_d.items():
                for a, v in cols.items():
                    values[v.index] = 1.0 if dev[n] == d and dtype[n] == a else 0.0
        for n, per_d in self.sv.items():
            for d, v in per_d.items():
                values[v.index] = 1.0 if n in placement.streamed and dev[n] == d else 0.0
                for a, q in self.qv.get(n, {}).get(d, {}).items():
                    values[q.index] = values[v.index] if dtype[n] == a else 0.0
        for n, cols in self.kv.items():
            for sp, k in cols.items():
                values[k.index] = 1.0 if placement.split.get(n) == sp else 0.0
        tensors = {t.name: t for t in p.tensors}
        for (t, b), ys in self.y_multi.items():
            src = dev[tensors[t].producer]
            needed = src != b and any(dev[c] == b for c in tensors[t].consumers)
            for a, y in ys:
                values[y.index] = 1.0 if needed and a == src else 0.0
        for d1, d2, cols in self.used_before:
            seen = 0.0
            for n, col in cols:
                if col is not None:
                    values[col.index] = seen
                seen = 1.0 if seen or dev[n] == d1 else 0.0
        if p.options.objective is Objective.MAKESPAN:
            self.makespan.start_values(values, placement, list_schedule(p, placement))
        self.ts.start_values(values, placement, dtype)
        self._propagate(values)
        for cp, u, _ in self.halves:  # the copy happens and its producer holds the tensor in 16 bits
            y = values[cp.term.index] if isinstance(cp.term, Column) else float(cp.term)
            values[u.index] = min(y, 1.0 if activations(dtype[p.tensor_info[cp.tensor].producer]) in LOW
                                  and dev[p.tensor_info[cp.tensor].producer] == cp.src else 0.0)
        return values

    def _propagate(self, values: list[float]) -> None:
        """Give each defined column the least value its ``>=`` rows allow, in creation order."""
        m = self.milp
        order = sorted(self.defined, key=lambda col: min(self.defined[col]))
        for col in order:
            best = values[col]
            for r in self.defined[col]:
                s = sum(c * values[i] for i, c in zip(m.row_index[r], m.row_value[r]) if i != col)
                coef = next(c for i, c in zip(m.row_index[r], m.row_value[r]) if i == col)
                best = max(best, (m.row_lower[r] - s) / coef)
            values[col] = min(max(best, m.lower[col]), m.upper[col])

    def devices(self, values: list[float]) -> dict[str, str]:
        """The device of every node in a solution vector."""
        device: dict[str, str] = {}
        for n in self.p.nodes:
            per_d = self.xv[n]
            device[n] = self.allowed[n][0] if not per_d else max(per_d, key=lambda d: values[per_d[d].index])
        return device

    def placement(self, values: list[float]) -> Placement:
        """The placement a solution vector describes."""
        p = self.p
        device = self.devices(values)
        streamed = {n: p.host for n, per_d in self.sv.items()
                    if device[n] in per_d and values[per_d[device[n]].index] > 0.5}
        order: tuple[str, ...] = ()
        if p.options.objective is Objective.MAKESPAN:
            order = self.makespan.order(values)
        precision = {}
        for n in p.nodes:
            d = device[n]
            per = self.rv.get(n, {}).get(d)
            a = max(per, key=lambda k: values[per[k].index]) if per else p.default_dtype(n, d)
            if a != FLOAT32:
                precision[n] = a
        state, recompute, streamed_state, saved_on_host = self.ts.answer(values, device)
        split = {n: sp for n, cols in self.kv.items() for sp, k in cols.items()
                 if device[n] == sp.home and values[k.index] > 0.5}
        return Placement(device, streamed, StreamMode.PREFETCH, order, precision, state, recompute,
                         streamed_state=streamed_state, split=split, saved_on_host=saved_on_host)


def interchangeable_devices(problem: Problem) -> list[tuple[str, str]]:
    """Pairs (d1, d2) of devices no solution can tell apart: swapping them maps every placement to
    one of the same cost and feasibility (same figures and cap, same links to every other device,
    no pins, every node allows both or neither, no link budget or stage order that names them)."""
    p = problem
    if p.options.contiguous_stages:
        return []
    pinned = set(p.pins.values())
    budgeted = set(p.options.link_budget)
    candidates = [d for d in p.device_names if d != p.host and d not in pinned]
    pairs = []
    for d1, d2 in itertools.combinations(candidates, 2):
        a, b = p.devices.device(d1), p.devices.device(d2)
        if dataclasses.replace(a, name=b.name) != b or p.capacity[d1] != p.capacity[d2]:
            continue
        if any((d1 in p.allowed[n]) != (d2 in p.allowed[n]) for n in p.nodes):
            continue
        if any(lbl in budgeted for lbl in p.link_labels if d1 in lbl.split("<->") or d2 in lbl.split("<->")):
            continue
        if all(_same_route(p, d1, d2, e) for e in p.device_names if e not in (d1, d2)) and _same_pair(p, d1, d2):
            pairs.append((d1, d2))
    # keep a chain d1 < d2 < d3 among each class, enough to order them
    chained: list[tuple[str, str]] = []
    seen: set[str] = set()
    for d1, d2 in pairs:
        if d2 not in seen:
            chained.append((d1, d2))
            seen.add(d2)
    return chained


def _route_key(p: Problem, src: str, dst: str) -> tuple:
    return tuple((link.bandwidth, link.latency, link.pageable_bandwidth) for link in p.devices.route(src, dst))


def _same_route(p: Problem, d1: str, d2: str, other: str) -> bool:
    return _route_key(p, d1, other) == _route_key(p, d2, other) and _route_key(p, other, d1) == _route_key(p, other, d2)


def _same_pair(p: Problem, d1: str, d2: str) -> bool:
    return _route_key(p, d1, d2) == _route_key(p, d2, d1)


def mapping_values(formulation: Formulation, values: list[float], columns: Mapping[str, Column]) -> dict[str, float]:
    """``{key: value}`` of a family of columns (for tests and explanations)."""
    return {k: value(values, c) for k, c in columns.items()}
