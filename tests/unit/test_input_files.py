"""Every file hetpart reads from a path a user gives is a regular file of bounded size: a FIFO, a
device or a folder is refused at once with one line naming the path and the fix, never read (a
FIFO would block forever, ``/dev/zero`` read until memory runs out)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cost_models.cluster import load_cluster
from cost_models.cost_table import CostTable
from cost_models.measure_cache import MeasurementCache
from cost_models.profiles import load_profile
from partitioner import Plan
from partitioner.cli.args import read_inputs
from partitioner.errors import HetpartError
from partitioner.files import open_input, read_bytes, read_text
from partitioner.frontends.onnx_load import load_onnx

DEVICE = Path("/dev/zero")


def refused_at_once(read: Callable[[], Any], fifo: Path) -> HetpartError:
    """The error ``read()`` raises within seconds; a reader blocked on ``fifo`` is released and the test fails."""
    outcome: list[BaseException | None] = []

    def attempt() -> None:
        try:
            read()
            outcome.append(None)
        except BaseException as err:  # noqa: BLE001 - handed to the test below
            outcome.append(err)

    reader = threading.Thread(target=attempt, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)   # let the blocked reader go: it read the FIFO
        os.close(fd)
        reader.join(10)
        pytest.fail(f"reading {fifo} blocked on the FIFO")
    assert outcome and isinstance(outcome[0], HetpartError), outcome
    return outcome[0]


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe.json"
    os.mkfifo(path)
    return path


READERS: dict[str, Callable[[Path], Any]] = {
    "measurement cache": MeasurementCache.load,
    "costs file": CostTable.load,
    "--input": lambda p: read_inputs([f"x={p}"]),
    "plan": Plan.load,
    "profile": load_profile,
    "cluster profile": load_cluster,
    "ONNX model": load_onnx,
}


@pytest.mark.parametrize("what", READERS)
def test_a_fifo_is_refused_without_blocking(what: str, fifo: Path) -> None:
    err = refused_at_once(lambda: READERS[what](fifo), fifo)
    assert str(fifo) in str(err) and "FIFO, not a regular file" in str(err)
    assert "\n" not in str(err)


@pytest.mark.parametrize("what", ["measurement cache", "costs file", "--input", "plan", "ONNX model"])
def test_a_device_is_refused_before_it_is_read(what: str, tmp_path: Path) -> None:
    if not DEVICE.exists():
        pytest.skip("no /dev/zero here")
    link = tmp_path / "data.json"
    link.symlink_to(DEVICE)   # a link is followed: what it points to is what is read
    for path in (DEVICE, link):
        with pytest.raises(HetpartError, match="character device, not a regular file") as err:
            READERS[what](path)
        assert str(path) in str(err.value)


def test_a_folder_is_refused_and_a_link_to_a_regular_file_is_read(tmp_path: Path) -> None:
    with pytest.raises(HetpartError, match="is a folder, not a regular file: give the --input x array"):
        read_inputs([f"x={tmp_path}"])
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.save(tmp_path / "x.npy", array)
    (tmp_path / "link.npy").symlink_to(tmp_path / "x.npy")
    assert np.array_equal(read_inputs([f"x={tmp_path / 'link.npy'}"])["x"], array)


def test_a_file_over_its_bound_is_refused_unread(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_bytes(b"{" + b" " * 4096 + b"}")
    with pytest.raises(HetpartError, match=r"4,098 bytes, over the 1,024 a costs file may be"):
        read_text(big, what="costs file", max_bytes=1024)
    assert read_bytes(big, what="costs file", max_bytes=1 << 20)[:1] == b"{"
    with open_input(big, what="costs file", max_bytes=1 << 20) as f:
        assert f.read(1) == b"{"
    with pytest.raises(FileNotFoundError):
        open_input(tmp_path / "missing.json", what="costs file", max_bytes=1024)
