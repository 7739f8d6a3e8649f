"""End to end: plans that split linears in time (weight chunks streamed from the host), emitted in one
process under strict devices.

Each logical device is bound to its own CPU tag (:mod:`backends.torch.strict`): a chunk computed
from a weight left on the host, or a chunk fetched twice, fails the run. Outputs equal the original
model's; the run's copies (each chunk's fetch, counted as the op's one ``split`` transfer) and the
bytes resident per device (the weight on the host, only the bias on the accelerator) equal the
plan's; ``state_dict`` keeps the original's keys and values, and ``load_state_dict`` cuts them.

The plans: the ILP's (a 16 MiB head over a 24 MiB cap), and ``gpt:small`` with every block linear
split in time by hand (2 to 7 chunks, even and uneven) through :meth:`Plan.from_solution`.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import models
from partitioner import Plan, from_module, load_profile
from partitioner.solvers.problem import Options, Placement, Problem, Solution, Status, evaluate
from partitioner.solvers.splits import SplitOptions
from partitioner.verify import verify_placement
from tests.e2e.test_emit import _outputs, emit_strict, strict_step
from tests.unit.test_time_splits import _plan


def _same_outputs(plan: Plan, model: torch.nn.Module, inputs: tuple) -> torch.nn.Module:
    emitted, run = emit_strict(plan, model)
    with torch.no_grad():
        expected = _outputs(model(*inputs))
        got = strict_step(run, emitted, inputs)  # copies and resident bytes equal the plan's
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g.cpu(), e, rtol=1e-4, atol=1e-5)
    return emitted


def test_the_ilps_time_split_runs_and_equals_the_original(tmp_path) -> None:  # noqa: ANN001
    plan, model, inputs = _plan()
    path = tmp_path / "time.json"
    plan.save(path)
    loaded = Plan.load(path)
    emitted = _same_outputs(loaded, model, inputs)
    chunks = [n for n, _ in emitted.named_parameters() if "_chunk" in n]
    assert len(chunks) == 16  # 8 weight chunks and 8 bias pieces, never the whole weight
    state = emitted.state_dict()
    assert list(state) == list(model.state_dict())
    for key, value in model.state_dict().items():
        torch.testing.assert_close(state[key].cpu(), value)
    torch.manual_seed(1)
    other = type(model)().eval()
    emitted.load_state_dict(other.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(emitted(*inputs).cpu(), other(*inputs), rtol=1e-4, atol=1e-5)


def _hand_time_split_plan(model: torch.nn.Module, inputs: tuple) -> Plan:
    """Every splittable linear split in time to ``cuda:0``, cycling through 2, 3, 5 and 7 chunks
    (even and uneven); the rest on the host (evaluate, verify and the plan's checks all pass)."""
    graph = from_module(model, inputs)
    problem = Problem(graph, load_profile("h200-host"),
                      Options(splits=SplitOptions(axes=("time",), chunks=(2, 3, 5, 7))))
    host = problem.host
    device = {n: host for n in problem.nodes}
    split = {}
    counts = itertools.cycle((2, 3, 5, 7))
    for n, choices in problem.split_choices.items():
        n_chunks = next(counts)
        split[n] = next(sp for sp in choices if sp.chunks == n_chunks)
        device[n] = split[n].home
    placement = Placement(device, split=split)
    ev = evaluate(problem, placement)
    assert ev.feasible, ev.violations
    verify_placement(problem, placement, ev)
    plan = Plan.from_solution(problem, Solution("by hand", placement, Status.HEURISTIC), ev)
    assert len(plan.splits) >= 4 and {e["chunks"] for e in plan.splits.values()} == {2, 3, 5, 7}
    return plan


def test_gpt_small_with_its_linears_split_in_time_equals_the_original() -> None:
    model, inputs = models.get("gpt", "small")
    _same_outputs(_hand_time_split_plan(model, inputs), model, inputs)


def test_an_hf_llama_with_its_linears_split_in_time_equals_the_original() -> None:
    """Linears without a bias (Llama's), the untied LM head among them."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=False)
    torch.manual_seed(0)
    lm = transformers.LlamaForCausalLM(config).eval()

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = lm

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.lm(input_ids=input_ids, use_cache=False).logits

    model, inputs = Logits().eval(), (torch.randint(0, 256, (2, 16)),)
    plan = _hand_time_split_plan(model, inputs)
    assert any("lm_head" in plan.modules[op] for op in plan.splits)
    _same_outputs(plan, model, inputs)
