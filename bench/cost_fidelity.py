"""How well hetpart's cost models predict measured times: H200 op rows, and whole models here.

Part 1 (the H200 calibration file): for every op row of ``cost_models/data/h200-host-calibration.json``
the measured and predicted time on the CPU and on the GPU with their ratio, whether the predicted
CPU/GPU ratio is on the right side of 1, and the median absolute relative error per device, over all
rows and over the rows the targets name (GPU rows above 50 µs, CPU rows above 1 ms; targets ≤ 25%).

Part 2 (this machine, see ``bench/e2e_fidelity.py``): this CPU calibrated, then every zoo model at
``small`` and ``base`` that fits ``--memory-limit``, inference and training step, predicted with the
calibrated profile and with the profiled model against the measured time of the emitted module;
targets: median |error| ≤ 10 % profiled and ≤ 20 % calibrated, no row beyond 35 %, Kendall tau ≥ 0.9;
then a model planned on two logical devices bound to this CPU, each device's predicted against
measured busy time. Timings mean something only when nothing else runs: the load average is printed
at the start and the end.

    python bench/cost_fidelity.py                      # both parts, the full table (minutes)
    python bench/cost_fidelity.py --quick              # part 2 on small models, quick calibration (< 2 min)
    python bench/cost_fidelity.py --ops-only           # part 1 only (seconds, no measuring)
    python bench/cost_fidelity.py --models gpt,bert --sizes base --memory-limit 16GB
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

import torch

import models
from cost_models.analytic import op_time
from cost_models.calibration import CalibrationRow, calibration_rows
from cost_models.units import format_seconds, parse_bytes
from partitioner import DeviceSet, load_profile

GPU_FLOOR_S = 50e-6   # the target covers GPU rows measured above this
CPU_FLOOR_S = 1e-3    # and CPU rows measured above this
TARGET = 0.25         # median absolute relative error


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One calibration row: measured and predicted seconds on each device."""

    row: CalibrationRow
    cpu_measured: float | None
    cpu_predicted: float
    gpu_measured: float | None
    gpu_predicted: float

    @property
    def order_ok(self) -> bool | None:
        """Whether the predicted CPU/GPU ratio is on the same side of 1 as the measured one."""
        if self.cpu_measured is None or self.gpu_measured is None:
            return None
        return (self.cpu_measured > self.gpu_measured) == (self.cpu_predicted > self.gpu_predicted)


def compare(profile: DeviceSet) -> list[Comparison]:
    """Predict every calibration row on the profile's ``cpu`` and ``cuda:0``."""
    cpu, gpu = profile.device("cpu"), profile.device("cuda:0")
    return [
        Comparison(r, r.cpu_s, op_time(r.captured, cpu).seconds, r.gpu_s, op_time(r.captured, gpu).seconds)
        for r in calibration_rows()
    ]


def relative_error(measured: float, predicted: float) -> float:
    return abs(predicted - measured) / measured


def median_errors(rows: list[Comparison]) -> dict[str, float]:
    """Median absolute relative error: all rows and target rows, per device."""
    cpu_all = [relative_error(c.cpu_measured, c.cpu_predicted) for c in rows if c.cpu_measured]
    gpu_all = [relative_error(c.gpu_measured, c.gpu_predicted) for c in rows if c.gpu_measured]
    cpu_target = [
        relative_error(c.cpu_measured, c.cpu_predicted) for c in rows if c.cpu_measured and c.cpu_measured > CPU_FLOOR_S
    ]
    gpu_target = [
        relative_error(c.gpu_measured, c.gpu_predicted) for c in rows if c.gpu_measured and c.gpu_measured > GPU_FLOOR_S
    ]
    return {
        "cpu_all": statistics.median(cpu_all),
        "gpu_all": statistics.median(gpu_all),
        "cpu_target": statistics.median(cpu_target),
        "gpu_target": statistics.median(gpu_target),
        "cpu_target_rows": len(cpu_target),
        "gpu_target_rows": len(gpu_target),
    }


def _cell(measured: float | None, predicted: float) -> list[str]:
    if measured is None:
        return ["-", format_seconds(predicted), "-"]
    return [format_seconds(measured), format_seconds(predicted), f"{predicted / measured:.2f}"]


def op_rows(profile_name: str) -> bool:
    """Part 1: print the H200 op rows; True when their targets are met."""
    rows = compare(load_profile(profile_name))
    header = ["op", "shape", "dtype", "class", "cpu meas", "cpu pred", "ratio", "gpu meas", "gpu pred", "ratio",
              "cpu/gpu meas", "cpu/gpu pred", "order"]
    table = [header]
    for c in rows:
        r = c.row
        ratio_m = f"{c.cpu_measured / c.gpu_measured:.1f}" if c.cpu_measured and c.gpu_measured else "-"
        ratio_p = f"{c.cpu_predicted / c.gpu_predicted:.1f}"
        order = {True: "ok", False: "WRONG", None: "-"}[c.order_ok]
        table.append([r.op, r.shape, r.dtype, r.captured.op_class.value]
                     + _cell(c.cpu_measured, c.cpu_predicted) + _cell(c.gpu_measured, c.gpu_predicted)
                     + [ratio_m, ratio_p, order])
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(w) if i < 4 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))
    e = median_errors(rows)
    wrong = sum(1 for c in rows if c.order_ok is False)
    print()
    print(f"median |relative error|, all rows:   cpu {e['cpu_all']:.1%}   gpu {e['gpu_all']:.1%}")
    print(f"median |relative error|, target rows: cpu {e['cpu_target']:.1%} ({e['cpu_target_rows']} rows > 1 ms)   "
          f"gpu {e['gpu_target']:.1%} ({e['gpu_target_rows']} rows > 50 µs)   target <= {TARGET:.0%}")
    print(f"CPU/GPU order wrong on {wrong} of {sum(1 for c in rows if c.order_ok is not None)} rows")
    ok = e["cpu_target"] <= TARGET and e["gpu_target"] <= TARGET and wrong == 0
    print("targets met" if ok else "TARGETS MISSED")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="h200-host", help="part 1: the profile predicting the H200 rows")
    part = parser.add_mutually_exclusive_group()
    part.add_argument("--ops-only", action="store_true", help="part 1 only")
    part.add_argument("--e2e-only", action="store_true", help="part 2 only")
    parser.add_argument("--quick", action="store_true",
                        help="part 2 on small models, quick calibration, 5 repeats (a smoke run: < 2 min)")
    parser.add_argument("--models", help=f"comma-separated zoo models (default: all: {','.join(models.names())})")
    parser.add_argument("--sizes", help="comma-separated sizes (default small,base; --quick: small)")
    parser.add_argument("--repeat", type=int, help="timed runs per measurement (default 7; --quick 5)")
    parser.add_argument("--budget", type=float, default=30.0, help="seconds per model and phase before fewer runs")
    parser.add_argument("--memory-limit", default="8GB", help="skip a model and mode needing more than this")
    parser.add_argument("--optimizer", default="sgd", choices=["sgd", "sgd-momentum", "adam"],
                        help="the training step's optimizer (sgd: the calibration file's; least memory)")
    parser.add_argument("--inference-only", action="store_true", help="no training rows")
    parser.add_argument("--calibrated", metavar="FILE.toml", help="use this calibrated profile, do not calibrate")
    parser.add_argument("--write-calibrated", metavar="FILE.toml", help="write the profile calibrated here")
    parser.add_argument("--two-device", default="gpt:small", metavar="MODEL",
                        help="the model planned on two logical devices bound to this CPU ('' to skip)")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: as the environment sets)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.models = args.models.split(",") if args.models else models.names()
    args.sizes = args.sizes.split(",") if args.sizes else (["small"] if args.quick else ["small", "base"])
    args.repeat = args.repeat or (5 if args.quick else 7)
    args.memory_limit = parse_bytes(args.memory_limit, where="--memory-limit")
    ok = True
    if not args.e2e_only:
        ok &= op_rows(args.profile)
        print()
    if not args.ops_only:
        import e2e_fidelity   # bench/ is on the path when this runs as a script

        ok &= e2e_fidelity.run(args) == 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
