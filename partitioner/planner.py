"""``partition``: model → OpGraph → (coarsened) Problem → baselines → ILP → verified Plan.

The pipeline is one function listing its passes in order; each is a function from one value to
the next, with invariant checks (``verify``) at entry and exit.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from cost_models.live_memory import profile_for
from cost_models.profiles import DeviceSet
from cost_models.training import parse_optimizer
from partitioner.coarsen import CoarsenOptions, Coarsening, auto_coarsen, coarsen as coarsen_graph, identity
from partitioner.errors import CaptureError, HetpartError, InfeasiblePlacement, SolverUnavailable
from partitioner.frontends.fx import capture_mode, from_module
from partitioner.frontends.hf_folder import is_model_folder
from partitioner.frontends.inputs import dynamic_dims, input_specs
from partitioner.frontends.onnx_input import is_onnx_graph, is_onnx_model
from partitioner.ir import OpGraph
from partitioner.micro_batches import batch_size, micro_batch_inputs, pipeline_spec_for
from partitioner.options import META, MAX_TIME_LIMIT, Hardware, PlanOptions, Source, check_limits, describe_options, objective_of
from partitioner.fallbacks import with_fallbacks
from partitioner.plan import Plan
from partitioner.plan.values import InputSpec
from partitioner.solvers import (BASELINE_NAMES, ONNX_BASELINE_NAMES, SPLIT_BASELINE_NAMES, TRAINING_BASELINES,
                                 run_baseline)
from partitioner.solvers.megatron import NAME as MEGATRON, tensor_parallel_group
from partitioner.solvers.problem import accelerator_devices
from partitioner.solvers.expert_streaming import fold_expert_weights
from partitioner.solvers.split_regions import interior_ops
from partitioner.solvers.split_offers import splittable_ops
from partitioner.solvers.splits import resolve_splits
from partitioner.solvers.train_state import tidy
from partitioner.solvers.bounds import memory_aware_lower_bound, physical_lower_bound
from partitioner.solvers.ilp import ProgressFn, relative_gap, solve_ilp, status_for_gap
from partitioner.solvers.multilevel import solve_multilevel
from partitioner.solvers.pipeline import PipelineSpec, explain_no_fit
from partitioner.solvers.pipeline_baselines import PIPELINE_BASELINES
from partitioner.solvers.pipeline_dp import solve_pipeline_dp
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
MIN_SOLVE_S = 0.05  # below this many seconds left, the ILP is not started
LOWER_BOUND_SHARE = 0.2  # the memory-aware lower bound must be done within this share of time_limit
# The steps after the solve (the candidates' evaluations, verify_placement, the plan record) take
# 12-28 evaluations of one placement (measured on 340- to 3,000-op graphs); the solve stops that
# much before the time limit, at most FINISH_SHARE of it, so the whole call returns within it.
FINISH_EVALUATIONS = 30
FINISH_SHARE = 0.1


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

    Takes the parameters of :func:`partition_outcome` and returns only the plan. The options
    (keywords, or ``options=PlanOptions(...)`` whole) are those of
    :class:`partitioner.options.PlanOptions`:

{options}

    Example:
        >>> import models
        >>> module, inputs = models.get("gpt", "tiny")
        >>> plan = partition(module, inputs, "h200-host", memory={"cuda:0": "1GB"})
        >>> plan.solver.status in ("optimal", "within gap")
        True
    """
    return partition_outcome(*args, **kwargs).plan


def partition_outcome(
    model_or_graph: Any,
    example_inputs: Any = None,
    devices: str | DeviceSet | None = None,
    *,
    options: PlanOptions | None = None,
    **keywords: Any,
) -> Outcome:
    """Place every op of a model on the devices of a profile: the plan and how it was reached.

    Returns an :class:`Outcome` (plan, problem, coarsening, solution, evaluation, baselines);
    :func:`partition` returns its plan.

    Parameters:
        model_or_graph: an ``nn.Module`` (captured with ``capture``), an ONNX model (a ``.onnx`` path
            or ``ModelProto``, imported with :func:`~partitioner.frontends.onnx.from_onnx`), a model
            folder (a path: built hollow from its config.json, no weight read, example inputs from
            ``input_shapes``; :mod:`partitioner.frontends.hf_folder`), or an OpGraph.
            ONNX plans are for inference, without weight streaming (onnxruntime sessions hold their
            weights), and list the ``ort-fallback`` and ``openvino-pipeline`` baselines too.
        example_inputs: the inputs the model is captured and costed with (one step's batch).
        devices: the ``devices`` option, positionally.
        options: a :class:`~partitioner.options.PlanOptions` record; ``keywords`` replace its fields.
        keywords: the options by name (see :class:`~partitioner.options.PlanOptions` and ``help(partition)``).

    Raises:
        InfeasiblePlacement: no placement fits the caps and pins; the message names the device,
            the bytes needed at least, and the cap.
        UnknownOption: a keyword that is no option.

    Example:
        >>> import models
        >>> module, inputs = models.get("gpt", "tiny")
        >>> out = partition_outcome(module, inputs, "h200-host", memory={"cuda:0": "1GB"})
        >>> out.evaluation.feasible
        True
    """
    request = PlanOptions.build(options, **({"devices": devices} if devices is not None else {}), **keywords)
    if request.generation.generate:
        raise HetpartError("generate=True plans a prefill and a decode step together, which is not one plan: call "
                           "partitioner.plan_generation(model, devices, ...) (CLI: hetpart plan MODEL --generate)")
    if is_model_folder(model_or_graph):  # a model folder: built hollow, no weight read (frontends.hf_folder)
        model_or_graph, example_inputs, request = _from_folder(model_or_graph, example_inputs, request)
    if request.batch is not None:  # re-plans over micro-batches (partitioner.batching), each with batch=None
        from partitioner.batching import fit_outcome

        return fit_outcome(model_or_graph, example_inputs, request)
    profile = _profile(request.hardware)  # a bad profile or cap fails before the capture
    spec = _pipeline_spec(model_or_graph, example_inputs, profile, request)
    dtypes = _precision(request, profile, spec)
    if spec is not None and not isinstance(model_or_graph, OpGraph) and example_inputs is not None:
        example_inputs = micro_batch_inputs(example_inputs, spec.micro_batches)  # costs are per micro-batch
    graph, inputs = _capture(model_or_graph, example_inputs, request.source, request.train.training)
    started = time.perf_counter()  # time_limit covers everything from here (capture excluded)
    verify_graph(graph)
    if len(graph) == 0:
        raise CaptureError(f"{graph.name!r} has no operations to place: its forward returns its inputs or "
                           f"constants without computing anything, so there is nothing to partition")
    onnx_graph = is_onnx_graph(graph)
    if onnx_graph and request.train.training:
        raise HetpartError(f"{graph.name!r} is an ONNX graph: ONNX models are planned for inference (onnxruntime "
                           "runs them forward only); drop training=True (CLI: --training)")
    if dtypes is not None and dtypes.max_error is not None:  # the accuracy budget: each weight's error measured
        from partitioner.error_budget import measured_precision

        dtypes = measured_precision(dtypes, model_or_graph, example_inputs, graph, request)
    options_ = _solver_options(request, spec, dtypes, onnx_graph)
    cons, search = request.constraints, request.search
    pins = cons.pins
    if cons.device_map_pins:  # a hand-made accelerate device_map fixes its modules; the solver places the rest
        from partitioner.device_map_pins import pins_from_device_map

        pins = pins_from_device_map(cons.device_map_pins, graph, profile.names(), cons.pins)
    # with splits, each splittable op stays a node of its own (a coarse group is never split), and so
    # does each op between a column split and a row split (solvers/split_regions.py: a region forms)
    splittable = splittable_ops(graph, options_.splits) | interior_ops(graph) if options_.splits is not None \
        else frozenset()
    coarse = _coarsen(graph, options_, search.coarsen, pins, cons.align_modules, splittable)
    from cost_models.profiled import resolve_costs  # here: cost_models.profiled imports partitioner's errors

    cost_model = resolve_costs(request.costs, graph, profile, example_inputs, training=bool(request.train.training),
                               optimizer=request.train.optimizer)

    def attempt(options: Options, started: float) -> Outcome:
        """Problem, baselines, ILP and plan record for ``options``, within the time limit from ``started``."""
        problem = Problem(coarse.graph, profile, options, pins=pins, members=coarse.members, original=graph,
                          costs=cost_model)
        if problem.options.training and problem.options.optimizer.value == "sparse-adam" and not problem.sparse_ops:
            from partitioner.plan.training_state import NO_TABLE

            log.warning(NO_TABLE)
        dense = _dense_problem(problem)
        baselines = {name: _evaluated(dense if name in DENSE_BASELINES else problem,
                                      run_baseline(name, problem, no_split=cons.no_split))
                     for name in _baseline_names(problem)}
        time_limit, gap = search.time_limit, search.gap
        deadline = started + time_limit - _finishing_time(problem, baselines, time_limit)
        lower_bound = _lower_bound(problem, started + LOWER_BOUND_SHARE * time_limit)
        solution, evaluation, ilp = _solve(problem, search.solver, baselines, deadline, gap, search.progress)
        if ilp is not None and problem.train_state:  # state kept on the host or recomputed for nothing: undone
            tidied = tidy(problem, solution.placement, evaluate, deadline)  # within the solve's own time
            if tidied != solution.placement:
                solution, evaluation = dataclasses.replace(solution, placement=tidied), evaluate(problem, tidied)
        if ilp is not None or solution.status is Status.TIME_LIMIT:  # the ILP's, or a start kept for want of time
            # the plan's solve time is everything after capture
            solution = dataclasses.replace(solution, seconds=time.perf_counter() - started)
            if lower_bound is not None and (solution.bound is None or lower_bound > solution.bound):
                # the memory-aware bound is a bound on every placement too: a solver stopped before its
                # root (a 3,000-op DAG in 5 s) states that one rather than none, or 0
                solution = dataclasses.replace(solution, bound=lower_bound,
                                               status=status_for_gap(relative_gap(evaluation.total_s, lower_bound), gap))
        verify_placement(problem, solution.placement, evaluation)
        plan = _plan(request, model_or_graph, graph, coarse, problem, solution, evaluation, baselines, lower_bound,
                     inputs, ilp, onnx_graph)
        return Outcome(plan, problem, coarse, solution, evaluation, baselines)

    if dtypes is not None and dtypes.max_error is not None:  # re-solved until the measured error keeps the budget
        from partitioner.error_budget import within_budget

        outcome = within_budget(attempt, options_, model_or_graph, example_inputs)
    else:
        outcome = attempt(options_, started)
        if dtypes is not None and dtypes.packs:  # the plan states the error its packed weights cost, measured
            from partitioner.error_budget import with_measured_error

            outcome = with_measured_error(outcome, model_or_graph, example_inputs)
    plan = outcome.plan
    if profile.probe is not None:
        plan = dataclasses.replace(plan, probe=profile.probe.to_dict())
    fractions = tuple(request.fallbacks or ())
    if fractions:
        fallback = request.replace(fallbacks=None, dynamic_shapes=None, input_shapes=None, progress=None,
                                   streaming=options_.streaming)
        plan = with_fallbacks(plan, profile, fractions, lambda base, caps: partition_outcome(
            graph, example_inputs, options=fallback.replace(devices=base, memory=caps)).plan)
    return dataclasses.replace(outcome, plan=plan)


def _from_folder(spec: Any, example_inputs: Any, request: PlanOptions) -> tuple[Any, Any, PlanOptions]:
    """A model folder's hollow model, its example inputs (unless given) and the request naming it."""
    from partitioner.frontends.hf_folder import open_folder

    src = request.source
    folder = open_folder(spec, dtype=src.folder_dtype, trust_remote_code=src.trust_remote_code,
                         input_shapes=src.input_shapes)
    if src.model_name is None:
        request = request.replace(model_name=folder.name)
    return folder.module, example_inputs if example_inputs is not None else folder.example_inputs(), request


def _solver_options(request: PlanOptions, spec: PipelineSpec | None, dtypes: Any, onnx_graph: bool) -> Options:
    """The cost semantics' options (:class:`~partitioner.solvers.problem.Options`) the request stands for:
    an ONNX graph never streams, nor does a pipeline."""
    cons = request.constraints
    return Options(
        objective=objective_of(request.objective), training=bool(request.train.training),
        optimizer=parse_optimizer(request.train.optimizer),
        streaming=cons.streaming and not onnx_graph and spec is None, link_budget=dict(cons.link_budget or {}),
        contiguous_stages=cons.contiguous_stages, pipeline=spec, precision=dtypes,
        offload=bool(request.train.offload), recompute=bool(request.train.recompute),
        save_on_host=bool(request.train.save_on_host),
        sparse_updates=bool(request.train.sparse_updates), delayed_update=bool(request.train.delayed_update),
        placed_optimizer=bool(request.train.placed_optimizer),
        splits=resolve_splits(request.splits),
    )


def _plan(request: PlanOptions, model_or_graph: Any, graph: OpGraph, coarse: Coarsening, problem: Problem,
          solution: Solution, evaluation: Evaluation, baselines: Mapping[str, tuple[Solution, Evaluation]],
          lower_bound: float | None, inputs: Any, ilp: Solution | None, onnx_graph: bool) -> Plan:
    """The plan record of a solve, with the request as asked."""
    capture = request.source.capture
    plan = Plan.from_solution(
        problem, solution, evaluation,
        baselines={name: ev for name, (_, ev) in baselines.items()},
        lower_bound=lower_bound, model_name=request.source.model_name or graph.name, inputs=inputs,
        ilp=ilp, requested_gap=request.search.gap if ilp is not None else None,
        capture="onnx" if onnx_graph else capture if not isinstance(model_or_graph, OpGraph) else "export",
        constraints={
            "pins": dict(problem.pins) and {op: problem.pins[n] for n in problem.pins for op in coarse.members[n]},
            "memory_caps": {d: problem.devices.device(d).memory for d in (request.hardware.memory or {})},
            "streaming": problem.options.streaming,
            "align_modules": tuple(request.constraints.align_modules),
        },
    )
    return dataclasses.replace(plan, request=request.to_record())


# --------------------------------------------------------------------------------------------
# Passes
# --------------------------------------------------------------------------------------------


def _capture(model_or_graph: Any, example_inputs: Any, source: Source,
             training: bool | None) -> tuple[OpGraph, tuple[InputSpec, ...] | None]:
    """The graph (a training plan's model captured in train mode), and the model's inputs as
    passed (None for a graph given as is)."""
    if isinstance(model_or_graph, OpGraph):
        if source.dynamic_shapes is not None:
            raise HetpartError("dynamic_shapes applies when partition captures a model, not to an OpGraph")
        return model_or_graph, None
    if is_onnx_model(model_or_graph):
        if source.dynamic_shapes is not None:
            raise HetpartError("dynamic_shapes applies to torch models; an ONNX model's shapes come from input_shapes")
        from partitioner.frontends.onnx import from_onnx

        return from_onnx(model_or_graph, source.input_shapes, name=source.model_name), None
    if example_inputs is None:
        raise HetpartError("partition(model, example_inputs, ...) needs example inputs to capture an nn.Module")
    args = example_inputs if isinstance(example_inputs, tuple) else tuple(example_inputs) \
        if isinstance(example_inputs, list) else (example_inputs,)
    dims = dynamic_dims(source.dynamic_shapes, args)
    with capture_mode(model_or_graph, training=bool(training)):
        graph = from_module(model_or_graph, args, capture=source.capture, name=source.model_name, dynamic_shapes=dims)
    return graph, input_specs(args, dims, graph.source if any(dims) else None)


def _profile(hardware: Hardware) -> DeviceSet:
    """The device set of the request: the profile (``detect[:NAME]`` reads the free memory now), capped."""
    profile = profile_for(hardware.devices, margin=hardware.detect_margin)
    return profile.with_memory(hardware.memory) if hardware.memory else profile


def _pipeline_spec(model_or_graph: Any, example_inputs: Any, profile: DeviceSet,
                   request: PlanOptions) -> PipelineSpec | None:
    """The plan's pipeline spec, or None when it is no pipeline (:mod:`partitioner.micro_batches`).
    ONNX models run as onnxruntime sessions, not on ``torch.distributed.pipelining``: they are
    planned without stages, and asking for stages is refused."""
    pipe = request.pipeline
    if is_onnx_model(model_or_graph):
        if pipe.micro_batches is not None or pipe.schedule is not None or pipe.stages is not None:
            raise HetpartError("pipeline stages run torch models on torch.distributed.pipelining; an ONNX model "
                               "is planned without them: drop micro_batches, schedule and stages "
                               "(CLI: --micro-batches, --schedule, --stages)")
        return None
    batch = None if isinstance(model_or_graph, OpGraph) else batch_size(example_inputs)
    spec = pipeline_spec_for(profile, request.objective, micro_batches=pipe.micro_batches, schedule=pipe.schedule,
                             stages=pipe.stages, batch=batch)
    if spec is not None and request.fallbacks:  # a cluster profile's throughput plan is a pipeline
        raise HetpartError("fallback plans are not made for pipeline plans (each stage is a process of its own); "
                           "drop fallbacks, or plan without stages")
    return spec


def _precision(request: PlanOptions, profile: DeviceSet, spec: PipelineSpec | None) -> Any:
    """The resolved ``precision`` setting (None: as traced), refused where it cannot be priced (the
    record refuses the combinations it can see; a cluster's throughput plan is a pipeline too)."""
    from cost_models.precision import PrecisionError, resolve_precision

    resolved = resolve_precision(request.precision, profile)
    if resolved is not None and spec is not None:
        raise PrecisionError("precision is planned for the latency and throughput objectives without pipeline "
                             "stages (the makespan and pipeline models do not price 16-bit copies and casts): "
                             "drop precision, or plan with objective 'latency' or 'throughput'")
    return resolved


#: The most (edge, device pair) transfer terms the ILP is built with: beyond this the model takes
#: minutes and gigabytes to build (1,000 devices: over 120 s and 4 GB for a 5-op graph) before solving.
MAX_TRANSFER_TERMS = 100_000


def _check_ilp_size(problem: Problem) -> None:
    """Refuse, with the sizes and the ways out, an ILP too large to build in reasonable time and memory."""
    devices = len(problem.device_names)
    edges = problem.graph.dag.number_of_edges()
    terms = edges * devices * (devices - 1)
    if terms > MAX_TRANSFER_TERMS:
        raise HetpartError(
            f"the ILP for {problem.graph.name!r} would have about {terms:,} transfer terms ({edges:,} edges x "
            f"{devices} devices x {devices - 1} others), over the {MAX_TRANSFER_TERMS:,} it is built with; "
            f"plan on a profile of the devices you mean to use, coarsen the graph (--coarsen on), or use a "
            f"baseline solver (--solver heft)")


def _coarsen(
    graph: OpGraph, options: Options, mode: bool | str, pins: Mapping[str, str] | None, align: Sequence[str],
    separate: frozenset[str] = frozenset(),
) -> Coarsening:
    """The coarsening a plan is solved on; pinned ops and ``separate`` ones stay out of every group."""
    keep = frozenset(_pinned_ops(graph, pins or {})) | separate
    aligned = _aligned(graph, align, keep)
    if options.splits is not None and {"time", "experts"} & set(options.splits.axes):
        # each fused experts op and the view owning its weight: one node, which a time split by expert cuts
        experts = fold_expert_weights(aligned.graph)
        if experts is not None:
            aligned = _compose(aligned, experts)
            keep = keep | frozenset(op for g in experts.members.values() if len(g) > 1 for op in g)
    if mode is False or mode == "off":
        return aligned
    keep_groups = frozenset(aligned.group_of[op] for op in keep)
    # views cost nothing and their output is their input's bytes: placed with their producer they
    # cost what they would anywhere else, so they are always folded (a third fewer nodes on transformers)
    folded = _compose(aligned, coarsen_graph(aligned.graph, CoarsenOptions(
        fold_views=True, merge_chains=False, keep_separate=keep_groups, max_group_ops=MAX_GROUP_OPS)))
    threshold = COARSEN_THRESHOLD[options.objective]
    if mode is True or mode == "on":
        threshold = min(threshold, max(1, len(folded.graph) - 1))
    keep_groups = frozenset(folded.group_of[op] for op in keep)
    return _compose(folded, auto_coarsen(folded.graph, threshold, keep_separate=keep_groups,
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
    if problem.options.pipeline is not None:  # splits users make today; greedy / HEFT make no pipeline
        return [f"single:{d}" for d in problem.device_names] + list(PIPELINE_BASELINES)
    onnx = ONNX_BASELINE_NAMES if is_onnx_graph(problem.original) else ()
    offload = TRAINING_BASELINES if problem.train_state and accelerator_devices(problem.devices) else ()
    split = SPLIT_BASELINE_NAMES if problem.split_choices and accelerator_devices(problem.devices) else ()
    split = tuple(n for n in split if n != MEGATRON or tensor_parallel_group(problem))  # like accelerators only
    return ([f"single:{d}" for d in problem.device_names] + list(BASELINE_NAMES) + list(onnx) + list(offload)
            + list(split))


#: Baselines of tools users run today, which update embedding tables densely: priced on a problem
#: without row-sparse updates (hetpart's own single-device and HEFT placements keep them).
DENSE_BASELINES = frozenset({"greedy", "sequential-fill", *TRAINING_BASELINES})


def _dense_problem(problem: Problem) -> Problem:
    """``problem`` without row-sparse updates (itself where it has none)."""
    if not problem.sparse_ops:
        return problem
    dense = Problem(problem.graph, problem.devices, dataclasses.replace(problem.options, sparse_updates=False),
                    members=problem.members, original=problem.original, costs=problem.costs)
    dense.pins, dense.allowed = problem.pins, problem.allowed  # the same pins, resolved once
    return dense


def _evaluated(problem: Problem, solution: Solution) -> tuple[Solution, Evaluation]:
    return solution, evaluate(problem, solution.placement)


def _finishing_time(problem: Problem, baselines: Mapping[str, tuple[Solution, Evaluation]], time_limit: float) -> float:
    """Seconds to keep for the steps after the solve: FINISH_EVALUATIONS timed evaluations of a
    baseline's placement, at most FINISH_SHARE of ``time_limit``."""
    placements = [sol.placement for sol, _ in baselines.values() if sol.placement.device]
    if not placements:
        return 0.0
    began = time.perf_counter()
    evaluate(problem, placements[0])
    return min(FINISH_SHARE * time_limit, FINISH_EVALUATIONS * (time.perf_counter() - began))


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
    deadline: float,
    gap: float,
    progress: ProgressFn | None,
) -> tuple[Solution, Evaluation, Solution | None]:
    """The placement the plan carries, its evaluation, and the ILP's own solution (None when a
    baseline was asked for). The ILP starts from the best baseline improved by local search,
    through the coarser levels (:mod:`partitioner.solvers.multilevel`), within ``deadline``;
    pipeline stages start from the stage dynamic program instead, whose answer is kept as it is
    when it is exact (chain-shaped graphs). Whichever of the ILP's incumbent, the warm start and the baselines is fastest is kept, under
    its own name, with the ILP's bound (a bound on every placement, whoever found it)."""
    if solver in baselines:
        sol, ev = baselines[solver]
        if not ev.feasible:
            raise InfeasiblePlacement(f"the {solver} baseline does not fit: {'; '.join(ev.violations[:3])}")
        return sol, ev, None
    if solver in SPLIT_BASELINE_NAMES and not problem.split_choices:
        raise SolverUnavailable(f"baseline {solver!r} splits linears, and this plan offers no split: add "
                                f"splits=True (CLI: --split), on a profile with an accelerator")
    if solver == MEGATRON and not tensor_parallel_group(problem):
        raise SolverUnavailable("baseline 'megatron' splits every linear evenly over like accelerators, and this plan "
                                "offers no even split over two or more of them: plan on a host of like GPUs (e.g. "
                                "8xh100-nvlink) with splits over them (CLI: --split cols,rows@8)")
    if solver.startswith("single:") or solver in BASELINE_NAMES + ONNX_BASELINE_NAMES + SPLIT_BASELINE_NAMES:
        raise SolverUnavailable(f"baseline {solver!r} is not available for this profile: "
                                f"use one of {', '.join(baselines)}")
    _check_ilp_size(problem)
    best = _best_feasible(baselines)
    pipeline = problem.options.pipeline is not None
    explain = explain_no_fit if pipeline else explain_infeasibility
    if pipeline:
        dp = solve_pipeline_dp(problem, upper_bound=best[2].total_s if best else math.inf)
        if solver == "pipeline-dp" or (solver == "auto" and dp.status is Status.OPTIMAL):  # exact on chains
            if not dp.placement.device:
                raise InfeasiblePlacement(explain_no_fit(problem))
            return dp, evaluate(problem, dp.placement), None
        if dp.placement.device:
            ev = evaluate(problem, dp.placement)
            if ev.feasible and (best is None or ev.total_s < best[2].total_s):
                best = ("pipeline-dp", dp, ev)  # the ILP's warm start
    left = deadline - time.perf_counter()
    if left < MIN_SOLVE_S:
        if best is None:
            raise InfeasiblePlacement("no time left for the ILP and no baseline fits; " + explain(problem))
        name, sol, ev = best
        note = f"the time limit was spent before the ILP could run; keeping {name}'s placement"
        log.warning(note)
        return dataclasses.replace(sol, status=Status.TIME_LIMIT, note=note), ev, None
    if pipeline:  # stages start from the best segmentation; coarser levels and local search are not stage-aware
        ilp, warm = solve_ilp(problem, solver=solver, time_limit=left, gap=gap,
                              warm_start=best[1].placement if best else None, progress=progress), None
    else:
        ilp, warm = solve_multilevel(problem, best[1] if best else None, solver=solver, time_limit=left, gap=gap,
                                     progress=progress)
    if ilp.status is Status.INFEASIBLE:
        raise InfeasiblePlacement(explain(problem))
    candidates = []
    for candidate in (ilp, warm, best[1] if best else None):
        if candidate is not None and candidate.placement.device:
            ev = evaluate(problem, candidate.placement)
            if ev.feasible:
                candidates.append((ev.total_s, candidate is not ilp, candidate, ev))
    if not candidates:
        raise InfeasiblePlacement(
            f"the {ilp.solver} solver found no placement in time and no baseline fits; " + explain(problem)
        )
    total, _, chosen, ev = min(candidates, key=lambda c: (c[0], c[1]))
    if chosen is not ilp:
        status = status_for_gap(relative_gap(total, ilp.bound), gap) if ilp.bound is not None else Status.HEURISTIC
        note = (f"the ILP's incumbent ({_ms(ilp.objective)}) was not faster than {chosen.solver} ({_ms(total)}); "
                f"the plan keeps {chosen.solver}'s placement")
        log.info(note)
        chosen = dataclasses.replace(chosen, status=status, bound=ilp.bound, note=note, objective=total,
                                     seconds=ilp.seconds)
    if ilp.note:
        log.warning("%s: %s", ilp.solver, ilp.note)
    return chosen, ev, ilp


def _ms(seconds: float | None) -> str:
    return "none" if seconds is None else f"{seconds * 1e3:.4g} ms"


def _lower_bound(problem: Problem, deadline: float) -> float:
    """The memory-aware lower bound when there is time for it, else the physical one."""
    left = deadline - time.perf_counter()
    if left < MIN_SOLVE_S:
        return physical_lower_bound(problem)
    return memory_aware_lower_bound(problem, time_limit=left)


def _signature(returns: type) -> inspect.Signature:
    """The signature of ``partition`` and ``partition_outcome``: the model, inputs and devices, then
    ``options=`` and every option of the record by name, with its default (what ``help`` shows)."""
    head = list(inspect.signature(partition_outcome).parameters.values())[:4]
    fields = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=meta["default"])
              for name, meta in META.items() if name != "devices"]
    return inspect.Signature([*head, *fields], return_annotation=returns)


partition.__doc__ = (partition.__doc__ or "").replace("{options}", describe_options(" " * 8))
partition.__signature__ = _signature(Plan)  # type: ignore[attr-defined]
partition_outcome.__signature__ = _signature(Outcome)  # type: ignore[attr-defined]
