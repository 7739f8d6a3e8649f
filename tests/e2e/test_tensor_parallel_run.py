"""Plans with split linears run across ranks on torch.distributed.tensor: real torchrun processes, gloo.

Two ranks (the plan's ``cpu`` and ``cuda:0``, both bound to this machine's CPU), every splittable
linear of the model split evenly (by output columns and by the reduction dimension, homes on both
devices): the ranks' outputs, loss and gradients (a sharded weight's gathered with
``full_tensor()``, under the model's parameter name) equal one single-process step of the model
(``torch.testing.assert_close`` and the check's report for ``gpt:small``; ``check_ranks``, which
starts the ranks itself, for an HF Llama from a small ``transformers`` config). A launch with
another number of processes than the mesh's is refused before anything runs, naming both numbers
and the command to run. ``hetpart launch`` prints, runs and checks a plan with splits.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import models
from backends.tensor_parallel import RunOptions, check_ranks, check_results, layout_of, reference_step, run_ranks
from backends.tensor_parallel.runtime import ERROR_PREFIX
from backends.pipeline.check import read_results
from backends.pipeline.launch import rank_errors
from partitioner import Plan
from tests.e2e.split_plans import even_over, region_plan, split_plan

HERE = Path(__file__).resolve().parent
CPU_RANKS = {"cuda:0": "cpu"}


def _run_and_compare(plan: Plan, model: torch.nn.Module, inputs: tuple, spec: str, sharded: set[str],
                     tmp_path: Path, world: int = 2, device_map: dict | None = CPU_RANKS) -> None:
    options = RunOptions(training=True, device_map=device_map or {}, results=str(tmp_path), timeout_s=120)
    run = run_ranks(plan, spec, options, timeout_s=300)
    assert run.returncode == 0, run.output[-3000:]
    records = read_results(tmp_path, world)
    assert len(records) == world
    ref_outs, ref_loss, ref_grads = reference_step(model, inputs, options)
    names = {name for name, _ in model.named_parameters()}
    for record in records:
        assert set(record["sharded"]) == sharded, record["sharded"]
        for got, want in zip(record["outputs"], ref_outs, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(record["loss"], ref_loss, rtol=1e-4, atol=1e-6)
        assert set(record["grads"]) == {n for n, g in ref_grads.items() if g is not None}
        assert set(record["grads"]) <= names
        for name, grad in record["grads"].items():
            assert grad.shape == ref_grads[name].shape, name  # gathered to the full tensor
            torch.testing.assert_close(grad, ref_grads[name], rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    report = check_results(plan, model, inputs, options, tmp_path)
    assert report.passed, report.to_text()


@pytest.fixture(scope="module")
def gpt_small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Plan, torch.nn.Module, tuple]:
    """gpt:small with its 24 block linears split in halves over cpu and cuda:0."""
    model, inputs = models.get("gpt", "small")
    plan = split_plan(model, inputs, tmp_path_factory.mktemp("plans") / "gpt.json", model_name="gpt:small")
    return plan, model, inputs


@pytest.mark.slow
def test_gpt_small_on_two_tensor_parallel_ranks_equals_the_model(gpt_small, tmp_path: Path) -> None:
    plan, model, inputs = gpt_small
    assert {e["axis"] for e in plan.splits.values()} == {"cols", "rows"}
    assert {e["devices"][0] for e in plan.splits.values()} == {"cpu", "cuda:0"}
    assert len(plan.splits) == 24
    blocks = {f"blocks.{i}.{m}" for i in range(4) for m in ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj",
                                                              "mlp.ff1", "mlp.ff2")}
    _run_and_compare(plan, model, inputs, "gpt:small", blocks, tmp_path)


@pytest.mark.slow
def test_gpt_small_on_four_tensor_parallel_ranks_equals_the_model(tmp_path: Path) -> None:
    """Every block linear split evenly over the four CPUs of ``4x-cpu-host`` (a quarter of its weight
    on each rank, homes on all four): a mesh of 4 ranks."""
    model, inputs = models.get("gpt", "small")
    plan = split_plan(model, inputs, tmp_path / "gpt4.json", even_over(4), profile="4x-cpu-host",
                      model_name="gpt:small")
    assert {len(e["devices"]) for e in plan.splits.values()} == {4} and len(plan.splits) == 24
    assert {e["axis"] for e in plan.splits.values()} == {"cols", "rows"}
    assert len({e["devices"][0] for e in plan.splits.values()}) == 4
    layout = layout_of(plan, model, inputs)
    assert layout.world_size == 4 and {s.sizes for s in layout.linears} == {(64,) * 4, (256,) * 4}
    blocks = {f"blocks.{i}.{m}" for i in range(4) for m in ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj",
                                                              "mlp.ff1", "mlp.ff2")}
    results = tmp_path / "results"
    results.mkdir()
    _run_and_compare(plan, model, inputs, "gpt:small", blocks, results, world=4, device_map=None)


@pytest.mark.slow
def test_an_hf_llama_on_two_tensor_parallel_ranks_equals_the_model(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from tests.e2e.tensor_parallel_models import llama

    model, inputs = llama()
    plan = split_plan(model, inputs, tmp_path / "llama.json")
    linears = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
               "mlp.up_proj", "mlp.down_proj")
    modules = {f"lm.model.layers.0.{m}" for m in linears} | {"lm.lm_head"}
    assert len(plan.splits) == 8 and {e["axis"] for e in plan.splits.values()} == {"cols", "rows"}
    assert {s.module for s in layout_of(plan, model, inputs).linears} == modules
    report = check_ranks(plan, model, inputs, model_spec=f"{HERE / 'tensor_parallel_models.py'}:llama",
                         options=RunOptions(training=True, device_map=CPU_RANKS, timeout_s=120), run_timeout_s=300)
    assert report.passed, report.to_text()
    names = [n for n, p in model.named_parameters()]
    assert [e.name for e in report.grads] == [f"rank {r} {n}" for r in (0, 1) for n in names]
    assert report.loss is not None and len(report.outputs) == 2


@pytest.mark.slow
def test_a_launch_of_another_size_than_the_mesh_is_refused_before_anything_runs(gpt_small, tmp_path: Path) -> None:
    plan = gpt_small[0]
    before = Path(plan.source).read_bytes()
    options = RunOptions(training=True, device_map=CPU_RANKS, results=str(tmp_path), timeout_s=60)
    run = run_ranks(plan, "gpt:small", options, world_size=1, timeout_s=120)
    assert run.returncode != 0
    errors = [line for line in run.output.splitlines() if line.startswith(ERROR_PREFIX)]
    assert len(errors) == 1, run.output[-3000:]  # refused at once, not waiting for a peer
    assert "over 2 devices (cpu, cuda:0)" in errors[0] and "a device mesh of 2 ranks" in errors[0]
    assert "started 1 process (WORLD_SIZE=1)" in errors[0] and "nothing was run" in errors[0]
    assert "--nproc-per-node 2 -m backends.tensor_parallel" in errors[0]
    assert rank_errors(run.output, ERROR_PREFIX) == errors[0].strip()  # what check_ranks and the CLI report
    assert not any(tmp_path.iterdir())  # no rank wrote results
    assert Path(plan.source).read_bytes() == before


@pytest.mark.slow
def test_hetpart_launch_runs_and_checks_a_plan_with_splits(tmp_path: Path, capsys) -> None:
    from partitioner.cli import main as cli_main
    from tests.e2e.tensor_parallel_models import mlp

    model, inputs = mlp()
    spec = f"{HERE / 'tensor_parallel_models.py'}:mlp"
    plan = split_plan(model, inputs, tmp_path / "mlp.json", model_name=spec)
    assert cli_main(["launch", plan.source]) == 0
    printed = capsys.readouterr().out
    assert "2 split linears over 2 tensor-parallel ranks" in printed
    assert "torchrun --standalone --nproc-per-node 2 -m backends.tensor_parallel" in printed
    assert cli_main(["launch", plan.source, "--run", "--check", "--training", "--steps", "2"]) == 2
    assert "drop --steps" in capsys.readouterr().err
    assert cli_main(["launch", plan.source, "--run", "--check", "--training", "--bind", "cuda:0=cpu",
                     "--timeout", "60"]) == 0
    out = capsys.readouterr().out
    assert "ran 1 step on 2 local ranks" in out and "tensor-parallel group of 2 ranks (2 linears sharded)" in out
    assert "rank 1 0.weight" in out and "rank 0 loss" in out


@pytest.mark.slow
def test_gpt_small_with_its_mlps_as_split_regions_on_two_ranks_equals_the_model(tmp_path: Path) -> None:
    """Each MLP as Megatron runs it (ColwiseParallel with its output left sharded, gelu on each rank's
    block, RowwiseParallel with its input sharded): outputs, loss and gathered gradients equal the model."""
    model, inputs = models.get("gpt", "small")
    plan, _, _ = region_plan(model, inputs, tmp_path / "gpt-regions.json", fractions=(0.5,), heads=False,
                             model_name="gpt:small")
    layout = layout_of(plan, model, inputs)
    assert all(s.region for s in layout.linears) and len(layout.linears) == 8
    blocks = {f"blocks.{i}.mlp.{m}" for i in range(4) for m in ("ff1", "ff2")}
    (tmp_path / "run").mkdir()
    _run_and_compare(plan, model, inputs, "gpt:small", blocks, tmp_path / "run")


@pytest.mark.slow
def test_an_hf_llama_with_its_swiglu_as_a_split_region_on_two_ranks_equals_the_model(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from tests.e2e.tensor_parallel_models import llama

    model, inputs = llama()
    plan, _, _ = region_plan(model, inputs, tmp_path / "llama-regions.json", fractions=(0.5,), heads=False)
    layout = layout_of(plan, model, inputs)
    assert {s.module for s in layout.linears} == {f"lm.model.layers.0.mlp.{m}" for m in ("gate_proj", "up_proj",
                                                                                       "down_proj")}
    assert all(s.region for s in layout.linears)
    report = check_ranks(plan, model, inputs, model_spec=f"{HERE / 'tensor_parallel_models.py'}:llama",
                         options=RunOptions(training=True, device_map=CPU_RANKS, timeout_s=120), run_timeout_s=300)
    assert report.passed, report.to_text()


@pytest.mark.slow
def test_gpt_small_with_its_attention_and_mlps_as_split_regions_on_two_ranks_equals_the_model(tmp_path: Path) -> None:
    """Each attention as Megatron runs it (q/k/v ColwiseParallel with their heads left sharded, each
    rank's ``SelfAttention.n_heads`` set to its 4 of 8 heads, o_proj RowwiseParallel with its input
    sharded) and each MLP as a region: outputs, loss and gathered gradients equal the model."""
    model, inputs = models.get("gpt", "small")
    plan, _, _ = region_plan(model, inputs, tmp_path / "gpt-attention.json", fractions=(0.5,), model_name="gpt:small")
    layout = layout_of(plan, model, inputs)
    assert all(s.region for s in layout.linears) and len(layout.linears) == 24
    assert [(h.module, h.attribute, h.counts) for h in layout.heads] == [
        (f"blocks.{i}.attn", "n_heads", (4, 4)) for i in range(4)]
    assert model.blocks[0].attn.n_heads == 8  # the caller's model is not changed
    blocks = {f"blocks.{i}.{m}" for i in range(4) for m in ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj",
                                                              "mlp.ff1", "mlp.ff2")}
    (tmp_path / "run").mkdir()
    _run_and_compare(plan, model, inputs, "gpt:small", blocks, tmp_path / "run")


@pytest.mark.slow
@pytest.mark.parametrize("factory", ["llama_mha", "llama"])
def test_an_hf_llama_with_its_attention_and_swiglu_as_split_regions_on_two_ranks_equals_the_model(
        factory: str, tmp_path: Path) -> None:
    """HF Llama, with as many key/value heads as query heads (``llama_mha``) or grouped ones (``llama``:
    4 query heads, 2 key/value heads): its attention as a region across ranks, its views with ``-1``
    heads and its ``repeat_kv`` computing with each rank's 2 of 4 heads and 1 of 2 key/value heads
    from the tensors' shapes (no head count to set), the rotary tables and mask computed whole on
    every rank; its SwiGLU as a region too."""
    pytest.importorskip("transformers")
    from tests.e2e import tensor_parallel_models

    model, inputs = getattr(tensor_parallel_models, factory)()
    plan, _, _ = region_plan(model, inputs, tmp_path / "llama-attention.json", fractions=(0.5,))
    layout = layout_of(plan, model, inputs)
    linears = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
               "mlp.up_proj", "mlp.down_proj")
    assert {s.module for s in layout.linears} == {f"lm.model.layers.0.{m}" for m in linears}
    assert all(s.region for s in layout.linears) and layout.heads == ()
    report = check_ranks(plan, model, inputs, model_spec=f"{HERE / 'tensor_parallel_models.py'}:{factory}",
                         options=RunOptions(training=True, device_map=CPU_RANKS, timeout_s=120), run_timeout_s=300)
    assert report.passed, report.to_text()
