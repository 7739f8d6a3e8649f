"""Split linears on a real GPU: shards on the CPU and on CUDA, in one process.

Skipped without CUDA (marker ``gpu``). The plan splits a 4,096 -> 32,768 head (512 MiB in float32)
over ``cuda:0`` and the CPU, both ways and on both axes; the emitted module keeps each shard's weight
on its own device (the CUDA shard's bytes on the GPU, never the whole weight), and its outputs and
gradients equal the original's (the gradient of the split weight joined from its shards).
"""

from __future__ import annotations

import pytest
import torch

from backends.compare import compare
from backends.torch.splits import joined_gradients
from partitioner import Plan, from_module, load_profile
from partitioner.solvers.problem import Options, Placement, Problem, Solution, Status
from partitioner.solvers.splits import Split, SplitOptions

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("axis", ["cols", "rows"])
@pytest.mark.parametrize("home", ["cpu", "cuda:0"])
def test_a_split_head_runs_on_the_cpu_and_the_gpu(axis: str, home: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.LayerNorm(4096), torch.nn.Linear(4096, 32768)).eval()
    inputs = (torch.randn(16, 4096),)
    graph = from_module(model, inputs)
    problem = Problem(graph, load_profile("h200-host"), Options(streaming=False, splits=SplitOptions(
        fractions=(0.75,), proportional=False, balanced=False, axes=(axis,))))
    node = next(iter(problem.split_choices))
    other = "cpu" if home == "cuda:0" else "cuda:0"
    sp = Split(axis, (home, other), (0.75, 0.25))
    placement = Placement({n: home for n in problem.nodes}, split={node: sp})
    plan = Plan.from_solution(problem, Solution("by hand", placement, Status.HEURISTIC))
    torch.cuda.reset_peak_memory_stats()
    emitted = plan.emit(model)
    on_gpu = sum(p.numel() * p.element_size() for p in emitted.parameters() if p.is_cuda)
    gpu_share = plan.splits[node]["bytes"][sp.devices.index("cuda:0")]
    layer_norm = 2 * 4096 * 4 if home == "cuda:0" else 0
    assert on_gpu == gpu_share + layer_norm
    assert torch.cuda.max_memory_allocated() < 512 * 2**20  # never the whole 512 MiB weight on the GPU
    out = emitted(*inputs)
    torch.testing.assert_close(out.cpu(), model(*inputs), rtol=1e-4, atol=1e-4)
    model.zero_grad()
    model(*inputs).sum().backward()
    out.sum().backward()
    grads = joined_gradients(emitted)
    for name, p in model.named_parameters():
        error = compare(name, grads[name], p.grad, summed=True)
        assert error.passed, error
