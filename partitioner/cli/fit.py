"""``hetpart fit``: the largest micro-batch whose training plan fits, its accumulation steps, the plan."""

from __future__ import annotations

import argparse
import sys

from partitioner.cli.args import add_caps_and_pins, flag_options, output_path


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the subcommand to ``hetpart``'s parser."""
    ft = sub.add_parser("fit", parents=[common],
                        help="size the micro-batch from memory: the largest whose training plan fits, and the "
                             "gradient accumulation steps that reach a global batch")
    ft.add_argument("model", help="zoo name (gpt, gpt:small) or path/to/file.py:factory")
    ft.add_argument("--devices", default="h200-host", metavar="PROFILE", help="built-in profile or TOML file")
    ft.add_argument("--global-batch", required=True, type=int, metavar="N",
                    help="samples per optimizer step, at most 16,777,216 (2**24); the example inputs are rescaled "
                         "to it along dimension 0 (refused when they would not fit in half the free memory)")
    ft.add_argument("--micro-batch", type=int, metavar="M",
                    help="plan exactly this micro-batch (it must divide N) instead of searching the divisors of N")
    ft.add_argument("--training", action="store_true",
                    help="plan a training step (required: accumulation is over gradients)")
    ft.add_argument("--optimizer", default="adam", choices=["sgd", "sgd-momentum", "adam", "adamw", "adagrad", "sparse-adam"])
    ft.add_argument("--objective", default="latency", choices=["latency", "throughput", "makespan"])
    ft.add_argument("--no-offload", dest="offload", action="store_false",
                    help="keep each parameter's optimizer state and step with its weights")
    ft.add_argument("--no-recompute", dest="recompute", action="store_false",
                    help="save every activation for backward (no recompute), so activations bound the micro-batch")
    ft.add_argument("--no-save-on-host", dest="save_on_host", action="store_false",
                    help="keep every saved activation on the device computing it (none held in host memory)")
    add_caps_and_pins(ft)
    ft.add_argument("--solver", default="auto", help="auto, highs, cbc, or a baseline (see hetpart plan)")
    ft.add_argument("--time-limit", type=float, default=60.0, metavar="S", help="time limit of each solve, seconds")
    ft.add_argument("--gap", type=float, default=0.01, help="relative optimality gap to stop at")
    ft.add_argument("--precision", metavar="auto|DEVICE=DTYPE,...",
                    help="plan every micro-batch in 16 bits too (see hetpart plan --precision): 16-bit activations "
                         "let a larger micro-batch fit")
    ft.add_argument("-o", "--output", metavar="PLAN.json", help="write the plan at the micro-batch found")
    ft.add_argument("--force", action="store_true", help="overwrite PLAN.json if it exists")
    ft.set_defaults(func=_cmd_fit)


def _cmd_fit(args: argparse.Namespace) -> int:
    from cost_models.profiles import load_profile
    from partitioner.batching import check_batches, fit_batch
    from partitioner.errors import HetpartError
    from partitioner.model_source import load_model
    from partitioner.options import PlanOptions, check_limits

    if not args.training:
        raise HetpartError("hetpart fit sizes the micro-batch of a training step and accumulates gradients over "
                           "micro-batches: pass --training")
    check_batches(args.global_batch, args.micro_batch)  # a bad batch fails before any work
    check_limits(args.time_limit, args.gap, ("--time-limit", "--gap"))
    if args.output is not None:
        output_path(args.output, "-o", force=args.force)
    request = PlanOptions.build(**flag_options(args))  # bad values and combinations fail here
    profile = load_profile(args.devices)
    if args.precision is not None:  # a bad --precision fails before the model is built
        from cost_models.precision import resolve_precision

        resolve_precision(args.precision, profile)
    loaded = load_model(args.model, device="meta")  # shapes only: planning needs no weights
    if loaded.is_onnx:
        raise HetpartError("hetpart fit plans training steps of torch models; ONNX models are planned for inference")
    print(f"fitting {loaded.name}: global batch {args.global_batch} on {profile.name} ...", file=sys.stderr)

    def progress(trial) -> None:  # noqa: ANN001 - a batching.Trial
        verdict = "fits" if trial.fits else "does not fit"
        print(f"  micro-batch {trial.micro_batch}: {verdict}", file=sys.stderr, flush=True)

    fit = fit_batch(
        loaded.module, loaded.example_inputs, global_batch=args.global_batch, micro_batch=args.micro_batch,
        on_trial=progress, options=request.replace(devices=profile, no_split=loaded.no_split, model_name=loaded.name),
    )
    print(fit.summary())
    if args.output:
        fit.plan.save(args.output, force=args.force)
        print(f"wrote {args.output} (check it: hetpart check {args.model} --plan {args.output} --training "
              f"--bind cuda:0=cpu)")
    return 0
