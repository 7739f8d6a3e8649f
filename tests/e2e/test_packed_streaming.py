"""End to end: packed weights streamed from host memory. Plans whose GPU cap is too small for the
packed weights stream some of them packed (``precision.streamed``); emitted under strict devices
(every logical device on its own CPU tag, each op on its planned device, every copy seen) they
equal the same packing applied to the whole model unplaced, each streamed linear's packed tensors
live on the host and are fetched through the streamer every call, and the bytes crossing the link
are the plan's (packed values and scales, not float weights)."""

from __future__ import annotations

import pytest
import torch

import models
from backends.torch.check import check_plan
from partitioner import partition
from partitioner.errors import HetpartError

pytest.importorskip("torchao")

BUDGET = {"int8": 0.02, "int4": 0.35}  # relative L2 output error against float (see test_packed_weights.py)


def _llama():  # noqa: ANN202
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                      tie_word_embeddings=True)
    torch.manual_seed(0)
    module = transformers.LlamaForCausalLM(config).eval()
    module.config.use_cache = False
    return module, (torch.randint(0, 256, (1, 16)),)


def _check_streamed_packed(module, inputs, plan, weight: str) -> None:  # noqa: ANN001
    streamed = plan.precision.get("streamed", {})
    assert streamed, plan.summary()  # the cap makes the plan stream packed weights
    assert set(streamed) <= set(plan.weights) and set(streamed) <= set(plan.precision["weights"])
    assert all(plan.precision["weights"][op] == weight for op in streamed)
    assert all(nbytes == plan.precision["weight_bytes"][op] for op, nbytes in streamed.items())
    # the plan's weight copies carry the packed bytes of the packed linears (with their float32
    # biases) and the float32 bytes of any other streamed op (activations stay float32 here)
    weight_copies = sum(t.bytes for t in plan.transfers if t.kind == "weights")
    others = sum(plan.op_bytes[op][1] for op in plan.weights if op not in streamed)
    assert weight_copies == sum(streamed.values()) + others
    assert sum(streamed.values()) < sum(plan.op_bytes[op][1] for op in streamed) / 3  # packed, not float

    report = check_plan(plan, module, inputs, repeat=1, strict_devices=True)
    assert report.passed, report.to_text()  # outputs, copies (tensor, devices, bytes) and resident bytes
    host, gpu = plan.devices.host_device().name, "cuda:0"
    (link,) = [row for row in report.devices.links if (row.src, row.dst) == (host, gpu)]
    assert link.bytes == link.plan_bytes and link.bytes >= sum(streamed.values())
    for name, error in report.packed.placed.items():
        assert 0 < error < BUDGET[weight], report.to_text()
        assert error == pytest.approx(report.packed.reference[name], rel=1e-3, abs=1e-5)

    emitted = plan.emit(module, {gpu: "cpu"})
    buffers = dict(emitted.named_buffers())
    names = {op: n for op, ns in plan.param_names.items() for n in ns[:1]}
    for op in streamed:
        weight_name = names[op]
        fetched = f"_hetpart_streamer.get('{weight_name}_{weight}_qweight'"
        assert fetched in emitted.code, emitted.code  # fetched every call, not resident
        assert f"{weight_name}_{weight}_qweight" in buffers
        assert weight_name not in dict(emitted.named_parameters())  # the float weight is gone


@pytest.mark.parametrize(("weight", "cap"), [("int8", "4MB"), ("int4", "2MB")])
def test_gpt_small_streams_packed_weights_as_planned(weight: str, cap: str) -> None:
    module, inputs = models.get("gpt", "small")
    plan = partition(module, inputs, "h200-host", memory={"cuda:0": cap}, precision={"weights": weight},
                     time_limit=30)
    _check_streamed_packed(module, inputs, plan, weight)


@pytest.mark.parametrize(("weight", "cap"), [("int8", "64KB"), ("int4", "40KB")])
def test_hf_llama_small_config_streams_packed_weights_as_planned(weight: str, cap: str) -> None:
    module, inputs = _llama()
    plan = partition(module, inputs, "h200-host", memory={"cuda:0": cap}, precision={"weights": weight},
                     time_limit=30, pins={"model.layers.*": "cuda:0"})
    _check_streamed_packed(module, inputs, plan, weight)


def test_emit_source_refuses_streamed_packed_weights_by_name(tmp_path) -> None:  # noqa: ANN001
    module, inputs = models.get("gpt", "small")
    plan = partition(module, inputs, "h200-host", memory={"cuda:0": "4MB"}, precision={"weights": "int8"},
                     time_limit=30)
    assert plan.precision.get("streamed")
    with pytest.raises(HetpartError, match=r"packs the weights of 24 linears \(precision.weights\).*emit_source"):
        plan.emit_source(tmp_path / "placed.py", module, {"cuda:0": "cpu"})
