"""Case (i) of ``bench/gpu_check.py``: a plan made from the GPU's live state, with most of it taken.

A blocker tensor takes all but ``LEFT_FREE`` (3 GiB) of the GPU's free memory. Then
``hetpart plan MODEL --devices detect --detect-margin 256MiB --fallbacks 0.5,0.25`` runs in a
subprocess (it sees the blocker through NVML or ``torch.cuda.mem_get_info``, like any other
process), and the plan it wrote is checked and run here: the probe's source and reading, the cap
it set on ``cuda:0``, the plan's predicted memory there against the cap, the emitted module's peak
memory (``max_memory_allocated`` above the blocker) against the memory that was free, its forward
time and its largest difference from the model on the CPU. Then a second blocker takes most of the
rest and the live module (``backends.torch.emit_live``, default probe) is called again: which plan
it runs, and its difference. Without CUDA it prints the probe's fallbacks and ``n/a (no GPU)``.

    python bench/gpu_live.py [--size small|base]      (or through bench/gpu_check.py)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

import models
from cost_models.profiles import DeviceSet
from cost_models.units import format_bytes, format_seconds

ROOT = Path(__file__).resolve().parent.parent
MODEL = "emb-transformer"
LEFT_FREE = 3 * 2**30
MARGIN = "256MiB"
FALLBACKS = "0.5,0.25"
PLAN_TIMEOUT_S = 240


def run_live(size: str, timed: Callable[[Callable[[], Any]], float] | None = None) -> list[str]:
    """The lines of case (i) (see the module docstring)."""
    head = f"(i) live state: {MODEL}:{size}, blocker leaves {format_bytes(LEFT_FREE)}, --devices detect " \
           f"--detect-margin {MARGIN} --fallbacks {FALLBACKS}"
    if not torch.cuda.is_available():
        notes = DeviceSet.detect("h200-host").probe.notes
        return [head, "  n/a (no GPU); the probe here: " + "; ".join(notes)]
    from backends.torch import emit_live
    from partitioner import Plan

    lines = [head]
    torch.cuda.empty_cache()
    free0, total = torch.cuda.mem_get_info()
    block = torch.empty(max(0, free0 - LEFT_FREE), dtype=torch.uint8, device="cuda")
    try:
        free = torch.cuda.mem_get_info()[0]
        lines.append(f"  blocker {format_bytes(block.numel())} of {format_bytes(total)}: "
                     f"{format_bytes(free)} free")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "plan.json"
            command = [sys.executable, "-m", "partitioner.cli", "plan", f"{MODEL}:{size}", "--devices", "detect",
                       "--detect-margin", MARGIN, "--fallbacks", FALLBACKS, "-o", str(path), "--time-limit", "60"]
            started = time.perf_counter()
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=PLAN_TIMEOUT_S)
            if done.returncode != 0:
                return [*lines, f"  hetpart plan --devices detect FAILED ({done.returncode}): "
                                f"{(done.stderr.strip().splitlines() or [''])[-1][:200]}"]
            lines.append(f"  planned in {time.perf_counter() - started:.1f} s (subprocess)")
            plan = Plan.load(path)
        reading = plan.probe["devices"]["cuda:0"]
        need = [p.memory["cuda:0"]["used"] for p in (plan, *(f.plan for f in plan.fallbacks))]
        lines.append(f"  probe ({reading['source']}): free {format_bytes(reading['free'])}, cap "
                     f"{format_bytes(reading['cap'])}; notes: {'; '.join(plan.probe['notes']) or 'none'}")
        lines.append("  plan needs on cuda:0: " + ", ".join(f"{label} {format_bytes(n)}" for label, n in
                                                               zip(("primary", *FALLBACKS.split(",")), need)) +
                     f"; primary within the cap: {'yes' if need[0] <= reading['cap'] else 'NO'}")
        model, inputs = models.get(MODEL, size)
        with torch.no_grad():
            expected = model(*inputs)
        live = emit_live(plan, model)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.no_grad():
            out = live(*inputs)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        seconds = timed(lambda: live(*inputs)) if timed is not None else float("nan")
        lines.append(f"  runs: {live.labels[live.active]} plan, peak {format_bytes(peak)} of {format_bytes(free)} "
                     f"free ({'fits' if peak <= free else 'OVER'}), forward {format_seconds(seconds)}, "
                     f"max |diff| vs CPU {(out.float().cpu() - expected).abs().max().item():.2e}")
        resident = live.probe.resident(torch.device("cuda:0"))
        torch.cuda.empty_cache()
        more = torch.empty(max(0, torch.cuda.mem_get_info()[0] - max(need[0] - resident - 2**28, 2**26)),
                           dtype=torch.uint8, device="cuda")
        try:
            with torch.no_grad():
                out = live(*inputs)
            torch.cuda.synchronize()
            lines.append(f"  second blocker {format_bytes(more.numel())}: runs the {live.labels[live.active]} plan "
                         f"({live.switches} switch(es)), max |diff| vs CPU "
                         f"{(out.float().cpu() - expected).abs().max().item():.2e}")
        finally:
            del more
    except Exception as exc:  # noqa: BLE001 - a benchmark reports every case it can
        lines.append(f"  FAILED: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}")
    finally:
        del block
        torch.cuda.empty_cache()
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=models.SIZES, default="base" if torch.cuda.is_available() else "small")
    args = parser.parse_args(argv)
    for line in run_live(args.size):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
