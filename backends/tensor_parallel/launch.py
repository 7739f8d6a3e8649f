"""Launching a plan's tensor-parallel ranks: the rank program's arguments, and one local run.

In: a plan with splits (and its file path), the model spec and :class:`~backends.tensor_parallel.runtime.RunOptions`.
Out: :func:`rank_arguments` (what follows ``-m backends.tensor_parallel``) and :func:`run_ranks`,
every rank on this machine under one ``torchrun --standalone`` (the pipeline backend's
:func:`~backends.pipeline.launch.run_local`: a free port, signals forwarded, a timeout), one rank
per device of the plan's splits (stages x 2 for a plan with pipeline stages) unless ``world_size``
says otherwise (the ranks then refuse to
start, naming both numbers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from backends.pipeline.launch import LocalRun, run_local
from backends.tensor_parallel.grid import TP, grid_of
from backends.tensor_parallel.layout import mesh_devices
from backends.tensor_parallel.runtime import RANK_MODULE, RunOptions

__all__ = ["rank_arguments", "run_ranks", "world_size_of"]


def world_size_of(plan: Any) -> int:
    """How many ranks ``plan`` runs on: one per device of its splits, or, with pipeline stages,
    stages x 2 (:func:`~backends.tensor_parallel.grid.grid_of`).

    Example:
        >>> world_size_of(plan)          # doctest: +SKIP
        2
    """
    return len(grid_of(plan)) * TP if plan.pipeline else len(mesh_devices(plan))


def rank_arguments(plan_path: str | Path, model: str, options: RunOptions) -> list[str]:
    """The rank program's arguments for ``options``.

    Example:
        >>> rank_arguments("plan.json", "gpt:small", RunOptions(training=True, device_map={"cuda:0": "cpu"}))
        ['plan.json', '--model', 'gpt:small', '--training', '--bind', 'cuda:0=cpu']
    """
    args = [str(plan_path), "--model", model]
    if options.training:
        args.append("--training")
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
    return args


def run_ranks(plan: Any, model: str, options: RunOptions, *, world_size: int | None = None,
              timeout_s: float = 600.0, echo: bool = False) -> LocalRun:
    """Run every tensor-parallel rank of ``plan`` here (``torchrun --standalone``) and return what
    torchrun did. ``world_size`` (default: one rank per device of the splits) starts another
    number of processes: they refuse the launch.

    Example:
        >>> run = run_ranks(plan, "gpt:small", RunOptions(device_map={"cuda:0": "cpu"}))   # doctest: +SKIP
        >>> run.returncode                                                                  # doctest: +SKIP
        0
    """
    world = world_size_of(plan) if world_size is None else world_size
    return run_local(plan, rank_arguments(plan.source, model, options), timeout_s=timeout_s, echo=echo,
                     world_size=world, rank_module=RANK_MODULE)
