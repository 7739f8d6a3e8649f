"""``hetpart check``: run a plan's emitted module beside the original; compare outputs and time."""

from __future__ import annotations

import argparse

from partitioner.cli.args import add_bind, naming_the_model, pairs, positive_int


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the subcommand to ``hetpart``'s parser."""
    ck = sub.add_parser("check", parents=[common],
                        help="run a plan's emitted module beside the original; compare outputs and time")
    ck.add_argument("model", help="the model the plan was made for: zoo name (gpt, gpt:small) or file.py:factory")
    ck.add_argument("--plan", required=True, metavar="PLAN.json", help="a plan file from `hetpart plan`")
    add_bind(ck)
    ck.add_argument("--training", action="store_true",
                    help="also compare the loss (sum of outputs) and every parameter's gradient")
    ck.add_argument("--repeat", type=positive_int, default=5, metavar="N", help="timed runs of each (median)")
    ck.add_argument("--strict-devices", action="store_true",
                    help="bind every plan device to its own CPU tag and fail on the first op reading a tensor "
                         "from another device; print copies per link and resident bytes per device beside "
                         "the plan's (checks a plan for a machine you do not have)")
    ck.set_defaults(func=_cmd_check)


def _cmd_check(args: argparse.Namespace) -> int:
    from backends.torch.check import check_plan
    from partitioner.model_source import load_model
    from partitioner.plan import Plan

    plan = Plan.load(args.plan)
    binding = pairs(args.bind, "--bind", "cuda:0=cpu")
    loaded = load_model(args.model)  # real weights: both modules run
    with naming_the_model(plan, loaded.name):
        report = check_plan(plan, loaded.module, loaded.example_inputs, binding or None,
                            training=args.training, repeat=args.repeat, strict_devices=args.strict_devices)
    print(report.to_text())
    return 0 if report.passed else 1
