"""Training plans with a ``training_state`` section made by hand, for the tests of emitted training.

In: a zoo or transformers model in train mode, its inputs, a placement (ops not named compute on
``cuda:0``), the ops whose weights stream from the host, the parameters updated row-sparsely or
stepped on the host, and the ops recomputed in backward. Out: a :class:`~partitioner.Plan` costed
by ``evaluate`` like any solver's, with the section :mod:`partitioner.plan.training_state`
describes (checked when the plan is made).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import torch

from partitioner import Plan, from_module, load_profile
from partitioner.solvers.problem import Options, Placement, Problem, Solution, Status, StreamMode, evaluate
from tests.e2e.restated import restated


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
    """``plan`` re-costed with a ``training_state`` section (:func:`tests.e2e.restated.restated`):
    every parameter's weight where the plan keeps its op's weights, its state there too (or on the
    host for ``state_on_host``), a sparse update for the parameters named in ``sparse``."""
    return restated(plan, model, sparse=sparse, state_on_host=state_on_host, recompute=recompute, exact=exact)
