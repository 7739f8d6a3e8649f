"""``partition``: model → OpGraph → (coarsened) Problem → baselines → ILP → verified Plan.

The pipeline is one function listing its passes in order; each is a function from one value to
the next, with invariant checks (``verify``) at entry and exit.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from cost_models.profiles import DeviceSet, load_profile
from cost_models.training import parse_optimizer
from partitioner.coarsen import CoarsenOptions, Coarsening, auto_coarsen, coarsen as coarsen_graph, identity
from partitioner.errors import HetpartError, InfeasiblePlacement, SolverUnavailable
from partitioner.frontends.fx import from_module
from partitioner.ir import OpGraph
from partitioner.plan import Plan
from partitioner.solvers import BASELINE_NAMES, run_baseline
from partitioner.solvers.bounds import physical_lower_bound
from partitioner.solvers.ilp import ProgressFn, solve_ilp
from partitioner.solvers.problem import (
    Evaluation,
    Objective,
    Options,
    Problem,
    Solution,
    Status,
    evaluate,
    explain_infeasibility,
)
from partitioner.verify import verify_graph, verify_placement

log = logging.getLogger(__name__)

# Above these sizes the graph is coarsened before solving (``coarsen="auto"``).
COARSEN_THRESHOLD = {Objective.LATENCY: 400, Objective.THROUGHPUT: 400, Objective.MAKESPAN: 60}
MAX_GROUP_OPS = 64  # a coarse node never swallows more ops than this: memory caps still see the pieces


@dataclasses.dataclass(frozen=True)
class Outcome:
    """Everything a partition run produced, for callers that want more than the plan."""

    plan: Plan
    problem: Problem
    coarsening: Coarsening
    solution: Solution
    evaluation: Evaluation
    baselines: Mapping[str, tuple[Solution, Evaluation]]


def partition(*args: Any, **kwargs: Any) -> Plan:
    """Place every op of a model on the devices of a profile; returns a verified :class:`Plan`.

    Takes the parameters of :func:`partition_outcome` (listed there, and in ``help(partition)``)
    and returns only the plan.

    Example:
        >>> import models
        >>> module, inputs = models.get("gpt", "tiny")
        >>> plan = partition(module, inputs, "h200-host", memory={"cuda:0": "1GB"})
        >>> plan.solver.status in ("optimal", "feasible")
        True
    """
    return partition_outcome(*args, **kwargs).plan


def partition_outcome(
    model_or_graph: Any,
    example_inputs: Any = None,
    devices: str | DeviceSet = "h200-host",
    *,
    objective: str | Objective = "latency",
    memory: Mapping[str, int | str] | None = None,
    training: bool = False,
    optimizer: str = "adam",
    pins: Mapping[str, str] | None = None,
    solver: str = "auto",
    time_limit: float = 60.0,
    gap: float = 0.01,
    streaming: bool = True,
    coarsen: bool | str = "auto",
    no_split: Sequence[str] = (),
    align_modules: Sequence[str] = (),
    link_budget: Mapping[str, int] | None = None,
    contiguous_stages: bool = False,
    capture: str = "export",
    model_name: str | None = None,
    progress: ProgressFn | None = None,
    costs: Any = "analytic",
) -> Outcome:
    """Place every op of a model on the devices of a profile: the plan and how it was reached.

    Returns an :class:`Outcome` (plan, problem, coarsening, solution, evaluation, baselines);
    :func:`partition` returns its plan.

    Parameters:
        model_or_graph: an ``nn.Module`` (captured with ``capture``) or an OpGraph.
        devices: a built-in profile name, a TOML path, or a DeviceSet.
        objective: ``"latency"``, ``"throughput"`` or ``"makespan"``.
        memory: caps below the profile, e.g. ``{"cuda:0": "2GB"}``.
        pins: module-path globs or op names → device, e.g. ``{"emb*": "cpu"}``.
        solver: ``"auto"`` (HiGHS if installed, else CBC), ``"highs"``, ``"cbc"``, or a baseline
            (``"greedy"``, ``"sequential-fill"``, ``"heft"``, ``"single:cuda:0"``).
        time_limit, gap: the ILP's limits; a time-out returns the incumbent with its gap.
        streaming: allow weights to be streamed from host memory (inference plans).
        coarsen: ``"auto"`` (above a size threshold), True, or False.
        no_split: module classes the ``greedy`` fill keeps whole (accelerate's no_split_module_classes).
        align_modules: module classes every solver must keep whole (each instance on one device),
            so the plan exports as an accelerate ``device_map``.
        costs: ``"analytic"`` (the profile's roofline), ``"profiled"`` (measure the model's ops on
            the devices present here, cached), the path of a costs file from ``hetpart profile``,
            or a :class:`cost_models.costs.CostModel`; recorded in the plan (``plan.costs``).

    Raises:
        InfeasiblePlacement: no placement fits the caps and pins; the message names the device,
            the bytes needed at least, and the cap.

    Example:
        >>> import models
        >>> module, inputs = models.get("gpt", "tiny")
        >>> out = partition_outcome(module, inputs, "h200-host", memory={"cuda:0": "1GB"})
        >>> out.evaluation.feasible
        True
    """
    graph = _capture(model_or_graph, example_inputs, capture, model_name)
    verify_graph(graph)
    profile = _profile(devices, memory)
    options = Options(
        objective=_objective(objective), training=training, optimizer=parse_optimizer(optimizer),
        streaming=streaming, link_budget=dict(link_budget or {}), contiguous_stages=contiguous_stages,
    )
    coarse = _coarsen(graph, options, coarsen, pins, align_modules)
    from cost_models.profiled import resolve_costs  # here: cost_models.profiled imports partitioner's errors

    cost_model = resolve_costs(costs, graph, profile, example_inputs, training=training, optimizer=optimizer)
    problem = Problem(coarse.graph, profile, options, pins=pins, members=coarse.members, original=graph,
                      costs=cost_model)
    baselines = {name: _evaluated(problem, run_baseline(name, problem, no_split=no_split)) for name in _baseline_names(problem)}
    solution, evaluation = _solve(problem, solver, baselines, time_limit, gap, progress, no_split)
    verify_placement(problem, solution.placement, evaluation)
    plan = Plan.from_solution(
        problem, solution, evaluation,
        baselines={name: ev for name, (_, ev) in baselines.items()},
        lower_bound=physical_lower_bound(problem), model_name=model_name or graph.name,
        capture=capture if not isinstance(model_or_graph, OpGraph) else "export",
        constraints={
            "pins": dict(problem.pins) and {op: problem.pins[n] for n in problem.pins for op in coarse.members[n]},
            "memory_caps": {d: profile.device(d).memory for d in (memory or {})},
            "streaming": streaming,
            "align_modules": tuple(align_modules),
        },
    )
    return Outcome(plan, problem, coarse, solution, evaluation, baselines)


# --------------------------------------------------------------------------------------------
# Passes
# --------------------------------------------------------------------------------------------


def _capture(model_or_graph: Any, example_inputs: Any, capture: str, name: str | None) -> OpGraph:
    if isinstance(model_or_graph, OpGraph):
        return model_or_graph
    if example_inputs is None:
        raise HetpartError("partition(model, example_inputs, ...) needs example inputs to capture an nn.Module")
    return from_module(model_or_graph, example_inputs, capture=capture, name=name)


def _profile(devices: str | DeviceSet, memory: Mapping[str, int | str] | None) -> DeviceSet:
    profile = load_profile(devices) if isinstance(devices, str) else devices
    return profile.with_memory(memory) if memory else profile


def _objective(value: str | Objective) -> Objective:
    try:
        return Objective(value)
    except ValueError:
        raise HetpartError(
            f"unknown objective {value!r}: use one of {', '.join(o.value for o in Objective)}"
        ) from None


def _coarsen(
    graph: OpGraph, options: Options, mode: bool | str, pins: Mapping[str, str] | None, align: Sequence[str]
) -> Coarsening:
    keep = frozenset(_pinned_ops(graph, pins or {}))
    aligned = _aligned(graph, align, keep)
    if mode is False or mode == "off":
        return aligned
    threshold = COARSEN_THRESHOLD[options.objective]
    if mode is True or mode == "on":
        threshold = min(threshold, max(1, len(aligned.graph) - 1))
    keep_groups = frozenset(aligned.group_of[op] for op in keep)
    return _compose(aligned, auto_coarsen(aligned.graph, threshold, keep_separate=keep_groups,
                                          max_group_ops=MAX_GROUP_OPS))


def _aligned(graph: OpGraph, classes: Sequence[str], keep: frozenset[str]) -> Coarsening:
    """Each instance of the given module classes as one group (identity when there are none)."""
    if not classes:
        return identity(graph)
    known = sorted(set(graph.module_types.values()) - {""})
    unknown = [c for c in classes if c not in known]
    if unknown:
        raise HetpartError(
            f"--align-modules names {', '.join(unknown)}, not a module class of {graph.name!r}; "
            f"its classes are: {', '.join(known)}"
        )
    paths = [p for p, t in graph.module_types.items() if t in classes and p]
    outer = tuple(p for p in paths if not any(p.startswith(q + ".") for q in paths))
    return coarsen_graph(graph, CoarsenOptions(fold_views=False, merge_chains=False, align=outer,
                                               keep_separate=frozenset()))


def _compose(first: Coarsening, second: Coarsening) -> Coarsening:
    """Coarsening ``first.graph`` by ``second``, as one coarsening of the original graph."""
    if len(second.graph) == len(first.graph):
        return first
    members = {g: tuple(op for sub in second.members[g] for op in first.members[sub]) for g in second.members}
    group_of = {op: g for g, ops in members.items() for op in ops}
    return Coarsening(second.graph, members, group_of)


def _pinned_ops(graph: OpGraph, pins: Mapping[str, str]) -> set[str]:
    import fnmatch

    out = set()
    for pattern in pins:
        for op in graph.ops.values():
            if op.name == pattern or fnmatch.fnmatchcase(op.name, pattern) or (
                op.module_path and fnmatch.fnmatchcase(op.module_path, pattern)
            ):
                out.add(op.name)
    return out


def _baseline_names(problem: Problem) -> list[str]:
    return [f"single:{d}" for d in problem.device_names] + list(BASELINE_NAMES)


def _evaluated(problem: Problem, solution: Solution) -> tuple[Solution, Evaluation]:
    return solution, evaluate(problem, solution.placement)


def _best_feasible(baselines: Mapping[str, tuple[Solution, Evaluation]]) -> tuple[str, Solution, Evaluation] | None:
    feasible = [(ev.total_s, name) for name, (_, ev) in baselines.items() if ev.feasible]
    if not feasible:
        return None
    _, name = min(feasible)
    return name, baselines[name][0], baselines[name][1]


def _solve(
    problem: Problem,
    solver: str,
    baselines: Mapping[str, tuple[Solution, Evaluation]],
    time_limit: float,
    gap: float,
    progress: ProgressFn | None,
    no_split: Sequence[str],
) -> tuple[Solution, Evaluation]:
    if solver in baselines:
        sol, ev = baselines[solver]
        if not ev.feasible:
            raise InfeasiblePlacement(f"the {solver} baseline does not fit: {'; '.join(ev.violations[:3])}")
        return sol, ev
    if solver.startswith("single:") or solver in BASELINE_NAMES:
        raise SolverUnavailable(f"baseline {solver!r} is not available for this profile: "
                                f"use one of {', '.join(baselines)}")
    best = _best_feasible(baselines)
    start = time.perf_counter()
    sol = solve_ilp(problem, solver=solver, time_limit=time_limit, gap=gap,
                    warm_start=best[1].placement if best else None, progress=progress)
    if sol.status is Status.INFEASIBLE:
        raise InfeasiblePlacement(explain_infeasibility(problem))
    if not sol.placement.device:  # no incumbent and no baseline to fall back on
        raise InfeasiblePlacement(
            f"the {sol.solver} solver found no placement within {time_limit:g} s and no baseline fits; "
            + explain_infeasibility(problem)
        )
    ev = evaluate(problem, sol.placement)
    if best is not None and (not ev.feasible or ev.total_s > best[2].total_s):
        # never worse than a baseline: keep the ILP's bound, return the baseline's placement
        name = best[0]
        note = f"the ILP's incumbent was not better than {name}; returning {name}'s placement"
        log.info(note)
        sol = dataclasses.replace(sol, placement=best[1].placement, note=f"{sol.note}; {note}".strip("; "),
                                  seconds=time.perf_counter() - start)
        ev = best[2]
    if not ev.feasible:
        raise InfeasiblePlacement(explain_infeasibility(problem))
    if sol.note:
        log.warning("%s: %s", sol.solver, sol.note)
    return sol, ev


partition.__signature__ = inspect.signature(partition_outcome).replace(return_annotation=Plan)  # type: ignore[attr-defined]
