"""``hetpart demo``: the seed case end to end, on built-in defaults, with nothing to download.

In: an output folder. Out: ``plan.json``, ``partitioned.py`` and ``report.html`` in it, a table of
the plan against every baseline, and the result of checking the emitted module against the
original model on this machine (the plan's GPU bound to the CPU when there is none).

The seed case is the calibration model — ``emb-transformer`` at ``base`` size: a 1,048,576 × 1024
fp32 embedding (4 GiB) feeding 8 transformer layers — on the ``h200-host`` profile with the GPU
capped at the embedding plus half the layers (4,496,539,680 bytes), so embedding and layers do
not fit together: the case where accelerate's ``device_map="auto"`` streams five layers
synchronously from pageable memory every call (measured 52.7 ms on an H200).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import torch

import models
from cost_models.units import format_bytes, format_seconds
from backends.compare import CheckReport
from backends.torch.check import check_plan
from backends.binding import present
from partitioner.errors import HetpartError
from partitioner.planner import partition_outcome
from partitioner.files import refuse_overwrite
from partitioner.report import write_report

MODEL = "emb-transformer"
PROFILE = "h200-host"
GPU_CAP = 4_496_539_680  # the embedding plus half the layers' parameters (the calibration's first cap)


@dataclasses.dataclass(frozen=True)
class DemoResult:
    """What the demo made and measured."""

    plan_path: Path
    source_path: Path
    report_path: Path
    table: str
    check: CheckReport
    seconds: float


def run_demo(
    out_dir: str | Path = "hetpart-demo",
    *,
    size: str = "base",
    force: bool = False,
    progress: Callable[[str], None] = lambda message: None,
) -> DemoResult:
    """Capture, plan, emit, check and report the seed case; write the three files to ``out_dir``.

    Raises:
        HetpartError: an output file exists and ``force`` is False (nothing is written then).

    Example:
        >>> result = run_demo("hetpart-demo", force=True)   # doctest: +SKIP
        >>> result.check.passed
        True
    """
    start = time.perf_counter()
    out = Path(out_dir)
    paths = (out / "plan.json", out / "partitioned.py", out / "report.html")
    existing = [str(p) for p in paths if p.exists()]
    if existing and not force:
        raise HetpartError(f"{', '.join(existing)} exist(s): pass --force to overwrite")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise HetpartError(f"cannot make the demo folder {out}: {err.strerror or err}; choose a folder "
                           f"that can be made (-o DIR)") from None
    refuse_overwrite(paths, force=force)  # and none of them a folder, FIFO or link, before the work

    progress(f"building {MODEL}:{size} with random weights ...")
    model, inputs = models.get(MODEL, size)
    cap = GPU_CAP if size == "base" else _scaled_cap(model)
    progress(f"capturing and planning on {PROFILE} with cuda:0 capped at {format_bytes(cap)} ...")
    outcome = partition_outcome(
        model, inputs, PROFILE, memory={"cuda:0": cap}, no_split=models.entry(MODEL).no_split_classes,
        model_name=f"{MODEL}:{size}", progress=lambda p: progress(
            f"  solving {p.seconds:.0f} s: best {format_seconds(p.incumbent) if p.incumbent else '-'}"),
    )
    plan = outcome.plan
    binding = {d: d if present(d) else "cpu" for d in plan.devices.names()}
    progress(f"emitting the partitioned module and checking it against the original "
             f"(binding {', '.join(f'{k}->{v}' for k, v in binding.items() if k != v) or 'none needed'}) ...")
    with torch.inference_mode(False):
        report = check_plan(plan, model, inputs, binding, repeat=1)
    progress("writing the plan, the partitioned source and the report ...")
    plan.save(paths[0], force=True)
    plan.emit_source(paths[1], model, binding, force=True)
    write_report(plan, paths[2], force=True)
    return DemoResult(paths[0], paths[1], paths[2], comparison_table(outcome), report, time.perf_counter() - start)


def _scaled_cap(model: torch.nn.Module) -> int:
    """For smaller sizes, the same situation: the embedding plus half the layers."""
    emb = model.emb.weight.numel() * model.emb.weight.element_size()
    layers = sum(p.numel() * p.element_size() for p in model.layers.parameters())
    return emb + layers // 2


def comparison_table(outcome) -> str:  # noqa: ANN001 - a partition Outcome
    """The plan against every baseline: predicted time, memory per device, fits, speed-up."""
    plan = outcome.plan
    devices = plan.devices.names()
    total = plan.predicted["total_s"]
    header = ["placement", "predicted", *[f"mem {d}" for d in devices], "fits", "speed-up"]
    rows = [["hetpart ILP", format_seconds(total),
             *[format_bytes(plan.memory[d]["used"]) for d in devices], "yes", "1.00x"]]
    for name, (_, ev) in outcome.baselines.items():
        rows.append([name, format_seconds(ev.total_s), *[format_bytes(ev.memory[d]) for d in devices],
                     "yes" if ev.feasible else "no", f"{ev.total_s / total:.2f}x"])
    caps = ["capacity", "", *[format_bytes(plan.memory[d]["capacity"]) for d in devices], "", ""]
    table = [header, *rows, caps]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in table)
