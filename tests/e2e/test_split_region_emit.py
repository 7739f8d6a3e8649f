"""End to end: plans whose MLPs are split regions, emitted in one process under strict devices.

Each MLP's first linear(s) split by columns and its last by rows over the same devices and
fractions, the activation between on the home (:mod:`partitioner.solvers.split_regions`): the
emitted module never rejoins the columns' shards (the run's copies equal the plan's transfers, from
which the region dropped the columns' copies back and the row's copies out), and its outputs and
gradients equal the original's. Models: ``gpt:small`` (``fc1 -> gelu -> fc2``, and its attention by
heads: ``q, k, v -> unflatten, transpose -> sdpa -> transpose, flatten -> o_proj`` with each shard's
head count in its ``unflatten``) and a one-layer HF Llama (``silu(gate) * up -> down``; with as many
key/value heads as query heads its attention too, reading the rotary tables and the mask from
outside, each copied from the home to the other device; with grouped key/value heads each shard
holds whole groups: its query heads with their key/value head). A plan whose members disagree (the
row at another fraction) forms no region and runs as separate splits, as it is priced.
"""

from __future__ import annotations

import pytest
import torch

import models
from backends.torch.splits import joined_gradients
from partitioner import Plan
from partitioner.solvers.split_regions import regions_of
from tests.e2e.split_plans import region_plan
from tests.e2e.test_emit import _loss, _outputs, emit_strict, strict_step


def _check(plan: Plan, model: torch.nn.Module, inputs: tuple) -> torch.nn.Module:
    """Outputs and gradients equal the original's under strict devices (copies and resident bytes the
    plan's). Gradients to within 1e-4 of the largest gradient: a row split and the sharded interior
    add in another order, and a key bias's gradient (zero in exact arithmetic: softmax ignores a shift)
    is that order's rounding only."""
    emitted, run = emit_strict(plan, model)
    with torch.no_grad():
        expected = _outputs(model(*inputs))
        got = strict_step(run, emitted, inputs)
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g.cpu(), e, rtol=1e-4, atol=1e-5)
    model.zero_grad()
    _loss(_outputs(model(*inputs))).backward()
    _loss(strict_step(run, emitted, inputs)).backward()
    ours = joined_gradients(emitted)
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    scale = max(g.abs().max().item() for g in grads.values())
    for name, grad in grads.items():
        assert ours.get(name) is not None, f"no gradient for {name}"
        torch.testing.assert_close(ours[name].cpu(), grad, rtol=1e-4, atol=1e-4 * scale, msg=name)
    return emitted


def test_gpt_small_with_its_mlps_as_regions_equals_the_original(tmp_path) -> None:
    model, inputs = models.get("gpt", "small")
    loaded, problem, placement = region_plan(model, inputs, tmp_path / "regions.json")
    formed = regions_of(problem, placement)
    assert len(formed) == len(problem.region_offer.regions) == 8  # each block's attention (by heads) and MLP
    assert {problem.region_offer.regions[i].granule for i, _ in formed} == {1, 32}  # features, a head's
    assert all(problem.region_offer.price[key].latency_s < 0 for key in formed)
    split_copies = sum(t.kind == "split" for t in loaded.transfers)
    assert split_copies == 4 * (3 + 1) + 4 * (1 + 1)  # per region: each col's input out, the row's partial back
    emitted = _check(loaded, model, inputs)
    names = {n.name for n in emitted.graph.nodes}
    assert {"gelu_shard0", "gelu_shard1", "linear_4_shard1", "linear_5_shard1"} <= names
    assert "gelu" not in names and "linear_4" not in names  # no whole gelu, no concatenation of fc1's shards
    assert {"scaled_dot_product_attention_shard0", "scaled_dot_product_attention_shard1"} <= names  # heads
    assert emitted.graph.find_nodes(op="call_function", target=torch.ops.aten.unflatten.int)[0].args[2][0] in (2, 6)


def test_a_plan_whose_members_disagree_runs_as_separate_splits() -> None:
    model, inputs = models.get("gpt", "tiny")
    plan, problem, placement = region_plan(model, inputs, disagree=True)
    formed = {problem.region_offer.regions[i] for i, _ in regions_of(problem, placement)}
    assert 0 < len(formed) < len(problem.region_offer.regions)  # only the regions at 0.5 keep their members in step
    expected = sum(len(r.cols) + 1 if r in formed else 2 * (len(r.cols) + 1) for r in problem.region_offer.regions)
    assert sum(t.kind == "split" for t in plan.transfers) == expected
    _check(plan, model, inputs)


def test_an_hf_llama_with_its_swiglu_as_a_region_equals_the_original() -> None:
    pytest.importorskip("transformers")
    from tests.e2e.tensor_parallel_models import llama

    model, inputs = llama()
    plan, problem, placement = region_plan(model, inputs)
    formed = regions_of(problem, placement)
    assert formed and all(len(problem.region_offer.regions[i].cols) == 2 for i, _ in formed)  # gate and up
    _check(plan, model, inputs)


def test_an_hf_llama_with_its_attention_and_swiglu_as_regions_equals_the_original() -> None:
    pytest.importorskip("transformers")
    from tests.e2e.tensor_parallel_models import llama_mha

    model, inputs = llama_mha()
    plan, problem, placement = region_plan(model, inputs)
    formed = [problem.region_offer.regions[i] for i, _ in regions_of(problem, placement)]
    assert [len(r.cols) for r in formed] == [3, 2] and formed[0].granule == 16  # q, k, v by heads; gate, up
    assert len(formed[0].outside) == 3  # cos, sin and the mask, read whole by each shard
    copies = {(t.tensor, t.src, t.dst) for t in plan.transfers if t.kind == "split"}
    home, other = plan.splits[formed[0].row]["devices"]
    assert {(o, home, other) for o in formed[0].outside} <= copies
    emitted = _check(plan, model, inputs)
    names = {n.name for n in emitted.graph.nodes}
    assert {"scaled_dot_product_attention_shard0", "scaled_dot_product_attention_shard1"} <= names
    assert {f"{o}_to_{formed[0].row}_shard1" for o in formed[0].outside} <= names


def test_an_hf_llama_with_grouped_key_value_heads_as_an_attention_region_equals_the_original() -> None:
    """4 query heads over 2 key/value heads, split in halves: each shard one group (2 query heads, 1
    key/value head, its ``repeat_kv`` expanding 1 head to 2)."""
    pytest.importorskip("transformers")
    from tests.e2e.tensor_parallel_models import llama

    model, inputs = llama()
    plan, problem, placement = region_plan(model, inputs, fractions=(0.5,))
    formed = [problem.region_offer.regions[i] for i, _ in regions_of(problem, placement)]
    assert [len(r.cols) for r in formed] == [3, 2] and formed[0].granule == 32  # a group: 2 heads of 16
    emitted = _check(plan, model, inputs)
    expands = [n for n in emitted.graph.nodes if n.name.startswith("expand_3_shard")]
    assert [n.args[1][1] for n in expands] == [1, 1]  # one key/value head per shard


@pytest.mark.slow
def test_the_planner_forms_regions_under_a_tight_cap_and_the_plan_runs() -> None:
    """gpt:small with cuda:0 capped at 3 MB: the ILP splits each MLP's two linears alike with gelu on
    the home (a region: one copy out and one back instead of two each), and the plan runs."""
    from backends.torch.module import capture_for, unlifted_module
    from backends.torch.split_regions import plan_regions
    from partitioner import partition

    model, inputs = models.get("gpt", "small")
    plan = partition(model, inputs, "h200-host", splits=True, time_limit=30, memory={"cuda:0": "3MB"})
    regions = plan_regions(unlifted_module(capture_for(plan, model)), plan)
    assert regions, plan.splits
    members = {op for r in regions for op in (*r.cols, r.row)}
    expected = sum(len(r.cols) + 1 for r in regions) + 2 * len(set(plan.splits) - members)
    assert sum(t.kind == "split" for t in plan.transfers) == expected
    _check(plan, model, inputs)


def test_a_hand_edited_plan_whose_row_disagrees_is_no_region_for_the_price_nor_the_emitter(tmp_path) -> None:
    """A region plan file with its row's fractions edited: the emitter's rule forms no region there,
    and the plan's own check (``evaluate`` of its placement, the price's rule) asks for the copies
    separate splits make, so the stale file is refused naming them."""
    import dataclasses
    import json

    from backends.torch.module import capture_for, unlifted_module
    from backends.torch.split_regions import plan_regions
    from partitioner.errors import PlanMismatch
    from tests.e2e.tensor_parallel_models import mlp

    model, inputs = mlp()
    plan, _, _ = region_plan(model, inputs, tmp_path / "mlp.json", fractions=(0.5,))
    gm = unlifted_module(capture_for(plan, model))
    assert [r.row for r in plan_regions(gm, plan)] == ["linear_1"]
    text = json.loads((tmp_path / "mlp.json").read_text())
    text["splits"]["linear_1"]["fractions"] = [0.75, 0.25]
    (tmp_path / "edited.json").write_text(json.dumps(text))
    with pytest.raises(PlanMismatch, match=r"transfers lack the copy of split 'linear' .*\n.*split 'linear_1'"):
        Plan.load(tmp_path / "edited.json").emit(model, {"cuda:0": "cpu"})
    edited = dict(plan.splits)
    edited["linear_1"] = {**plan.splits["linear_1"], "fractions": [0.75, 0.25]}
    assert plan_regions(gm, dataclasses.replace(plan, splits=edited)) == ()
