"""``python -m backends.tensor_parallel plan.json [options]``: what each tensor-parallel rank runs (torchrun).

In: a plan file with a ``splits`` section, the model (``--model``: a zoo name or
``path/to/file.py:factory``; default: the plan's model name) and the options of
:class:`~backends.tensor_parallel.runtime.RunOptions`; torchrun's environment. Out: this rank's
step (see :mod:`backends.tensor_parallel.runtime`; a plan with pipeline stages runs as stages x
tensor-parallel groups, :mod:`backends.tensor_parallel.grid`); exit status 0, or 2 with a one-line error
``hetpart tensor-parallel rank R: error: ...``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

def build_parser() -> argparse.ArgumentParser:
    """The rank program's arguments."""
    from backends.pipeline.loss import LOSSES

    p = argparse.ArgumentParser(prog="python -m backends.tensor_parallel",
                                description="run this rank of a plan's split linears on torch.distributed.tensor "
                                            "(start it with torchrun, one rank per device of the splits)")
    p.add_argument("plan", help="a plan file with splits (partition(..., splits=True), hetpart plan --split)")
    p.add_argument("--model", help="zoo name or path/to/file.py:factory (default: the plan's model name)")
    p.add_argument("--training", action="store_true", help="loss and backward; gradients gathered")
    p.add_argument("--loss", default="mse", help=f"{', '.join(LOSSES)} or path/to/file.py:function")
    p.add_argument("--bind", action="append", default=[], metavar="PLAN_DEVICE=DEVICE",
                   help="run a plan device on this device, e.g. cuda:0=cpu (repeatable)")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S", help="fail a collective waiting longer")
    p.add_argument("--results", metavar="DIR", help="write rank<R>.pt (outputs, loss, gradients) here")
    p.add_argument("--seed", type=int, default=0, help="seed of the loss target")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run one rank; returns the exit status."""
    from backends.tensor_parallel.runtime import ERROR_PREFIX, RunOptions, run_rank
    from partitioner.cli.args import pairs
    from partitioner.errors import HetpartError
    from partitioner.model_source import load_model
    from partitioner.plan import Plan

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format=f"rank {os.environ.get('RANK', '?')}: %(message)s")
    try:
        plan = Plan.load(args.plan)
        loaded = load_model(args.model or plan.model_name)
        options = RunOptions(training=args.training, loss=args.loss,
                             device_map=pairs(args.bind, "--bind", "cuda:0=cpu"), timeout_s=args.timeout,
                             results=args.results, seed=args.seed)
        if plan.pipeline:  # pipeline stages x tensor-parallel groups
            from backends.tensor_parallel.grid import run_grid_rank

            run_grid_rank(plan, loaded.module, loaded.example_inputs, options)
        else:
            run_rank(plan, loaded.module, loaded.example_inputs, options)
    except HetpartError as exc:
        print(f"{ERROR_PREFIX} {os.environ.get('RANK', '?')}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
