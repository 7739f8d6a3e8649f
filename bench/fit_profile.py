"""Fit a profile's per-op-class efficiencies to the calibration measurements.

For each device of the profile that the calibration measured (``cpu`` → ``cpu_s``, ``cuda:0`` →
``gpu_s``) and each op class it has rows for, a grid search picks the compute efficiency, the
memory efficiency and the fixed per-op latency that minimise the summed absolute log error of
the roofline prediction::

    t = max(flops / (peak[dtype] · eff), bytes / (mem_bandwidth · mem_eff)) + launch_overhead + fixed

with the device's peak FLOP/s, bandwidths and launch overhead taken from the profile as they are.
It prints the fitted tables in TOML form and, per class, the error of the fit beside the error of
the profile as it stands. A class fitted on two rows fits them exactly: prefer the profile's
documented values there (the built-in profile cites the rows each value was read from).

    python bench/fit_profile.py [--profile h200-host]
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict

import torch

from cost_models.analytic import op_time
from cost_models.calibration import CalibrationRow, calibration_rows
from cost_models.fit import grid_fit
from cost_models.profiles import Device, load_profile

MEASURED = {"cpu": "cpu_s", "cuda:0": "gpu_s"}


def fit_class(rows: list[CalibrationRow], device: Device, field: str) -> tuple[float, float, float, float]:
    """Best (eff, mem_eff, fixed, mean |log error|) for one class on one device (``cost_models.fit.grid_fit``)."""
    vec = lambda xs: torch.tensor(xs, dtype=torch.float64)  # noqa: E731
    nbytes = [float(r.captured.bytes_read + r.captured.bytes_written) for r in rows]
    return grid_fit(vec([float(r.captured.flops) for r in rows]), vec(nbytes),
                    vec([device.stream_bandwidth(b) for b in nbytes]), vec([device.peak(r.dtype) for r in rows]),
                    vec([device.launch_overhead] * len(rows)), vec([getattr(r, field) for r in rows]))


def profile_error(rows: list[CalibrationRow], device: Device, field: str) -> float:
    """Mean |log error| of the profile as it is, for comparison with the fit."""
    errors = [abs(math.log(op_time(r.captured, device).seconds / getattr(r, field))) for r in rows]
    return sum(errors) / len(errors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="h200-host")
    args = parser.parse_args()
    profile = load_profile(args.profile)
    rows = calibration_rows()
    for device_name, field in MEASURED.items():
        device = profile.device(device_name)
        by_class: dict[str, list[CalibrationRow]] = defaultdict(list)
        for row in rows:
            if getattr(row, field) is not None:
                by_class[row.captured.op_class.value].append(row)
        fits = {cls: fit_class(class_rows, device, field) for cls, class_rows in sorted(by_class.items())}
        print(f"# {device_name}: fitted on {sum(map(len, by_class.values()))} rows "
              f"(peak and bandwidth from the profile; mean |log error| per class)")
        for cls, (_, _, _, err) in fits.items():
            now = profile_error(by_class[cls], device, field)
            print(f"#   {cls:<12} {len(by_class[cls]):>2} rows, mean |log error| fitted {err:.3f} "
                  f"(x{math.exp(err):.2f}), profile now {now:.3f} (x{math.exp(now):.2f})")
        print(f'[devices."{device_name}".efficiency]')
        for cls, (eff, _, _, _) in fits.items():
            print(f"{cls} = {eff:.3g}")
        print(f'[devices."{device_name}".mem_efficiency]')
        for cls, (_, mem, _, _) in fits.items():
            print(f"{cls} = {mem:.3g}")
        print(f'[devices."{device_name}".fixed_latency]')
        for cls, (_, _, fixed, _) in fits.items():
            print(f'{cls} = "{fixed * 1e6:.3g}us"')
        print()


if __name__ == "__main__":
    main()
