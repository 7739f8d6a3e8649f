"""``plan_generation``: a causal LM's prefill and decode step placed together, as one generation plan.

In: a causal language model (a transformers model with a generation head, the zoo's GPT, or a
:class:`~partitioner.frontends.decode_step.DecodeStep`), a device profile, and the options record
(:class:`~partitioner.options.PlanOptions`; its ``generation`` section: ``prompt_tokens``,
``new_tokens``, ``sequences``, ``generation_objective``). Out: a
:class:`~partitioner.plan.generation.GenerationPlan`.

The steps: the decode step with a static cache of ``prompt_tokens + new_tokens`` positions is
captured twice (at the prompt length, and at one token); each capture becomes a
:class:`~partitioner.solvers.problem.Problem` whose cache-writing ops keep their buffers where they
compute (never streamed); the baselines (:mod:`partitioner.solvers.generation_baselines`) are costed
for both phases; the best one that fits warm-starts the "one placement" ILP (every weight used the
same way in both phases), which warm-starts the joint ILP (:mod:`partitioner.solvers.generation`).
The fastest pair under the objective is the plan; its certificate is the joint ILP's bound.

Example:
    >>> from transformers import LlamaConfig, LlamaForCausalLM                      # doctest: +SKIP
    >>> gen = plan_generation(LlamaForCausalLM(config), "h200-host", memory={"cuda:0": "16GB"},
    ...                       prompt_tokens=512, new_tokens=128)                    # doctest: +SKIP
    >>> print(gen.summary())                                                        # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Mapping
from typing import Any

import torch

from partitioner.errors import HetpartError, InfeasiblePlacement
from partitioner.frontends.decode_step import DecodeStep, decode_step, phase_inputs
from partitioner.ir import OpGraph
from partitioner.options import PlanOptions
from partitioner.plan import Plan
from partitioner.plan.generation import GenerationPlan, objective_seconds, request_seconds, tokens_per_second
from partitioner.plan.values import SolverInfo
from partitioner.planner import _capture, _coarsen, _precision, _profile, _solver_options
from partitioner.solvers.bounds import physical_lower_bound
from partitioner.solvers.generation import GenerationProblem, JointSolution, PhasePair, solve_generation
from partitioner.solvers.generation_baselines import GENERATION_BASELINES, generation_baselines
from partitioner.solvers.problem import Evaluation, Problem, Solution, Status, evaluate
from partitioner.verify import verify_graph, verify_placement

__all__ = ["ONE_PLACEMENT", "plan_generation"]

log = logging.getLogger(__name__)

ONE_PLACEMENT = "one placement"  # the baseline: the best plan using every weight the same way in both phases
ONE_SHARE = 0.3  # of the solve time, for the one-placement ILP (it also warm-starts the joint one)


def plan_generation(model: Any, devices: Any = None, *, options: PlanOptions | None = None,
                    **keywords: Any) -> GenerationPlan:
    """Place ``model``'s prefill and decode step together (see the module docstring).

    Takes the options of :func:`partitioner.partition` (``generate`` is implied): ``prompt_tokens``,
    ``new_tokens``, ``sequences`` (the batch), ``generation_objective`` ('request', 'decode',
    'prefill'), ``memory``, ``time_limit``, ``gap``, ``pins``, ``streaming``, ``solver``, ``costs``,
    ``precision`` (as :func:`partitioner.partition` takes it: 16-bit compute and packed weights,
    ``{"weights": "int8"}`` or ``"auto"`` for the solver to choose per op; both phases get the
    same setting, and each weight one stored form shared by both, see
    :mod:`partitioner.solvers.generation`).
    ``solver`` may also name a baseline ('llama.cpp --fit', 'llama.cpp -ot exps=CPU', 'greedy',
    'one placement'): the plan is then that baseline's pair, to run it through the same code.

    Raises:
        CaptureError: the model has no KV cache hetpart can make static, or the context exceeds its positions.
        InfeasiblePlacement: no pair of placements fits the caps.
        HetpartError: options that do not combine with generation (training, stages, fallbacks, ...).
        PrecisionError: a ``precision`` setting the devices cannot run (named, with what they can).
    """
    request = PlanOptions.build(options, **({"devices": devices} if devices is not None else {}),
                                **keywords).replace(generate=True)
    gen = request.generation
    prompt, new, batch = gen.prompt_tokens, gen.new_tokens, gen.sequences
    step = decode_step(model, batch=batch, max_context=prompt + new)
    profile = _profile(request.hardware)
    precision = _precision(request, profile, None)
    if precision is not None and precision.max_error is not None:
        from cost_models.precision import PrecisionError

        raise PrecisionError("precision max_error is planned for single plans (partition, hetpart plan); a generation "
                             "plan packs what weights= asks and hetpart check --generate reports each loop's logit "
                             "error against the float model: drop max_error, or keep modules unpacked with keep=")
    options_ = _solver_options(request, None, precision, False)
    src = request.source
    name = src.model_name or _model_name(model)
    request = request.replace(model_name=name)
    with torch.no_grad():
        captured = [_capture(step, phase_inputs(step, tokens, start=start, device=_device_of(step)),
                             dataclasses.replace(src, model_name=name), False)
                    for tokens, start in ((prompt, 0), (1, prompt))]
    started = time.perf_counter()
    from cost_models.profiled import resolve_costs  # as in partitioner.planner

    problems = []
    for (graph, _), (tokens, start) in zip(captured, ((prompt, 0), (1, prompt))):
        verify_graph(graph)
        writers = _cache_writers(graph, step)
        coarse = _coarsen(graph, options_, request.search.coarsen, request.constraints.pins,
                          request.constraints.align_modules, separate=writers)
        costs = resolve_costs(request.costs, graph, profile, phase_inputs(step, tokens, start=start),
                              training=False, optimizer=request.train.optimizer)
        problems.append((coarse, Problem(coarse.graph, profile, options_, pins=request.constraints.pins,
                                         members=coarse.members, original=graph, costs=costs,
                                         state_writers=writers)))
    weights = objective_seconds(gen.generation_objective, new)
    gp = GenerationProblem(problems[0][1], problems[1][1], weights)
    baselines = generation_baselines(gp)
    asked = request.search.solver
    if asked in baselines:  # a baseline's pair as the plan (to run it through the same emitted code)
        chosen = baselines[asked]
        if chosen.status is Status.INFEASIBLE:
            raise InfeasiblePlacement(f"the {asked} placement does not fit: {chosen.note}")
        chosen = dataclasses.replace(chosen, seconds=time.perf_counter() - started)
        return _record(request, gp, chosen, baselines, [c for c, _ in problems], [i for _, i in captured])
    if asked in GENERATION_BASELINES:
        raise HetpartError(f"the {asked} baseline does not apply to this model (it has no routed experts); "
                           f"the baselines here are {', '.join(baselines)}")
    solver = "auto" if asked == ONE_PLACEMENT else asked
    time_limit, gap = request.search.time_limit, request.search.gap
    left = max(time_limit - (time.perf_counter() - started), 0.1)
    best = _best(baselines.values())
    one = solve_generation(gp, warm_start=best.placements if best else None, solver=solver,
                           time_limit=max(ONE_SHARE * left, 0.05), gap=gap, same_use=True)
    one = dataclasses.replace(one, solver=ONE_PLACEMENT)
    baselines[ONE_PLACEMENT] = one
    if asked == ONE_PLACEMENT:
        if one.objective is None:
            raise InfeasiblePlacement(f"no one-placement pair found: {one.note}")
        return _record(request, gp, dataclasses.replace(one, seconds=time.perf_counter() - started), baselines,
                       [c for c, _ in problems], [i for _, i in captured])
    left = max(time_limit - (time.perf_counter() - started), 0.1)
    warm = _best(baselines.values())
    joint = solve_generation(gp, warm_start=warm.placements if warm else None, solver=solver,
                             time_limit=left, gap=gap)
    if joint.objective is None:
        if joint.status is Status.INFEASIBLE or warm is None:
            from partitioner.solvers.problem import explain_infeasibility

            raise InfeasiblePlacement("no placement of the prefill and the decode step fits: "
                                      + explain_infeasibility(gp.decode))
        joint = dataclasses.replace(warm, bound=joint.bound, status=Status.TIME_LIMIT,
                                    note=f"the joint ILP found nothing better in time; keeping {warm.solver}'s pair")
    joint = dataclasses.replace(joint, seconds=time.perf_counter() - started)
    return _record(request, gp, joint, baselines, [c for c, _ in problems], [i for _, i in captured])


def _record(request: PlanOptions, gp: GenerationProblem, joint: JointSolution, baselines: Mapping[str, JointSolution],
            coarse: list[Any], inputs: list[Any]) -> GenerationPlan:
    gen = request.generation
    phase_plans = []
    evaluations: list[Evaluation] = []
    for i, (problem, placement) in enumerate(zip(gp.phases, joint.placements)):
        ev = evaluate(problem, placement)
        verify_placement(problem, placement, ev)
        evaluations.append(ev)
        solution = Solution(joint.solver, placement, joint.status, None, joint.seconds,
                            f"solved with the {('decode', 'prefill')[i]} step: the generation plan's solver states "
                            f"the bound of both")
        phase_baselines = {name: evaluate(problem, b.placements[i]) for name, b in baselines.items()
                           if b.placements[i].device}
        plan = Plan.from_solution(
            problem, solution, ev, baselines=phase_baselines, lower_bound=physical_lower_bound(problem),
            model_name=request.source.model_name, inputs=inputs[i], capture=request.source.capture,
            constraints={"pins": dict(request.constraints.pins or {}),
                         "memory_caps": {d: problem.devices.device(d).memory for d in (request.hardware.memory or {})},
                         "streaming": problem.options.streaming})
        phase_plans.append(dataclasses.replace(plan, request=request.to_record()))
    pre_s, dec_s = (ev.total_s for ev in evaluations)
    new = gen.new_tokens
    rows = {}
    for name, b in baselines.items():
        if not b.placements.prefill.device:
            rows[name] = {"prefill_s": None, "decode_s": None, "request_s": None, "feasible": False, "note": b.note}
            continue
        ev_pre, ev_dec, _, violations = gp.evaluate(b.placements)
        rows[name] = {"prefill_s": ev_pre.total_s, "decode_s": ev_dec.total_s,
                      "request_s": request_seconds(ev_pre.total_s, ev_dec.total_s, new),
                      "feasible": not violations, "note": violations[0] if violations else b.note}
    gap = None
    if joint.objective and joint.bound is not None:
        gap = max(0.0, (joint.objective - joint.bound) / joint.objective)
    solver = SolverInfo(joint.solver, joint.status.value, joint.objective, joint.bound, gap, joint.seconds,
                        requested_gap=request.search.gap, nodes=len(gp.decode.nodes), note=joint.note)
    predicted = {"prefill_s": pre_s, "decode_s": dec_s, "request_s": request_seconds(pre_s, dec_s, new),
                 "prefill_tokens_per_s": tokens_per_second(gen.sequences * gen.prompt_tokens, pre_s),
                 "decode_tokens_per_s": tokens_per_second(gen.sequences, dec_s)}
    req = {"prompt_tokens": gen.prompt_tokens, "new_tokens": new, "batch": gen.sequences,
           "max_context": gen.prompt_tokens + new, "objective": gen.generation_objective}
    return GenerationPlan(phase_plans[0], phase_plans[1], req, predicted, solver, rows)


def _best(solutions: Any) -> JointSolution | None:
    ok = [s for s in solutions if s.objective is not None and s.status is not Status.INFEASIBLE
          and s.placements.prefill.device and math.isfinite(s.objective)]
    return min(ok, key=lambda s: s.objective) if ok else None


def _cache_writers(graph: OpGraph, step: DecodeStep) -> frozenset[str]:
    """The ops that own a cache buffer (they write it): the buffer lives where they compute."""
    names = set(step.cache_names)
    return frozenset(p.owner for p in graph.params.values()
                     if p.owner is not None and (p.name in names or names.intersection(p.aliases)))


def _device_of(step: DecodeStep) -> torch.device:
    """Where the example inputs go: the model's device (the CPU for a hollow model on meta)."""
    for tensor in step.parameters():
        return torch.device("cpu") if tensor.device.type == "meta" else tensor.device
    return torch.device("cpu")


def _model_name(model: Any) -> str:
    inner = model.inner.model if isinstance(model, DecodeStep) and hasattr(model.inner, "model") else model
    return type(inner).__name__
