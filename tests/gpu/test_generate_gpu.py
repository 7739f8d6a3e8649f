"""Generation on a real GPU: the emitted prefill and decode loop with the cache split between the
host and the GPU, and weights streamed in the prefill.

Skipped without CUDA (marker ``gpu``; ``bench/gpu_check.py`` runs these first). What each test shows:

* a joint plan with one layer pinned to cuda:0 gives transformers' greedy tokens (computed on the
  CPU) for 32 new tokens, with each layer's cache on its planned device;
* a plan whose prefill streams weights the decode step computes on the CPU runs with those weights
  in pinned host memory (copies on the streamer's side stream), shared by both phases' modules.
"""

from __future__ import annotations

import pytest
import torch

from backends.torch.generate_check import reference_greedy
from partitioner import plan_generation
from tests.e2e.generation_models import ARCHITECTURES, build, weight_bytes

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _plan(model: torch.nn.Module, pins: dict[str, str]):
    return plan_generation(model, "h200-host", memory={"cuda:0": int(weight_bytes(model) * 0.6)},
                           prompt_tokens=64, new_tokens=32, time_limit=30, pins=pins)


def test_generate_on_the_gpu_equals_the_original_greedy_tokens() -> None:
    model = build("llama")
    gen = _plan(model, {ARCHITECTURES["llama"][1]: "cuda:0"})
    generator = gen.emit_generate(model)
    inner = generator.prefill_module.get_submodule("inner")
    devices = {getattr(inner, f"key_cache_{i}").device.type for i in range(2)}
    assert "cuda" in devices
    ids = torch.randint(3, 4000, (1, 11))
    tokens = generator.generate(ids, max_new_tokens=32)
    want, want_logits = reference_greedy(model, ids, 32)
    assert torch.equal(tokens, want)
    torch.testing.assert_close(generator.last_logits, want_logits, rtol=2e-3, atol=2e-3)


def test_weights_streamed_in_the_prefill_are_pinned_and_shared() -> None:
    model = build("llama")
    gen = _plan(model, {})
    streamed = [op for op, home in gen.prefill.weights.items() if gen.prefill.placement[op] != home]
    assert streamed, "the joint plan was expected to stream weights in the prefill"
    generator = gen.emit_generate(model)
    names = [n for op in streamed for n in gen.prefill.param_names.get(op, ())]
    for name in names:
        owner, _, attr = name.rpartition(".")
        tensor = getattr(generator.prefill_module.get_submodule(owner), attr)
        assert tensor.device.type == "cpu" and tensor.is_pinned()
        assert getattr(generator.decode_module.get_submodule(owner), attr) is tensor
    ids = torch.randint(3, 4000, (1, 64))
    assert torch.equal(generator.generate(ids, max_new_tokens=16), reference_greedy(model, ids, 16)[0])
