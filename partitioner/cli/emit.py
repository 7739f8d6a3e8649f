"""``hetpart emit``: write a plan as one runnable Python file for the model it was made for (``--training``: with
``build_optimizer``, the plan's placed optimizer), or, for an ONNX model, as a folder of ONNX parts and their
manifest (``hetpart run`` runs it)."""

from __future__ import annotations

import argparse
from pathlib import Path

from partitioner.cli.args import (
    add_bind, add_folder_flags, at_plan_inputs, add_input_shape, input_shapes, naming_the_model, one_line_summary, output_path, pairs,
)
from partitioner.errors import HetpartError
from partitioner.files import check_folder


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the subcommand to ``hetpart``'s parser."""
    em = sub.add_parser("emit", parents=[common], help="write a plan as a runnable Python file")
    em.add_argument("model", help="the model the plan was made for: zoo name (gpt, gpt:small), file.py:factory, "
                                  "model.onnx or a model folder (the file's build('./folder') loads it by the plan)")
    em.add_argument("--plan", required=True, metavar="PLAN.json", help="a plan file from `hetpart plan`")
    em.add_argument("-o", "--output", required=True, metavar="FILE.py|DIR",
                    help="the Python file to write (ONNX models: the folder of parts)")
    add_bind(em)
    add_input_shape(em)
    em.add_argument("--training", action="store_true",
                    help="a training plan: also write build_optimizer(module, lr=...), the plan's placed optimizer "
                         "(each parameter's optimizer state and step where the plan puts them)")
    add_folder_flags(em)
    em.add_argument("--force", action="store_true",
                    help="overwrite FILE.py if it exists (DIR: replace it if it is a folder of parts, nothing else)")
    em.set_defaults(func=_cmd_emit)


def _cmd_emit(args: argparse.Namespace) -> int:
    from partitioner.model_source import load_model
    from partitioner.plan import Plan

    if str(args.model).lower().endswith(".onnx"):  # parts go to a folder: --force replaces only a parts folder
        from backends.onnx_parts.folder import PARTS

        output = check_folder(args.output, force=args.force, kind=PARTS)
    else:
        output = output_path(args.output, "-o", force=args.force)
    plan = Plan.load(args.plan)
    binding = pairs(args.bind, "--bind", "cuda:0=cpu")
    loaded = load_model(args.model, input_shapes=input_shapes(args.input_shape),  # real weights (a folder: hollow)
                        dtype=args.folder_dtype or (plan.request or {}).get("folder_dtype"),
                        trust_remote_code=args.trust_remote_code)
    loaded = at_plan_inputs(loaded, plan, args.input_shape)
    if loaded.is_onnx:
        return _emit_onnx(args, plan, loaded, output, binding)
    example_inputs = loaded.example_inputs
    if plan.batch:  # the plan was made at one micro-batch: the file runs one micro-batch
        from partitioner.batching import inputs_at_batch

        example_inputs = inputs_at_batch(example_inputs, plan.batch["micro_batch"])
    if args.training and not plan.training:
        raise HetpartError(f"--training: {args.plan} is an inference plan (no gradients or optimizer state priced); "
                           f"re-plan with `hetpart plan --training`, or emit without --training")
    with naming_the_model(plan, loaded.name):
        plan.emit_source(output, loaded.folder or loaded.module, binding or None, example_inputs=example_inputs,
                         force=args.force, training=args.training)
    print(f"wrote {output}")
    if loaded.folder is not None:
        print(f"its build({str(args.model)!r}) reads each weight from the folder into its device")
    if args.training:
        print(f"build_optimizer(module, lr=...) in it builds the plan's {plan.optimizer} optimizer")
    elif plan.training:
        print("note: a training plan: the file's forward is the model captured in train mode (dropout, batch norm "
              "statistics as in training); add --training to write build_optimizer too")
    if plan.batch:
        print(f"it runs one micro-batch of {plan.batch['micro_batch']}: accumulate gradients over "
              f"{plan.batch['accumulation_steps']} of them per global batch of {plan.batch['global_batch']} "
              "(backends.torch.training.accumulate_gradients does it for you)")
    print(one_line_summary(plan, binding))
    return 0


def _emit_onnx(args: argparse.Namespace, plan, loaded, output: Path, binding: dict[str, str]) -> int:  # noqa: ANN001
    if args.training:
        raise HetpartError("--training: ONNX parts run forward only (no optimizer); emit without --training")
    if binding:
        raise HetpartError("--bind chooses where parts run: give it to `hetpart run DIR --bind ...`, not to emit")
    with naming_the_model(plan, loaded.name):
        plan.emit_onnx(output, loaded.module, input_shapes=loaded.input_shapes, force=args.force)
    from backends.onnx_parts.manifest import MANIFEST, Manifest

    manifest = Manifest.from_json((output / MANIFEST).read_text(encoding="utf-8"), str(output / MANIFEST))
    print(f"wrote {output}: {len(manifest.parts)} parts and {MANIFEST} "
          f"({', '.join(f'{p.file} on {p.device}' for p in manifest.parts[:4])}"
          f"{', ...' if len(manifest.parts) > 4 else ''}); run it with `hetpart run {output} --input NAME=FILE.npy`")
    print(one_line_summary(plan, {}))
    return 0
