"""Module alignment and the accelerate-style device_map export, checked with accelerate itself."""

from __future__ import annotations

import pytest
import torch

import models
from partitioner import partition
from partitioner.errors import GraphError, HetpartError, PlanMismatch


def test_aligned_plans_keep_each_block_on_one_device() -> None:
    model, inputs = models.get("gpt", "small")
    plan = partition(model, inputs, "h200-host", memory={"cuda:0": "12MB"}, align_modules=["Block"],
                     streaming=False)  # resident weights: the blocks must split between the devices
    for i in range(4):
        devices = {plan.placement[op] for op, path in plan.modules.items() if path.startswith(f"blocks.{i}.")
                   or path == f"blocks.{i}"}
        assert len(devices) == 1, (i, devices)
    device_map = plan.to_device_map()
    assert set(device_map.values()) == {"cpu", "cuda:0"}
    assert any(k.startswith("blocks.") for k in device_map)


def test_device_map_says_where_weights_live() -> None:
    model, inputs = models.get("mlp", "small")
    plan = partition(model, inputs, "h200-host", memory={"cuda:0": "9MB"})
    homes = {plan.weights.get(op, plan.placement[op]) for op in plan.param_ops}
    assert set(plan.to_device_map().values()) == homes  # streamed weights live on the host


def test_unknown_align_class_lists_the_known_ones() -> None:
    model, inputs = models.get("gpt", "tiny")
    with pytest.raises(HetpartError, match="not a module class.*Block"):
        partition(model, inputs, "h200-host", align_modules=["Blok"])


def test_non_convex_module_cannot_be_aligned() -> None:
    class Split(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(4, 4)
            self.b = torch.nn.Linear(4, 4)

    class Outer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Split()
            self.mid = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner.b(self.mid(self.inner.a(x)))  # an outside op between the module's ops

    with pytest.raises(GraphError, match="module 'inner' cannot be kept whole"):
        partition(Outer(), (torch.randn(2, 4),), "h200-host", align_modules=["Split"])


def test_exported_device_map_dispatches_with_accelerate() -> None:
    accelerate = pytest.importorskip("accelerate")
    model, inputs = models.get("gpt", "tiny")
    plan = partition(model, inputs, "h200-host", align_modules=["Block"],
                     pins={"blocks.1*": "cuda:0", "ln_f": "cuda:0"})
    device_map = plan.to_device_map()
    assert set(device_map.values()) == {"cpu", "cuda:0"} and device_map["blocks.1"] == "cuda:0"
    expected = model(*inputs)
    here = {k: ("cpu" if v != "cpu" else v) for k, v in device_map.items()}  # no GPU here: bind it to the CPU
    fresh, _ = models.get("gpt", "tiny")
    dispatched = accelerate.dispatch_model(fresh, device_map=here, main_device="cpu")
    torch.testing.assert_close(dispatched(*inputs), expected)
    accelerate.utils.check_device_map(fresh, here)


class _TwoOps(torch.nn.Module):
    """One module whose two parameters are read by two different ops."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(4))
        self.shift = torch.nn.Parameter(torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * self.scale) + self.shift


class _Holder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.affine = _TwoOps()
        self.out = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.affine(x))


def test_split_leaf_module_is_named() -> None:
    plan = partition(_Holder(), (torch.randn(3, 4),), "h200-host")
    ops = [op for op in plan.param_ops if plan.modules[op] == "affine"]
    assert len(ops) == 2
    split = partition(_Holder(), (torch.randn(3, 4),), "h200-host", pins={ops[0]: "cpu", ops[1]: "cuda:0"})
    with pytest.raises(PlanMismatch, match="module affine is split across"):
        split.to_device_map()
    aligned = partition(_Holder(), (torch.randn(3, 4),), "h200-host", align_modules=["_TwoOps"],
                        pins={"out": "cuda:0"})
    device_map = aligned.to_device_map()
    assert device_map["out"] == "cuda:0" and "affine" in device_map
