"""Launching a pipeline plan: the ``torchrun`` command for each host, or one local run.

In: a pipeline plan (and its file path), the model spec and the rank options. Out:
:func:`torchrun_commands`, one command line per host of the plan's stages (``--nnodes``,
``--nproc-per-node``, ``--node-rank``, and the rendezvous at ``host0``: ``--master-addr`` /
``--master-port``, torchrun's static rendezvous, so a host's processes take the ranks of its
stages); and :func:`run_local`, every rank on this machine under one ``torchrun --standalone``
(a free port, so runs side by side do not collide), returning its exit status and output.

Each rank runs ``python -m backends.pipeline PLAN --model SPEC ...`` (:mod:`backends.pipeline.runtime`).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from backends.pipeline.runtime import RunOptions
from partitioner.errors import PipelineRunError

__all__ = ["Node", "nodes_of", "rank_arguments", "torchrun_commands", "run_local", "LocalRun", "shell_line"]

RANK_MODULE = "backends.pipeline"


@dataclasses.dataclass(frozen=True)
class Node:
    """One host of a launch: its node rank, how many ranks it starts, which stages they run."""

    host: str
    node_rank: int
    ranks: tuple[int, ...]
    devices: tuple[str, ...]


def nodes_of(plan: Any) -> tuple[Node, ...]:
    """The hosts of a pipeline plan's stages, in node-rank order.

    Example:
        >>> [(n.host, n.ranks) for n in nodes_of(plan)]          # doctest: +SKIP
        [('host0', (0, 1)), ('host1', (2, 3))]
    """
    nodes: dict[str, list[dict[str, Any]]] = {}
    for st in plan.pipeline["stages"]:
        nodes.setdefault(st["host"], []).append(st)
    return tuple(Node(host, i, tuple(st["rank"] for st in sts), tuple(st["device"] for st in sts))
                 for i, (host, sts) in enumerate(nodes.items()))


def rank_arguments(plan_path: str | Path, model: str, options: RunOptions, *, verbose: bool = False) -> list[str]:
    """The rank program's arguments for ``options`` (what follows ``-m backends.pipeline``)."""
    args = [str(plan_path), "--model", model]
    if options.training:
        args.append("--training")
    if options.schedule:
        args += ["--schedule", options.schedule]
    if options.steps != 1:
        args += ["--steps", str(options.steps)]
    if options.loss != "mse":
        args += ["--loss", options.loss]
    for logical, physical in options.device_map.items():
        args += ["--bind", f"{logical}={physical}"]
    if options.timeout_s != RunOptions.timeout_s:
        args += ["--timeout", f"{options.timeout_s:g}"]
    if options.results:
        args += ["--results", str(options.results)]
    if options.seed:
        args += ["--seed", str(options.seed)]
    if verbose:
        args.append("--verbose")
    return args


def torchrun_commands(plan: Any, rank_args: Sequence[str], *, master_addr: str = "HOST0_ADDRESS",
                      master_port: int = 29500) -> list[tuple[Node, list[str]]]:
    """One ``torchrun`` command per host; run each on its host (``host0``'s address as master).

    Example:
        >>> for node, argv in torchrun_commands(plan, ["plan.json", "--model", "gpt:tiny"]):   # doctest: +SKIP
        ...     print(node.host, shlex.join(argv))
        host0 torchrun --nnodes 2 --nproc-per-node 1 --node-rank 0 --master-addr HOST0_ADDRESS ...
    """
    nodes = nodes_of(plan)
    return [(node, ["torchrun", "--nnodes", str(len(nodes)), "--nproc-per-node", str(len(node.ranks)),
                    "--node-rank", str(node.node_rank), "--master-addr", master_addr,
                    "--master-port", str(master_port), "-m", RANK_MODULE, *rank_args])
            for node in nodes]


@dataclasses.dataclass(frozen=True)
class LocalRun:
    """What a local run did: torchrun's exit status and its output (every rank's, interleaved)."""

    returncode: int
    output: str
    command: tuple[str, ...]


def run_local(plan: Any, rank_args: Sequence[str], *, timeout_s: float = 600.0, echo: bool = False) -> LocalRun:
    """Run every rank on this machine: ``torchrun --standalone --nproc-per-node WORLD``.

    Raises:
        PipelineRunError: the run took longer than ``timeout_s`` (it is stopped first).

    Example:
        >>> run = run_local(plan, rank_arguments("plan.json", "mlp:tiny", RunOptions()))   # doctest: +SKIP
        >>> run.returncode
        0
    """
    world = plan.pipeline["world_size"]
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
            "--nproc-per-node", str(world), "--monitor-interval", "0.5", "-m", RANK_MODULE, *rank_args]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default too; said here to keep its warning quiet
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=_collect, args=(proc, lines, echo), daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
        raise PipelineRunError(f"the local run of {world} ranks took longer than {timeout_s:g} s and was stopped; "
                               f"raise --timeout or look for a rank waiting on a dead peer") from None
    finally:
        reader.join(timeout=10)
    return LocalRun(proc.returncode, "".join(lines), tuple(argv))


def _collect(proc: subprocess.Popen, lines: list[str], echo: bool) -> None:
    """Keep the run's output, and copy it to our stdout as it comes when ``echo`` (the CLI's view)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if echo:
            sys.stdout.write(line)
            sys.stdout.flush()


def shell_line(argv: Sequence[str]) -> str:
    """A command line as a shell would take it (each argument quoted where needed)."""
    return shlex.join(argv)
