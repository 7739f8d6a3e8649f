"""End to end: plans that split linears over three devices, emitted in one process under strict devices.

On ``2xh200-host`` (``cpu``, ``cuda:0``, ``cuda:1``, each bound to its own CPU tag, so a shard
reading a tensor from another device fails the run) every splittable linear is split over all three
devices, cycling through both axes, the three homes, and even or rate-proportional fractions
(``SplitOptions(degrees=(3,))``). Outputs and every parameter's gradient (a split weight's three
shards joined under the original name) equal the original model's; the run's copies and the bytes
resident per device equal the plan's; ``state_dict`` keeps the original's keys and values. The
models: ``gpt:small`` and an HF Llama from a small ``transformers`` config.
"""

from __future__ import annotations

import itertools
import json

import pytest
import torch

import models
from partitioner import Plan, from_module, load_profile
from partitioner.solvers.problem import Options, Placement, Problem, Solution, Status, evaluate
from partitioner.solvers.splits import SplitOptions, even_shares
from partitioner.verify import verify_placement
from backends.compare import compare
from backends.torch.splits import joined_gradients
from tests.e2e.test_emit import _loss, _outputs, emit_strict, strict_step

#: A gradient that is zero in exact arithmetic (a key projection's bias under softmax) is rounding
#: noise in both runs; below this share of the model's largest gradient both are taken as zero.
NOISE = 1e-8


def _three_way_plan(module: torch.nn.Module, inputs: tuple) -> Plan:
    """Every splittable linear split over cpu, cuda:0 and cuda:1 (axes, homes and fractions cycling);
    the rest on the host: a valid plan (evaluate, verify and the plan's own checks pass)."""
    problem = Problem(from_module(module, inputs), load_profile("2xh200-host"),
                      Options(streaming=False, splits=SplitOptions(degrees=(3,), balanced=False)))
    host = problem.host
    device = {n: host for n in problem.nodes}
    split = {}
    kinds = itertools.cycle(itertools.product(("cols", "rows"), ("cpu", "cuda:0", "cuda:1"), (True, False)))
    for n, choices in problem.split_choices.items():
        assert {len(s.devices) for s in choices} == {3}
        for axis, home, even in kinds:
            sp = next((s for s in choices if s.axis == axis and s.home == home
                       and (s.fractions == even_shares(3)) == even), None)
            if sp is not None:
                break
        split[n], device[n] = sp, sp.home
    placement = Placement(device, split=split)
    ev = evaluate(problem, placement)
    assert ev.feasible, ev.violations
    verify_placement(problem, placement, ev)
    plan = Plan.from_solution(problem, Solution("by hand", placement, Status.HEURISTIC), ev)
    assert len(plan.splits) == len(split) >= 4
    return plan


def _check(plan: Plan, model: torch.nn.Module, inputs: tuple) -> torch.nn.Module:
    """The emitted plan under strict devices: outputs and joined gradients equal the original's."""
    emitted, run = emit_strict(plan, model)
    with torch.no_grad():
        expected = _outputs(model(*inputs))
        got = strict_step(run, emitted, inputs)  # copies and resident bytes equal the plan's
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g.cpu(), e, rtol=1e-4, atol=1e-5)
    model.zero_grad()
    _loss(_outputs(model(*inputs))).backward()
    _loss(strict_step(run, emitted, inputs)).backward()
    ours = joined_gradients(emitted)
    largest = max(p.grad.abs().max().item() for p in model.parameters() if p.grad is not None)
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        assert ours.get(name) is not None, f"no gradient for {name}"
        error = compare(name, ours[name], p.grad, summed=True)  # as `hetpart check` compares a sum
        noise = max(p.grad.abs().max().item(), ours[name].abs().max().item()) <= NOISE * largest
        assert error.passed or noise, error
    return emitted


def test_gpt_small_with_its_linears_split_three_ways_equals_the_original(tmp_path) -> None:
    model, inputs = models.get("gpt", "small")
    plan = _three_way_plan(model, inputs)
    assert {e["axis"] for e in plan.splits.values()} == {"cols", "rows"}
    assert {e["devices"][0] for e in plan.splits.values()} == {"cpu", "cuda:0", "cuda:1"}
    assert {len(e["devices"]) for e in plan.splits.values()} == {3}
    assert len({tuple(e["fractions"]) for e in plan.splits.values()}) > 1  # even and rate-proportional
    path = tmp_path / "three.json"
    plan.save(path)
    loaded = Plan.load(path)
    assert loaded == plan
    emitted = _check(loaded, model, inputs)
    state = emitted.state_dict()
    assert list(state) == [k for k in model.state_dict() if k in state] and set(state) == set(model.state_dict())
    for key, value in model.state_dict().items():
        torch.testing.assert_close(state[key].cpu(), value)


def test_an_hf_llama_with_its_linears_split_three_ways_equals_the_original() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 256, (2, 16))

    class Logits(torch.nn.Module):
        def __init__(self, lm: torch.nn.Module) -> None:
            super().__init__()
            self.lm = lm

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.lm(input_ids=input_ids, use_cache=False).logits

    wrapped = Logits(model).eval()
    plan = _three_way_plan(wrapped, (ids,))
    assert any(op for op in plan.splits if "lm_head" in plan.modules[op])
    _check(plan, wrapped, (ids,))


def test_a_three_way_split_whose_fractions_do_not_sum_to_one_is_refused(tmp_path) -> None:
    model, inputs = models.get("gpt", "small")
    data = json.loads(_three_way_plan(model, inputs).to_json())
    op = next(iter(data["splits"]))
    data["splits"][op]["fractions"] = [0.5, 0.3, 0.3]
    (tmp_path / "sum.json").write_text(json.dumps(data))
    with pytest.raises(Exception, match=rf"splits\[\"{op}\"\].fractions: op '{op}' split .* do not sum to one "
                                        r"\(their sum is 1.1"):
        Plan.load(tmp_path / "sum.json")
    data["splits"][op]["fractions"] = [0.5, 0.5]
    (tmp_path / "count.json").write_text(json.dumps(data))
    with pytest.raises(Exception, match=r"2 fractions for 3 devices; give one fraction per device"):
        Plan.load(tmp_path / "count.json")
