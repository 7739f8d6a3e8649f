"""``python -m backends.pipeline plan.json [options]``: the program every rank runs under torchrun.

In: a pipeline plan file, the model (``--model``: a zoo name or ``path/to/file.py:factory``;
default: the plan's model name) and the options of :class:`~backends.pipeline.runtime.RunOptions`;
torchrun's environment. Out: this rank's stage run for ``--steps`` steps (see
:mod:`backends.pipeline.runtime`); exit status 0, or 2 with a one-line error naming the rank.
``hetpart launch plan.json`` prints (or with ``--run`` runs) the torchrun commands that start it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    """The rank program's arguments (``hetpart launch`` passes them through)."""
    from backends.pipeline.loss import LOSSES

    p = argparse.ArgumentParser(prog="python -m backends.pipeline",
                                description="run this rank's stage of a pipeline plan (start it with torchrun)")
    p.add_argument("plan", help="a pipeline plan file from `hetpart plan ... --objective throughput`")
    p.add_argument("--model", help="zoo name or path/to/file.py:factory (default: the plan's model name)")
    p.add_argument("--training", action="store_true", help="a training step: loss, backward, optimizer")
    p.add_argument("--schedule", choices=["gpipe", "1f1b"], help="override the plan's schedule")
    p.add_argument("--steps", type=int, default=1, help="steps to run (the first is checked)")
    p.add_argument("--loss", default="mse", help=f"{', '.join(LOSSES)} or path/to/file.py:function")
    p.add_argument("--bind", action="append", default=[], metavar="PLAN_DEVICE=DEVICE",
                   help="run a plan device on this device, e.g. host0/cuda:0=cpu (repeatable)")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S", help="fail a collective waiting longer")
    p.add_argument("--results", metavar="DIR", help="write rank<R>.pt (outputs, gradients, step times) here")
    p.add_argument("--seed", type=int, default=0, help="seed of the loss target")
    p.add_argument("--verbose", action="store_true", help="log every step's time")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run one rank; returns the exit status."""
    from backends.pipeline.runtime import RunOptions, run_rank
    from partitioner.cli.args import pairs
    from partitioner.errors import HetpartError
    from partitioner.model_source import load_model
    from partitioner.plan import Plan

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format=f"rank {os.environ.get('RANK', '?')}: %(message)s")
    try:
        plan = Plan.load(args.plan)
        loaded = load_model(args.model or plan.model_name)
        options = RunOptions(training=args.training, schedule=args.schedule, steps=args.steps, loss=args.loss,
                             device_map=pairs(args.bind, "--bind", "host0/cuda:0=cpu"), timeout_s=args.timeout,
                             results=args.results, seed=args.seed)
        run_rank(plan, loaded.module, loaded.example_inputs, options)
    except HetpartError as exc:
        print(f"hetpart pipeline rank {os.environ.get('RANK', '?')}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
