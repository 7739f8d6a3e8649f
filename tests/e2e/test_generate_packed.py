"""Generation plans with precision: packed weights (int8, int4) and 16-bit compute, planned jointly for
the prefill and the decode step, emitted as one generate loop under strict devices.

Each plan is a real joint solve on h200-host with one layer pinned to cuda:0 (so both phases compute
on both devices and weights are packed on each), checked three ways: the greedy tokens equal those of
the same plan run unplaced on the host (the packed reference: the same packing and casts, no
placement), every copy and resident byte is the plan's (strict devices), and each packed weight is
held once, by the prefill and the decode module alike."""

from __future__ import annotations

import pytest
import torch

from backends.torch.generate_check import check_generation
from backends.torch.packed import PACKED_ATTR
from partitioner import plan_generation
from tests.e2e.generation_models import ARCHITECTURES, build, weight_bytes

pytest.importorskip("torchao")

PROMPT, NEW = 16, 8
#: relative L2 error of the logits against the float model (random weights): int8 per-row scales,
#: int4 grouped scales (two layers of random weights: int4 alone is ~0.1 per linear)
BUDGET = {"int8": 0.05, "int4": 0.5, None: 0.02}


def _plan(model: torch.nn.Module, name: str, precision):  # noqa: ANN001, ANN202
    return plan_generation(model, "h200-host", memory={"cuda:0": int(weight_bytes(model) * 0.6)},
                           prompt_tokens=PROMPT, new_tokens=NEW, time_limit=30,
                           pins={ARCHITECTURES[name][1]: "cuda:0"}, precision=precision)


@pytest.mark.parametrize(("name", "weight"), [("llama", "int8"), ("llama", "int4"), ("zoo-gpt", "int8"),
                                              ("zoo-gpt", "int4")])
def test_packed_generation_equals_the_unplaced_packing_under_strict_devices(name: str, weight: str) -> None:
    model = build(name)
    gen = _plan(model, name, {"weights": weight})
    for phase in (gen.prefill, gen.decode):
        assert {"cpu", "cuda:0"} <= set(phase.placement.values())
        packed_on = {phase.placement[op] for op in phase.precision["weights"]}
        assert packed_on == {"cpu", "cuda:0"}, packed_on  # packed weights on both devices
        assert set(phase.precision["weights"].values()) == {weight}
    assert gen.precision["prefill"]["weight_bytes"] == gen.precision["decode"]["weight_bytes"]

    report = check_generation(gen, model, NEW, strict_devices=True)
    assert report.passed, report.to_text()
    assert report.equal_tokens == report.compared_tokens == NEW
    assert report.precision is not None and report.precision.weights == {weight: len(gen.decode.precision["weights"])}
    assert 0 < report.precision.placed < BUDGET[weight], report.to_text()
    assert report.precision.placed == pytest.approx(report.precision.reference, rel=1e-3, abs=1e-6)
    text = report.to_text()
    assert "against the float model" in text and text.splitlines()[-1].startswith("verdict: PASSED")
    for phase in ("prefill", "decode"):  # resident bytes are the plan's: no weight held twice
        assert report.strict[phase].passed


def test_both_modules_read_one_set_of_packed_buffers_and_no_float_weight() -> None:
    model = build("llama")
    gen = _plan(model, "llama", {"weights": "int8"})
    generator = gen.emit_generate(model, {"cuda:0": "cpu"})
    pre, dec = generator.prefill_module, generator.decode_module
    packed = getattr(pre, PACKED_ATTR)
    assert packed and set(getattr(dec, PACKED_ATTR)) == set(packed)
    for buffer, weight in packed.items():
        assert pre.get_buffer(buffer) is dec.get_buffer(buffer)  # one tensor, not a copy
        for module in (pre, dec):
            owner, _, attr = weight.rpartition(".")
            assert not hasattr(module.get_submodule(owner), attr), weight  # the float weight is gone
    ids = torch.randint(3, 4000, (1, 9))
    unplaced = gen.emit_generate(model, {d: "cpu" for d in gen.prefill.devices.names()})
    assert torch.equal(generator.generate(ids, max_new_tokens=NEW), unplaced.generate(ids, max_new_tokens=NEW))


def test_16_bit_generation_shares_its_16_bit_weights() -> None:
    model = build("llama")
    gen = _plan(model, "llama", {"cuda:0": "bf16"})
    assert gen.decode.precision["ops"] and gen.prefill.precision["ops"]
    report = check_generation(gen, model, NEW, strict_devices=True)
    assert report.passed, report.to_text()
    assert report.precision is not None and report.precision.low_ops > 0
    assert report.precision.placed < BUDGET[None], report.to_text()
    generator = gen.emit_generate(model, {"cuda:0": "cpu"})
    low = [name for name, t in generator.prefill_module.named_parameters() if t.dtype == torch.bfloat16]
    assert low  # the weights of ops computing in bfloat16 are stored so, once
    for name in low:
        assert generator.decode_module.get_parameter(name) is generator.prefill_module.get_parameter(name)
