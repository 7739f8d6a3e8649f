"""The ``megatron`` baseline: every linear split evenly over a host's like GPUs, pairs not rejoined.

On ``8xh100-nvlink`` a two-block stack of the zoo's pre-norm blocks (hidden 128, 8 heads of 16, 12 tokens: sizes the region finder tells apart) offered
splits of degree 8: the baseline splits every linear over the eight GPUs in even shares, forms every
attention (by heads) and MLP region, is listed among the plan's baselines and emitted with
``--solver megatron``, and the ILP's plan is never slower. On ``h200-host`` (one GPU) it is not
listed, and asked for by name it says why it cannot run. Its plan runs under strict devices with
outputs and gradients equal to the original's (``tests/e2e/test_nway_split_emit.py``'s check).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from models.blocks import Block
from partitioner import from_module, load_profile, partition_outcome
from partitioner.errors import SolverUnavailable
from partitioner.solvers.megatron import solve_megatron
from partitioner.solvers.problem import Options, Problem, evaluate
from partitioner.solvers.split_regions import regions_of
from partitioner.solvers.splits import SplitOptions, even_shares


class _Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(128, 8, 512, is_causal=True) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def _stack() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return _Stack().eval(), (torch.randn(1, 12, 128),)


def test_megatron_splits_every_linear_over_the_eight_gpus_and_forms_every_region() -> None:
    module, inputs = _stack()
    problem = Problem(from_module(module, inputs), load_profile("8xh100-nvlink"),
                      Options(streaming=False, splits=SplitOptions(degrees=(8,))))
    sol = solve_megatron(problem)
    group = tuple(f"cuda:{i}" for i in range(8))
    assert len(sol.placement.split) == 12  # q, k, v, o, ff1, ff2 in each block
    assert {(sp.devices, sp.fractions) for sp in sol.placement.split.values()} == {(group, even_shares(8))}
    assert sorted(sp.axis for sp in sol.placement.split.values()).count("rows") == 4  # o_proj and ff2
    assert len(regions_of(problem, sol.placement)) == 4  # attention by heads and the MLP, per block
    ev = evaluate(problem, sol.placement)
    assert ev.feasible, ev.violations


def test_the_plan_lists_megatron_and_is_never_slower() -> None:
    module, inputs = _stack()
    out = partition_outcome(module, inputs, "8xh100-nvlink", splits={"degrees": [8]}, time_limit=5)
    sol, ev = out.baselines["megatron"]
    assert ev.feasible and out.evaluation.total_s <= ev.total_s * (1 + 1e-9)
    chosen = partition_outcome(module, inputs, "8xh100-nvlink", splits={"degrees": [8]}, solver="megatron")
    assert chosen.plan.solver.name == "megatron" and len(chosen.plan.splits) == 12


def test_without_like_gpus_megatron_is_not_listed_and_refused_by_name() -> None:
    module, inputs = _stack()
    out = partition_outcome(module, inputs, "h200-host", splits=True, time_limit=10)
    assert "megatron" not in out.baselines
    with pytest.raises(SolverUnavailable, match="like accelerators"):
        partition_outcome(module, inputs, "h200-host", splits=True, solver="megatron")
