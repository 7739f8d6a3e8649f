"""Plans of hand-made and random placements, for the end-to-end tests of emitted code.

In: a zoo model, its inputs and a placement (by hand, or drawn at random from a seed). Out: a
:class:`~partitioner.Plan` of that placement, costed by ``evaluate`` like any solver's.
"""

from __future__ import annotations

import random

import torch

from partitioner import Plan, from_module, load_profile
from partitioner.solvers.problem import Options, Placement, Problem, Solution, Status, StreamMode, evaluate


def plan_for(model: torch.nn.Module, inputs: tuple, profile: str, rng: random.Random, *, stream: bool) -> Plan:
    """A plan with a random device per op (and random streamed weights on accelerators)."""
    graph = from_module(model, inputs)
    problem = Problem(graph, load_profile(profile), Options(streaming=stream))
    device = {n: rng.choice(problem.allowed[n]) for n in problem.nodes}
    streamed = {
        n: problem.host for n in problem.streamable if device[n] != problem.host and rng.random() < 0.5
    } if stream else {}
    order = tuple(problem.nodes)
    placement = Placement(device, streamed, StreamMode.PREFETCH, order)
    solution = Solution("random", placement, Status.HEURISTIC)
    return Plan.from_solution(problem, solution, evaluate(problem, placement))


def plan_with_placement(model: torch.nn.Module, inputs: tuple, device: dict[str, str], profile: str = "cpu-gpu-npu",
                        order: tuple[str, ...] = (), streamed: dict[str, str] | None = None) -> Plan:
    """The plan of a hand-made placement (ops not named go to the CPU), issued in ``order``;
    ``streamed`` maps ops to the device their weights are streamed from."""
    graph = from_module(model, inputs)
    problem = Problem(graph, load_profile(profile), Options(streaming=bool(streamed)))
    placement = Placement({n: device.get(n, "cpu") for n in problem.nodes}, dict(streamed or {}), StreamMode.PREFETCH,
                          order or tuple(problem.nodes))
    return Plan.from_solution(problem, Solution("hand", placement, Status.HEURISTIC), evaluate(problem, placement))


#: dlrm:tiny placed by hand: an item of a multi-output op (``getitem`` of ``embedding_bag``) away
#: from its producer, a tensor (``stack``) read on two other devices, an op (``index``) reading a
#: non-persistent buffer on an accelerator.
DLRM_PLACEMENT = {"getitem": "cuda:0", "transpose": "cuda:0", "bmm": "npu:0", "index": "cuda:0"}


class Positions(torch.nn.Module):
    """A factory op in the graph: ``arange`` with the device the capture saw (the host)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.arange(x.shape[-1], device=x.device, dtype=x.dtype)


def factory_plan() -> tuple[Plan, torch.nn.Module, tuple[torch.Tensor, ...]]:
    """``Positions`` with its ``arange`` and ``mul`` on cuda:0."""
    model, inputs = Positions(), (torch.randn(2, 8),)
    plan = plan_with_placement(model, inputs, {"arange": "cuda:0", "mul": "cuda:0"})
    return plan, model, inputs
