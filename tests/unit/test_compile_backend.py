"""The torch.compile backend's options, errors, logging and state copies (small graphs, real dynamo)."""

from __future__ import annotations

import logging
import traceback

import pytest
import torch

import models
from backends import BACKENDS, get_backend
from backends.compile import BACKEND, HetpartBackend, parse_options
from backends.compile.options import KNOWN
from backends.compile.state import ArgumentStreamer, StateCopies
from partitioner.errors import HetpartError, InfeasiblePlacement, PlanMismatch


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_the_backend_is_registered_with_the_interface() -> None:
    assert "compile" in BACKENDS and get_backend("compile") is BACKEND
    assert BACKEND.name == "compile" and BACKEND.runs


def test_options_parse_and_unknown_ones_list_the_known() -> None:
    opts = parse_options({"devices": "cpu-gpu-npu", "memory": {"cuda:0": "24KB"}, "time_limit": 5})
    assert opts.objective == "latency" and opts.time_limit == 5 and opts.training is None
    assert opts.profile().device("cuda:0").memory == 24_000
    with pytest.raises(HetpartError, match="unknown torch.compile option 'colour'") as err:
        parse_options({"colour": "blue"})
    for name in ("devices", "memory", "objective", "pins", "device_map", "training", "time_limit", "plan_dir"):
        assert name in KNOWN and name in str(err.value)
    with pytest.raises(HetpartError, match="option 'memory' must be a dict"):
        parse_options({"memory": "8GB"})
    with pytest.raises(HetpartError, match="option 'time_limit' must be a positive number"):
        parse_options({"time_limit": 0})


def test_the_options_key_changes_with_what_changes_a_plan() -> None:
    base = parse_options({"devices": "h200-host"})
    profile = base.profile()
    key = base.key(profile, training=False)
    assert key == parse_options({"devices": "h200-host", "device_map": {"cuda:0": "cpu"},
                                 "plan_dir": "x"}).key(profile, training=False)
    assert key != parse_options({"devices": "h200-host", "time_limit": 3}).key(profile, training=False)
    assert key != base.key(profile, training=True)
    assert key != parse_options({"devices": "h200-host", "objective": "throughput"}).key(profile, training=False)
    capped = parse_options({"devices": "h200-host", "memory": {"cuda:0": "1GB"}})
    assert key != capped.key(capped.profile(), training=False)


def _raised_by_compiled_call(options: dict) -> BaseException:
    model, inputs = models.get("mlp", "tiny")
    compiled = torch.compile(model, backend=HetpartBackend(), options=options)
    with pytest.raises(HetpartError) as info, torch.no_grad():
        compiled(*inputs)
    return info.value


def _dynamo_frames(err: BaseException) -> list[str]:
    frames = traceback.extract_tb(err.__traceback__)
    return [f.filename for f in frames if "_dynamo" in f.filename and not f.filename.endswith("eval_frame.py")]


def test_an_unknown_option_reaches_the_user_from_torch_compile() -> None:
    err = _raised_by_compiled_call({"devices": "cpu", "colour": "blue"})
    assert "unknown torch.compile option 'colour'" in str(err) and "plan_dir" in str(err)
    assert not isinstance(err, torch._dynamo.exc.BackendCompilerFailed)
    assert _dynamo_frames(err) == []


def test_an_infeasible_memory_option_names_the_device_bytes_and_cap() -> None:
    err = _raised_by_compiled_call({"devices": "h200-host", "memory": {"cuda:0": "1KB"},
                                    "pins": {"layers.0": "cuda:0"}, "device_map": {"cuda:0": "cpu"}})
    assert isinstance(err, InfeasiblePlacement)
    assert not isinstance(err, torch._dynamo.exc.BackendCompilerFailed)
    first = str(err).splitlines()[0]
    assert "device cuda:0 must hold at least 4,096 bytes" in first and "its cap is 1,000" in first, first
    assert _dynamo_frames(err) == [], "dynamo's own frames are cut from the traceback"


def test_an_unbound_device_says_how_to_bind_it() -> None:
    if torch.cuda.is_available():
        pytest.skip("cuda:0 is present here")
    err = _raised_by_compiled_call({"devices": "h200-host", "memory": {"cpu": "40KB"}})
    assert "device_map={'cuda:0': 'cpu'}" in str(err)


def test_mode_is_refused_with_the_way_to_pass_options() -> None:
    model, inputs = models.get("mlp", "tiny")
    with pytest.raises(HetpartError, match="takes options="):
        torch.compile(model, backend=HetpartBackend(), mode="max-autotune-no-cudagraphs")(*inputs)


@torch.library.custom_op("hetpart_test::mystery", mutates_args=())
def _mystery(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


@_mystery.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class _WithCustomOp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(_mystery(x)).relu()


def test_an_op_the_cost_model_never_saw_is_costed_by_the_fallback_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model, x = _WithCustomOp(), torch.randn(4, 8)
    backend = HetpartBackend()
    with caplog.at_level(logging.INFO, logger="hetpart"), torch.no_grad():
        out = torch.compile(model, backend=backend, options={"devices": "cpu"})(x)
    torch.testing.assert_close(out, model(x))
    (record,) = backend.records
    (unknown,) = [op for op in record.plan.placement if "mystery" in op]
    assert record.plan.predicted["per_op_s"][unknown] > 0, "memory-bound, not free"
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("hetpart")]
    assert any("no class for" in m and "hetpart_test::mystery" in m and "memory-bound" in m for m in lines), lines
    (info,) = [m for m in lines if "ops on" in m]
    assert "MLP" not in info and "_WithCustomOp [0/0] (fc)" in info and "solved in" in info and "gap" in info


def test_the_plan_summary_is_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    model, inputs = models.get("mlp", "tiny")
    with caplog.at_level(logging.DEBUG, logger="hetpart"), torch.no_grad():
        torch.compile(model, backend=HetpartBackend(), options={"devices": "cpu"})(*inputs)
    assert any(r.levelno == logging.DEBUG and "plan for" in r.getMessage() for r in caplog.records)


def test_given_plans_are_used_and_another_graph_is_a_mismatch(tmp_path) -> None:
    model, inputs = models.get("mlp", "tiny")
    first = HetpartBackend()
    with torch.no_grad():
        torch.compile(model, backend=first, options={"devices": "cpu"})(*inputs)
    plan = first.records[0].plan
    torch._dynamo.reset()
    report = BACKEND.check(plan, model, inputs, repeat=1)
    assert report.passed
    other, other_inputs = models.get("two-branch", "tiny")
    with pytest.raises(PlanMismatch, match="plans given were made for"), torch.no_grad():
        BACKEND.build(plan, other)(*other_inputs)


def test_state_copies_are_kept_until_the_tensor_changes() -> None:
    copies = StateCopies()
    w = torch.nn.Parameter(torch.ones(3))
    first = copies.get(w, "w", "cpu")
    assert first is not w and copies.get(w, "w", "cpu") is first
    with torch.no_grad():
        w.add_(1)                                   # an optimizer-style in-place update bumps the version
    second = copies.get(w, "w", "cpu")
    assert second is not first and torch.equal(second, torch.full((3,), 2.0))
    other = torch.nn.Parameter(torch.ones(3))       # another tensor under the same name
    assert torch.equal(copies.get(other, "w", "cpu"), torch.ones(3))


def test_the_argument_streamer_fetches_this_calls_weights() -> None:
    streamer = ArgumentStreamer([("a", "cpu"), ("b", "cpu")], StateCopies())
    a, b = torch.randn(4), torch.randn(2)
    streamer.bind(a, b)
    assert torch.equal(streamer.get("a", "cpu"), a) and torch.equal(streamer.get("b", "cpu"), b)
    streamer.bind(b * 0, a * 0)
    assert not streamer.get("a", "cpu").any()


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_inputs_updated_in_place_are_found(mode: str) -> None:
    from backends.compile.mutation import mutated_inputs

    model, inputs = models.get("convnet", "tiny")
    getattr(model, mode)()
    found: list[set[str]] = []

    def capture(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        found.append(mutated_inputs(gm, example_inputs))
        return gm.forward

    torch.compile(model, backend=capture)(*inputs)
    kinds = {name.split("_buffers_")[-1].rstrip("_") for name in found[0]}
    # batch_norm updates its running statistics without its schema saying so
    assert kinds == ({"running_mean", "running_var", "num_batches_tracked"} if mode == "train" else set())
