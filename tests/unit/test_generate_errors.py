"""What the emitted generate loop refuses, each with a sentence naming the thing and the fix."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from backends.torch.sampling import Sampling, next_token
from partitioner import plan_generation
from partitioner.errors import CaptureError, GenerationError, HetpartError, PlanMismatch
from models.gpt import CONFIGS, GPT


def _llama(seed: int = 0, layers: int = 2) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                        max_position_embeddings=64)).eval()


@pytest.fixture(scope="module")
def planned():
    model = _llama()
    gen = plan_generation(model, "h200-host", memory={"cuda:0": "300KB"}, prompt_tokens=8, new_tokens=8,
                          time_limit=10, pins={"inner.model.model.layers.1*": "cuda:0"})
    return model, gen, gen.emit_generate(model, {"cuda:0": "cpu"})


@pytest.mark.parametrize("call, words", [
    (lambda g: g.generate(torch.zeros(1, 9, dtype=torch.long)), "longer than the planned prefill of 8"),
    (lambda g: g.generate(torch.zeros(2, 4, dtype=torch.long)), "re-plan with --batch 2"),
    (lambda g: g.generate(torch.zeros(1, 8, dtype=torch.long), max_new_tokens=9), "holds 16"),
    (lambda g: g.generate(torch.zeros(1, 4, dtype=torch.long), max_new_tokens=0), "positive integer"),
    (lambda g: g.generate(torch.zeros(1, 4)), "integer token ids"),
    (lambda g: g.generate([[1, 2]]), "must be a tensor"),
    (lambda g: g.generate(torch.full((1, 4), 300)), "outside the vocabulary of 256"),
    (lambda g: g.generate(torch.ones(1, 4, dtype=torch.long), attention_mask=torch.tensor([[0, 1, 1, 1]])),
     "prompts of different lengths one by one"),
    (lambda g: g.generate(torch.ones(1, 4, dtype=torch.long), top_k=3), "pass do_sample=True"),
    (lambda g: g.generate(torch.ones(1, 4, dtype=torch.long), do_sample=True, temperature=0), "above 0"),
    (lambda g: g.generate(torch.ones(1, 4, dtype=torch.long), do_sample=True, top_p=1.5), "(0, 1]"),
    (lambda g: g.generate(torch.ones(1, 4, dtype=torch.long), do_sample=True, top_k=0), "positive integer"),
    (lambda g: g.generate(torch.ones(1, 4, dtype=torch.long), do_sample=True, seed=-1), "non-negative"),
    (lambda g: g.decode_one(torch.ones(1, dtype=torch.long), 16), "outside the cache of 16"),
])
def test_bad_requests_are_refused_by_name(planned, call, words: str) -> None:
    _, _, generator = planned
    with pytest.raises(GenerationError) as err:
        call(generator)
    assert words in str(err.value)


def test_a_request_after_a_refusal_still_equals_the_original(planned) -> None:
    model, _, generator = planned
    with pytest.raises(GenerationError):
        generator.generate(torch.zeros(1, 20, dtype=torch.long))
    ids = torch.randint(3, 250, (1, 6))
    want = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert torch.equal(generator.generate(ids, max_new_tokens=8), want)
    with pytest.raises(HetpartError, match="strict_devices=True"):
        generator.device_reports()


def test_a_different_model_or_binding_is_refused(planned) -> None:
    _, gen, _ = planned
    with pytest.raises(PlanMismatch):
        gen.emit_generate(_llama(layers=3), {"cuda:0": "cpu"})
    with pytest.raises(CaptureError, match="not a causal language model"):
        gen.emit_generate(torch.nn.Linear(2, 2), {"cuda:0": "cpu"})
    with pytest.raises(HetpartError, match="drop device_map"):
        gen.emit_generate(_llama(), {"cuda:0": "cpu"}, strict_devices=True)
    with pytest.raises(HetpartError, match="bind it to a present device"):
        gen.emit_generate(_llama())  # cuda:0 is not on this machine


def test_the_zoo_gpt_cache_equals_its_full_forward_and_refuses_a_long_context() -> None:
    torch.manual_seed(0)
    gpt = GPT(CONFIGS["tiny"]).eval()
    ids = torch.randint(0, 128, (2, 10))
    step = gpt.with_static_cache(2, 16)
    with torch.no_grad():
        pieces = [step(ids[:, :6], torch.arange(6))]
        pieces += [step(ids[:, p:p + 1], torch.tensor([p])) for p in range(6, 10)]
        torch.testing.assert_close(torch.cat(pieces, dim=1), gpt(ids), rtol=1e-5, atol=1e-5)
    with pytest.raises(CaptureError, match="16 positions"):
        plan_generation(gpt, "h200-host", prompt_tokens=10, new_tokens=10)


def test_sampling_takes_transformers_order_and_keeps_the_nucleus() -> None:
    logits = torch.tensor([[0.0, 3.0, 2.9, -5.0]])
    assert next_token(logits, Sampling.build()).tolist() == [1]
    s = Sampling.build(do_sample=True, top_p=0.5, seed=0)
    drawn = {int(next_token(logits, s, g)) for g in [s.generator()] for _ in range(30)}
    assert drawn <= {1, 2}
    s = Sampling.build(do_sample=True, top_k=1, seed=3)
    assert {int(next_token(logits, s, s.generator())) for _ in range(5)} == {1}


def test_gpt2_eos_stops_like_transformers() -> None:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=64,
                                       bos_token_id=1, eos_token_id=2)).eval()
    gen = plan_generation(model, "h200-host", prompt_tokens=8, new_tokens=24, time_limit=10)
    generator = gen.emit_generate(model, {"cuda:0": "cpu"})
    ids = torch.randint(3, 60, (1, 5))
    first = generator.generate(ids, max_new_tokens=24)
    eos = int(first[0, 7])  # the third new token: call it the end
    stopped = generator.generate(ids, max_new_tokens=24, eos_token_id=eos, pad_token_id=0)
    want = model.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=eos, pad_token_id=0)
    assert torch.equal(stopped, want)
    assert stopped.shape[1] <= 8 < first.shape[1]


def test_a_plan_made_on_meta_names_the_layout_copies_a_real_capture_lacks() -> None:
    config = _llama().config
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        hollow = LlamaForCausalLM(config).eval()
    gen = plan_generation(hollow, "h200-host", prompt_tokens=8, new_tokens=8, time_limit=10)
    real = LlamaForCausalLM(config).eval()
    with pytest.raises(PlanMismatch, match="another memory layout") as err:
        gen.emit_generate(real, {"cuda:0": "cpu"})
    assert "model folder" in str(err.value)


def test_transformers_generate_arguments_work_as_transformers_reads_them(planned) -> None:
    from transformers import GenerationConfig

    model, _, generator = planned
    ids = torch.randint(3, 250, (1, 6))
    want = model.generate(ids, max_new_tokens=8, do_sample=False, return_dict_in_generate=True, output_logits=True)
    got = generator.generate(ids, max_new_tokens=8, return_dict_in_generate=True, output_logits=True)
    assert torch.equal(got.sequences, want.sequences) and len(got.logits) == len(want.logits)
    torch.testing.assert_close(torch.stack(got.logits), torch.stack(want.logits), rtol=1e-4, atol=1e-4)
    assert torch.equal(generator.generate(ids, max_length=14), want.sequences)
    config = GenerationConfig(max_new_tokens=8, do_sample=False, eos_token_id=None)
    assert torch.equal(generator.generate(ids, generation_config=config),
                       model.generate(ids, generation_config=config))
    sampled = GenerationConfig(max_new_tokens=5, do_sample=True, top_k=3)
    assert generator.generate(ids, generation_config=sampled, seed=4).shape == (1, 11)
    with pytest.raises(GenerationError, match="beam search is not planned"):
        generator.generate(ids, num_beams=4)
    with pytest.raises(GenerationError, match="does not take repetition_penalty"):
        generator.generate(ids, repetition_penalty=1.2)
