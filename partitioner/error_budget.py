"""The accuracy budget of a plan with packed weights: measured, solved under, and re-measured.

In: a request whose ``precision`` has ``max_error`` (the relative L2 error of the model's outputs
against the float model on the example inputs that packed weights may cost), the model with its
weights, and the planner's ``attempt`` (options -> solved plan). Out: a plan whose measured error
keeps the budget, with the measurement recorded in ``precision.error``, or a
:class:`~cost_models.precision.PrecisionError` naming the least error found and the ops causing it.

The passes:

1. :func:`measured_precision`: each weight the plan may pack is packed alone, in each dtype a
   device offers, and the error that costs measured (:func:`backends.torch.weight_errors.weight_errors`)
   on the first sample of the batch (one forward per weight and dtype);
2. :func:`within_budget`: the solver bounds the estimate (their root sum of squares,
   :mod:`partitioner.solvers.packing_error`) by the budget; the plan's own emitted module (every
   device bound to the host: its kernels, no placement) is measured; while that is over the budget
   the estimate's bound is tightened by the ratio and the plan solved again (at most
   :data:`MAX_ROUNDS` times, each solve within the time limit);
3. when no placement keeps the estimate within the budget (memory forces packing) or the rounds
   run out, the least-error plan is searched for (the estimate's bound raised step by step towards
   what fits) and its measured error and largest ops are named in the refusal.

Example:
    >>> plan = partition(model, (x,), "h200-host", memory={"cuda:0": "2GB"},
    ...                  precision={"weights": "auto", "max_error": 0.02})      # doctest: +SKIP
    >>> plan.precision["error"]["measured"]["all"] <= 0.02                     # doctest: +SKIP
    True
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from cost_models.precision import Precision, PrecisionError, quantizable_weight, weight_shape_problem
from partitioner.errors import InfeasiblePlacement
from partitioner.ir import OpGraph
from partitioner.solvers.packing_error import estimated_error, op_errors
from partitioner.solvers.problem import node_dtypes

log = logging.getLogger(__name__)

__all__ = ["measured_precision", "within_budget", "with_measured_error", "MAX_ROUNDS"]

MAX_ROUNDS = 4      # solves under a tightened bound after a measured plan is over the budget
SEARCH_STEPS = 3    # solves looking for the least error once the budget cannot be kept
TIGHTEN = 0.9       # margin under the measured ratio when the bound is tightened


def measured_precision(precision: Precision, model: Any, example_inputs: Any, graph: OpGraph,
                       request: Any) -> Precision:
    """``precision`` with ``weight_errors`` measured for every weight of ``graph`` a device may pack.

    Raises:
        PrecisionError: the model is no ``nn.Module`` with its weights (an OpGraph, an ONNX model, a
            model folder planned hollow), or the request also asks for fallback plans.
    """
    import torch

    if not isinstance(model, torch.nn.Module):
        raise PrecisionError(f"precision max_error is measured by running the model with its weights on the "
                             f"example inputs; {type(model).__name__} is not a torch model (an OpGraph or ONNX "
                             f"model): plan the nn.Module, or drop max_error and pack explicitly (weights=int8)")
    if request.fallbacks:
        raise PrecisionError("precision max_error is not planned with fallback plans yet (each fallback would "
                             "need its own measured plan): drop fallbacks or max_error")
    offered = sorted({w for per in precision.weights.values() for w in per})
    params: dict[str, tuple[str, ...]] = {}
    for op in graph.ops.values():
        name = quantizable_weight(op, graph.params)
        if name is not None:
            shape = graph.params[name].shape
            params[name] = tuple(w for w in offered if weight_shape_problem(shape, w) is None)
    params = {p: ws for p, ws in params.items() if ws}
    from backends.torch.weight_errors import weight_errors  # the model runs: torch's kernels

    args = _one_sample(example_inputs if isinstance(example_inputs, tuple) else (example_inputs,))
    started = time.perf_counter()
    errors = weight_errors(model, args, params)
    log.info("measured the output error of %d weights packed alone in %.1f s", len(errors),
             time.perf_counter() - started)
    return dataclasses.replace(precision, weight_errors=errors)


def _one_sample(args: tuple) -> tuple:
    """The first sample of a batch (every tensor input cut to 1 along its first dimension) where
    every tensor input has the same first dimension above 1, else ``args``: the per-weight terms
    are an estimate (one forward per weight and dtype), the whole plan is measured on every sample."""
    import torch

    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    sizes = {int(t.shape[0]) if t.dim() else 0 for t in tensors}
    if len(sizes) != 1 or next(iter(sizes)) < 2:
        return args
    return tuple(a[:1] if isinstance(a, torch.Tensor) else a for a in args)


def within_budget(attempt: Callable[[Any, float], Any], options: Any, model: Any, example_inputs: Any) -> Any:
    """The first solved outcome whose measured error keeps ``max_error`` (see the module docstring).

    Raises:
        PrecisionError: no plan found keeps it; names the least error found and its largest ops.
    """
    precision: Precision = options.precision
    budget = precision.max_error
    args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    tried: list[tuple[float, Any]] = []   # (measured error, outcome) of every plan solved
    bound = budget
    for _ in range(1 + MAX_ROUNDS):
        try:
            outcome = attempt(_bounded(options, bound), time.perf_counter())
        except InfeasiblePlacement:
            break  # memory needs more packing than the bound allows
        measured = _measure(outcome, model, args)
        tried.append((measured["all"], outcome))
        if measured["all"] <= budget:
            return _recorded(outcome, measured)
        estimate = _estimate(outcome)
        if estimate == 0.0:  # nothing packed: the error is the activations' dtypes, not the weights
            break
        bound = min(bound, estimate) * TIGHTEN * budget / measured["all"]
        log.info("plan measured at %.3g against max_error %.3g: re-solving with the estimate bounded by %.3g",
                 measured["all"], budget, bound)
    raise PrecisionError(_refusal(budget, _least(attempt, options, model, args, tried, budget)))


def _least(attempt: Callable[[Any, float], Any], options: Any, model: Any, args: tuple,
           tried: list[tuple[float, Any]], budget: float) -> tuple[float, Any]:
    """The least-error plan found: those tried, the plan without a bound, and bounds between."""
    try:
        free = attempt(_bounded(options, None), time.perf_counter())
    except InfeasiblePlacement:
        free = None
    if free is not None:
        tried.append((_measure(free, model, args)["all"], free))
        low, high = budget, max(_estimate(free), budget)
        for _ in range(SEARCH_STEPS):
            if high <= low * 1.01:
                break
            middle = (low * high) ** 0.5
            try:
                outcome = attempt(_bounded(options, middle), time.perf_counter())
            except InfeasiblePlacement:
                low = middle
                continue
            tried.append((_measure(outcome, model, args)["all"], outcome))
            high = middle
    if not tried:
        raise InfeasiblePlacement("no placement fits the memory caps even without an accuracy budget")
    return min(tried, key=lambda t: t[0])


def with_measured_error(outcome: Any, model: Any, example_inputs: Any) -> Any:
    """``outcome`` whose plan records the measured error of its packed weights against the float
    model (``precision.error.measured``), where it packs some and ``model`` has its weights; else as is."""
    import torch

    packed = outcome.plan.precision.get("weights") if outcome.plan.precision else None
    if not packed or not isinstance(model, torch.nn.Module) or any(p.is_meta for p in model.parameters()):
        return outcome
    args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    measured = _measure(outcome, model, args)
    section = dict(outcome.plan.precision)
    section["error"] = {"measured": {k: v for k, v in measured.items() if k != "how"}, "measured_by": measured["how"]}
    return dataclasses.replace(outcome, plan=dataclasses.replace(outcome.plan, precision=section))


def _refusal(budget: float, least: tuple[float, Any]) -> str:
    error, outcome = least
    problem = _with_terms(outcome.problem)
    ops = op_errors(problem, node_dtypes(problem, outcome.solution.placement))
    worst = ", ".join(f"{op} ({e:.2g})" for op, e in list(ops.items())[:5]) or "none packed"
    keep = ";".join(dict.fromkeys(outcome.problem.original.ops[op].module_path or op for op in list(ops)[:3]))
    if not ops:
        return (f"no plan found keeps the output error within precision max_error={budget:g}: a plan packing no "
                f"weight measures {error:.3g}, from its 16-bit activations alone; raise max_error, or drop the "
                f"16-bit activations (activations=auto, or a device's bf16/fp16)")
    return (f"no plan found keeps the output error within precision max_error={budget:g}: the least error found "
            f"is {error:.3g} (measured on the example inputs), by a plan packing {len(ops)} weights; the largest "
            f"alone: {worst}. Raise max_error, give the devices more memory, or keep those modules unpacked "
            f"(keep={keep or '...'})")


def _bounded(options: Any, bound: float | None) -> Any:
    """``options`` with the solver's bound on the estimate set to ``bound`` (None: no bound)."""
    precision = options.precision
    if bound is None:
        precision = dataclasses.replace(precision, max_error=None, error_budget=None)
    else:
        precision = dataclasses.replace(precision, error_budget=bound)
    return dataclasses.replace(options, precision=precision)


def _estimate(outcome: Any) -> float:
    problem = _with_terms(outcome.problem)
    return estimated_error(problem, node_dtypes(problem, outcome.solution.placement))


def _with_terms(problem: Any) -> Any:
    """``problem``, or where it was solved without a bound a twin whose error terms are available."""
    import copy

    if problem.precision.max_error is not None:
        return problem
    twin = copy.copy(problem)
    twin.precision = dataclasses.replace(problem.precision, max_error=float("inf"))
    twin.__dict__.pop("error_squares", None)
    return twin


def _measure(outcome: Any, model: Any, args: tuple) -> dict[str, Any]:
    """The plan's measured errors (``plan_error``'s), with ``"how"`` it was measured."""
    from backends.torch.weight_errors import plan_error

    errors, how = plan_error(outcome.plan, model, args, outcome.problem.quantizable)
    return {**errors, "how": how}


def _recorded(outcome: Any, measured: Mapping[str, float]) -> Any:
    """``outcome`` whose plan records the budget, the measured errors and each packed op's own."""
    problem, plan = outcome.problem, outcome.plan
    dtype = node_dtypes(problem, outcome.solution.placement)
    section = dict(plan.precision)
    section["error"] = {
        "max_error": problem.precision.max_error,
        "measured": {k: v for k, v in measured.items() if k != "how"},
        "measured_by": measured["how"],
        "estimated": estimated_error(problem, dtype),
        "ops": op_errors(problem, dtype),
    }
    return dataclasses.replace(outcome, plan=dataclasses.replace(plan, precision=section))
