"""A plan re-costed with training-state choices made by hand, for the tests of emitted training.

``restated(plan, model, state_on_host=..., state_streamed=..., recompute=..., sparse=...)``
evaluates ``plan``'s placement again on ``model`` as the plan captured it, with the optimizer state
of the named parameters on the host (stepped there, or streamed to the weight's device for the
step), the named ops recomputing and row-sparse updates where asked, and returns
the plan :meth:`Plan.from_solution` makes of it: memory, transfers (gradients out, updated weights
back) and the ``training_state`` section all agree, as in a plan the ILP chose. The parameters in
``sparse`` (and only they) are written ``"sparse"`` in the section, so a test may also name an
update the emitter must refuse.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

import torch

from backends.torch.module import capture_for
from cost_models.training import parse_optimizer
from partitioner import Plan
from partitioner.solvers.problem import Objective, Options, Placement, Problem, Solution, Status, StreamMode, evaluate


def restated(plan: Plan, model: torch.nn.Module, *, state_on_host: Collection[str] = (),
             state_streamed: Collection[str] = (), recompute: Collection[str] = (), sparse: Collection[str] = (), delayed_update: bool = False,
             exact: bool | None = None) -> Plan:
    graph = capture_for(plan, model)
    options = Options(objective=Objective(plan.objective), training=True, optimizer=parse_optimizer(plan.optimizer),
                      sparse_updates=bool(sparse), delayed_update=delayed_update)
    problem = Problem(graph, plan.devices, options)
    host = problem.host
    owner = {name: op for op, names in plan.param_names.items() for name in names}
    state = {owner[n]: host for n in state_on_host
             if n in owner and plan.placement[owner[n]] != host and owner[n] not in plan.weights}
    streamed_state = frozenset(owner[n] for n in state_streamed
                               if n in owner and plan.placement[owner[n]] != host and owner[n] not in plan.weights)
    placement = Placement(dict(plan.placement), dict(plan.weights), StreamMode(plan.stream_mode),
                          tuple(plan.schedule), state=state, recompute=frozenset(recompute),
                          streamed_state=streamed_state)
    ev = evaluate(problem, placement)
    made = Plan.from_solution(problem, Solution("hand", placement, Status.HEURISTIC), ev,
                              model_name=plan.model_name, inputs=plan.inputs, capture=plan.capture)
    section = dict(made.training_state)
    params = {}
    for name, ps in section["params"].items():
        ps = dict(ps, update="sparse" if name in sparse else "dense")
        if exact is not None:
            ps["exact"] = exact
        params[name] = ps
    section["params"] = params
    return dataclasses.replace(made, training_state=section, request=plan.request)
