"""``hetpart inspect``: a model's ops and their predicted cost on each device of a profile."""

from __future__ import annotations

import argparse
import json

from partitioner.cli.args import add_input_shape, input_shapes


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the subcommand to ``hetpart``'s parser."""
    ins = sub.add_parser("inspect", parents=[common], help="show a model's ops and their cost on each device")
    ins.add_argument("model", help="zoo name (gpt, gpt:small), path/to/file.py:factory or model.onnx")
    ins.add_argument("--devices", default="h200-host", metavar="PROFILE", help="built-in profile or TOML file")
    ins.add_argument("--capture", default="export", choices=["export", "symbolic_trace"])
    ins.add_argument("--training", action="store_true", help="cost a training step (forward + backward)")
    ins.add_argument("--optimizer", default="adam", choices=["sgd", "sgd-momentum", "adam", "adamw", "adagrad", "sparse-adam"])
    ins.add_argument("--top", type=int, default=15, metavar="N", help="show the N most expensive ops (0: all)")
    ins.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_input_shape(ins)
    ins.set_defaults(func=_cmd_inspect)


def _cmd_inspect(args: argparse.Namespace) -> int:
    from cost_models.profiles import load_profile
    from partitioner.frontends.fx import from_module
    from partitioner.inspect import inspect_graph
    from partitioner.model_source import load_model

    profile = load_profile(args.devices)
    loaded = load_model(args.model, device="meta", input_shapes=input_shapes(args.input_shape))
    if loaded.is_onnx:
        from partitioner.frontends.onnx import from_onnx

        graph = from_onnx(loaded.module, loaded.input_shapes, name=loaded.name)
    else:  # zoo models are built on "meta": shapes only, no memory for weights
        graph = from_module(loaded.module, loaded.example_inputs, capture=args.capture, name=loaded.name)
    report = inspect_graph(graph, profile, training=args.training, optimizer=args.optimizer, model_name=loaded.name)
    if args.json:
        print(json.dumps(report.to_dict(top=args.top), indent=2))
    else:
        print(report.to_text(top=args.top))
        fallback = getattr(graph.source, "fallback_ops", ())
        if fallback:
            print(f"op types without a cost entry (costed by the bytes they move): {', '.join(fallback)}")
    return 0
