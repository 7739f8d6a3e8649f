"""The torch.compile backend's options, their errors and the plan cache they key (real dynamo graphs, real solves).

The cache tests hand the backend one graph dynamo captured (``HetpartBackend()(gm, inputs, options)``,
as torch.compile calls it), so each option change costs a solve, not a dynamo compile.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import models
from backends.compile import HetpartBackend, parse_options
from backends.compile.cache import disagreements
from backends.compile.options import KNOWN, CompileOptions
from partitioner import Plan
from partitioner.errors import HetpartError, ProfileError, UnitError

PROFILE = "h200-host"
BIND = {"cuda:0": "cpu"}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# -- A6: errors inside the backend reach the user as themselves ---------------------------------


def _raised_by_compiled_call(options: dict) -> BaseException:
    model, inputs = models.get("mlp", "tiny")
    compiled = torch.compile(model, backend=HetpartBackend(), options={"device_map": BIND, **options})
    with pytest.raises(BaseException) as info, torch.no_grad():
        compiled(*inputs)
    return info.value


@pytest.mark.parametrize("options, kind, sentence", [
    ({"devices": "no-such-profile"}, ProfileError, "no profile 'no-such-profile': built-in profiles are"),
    ({"devices": PROFILE, "memory": {"cuda:0": "lots"}}, UnitError, "memory cap for cuda:0: 'lots' is not valid"),
    ({"devices": PROFILE, "memory": {"tpu:9": "1GB"}}, ProfileError, "no device 'tpu:9' in profile"),
    ({"devices": PROFILE, "optimizer": "lion", "training": True}, HetpartError,
     "option 'optimizer' must be one of sgd, sgd-momentum, adam, adamw, adagrad, sparse-adam; got 'lion'"),
    ({"devices": 5}, HetpartError, "option 'devices' must be a built-in profile name"),
    ({"devices": PROFILE, "plan_dir": 5}, HetpartError, "option 'plan_dir' must be the path of a folder"),
])
def test_profile_unit_and_option_errors_reach_the_user_with_their_sentence(options: dict, kind: type,
                                                                          sentence: str) -> None:
    err = _raised_by_compiled_call(options)
    assert isinstance(err, kind), f"{type(err).__name__}: {err}"
    assert not isinstance(err, torch._dynamo.exc.BackendCompilerFailed)
    assert str(err).startswith(sentence), str(err)
    assert "takes no keyword arguments" not in str(err)


# -- A7: every option is checked, naming the option ----------------------------------------------


@pytest.mark.parametrize("name, value", [
    ("time_limit", "10"), ("time_limit", 0), ("time_limit", math.inf), ("time_limit", math.nan), ("time_limit", True),
    ("gap", 1.0), ("gap", -0.1), ("gap", "0.01"), ("gap", math.nan),
    ("memory", ["8GB"]), ("memory", "8GB"), ("memory", {"cuda:0": 1.5}), ("memory", {"cuda:0": True}),
    ("memory", {0: "8GB"}),
    ("pins", [("layers.0", "cpu")]), ("pins", {"layers.0": 0}), ("device_map", {"cuda:0": 1}), ("device_map", "cpu"),
    ("objective", "fastest"), ("objective", 1), ("optimizer", "lion"), ("training", "yes"), ("training", 1),
    ("streaming", "yes"), ("streaming", 1), ("coarsen", "maybe"), ("coarsen", 0), ("solver", ""), ("solver", 3),
    ("devices", 5), ("devices", ""), ("devices", None), ("plan_dir", 5), ("plan_dir", ""),
])
def test_an_ill_typed_option_is_refused_naming_it(name: str, value: object) -> None:
    with pytest.raises(HetpartError, match=f"^option '{name}'") as err:
        parse_options({name: value})
    assert repr(value) in str(err.value) or repr(next(iter(value))) in str(err.value)  # what was given


def test_well_typed_options_are_kept() -> None:
    opts = parse_options({"devices": Path("profiles/x.toml"), "plan_dir": Path("plans"), "coarsen": False,
                          "streaming": False, "time_limit": 3, "gap": 0.0, "training": None, "memory": {"cpu": 10**6}})
    assert opts.devices == "profiles/x.toml" and opts.plan_dir == "plans" and opts.coarsen is False
    assert opts.time_limit == 3 and opts.gap == 0.0


# -- A7 / issue 36: the cache key covers every option that changes a plan ----------------------


@pytest.fixture(scope="module")
def dynamo_graph():
    """The graph (and example inputs) dynamo hands a backend for the tiny MLP."""
    model, inputs = models.get("mlp", "tiny")
    seen = []

    def capture(gm, example_inputs):
        seen.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=capture)(*inputs)
    torch._dynamo.reset()
    (found,) = seen
    return found


#: a second value for every option that changes a plan (the base is CompileOptions' default, or BASE)
CHANGED = {
    "devices": "cpu-gpu-npu",  # with npu:0 bound too (CHANGES)
    "memory": {"cpu": "40KB"},
    "objective": "throughput",
    "pins": {"layers.0": "cuda:0"},
    "training": True,
    "optimizer": "sgd",
    "solver": "greedy",
    "time_limit": 7.0,
    "gap": 0.05,
    "streaming": False,
    "coarsen": False,
    "detect_margin": 0.1,
    "no_split": ("Linear",),
    "align_modules": ("Linear",),
    "link_budget": {"cpu<->cuda:0": 10**9},
    "contiguous_stages": True,
}
#: the options each change sets
CHANGES = {name: {name: value} for name, value in CHANGED.items()}
CHANGES["devices"]["device_map"] = {"cuda:0": "cpu", "npu:0": "cpu"}
#: options that do not change a plan (device_map: the cpu bound to itself as well)
IRRELEVANT = {"device_map": {"cpu": "cpu"}, "plan_dir": None}
BASE = {"devices": PROFILE, "device_map": BIND, "training": False}


def test_every_option_is_either_plan_relevant_or_not() -> None:
    """A new option must be sorted here: into CHANGED (the cache key must cover it) or IRRELEVANT."""
    assert set(CHANGED) | set(IRRELEVANT) == set(KNOWN) and not set(CHANGED) & set(IRRELEVANT)


def _compile(backend: HetpartBackend, graph, options: dict) -> str:
    gm, inputs = graph
    with torch.no_grad():
        backend(gm, inputs, options)
    return backend.records[-1].plan_from


@pytest.mark.parametrize("changed", sorted(CHANGED))
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(irrelevant=st.sets(st.sampled_from(sorted(IRRELEVANT))))
def test_changing_one_plan_option_misses_the_cache_in_memory_and_on_disk(
        dynamo_graph, tmp_path_factory: pytest.TempPathFactory, changed: str, irrelevant: set[str]) -> None:
    folder = tmp_path_factory.mktemp("plans")
    base = dict(BASE, plan_dir=str(folder / "base"))
    other = dict(base, **CHANGES[changed])
    backend = HetpartBackend()
    assert _compile(backend, dynamo_graph, base) == "solved"
    assert _compile(backend, dynamo_graph, other) == "solved", f"{changed} changed: the cache must miss"
    same = dict(other)
    if "device_map" in irrelevant:
        same["device_map"] = dict(other["device_map"], **IRRELEVANT["device_map"])
    assert _compile(backend, dynamo_graph, same) == "memory", f"only {sorted(irrelevant)} changed: a hit"
    # on disk: a fresh process (a new backend) finds each plan it was made for, and only that
    assert _compile(HetpartBackend(), dynamo_graph, same) == "disk"
    shutil.rmtree(folder / "base")
    assert _compile(HetpartBackend(), dynamo_graph, base) == "solved"
    assert _compile(HetpartBackend(), dynamo_graph, other) == "solved", f"{changed} changed: the disk cache must miss"


# -- A7 / B1: a plan_dir entry is used only when it loads, verifies and was made under these options


def _saved_plan(graph, options: dict) -> tuple[Path, Plan]:
    backend = HetpartBackend()
    _compile(backend, graph, options)
    record = backend.records[-1]
    return Path(record.path), record.plan


@pytest.mark.parametrize("changed", ["pins", "solver", "objective", "optimizer", "streaming", "gap"])
def test_a_plan_made_under_other_options_is_not_served_from_its_file(
        dynamo_graph, tmp_path: Path, caplog: pytest.LogCaptureFixture, changed: str) -> None:
    options = dict(BASE, plan_dir=str(tmp_path), training=changed == "optimizer")
    path, plan = _saved_plan(dynamo_graph, options)
    other_path, other = _saved_plan(dynamo_graph, dict(options, **CHANGES[changed]))
    assert other_path != path
    shutil.copyfile(other_path, path)  # the other options' plan, under this key's name
    backend = HetpartBackend()
    with caplog.at_level(logging.WARNING, logger="hetpart"):
        assert _compile(backend, dynamo_graph, options) == "solved"
    said = " ".join(r.getMessage() for r in caplog.records)
    assert str(path) in said and "made under other options" in said, said
    assert Plan.load(path) == backend.records[-1].plan  # the file now holds this options' plan


def _truncated(text: str) -> str:
    return text[: len(text) // 2]


def _wrong_version(text: str) -> str:
    data = json.loads(text)
    data["format_version"] = 999
    return json.dumps(data)


def _placement_names_a_missing_device(text: str) -> str:
    data = json.loads(text)
    first = next(iter(data["placement"]))
    data["placement"][first] = "tpu:7"
    return json.dumps(data)


@pytest.mark.parametrize("damage", [_truncated, _wrong_version, _placement_names_a_missing_device,
                                    lambda text: "\x00\xff" * 40, lambda text: ""])
def test_a_plan_dir_entry_that_does_not_load_or_verify_is_solved_again_with_a_log_line(
        dynamo_graph, tmp_path: Path, caplog: pytest.LogCaptureFixture, damage) -> None:
    options = dict(BASE, plan_dir=str(tmp_path))
    path, plan = _saved_plan(dynamo_graph, options)
    path.write_text(damage(path.read_text()), encoding="utf-8", errors="surrogateescape")
    backend = HetpartBackend()
    with caplog.at_level(logging.WARNING, logger="hetpart"):
        assert _compile(backend, dynamo_graph, options) == "solved"
    said = [r.getMessage() for r in caplog.records if str(path) in r.getMessage()]
    assert said and "solving again" in said[0], said
    assert Plan.load(path) == backend.records[-1].plan


def _placement_only_edit(plan: Plan) -> str:
    """The plan's file with every op moved to the other device, memory left as recorded."""
    other = {"cpu": "cuda:0", "cuda:0": "cpu"}
    data = json.loads(plan.to_json())
    data["placement"] = {op: other[d] for op, d in data["placement"].items()}
    return json.dumps(data)


def test_a_plan_dir_entry_whose_placement_was_edited_is_solved_again(
        dynamo_graph, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    options = dict(BASE, plan_dir=str(tmp_path), memory={"cpu": "40KB", "cuda:0": "40KB"})
    path, plan = _saved_plan(dynamo_graph, options)
    path.write_text(_placement_only_edit(plan), encoding="utf-8")
    backend = HetpartBackend()
    with caplog.at_level(logging.WARNING, logger="hetpart"):
        assert _compile(backend, dynamo_graph, options) == "solved"
    assert any(str(path) in r.getMessage() for r in caplog.records)


def test_disagreements_name_each_option_a_plan_records(dynamo_graph) -> None:
    backend = HetpartBackend()
    _compile(backend, dynamo_graph, dict(BASE, pins={"layers.0": "cuda:0"}))
    record = backend.records[-1]
    from partitioner.frontends.fx import from_graph_module

    graph = from_graph_module(*dynamo_graph)
    planning = parse_options(dict(BASE, pins={"layers.0": "cuda:0"})).planning(False).flat()
    assert disagreements(record.plan, graph, planning) == []
    for name, value, said in [("objective", "throughput", "objective is 'latency'"),
                              ("training", True, "training is False"), ("optimizer", "sgd", "optimizer is 'adam'"),
                              ("streaming", False, "streaming is True"), ("pins", {"layers.0": "cpu"}, "pinned to"),
                              ("pins", None, "by no pin given"), ("solver", "greedy", "its solver is 'ilp:highs'"),
                              ("solver", "cbc", "not the ILP with cbc"), ("gap", 0.2, "gap 0.01")]:
        found = disagreements(record.plan, graph, dict(planning, **{name: value}))
        assert any(said in w for w in found), (name, value, found)
