"""The ``hetpart`` command line: one module per subcommand (or pair of related subcommands).

Subcommands: ``devices`` (built-in and detected device profiles), ``inspect`` (a model's ops and
their predicted cost on each device), ``plan`` (place a model's ops, write the plan file),
``fit`` (the largest micro-batch whose training plan fits, and the gradient accumulation steps
that reach a global batch),
``report`` and ``explain`` (draw a plan; why an op sits where it does), ``demo`` (the seed case end
to end), ``emit`` (write a plan as a runnable Python file) and ``check`` (run the emitted plan
beside the original model and compare outputs, gradients and time; exit 1 when they differ),
``generate`` (run a generation plan's prefill and decode steps on a prompt; ``check --generate N``
compares its tokens with the original's greedy decoding), ``run`` (run a folder of ONNX parts written by ``emit`` for an ``.onnx`` model), ``profile`` (measure a
model's ops on this machine, cached; write a costs file for ``plan --costs``), ``calibrate`` (fit
a device profile of this machine to micro-benchmarks; a poor fit says so) and ``launch`` (the
torchrun commands of a pipeline plan, or a local run of every rank, ``--check``ed) and ``watch`` (the
devices' free memory now against a plan's and its fallbacks' needs). Every command
that takes a model takes a ``.onnx`` file too (``--input-shape NAME=AxBxC`` binds symbolic dimensions).
Errors from hetpart print as one message and exit 2; ``--debug`` shows the traceback instead.

A subcommand is a module here with ``register(sub, common)``, listed in :data:`COMMANDS`;
:mod:`partitioner.cli.args` holds the argument helpers they share.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator, Sequence

from partitioner.cli import (
    calibrate, check, demo, devices, emit, fit, generate, inspect_model, launch, plan, profile, report, run, watch,
)
from partitioner.errors import HetpartError
from partitioner.terminal import PrintableStream

#: The subcommand modules, in the order ``hetpart --help`` lists them.
COMMANDS = (devices, inspect_model, plan, fit, report, demo, emit, check, generate, run, profile, calibrate, launch,
            watch)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hetpart`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, format="%(name)s: %(message)s")
    with _printable_output():  # names from models, plans and profiles never drive the terminal
        try:
            return args.func(args)
        except HetpartError as exc:
            if args.debug:
                raise
            print(f"hetpart: error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("hetpart: interrupted", file=sys.stderr)
            return 130
        except BrokenPipeError:  # output piped into head and friends
            sys.stderr.close()
            return 0


@contextlib.contextmanager
def _printable_output() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` escape control characters while a command runs."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = PrintableStream(sys.stdout), PrintableStream(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def build_parser() -> argparse.ArgumentParser:
    """``hetpart``'s argument parser: the common flags and every subcommand of :data:`COMMANDS`."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show full tracebacks and debug logging")
    parser = argparse.ArgumentParser(
        prog="hetpart",
        description="Place the operators of a neural network on CPUs, GPUs and accelerators.",
        parents=[common],
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub, common)
    return parser


__all__ = ["COMMANDS", "build_parser", "main"]
