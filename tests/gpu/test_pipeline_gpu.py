"""A pipeline whose stages mix a host CPU and its GPU (gloo, host tensors on the wire), checked
against the model: outputs, loss and gradients. Needs CUDA; skipped without it."""

from __future__ import annotations

import pytest
import torch

import models
from backends import get_backend
from partitioner import Plan, partition

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_a_cpu_stage_feeding_a_gpu_stage_trains_like_the_model(tmp_path):
    module, inputs = models.get("gpt", "tiny")
    # the embedding on the host CPU, the rest on its GPU: host0/cpu -> host0/cuda:0
    plan = partition(module, inputs, "2x-h200-host", objective="throughput", training=True, micro_batches=2,
                     schedule="gpipe", pins={"tok_emb*": "host0/cpu", "lm_head*": "host0/cuda:0"},
                     model_name="gpt:tiny")
    plan.save(tmp_path / "plan.json")
    plan = Plan.load(tmp_path / "plan.json")
    assert [s["device"] for s in plan.pipeline["stages"]][:2] == ["host0/cpu", "host0/cuda:0"]
    bind = {s["device"]: "cuda:0" for s in plan.pipeline["stages"] if "cuda" in s["device"]}
    report = get_backend("pipeline").check(plan, module, inputs, bind, model_spec="gpt:tiny", training=True,
                                           timeout_s=120)
    assert report.passed, report.to_text()
