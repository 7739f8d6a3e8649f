"""``hetpart plan``: place a model's ops on the devices of a profile and write the plan."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from partitioner.cli.args import (
    add_caps_and_pins, add_folder_flags, add_input_shape, fallback_fractions, flag_options, input_shapes, output_path, positive_int,
    print_progress,
)
from partitioner.errors import HetpartError


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the subcommand to ``hetpart``'s parser."""
    pl = sub.add_parser("plan", parents=[common], help="place a model's ops on the devices of a profile")
    pl.add_argument("model", nargs="?", help="zoo name (gpt, gpt:small), path/to/file.py:factory, model.onnx or a "
                                         "model folder (config.json + *.safetensors; no weight is read) "
                                         "(with --like: the model the plan was made for, unless given)")
    pl.add_argument("--like", metavar="PLAN.json",
                    help="re-solve with the request a plan records (hetpart explain shows it); the flags given "
                         "here replace its options, e.g. --like plan.json --memory cuda:0=1GB")
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
    pl.add_argument("--optimizer", default="adam",
                    choices=["sgd", "sgd-momentum", "adam", "adamw", "adagrad", "sparse-adam"])
    pl.add_argument("--no-offload", dest="offload", action="store_false",
                    help="training: keep each parameter's optimizer state and step with its weights")
    pl.add_argument("--no-recompute", dest="recompute", action="store_false",
                    help="training: save every activation for backward (no recompute)")
    pl.add_argument("--no-save-on-host", dest="save_on_host", action="store_false",
                    help="training: keep saved activations on the device computing them (none held in host memory)")
    pl.add_argument("--dense-updates", dest="sparse_updates", action="store_false",
                    help="training: update embedding tables densely even where a row-sparse update is exact")
    pl.add_argument("--delayed-update", action="store_true",
                    help="training: the host's optimizer step of one iteration runs beside the next (changes "
                         "the training: ZeRO-Offload's delayed parameter update)")
    pl.add_argument("--solver", default="auto",
                    help="auto, highs, cbc, or a baseline: greedy, sequential-fill, heft, single:DEVICE; "
                         "pipelines: pipeline-dp, pippy-equal-size, deepspeed-parameters, flop-balanced")
    pl.add_argument("--time-limit", type=float, default=60.0, metavar="S", help="ILP time limit in seconds")
    pl.add_argument("--gap", type=float, default=0.01, help="relative optimality gap to stop at")
    pl.add_argument("--no-streaming", dest="streaming", action="store_false",
                    help="keep every weight where its op computes")
    pl.add_argument("--coarsen", default="auto", choices=["auto", "on", "off"])
    pl.add_argument("--capture", default="export", choices=["export", "symbolic_trace"])
    pl.add_argument("--align-modules", action="append", default=[], metavar="CLASS",
                    help="keep every instance of a module class on one device, e.g. Block (repeatable)")
    pl.add_argument("--link-budget", action="append", default=[], metavar="LINK=SIZE",
                    help="bytes per step a link may carry, e.g. 'cpu<->cuda:0=1GB' (repeatable)")
    pl.add_argument("--device-map", dest="device_map_pins", metavar="MAP.json",
                    help="an accelerate device_map (module path -> GPU index or device) to pin: hetpart places "
                         "the modules it leaves out")
    add_folder_flags(pl)
    pl.add_argument("--contiguous-stages", action="store_true",
                    help="devices in profile order form contiguous stages (every edge goes forward in that order)")
    pl.add_argument("--dynamic", dest="dynamic_shapes", metavar="DIMS", default=None,
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
    pl.add_argument("--split", dest="splits", nargs="?", const="on", default=None, metavar="AXES[:F/F...][@D/D...]",
                    help="inference: let the solver split linears over devices, by output columns (cols) and/or "
                         "the reduction dimension (rows), at these home shares, e.g. cols:0.25/0.5/0.75 (default: "
                         "both axes, 0.25/0.5/0.75, the rate-proportional share and the balanced one); '@' names the "
                         "degrees, how many devices a split spans (default 2/4/8: pairs at those shares, and 4 or 8 "
                         "like devices in even shares, e.g. cols,rows@8 for Megatron-style degree 8); 'time' adds "
                         "time splits (a linear's weight streamed to one accelerator in row chunks, e.g. cols,time "
                         "or time:8/16 for those chunk counts); 'table' and 'batch' add splits of embeddings by "
                         "table rows and of elementwise ops and norms by batch, e.g. cols,rows,table,batch")
    gen = pl.add_argument_group("generation (a prefill and a decode step with a KV cache, one plan)")
    gen.add_argument("--generate", action="store_true",
                     help="plan generation: the prefill at --prompt-tokens and the decode step, solved together")
    gen.add_argument("--prompt-tokens", type=positive_int, default=512, metavar="P",
                     help="prompt length the prefill is planned for (default 512)")
    gen.add_argument("--new-tokens", type=positive_int, default=128, metavar="N",
                     help="tokens generated per request; the cache holds P + N (default 128)")
    gen.add_argument("--batch", dest="sequences", type=positive_int, default=1, metavar="B",
                     help="sequences decoded together (default 1)")
    gen.add_argument("--generation-objective", default="request", choices=["request", "decode", "prefill"],
                     help="minimise a request's time (default), the decode step's or the prefill's")
    pl.add_argument("-o", "--output", metavar="FILE", help="write the plan (see --format)")
    pl.add_argument("--format", default="json", choices=["json", "device-map", "csv"],
                    help="json: the plan file; device-map: accelerate's device_map; csv: op, module, device, seconds")
    pl.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    add_input_shape(pl)
    pl.set_defaults(func=_cmd_plan, flag_defaults={a.dest: a.default for a in pl._actions})


def _cmd_plan(args: argparse.Namespace) -> int:
    from cost_models.live_memory import profile_for
    from partitioner.model_source import load_model
    from partitioner.options import check_limits
    from partitioner.planner import partition

    check_limits(args.time_limit, args.gap, ("--time-limit", "--gap"))
    if args.output is not None:
        output_path(args.output, "-o", force=args.force)
    if args.format != "json" and args.output is None:
        raise HetpartError(f"--format {args.format} writes a file: give it with -o FILE")
    base, model = _like(args)
    request = base.replace(**_asked(args, base is not None))  # bad values and combinations fail here
    profile = profile_for(request.hardware.devices, margin=request.hardware.detect_margin)  # before the capture
    if profile.probe is not None:
        print("\n".join(profile.notes[-1 - len(profile.probe.notes):]), file=sys.stderr)
    measured = request.costs == "profiled"
    if request.precision is not None:  # a bad --precision fails before the capture too
        from cost_models.precision import resolve_precision

        measured |= resolve_precision(request.precision, profile).max_error is not None
    # zoo models: shapes only, no memory for weights (measuring ops, or the error packed weights
    # cost, needs real ones); ONNX models: the path, imported by partition
    shapes = input_shapes(args.input_shape) or request.source.input_shapes
    loaded = load_model(model, device=None if measured else "meta", input_shapes=shapes,
                        dtype=request.source.folder_dtype, trust_remote_code=request.source.trust_remote_code)
    print(f"capturing {loaded.name} ({'onnx' if loaded.is_onnx else request.source.capture}) ...", file=sys.stderr)
    if request.generation.generate:
        return _generation(args, loaded, request.replace(devices=profile, no_split=loaded.no_split,
                                                         model_name=loaded.name))
    plan = partition(loaded.module, loaded.example_inputs, options=request.replace(
        devices=profile, no_split=loaded.no_split, model_name=loaded.name, progress=print_progress,
        input_shapes=loaded.input_shapes if loaded.folder is None else shapes))
    print(plan.summary())
    if args.output:
        from partitioner.export import write_export

        write_export(plan, args.output, args.format, force=args.force)
        print(f"wrote {args.output} ({args.format})")
    return 0


def _generation(args: argparse.Namespace, loaded: Any, request: Any) -> int:
    """``--generate``: the generation plan (partitioner.generation_planner), its summary and file."""
    from partitioner.generation_planner import plan_generation

    if loaded.is_onnx:
        raise HetpartError("--generate plans a torch causal language model's decode step; an ONNX model has no "
                           "KV cache hetpart can make static: give a transformers model folder or a zoo model")
    if args.format != "json":
        raise HetpartError(f"--format {args.format} writes one placement; a generation plan has two: use --format json")
    gen = plan_generation(loaded.module, options=request)
    print(gen.summary())
    if args.output:
        gen.save(args.output, force=args.force)
        print(f"wrote {args.output} (generation plan)")
    return 0


def _like(args: argparse.Namespace):  # noqa: ANN202 - (PlanOptions, model spec)
    """The request to start from (a plan's, with ``--like``; else the defaults) and the model to plan."""
    from partitioner.options import PlanOptions

    if args.like is None:
        if args.model is None:
            raise HetpartError("hetpart plan needs a MODEL (zoo name, path/to/file.py:factory or model.onnx), "
                               "or --like PLAN.json to re-solve the model a plan was made for")
        return PlanOptions(), args.model
    from partitioner.plan import Plan

    like = Plan.load(args.like)
    if not like.request:
        raise HetpartError(f"--like {args.like}: the plan records no request (it was made before plans recorded "
                           f"their options); give the flags instead")
    base = PlanOptions.from_record(like.request)
    if isinstance(like.request.get("devices"), str) and like.request["devices"] == like.devices.name:
        base = base.replace(devices=like.devices)  # the profile as planned (a TOML file may have moved)
    return base, args.model or like.model_name


def _asked(args: argparse.Namespace, like: bool) -> dict:
    """The options the flags set; with ``--like``, only the flags given (those not at their defaults)."""
    asked = flag_options(args)
    if like:
        asked = {k: v for k, v in asked.items() if getattr(args, k) != args.flag_defaults.get(k)}
    return asked
