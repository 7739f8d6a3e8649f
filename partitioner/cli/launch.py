"""``hetpart launch``: the torchrun commands that run a pipeline plan, or a local run of every rank.

A plan with splits runs as tensor-parallel ranks (``backends.tensor_parallel``: one per device of its
splits, or pipeline stages x 2), all on this machine: without ``--run`` the one ``torchrun`` command
is printed; ``--run`` and ``--check`` as for pipelines (one step; ``--schedule`` and ``--steps`` refused).

Without ``--run`` it prints one ``torchrun`` command per host (``--nnodes``, ``--nproc-per-node``,
``--node-rank``, the rendezvous at host0). With ``--run`` it starts every rank on this machine
(``torchrun --standalone``) and prints their step times against the plan's prediction; ``--check``
also runs the single-process model on the same inputs and compares outputs (with ``--training``
the loss and gradients), printing a one-line verdict last. Exit status: 0, 1 when the check
fails, 2 for errors (a rank that stopped included), 130 / 143 when SIGINT (Ctrl-C) / SIGTERM
stopped the run (torchrun and every rank are stopped first).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile

from partitioner.cli.args import pairs, positive_int


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the subcommand to ``hetpart``'s parser."""
    la = sub.add_parser("launch", parents=[common],
                        help="print the torchrun commands of a pipeline plan, or run every rank here (--run)")
    la.add_argument("plan", metavar="PLAN.json", help="a pipeline plan (hetpart plan ... --objective throughput), "
                                                      "or a plan with splits (tensor-parallel ranks)")
    la.add_argument("--model", help="the model the ranks build: zoo name or path/to/file.py:factory "
                                    "(default: the plan's model name)")
    la.add_argument("--run", action="store_true", help="run every rank on this machine (torchrun --standalone)")
    la.add_argument("--check", action="store_true", help="with --run: compare with the single-process model")
    la.add_argument("--training", action="store_true", help="run training steps (loss, backward, optimizer)")
    la.add_argument("--schedule", choices=["gpipe", "1f1b"], help="override the plan's schedule")
    la.add_argument("--steps", type=positive_int, default=1, help="steps to run (the first is checked)")
    la.add_argument("--loss", default="mse", help="mse, cross-entropy or path/to/file.py:function")
    la.add_argument("--bind", action="append", default=[], metavar="PLAN_DEVICE=DEVICE",
                    help="run a plan device on another, e.g. host0/cuda:0=cpu (repeatable)")
    la.add_argument("--timeout", type=float, default=300.0, metavar="S",
                    help="a rank waiting longer than this on a peer stops with an error")
    la.add_argument("--master-addr", default="HOST0_ADDRESS", help="host0's address, for the printed commands")
    la.add_argument("--master-port", type=int, default=29500, help="the rendezvous port on host0")
    la.set_defaults(func=_cmd_launch)


def _cmd_launch(args: argparse.Namespace) -> int:
    from backends.pipeline import BACKEND, rank_errors
    from backends.pipeline.check import check_results, read_results
    from backends.pipeline.launch import (
        LaunchInterrupted, check_master_addr, rank_arguments, run_local, shell_line, torchrun_commands,
    )
    from backends.pipeline.runtime import RunOptions
    from cost_models.units import format_seconds
    from partitioner.errors import HetpartError, PipelineRunError
    from partitioner.plan import Plan
    from partitioner.terminal import one_line

    check_master_addr(args.master_addr)  # before any work: the printed commands would carry it
    plan = Plan.load(args.plan)
    if plan.splits:  # split linears: tensor-parallel ranks (with stages: stages x tensor-parallel groups)
        return _launch_tensor_parallel(args, plan)
    if not plan.pipeline:
        raise HetpartError(f"{args.plan} is not a pipeline plan (no pipeline section): plan one with "
                           f"`hetpart plan MODEL --devices 4x-cpu-host --objective throughput`")
    if args.check and not args.run:
        raise HetpartError("--check compares a local run with the model: add --run")
    model = args.model or plan.model_name
    binding = pairs(args.bind, "--bind", "host0/cuda:0=cpu")
    section = plan.pipeline
    with tempfile.TemporaryDirectory(prefix="hetpart-launch-") as results:
        options = RunOptions(training=args.training, schedule=args.schedule, steps=args.steps, loss=args.loss,
                             device_map=binding, timeout_s=args.timeout, results=results if args.run else None)
        rank_args = rank_arguments(args.plan, model, options)
        if not args.run:  # every value from the command line or the plan: quoted, or escaped in a comment
            commands = torchrun_commands(plan, rank_args, master_addr=args.master_addr, master_port=args.master_port)
            print(f"# {one_line(args.plan)}: {section['world_size']} stages over "
                  f"{len({s['host'] for s in section['stages']})} hosts; run each line on its host "
                  f"({one_line(args.master_addr)} = host0's address):")
            for node, argv in commands:
                print(f"# {one_line(node.host)} (node rank {node.node_rank}): ranks "
                      f"{', '.join(map(str, node.ranks))} on {', '.join(map(one_line, node.devices))}")
                print(shell_line(argv))
            return 0
        BACKEND.bind(plan, binding)
        print(f"running {section['world_size']} ranks here: {shell_line(['torchrun', '--standalone', '--nproc-per-node', str(section['world_size']), '-m', 'backends.pipeline', *rank_args])}")
        try:
            run = run_local(plan, rank_args, timeout_s=args.timeout * (args.steps + 2) + 120, echo=True)
        except LaunchInterrupted as stopped:  # torchrun and its ranks are stopped already
            print(f"hetpart: {stopped.line()}", file=sys.stderr)
            return stopped.status
        if run.returncode != 0:
            raise PipelineRunError(f"the pipeline run failed (exit status {run.returncode}): {rank_errors(run.output)}")
        measured = max(statistics.median(r["step_s"]) for r in read_results(results, section["world_size"]))
        print(f"ran {args.steps} step(s) on {section['world_size']} local ranks: median {format_seconds(measured)} "
              f"per step (slowest rank); the plan predicts {format_seconds(section['step_s'])} on "
              f"{plan.devices.name}")
        if not args.check:
            return 0
        from partitioner.model_source import load_model

        loaded = load_model(model)
        report = check_results(plan, loaded.module, loaded.example_inputs, options, results)
        print(report.to_text())
        return 0 if report.passed else 1



def _launch_tensor_parallel(args: argparse.Namespace, plan: object) -> int:
    """A plan with splits: its tensor-parallel ranks (``backends.tensor_parallel``), all on this machine."""
    from backends.binding import present
    from backends.pipeline.launch import LaunchInterrupted, rank_errors, shell_line
    from backends.tensor_parallel.check import check_results
    from backends.tensor_parallel.launch import rank_arguments, run_ranks, world_size_of
    from backends.tensor_parallel.runtime import ERROR_PREFIX, RANK_MODULE, RunOptions
    from backends.pipeline.runtime import physical_device
    from cost_models.units import format_seconds
    from partitioner.errors import HetpartError, PipelineRunError

    fixed = [flag for flag, given in (("--schedule", args.schedule), ("--steps", args.steps != 1)) if given]
    if fixed:
        raise HetpartError(f"{args.plan} splits linears: its tensor-parallel ranks run one step with the plan's "
                           f"schedule; drop {' and '.join(fixed)}")
    if args.check and not args.run:
        raise HetpartError("--check compares a local run with the model: add --run")
    binding = pairs(args.bind, "--bind", "cuda:0=cpu")
    world = world_size_of(plan)
    devices = sorted({d for e in plan.splits.values() for d in e["devices"]}
                     | {st["device"] for st in (plan.pipeline or {}).get("stages", [])})
    model = args.model or plan.model_name
    with tempfile.TemporaryDirectory(prefix="hetpart-launch-") as results:
        options = RunOptions(training=args.training, loss=args.loss, device_map=binding, timeout_s=args.timeout,
                             results=results if args.run else None)
        argv = ["torchrun", "--standalone", "--nproc-per-node", str(world), "-m", RANK_MODULE,
                *rank_arguments(args.plan, model, options)]
        if not args.run:
            print(f"# {len(plan.splits)} split linears over {world} tensor-parallel ranks"
                  f"{' (' + str(world // 2) + ' pipeline stages x 2)' if plan.pipeline else ''}, all on this machine "
                  f"(launches over several hosts are not built for tensor-parallel plans):")
            print(shell_line(argv))
            return 0
        absent = [d for d in devices if not present(str(physical_device(d, binding)))]
        if absent:
            raise HetpartError(f"the plan's ranks use {', '.join(absent)}, not present on this machine; bind them to "
                               f"present devices, e.g. " + " ".join(f"--bind {d}=cpu" for d in absent))
        print(f"running {world} ranks here: {shell_line(argv)}")
        try:
            run = run_ranks(plan, model, options, timeout_s=args.timeout * 3 + 120, echo=True)
        except LaunchInterrupted as stopped:
            print(f"hetpart: {stopped.line()}", file=sys.stderr)
            return stopped.status
        if run.returncode != 0:
            raise PipelineRunError(f"the tensor-parallel run failed (exit status {run.returncode}): "
                                   f"{rank_errors(run.output, ERROR_PREFIX)}")
        if not args.check:
            print(f"ran 1 step on {world} local ranks")
            return 0
        from partitioner.model_source import load_model

        loaded = load_model(model)
        report = check_results(plan, loaded.module, loaded.example_inputs, options, results)
        print(f"ran 1 step on {world} local ranks: {format_seconds(report.emitted_s)} (slowest rank)")
        print(report.to_text())
        return 0 if report.passed else 1
