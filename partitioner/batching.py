"""Batch sizing from memory: the largest micro-batch whose plan fits, and the accumulation steps.

In: a model, its example inputs, a device set (with caps) and a global batch ``G``. Out: a
:class:`BatchFit`: the largest micro-batch ``m`` whose training plan fits every device, the
accumulation steps ``G // m`` that reach the global batch, the predicted time per global step,
the plan (its ``batch`` section records ``m`` and the steps, :mod:`partitioner.plan.batch`) and
every micro-batch tried with its verdict.

How inputs are rescaled: dimension 0 of every tensor input is the batch (as for pipeline plans,
:mod:`partitioner.micro_batches`). The example inputs are first brought to the global batch
(:func:`inputs_at_batch`: their rows repeated cyclically, or the first ``G`` rows kept; values do
not change what a plan costs, only shapes do), then cut into ``G // m`` micro-batches with
:func:`~partitioner.micro_batches.micro_batch_inputs`. Non-tensor inputs and 0-d tensors are
passed as they are. The model is re-captured at each micro-batch tried, so every activation,
saved tensor and working set is priced at that size (the memory model scales them with the batch;
parameters, gradients and optimizer state do not change).

Search rule: a micro-batch must divide the global batch (every micro-batch has the same size, so
the accumulated gradient of a mean loss is the mean of the micro-batches' means; no remainder).
The candidates are the divisors of ``G``. The global batch itself is tried first (one step, no
accumulation); then micro-batch 1 (if it does not fit, nothing does: :class:`InfeasiblePlacement`
naming each device, the bytes the step needs there at micro-batch 1 and its cap); then bisection
over the divisors between them, so ``G = 2**k`` takes at most ``2 + log2(k + 1)`` solves. The
bisection assumes that a micro-batch fits whenever a larger one does (memory grows with the
batch). The next larger divisor than the answer was solved and did not fit (its reason is kept).

Bounds: a global batch is at most :data:`MAX_GLOBAL_BATCH` samples (2**24, far above the batches
trained in practice; the divisor search and every per-sample figure stay small), and the example
inputs brought to it must take at most half of the memory this process can have now (``MemAvailable``
of ``/proc/meminfo``, lowered by a cgroup memory limit; the other half is left for the model and its
capture): the bytes are counted (:func:`input_bytes_at_batch`: the repeated rows of every real
tensor input; slices and meta or fake tensors allocate nothing) and a batch over the limit is refused
before anything is allocated.

Time per global step: ``steps`` micro-batches forward and backward and one optimizer step, from
the plan's evaluation with its optimizer steps taken out of the per-micro-batch time
(:func:`global_step_seconds`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from partitioner.errors import HetpartError, InfeasiblePlacement
from partitioner.micro_batches import batch_size, micro_batch_inputs
from partitioner.plan.batch import batch_record
from partitioner.solvers.problem import Evaluation, Objective, Placement, Problem, evaluate

__all__ = ["BatchFit", "Trial", "fit_batch", "fit_outcome", "inputs_at_batch", "input_bytes_at_batch", "candidates",
           "check_batches", "global_step_seconds", "evaluate_at", "host_memory_available", "MAX_GLOBAL_BATCH"]

#: The largest global batch sized, in samples (2**24 = 16,777,216).
MAX_GLOBAL_BATCH = 2**24



@dataclasses.dataclass(frozen=True)
class Trial:
    """One micro-batch planned: whether a placement fits, and its predicted time and memory (or why not)."""

    micro_batch: int
    fits: bool
    micro_step_s: float | None = None          # one micro-batch forward + backward + optimizer step
    memory: Mapping[str, int] = dataclasses.field(default_factory=dict)  # bytes per device when it fits
    reason: str = ""                           # the InfeasiblePlacement message when it does not


@dataclasses.dataclass(frozen=True)
class BatchFit:
    """The batch-sizing answer (see the module docstring)."""

    global_batch: int
    micro_batch: int
    steps: int                                 # accumulation steps: global_batch // micro_batch
    step_s: float                              # predicted time per global step
    outcome: Any                               # partitioner.planner.Outcome at the micro-batch
    tried: tuple[Trial, ...]                   # in the order solved

    @property
    def plan(self) -> Any:
        """The plan at the micro-batch, with its ``batch`` section."""
        return self.outcome.plan

    @property
    def next_larger(self) -> Trial | None:
        """The trial of the smallest larger candidate (it did not fit), or None when ``m == G``."""
        larger = [t for t in self.tried if t.micro_batch > self.micro_batch]
        return min(larger, key=lambda t: t.micro_batch) if larger else None

    def summary(self) -> str:
        """Lines for people: the answer, memory per device against its cap, and every trial."""
        from cost_models.units import format_bytes, format_seconds
        from partitioner.terminal import one_line

        plan = self.plan
        lines = [f"fit for '{one_line(plan.model_name)}' on {one_line(plan.devices.name)}: global batch "
                 f"{self.global_batch} = {self.steps} x micro-batch {self.micro_batch}"
                 f" ({'gradient accumulation' if self.steps > 1 else 'no accumulation'})",
                 f"  predicted  {format_seconds(self.step_s)} per global step "
                 f"({format_seconds(plan.predicted['total_s'])} per micro-batch step, optimizer once)",
                 "  inputs     rescaled along dimension 0 (the batch): example rows repeated to the global "
                 "batch, cut into equal micro-batches"]
        from partitioner.plan.precision import precision_lines

        lines += precision_lines(plan)
        for device, mem in plan.memory.items():
            used, cap = mem["used"], mem["capacity"]
            lines.append(f"  memory     {one_line(device):<10} {format_bytes(used):>11} of {format_bytes(cap):>11} "
                         f"({used / cap:.0%})")
        for t in sorted(self.tried, key=lambda t: t.micro_batch):
            if t.fits:
                verdict = f"fits, {format_seconds(t.micro_step_s)} per micro-batch step"
            else:
                verdict = "does not fit: " + one_line(t.reason)
            lines.append(f"  tried      micro-batch {t.micro_batch:>6}: {verdict}")
        return "\n".join(lines)


def inputs_at_batch(inputs: Any, batch: int) -> tuple:
    """Every tensor input brought to ``batch`` rows along dimension 0: its rows repeated
    cyclically (row ``i`` is example row ``i mod b``), or its first ``batch`` rows.

    Raises:
        HetpartError: ``batch`` below 1 or over :data:`MAX_GLOBAL_BATCH`, tensor inputs whose first
            dimensions differ (the first dimension of every tensor input must be the batch), or
            inputs at ``batch`` that would take more than half of the memory available now
            (refused before anything is allocated).

    Example:
        >>> import torch
        >>> inputs_at_batch((torch.tensor([[1], [2]]),), 5)[0].flatten().tolist()
        [1, 2, 1, 2, 1]
    """
    check_batches(batch)
    args = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    _common_batch(args)
    needed = input_bytes_at_batch(args, batch)
    if needed:
        available = host_memory_available()
        if needed > available // 2:
            from cost_models.units import format_bytes

            raise HetpartError(f"global batch {batch:,}: the example inputs repeated to {batch:,} rows would take "
                               f"{format_bytes(needed)}, over half of the {format_bytes(available)} of memory "
                               f"available now; give a smaller global batch, or inputs on the meta device "
                               f"(planning needs their shapes only)")
    out = []
    for x in args:
        shape = getattr(x, "shape", None)
        if shape is None or len(shape) == 0:
            out.append(x)
            continue
        rows = int(shape[0])
        if rows >= batch:
            out.append(x[:batch])
        else:
            out.append(x.repeat(math.ceil(batch / rows), *([1] * (len(shape) - 1)))[:batch])
    return tuple(out)


def input_bytes_at_batch(inputs: Any, batch: int) -> int:
    """The bytes :func:`inputs_at_batch` allocates to bring ``inputs`` to ``batch`` rows: each real
    tensor input with fewer rows is repeated (``ceil(batch / rows)`` copies of its rows, sliced
    after); one with enough rows is sliced (a view), and meta or fake tensors hold no memory.

    Example:
        >>> import torch
        >>> input_bytes_at_batch((torch.zeros(2, 3), torch.zeros(4, 3, device="meta")), 5)   # 6 rows x 12 B
        72
    """
    import torch
    from torch._subclasses.fake_tensor import is_fake

    total = 0
    for x in (tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)):
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] >= batch or x.is_meta or is_fake(x):
            continue
        rows = int(x.shape[0])
        total += math.ceil(batch / rows) * rows * (x[:1].numel() * x.element_size())
    return total


def host_memory_available() -> int:
    """Bytes this process can allocate now: ``MemAvailable`` (``/proc/meminfo``; else the free
    pages), lowered by a cgroup v2 or v1 memory limit (the limit less the usage).

    Example:
        >>> host_memory_available() > 0                     # doctest: +SKIP
        True
    """
    import os
    from pathlib import Path

    available = None
    try:
        for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024      # kiB
    except (OSError, ValueError, IndexError):
        pass
    if available is None:
        try:
            available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
        except (AttributeError, ValueError, OSError):
            available = 8 * 2**30                           # unknown: a small machine's
    v1 = "/sys/fs/cgroup/memory/memory."
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         (v1 + "limit_in_bytes", v1 + "usage_in_bytes")):
        try:
            cap, used = int(Path(limit).read_text().strip()), int(Path(usage).read_text().strip())
        except (OSError, ValueError):                       # no such cgroup, or "max": no limit
            continue
        available = min(available, max(cap - used, 0))
    return available


def candidates(global_batch: int) -> list[int]:
    """The micro-batches tried for ``global_batch``: its divisors, ascending.

    Example:
        >>> candidates(12)
        [1, 2, 3, 4, 6, 12]
    """
    check_batches(global_batch)
    small = [d for d in range(1, math.isqrt(global_batch) + 1) if global_batch % d == 0]
    return sorted(set(small + [global_batch // d for d in small]))


def check_batches(global_batch: Any, micro_batch: Any = None) -> None:
    """Raise unless ``global_batch`` is a whole number from 1 to :data:`MAX_GLOBAL_BATCH` and
    ``micro_batch`` (when given) one that divides it.

    Raises:
        HetpartError: names the value, the rule and the divisors to choose from.

    Example:
        >>> check_batches(64, 16)
    """
    def whole(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 1

    if not whole(global_batch):
        raise HetpartError(f"global batch {global_batch!r}: expected a whole number of samples, at least 1, "
                           f"e.g. --global-batch 64")
    if global_batch > MAX_GLOBAL_BATCH:
        raise HetpartError(f"global batch {global_batch:,}: over the {MAX_GLOBAL_BATCH:,} samples per step hetpart "
                           f"sizes; give the samples of one optimizer step, e.g. --global-batch 4096")
    if micro_batch is None:
        return
    if not whole(micro_batch):
        raise HetpartError(f"micro-batch {micro_batch!r}: expected a whole number of samples, at least 1, "
                           f"e.g. --micro-batch 8")
    if global_batch % micro_batch:
        raise HetpartError(f"micro-batch {micro_batch} does not divide the global batch of {global_batch}: a global "
                           f"step accumulates equal micro-batches, with no remainder; use one of "
                           f"{', '.join(map(str, candidates(global_batch)))}, or a global batch that is a "
                           f"multiple of {micro_batch}")


def fit_batch(
    model: Any,
    example_inputs: Any,
    devices: Any = None,
    *,
    global_batch: int | None = None,
    micro_batch: int | None = None,
    training: bool = True,
    on_trial: Callable[[Trial], None] | None = None,
    options: Any = None,
    **keywords: Any,
) -> BatchFit:
    """The largest micro-batch whose training plan fits every device, and its accumulation steps.

    Parameters:
        model, example_inputs, devices: as for :func:`~partitioner.planner.partition`; the model
            must be an ``nn.Module`` (it is re-captured at every micro-batch tried).
        global_batch: samples per optimizer step (default: the example inputs' batch); the
            example inputs are rescaled to it along dimension 0 (:func:`inputs_at_batch`).
        micro_batch: plan exactly this micro-batch (it must divide the global batch) instead of
            searching.
        training: must be true: accumulation is over gradients.
        on_trial: called with each :class:`Trial` as it is solved (progress).
        options, keywords: the request (:class:`~partitioner.options.PlanOptions`) and fields
            replaced in it (``memory``, ``optimizer``, ``pins``, ``solver``, ``time_limit`` per solve, ...).

    Raises:
        HetpartError: a global batch below 1, a micro-batch that does not divide it, no
            training, an OpGraph or ONNX model, or pipeline options.
        InfeasiblePlacement: no micro-batch fits (or the one asked for does not): names each
            device, the bytes the step needs there at that micro-batch, and its cap.

    Example:
        >>> import models
        >>> module, inputs = models.get("mlp", "tiny")
        >>> fit = fit_batch(module, inputs, "h200-host", global_batch=8, memory={"cuda:0": "1GB"})
        >>> fit.micro_batch * fit.steps
        8
    """
    from partitioner.frontends.onnx_input import is_onnx_model
    from partitioner.ir import OpGraph
    from partitioner.options import PlanOptions
    from partitioner.planner import partition_outcome

    if not training:
        raise HetpartError("batch sizing accumulates gradients over micro-batches: it plans training steps; "
                           "pass training=True (CLI: --training)")
    if devices is not None:
        keywords["devices"] = devices
    # the record refuses what does not combine with batch sizing; each solve plans one micro-batch
    wanted = PlanOptions.build(options, **keywords, training=True, batch=micro_batch or "auto")
    request = wanted.replace(batch=None)
    if isinstance(model, OpGraph) or is_onnx_model(model):
        raise HetpartError("batch sizing re-captures the model at every micro-batch it tries: give the torch "
                           "nn.Module and its example inputs, not an OpGraph or an ONNX model")
    if example_inputs is None or batch_size(example_inputs) is None:
        raise HetpartError("batch sizing needs example inputs with a tensor whose dimension 0 is the batch")
    if global_batch is None:
        global_batch = batch_size(example_inputs)
    check_batches(global_batch, micro_batch)
    full = inputs_at_batch(example_inputs, global_batch)
    order = [micro_batch] if micro_batch is not None else candidates(global_batch)
    outcomes: dict[int, Any] = {}
    tried: list[Trial] = []

    def solve(m: int) -> bool:
        try:
            out = partition_outcome(model, micro_batch_inputs(full, global_batch // m), options=request)
        except InfeasiblePlacement as exc:
            trial = Trial(m, False, reason=str(exc))
        else:
            outcomes[m] = out
            trial = Trial(m, True, out.evaluation.total_s, dict(out.evaluation.memory))
        tried.append(trial)
        if on_trial is not None:
            on_trial(trial)
        return trial.fits

    lo, hi = 0, len(order) - 1
    if not solve(order[hi]):
        if hi == 0 or not solve(order[0]):
            raise InfeasiblePlacement(_no_fit(model, full, global_batch, order[0], tried[-1].reason, request))
        while hi - lo > 1:  # order[lo] fits, order[hi] does not
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if solve(order[mid]) else (lo, mid)
    else:
        lo = hi
    m = order[lo]
    out = outcomes[m]
    steps = global_batch // m
    step_s = global_step_seconds(out.problem, out.solution.placement, out.evaluation, steps)
    plan = dataclasses.replace(out.plan, batch=batch_record(global_batch, m, step_s), request=wanted.to_record())
    return BatchFit(global_batch, m, steps, step_s, dataclasses.replace(out, plan=plan), tuple(tried))


def fit_outcome(model: Any, example_inputs: Any, request: Any) -> Any:
    """``partition_outcome(..., batch=...)``: ``"auto"`` searches the micro-batch, a number fixes it;
    the example inputs are the global batch (the record has checked ``batch``). Returns the
    Outcome at the micro-batch."""
    micro = None if request.batch == "auto" else request.batch
    return fit_batch(model, example_inputs, micro_batch=micro, options=request).outcome


def global_step_seconds(problem: Problem, placement: Placement, evaluation: Evaluation, steps: int) -> float:
    """Predicted time of ``steps`` micro-batches forward and backward plus one optimizer step.

    The evaluation's time includes one optimizer step (each device's: summed on the critical path
    for ``latency``, on its device for ``throughput``, the longest for ``makespan``, as
    :func:`~partitioner.solvers.problem.evaluate` adds them); that share is paid once per global
    step and the rest ``steps`` times; the busiest link, which runs beside compute, carries
    ``steps`` micro-batches' copies. With ``steps=1`` this is the evaluation's ``total_s``.

    Example:
        >>> global_step_seconds(out.problem, out.solution.placement, out.evaluation, 4)   # doctest: +SKIP
        0.0123
    """
    opt = {d: 0.0 for d in problem.device_names}
    if problem.options.training:
        for n in problem.nodes:
            home = placement.state_device(n)
            opt[home] += problem.opt_step[n][home]
    links = steps * max(evaluation.per_link_s.values(), default=0.0)  # links run beside compute
    if problem.train_state and problem.options.objective is Objective.LATENCY:
        # host steps run beside the last micro-batch's backward (solvers/train_state.py); steps on
        # accelerators once, after it
        once = sum(s for d, s in opt.items() if d != problem.host)
        return max((steps - 1) * (evaluation.critical_path_s - once) + evaluation.total_s, links)
    if problem.options.objective is Objective.THROUGHPUT:
        return max([*(steps * (evaluation.per_device_s[d] - opt[d]) + opt[d] for d in opt), links])
    once = sum(opt.values()) if problem.options.objective is Objective.LATENCY else max(opt.values(), default=0.0)
    return max(steps * (evaluation.critical_path_s - once) + once, links)


def evaluate_at(fit: BatchFit, model: Any, example_inputs: Any, micro_batch: int) -> Evaluation:
    """The fit's placement (op by op) evaluated with the model captured at another micro-batch:
    the memory model's verdict on running the same plan with ``micro_batch`` rows.

    Example:
        >>> evaluate_at(fit, module, inputs, 2 * fit.micro_batch).violations   # doctest: +SKIP
        ('device cuda:0 needs 1,234 bytes, over its capacity of 1,000',)
    """
    check_batches(fit.global_batch, micro_batch)
    problem = fit.outcome.problem
    full = inputs_at_batch(example_inputs, fit.global_batch)
    at = _problem_at(model, micro_batch_inputs(full, fit.global_batch // micro_batch), problem.devices,
                     problem.options, dict(fit.plan.constraints.get("pins", {})))
    placed = fit.plan.placement
    missing = [op for op in at.nodes if op not in placed]
    if missing:
        raise HetpartError(f"the model captured at micro-batch {micro_batch} has ops the plan does not place "
                           f"({', '.join(missing[:3])}): its graph depends on the batch size")
    return evaluate(at, Placement({op: placed[op] for op in at.nodes}, dict(fit.plan.weights)))


# --------------------------------------------------------------------------------------------


def _common_batch(args: tuple) -> None:
    rows = {i: int(x.shape[0]) for i, x in enumerate(args) if getattr(x, "shape", None) is not None
            and len(x.shape) > 0}
    if len(set(rows.values())) > 1:
        shown = ", ".join(f"input {i}: {n}" for i, n in rows.items())
        raise HetpartError(f"the tensor inputs have different first dimensions ({shown}); batch sizing takes "
                           f"dimension 0 of every tensor input as the batch: pass inputs that share it")


def _problem_at(model: Any, inputs: tuple, devices: Any, options: Any, pins: Any) -> Problem:
    """The op-level problem of ``model`` captured (in train mode) at ``inputs``: memory as planned there."""
    from partitioner.frontends.fx import capture_mode, from_module

    with capture_mode(model, training=True):
        graph = from_module(model, inputs)
    return Problem(graph, devices, options, pins=pins)


def _no_fit(model: Any, full: tuple, global_batch: int, m: int, reason: str, request: Any) -> str:
    """Why not even micro-batch ``m`` fits: the solver's reason and, per device, the bytes the whole
    step would need there at micro-batch ``m`` against its cap."""
    from cost_models.training import parse_optimizer
    from partitioner.options import objective_of
    from partitioner.planner import _profile
    from partitioner.solvers.problem import Options

    profile = _profile(request.hardware)
    opts = Options(objective=objective_of(request.objective), training=True,
                   optimizer=parse_optimizer(request.train.optimizer), streaming=False)
    problem = _problem_at(model, micro_batch_inputs(full, global_batch // m), profile, opts, request.constraints.pins)
    needs = []
    for d in problem.device_names:
        ev = evaluate(problem, Placement({n: d for n in problem.nodes}))
        needs.append(f"{d} {ev.memory[d]:,} bytes (cap {problem.capacity[d]:,})")
    return (f"no micro-batch of the global batch {global_batch} fits: even micro-batch {m} does not. "
            f"The whole step at micro-batch {m} on one device needs: {'; '.join(needs)}. {reason}")
