"""``hetpart plan``: place a model's ops on the devices of a profile and write the plan."""

from __future__ import annotations

import argparse
import sys

from partitioner.cli.args import (
    add_caps_and_pins, add_input_shape, fallback_fractions, input_shapes, output_path, pairs, positive_int, print_progress,
)
from partitioner.errors import HetpartError


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the subcommand to ``hetpart``'s parser."""
    pl = sub.add_parser("plan", parents=[common], help="place a model's ops on the devices of a profile")
    pl.add_argument("model", help="zoo name (gpt, gpt:small), path/to/file.py:factory or model.onnx")
    pl.add_argument("--devices", default="h200-host", metavar="PROFILE",
                    help="built-in profile or TOML file; detect (this machine) or detect:PROFILE caps each "
                         "accelerator at the memory free now minus --detect-margin")
    pl.add_argument("--detect-margin", default="5%", metavar="M",
                    help="with --devices detect: memory left free on each accelerator, a share (5%%, 0.05) "
                         "or a size (2GiB)")
    pl.add_argument("--fallbacks", type=fallback_fractions, default=(), metavar="F,F",
                    help="also solve plans for less accelerator memory, e.g. 0.75,0.5 of this plan's: the emitted "
                         "module (backends.torch.emit_live) runs the one that fits the free memory at each call")
    pl.add_argument("--objective", default="latency", choices=["latency", "throughput", "makespan"])
    add_caps_and_pins(pl)
    pl.add_argument("--training", action="store_true", help="plan a training step")
    pl.add_argument("--optimizer", default="adam", choices=["sgd", "sgd-momentum", "adam"])
    pl.add_argument("--solver", default="auto",
                    help="auto, highs, cbc, or a baseline: greedy, sequential-fill, heft, single:DEVICE; "
                         "pipelines: pipeline-dp, pippy-equal-size, deepspeed-parameters, flop-balanced")
    pl.add_argument("--time-limit", type=float, default=60.0, metavar="S", help="ILP time limit in seconds")
    pl.add_argument("--gap", type=float, default=0.01, help="relative optimality gap to stop at")
    pl.add_argument("--no-streaming", action="store_true", help="keep every weight where its op computes")
    pl.add_argument("--coarsen", default="auto", choices=["auto", "on", "off"])
    pl.add_argument("--capture", default="export", choices=["export", "symbolic_trace"])
    pl.add_argument("--align-modules", action="append", default=[], metavar="CLASS",
                    help="keep every instance of a module class on one device, e.g. Block (repeatable)")
    pl.add_argument("--dynamic", metavar="DIMS", default=None,
                    help="input dimensions the emitted module may run at other sizes: batch (dim 0), seq "
                         "(dim 1), NAME=DIM; comma-separated, e.g. batch,seq (costed at the example size)")
    pl.add_argument("--costs", default="analytic", metavar="analytic|profiled|COSTS.json",
                    help="op times: the profile's roofline, measured now on this machine, or a costs file "
                         "from `hetpart profile`")
    pl.add_argument("--micro-batches", type=positive_int, metavar="N",
                    help="pipeline stages: split each step's batch into N micro-batches (default: the largest "
                         "divisor of the batch up to 2x the devices); throughput on a cluster plans stages anyway")
    pl.add_argument("--schedule", choices=["gpipe", "1f1b"], help="pipeline schedule (default 1f1b)")
    pl.add_argument("--stages", type=positive_int, metavar="N", help="exactly N pipeline stages (default: the best)")
    pl.add_argument("--precision", metavar="auto|DEVICE=DTYPE,...",
                    help="compute in 16 bits: auto (the solver chooses per op among the dtypes each device runs "
                         "well) or per device, e.g. cuda:0=bf16,cpu=fp32 (softmax, norms, losses stay fp32)")
    pl.add_argument("-o", "--output", metavar="FILE", help="write the plan (see --format)")
    pl.add_argument("--format", default="json", choices=["json", "device-map", "csv"],
                    help="json: the plan file; device-map: accelerate's device_map; csv: op, module, device, seconds")
    pl.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    add_input_shape(pl)
    pl.set_defaults(func=_cmd_plan)


def _cmd_plan(args: argparse.Namespace) -> int:
    from cost_models.live_memory import profile_for
    from partitioner.model_source import load_model
    from partitioner.planner import partition

    from partitioner.planner import check_limits

    check_limits(args.time_limit, args.gap, ("--time-limit", "--gap"))
    if args.output is not None:
        output_path(args.output, "-o", force=args.force)
    if args.format != "json" and args.output is None:
        raise HetpartError(f"--format {args.format} writes a file: give it with -o FILE")
    profile = profile_for(args.devices, margin=args.detect_margin)  # fails before the model is captured
    if profile.probe is not None:
        print("\n".join(profile.notes[-1 - len(profile.probe.notes):]), file=sys.stderr)
    if args.precision is not None:  # a bad --precision fails before the capture too
        from cost_models.precision import resolve_precision

        resolve_precision(args.precision, profile)
    # zoo models: shapes only, no memory for weights (measuring ops needs real ones);
    # ONNX models: the path, imported by partition
    loaded = load_model(args.model, device=None if args.costs == "profiled" else "meta",
                        input_shapes=input_shapes(args.input_shape))
    memory = pairs(args.memory, "--memory", "cuda:0=2GB")
    pins = pairs(args.pin, "--pin", "'emb*=cpu'")
    print(f"capturing {loaded.name} ({'onnx' if loaded.is_onnx else args.capture}) ...", file=sys.stderr)
    plan = partition(
        loaded.module, loaded.example_inputs, profile,
        objective=args.objective, memory=memory, training=args.training, optimizer=args.optimizer,
        pins=pins, solver=args.solver, time_limit=args.time_limit, gap=args.gap,
        streaming=not args.no_streaming, coarsen={"on": True, "off": False}.get(args.coarsen, "auto"),
        no_split=loaded.no_split, capture=args.capture, model_name=loaded.name, progress=print_progress,
        align_modules=args.align_modules, dynamic_shapes=_dynamic(args.dynamic), input_shapes=loaded.input_shapes,
        costs=args.costs,
        micro_batches=args.micro_batches, schedule=args.schedule, stages=args.stages, fallbacks=args.fallbacks,
        precision=args.precision,
    )
    print(plan.summary())
    if args.output:
        from partitioner.export import write_export

        write_export(plan, args.output, args.format, force=args.force)
        print(f"wrote {args.output} ({args.format})")
    return 0


def _dynamic(text: str | None) -> tuple[str, ...] | None:
    """``--dynamic batch,seq`` as names; an empty value is an error."""
    if text is None:
        return None
    names = tuple(part.strip() for part in text.split(","))
    if not all(names):
        raise HetpartError(f"--dynamic {text!r}: expected comma-separated names, e.g. --dynamic batch,seq")
    return names
