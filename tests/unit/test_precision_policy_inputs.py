"""Ops with mask or index inputs under a 16-bit precision plan: what the policy gives them, and
that their masks and indices are never cast.

The model reads int64 token ids (an embedding), a boolean mask (``masked_fill``) and int64
indices (``gather``, ``index_select``), and makes a boolean mask from floats (``> 0``). Under
bf16 the ops computing on float values (embedding, the comparison ``> 0``, linear, masked_fill,
gather, index_select) compute in bfloat16 (``flexible`` in :mod:`cost_models.precision`: they
compute in float32 as traced and read a float tensor or weight), the ops on masks and indices
(``unsqueeze`` and ``~`` of the mask, ``select`` of the indices) stay as traced (``native``) and
softmax in float32 (``fixed``). The emitted
module, run under a dispatch mode that records every aten call's argument dtypes, feeds the
indices and masks in their own dtypes, computes the flexible ops on bfloat16 values, and its
outputs equal the model's (the boolean output exactly, the float one within bfloat16's tolerance).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from backends.compare import EXACT
from backends.torch.check import check_plan
from partitioner import partition

BF16 = {"cuda:0": "bf16", "cpu": "bf16"}


class MaskIndex(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.proj = nn.Linear(16, 16)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, ...]:
        e = self.emb(tokens)                                  # (4, 6, 16) from int64 ids
        positive = e > 0                                      # a mask made from floats
        h = self.proj(e).masked_fill(~mask.unsqueeze(-1), 0.0)
        g = torch.gather(h, 1, index)                         # int64 indices, (4, 3, 16)
        rows = torch.index_select(g, 1, index[0, :, 0])       # int64 indices again
        return torch.softmax(rows, dim=-1), positive


class ArgDtypes(TorchDispatchMode):
    """Records, per aten op name, the dtypes of its tensor arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, list[tuple[torch.dtype, ...]]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        dtypes = tuple(a.dtype for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor))
        self.calls.setdefault(func.__name__.split(".")[0], []).append(dtypes)
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def setup():  # noqa: ANN201
    torch.manual_seed(0)
    module = MaskIndex().eval()
    tokens = torch.randint(0, 50, (4, 6))
    mask = torch.rand(4, 6) > 0.3
    index = torch.randint(0, 3, (4, 3, 16))
    inputs = (tokens, mask, index)
    plan = partition(module, inputs, "h200-host", precision=BF16, pins={"*": "cpu"}, time_limit=20)
    return module, inputs, plan




def test_the_policy_puts_float_ops_with_mask_or_index_inputs_in_16_bits_and_masks_as_traced(setup) -> None:
    module, inputs, plan = setup
    ops = plan.precision["ops"]
    by_kind: dict[str, set[str]] = {}
    for op in plan.placement:
        base = op.rstrip("_0123456789") or op
        by_kind.setdefault(base, set()).add(op)
    for kind in ("embedding", "gt", "linear", "masked_fill", "gather", "index_select"):
        assert by_kind.get(kind), (kind, sorted(plan.placement))
        assert all(ops.get(op) == "bfloat16" for op in by_kind[kind]), (kind, ops)
    for kind in ("unsqueeze", "bitwise_not", "select", "softmax"):
        assert by_kind.get(kind), (kind, sorted(plan.placement))
        assert not any(op in ops for op in by_kind[kind]), (kind, ops)


def test_masks_and_indices_are_fed_uncast_and_the_outputs_equal_the_model(setup) -> None:
    module, inputs, plan = setup
    emitted = plan.emit(module)
    recorder = ArgDtypes()
    with torch.no_grad(), recorder:
        out = emitted(*inputs)
    calls = recorder.calls
    assert calls["embedding"] == [(torch.bfloat16, torch.int64)]            # bf16 weight, int64 ids
    assert calls["masked_fill"] == [(torch.bfloat16, torch.bool)]          # bf16 values, the mask as is
    assert calls["gather"] == [(torch.bfloat16, torch.int64)]
    assert calls["index_select"] == [(torch.bfloat16, torch.int64)]
    assert calls["gt"] == [(torch.bfloat16,)]                                # compares bf16 values
    assert calls["bitwise_not"] == [(torch.bool,)]
    assert all(dtypes == (torch.int64,) for dtypes in calls["select"])
    with torch.no_grad():
        expected = module(*inputs)
    assert out[1].dtype is torch.bool and torch.equal(out[1], expected[1])
    torch.testing.assert_close(out[0], expected[0], rtol=1.6e-2, atol=1e-2)
    report = check_plan(plan, module, inputs, repeat=1)
    assert report.passed, report.to_text()
    mask_row = [e for e in report.outputs if e.dtype == "bool"]
    assert mask_row and all(e.tolerance == EXACT for e in mask_row)        # a mask is compared exactly
