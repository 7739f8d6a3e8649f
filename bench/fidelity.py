"""Predicted against measured: the pieces ``cost_fidelity.py`` and ``gpu_check.py`` share.

In: a plan, the model it was made for, the inputs, a binding of its devices to present ones.
Out: the measured time of a step of the emitted module (:func:`step_seconds`: forward under
``inference_mode``, or forward + loss + backward + optimizer step), the measured busy time of
each of the plan's devices in that module (:func:`device_seconds`: every op of the emitted module
timed in place by :func:`cost_models.measure.measure_ops`, summed by the device the plan put it
on; the inserted copies summed apart), and the statistics the targets are stated in
(:func:`relative_error`, :func:`kendall_tau`).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from cost_models.machine_load import LoadMeter
from cost_models.measure import MeasureOptions, make_optimizer, measure_ops
from cost_models.measure_cache import MeasurementCache

__all__ = ["step_fn", "step_seconds", "device_seconds", "relative_error", "kendall_tau", "load_note", "DeviceTimes"]


def step_fn(module: torch.nn.Module, inputs: tuple, *, training: bool, optimizer: str = "sgd",
            sync: Callable[[], None] = lambda: None) -> Callable[[], None]:
    """One step of ``module``: a forward under ``inference_mode``, or forward, loss (the sum of the
    float outputs, as the profiler's training pass), backward, optimizer step, gradients dropped."""
    if not training:
        def forward() -> None:
            with torch.inference_mode():
                module(*inputs)
            sync()
        return forward
    params = [p for p in module.parameters() if p.requires_grad]
    opt = make_optimizer(optimizer, params)

    def train() -> None:
        out = module(*inputs)
        floats = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        torch.stack([t.float().sum() for t in floats]).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
    return train


def step_seconds(fns: Sequence[Callable[[], None]], *, repeat: int, warmup: int = 2,
                 budget_s: float = 60.0) -> list[float]:
    """Median seconds of each function, run interleaved (A B A B ...) after ``warmup`` rounds;
    fewer rounds (at least 3) when one round would overrun ``budget_s``."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    times: list[list[float]] = [[] for _ in fns]
    started = time.perf_counter()
    for r in range(repeat):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - t0)
        if r >= 2 and (time.perf_counter() - started) * (r + 2) / (r + 1) > budget_s:
            break
    return [statistics.median(t) for t in times]


@dataclasses.dataclass(frozen=True)
class DeviceTimes:
    """Measured busy seconds of each plan device in the emitted module, and of its copies."""

    per_device: Mapping[str, float]
    copies: float
    other: float      # nodes that are neither an op of the plan nor a copy (export's guard)


def device_seconds(emitted: torch.fx.GraphModule, inputs: tuple, plan: Any, binding: Mapping[str, str],
                   *, training: bool = False, optimizer: str = "sgd", repeats: int = 5) -> DeviceTimes:
    """Every node of ``emitted`` timed in place on the physical device it runs on, summed per plan
    device (what the binding really runs); inserted ``.to`` copies and weight fetches summed apart.

    In training a node's time is its forward with autograd plus its backward; the optimizer step
    is added to the device holding the parameters (all of them: one device per physical step)."""
    physical = sorted(set(binding.values()))
    if len(physical) != 1:
        raise ValueError("device_seconds times one physical device; bind every plan device to the same one")
    measured = measure_ops(emitted, inputs, physical[0],
                           options=MeasureOptions(repeats=repeats, min_repeats=min(3, repeats), training=training,
                                                  optimizer=optimizer),
                           cache=MeasurementCache())
    per_device = {d: 0.0 for d in plan.devices.names()}
    copies = other = 0.0
    for node, t in measured.ops.items():
        seconds = ((t.train_forward_s or 0.0) + (t.backward_s or 0.0)) if training else (t.forward_s or 0.0)
        if node in plan.placement:
            per_device[plan.placement[node]] += seconds
        elif node.startswith(("to", "get")):
            copies += seconds
        else:
            other += seconds
    if training:
        rate = measured.optimizer_s_per_byte.get(optimizer, 0.0)
        for op, device in plan.placement.items():
            per_device[plan.weights.get(op, device)] += rate * plan.op_bytes.get(op, (0, 0))[1]
    return DeviceTimes(per_device, copies, other)


def relative_error(predicted: float, measured: float) -> float:
    """``(predicted - measured) / measured`` (signed)."""
    return (predicted - measured) / measured


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall's tau between two rankings of the same items (pairs tied in either count for neither).

    Example:
        >>> kendall_tau([1, 2, 3], [10, 30, 20])
        0.3333333333333333
    """
    concordant = discordant = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            s = (a[i] - a[j]) * (b[i] - b[j])
            concordant += s > 0
            discordant += s < 0
    return (concordant - discordant) / max(concordant + discordant, 1)


def load_note(since: LoadMeter | None = None) -> str:
    """``other processes used 0.03 of 2 CPUs over 1 s (this process not counted): quiet``, or ``...: LOADED``.

    The CPU time of *other* processes (``cost_models.machine_load``): this process's own threads, which
    are busy measuring, are not counted, as a load average would count them. ``since``: over the span
    since that meter started (the whole run); without it, over the next second, this process idle.
    """
    meter = since if since is not None else LoadMeter()
    if since is None:
        time.sleep(1.0)
    reading = meter.reading()
    if reading.load is None:   # no /proc here: the load average, which counts this process too
        load, cores = os.getloadavg()[0], os.cpu_count() or 1
        state = "quiet" if load < 0.5 * cores else "LOADED — timings are not meaningful"
        return f"load average {load:.1f} on {cores} cores (this process included): {state}"
    state = ("LOADED — other processes share the cores: timings are not meaningful" if reading.busy
             else "quiet" if reading.quiet else "too short to tell")
    return f"{reading.describe()} (this process not counted): {state}"
