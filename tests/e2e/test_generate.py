"""The emitted generate loop equals the original model's greedy decoding, under strict devices.

Each plan is a real joint solve (plan_generation, HiGHS) on h200-host with cuda:0 capped; one layer is
pinned to cuda:0 so that both phases compute on both devices and the KV cache is split between them,
and every copy of a cache entry, a weight or an activation is one the emitted code makes."""

from __future__ import annotations

import pytest
import torch

from backends.torch.generate_check import reference_greedy
from partitioner import plan_generation
from tests.e2e.generation_models import ARCHITECTURES, build, weight_bytes

PROMPT, NEW = 64, 32


def _plan(model: torch.nn.Module, pin: str | None, *, fraction: float = 0.6, batch: int = 1):
    pins = {pin: "cuda:0"} if pin else {}
    return plan_generation(model, "h200-host", memory={"cuda:0": int(weight_bytes(model) * fraction)},
                           prompt_tokens=PROMPT, new_tokens=NEW, sequences=batch, time_limit=30, pins=pins)


def _copies(report) -> int:
    return sum(row.copies for row in report.links)


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_generate_equals_the_original_greedy_tokens_under_strict_devices(name: str) -> None:
    model = build(name)
    gen = _plan(model, ARCHITECTURES[name][1])
    for phase in (gen.prefill, gen.decode):
        assert {"cpu", "cuda:0"} <= set(phase.placement.values())
    cache_homes = {gen.prefill.weights.get(op, gen.prefill.placement[op])
                   for op, names in gen.prefill.param_names.items() for n in names if "cache" in n.rsplit(".", 1)[-1]}
    assert cache_homes == {"cpu", "cuda:0"}  # the cache lives on both devices
    generator = gen.emit_generate(model, strict_devices=True)
    torch.manual_seed(1)
    ids = torch.randint(3, 4000, (1, 11))
    tokens = generator.generate(ids, max_new_tokens=NEW)
    want, want_logits = reference_greedy(model, ids, NEW)
    assert torch.equal(tokens, want)
    torch.testing.assert_close(generator.last_logits, want_logits[:, :generator.last_logits.shape[1]],
                               rtol=1e-4, atol=1e-4)
    reports = generator.device_reports()
    for phase in ("prefill", "decode"):
        assert reports[phase].passed, reports[phase].to_text()
        assert _copies(reports[phase]) > 0
    assert len(generator.timings["decode_s"]) == tokens.shape[1] - ids.shape[1] - 1


@pytest.mark.parametrize("name", ["llama", "mistral"])
def test_phases_placed_differently_share_one_cache_and_still_equal_the_original(name: str) -> None:
    model = build(name)
    gen = _plan(model, None)
    differ = gen.phase_difference()
    assert differ, "the joint plan was expected to use some weight differently in the two phases"
    assert any("streamed" in prefill for _, prefill, _ in differ)  # the prefill streams what the decode does not
    generator = gen.emit_generate(model, strict_devices=True)
    assert generator.decode_module.get_submodule("inner").key_cache_0 is \
        generator.prefill_module.get_submodule("inner").key_cache_0
    ids = torch.randint(3, 4000, (1, PROMPT))  # a prompt of the planned length: no padding
    tokens = generator.generate(ids, max_new_tokens=NEW)
    want, _ = reference_greedy(model, ids, NEW)
    assert torch.equal(tokens, want)
    assert all(r.passed for r in generator.device_reports().values())


def test_a_batch_of_two_and_a_smaller_batch_on_a_bound_device() -> None:
    model = build("llama")
    gen = _plan(model, ARCHITECTURES["llama"][1], batch=2)
    generator = gen.emit_generate(model, {"cuda:0": "cpu"})
    ids = torch.randint(3, 4000, (2, 9))
    want, _ = reference_greedy(model, ids, 16)
    assert torch.equal(generator.generate(ids, max_new_tokens=16), want)
    one, _ = reference_greedy(model, ids[:1], 16)
    assert torch.equal(generator.generate(ids[:1], max_new_tokens=16), one)  # a row of padding rides along


def test_sampling_repeats_with_its_seed_and_keeps_to_top_k() -> None:
    model = build("gpt2")
    gen = _plan(model, ARCHITECTURES["gpt2"][1])
    generator = gen.emit_generate(model, {"cuda:0": "cpu"})
    ids = torch.randint(3, 4000, (1, 5))
    state = torch.random.get_rng_state()
    first = generator.generate(ids, max_new_tokens=12, do_sample=True, top_k=5, temperature=0.8, seed=7)
    again = generator.generate(ids, max_new_tokens=12, do_sample=True, top_k=5, temperature=0.8, seed=7)
    assert torch.equal(first, again)
    assert torch.equal(torch.random.get_rng_state(), state)  # the process's random state is left alone
    for step in range(first.shape[1] - ids.shape[1]):
        top = generator.last_logits[0, step].topk(5).indices
        assert first[0, ids.shape[1] + step] in top
    other = [generator.generate(ids, max_new_tokens=12, do_sample=True, seed=s) for s in range(4)]
    assert any(not torch.equal(o, other[0]) for o in other[1:])
    greedy = generator.generate(ids, max_new_tokens=12)
    assert torch.equal(greedy, reference_greedy(model, ids, 12)[0])
