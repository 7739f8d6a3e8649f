"""Live device state on a real GPU: a blocker tensor takes most of the memory, ``--devices detect``
plans within what is left, and the live module switches to a fallback when more is taken.

Skipped without CUDA (marker ``gpu``; ``bench/gpu_check.py`` runs these first). What each test shows:

* with all but ~1 GiB of the GPU's free memory held by a blocker tensor, ``DeviceSet.detect``
  (NVML or ``torch.cuda.mem_get_info``, never the profile's figure here) caps ``cuda:0`` below the
  free memory, the plan of a 512 MiB tower fits the cap (so it cannot hold every weight on the GPU),
  and the emitted module runs there, peaking within the free memory, with the tower's outputs;
* with fallbacks at 0.5 and 0.25, a second blocker taking most of what was left makes the live
  module (its default probe: free memory plus its own weights there) leave the primary plan for a
  fallback that fits, outputs unchanged.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from backends.torch import emit_live
from cost_models.profiles import DeviceSet
from partitioner import partition
from tests.gpu.tower import Tower

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

WIDTH, DEPTH, BATCH = 4096, 8, 256       # 64 MiB of fp32 weights per layer, 512 MiB in all
LEFT_FREE = 1024 * 2**20                 # what the blocker leaves free
MARGIN = "128MiB"


def blocker(leave: int) -> torch.Tensor:
    """A tensor taking all the GPU's free memory but ``leave`` bytes."""
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    return torch.empty(max(0, free - leave), dtype=torch.uint8, device="cuda")


@pytest.fixture(scope="module")
def tower() -> tuple[nn.Module, tuple[torch.Tensor, ...], torch.Tensor]:
    torch.manual_seed(0)
    model = Tower(WIDTH, DEPTH).eval()
    inputs = (torch.randn(BATCH, WIDTH) / WIDTH**0.5,)
    with torch.no_grad():
        expected = model(*inputs)
    return model, inputs, expected


def test_detect_plans_within_the_memory_a_blocker_leaves(tower) -> None:  # noqa: ANN001
    model, inputs, expected = tower
    block = blocker(LEFT_FREE // 2)  # the tower (512 MiB) cannot sit whole in what is left
    try:
        profile = DeviceSet.detect("h200-host", margin=MARGIN)
        reading = profile.probe.readings[0]
        assert reading.source in ("nvml", "torch"), profile.probe.notes
        free_now = torch.cuda.mem_get_info()[0]
        cap = profile.device("cuda:0").memory
        assert cap <= free_now
        plan = partition(model, inputs, profile, time_limit=30)
        assert plan.probe["devices"]["cuda:0"]["source"] == reading.source
        assert plan.memory["cuda:0"]["used"] <= cap
        emitted = plan.emit(model)
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        with torch.no_grad():
            out = emitted(*inputs)
        torch.cuda.synchronize()
        assert torch.cuda.max_memory_allocated() - before <= free_now
        torch.testing.assert_close(out.cpu(), expected, rtol=1e-3, atol=1e-3)
    finally:
        del block
        torch.cuda.empty_cache()


def test_the_live_module_switches_when_a_second_blocker_arrives(tower) -> None:  # noqa: ANN001
    model, inputs, expected = tower
    block = blocker(LEFT_FREE)
    try:
        profile = DeviceSet.detect("h200-host", margin=MARGIN)
        plan = partition(model, inputs, profile, fallbacks=[0.5, 0.25], time_limit=30)
        need = [p.memory["cuda:0"]["used"] for p in (plan, *(f.plan for f in plan.fallbacks))]
        assert need[0] > need[-1]
        live = emit_live(plan, model)
        with torch.no_grad():
            first = live(*inputs)
        assert live.labels[live.active] == "primary"
        torch.testing.assert_close(first.cpu(), expected, rtol=1e-3, atol=1e-3)
        # the probe counts the running plan's own weights as available (a switch frees them): leave
        # free less than the primary needs beyond them, so that only a fallback fits
        resident = live.probe.resident(torch.device("cuda:0"))
        more = blocker(max(need[0] - resident - 64 * 2**20, 16 * 2**20))
        try:
            assert live.probe()["cuda:0"] < need[0]
            with torch.no_grad():
                second = live(*inputs)
            assert live.active != 0 and live.switches == 1
            torch.testing.assert_close(second.cpu(), expected, rtol=1e-3, atol=1e-3)
        finally:
            del more
    finally:
        del block
        torch.cuda.empty_cache()
