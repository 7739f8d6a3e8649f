"""End to end: plans with packed weights (``precision={"weights": ...}``), emitted under strict
devices (every copy between devices exercised), equal the same packing applied to the whole model
unplaced within float tolerance, and their error against the float model is reported and small;
and the inputs that cannot make such a plan are refused by name."""

from __future__ import annotations

import pytest
import torch

import models
from backends.torch.check import check_plan
from cost_models.precision import PrecisionError
from partitioner import partition

pytest.importorskip("torchao")

#: relative L2 output error against float, random weights: int8 per-row scales, int4 grouped
BUDGET = {"int8": 0.02, "int4": 0.35}  # (gpt:small: 24 linears in a row; int4 alone is ~0.1 per linear)


def _check(module, inputs, plan):  # noqa: ANN001, ANN202
    report = check_plan(plan, module, inputs, repeat=1, strict_devices=True)
    assert report.passed, report.to_text()
    assert report.packed is not None and report.devices is not None
    return report


@pytest.mark.parametrize("weight", ["int8", "int4"])
def test_gpt_small_split_over_cpu_and_gpu_equals_the_unplaced_packing(weight: str) -> None:
    module, inputs = models.get("gpt", "small")
    plan = partition(module, inputs, "h200-host", memory={"cuda:0": "12MB"}, precision={"weights": weight},
                     time_limit=30)
    packed = plan.precision["weights"]
    assert packed and set(packed.values()) == {weight}
    assert len(set(plan.placement.values())) == 2, plan.summary()  # the cap splits it: copies between devices
    report = _check(module, inputs, plan)
    assert any(link.copies for link in report.devices.links)  # activations really crossed devices
    for name, error in report.packed.placed.items():
        assert 0 < error < BUDGET[weight], report.to_text()
        assert error == pytest.approx(report.packed.reference[name], rel=1e-3, abs=1e-5)
    emitted = plan.emit(module, {"cuda:0": "cpu"})
    assert f"linear_{weight}" in emitted.code
    params, buffers = dict(emitted.named_parameters()), dict(emitted.named_buffers())
    assert "blocks.0.attn.q_proj.weight" not in params  # the float weight is gone, its packed form is there
    assert f"blocks.0.attn.q_proj.weight_{weight}_qweight" in buffers


def test_seed_model_packs_its_dense_layers_and_keeps_the_embedding() -> None:
    module, inputs = models.get("emb-transformer", "tiny")
    plan = partition(module, inputs, "h200-host", precision={"weights": "int8"}, time_limit=30,
                     pins={"*embed*": "cpu"})
    assert plan.precision["weights"]
    assert not any("embed" in op for op in plan.precision["weights"])  # a gather's table is not a linear
    report = _check(module, inputs, plan)
    assert report.packed.worst < BUDGET["int8"]


def test_hf_llama_small_config_packed_int8_on_two_devices() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                      tie_word_embeddings=True)
    torch.manual_seed(0)
    module = transformers.LlamaForCausalLM(config).eval()
    module.config.use_cache = False
    inputs = (torch.randint(0, 256, (1, 16)),)
    plan = partition(module, inputs, "h200-host", precision={"weights": "int8"}, time_limit=30,
                     pins={"model.layers.1*": "cuda:0", "model.layers.0*": "cpu"})
    assert plan.precision["weights"]
    report = _check(module, inputs, plan)
    assert report.packed.worst < BUDGET["int8"]


def test_bad_inputs_are_refused_by_name() -> None:
    module, inputs = models.get("mlp", "tiny")
    with pytest.raises(PrecisionError, match="no device of profile 't4-flexgen' has a int8"):
        partition(module, inputs, "t4-flexgen", precision={"weights": "int8"})
    with pytest.raises(PrecisionError, match="cpu has no float8 weight-only kernel.*int8, int4"):
        partition(module, inputs, "h200-host", precision={"weights": {"cpu": "fp8"}})
    with pytest.raises(PrecisionError, match="not a weight dtype.*int8, int4, float8"):
        partition(module, inputs, "h200-host", precision={"weights": "int3"})
    with pytest.raises(PrecisionError, match="training=True.*drop weights"):
        partition(module.train(), inputs, "h200-host", precision={"weights": "int8"}, training=True)
