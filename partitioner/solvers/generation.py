"""The joint ILP of a generation plan: the prefill's placement and the decode step's, in one program.

In: a :class:`GenerationProblem` (the prefill's :class:`~partitioner.solvers.problem.Problem` at the
prompt length, the decode step's at one token with the cache at its full size, and the weights of
their times in the objective), limits and a warm start (a :class:`PhasePair`).
Out: a :class:`JointSolution`: both placements, the solver's status, the weighted objective and a
proven lower bound on it, in seconds.

The model is each phase's own formulation (:class:`~partitioner.solvers.formulation.Formulation`,
built once per phase, unchanged), put side by side in one :class:`~partitioner.solvers.milp.Milp`
(columns and rows of the prefill first, then the decode step's; names prefixed ``prefill.`` and
``decode.``; each phase's objective column priced by its weight), plus the rows that make it one
plan: for every parameter or buffer and every device, "its owner lives on the device" in the prefill
equals the same in the decode step. So memory is shared (what is resident in one phase is resident
in the other, and each phase's memory row counts it), while where each op computes and which
weights stream are each phase's own. With ``precision``, the form a weight is stored in (float32,
16 bits, or packed in int8/int4/float8 with its scales: :meth:`GenerationProblem.form_of`) is part
of its home: for every linked pair, device and form, "its owner's weights live on the device in
that form" in the prefill equals the same in the decode step (rows ``form[prefill op][decode op]
[device][form]``), so one stored copy serves both phases and each phase's memory row counts the
same bytes. A weight's owner op computes in the form it is stored in (streamed: in the form the host
holds it in), so its dtype choice is one for both phases, while the device it computes on and
whether it streams stay each phase's own. With ``same_use`` the parameter owners also compute on
the same device and stream the same way in both phases: the best plan that uses every weight one
way (the "one placement" baseline; parameter-free ops stay free per phase).

Each phase's cutoff is the warm start's objective over that phase's weight (no placement with a
phase dearer than that can beat the start), and interchangeable-device symmetry rows are not used
(they order each phase on its own, which the link rows could contradict).

Example:
    >>> gp = GenerationProblem(prefill_problem, decode_problem, (1.0, 127.0))      # doctest: +SKIP
    >>> sol = solve_generation(gp, warm_start=PhasePair(pre, dec), time_limit=30)  # doctest: +SKIP
    >>> sol.status, sol.objective, sol.bound
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence

from cost_models.precision import FLOAT32
from partitioner.errors import HetpartError
from partitioner.solvers import cbc, highs
from partitioner.solvers.bounds import physical_lower_bound
from partitioner.solvers.formulation import Formulation, Units
from partitioner.solvers.ilp import PROOF_MOST, PROOF_SHARE, REFERENCE, check_limits, relative_gap, \
    resolve_solver, status_for_gap
from partitioner.solvers.milp import Column, Milp, Term
from partitioner.solvers.problem import Evaluation, Placement, Problem, Status, evaluate

__all__ = ["GenerationProblem", "JointSolution", "PhasePair", "solve_generation"]

PHASES = ("prefill", "decode")
AGREEMENT = 1e-6  # relative difference allowed between the solver's objective and the evaluations


@dataclasses.dataclass(frozen=True)
class PhasePair:
    """A placement of each phase."""

    prefill: Placement
    decode: Placement

    def __iter__(self):  # noqa: ANN204 - (prefill, decode)
        return iter((self.prefill, self.decode))

    def __getitem__(self, phase: int) -> Placement:
        return (self.prefill, self.decode)[phase]


@dataclasses.dataclass(frozen=True)
class JointSolution:
    """What a joint solve (or a baseline) produced; times in seconds of the weighted objective."""

    solver: str
    placements: PhasePair
    status: Status
    objective: float | None
    bound: float | None
    seconds: float
    note: str = ""


class GenerationProblem:
    """The two phases, their weights, and which nodes of each hold the same parameter.

    ``links``: ``(prefill node, decode node)`` for every pair of nodes that own a common parameter
    or buffer (by name); their homes must agree.
    """

    def __init__(self, prefill: Problem, decode: Problem, weights: tuple[float, float]) -> None:
        if prefill.device_names != decode.device_names:
            raise HetpartError("the prefill and the decode step must be planned on one device set")
        self.prefill, self.decode = prefill, decode
        self.weights = (float(weights[0]), float(weights[1]))
        owner_pre, owner_dec = _param_owners(prefill), _param_owners(decode)
        missing = sorted(set(owner_pre) ^ set(owner_dec))
        if missing:
            raise HetpartError(f"the two phases hold different parameters ({', '.join(missing[:3])}): capture both "
                               f"from one decode step")
        self.links: tuple[tuple[str, str], ...] = tuple(dict.fromkeys(
            (owner_pre[name], owner_dec[name]) for name in owner_pre))
        shared: dict[tuple[str, str], list[str]] = {}
        for name in owner_pre:
            shared.setdefault((owner_pre[name], owner_dec[name]), []).append(name)
        #: each link's parameter names (what its stored form is made of)
        self.shared: dict[tuple[str, str], tuple[str, ...]] = {k: tuple(sorted(v)) for k, v in shared.items()}

    @property
    def phases(self) -> tuple[Problem, Problem]:
        return self.prefill, self.decode

    def evaluate(self, pair: PhasePair) -> tuple[Evaluation, Evaluation, float, list[str]]:
        """Both phases' evaluations, the weighted objective and every violation (caps, pins, homes)."""
        ev_pre, ev_dec = evaluate(self.prefill, pair.prefill), evaluate(self.decode, pair.decode)
        violations = [f"prefill: {v}" for v in ev_pre.violations] + [f"decode: {v}" for v in ev_dec.violations]
        violations += self.home_violations(pair)
        total = self.weights[0] * ev_pre.total_s + self.weights[1] * ev_dec.total_s
        return ev_pre, ev_dec, total, violations

    def home_violations(self, pair: PhasePair) -> list[str]:
        """Every linked pair whose weights live on different devices, or in different stored forms."""
        out = []
        for a, b in self.links:
            ha, hb = pair.prefill.residence(a), pair.decode.residence(b)
            if ha != hb:
                out.append(f"the weights of {a} live on {ha} in the prefill but on {hb} in the decode step")
                continue
            names = self.shared[(a, b)]
            fa = self.form_of(0, a, self.prefill.dtype_of(pair.prefill, a), names)
            fb = self.form_of(1, b, self.decode.dtype_of(pair.decode, b), names)
            if fa != fb:
                out.append(f"the weights of {a} are stored as {_form_name(fa)} in the prefill but as "
                           f"{_form_name(fb)} in the decode step (one stored copy serves both phases)")
        return out

    def form_of(self, phase: int, node: str, choice: str, names: Sequence[str]) -> tuple[str, ...]:
        """The form parameters ``names`` of ``node`` are stored in when it computes in ``choice``
        (streamed: the host holds them in the choice it computes in): per parameter, its owner
        op's member choice (:meth:`~partitioner.solvers.problem.Problem.op_dtype`: ``"float32"``,
        ``"bfloat16"``, ``"bfloat16+int8"``, ...). Without precision every form is float32."""
        problem = self.phases[phase]
        if problem.precision is None:
            return tuple(FLOAT32 for _ in names)
        params = problem.original.params
        return tuple(problem.op_dtype(params[n].owner, choice) for n in names)


def _form_name(form: Sequence[str]) -> str:
    """A stored form as words: one dtype when every parameter has it, else each in order."""
    return form[0] if len(set(form)) == 1 else "(" + ", ".join(form) + ")"


def _param_owners(problem: Problem) -> dict[str, str]:
    """Every parameter (by name) of ``problem``'s graph -> the node owning it."""
    group_of = {op: n for n in problem.nodes for op in problem.members[n]}
    return {p.name: group_of[p.owner] for p in problem.original.params.values()
            if p.owner is not None and p.owner in group_of}


def solve_generation(
    problem: GenerationProblem,
    *,
    warm_start: PhasePair | None,
    solver: str = "auto",
    time_limit: float = 60.0,
    gap: float = 0.01,
    same_use: bool = False,
) -> JointSolution:
    """Solve the joint ILP within ``time_limit`` seconds (building included).

    ``warm_start`` must fit both phases and agree on every home, else it is not used. ``same_use``:
    parameter owners compute on one device and stream alike in both phases (see the module docstring).

    Raises:
        HetpartError: a bad time limit or gap; SolverUnavailable: no such solver here.
    """
    check_limits(time_limit, gap)
    name = resolve_solver(solver)
    started = time.perf_counter()
    incumbent = None
    if warm_start is not None:
        _, _, total, violations = problem.evaluate(warm_start)
        if violations or not math.isfinite(total):
            warm_start = None
        else:
            incumbent = total
    reference = incumbent or sum(w * physical_lower_bound(p) for w, p in zip(problem.weights, problem.phases))
    units = Units(time=REFERENCE / reference) if reference and math.isfinite(reference) and reference > 0 else Units()
    models = [Formulation(p, units, symmetry=False, cutoff=None if incumbent is None else incumbent / w)
              for p, w in zip(problem.phases, problem.weights)]
    milp, offsets = _side_by_side(models, problem.weights)
    _link_homes(milp, problem, models, offsets, same_use)
    _link_forms(milp, problem, models, offsets)
    start = None
    if warm_start is not None:
        start = [v for m, placement in zip(models, warm_start) for v in m.start_values(m.canonical(placement))]
    left = max(time_limit - (time.perf_counter() - started), 0.05)
    if name == "highs":
        run = highs.run_highs(milp, time_limit=left, gap=gap, start=start, scale=units.time,
                              proof_seconds=min(PROOF_SHARE * left, PROOF_MOST))
    else:
        run = cbc.run_cbc(milp, time_limit=left, gap=gap, start=start)
    label = f"ilp:{name}" + (" (one use per weight)" if same_use else "")
    physical = sum(w * physical_lower_bound(p) for w, p in zip(problem.weights, problem.phases))
    bound = run.bound / units.time if run.bound is not None else None
    bound = physical if bound is None else max(bound, physical)
    note = run.note
    pair = warm_start
    if run.values is not None:
        found = PhasePair(*(m.placement(run.values[o:o + m.milp.num_cols]) for m, o in zip(models, offsets)))
        _, _, total, violations = problem.evaluate(found)
        if violations:
            note = f"{note}; the solver's placement breaks {violations[0]}".lstrip("; ")
        elif incumbent is None or total < incumbent * (1 + AGREEMENT):
            pair, incumbent = found, total
            objective = run.objective / units.time if run.objective is not None else None
            if objective is not None and abs(objective - total) > AGREEMENT * max(total, 1e-300) + 1e-15 \
                    and run.state == "optimal":
                note = f"{note}; the model's objective {objective!r} s differs from the evaluation {total!r} s"\
                    .lstrip("; ")
    elif run.state == "infeasible" and warm_start is None:
        return JointSolution(label, PhasePair(Placement({}), Placement({})), Status.INFEASIBLE, None, bound,
                             time.perf_counter() - started, run.note)
    if pair is None:
        return JointSolution(label, PhasePair(Placement({}), Placement({})), Status.TIME_LIMIT, None, bound,
                             time.perf_counter() - started, f"{note}; no placement found".lstrip("; "))
    status = status_for_gap(relative_gap(incumbent, bound), gap)
    return JointSolution(label, pair, status, incumbent, bound, time.perf_counter() - started, note)


def _side_by_side(models: Sequence[Formulation], weights: Sequence[float]) -> tuple[Milp, list[int]]:
    """One program holding every phase's columns and rows (names prefixed, costs weighted)."""
    out = Milp()
    offsets = []
    for phase, model, weight in zip(PHASES, models, weights):
        m, col0, row0 = model.milp, out.num_cols, out.num_rows
        offsets.append(col0)
        out.names += [f"{phase}.{n}" for n in m.names]
        out.lower += m.lower
        out.upper += m.upper
        out.cost += [weight * c for c in m.cost]
        out.integer += m.integer
        names = [f"{phase}.{n}" for n in m.row_names]
        out.row_names += names
        out._row_seen.update(names)
        out.row_lower += m.row_lower
        out.row_upper += m.row_upper
        out.row_index += [[i + col0 for i in idx] for idx in m.row_index]
        out.row_value += [list(v) for v in m.row_value]
        out.ordering_rows += [r + row0 for r in m.ordering_rows]
    return out, offsets


def _shifted(terms: Sequence[Term], offset: int) -> list[Term]:
    return [(c, Column(v.index + offset)) if isinstance(v, Column) else (c, v) for c, v in terms]


def _link_homes(milp: Milp, problem: GenerationProblem, models: Sequence[Formulation], offsets: Sequence[int],
                same_use: bool) -> None:
    """For each linked pair and device: the prefill's "lives there" equals the decode step's (and,
    with ``same_use``, "computes there" and "streams there" too)."""
    fa, fb = models
    oa, ob = offsets
    for a, b in problem.links:
        for d in problem.prefill.device_names:
            families = [("home", fa.resident(a, d), fb.resident(b, d))]
            if same_use:
                families.append(("compute", [(1.0, fa.x(a, d))], [(1.0, fb.x(b, d))]))
                sa, sb = fa.sv.get(a, {}).get(d, 0.0), fb.sv.get(b, {}).get(d, 0.0)
                families.append(("stream", [(1.0, sa)], [(1.0, sb)]))
            for kind, left, right in families:
                terms = _shifted(left, oa) + [(-c, v) for c, v in _shifted(right, ob)]
                if all(not isinstance(v, Column) for _, v in terms) and abs(sum(c * v for c, v in terms)) < 1e-12:
                    continue  # both sides fixed and equal: nothing to say
                milp.equal(f"{kind}[{a}][{b}][{d}]", terms, 0.0)


def _link_forms(milp: Milp, problem: GenerationProblem, models: Sequence[Formulation], offsets: Sequence[int]) -> None:
    """For each linked pair, device and stored form: "its weights live on the device in that form"
    in the prefill equals the same in the decode step (nothing to say where every choice of both
    stores them alike)."""
    if all(p.precision is None for p in problem.phases):
        return
    for a, b in problem.links:
        names = problem.shared[(a, b)]
        sides = [_stored(problem, i, m, n, names) for i, (m, n) in enumerate(zip(models, (a, b)))]
        forms = sorted({f for side in sides for per_d in side.values() for f in per_d})
        if len(forms) < 2:
            continue  # one form whatever either phase chooses: the home rows say it all
        for d in problem.prefill.device_names:
            for form in forms:
                left, right = sides[0].get(d, {}).get(form, []), sides[1].get(d, {}).get(form, [])
                terms = _shifted(left, offsets[0]) + [(-c, v) for c, v in _shifted(right, offsets[1])]
                if all(not isinstance(v, Column) for _, v in terms) and abs(sum(c * v for c, v in terms)) < 1e-12:
                    continue
                milp.equal(f"form[{a}][{b}][{d}][{','.join(form)}]", terms, 0.0)


def _stored(problem: GenerationProblem, phase: int, model: Formulation, node: str,
            names: Sequence[str]) -> dict[str, dict[tuple[str, ...], list[Term]]]:
    """device -> stored form -> terms of "``node``'s weights live on the device in that form": a
    choice computing there (less where it streams them from the host), and on the host, every
    stream's form."""
    p = model.p
    out: dict[str, dict[tuple[str, ...], list[Term]]] = {}
    for d in p.device_names:
        for c in model.dtypes_on(node, d):
            form = problem.form_of(phase, node, c, names)
            out.setdefault(d, {}).setdefault(form, []).append((1.0, model.r(node, d, c)))
    for d in model.sv.get(node, {}):
        for choice, q in model.streams(node, d):  # streamed in the form it computes in (packed: packed)
            form = problem.form_of(phase, node, choice, names)
            out.setdefault(d, {}).setdefault(form, []).append((-1.0, q))
            out.setdefault(p.host, {}).setdefault(form, []).append((1.0, q))
    return out
