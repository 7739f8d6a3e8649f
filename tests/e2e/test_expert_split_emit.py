"""End to end: a tiny transformers Mixtral whose fused experts ops are split in time by expert, emitted
in one process under strict devices.

Each logical device is bound to its own CPU tag (:mod:`backends.torch.strict`): an expert group
computed from a weight left on the host, or fetched twice, fails the run. The model: 2 layers, hidden
64, 4 experts, top-2 routing, captured as transformers 5 captures it by default (float32:
``transformers.grouped_mm_fallback`` over an ``aten.transpose`` view of each fused weight). Every
experts op is split by hand into 2, 3 or 4 groups of experts (even and uneven), the rest on the host:
outputs and every parameter's gradient equal the original model's, the run's copies (one per
group) and the bytes resident per device equal the plan's, and ``state_dict`` keeps the original's
keys and values. A plan the ILP makes (the experts modules pinned to a capped ``cuda:0``) runs too, and
so does the model in bfloat16, where the captured op is torch's ``aten._grouped_mm``, and a plan whose
experts splits (axis ``experts``) divide each op's experts between two devices.
"""

from __future__ import annotations

import functools
import itertools

import pytest
import torch

from backends.compare import compare
from backends.torch.splits import joined_gradients
from partitioner import Plan, from_module, load_profile
from partitioner.solvers.expert_streaming import fold_expert_weights
from partitioner.solvers.problem import Options, Placement, Problem, Solution, Status, evaluate
from partitioner.solvers.splits import SplitOptions
from partitioner.verify import verify_placement
from tests.e2e.test_emit import _loss, _outputs, emit_strict, strict_step

transformers = pytest.importorskip("transformers")


class Logits(torch.nn.Module):
    """A causal LM's logits for token ids (no cache)."""

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=input_ids, use_cache=False).logits


def tiny_mixtral() -> tuple[torch.nn.Module, tuple]:
    """2 layers, hidden 64, 4 experts, top-2; a batch of 2 x 8 tokens."""
    config = transformers.MixtralConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        num_local_experts=4, num_experts_per_tok=2, use_cache=False)
    torch.manual_seed(0)
    return Logits(transformers.MixtralForCausalLM(config)).eval(), (torch.randint(0, 256, (2, 8)),)


def hand_expert_plan(model: torch.nn.Module, inputs: tuple, counts: tuple[int, ...] = (2, 3, 4)) -> Plan:
    """Every experts op split in time by expert to ``cuda:0``, cycling through ``counts`` groups; the
    rest on the host (evaluate, verify and the plan's checks all pass)."""
    graph = from_module(model, inputs)
    folded = fold_expert_weights(graph)
    problem = Problem(folded.graph, load_profile("h200-host"), Options(splits=SplitOptions(axes=("time",), chunks=counts)),
                      members=folded.members, original=graph)
    device = {n: problem.host for n in problem.nodes}
    split = {}
    cycle = itertools.cycle(counts)
    for n, choices in problem.split_choices.items():
        by_expert = [sp for sp in choices if getattr(sp, "by", None) == "expert"]
        if by_expert:
            chunks = next(cycle)
            split[n] = next(sp for sp in by_expert if sp.chunks == chunks)
            device[n] = split[n].home
    placement = Placement(device, split=split)
    ev = evaluate(problem, placement)
    assert ev.feasible, ev.violations
    verify_placement(problem, placement, ev)
    return Plan.from_solution(problem, Solution("by hand", placement, Status.HEURISTIC), ev)


@functools.cache
def tiny_plan() -> tuple[Plan, torch.nn.Module, tuple]:
    """:func:`hand_expert_plan` of :func:`tiny_mixtral`, made once per run (the tests reset the gradients
    they read)."""
    model, inputs = tiny_mixtral()
    return hand_expert_plan(model, inputs), model, inputs


def test_a_mixtral_with_its_experts_split_in_time_equals_the_original(tmp_path) -> None:  # noqa: ANN001
    plan, model, inputs = tiny_plan()
    assert len(plan.splits) == 4 and {e["chunks"] for e in plan.splits.values()} == {2, 3, 4}
    assert all(e["by"] == "expert" for e in plan.splits.values())
    plan.save(tmp_path / "experts.json")
    plan = Plan.load(tmp_path / "experts.json")
    emitted, run = emit_strict(plan, model)
    with torch.no_grad():
        expected = _outputs(model(*inputs))
        got = strict_step(run, emitted, inputs)  # copies and resident bytes equal the plan's
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g.cpu(), e, rtol=1e-4, atol=1e-5)
    chunks = [n for n, _ in emitted.named_parameters() if "_chunk" in n]
    assert len(chunks) == 2 + 3 + 4 + 2  # expert groups, never a whole fused weight
    model.zero_grad()
    _loss(_outputs(model(*inputs))).backward()
    _loss(strict_step(run, emitted, inputs)).backward()
    ours = joined_gradients(emitted)
    for name, p in model.named_parameters():
        if p.grad is not None:
            error = compare(name, ours[name], p.grad, summed=True)
            assert error.passed, error
    state = emitted.state_dict()
    assert list(state) == list(model.state_dict())
    for key, value in model.state_dict().items():
        torch.testing.assert_close(state[key].cpu(), value)



def test_the_ilps_split_by_expert_runs_and_equals_the_original() -> None:
    """The experts modules pinned to ``cuda:0`` capped at 300 KiB: a layer's ``gate_up_proj`` (256 KiB)
    fits neither resident nor streamed whole (two buffers), nor in 2 groups (three 128 KiB buffers);
    the planner folds each experts op with its weight's view and the ILP splits it by expert."""
    from partitioner import partition

    model, inputs = tiny_mixtral()
    plan = partition(model, inputs, "h200-host", memory={"cuda:0": "300KiB"}, splits="time:2/4",
                     pins={"lm.model.layers.*.mlp.experts": "cuda:0"}, time_limit=20)
    assert len(plan.splits) == 4 and all(e["by"] == "expert" for e in plan.splits.values())
    assert {e["chunks"] for e in plan.splits.values() if e["bytes"][1] == 4 * 256 * 64 * 4} == {4}
    emitted, run = emit_strict(plan, model)
    with torch.no_grad():
        expected = _outputs(model(*inputs))
        got = strict_step(run, emitted, inputs)
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g.cpu(), e, rtol=1e-4, atol=1e-5)


def test_in_bfloat16_the_captured_aten_grouped_mm_is_split_alike() -> None:
    """In bfloat16 transformers calls torch's grouped matmul (``aten._grouped_mm``, the Mixtral rows of
    ``bench/plan_quality.py --split`` capture it so); each group runs it on its rows: the same values."""
    model, inputs = tiny_mixtral()
    model = model.to(torch.bfloat16)
    plan = hand_expert_plan(model, inputs)
    graph = from_module(model, inputs)
    assert {graph.ops[op].kind for op in plan.splits} == {"aten._grouped_mm.default"}
    emitted, run = emit_strict(plan, model)
    with torch.no_grad():
        expected = _outputs(model(*inputs))
        got = strict_step(run, emitted, inputs)
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g.cpu(), e)


def test_a_mixtral_with_its_experts_divided_between_devices_equals_the_original() -> None:
    """Experts splits (axis ``experts``) by hand: each experts op's experts divided between ``cuda:0``
    and the host (3:1, 2:2, 1:3, either one home): the routed rows copied over and the outputs summed
    back; outputs, gradients, copies and resident bytes as the plan says."""
    model, inputs = tiny_mixtral()
    graph = from_module(model, inputs)
    folded = fold_expert_weights(graph)
    problem = Problem(folded.graph, load_profile("h200-host"),
                      Options(splits=SplitOptions(axes=("experts",), fractions=(0.25, 0.5, 0.75))),
                      members=folded.members, original=graph)
    device = {n: problem.host for n in problem.nodes}
    split = {}
    kinds = itertools.cycle([(0.75, True), (0.5, False), (0.25, True), (0.75, False)])
    for n, choices in problem.split_choices.items():
        share, on_accelerator = next(kinds)
        split[n] = next(sp for sp in choices if sp.fractions[0] == share and (sp.home != problem.host) == on_accelerator)
        device[n] = split[n].home
    placement = Placement(device, split=split)
    ev = evaluate(problem, placement)
    assert ev.feasible, ev.violations
    verify_placement(problem, placement, ev)
    plan = Plan.from_solution(problem, Solution("by hand", placement, Status.HEURISTIC), ev)
    assert {e["axis"] for e in plan.splits.values()} == {"experts"} and len(plan.splits) == 4
    emitted, run = emit_strict(Plan.from_json(plan.to_json()), model)  # the section read back and checked
    with torch.no_grad():
        expected = _outputs(model(*inputs))
        got = strict_step(run, emitted, inputs)  # copies and resident bytes equal the plan's
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g.cpu(), e, rtol=1e-4, atol=1e-5)
    model.zero_grad()
    _loss(_outputs(model(*inputs))).backward()
    _loss(strict_step(run, emitted, inputs)).backward()
    ours = joined_gradients(emitted)
    for name, p in model.named_parameters():
        if p.grad is not None:
            assert compare(name, ours[name], p.grad, summed=True).passed, name
    assert list(emitted.state_dict()) == list(model.state_dict())
