"""``hetpart check``: run a plan's emitted module (for an ONNX model: its chained part sessions) beside the
original (one whole-model session); compare outputs and time. With ``--training --steps N``: train both for
N optimizer steps (the plan's placed optimizer, torch's for the original) and compare loss and parameters."""

from __future__ import annotations

import argparse

from partitioner.errors import HetpartError

from partitioner.cli.args import (
    add_bind, add_folder_flags, at_plan_inputs, add_input_shape, add_inputs, input_shapes, naming_the_model, pairs, positive_int, read_inputs,
)


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the subcommand to ``hetpart``'s parser."""
    ck = sub.add_parser("check", parents=[common],
                        help="run a plan's emitted module beside the original; compare outputs and time")
    ck.add_argument("model", help="the model the plan was made for: zoo name (gpt, gpt:small), file.py:factory, "
                                  "model.onnx or a model folder (loaded by the plan, beside transformers' own load)")
    ck.add_argument("--plan", required=True, metavar="PLAN.json", help="a plan file from `hetpart plan`")
    add_bind(ck)
    ck.add_argument("--training", action="store_true",
                    help="also compare the loss (sum of outputs) and every parameter's gradient")
    ck.add_argument("--steps", type=positive_int, metavar="N",
                    help="with --training: train the emitted module with the plan's placed optimizer and the "
                         "original with torch's for N steps; compare loss and parameters after each")
    ck.add_argument("--optimizer-args", nargs="+", default=[], metavar="KEY=VALUE",
                    help="with --steps: the optimizer's hyperparameters as Python literals, e.g. lr=1e-3 "
                         "betas=(0.9,0.99) (default: lr=1e-3)")
    ck.add_argument("--generate", type=positive_int, metavar="N",
                    help="a generation plan: run its emitted generate loop for N new tokens beside the original's "
                         "greedy decoding; compare tokens and logits (the verdict is the last line)")
    ck.add_argument("--repeat", type=positive_int, default=5, metavar="N", help="timed runs of each (median)")
    ck.add_argument("--strict-devices", action="store_true",
                    help="bind every plan device to its own CPU tag and fail on the first op reading a tensor "
                         "from another device; print copies per link and resident bytes per device beside "
                         "the plan's (checks a plan for a machine you do not have)")
    add_input_shape(ck)
    add_folder_flags(ck)
    add_inputs(ck)
    ck.set_defaults(func=_cmd_check)


def _cmd_check(args: argparse.Namespace) -> int:
    from backends.torch.check import check_plan
    from partitioner.model_source import load_model
    from partitioner.plan import Plan

    if args.generate is not None:
        return _check_generation(args)
    if args.optimizer_args and args.steps is None:
        raise HetpartError("--optimizer-args sets the optimizer of --steps N: add --training --steps 3")
    plan = Plan.load(args.plan)
    binding = pairs(args.bind, "--bind", "cuda:0=cpu")
    loaded = load_model(args.model, input_shapes=input_shapes(args.input_shape),  # real weights: both run
                        dtype=args.folder_dtype or (plan.request or {}).get("folder_dtype"),
                        trust_remote_code=args.trust_remote_code)
    loaded = at_plan_inputs(loaded, plan, args.input_shape)
    with naming_the_model(plan, loaded.name):
        if loaded.is_onnx:
            from backends.onnx_parts import check_parts

            if args.strict_devices:
                raise HetpartError("--strict-devices checks torch plans; ONNX parts run on onnxruntime: check without it")
            if args.training:
                raise HetpartError("--training: ONNX models run forward only; check without it")
            report = check_parts(plan, loaded.module, read_inputs(args.input) or None, binding or None,
                                 repeat=args.repeat, input_shapes=loaded.input_shapes)
        elif args.input:
            raise HetpartError("--input feeds ONNX models; zoo and factory models bring their example inputs")
        elif args.steps is not None:
            from backends.torch.training_check import check_training_steps

            if not args.training:
                raise HetpartError("--steps trains the emitted module: add --training")
            hyper = {"lr": 1e-3, **optimizer_args(args.optimizer_args)}
            report = check_training_steps(plan, loaded.module, loaded.example_inputs, binding or None,
                                          steps=args.steps, strict_devices=args.strict_devices, **hyper)
        elif loaded.folder is not None:  # the plan's module loaded from the folder, beside transformers' own load
            report = check_plan(plan, loaded.folder.reference(), loaded.example_inputs, binding or None,
                                training=args.training, repeat=args.repeat, strict_devices=args.strict_devices,
                                weights=loaded.folder)
        else:
            report = check_plan(plan, loaded.module, loaded.example_inputs, binding or None,
                                training=args.training, repeat=args.repeat, strict_devices=args.strict_devices)
    print(report.to_text())
    return 0 if report.passed else 1


def _check_generation(args: argparse.Namespace) -> int:
    """``--generate N``: :func:`backends.torch.generate_check.check_generation` on the plan's model."""
    from backends.torch.generate_check import check_generation
    from partitioner.cli.generate import load_generation

    other = [flag for flag, given in (("--training", args.training), ("--steps", args.steps is not None),
                                      ("--input", bool(args.input)), ("--input-shape", bool(args.input_shape)))
             if given]
    if other:
        raise HetpartError(f"--generate checks a generation plan's decoding; {', '.join(other)} belong to plans of "
                           f"one forward pass: drop them")
    gen, model, name = load_generation(args)
    binding = pairs(args.bind, "--bind", "cuda:0=cpu")
    with naming_the_model(gen.prefill, name):
        report = check_generation(gen, model, args.generate, binding or None, strict_devices=args.strict_devices,
                                  model_name=name)
    print(report.to_text())
    return 0 if report.passed else 1


def optimizer_args(items: list[str]) -> dict[str, object]:
    """``--optimizer-args lr=1e-3 betas=(0.9,0.99)`` as ``{"lr": 0.001, "betas": (0.9, 0.99)}``."""
    import ast

    out: dict[str, object] = {}
    for key, text in pairs(items, "--optimizer-args", "lr=1e-3").items():
        if not key.isidentifier():
            raise HetpartError(f"--optimizer-args {key}={text}: {key!r} is not a hyperparameter name")
        try:
            out[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise HetpartError(f"--optimizer-args {key}={text}: the value is not a Python literal "
                               f"(a number, True/False, a tuple such as (0.9,0.99))") from None
    return out
