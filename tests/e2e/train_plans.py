"""Training plans with a ``training_state`` section made by hand, for the tests of emitted training.

In: a zoo or transformers model in train mode, its inputs, a placement (ops not named compute on
``cuda:0``), the ops whose weights stream from the host, the parameters updated row-sparsely or
stepped on the host, and the ops recomputed in backward. Out: a :class:`~partitioner.Plan` costed
by ``evaluate`` like any solver's, with the section :mod:`partitioner.plan.training_state`
describes (checked when the plan is made).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import Any

import torch

from partitioner import Plan, from_module, load_profile
from partitioner.solvers.problem import Options, Placement, Problem, Solution, Status, StreamMode, evaluate


def training_plan(model: torch.nn.Module, inputs: tuple, *, device: Mapping[str, str] | None = None,
                  default: str = "cuda:0", streamed: Collection[str] = (), profile: str = "cpu-gpu-npu") -> Plan:
    """The training plan of a hand-made placement issued in graph order (an op its device cannot
    run goes to ``default``); ``streamed`` ops keep their weights on the host."""
    graph = from_module(model, inputs)
    problem = Problem(graph, load_profile(profile), Options(training=True))
    host = problem.host
    wanted = {n: (device or {}).get(n, default) for n in problem.nodes}
    placed = {n: d if d in problem.allowed[n] else default for n, d in wanted.items()}  # npu:0 runs no mean
    placement = Placement(placed, {n: host for n in streamed}, StreamMode.PREFETCH, tuple(problem.nodes))
    return Plan.from_solution(problem, Solution("hand", placement, Status.HEURISTIC), evaluate(problem, placement))


def with_training_state(plan: Plan, model: torch.nn.Module, *, sparse: Collection[str] = (), state_on_host: Collection[str] = (),
                        recompute: Collection[str] = (), exact: bool = True) -> Plan:
    """``plan`` with a ``training_state`` section: every parameter's weight where the plan keeps
    its op's weights, its state there too (or on the host for ``state_on_host``), a sparse update
    for the parameters named in ``sparse``; one entry per trainable tensor of ``model``, under
    its first name in the plan."""
    host = plan.devices.host_device().name
    tensors = dict(model.named_parameters(remove_duplicate=False))
    seen: set[int] = set()
    params: dict[str, Any] = {}
    for op, names in plan.param_names.items():
        for name in names:
            if name not in tensors or id(tensors[name]) in seen:
                continue  # a buffer, or a second name of a tied tensor (its first name stands for it)
            seen.add(id(tensors[name]))
            weights = plan.weights.get(op, plan.placement[op])
            params[name] = {"op": op, "compute": plan.placement[op], "weights": weights,
                            "state": host if name in state_on_host else weights,
                            "update": "sparse" if name in sparse else "dense", "exact": exact}
    section = {"optimizer": plan.optimizer, "delayed_update": False, "params": params, "recompute": list(recompute)}
    return dataclasses.replace(plan, training_state=section)
