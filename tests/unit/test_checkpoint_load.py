"""Reading checkpoint tensors into place: straight in, or through a staging buffer smaller than a tensor.

A safetensors file of a plain module (no transformers) is read into destinations of the stored
dtype (``pread`` into their bytes), of another dtype (cast chunk by chunk through a 1000-byte
staging buffer, so chunks end mid-tensor and never mid-element), and from a ``torch.save`` file.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from backends.torch.checkpoint_files import weight_files
from backends.torch.checkpoint_keys import plan_keys
from backends.torch.checkpoint_load import fill, wanted_of
from partitioner.errors import CheckpointError


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(37, 23), torch.nn.LayerNorm(23), torch.nn.Linear(23, 5))
    net.register_buffer("scale", torch.tensor(3.0))  # a 0-dim persistent buffer
    return net


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_tensors_are_read_in_place_or_through_a_small_staging_buffer(tmp_path: Path, dtype: torch.dtype) -> None:
    net = model()
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, tmp_path / "model.safetensors")
    files = weight_files(tmp_path)
    wanted = wanted_of(net.to(dtype))
    keys = plan_keys(net, wanted, files, cast=dtype is not torch.float32)
    destinations = {w.names[0]: torch.full(w.shape, float("nan"), dtype=dtype) for w in wanted}
    stats = fill(destinations, keys, files, staging_bytes=1000)
    for name, value in model().state_dict().items():
        torch.testing.assert_close(destinations[name], value.to(dtype), rtol=0, atol=0)
    stored = sum(v.numel() * 4 for v in model().state_dict().values())
    assert stats.bytes_read == stored
    assert stats.staged_bytes == (0 if dtype is torch.float32 else stored)
    assert stats.staging_bytes == (0 if dtype is torch.float32 else 1000)


def test_a_dtype_mismatch_without_a_cast_is_refused(tmp_path: Path) -> None:
    net = model()
    save_file(dict(net.state_dict()), tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"key '0\.(weight|bias)' in model.safetensors is float32, and "
                                              r"the model is built in float16: ask for the dtype \(--dtype float16"):
        plan_keys(net, wanted_of(net.half()), weight_files(tmp_path))


def test_a_torch_save_file_is_read_memory_mapped(tmp_path: Path) -> None:
    net = model()
    torch.save(net.state_dict(), tmp_path / "weights.pt")
    files = weight_files(tmp_path, tmp_path / "weights.pt")
    assert {s.offset for s in files.tensors.values()} == {None}
    wanted = wanted_of(net)
    destinations = {w.names[0]: torch.empty(w.shape) for w in wanted}
    fill(destinations, plan_keys(net, wanted, files), files)
    for name, value in net.state_dict().items():
        assert torch.equal(destinations[name], value)
