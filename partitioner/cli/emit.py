"""``hetpart emit``: write a plan as one runnable Python file for the model it was made for."""

from __future__ import annotations

import argparse

from partitioner.cli.args import add_bind, naming_the_model, one_line_summary, output_path, pairs


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the subcommand to ``hetpart``'s parser."""
    em = sub.add_parser("emit", parents=[common], help="write a plan as a runnable Python file")
    em.add_argument("model", help="the model the plan was made for: zoo name (gpt, gpt:small) or file.py:factory")
    em.add_argument("--plan", required=True, metavar="PLAN.json", help="a plan file from `hetpart plan`")
    em.add_argument("-o", "--output", required=True, metavar="FILE.py", help="the Python file to write")
    add_bind(em)
    em.add_argument("--force", action="store_true", help="overwrite FILE.py if it exists")
    em.set_defaults(func=_cmd_emit)


def _cmd_emit(args: argparse.Namespace) -> int:
    from partitioner.model_source import load_model
    from partitioner.plan import Plan

    output = output_path(args.output, "-o", force=args.force)
    plan = Plan.load(args.plan)
    binding = pairs(args.bind, "--bind", "cuda:0=cpu")
    loaded = load_model(args.model)  # real weights: the file is written for this model
    with naming_the_model(plan, loaded.name):
        plan.emit_source(output, loaded.module, binding or None, example_inputs=loaded.example_inputs,
                         force=args.force)
    print(f"wrote {output}")
    print(one_line_summary(plan, binding))
    return 0
