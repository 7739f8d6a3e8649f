"""End to end: embeddings split by table rows and elementwise ops and norms split by batch, emitted in
one process under strict devices.

Each logical device is bound to its own CPU tag (:mod:`backends.torch.strict`): a shard reading a
tensor from another device fails the run. Outputs and every parameter's gradient (a table's blocks
joined, a norm's copies summed, under the original name) equal the original model's; the run's
copies and the bytes resident per device equal the plan's (its ``split`` transfers and shard bytes);
``state_dict`` keeps the original's keys and values, and ``load_state_dict`` takes them.

The plans: the seed model (emb-transformer) with its embedding split by table rows (and its norms
and elementwise ops by batch), ``gpt:small`` with its norms, residual adds and GELUs split by batch
and its position table by rows, a batch of one split along the sequence, and a plan the ILP chose a
table split in under a tight cap.
"""

from __future__ import annotations

import itertools
import json

import pytest
import torch

import models
from partitioner import Plan, from_module, load_profile, partition
from partitioner.errors import PlanMismatch
from partitioner.solvers.problem import Options, Placement, Problem, Solution, Status, evaluate
from partitioner.solvers.splits import SplitOptions
from partitioner.verify import verify_placement
from tests.e2e.test_emit import emit_strict, strict_step
from tests.e2e.test_split_emit import _check


def _axis_plan(module: torch.nn.Module, inputs: tuple, axes: tuple[str, ...], batches: int | None = None) -> Plan:
    """Every op taking one of ``axes`` split (with ``batches``: every table and the first ``batches``
    ops taking batch splits), cycling through fractions and homes; the rest on the host (evaluate,
    verify and the plan's own checks pass)."""
    problem = Problem(from_module(module, inputs), load_profile("h200-host"),
                      Options(streaming=False, splits=SplitOptions(axes=axes, fractions=(0.25, 0.5, 0.75),
                                                                   proportional=False, balanced=False)))
    host = problem.host
    device = {n: host for n in problem.nodes}
    split = {}
    kinds = itertools.cycle([(0.25, False), (0.5, True), (0.75, True), (0.5, False)])
    for n, choices in problem.split_choices.items():
        if batches is not None and choices[0].axis == "batch" \
                and sum(s.axis == "batch" for s in split.values()) >= batches:
            continue
        f, away = next(kinds)
        sp = next(s for s in choices if s.fractions[0] == f and (s.home != host) == away)
        split[n], device[n] = sp, sp.home
    placement = Placement(device, split=split)
    ev = evaluate(problem, placement)
    assert ev.feasible, ev.violations
    verify_placement(problem, placement, ev)
    return Plan.from_solution(problem, Solution("by hand", placement, Status.HEURISTIC), ev)


def test_the_seed_models_embedding_split_by_table_rows_equals_the_original(tmp_path) -> None:
    model, inputs = models.get("emb-transformer", "tiny")
    plan = _axis_plan(model, inputs, ("table", "batch"))
    assert {e["axis"] for e in plan.splits.values()} == {"table", "batch"}
    path = tmp_path / "table.json"
    plan.save(path)
    loaded = Plan.load(path)
    assert loaded == plan
    emitted = _check(loaded, model, inputs)
    state = emitted.state_dict()
    assert set(state) == set(model.state_dict())
    for key, value in model.state_dict().items():
        torch.testing.assert_close(state[key].cpu(), value)
    other, _ = models.get("emb-transformer", "tiny", seed=1)
    emitted, run = emit_strict(plan, model)
    emitted.load_state_dict(other.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(strict_step(run, emitted, inputs)[0].cpu(), other(*inputs), rtol=1e-4, atol=1e-5)


def test_gpt_small_with_norms_and_elementwise_ops_split_by_batch_equals_the_original() -> None:
    """The first block's norms, residual adds and GELU split by batch, and the position table by rows."""
    model, inputs = models.get("gpt", "small")
    plan = _axis_plan(model, inputs, ("batch", "table"), batches=6)
    kinds = {op.split("_")[0] for op, e in plan.splits.items() if e["axis"] == "batch"}
    assert {"layer", "add", "gelu"} <= kinds, kinds
    assert any(e["axis"] == "table" for e in plan.splits.values())  # the position table (the token one is tied)
    _check(plan, model, inputs)


@pytest.mark.parametrize("norm", [torch.nn.LayerNorm, torch.nn.RMSNorm])
def test_a_batch_of_one_is_split_along_the_sequence(norm: type) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(norm(32), torch.nn.SiLU(), torch.nn.Linear(32, 8)).eval()
    inputs = (torch.randn(1, 12, 32),)
    plan = _axis_plan(model, inputs, ("batch",))
    assert len(plan.splits) == 2
    _check(plan, model, inputs)


def test_the_ilp_splits_a_table_over_a_tight_cap_and_the_plan_runs() -> None:
    """A 16384 x 256 table (16 MiB) with cuda:0 capped below it: the ILP splits it by rows."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(16384, 256), torch.nn.LayerNorm(256)).eval()
    inputs = (torch.randint(0, 16384, (8, 64)),)
    plan = partition(model, inputs, "h200-host", memory={"cuda:0": "14MB", "cpu": "10MB"},
                     splits="table,batch", time_limit=30)
    assert any(e["axis"] == "table" for e in plan.splits.values()), plan.placement
    _check(plan, model, inputs)


def test_a_table_split_on_a_norm_is_refused_naming_what_it_can_take(tmp_path) -> None:
    model, inputs = models.get("emb-transformer", "tiny")
    plan = _axis_plan(model, inputs, ("table",))
    data = json.loads(plan.to_json())
    table_op, entry = next(iter(data["splits"].items()))
    norm = next(o for o, m in data["model"]["modules"].items() if "norm" in m or "ln" in m)
    away = next(d for d in entry["devices"] if d != data["placement"][norm])
    data["splits"][norm] = {**entry, "devices": [data["placement"][norm], away]}
    data["splits"][norm].pop("bytes")
    path = tmp_path / "norm.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PlanMismatch, match=rf"op '{norm}' cannot take split table\[.*only aten embedding ops take "
                                           r"table splits; it can take batch splits"):
        Plan.load(path).check_graph(from_module(model, inputs))


def test_an_hf_llama_with_its_rms_norm_steps_and_table_split_equals_the_original() -> None:
    """HF's LlamaRMSNorm is captured as its steps (pow, mean, add, rsqrt, mul): those of the rows'
    shape, the SiLU, the residual adds and the untied table are split."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()

    class Logits(torch.nn.Module):
        def __init__(self, lm: torch.nn.Module) -> None:
            super().__init__()
            self.lm = lm

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.lm(input_ids=input_ids, use_cache=False).logits

    wrapped = Logits(model).eval()
    ids = torch.randint(0, 256, (2, 16))
    plan = _axis_plan(wrapped, (ids,), ("table", "batch"))
    kinds = {op.split("_")[0] for op, e in plan.splits.items() if e["axis"] == "batch"}
    assert {"mul", "rsqrt", "silu", "add"} <= kinds, kinds
    assert any(e["axis"] == "table" for e in plan.splits.values())
    _check(plan, wrapped, (ids,))
