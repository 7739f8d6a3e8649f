"""``hetpart report`` and ``hetpart explain``: draw a plan, or say why an op sits where it does."""

from __future__ import annotations

import argparse
from pathlib import Path

from partitioner.cli.args import add_input_shape, input_shapes, output_path


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the subcommand to ``hetpart``'s parser."""
    rp = sub.add_parser("report", parents=[common], help="draw a plan as a self-contained HTML page (or PNGs)")
    rp.add_argument("plan", metavar="PLAN.json")
    rp.add_argument("-o", "--output", metavar="FILE", help="report.html, or a folder for --format png")
    rp.add_argument("--format", default="html", choices=["html", "png"])
    rp.add_argument("--model", help="check the plan belongs to this model first (zoo name, file.py:factory "
                                    "or model.onnx)")
    add_input_shape(rp)
    rp.add_argument("--force", action="store_true", help="overwrite existing files")
    rp.set_defaults(func=_cmd_report)

    ex = sub.add_parser("explain", parents=[common], help="why an op or module sits where it does")
    ex.add_argument("plan", metavar="PLAN.json")
    ex.add_argument("target", metavar="OP_OR_MODULE", help="an op name, a module path, or a glob")
    ex.set_defaults(func=_cmd_explain)


def _cmd_report(args: argparse.Namespace) -> int:
    from partitioner.plan import Plan
    from partitioner.report import write_pngs, write_report
    from partitioner.report.png import check_png_folder

    if args.format == "png":
        check_png_folder(args.output if args.output is not None else "report-png", force=args.force)
    else:
        output_path(args.output if args.output is not None else "report.html", "-o", force=args.force)
    plan = Plan.load(args.plan)
    if args.model:
        from backends.torch.module import capture_for
        from partitioner.model_source import load_model

        loaded = load_model(args.model, device="meta", input_shapes=input_shapes(args.input_shape))
        if loaded.is_onnx:
            from backends.onnx_parts import graph_for

            graph_for(plan, loaded.module, loaded.input_shapes)  # raises PlanMismatch with both fingerprints
        else:
            capture_for(plan, loaded.module, loaded.example_inputs)
    if args.format == "png":
        folder = Path(args.output if args.output is not None else "report-png")
        for path in write_pngs(plan, folder, force=args.force):
            print(f"wrote {path}")
        return 0
    path = write_report(plan, args.output if args.output is not None else "report.html", force=args.force)
    print(f"wrote {path}")
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    from partitioner.explain import explain
    from partitioner.plan import Plan
    from partitioner.plan.summary import asked_text

    plan = Plan.load(args.plan)
    print(explain(plan, args.target).to_text())
    print(f"  the plan was asked: {asked_text(plan)} (re-solve it: hetpart plan --like {args.plan} ...)")
    return 0
