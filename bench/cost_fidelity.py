"""How well the analytic cost model predicts measured op times (H200 + 16-core host).

For every op row of ``cost_models/data/h200-host-calibration.json`` it prints the measured and
predicted time on the CPU and on the GPU with their ratio, whether the predicted CPU/GPU ratio
is on the right side of 1, and the median absolute relative error per device, over all rows and
over the rows the targets name (GPU rows above 50 µs, CPU rows above 1 ms; targets ≤ 25%).

    python bench/cost_fidelity.py [--profile h200-host]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

from cost_models.analytic import op_time
from cost_models.calibration import CalibrationRow, calibration_rows
from cost_models.units import format_seconds
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="h200-host")
    args = parser.parse_args()
    rows = compare(load_profile(args.profile))
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
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
