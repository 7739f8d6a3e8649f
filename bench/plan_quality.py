"""Plan quality: the ILP against every baseline on the zoo, with bounds, gap and solve time.

For each zoo model (``small``) × profile (``h200-host``, ``cpu-gpu-npu``, ``2xh200-host``) × memory
cap (none; tight = the accelerators capped at 40% of the model's parameter bytes) × objective, it
prints the ILP's predicted time, each baseline's (``*`` marks a baseline that does not fit), the
physical lower bound, the ILP's gap and its solve seconds, then the seed case (emb-transformer
``base`` under the measured caps). The last lines say whether the ILP was ≤ every feasible baseline
everywhere and its speed-up over ``greedy`` on the capped seed case (target ≥ 10×).

ONNX rows (``--onnx-models``): zoo models exported with ``torch.onnx.export`` (and the light
ResNet-50 / DenseNet-121 the onnx wheel ships) imported with ``from_onnx``, on every built-in profile
(``--onnx-profiles``) under the same two caps, latency objective, with the baselines ONNX users get today: ``ort-fallback``
(onnxruntime's provider order) and ``openvino-pipeline`` (OpenVINO HETERO's split by weight bytes).

    python bench/plan_quality.py [--models gpt,bert] [--objectives latency] [--time-limit 20]
                                 [--onnx-models gpt,resnet50 | --onnx-models ''] [--onnx-profiles cpu-gpu-npu]
                                 [--skip-seed]
"""

from __future__ import annotations

import argparse
import time

import models
from cost_models.calibration import measured_anchors
from cost_models.profiles import builtin_profiles
from cost_models.units import format_seconds
from partitioner import from_module, load_profile, partition_outcome
from partitioner.errors import InfeasiblePlacement

PROFILES = ("h200-host", "cpu-gpu-npu", "2xh200-host")
OBJECTIVES = ("latency", "throughput", "makespan")
BASELINES = ("greedy", "sequential-fill", "heft", "single:cpu", "single:cuda:0")
ONNX_BASELINES = ("ort-fallback", "openvino-pipeline", *BASELINES)
LIGHT = ("resnet50", "densenet121")


def tight_caps(profile_name: str, param_bytes: int) -> dict[str, int]:
    """Cap every accelerator at 40% of the model's parameters: no single device holds it all."""
    profile = load_profile(profile_name)
    return {d.name: max(1, int(0.4 * param_bytes)) for d in profile.devices if d.kind.value != "cpu"}


def row(label: str, out, seconds: float, baselines: tuple[str, ...] = BASELINES) -> tuple[list[str], bool]:  # noqa: ANN001
    plan = out.plan
    total = plan.predicted["total_s"]
    cells = [label, format_seconds(total)]
    never_worse = True
    for name in baselines:
        b = plan.baselines.get(name)
        if b is None or b.total_s is None:
            cells.append("-")
            continue
        cells.append(format_seconds(b.total_s) + ("" if b.feasible else "*"))
        if b.feasible and total > b.total_s * (1 + 1e-9):
            never_worse = False
    gap = plan.solver.gap
    cells += [format_seconds(plan.predicted["lower_bound_s"]), "-" if gap is None else f"{gap:.2%}",
              f"{seconds:.2f}", plan.solver.status]
    return cells, never_worse


def print_table(rows: list[list[str]], baselines: tuple[str, ...] = BASELINES) -> None:
    header = ["model / profile / cap / objective", "ILP", *baselines, "lower bd", "gap", "solve s", "status"]
    table = [header] + rows
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for r in table:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(models.names()))
    parser.add_argument("--objectives", default=",".join(OBJECTIVES))
    parser.add_argument("--profiles", default=",".join(PROFILES))
    parser.add_argument("--size", default="small")
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--onnx-models", default=",".join([*models.names(), *LIGHT]),
                        help=f"ONNX rows: zoo names and/or {', '.join(LIGHT)} ('' for none)")
    parser.add_argument("--onnx-profiles", default=",".join(builtin_profiles()), help="profiles of the ONNX rows")
    parser.add_argument("--skip-seed", action="store_true", help="leave out the seed case rows")
    args = parser.parse_args()
    rows: list[list[str]] = []
    all_ok = True
    for name in [n for n in args.models.split(",") if n]:
        module, inputs = models.get(name, args.size)
        graph = from_module(module, inputs, name=f"{name}:{args.size}")
        no_split = models.entry(name).no_split_classes
        for profile in args.profiles.split(","):
            for cap_name, caps in (("none", None), ("tight", tight_caps(profile, graph.total_param_bytes()))):
                for objective in args.objectives.split(","):
                    label = f"{name} / {profile} / {cap_name} / {objective}"
                    start = time.perf_counter()
                    try:
                        out = partition_outcome(graph, devices=profile, memory=caps, objective=objective,
                                                time_limit=args.time_limit, no_split=no_split)
                    except InfeasiblePlacement as exc:
                        rows.append([label, "infeasible", *["-"] * (len(BASELINES) + 4)])
                        print(f"# {label}: {exc}")
                        continue
                    cells, ok = row(label, out, time.perf_counter() - start)
                    rows.append(cells)
                    all_ok &= ok
    if rows:
        print_table(rows)
        print("(* = the baseline does not fit the caps; its time is shown for comparison)")
    onnx_names = [n for n in args.onnx_models.split(",") if n]
    if onnx_names:
        onnx_rows, ok = onnx_table(onnx_names, args.size, args.onnx_profiles.split(","), args.time_limit)
        all_ok &= ok
        print("\nONNX models (torch.onnx.export of the zoo; the onnx wheel's light models), latency:")
        print_table(onnx_rows, ONNX_BASELINES)
        print("(* = the baseline does not fit the caps; its time is shown for comparison)")
    if args.skip_seed:
        print(f"\nILP <= every feasible baseline everywhere: {'yes' if all_ok else 'NO'}")
        return 0 if all_ok else 1
    print()
    anchors = measured_anchors()
    module, inputs = models.get("emb-transformer", "base", device="meta")
    graph = from_module(module, inputs, name="emb-transformer:base")
    seed_rows = []
    speedups = []
    for cap_name, cap in (("emb+half layers", anchors["cap_half_layers"]), ("2 GiB", anchors["cap_below_embedding"])):
        start = time.perf_counter()
        out = partition_outcome(graph, devices="h200-host", memory={"cuda:0": int(cap)},
                                no_split=models.entry("emb-transformer").no_split_classes)
        cells, ok = row(f"seed case / h200-host / {cap_name} / latency", out, time.perf_counter() - start)
        seed_rows.append(cells)
        all_ok &= ok
        speedups.append(out.plan.baselines["greedy"].total_s / out.plan.predicted["total_s"])
    print_table(seed_rows)
    print()
    print(f"ILP <= every feasible baseline everywhere: {'yes' if all_ok else 'NO'}")
    print(f"speed-up over greedy on the capped seed case: {speedups[0]:.1f}x (emb+half layers), "
          f"{speedups[1]:.1f}x (2 GiB); target >= 10x: {'met' if max(speedups) >= 10 else 'MISSED'}")
    return 0 if all_ok else 1


def onnx_table(names: list[str], size: str, profiles: list[str], time_limit: float) -> tuple[list[list[str]], bool]:
    """ILP against every baseline, ONNX ones included, for each ONNX model x profile x cap (latency)."""
    import tempfile
    from pathlib import Path

    from models.onnx_models import export_zoo, light_model
    from partitioner import from_onnx

    rows, all_ok = [], True
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            path = light_model(name) if name in LIGHT else export_zoo(name, size, Path(tmp) / f"{name}.onnx")
            graph = from_onnx(path, name=name if name in LIGHT else f"{name}:{size}")
            for profile in profiles:
                for cap_name, caps in (("none", None), ("tight", tight_caps(profile, graph.total_param_bytes()))):
                    label = f"{graph.name} (onnx) / {profile} / {cap_name}"
                    start = time.perf_counter()
                    try:
                        out = partition_outcome(graph, devices=profile, memory=caps, time_limit=time_limit)
                    except InfeasiblePlacement as exc:
                        rows.append([label, "infeasible", *["-"] * (len(ONNX_BASELINES) + 4)])
                        print(f"# {label}: {exc}")
                        continue
                    cells, ok = row(label, out, time.perf_counter() - start, ONNX_BASELINES)
                    rows.append(cells)
                    all_ok &= ok
    return rows, all_ok


if __name__ == "__main__":
    raise SystemExit(main())
