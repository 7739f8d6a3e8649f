"""Strict devices count the plain tensor attributes a plan places (constants torch.export lifts).

A submodule's plain tensor attribute (neither parameter nor buffer, as BART's ``final_logits_bias``
path gives ``model.model.lifted_tensor_0``) is state the plan places and the emitted module holds:
the strict-devices report must count its bytes where it lives, or a correct plan reads DIFFERS.
"""

from __future__ import annotations

import torch

from backends.torch.check import check_plan
from partitioner import partition


class Inner(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.scale = torch.full((8,), 2.0)  # a plain tensor attribute

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


class Outer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = Inner()
        self.head = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.model(x))


def test_a_nested_plain_tensor_attribute_is_counted_where_the_plan_puts_it() -> None:
    model, inputs = Outer(), (torch.randn(4, 8),)
    plan = partition(model, inputs, "h200-host", pins={"head": "cuda:0", "model*": "cpu"})
    assert any("scale" in name for names in plan.param_names.values() for name in names)
    report = check_plan(plan, model, inputs, repeat=1, strict_devices=True)
    assert report.passed, report.to_text()
