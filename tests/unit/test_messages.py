"""What users are told: a "no placement fits" error suggests only what would change the answer, and
``Plan.save`` names the keyword a Python caller passes, the command line its flag."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import models
from models.onnx_models import export_zoo
from partitioner import partition
from partitioner.cli import main
from partitioner.errors import HetpartError, InfeasiblePlacement

TIGHT = {"cuda:0": "10KB", "cpu": "10KB"}  # gpt:tiny's weights fit nowhere, streamed or not


@pytest.fixture(scope="module")
def gpt_tiny() -> tuple:
    torch.manual_seed(0)
    return models.get("gpt", "tiny")


def _fix(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert message.startswith("no placement fits: ") and "To fix: raise the caps (--memory)" in message
    return message.split("To fix: ")[1]


def test_streaming_is_suggested_only_where_it_is_off(gpt_tiny: tuple) -> None:
    module, inputs = gpt_tiny
    with pytest.raises(InfeasiblePlacement) as on:  # streaming is on by default: suggesting it changes nothing
        partition(module, inputs, "h200-host", memory=TIGHT, time_limit=5)
    assert "streaming" not in _fix(on) and "pins" not in _fix(on)  # and there are no pins to remove
    with pytest.raises(InfeasiblePlacement) as off:
        partition(module, inputs, "h200-host", memory=TIGHT, streaming=False, time_limit=5)
    assert "allow weight streaming (drop --no-streaming; streaming=True)" in _fix(off)
    with pytest.raises(InfeasiblePlacement) as pinned:
        partition(module, inputs, "h200-host", memory=TIGHT, pins={"*": "cuda:0"}, time_limit=5)
    assert "remove pins" in _fix(pinned) and "streaming" not in _fix(pinned)


def test_an_onnx_model_is_never_told_to_stream_its_weights(tmp_path: Path) -> None:
    """ONNX models run as onnxruntime sessions, which never stream: the planner turns streaming off."""
    path = export_zoo("gpt", "tiny", tmp_path / "gpt.onnx")
    with pytest.raises(InfeasiblePlacement) as err:
        partition(path, devices="h200-host", memory=TIGHT, time_limit=5)
    assert "streaming" not in _fix(err)


def test_plan_save_names_the_keyword_and_the_cli_its_flag(gpt_tiny: tuple, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    module, inputs = gpt_tiny
    plan = partition(module, inputs, "h200-host", time_limit=5)
    path = plan.save(tmp_path / "plan.json")
    with pytest.raises(HetpartError, match=r"plan\.json exists: pass force=True to overwrite it$"):
        plan.save(path)
    plan.save(path, force=True)
    assert main(["plan", "mlp:tiny", "--time-limit", "5", "-o", str(path)]) == 2
    assert "plan.json exists: pass --force to overwrite it" in capsys.readouterr().err
