"""Case (g) of ``bench/gpu_check.py``: the seed case's predictions against runs, with both cost models.

On the machine it runs on: ``hetpart calibrate`` of the host (CPU, each GPU, their link); the seed
case (``emb-transformer`` under the "embedding + half the layers" cap on ``cuda:0``) profiled in
place on the CPU and the GPU; then planned twice — priced by the calibrated profile and by the
profiled model — and, for each, the ILP plan and every baseline's placement emitted and its forward
measured (wall time with synchronisation, median after warm-up). A placement shared by several
rows is measured once. Printed: predicted against measured for every row, the median and worst
|error| per cost model, and the calibration's verdict lines.

Without CUDA it dry-runs on the CPU: ``cuda:0`` of ``h200-host`` is bound to the CPU for the
calibration, the profile and the runs (the numbers then say nothing about a GPU; the first line
says so).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

import torch

import models
from cost_models.calibrate import calibrate
from cost_models.measure import MeasureOptions
from cost_models.measure_cache import MeasurementCache
from cost_models.profiled import ProfiledCosts
from cost_models.profiler import profile_graph
from cost_models.profiles import load_profile
from cost_models.units import format_seconds
from partitioner import Plan, from_module, partition_outcome

MODEL = "emb-transformer"


@dataclasses.dataclass(frozen=True)
class FidelityRow:
    """One placement priced by one cost model, and its measured forward."""

    costs: str
    case: str
    predicted: float
    measured: float | None
    fits: bool

    @property
    def error(self) -> float | None:
        return None if self.measured is None else (self.predicted - self.measured) / self.measured


def run_fidelity(size: str, cap_of: Callable[[torch.nn.Module], int], binding: dict[str, str] | None,
                 timed: Callable[[Callable[[], object]], float], *, quick: bool = False) -> list[str]:
    """Calibrate, profile, plan with both cost models, measure every placement; the lines to print."""
    cuda = torch.cuda.is_available()
    lines = [f"(g) cost fidelity: {MODEL}:{size}, " + ("CUDA present" if cuda else
             "NO GPU: cuda:0 bound to the CPU (a dry run: these numbers say nothing about a GPU)")]
    started = time.perf_counter()
    devices = "detect" if cuda else load_profile("h200-host")
    cal = calibrate(devices, name="calibrated-here", bind=binding, quick=quick or not cuda,
                    options=MeasureOptions(repeats=5, min_repeats=3))
    lines += [f"  calibration: {v}" for v in cal.verdicts()]
    profile = cal.profile
    model, inputs = models.get(MODEL, size)
    graph = from_module(model, inputs, name=f"{MODEL}:{size}")
    cap = cap_of(model)
    table = profile_graph(graph, inputs, profile, bind=binding, cache=MeasurementCache(), model_name=graph.name,
                          options=MeasureOptions(repeats=5, min_repeats=3, budget_s=20.0)).table
    lines.append(f"  calibrated and profiled in {time.perf_counter() - started:.0f} s; cap on cuda:0 {cap:,} B")
    meta, _ = models.get(MODEL, size, device="meta")
    no_split = models.entry(MODEL).no_split_classes
    rows: list[FidelityRow] = []
    measured: dict[tuple, float] = {}
    for costs_name, costs in (("calibrated", "analytic"), ("profiled", ProfiledCosts(table))):
        outcome = partition_outcome(meta, inputs, profile, memory={"cuda:0": cap}, no_split=no_split,
                                    time_limit=60, costs=costs)
        cases = {"ILP": (outcome.solution, outcome.evaluation), **outcome.baselines}
        for case, (solution, evaluation) in cases.items():
            plan = Plan.from_solution(outcome.problem, solution, evaluation)
            key = (tuple(sorted(plan.placement.items())), tuple(sorted(plan.weights.items())), plan.stream_mode)
            if key not in measured:
                emitted = plan.emit(model, binding, example_inputs=inputs)
                device_inputs = tuple(t.to(next(emitted.parameters()).device) for t in inputs)
                with torch.inference_mode():
                    measured[key] = timed(lambda e=emitted, x=device_inputs: e(*x))
                del emitted
                if cuda:
                    torch.cuda.empty_cache()
            rows.append(FidelityRow(costs_name, case, evaluation.total_s, measured[key], evaluation.feasible))
    lines.append(f"  {'costs':<11} {'placement':<16} {'predicted':>10} {'measured':>10} {'error':>7}  fits the cap")
    for r in rows:
        lines.append(f"  {r.costs:<11} {r.case:<16} {format_seconds(r.predicted):>10} "
                     f"{format_seconds(r.measured) if r.measured else '-':>10} "
                     f"{'-' if r.error is None else f'{r.error:+.0%}':>7}  {'yes' if r.fits else 'no'}")
    for costs_name in ("calibrated", "profiled"):
        errors = [abs(r.error) for r in rows if r.costs == costs_name and r.error is not None]
        if errors:
            lines.append(f"  {costs_name}: median |error| {statistics.median(errors):.0%}, worst {max(errors):.0%} "
                         f"over {len(errors)} placements")
    return lines
