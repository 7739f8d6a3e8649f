"""What the tensor-parallel ranks take from a plan, and what they refuse, without starting a process.

The layout (each split op as its ``nn.Linear`` and style, the mesh's devices), torch.distributed.tensor's
even blocks, and the refusals: uneven fractions, a shared weight, splits over different devices, a
launch whose world size is not the mesh's (each naming the op or both numbers, and the fix).
"""

from __future__ import annotations

import dataclasses

from pathlib import Path

import pytest
import torch

from backends.tensor_parallel import dtensor_sizes, layout_of, mesh_devices, rank_arguments, rank_environment
from backends.tensor_parallel.runtime import RunOptions, run_rank
from partitioner.errors import HetpartError, PipelineRunError, PlanMismatch
from tests.e2e.split_plans import split_plan


def _mlp() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 6)).eval()
    return model, (torch.randn(4, 8),)


def _first(axis: str, fraction: float, away: bool = False):
    def choose(_node, choices, host):
        return next(s for s in choices if s.axis == axis and s.fractions[0] == fraction and (s.home != host) == away)
    return choose


def test_dtensor_blocks_are_torch_chunks() -> None:
    assert dtensor_sizes(10, 2) == (5, 5) and dtensor_sizes(7, 2) == (4, 3) and dtensor_sizes(2, 4) == (1, 1, 0, 0)


def test_the_layout_names_each_split_linear_and_its_style(tmp_path: Path) -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    model, inputs = _mlp()
    plan = split_plan(model, inputs, tmp_path / "p.json")
    layout = layout_of(plan, model, inputs)
    assert layout.devices == ("cpu", "cuda:0") == mesh_devices(plan) and layout.world_size == 2
    assert [(s.module, s.axis, s.sizes) for s in layout.linears] == [("0", "cols", (8, 8)), ("2", "rows", (8, 8))]
    styles = layout.plan()
    assert isinstance(styles["0"], ColwiseParallel) and isinstance(styles["2"], RowwiseParallel)
    assert set(layout.plan("model.")) == {"model.0", "model.2"}


def test_uneven_fractions_are_refused_with_the_op_and_the_fix(tmp_path: Path) -> None:
    model, inputs = _mlp()
    plan = split_plan(model, inputs, tmp_path / "p.json", _first("cols", 0.75), fractions=(0.75,))
    with pytest.raises(PlanMismatch) as info:
        layout_of(plan, model, inputs)
    text = str(info.value)
    assert "op 'linear' (0, weight (16, 8)) is split cols with fractions [0.75, 0.25]" in text
    assert "12 on cpu, 4 on cuda:0 of its 16 rows" in text and "even blocks (8, 8" in text
    assert '"fractions": [0.5]' in text and "plan.emit" in text


class _Functional(torch.nn.Module):
    """A linear written as ``F.linear`` on a parameter of its own (no ``nn.Linear`` to shard)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.w).relu()


def test_a_linear_that_is_not_an_nn_linear_is_refused(tmp_path: Path) -> None:
    model, inputs = _Functional(), (torch.randn(4, 8),)
    plan = split_plan(model, inputs, tmp_path / "p.json", _first("cols", 0.5))
    assert list(plan.splits) == ["linear"]
    with pytest.raises(PlanMismatch, match=r"op 'linear' \(split cols over \['cpu', 'cuda:0'\]\) reads 'w', not the "
                                           r"weight of an nn.Linear: .*ColwiseParallel.*plan.emit"):
        layout_of(plan, model, inputs)


def test_splits_over_different_devices_are_refused(tmp_path: Path) -> None:
    model, inputs = _mlp()
    others = iter(["cuda:0", "npu:0"])

    def choose(_node, choices, host):
        other = next(others)
        return next(s for s in choices if s.axis == "cols" and s.fractions[0] == 0.5 and s.devices == (host, other))

    plan = split_plan(model, inputs, tmp_path / "p.json", choose, profile="cpu-gpu-npu")
    with pytest.raises(PlanMismatch, match=r"'linear_1' is split over \['cpu', 'npu:0'\] but 'linear' over "
                                           r"\['cpu', 'cuda:0'\]: one tensor-parallel group"):
        mesh_devices(plan)


def test_a_launch_that_does_not_match_the_mesh_is_refused(tmp_path: Path, monkeypatch) -> None:
    model, inputs = _mlp()
    plan = split_plan(model, inputs, tmp_path / "p.json")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(PipelineRunError) as info:
        rank_environment(plan, mesh_devices(plan))
    text = str(info.value)
    assert "over 2 devices (cpu, cuda:0): a device mesh of 2 ranks" in text
    assert "started 3 processes (WORLD_SIZE=3); nothing was run" in text
    assert f"torchrun --standalone --nproc-per-node 2 -m backends.tensor_parallel {plan.source}" in text
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert rank_environment(plan, mesh_devices(plan)) == (0, 2)
    monkeypatch.delenv("RANK")
    with pytest.raises(PipelineRunError, match="RANK is not set: run the ranks with torchrun"):
        rank_environment(plan, mesh_devices(plan))


def test_rank_arguments() -> None:
    options = RunOptions(training=True, loss="cross-entropy", device_map={"cuda:0": "cpu"}, timeout_s=60, seed=3)
    assert rank_arguments("p.json", "gpt:small", options) == [
        "p.json", "--model", "gpt:small", "--training", "--loss", "cross-entropy", "--bind", "cuda:0=cpu",
        "--timeout", "60", "--seed", "3"]


@pytest.fixture(scope="module")
def pipeline_plan_json(tmp_path_factory) -> dict:
    """gpt:tiny's 2-stage pipeline plan on 4x-cpu-host (host0, host1), as its file holds it."""
    import json

    import models
    from partitioner import partition

    module, inputs = models.get("gpt", "tiny")
    plan = partition(module, inputs, "4x-cpu-host", objective="throughput", stages=2, micro_batches=2,
                     schedule="gpipe", solver="pipeline-dp", model_name="gpt:tiny")
    path = tmp_path_factory.mktemp("plans") / "pipeline.json"
    plan.save(path)
    return json.loads(path.read_text())


def _grid(data: dict, path: Path, others: dict[str, str]):
    import json

    from partitioner import Plan

    data = dict(data, splits={op: {"axis": "cols", "devices": [data["placement"][op], other], "fractions": [0.5, 0.5]}
                              for op, other in others.items()})
    path.write_text(json.dumps(data))
    return Plan.load(path)


def test_the_grid_is_each_stage_and_its_splits_other_device(pipeline_plan_json, tmp_path: Path, monkeypatch) -> None:
    from backends.tensor_parallel.grid import _grid_environment, grid_of
    from backends.tensor_parallel.launch import world_size_of

    plan = _grid(pipeline_plan_json, tmp_path / "g.json", {"linear": "host2/cpu", "linear_5": "host3/cpu"})
    assert grid_of(plan) == (("host0/cpu", "host2/cpu"), ("host1/cpu", "host3/cpu")) and world_size_of(plan) == 4
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(PipelineRunError) as info:
        _grid_environment(plan, 2)
    assert "2 pipeline stages whose linears split over 2 devices each: a device mesh of 2 x 2 = 4 ranks" \
        in str(info.value)
    assert "started 2 processes (WORLD_SIZE=2); nothing was run" in str(info.value)
    assert "--nproc-per-node 4 -m backends.tensor_parallel" in str(info.value)
    with pytest.raises(HetpartError, match="has pipeline stages: its ranks are stages x tensor-parallel ranks"):
        run_rank(plan, torch.nn.Linear(2, 2), (), RunOptions())
    only_first = _grid(pipeline_plan_json, tmp_path / "h.json", {"linear": "host2/cpu"})
    assert grid_of(only_first) == (("host0/cpu", "host2/cpu"), ("host1/cpu", "host1/cpu"))  # a replica


def test_a_stage_splitting_over_two_other_devices_is_refused(pipeline_plan_json, tmp_path: Path) -> None:
    from backends.tensor_parallel.grid import grid_of

    plan = _grid(pipeline_plan_json, tmp_path / "g.json", {"linear": "host2/cpu", "linear_1": "host3/cpu"})
    with pytest.raises(PlanMismatch, match=r"stage 0 \(host0/cpu\) splits ops over 2 other devices \(linear over "
                                           r"host2/cpu, linear_1 over host3/cpu\): a stage's tensor-parallel group"):
        grid_of(plan)


class _Heads(torch.nn.Module):
    """Attention by heads (q/k/v, views, sdpa, o): the head count from ``n_heads`` (``named``), from
    a literal the module holds nowhere (not ``named``), or ``-1`` (``minus_one``)."""

    def __init__(self, named: bool = True, minus_one: bool = False) -> None:
        super().__init__()
        self.named, self.minus_one = named, minus_one
        if named:
            self.n_heads = 4
        self.q, self.k, self.v, self.o = (torch.nn.Linear(32, 32) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        heads = -1 if self.minus_one else self.n_heads if self.named else 4
        q, k, v = (f(x).unflatten(-1, (heads, 8)).transpose(1, 2) for f in (self.q, self.k, self.v))
        return self.o(torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))


@pytest.mark.parametrize("named, minus_one, counts", [(True, False, ((2, 2),)), (False, True, ())])
def test_an_attention_region_sets_the_ranks_head_count_or_needs_none(named, minus_one, counts) -> None:
    from backends.tensor_parallel import set_head_counts
    from tests.e2e.split_plans import region_plan

    torch.manual_seed(0)
    model, inputs = _Heads(named, minus_one).eval(), (torch.randn(2, 5, 32),)
    plan, _, _ = region_plan(model, inputs, fractions=(0.5,))
    layout = layout_of(plan, model, inputs)
    assert all(s.region for s in layout.linears) and len(layout.linears) == 4
    assert [h.counts for h in layout.heads] == list(counts)
    assert all((h.module, h.attribute) == ("", "n_heads") for h in layout.heads)
    set_head_counts(model, layout.heads, 1)
    assert getattr(model, "n_heads", None) == (2 if named else None)


def test_an_attention_region_whose_head_count_cannot_be_set_is_refused_by_name() -> None:
    from tests.e2e.split_plans import region_plan

    torch.manual_seed(0)
    model, inputs = _Heads(named=False).eval(), (torch.randn(2, 5, 32),)
    plan, _, _ = region_plan(model, inputs, fractions=(0.5,))
    with pytest.raises(PlanMismatch, match=r"op 'unflatten' of the attention region .* writes 4 heads .* module "
                                           r"'\(the model\)' \(_Heads\), which has no attribute named n_heads") as info:
        layout_of(plan, model, inputs)
    # its code writes the 4 whatever the shapes: a copy holding rank 0's 16 features does not capture
    assert "a copy of the model holding rank 0's shards does not capture" in str(info.value)
    assert "unflatten" in str(info.value) and "plan.emit" in str(info.value)


def test_an_hf_llama_attention_region_with_grouped_heads_computes_with_each_ranks_heads() -> None:
    """Its ``repeat_kv`` expands a key/value head count the captured graph holds as a literal and
    LlamaAttention keeps in no head count attribute; HF's code takes it from the tensor's shape, so a
    copy holding a rank's shards (2 of 4 query heads, 1 of 2 key/value heads) captures: no count to set."""
    pytest.importorskip("transformers")
    from backends.tensor_parallel.heads import head_counts
    from backends.tensor_parallel.layout import sharded_regions
    from backends.tensor_parallel.shard_shapes import shard_capture_error, shard_copy
    from backends.torch.module import capture_for, unlifted_module
    from tests.e2e.split_plans import region_plan
    from tests.e2e.tensor_parallel_models import llama

    model, inputs = llama()
    plan, _, _ = region_plan(model, inputs, fractions=(0.5,))
    layout = layout_of(plan, model, inputs)
    assert layout.heads == () and all(s.region for s in layout.linears)
    sizes = {s.module.rsplit(".", 1)[1]: s.sizes for s in layout.linears}
    assert sizes["q_proj"] == (32, 32) and sizes["k_proj"] == sizes["v_proj"] == (16, 16)  # whole key/value groups
    gm = unlifted_module(capture_for(plan, model, inputs))
    groups = {op: layout.devices for op in plan.splits}
    _, unset = head_counts(gm, sharded_regions(plan, gm, groups, heads=True), {s.op: s.sizes for s in layout.linears
                                                                              if s.axis == "rows"}, model)
    assert {u.literal for u in unset} == {2, 4} and {u.module for u in unset} == {"lm.model.layers.0.self_attn"}
    copy = shard_copy(model, layout.linears, 1)
    attn = copy.lm.model.layers[0].self_attn
    assert attn.k_proj.weight.shape == (16, 64) and attn.o_proj.weight.shape == (64, 32) and attn.q_proj.weight.is_meta
    assert model.lm.model.layers[0].self_attn.k_proj.weight.shape == (32, 64)  # the model is not changed
    # a key/value block that does not hold whole heads of its query block does not capture
    uneven = [dataclasses.replace(s, sizes=(8, 8)) if s.module.endswith("k_proj") else s for s in layout.linears]
    rank, error = shard_capture_error(plan, model, inputs, uneven, ())
    assert rank == 0 and "could not capture" in error

