"""The global batch is bounded: at most MAX_GLOBAL_BATCH samples (hetpart fit --global-batch,
fit_batch, partition(batch=...)), and example inputs that would take more than half of the memory
available now when repeated to the global batch are refused before anything is allocated."""

from __future__ import annotations

import pytest
import torch

import models
from partitioner.batching import (
    MAX_GLOBAL_BATCH, check_batches, fit_batch, host_memory_available, input_bytes_at_batch, inputs_at_batch,
)
from partitioner.cli import main
from partitioner.errors import HetpartError

FACTORY = '''
import torch

class Wide(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(1_000_000, 2)

    def forward(self, x):
        return self.fc(x)

def build():
    return Wide(), (torch.zeros(1, 1_000_000),)      # 4 MB a row, real memory
'''


def test_a_global_batch_over_the_bound_is_refused_before_the_model_is_built(capsys):
    assert main(["fit", "mlp:tiny", "--global-batch", "100000000", "--training"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "global batch 100,000,000" in err and f"{MAX_GLOBAL_BATCH:,}" in err, err
    check_batches(MAX_GLOBAL_BATCH)
    with pytest.raises(HetpartError, match="over the 16,777,216 samples"):
        check_batches(MAX_GLOBAL_BATCH + 1)
    module, inputs = models.get("mlp", "tiny", device="meta")
    with pytest.raises(HetpartError, match="over the 16,777,216 samples"):
        fit_batch(module, inputs, "h200-host", global_batch=2**40)


def test_the_bytes_of_the_repeated_inputs_are_counted_without_allocating():
    x = torch.zeros(3, 5, dtype=torch.float16)               # 10 B a row
    # 7 rows: repeat(3) makes 9 rows, sliced after; 0-d, meta and already-large inputs take nothing
    assert input_bytes_at_batch((x, torch.tensor(1.0), torch.zeros(2, 5, device="meta")), 7) == 9 * 10
    assert input_bytes_at_batch(torch.zeros(8, 4), 8) == 0                          # a slice
    assert input_bytes_at_batch(torch.zeros(1, 2, 3, dtype=torch.int64), 4) == 4 * 2 * 3 * 8
    assert host_memory_available() > 0


def test_inputs_that_would_not_fit_in_memory_are_refused_before_allocating():
    x = torch.zeros(2, 1_000_000)                             # 4 MB a row
    with pytest.raises(HetpartError) as err:
        inputs_at_batch(x, 2**20)                             # 4 TiB
    msg = str(err.value)
    assert "global batch 1,048,576" in msg and "3.81 TiB" in msg and "of memory available now" in msg, msg
    meta = inputs_at_batch(torch.zeros(2, 1_000_000, device="meta"), 2**20)[0]   # shapes only: no bound
    assert meta.shape == (2**20, 1_000_000)


def test_hetpart_fit_refuses_a_factorys_real_inputs_at_a_global_batch_the_host_cannot_hold(tmp_path, capsys):
    path = tmp_path / "wide.py"
    path.write_text(FACTORY)
    assert main(["fit", f"{path}:build", "--global-batch", str(2**20), "--training"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("hetpart: error: global batch 1,048,576: the example inputs repeated"), err
