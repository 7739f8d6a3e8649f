"""Fallback plans are planned for the memory their level asks for, on every device (the host
included), a plan fits only where every reported device has room, and the default probe counts
the running plan's own weights as available (else a module flaps between plans on every call).

The probe runs with a CPU emulation of one CUDA device: every logical device is bound to the CPU,
the probe reads ``cuda:0`` through a stand-in for ``torch.cuda.mem_get_info`` whose free memory is
a fixed total less the bytes the running plan holds on ``cuda:0`` (its parameters, counted here
from the plan's own placement), as a GPU's would be.
"""

from __future__ import annotations

import math
import types

import pytest
import torch

import models
from backends.torch import emit_live
from backends.torch.live import DeviceProbe
from cost_models.live_memory import CudaReader
from partitioner import Plan, partition
from partitioner.errors import NoPlanFits
from partitioner.plan.live import plan_that_fits

CAP = 26_000_000          # cuda:0 of the primary: mlp:small (24.5 MiB of weights) just fits
HOST_CAP = 60_000_000     # the host capped too: the fallbacks must keep this cap, not the profile's
FRACTIONS = (0.6, 0.3)


@pytest.fixture(scope="module")
def capped() -> Plan:
    module, inputs = models.get("mlp", "small", device="meta")
    return partition(module, inputs, "h200-host", memory={"cuda:0": CAP, "cpu": HOST_CAP}, fallbacks=FRACTIONS,
                     time_limit=20)


def test_every_fallback_is_planned_for_its_level_of_each_accelerator_and_the_hosts_own_cap(capped) -> None:
    primary = capped.memory
    assert primary["cuda:0"]["capacity"] == CAP and primary["cpu"]["capacity"] == HOST_CAP
    for fallback in capped.fallbacks:
        memory = fallback.plan.memory
        assert set(memory) == set(primary)
        for device, held in primary.items():
            kind = capped.devices.device(device).kind.name
            expected = held["capacity"] if kind == "CPU" else max(1, math.floor(fallback.fraction * held["capacity"]))
            assert memory[device]["capacity"] == expected, (fallback.fraction, device)
            assert memory[device]["used"] <= memory[device]["capacity"], (fallback.fraction, device)


def test_a_plan_fits_only_where_every_reported_device_has_room(capped) -> None:
    plans = (capped, *(f.plan for f in capped.fallbacks))
    gpu = [p.memory["cuda:0"]["used"] for p in plans]
    host = [p.memory["cpu"]["used"] for p in plans]
    assert host[0] < host[1]                       # the fallbacks move weights to the host
    # cuda:0 has room for the primary; the host has room for no plan but the primary
    assert plan_that_fits(capped, {"cuda:0": gpu[0], "cpu": host[0]}) == 0
    # the host has room for the primary only, cuda:0 only for the fallbacks: nothing fits
    with pytest.raises(NoPlanFits):
        plan_that_fits(capped, {"cuda:0": gpu[1], "cpu": host[0]})
    # cuda:0 too small for the primary, the host big enough for the first fallback
    assert plan_that_fits(capped, {"cuda:0": gpu[1], "cpu": host[1]}) == 1


# -- the default probe, on a CPU emulation of cuda:0 ---------------------------------------------------

def _bytes_on(plan: Plan, module: torch.nn.Module, device: str) -> int:
    """Bytes of ``module``'s parameters owned by ops ``plan`` runs on ``device`` without streaming them."""
    params = dict(module.named_parameters())
    return sum(params[name].numel() * params[name].element_size()
               for op, names in plan.param_names.items() if plan.placement[op] == device and op not in plan.weights
               for name in names if name in params)


def test_the_default_probe_counts_the_running_plans_own_weights_so_the_plan_holds(capped) -> None:
    torch.manual_seed(0)
    module, inputs = models.get("mlp", "small")
    plan = partition(module, inputs, "h200-host", memory={"cuda:0": CAP}, fallbacks=FRACTIONS, time_limit=20)
    need = [p.memory["cuda:0"]["used"] for p in (plan, *(f.plan for f in plan.fallbacks))]
    assert plan.memory["cpu"]["used"] == 0 and _bytes_on(plan, module, "cuda:0") > need[0] // 2
    live = emit_live(plan, module, {"cuda:0": "cpu"})
    assert isinstance(live.probe, DeviceProbe)
    total = need[0]                                   # the emulated GPU: room for the primary, nothing more

    def mem_get_info(index: int) -> tuple[int, int]:
        assert index == 0
        held = 0 if live.active is None else _bytes_on(live.plans[live.active], module, "cuda:0")
        return total - held, total

    cuda = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 1, mem_get_info=mem_get_info)
    live.probe.reader = CudaReader(nvml=lambda: None, torch_module=lambda: types.SimpleNamespace(cuda=cuda))
    live.probe.devices = {"cuda:0": (torch.device("cpu"), 0)}  # cuda:0's tensors sit on the CPU here
    with torch.no_grad():
        expected = module(*inputs)
        for _ in range(4):
            torch.testing.assert_close(live(*inputs), expected)
    assert live.labels[live.active] == "primary" and live.switches == 0
    assert live.probe()["cuda:0"] == total            # its own weights count as available
