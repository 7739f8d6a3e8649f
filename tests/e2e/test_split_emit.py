"""End to end: plans that split linears over two devices, emitted in one process under strict devices.

Each logical device is bound to its own CPU tag (:mod:`backends.torch.strict`): a shard reading a
tensor from the other device fails the run. Outputs and every parameter's gradient (a split
weight's shards joined under the original name) equal the original model's; the run's copies and
the bytes resident per device equal the plan's transfers (the ``split`` copies included) and its
shard bytes; ``state_dict`` keeps the original's keys and values.

The plans: ``gpt:small`` with every block linear split by hand (both axes, both directions, several
fractions, through :meth:`Plan.from_solution` on the problem's own evaluation), the seed model
(emb-transformer) split alike, a plan the ILP chose splits in under a tight cap, the ``hetegen``
baseline's plan, and an HF Llama from a small ``transformers`` config.
"""

from __future__ import annotations

import itertools
import json

import pytest
import torch

import models
from backends.compare import compare
from backends.torch.splits import joined_gradients
from partitioner import Plan, from_module, load_profile, partition
from partitioner.errors import PlanMismatch
from partitioner.solvers.problem import Options, Placement, Problem, Solution, Status, evaluate
from partitioner.solvers.splits import SplitOptions
from partitioner.verify import verify_placement
from tests.e2e.test_emit import _loss, _outputs, emit_strict, strict_step


def _hand_split_plan(module: torch.nn.Module, inputs: tuple, profile: str = "h200-host") -> Plan:
    """Every splittable linear split, cycling through axes, directions and fractions; the rest on
    the host (a valid plan: evaluate, verify and the plan's own checks all pass)."""
    graph = from_module(module, inputs)
    devices = load_profile(profile)
    problem = Problem(graph, devices, Options(streaming=False, splits=SplitOptions(fractions=(0.25, 0.5, 0.75),
                                                                                     proportional=False, balanced=False)))
    host = problem.host
    device = {n: host for n in problem.nodes}
    split = {}
    kinds = itertools.cycle([("cols", 0.25, False), ("rows", 0.5, True), ("cols", 0.75, True), ("rows", 0.25, False)])
    for n, choices in problem.split_choices.items():
        axis, f, flip = next(kinds)
        sp = next(s for s in choices if s.axis == axis and s.fractions[0] == f and (s.home != host) == flip)
        split[n], device[n] = sp, sp.home
    placement = Placement(device, split=split)
    ev = evaluate(problem, placement)
    assert ev.feasible, ev.violations
    verify_placement(problem, placement, ev)
    plan = Plan.from_solution(problem, Solution("by hand", placement, Status.HEURISTIC), ev)
    assert len(plan.splits) == len(split) >= 4
    return plan


def _check(plan: Plan, model: torch.nn.Module, inputs: tuple) -> torch.nn.Module:
    emitted, run = emit_strict(plan, model)
    with torch.no_grad():
        expected = _outputs(model(*inputs))
        got = strict_step(run, emitted, inputs)  # copies and resident bytes equal the plan's
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g.cpu(), e, rtol=1e-4, atol=1e-5)
    model.zero_grad()
    _loss(_outputs(model(*inputs))).backward()
    loss = _loss(strict_step(run, emitted, inputs))
    loss.backward()
    ours = joined_gradients(emitted)
    for name, p in model.named_parameters():
        if p.grad is not None:
            assert ours.get(name) is not None, f"no gradient for {name}"
            # a sum over the outputs, as `hetpart check` compares it: atol scaled by the gradient's size
            # (a row split adds its partial products in another order)
            error = compare(name, ours[name], p.grad, summed=True)
            assert error.passed, error
    return emitted


@pytest.fixture(scope="module")
def gpt_small() -> tuple[torch.nn.Module, tuple]:
    return models.get("gpt", "small")


def test_gpt_small_with_its_linears_split_equals_the_original(gpt_small, tmp_path) -> None:
    model, inputs = gpt_small
    plan = _hand_split_plan(model, inputs)
    assert {e["axis"] for e in plan.splits.values()} == {"cols", "rows"}
    assert {e["devices"][0] for e in plan.splits.values()} == {"cpu", "cuda:0"}
    assert any(t.kind == "split" for t in plan.transfers)
    path = tmp_path / "split.json"
    plan.save(path)
    loaded = Plan.load(path)
    assert loaded == plan
    emitted = _check(loaded, model, inputs)
    state = emitted.state_dict()
    assert list(state) == [k for k in model.state_dict() if k in state] and set(state) == set(model.state_dict())
    for key, value in model.state_dict().items():
        torch.testing.assert_close(state[key].cpu(), value)


def test_a_split_module_loads_the_originals_state_dict(gpt_small) -> None:
    model, inputs = gpt_small
    plan = _hand_split_plan(model, inputs)
    emitted, run = emit_strict(plan, model)
    other, _ = models.get("gpt", "small", seed=1)
    emitted.load_state_dict(other.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(strict_step(run, emitted, inputs)[0].cpu(), other(*inputs), rtol=1e-4, atol=1e-5)


def test_the_ilp_splits_a_linear_over_a_tight_cap_and_the_plan_runs() -> None:
    """A 256 x 16384 head (16 MiB) with cuda:0 capped below it: the ILP splits it, and the plan runs."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.LayerNorm(256), torch.nn.Linear(256, 16384)).eval()
    inputs = (torch.randn(8, 256),)
    plan = partition(model, inputs, "h200-host", memory={"cuda:0": "14MB"}, splits=True, time_limit=30)
    whole = partition(model, inputs, "h200-host", memory={"cuda:0": "14MB"}, time_limit=30)
    assert plan.splits, plan.placement
    assert plan.predicted["total_s"] < whole.predicted["total_s"]
    assert not whole.splits and "splits" not in json.loads(whole.to_json())
    _check(plan, model, inputs)


def test_an_hf_llama_with_split_linears_equals_the_original() -> None:
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
    plan = _hand_split_plan(wrapped, (ids,))
    assert any(op for op in plan.splits if "lm_head" in plan.modules[op])
    _check(plan, wrapped, (ids,))


def test_the_seed_model_with_its_linears_split_equals_the_original() -> None:
    """The seed case (emb-transformer: an embedding table, attention blocks, a head) at its tiny size."""
    model, inputs = models.get("emb-transformer", "tiny")
    plan = _hand_split_plan(model, inputs)
    assert {e["axis"] for e in plan.splits.values()} == {"cols", "rows"}
    _check(plan, model, inputs)


def test_the_hetegen_baseline_plan_runs_and_equals_the_original(gpt_small) -> None:
    """HeteGen's placement (every linear split by columns between cuda:0 and the CPU at the balanced
    share) emitted and run under strict devices."""
    model, inputs = gpt_small
    plan = partition(model, inputs, "h200-host", splits=True, solver="hetegen", time_limit=20)
    assert plan.solver.name == "hetegen" and len(plan.splits) >= 4
    assert {(e["axis"], tuple(e["devices"])) for e in plan.splits.values()} == {("cols", ("cuda:0", "cpu"))}
    _check(plan, model, inputs)


def test_a_hand_edited_split_is_refused_naming_the_op_and_what_it_can_take(gpt_small, tmp_path) -> None:
    model, inputs = gpt_small
    plan = _hand_split_plan(model, inputs)
    data = json.loads(plan.to_json())
    op = next(iter(data["splits"]))
    data["splits"][op]["fractions"] = [0.7, 0.7]
    path = tmp_path / "sum.json"
    path.write_text(json.dumps(data))
    with pytest.raises(Exception, match=rf"splits\[\"{op}\"\].fractions: op '{op}' split .* do not sum to one"):
        Plan.load(path)
    data = json.loads(plan.to_json())
    norm = next(o for o, m in data["model"]["modules"].items() if "ln" in m and o not in data["splits"])
    entry = dict(next(iter(data["splits"].values())))
    entry["devices"] = [data["placement"][norm], "cuda:0" if data["placement"][norm] == "cpu" else "cpu"]
    entry.pop("bytes")
    data["splits"][norm] = entry
    path = tmp_path / "norm.json"
    path.write_text(json.dumps(data))
    edited = Plan.load(path)
    with pytest.raises(PlanMismatch, match=rf"op '{norm}' cannot take split .*only aten linear ops take (cols|rows) "
                                           r"splits; it can take batch splits"):
        edited.check_graph(from_module(model, inputs))


def test_backends_that_run_ops_whole_refuse_a_split_plan(tmp_path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).eval()
    inputs = (torch.randn(4, 16),)
    graph = from_module(model, inputs)
    problem = Problem(graph, load_profile("h200-host"), Options(streaming=False, splits=SplitOptions()))
    node, choices = next(iter(problem.split_choices.items()))
    placement = Placement({n: choices[0].home for n in problem.nodes}, split={node: choices[0]})
    plan = Plan.from_solution(problem, Solution("by hand", placement, Status.HEURISTIC))
    with pytest.raises(Exception, match=r"splits 1 linears over two devices .*emit_source \(the generated file\) runs "
                                        r"every op whole: run it with plan.emit\(model\)"):
        plan.emit_source(tmp_path / "placed.py", model, {"cuda:0": "cpu"})
