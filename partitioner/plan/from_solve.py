"""A plan from a solve: the solution of a (possibly coarsened) problem expanded to the graph's ops.

In: the :class:`~partitioner.solvers.problem.Problem`, the solver's
:class:`~partitioner.solvers.problem.Solution` and its evaluation, the baselines' evaluations.
Out: the keyword arguments of :class:`~partitioner.plan.record.Plan` (:func:`fields_from_solution`),
with every coarse node expanded to its member ops and the per-op times of the cost model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from partitioner.plan.pipeline import pipeline_record
from partitioner.plan.precision import precision_record
from partitioner.plan.training_state import training_state_record
from partitioner.plan.splits import splits_record
from partitioner.plan.values import BaselineInfo, InputSpec, SolverInfo, TransferInfo

if TYPE_CHECKING:
    from partitioner.solvers.problem import Evaluation, Problem, Solution


def fields_from_solution(
    problem: Problem,
    solution: Solution,
    evaluation: Evaluation | None = None,
    *,
    baselines: Mapping[str, Evaluation | BaselineInfo] | None = None,
    lower_bound: float | None = None,
    model_name: str | None = None,
    capture: str = "export",
    constraints: Mapping[str, Any] | None = None,
    inputs: tuple[InputSpec, ...] | None = None,
    ilp: Solution | None = None,
    requested_gap: float | None = None,
) -> dict[str, Any]:
    """The fields of the plan of ``solution`` (see :meth:`Plan.from_solution`).

    ``inputs`` are the model's positional inputs as passed (default: the graph's input tensors).
    ``ilp`` is the ILP's own solution when ``solution`` is another solver's placement that beat
    it (kept beside it in the plan); ``requested_gap`` the gap the ILP was asked for. The bound is
    written as the solver proved it (never clamped to the objective), the gap from the two.
    """
    from partitioner.solvers.problem import evaluate

    ev = evaluation if evaluation is not None else evaluate(problem, solution.placement)
    graph, placement = problem.original, solution.placement
    device = {op: placement.device[n] for n in problem.nodes for op in problem.members[n]}
    weights = {op: home for n, home in placement.streamed.items() if home != placement.device[n]
               for op in problem.members[n] if graph.ops[op].owned_params}
    order = placement.order or problem.nodes
    precision = precision_record(problem, placement)
    return dict(
        model_name=model_name or graph.name,
        inputs=inputs if inputs is not None else tuple(
            InputSpec("tensor", graph.tensors[t].shape, graph.tensors[t].dtype) for t in graph.inputs),
        capture=capture,
        edges=tuple((u, v) for u, v in graph.dag.edges),
        edge_bytes=tuple(b for _, _, b in graph.dag.edges(data="bytes")),
        param_names={op.name: tuple(n for p in op.owned_params for n in (p, *graph.params[p].aliases))
                     for op in graph.topological_order() if op.owned_params},
        op_bytes={op.name: (sum(graph.tensors[t].nbytes for t in op.outputs), op.param_bytes)
                  for op in graph.topological_order()},
        constraints=dict(constraints or {}),
        costs=problem.costs.record(),
        pipeline=pipeline_record(problem, placement) if problem.options.pipeline is not None else {},
        precision=precision,
        training_state=training_state_record(problem, placement, ev),
        splits=splits_record(problem, placement),
        fingerprint=graph.fingerprint(),
        op_count=len(graph),
        modules={op.name: op.module_path for op in graph.topological_order()},
        param_ops=tuple(op.name for op in graph.topological_order() if op.owned_params),
        devices=problem.devices,
        objective=problem.options.objective,
        training=problem.options.training,
        optimizer=problem.options.optimizer,
        placement={op.name: device[op.name] for op in graph.topological_order()},
        weights=weights,
        stream_mode=placement.stream_mode,
        schedule=tuple(op for n in order for op in problem.members[n]),
        transfers=tuple(TransferInfo(t.tensor, t.src, t.dst, t.bytes, t.seconds, t.kind)
                        for t in ev.transfers),
        memory={d: {"used": ev.memory[d], "capacity": ev.capacity[d]} for d in ev.memory},
        predicted={"total_s": ev.total_s, "critical_path_s": ev.critical_path_s,
                   "per_device_s": dict(ev.per_device_s), "per_link_s": dict(ev.per_link_s),
                   "lower_bound_s": lower_bound if lower_bound is not None else solution.bound,
                   "per_op_s": _per_op_seconds(problem, device, precision.get("ops"), placement.split),
                   "per_op_device_s": _per_op_device_seconds(problem)},
        solver=_solver_info(problem, solution, ev.total_s, ilp, requested_gap),
        baselines={name: b if isinstance(b, BaselineInfo) else
                   BaselineInfo(b.total_s, b.feasible, "; ".join(b.violations[:1]))
                   for name, b in (baselines or {}).items()},
    )


def _solver_info(problem: Problem, solution: Solution, objective: float, ilp: Solution | None,
                 requested_gap: float | None) -> SolverInfo:
    nodes = len(problem.nodes) if problem.graph is not problem.original else None
    own = None
    if ilp is not None and ilp.solver != solution.solver:  # the plan carries another solver's placement
        own = SolverInfo(ilp.solver, _word(ilp.status), ilp.objective, ilp.bound, _gap(ilp.objective, ilp.bound),
                         ilp.seconds, requested_gap, nodes, ilp.note)
    return SolverInfo(solution.solver, _word(solution.status), objective, solution.bound,
                      _gap(objective, solution.bound), solution.seconds, requested_gap, nodes, solution.note, own)


def _word(status: Any) -> str:
    return getattr(status, "value", status)


def _gap(objective: float | None, bound: float | None) -> float | None:
    """Relative gap ``(objective - bound) / objective``; None when either is unknown."""
    if objective is None or bound is None or not math.isfinite(objective) or not math.isfinite(bound):
        return None
    if objective == 0:
        return 0.0
    return max(0.0, (objective - bound) / abs(objective))


def _per_op_device_seconds(problem: Problem) -> dict[str, dict[str, float | None]]:
    """Each op's time on every device of the profile (None where the device cannot run it)."""
    costs = problem.costs
    cost = costs.training_op_time if problem.options.training else costs.op_time
    out: dict[str, dict[str, float | None]] = {}
    for op in problem.original.topological_order():
        out[op.name] = {
            d.name: cost(op, d).seconds
            if d.supports(op.kind, op.op_class.value) and costs.unsupported(op, d) is None else None
            for d in problem.devices.devices
        }
    return out


def _per_op_seconds(problem: Problem, device: Mapping[str, str],
                    precision: Mapping[str, str] | None = None, split: Mapping[str, Any] | None = None) -> dict[str, float]:
    """Each op's own time on its device (in its dtype), the cost model's view of the problem's node times;
    a split op's: what it adds to the objective (:meth:`~partitioner.solvers.problem.Problem.split_cost`)."""
    from partitioner.solvers.splits import split_op

    ops, dtype = problem.original.ops, precision or {}
    out = {op: problem.compute_time(ops[op], problem.devices.device(d), dtype.get(op, "float32"))
           for op, d in device.items()}
    for n, sp in (split or {}).items():
        out[split_op(problem, n).name] = problem.split_cost(n, sp)
    return out
