"""Whole models on this machine's CPU: predicted against measured, with both cost models.

The end-to-end part of ``bench/cost_fidelity.py`` (run it through that script):

1. ``hetpart calibrate`` of this machine (or ``--calibrated FILE``): the calibrated analytic profile;
2. for every zoo model at each size that fits the memory limit (the rest are listed as skipped,
   with what they would need): the model's ops profiled in place (inference and training, SGD by
   default), then a single-CPU plan priced by the calibrated profile and by the profiled model,
   inference and training step; the emitted module of that plan measured (median of forwards, then
   of training steps, each after warm-up); the signed error of each prediction;
3. the targets: median |error| <= 10 % (profiled) and <= 20 % (calibrated), no row beyond 35 %,
   Kendall tau >= 0.9 between the predicted and the measured order of the rows;
4. one model planned on two logical devices bound to this CPU (``cpu`` and ``npu:0``, both the
   calibrated CPU, each capped so neither holds the whole model): for the plan of each cost
   model, each device's predicted busy time against the measured busy time of its ops in the
   emitted module (every node timed in place and summed per device; copies apart).

Everything runs with glibc keeping freed memory (:func:`cost_models.allocator.keep_freed_memory`),
the state the profiler measures in: without it, a training loop's gradients are faulted in again
in some runs and not in others (``dlrm:small``'s backward: 8 ms or 16-18 ms, run to run).
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
from collections.abc import Sequence
from pathlib import Path

import torch

import models
from cost_models.allocator import keep_freed_memory
from cost_models.calibrate import calibrate
from cost_models.machine_load import LoadMeter
from cost_models.measure import MeasureOptions
from cost_models.measure_cache import MeasurementCache
from cost_models.profiled import ProfiledCosts
from cost_models.profiler import profile_graph
from cost_models.profiles import DeviceKind, DeviceSet, Link, load_profile
from cost_models.units import format_bytes, format_seconds
from fidelity import device_seconds, kendall_tau, load_note, relative_error, step_fn, step_seconds
from partitioner import from_module, partition

TARGET_PROFILED, TARGET_CALIBRATED, TARGET_WORST, TARGET_TAU = 0.10, 0.20, 0.35, 0.9
MODES = ("inference", "training")


@dataclasses.dataclass
class Row:
    """One model, size and mode: measured and predicted seconds (or why it was skipped)."""

    model: str
    mode: str
    measured: float | None = None
    calibrated: float | None = None
    profiled: float | None = None
    skipped: str = ""


def _print(table: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for r in table:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip())


def _signed(x: float | None) -> str:
    return "-" if x is None else f"{x:+.0%}"


def local_profile(args: object) -> DeviceSet:
    """The calibrated profile of this machine (calibrated now unless ``--calibrated FILE``)."""
    if args.calibrated:
        print(f"calibrated profile: {args.calibrated} (given)")
        return load_profile(args.calibrated)
    cal = calibrate("detect", name="bench-local", quick=args.quick,
                    options=MeasureOptions(repeats=args.repeat, min_repeats=3))
    for line in cal.verdicts():
        print(f"calibration: {line}")
    if args.write_calibrated:
        Path(args.write_calibrated).write_text(cal.profile.to_toml(), encoding="utf-8")
        print(f"calibrated profile written to {args.write_calibrated} (reuse it: --calibrated {args.write_calibrated})")
    return cal.profile


def _need(graph: object, profile: DeviceSet, training: bool, optimizer: str) -> int:
    """Bytes the bench holds at its peak: the plan's memory on the CPU plus one more copy of the
    weights (the emitted module's own, or the profiler's training copy)."""
    plan = partition(graph, None, profile, solver="single:cpu", training=training, optimizer=optimizer)
    return plan.memory["cpu"]["used"] + graph.total_param_bytes()


def model_rows(name: str, size: str, profile: DeviceSet, args: object) -> list[Row]:
    """Both modes of one model: profile it, plan it with both cost models, measure the emitted module."""
    label = f"{name}:{size}"
    meta, meta_inputs = models.get(name, size, device="meta")
    meta_graph = from_module(meta, meta_inputs, name=label)
    modes = [m for m in MODES if not (args.inference_only and m == "training")]
    fits = {m: _need(meta_graph, profile, m == "training", args.optimizer) for m in modes}
    runnable = [m for m in modes if fits[m] <= args.memory_limit]
    rows = {m: Row(label, m, skipped=f"needs ~{format_bytes(fits[m])} > limit {format_bytes(args.memory_limit)}")
            for m in modes if m not in runnable}
    if not runnable:
        return list(rows.values())
    del meta, meta_graph
    module, inputs = models.get(name, size)
    graph = from_module(module, inputs, name=label)
    training = "training" in runnable
    measured = profile_graph(graph, inputs, profile, cache=MeasurementCache(), model_name=label,
                             options=MeasureOptions(repeats=args.repeat, min_repeats=3, training=training,
                                                    optimizer=args.optimizer, budget_s=args.budget))
    plans = {}
    for mode in runnable:
        kw = dict(solver="single:cpu", training=mode == "training", optimizer=args.optimizer)
        plans[mode] = (partition(graph, None, profile, **kw),
                       partition(graph, None, profile, costs=ProfiledCosts(measured.table), **kw))
    emitted = plans[runnable[0]][0].emit(module, example_inputs=inputs)
    del module, graph, measured
    gc.collect()
    # each mode timed in its own loop: a training step between forwards would leave them cold caches
    seconds = [step_seconds([step_fn(emitted, inputs, training=m == "training", optimizer=args.optimizer)],
                            repeat=args.repeat, budget_s=args.budget)[0] for m in runnable]
    for mode, s in zip(runnable, seconds):
        analytic, profiled = plans[mode]
        rows[mode] = Row(label, mode, s, analytic.predicted["total_s"], profiled.predicted["total_s"])
    return [rows[m] for m in modes]


def summarize(rows: Sequence[Row]) -> bool:
    """Print the table and the targets; True when every target is met."""
    table = [["model", "mode", "measured", "calibrated", "error", "profiled", "error", "note"]]
    for r in rows:
        if r.skipped:
            table.append([r.model, r.mode, "-", "-", "-", "-", "-", f"skipped: {r.skipped}"])
            continue
        table.append([r.model, r.mode, format_seconds(r.measured), format_seconds(r.calibrated),
                      _signed(relative_error(r.calibrated, r.measured)), format_seconds(r.profiled),
                      _signed(relative_error(r.profiled, r.measured)), ""])
    _print(table)
    done = [r for r in rows if not r.skipped]
    if not done:
        print("no rows measured")
        return False
    ok = True
    print()
    for what, attr, target in (("profiled", "profiled", TARGET_PROFILED), ("calibrated", "calibrated", TARGET_CALIBRATED)):
        errors = [abs(relative_error(getattr(r, attr), r.measured)) for r in done]
        worst = max(errors)
        taus = {mode: kendall_tau([getattr(r, attr) for r in done if r.mode == mode],
                                  [r.measured for r in done if r.mode == mode]) for mode in MODES}
        tau_all = kendall_tau([getattr(r, attr) for r in done], [r.measured for r in done])
        met = statistics.median(errors) <= target and worst <= TARGET_WORST and tau_all >= TARGET_TAU
        ok &= met
        print(f"{what:<10} median |error| {statistics.median(errors):5.1%} (target <= {target:.0%}), worst {worst:5.1%} "
              f"(target <= {TARGET_WORST:.0%}), Kendall tau {tau_all:.2f} (inference {taus['inference']:.2f}, "
              f"training {taus['training']:.2f}; target >= {TARGET_TAU}) over {len(done)} rows: "
              f"{'met' if met else 'MISSED'}")
    return ok


def two_device_profile(profile: DeviceSet) -> DeviceSet:
    """``cpu`` and ``npu:0``, both the calibrated CPU; a copy between them is ``.to`` of the same device."""
    cpu = profile.device("cpu")
    twin = dataclasses.replace(cpu, name="npu:0", kind=DeviceKind.NPU)
    link = Link(("cpu", "npu:0"), 1e15, 1e-6, None, "same cpu")
    return DeviceSet("two-logical-cpus", (cpu, twin), (link,), source=f"{profile.source} + npu:0 twin")


def two_device_check(model: str, profile: DeviceSet, args: object) -> None:
    """Each device's predicted busy time against what the emitted module runs on it."""
    name, _, size = model.partition(":")
    module, inputs = models.get(name, size or "small")
    graph = from_module(module, inputs, name=model)
    twins = two_device_profile(profile)
    binding = {"npu:0": "cpu"}
    whole = partition(graph, None, profile, solver="single:cpu").memory["cpu"]["used"]
    caps = {"cpu": int(0.6 * whole), "npu:0": int(0.6 * whole)}
    table = profile_graph(graph, inputs, twins, bind=binding, cache=MeasurementCache(), model_name=model,
                          options=MeasureOptions(repeats=args.repeat, min_repeats=3)).table
    print(f"\n{model} on two logical devices bound to this CPU (cpu, npu:0; each capped at {format_bytes(caps['cpu'])} "
          f"of the {format_bytes(whole)} it needs alone):")
    rows = [["plan costs", "device", "ops", "predicted busy", "measured busy", "error"]]
    for costs in ("calibrated", "profiled"):
        model_costs = ProfiledCosts(table) if costs == "profiled" else "analytic"
        plan = partition(graph, None, twins, memory=caps, costs=model_costs, time_limit=30)
        emitted = plan.emit(module, binding, example_inputs=inputs)
        measured = device_seconds(emitted, inputs, plan, {"cpu": "cpu", "npu:0": "cpu"}, repeats=args.repeat)
        wall = step_seconds([step_fn(emitted, inputs, training=False)], repeat=args.repeat)[0]
        for device, ops in plan.per_device_ops().items():
            predicted, got = plan.predicted["per_device_s"][device], measured.per_device[device]
            rows.append([costs, device, str(len(ops)), format_seconds(predicted), format_seconds(got),
                         _signed(relative_error(predicted, got)) if got else "-"])
        rows.append([costs, "copies", str(sum(1 for t in plan.transfers)), format_seconds(
            sum(t.seconds for t in plan.transfers)), format_seconds(measured.copies), ""])
        rows.append([costs, "whole step", "", format_seconds(plan.predicted["total_s"]), format_seconds(wall),
                     _signed(relative_error(plan.predicted["total_s"], wall))])
    _print(rows)


def run(args: object) -> int:
    """The end-to-end section: calibrate, the model rows, the targets, the two-device check."""
    print(f"end-to-end on this CPU: torch {torch.__version__}, {torch.get_num_threads()} threads; {load_note()}")
    whole_run = LoadMeter()
    # the state the profiler measures in, and the one a steady training loop should run in
    print(f"allocator: {keep_freed_memory().describe()}")
    profile = local_profile(args)
    rows: list[Row] = []
    for size in args.sizes:
        for name in args.models:
            rows += model_rows(name, size, profile, args)
            gc.collect()
    print()
    ok = summarize(rows)
    if args.two_device:
        two_device_check(args.two_device, profile, args)
    print(f"\nover the run: {load_note(whole_run)}")
    return 0 if ok else 1
