"""One record for what a plan is asked: reachable from every entry point, validated once, recorded.

``partitioner.options.PlanOptions`` is what ``partition``'s keywords, ``hetpart plan``'s flags and
the compile backend's options build; it refuses bad values and combinations when it is made (each
refusal naming both options), plans record it, and ``hetpart plan --like`` re-solves from it.
"""

from __future__ import annotations

import argparse
import inspect
import json
from pathlib import Path

import pytest

import models
from partitioner import Plan, partition
from partitioner.cli import main as cli_main
from partitioner.errors import HetpartError
from partitioner.options import FIELDS, META, PlanOptions, UnknownOption, options_table
from partitioner.plan import PlanFormatError

REPO = Path(__file__).resolve().parents[2]


def _subparser(command: str) -> argparse.ArgumentParser:
    from partitioner.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def test_every_option_is_a_keyword_of_partition_with_its_default() -> None:
    params = inspect.signature(partition).parameters
    for name, meta in META.items():
        assert name in params, f"partition does not take option {name!r}"
        if name != "devices":  # positional there, its default filled by the record
            assert params[name].default == meta["default"], name
    assert "options" in params


def test_every_option_is_a_flag_of_the_cli_or_says_how_the_cli_sets_it() -> None:
    plan, fit = _subparser("plan"), _subparser("fit")
    for name, meta in META.items():
        flag = meta["flag"]
        assert flag, f"option {name!r} names no CLI flag"
        if flag.startswith("hetpart fit "):
            parser, flag = fit, flag.removeprefix("hetpart fit ")
        elif flag.startswith("--"):
            parser = plan
        else:  # a sentence: set from the model or printed by the CLI
            assert flag.startswith("(") and flag.endswith(")"), (name, flag)
            continue
        actions = {s: a for a in parser._actions for s in a.option_strings}
        assert flag in actions, f"option {name!r}: hetpart has no flag {flag}"
        if parser is plan and name != "input_shapes":  # --input-shape reaches the model loader first
            assert actions[flag].dest == name, f"{flag} sets {actions[flag].dest!r}, not the option {name!r}"


def test_the_readme_options_table_is_the_records() -> None:
    text = (REPO / "README.md").read_text()
    start, end = text.index("<!-- options:start -->\n"), text.index("<!-- options:end -->")
    assert text[start + len("<!-- options:start -->\n"):end].strip() == options_table()


def test_help_of_partition_lists_every_option() -> None:
    doc = partition.__doc__ or ""
    for name in FIELDS:
        assert f"        {name} (default " in doc, name


@pytest.mark.parametrize(("keywords", "names"), [
    ({"precision": "auto", "objective": "makespan"}, ("precision", "makespan")),
    ({"precision": "auto", "objective": "throughput", "stages": 2}, ("precision", "pipeline stages")),
    ({"fallbacks": [0.5], "objective": "throughput", "stages": 2}, ("fallback", "stages")),
    ({"batch": "auto", "training": True, "objective": "throughput", "micro_batches": 2}, ("batch sizing",
                                                                                          "micro_batches")),
    ({"batch": "auto", "training": True, "dynamic_shapes": ("batch",)}, ("batch sizing", "dynamic_shapes")),
    ({"batch": "auto"}, ("batch sizing", "training")),
    ({"micro_batches": 2}, ("--micro-batches", "--objective latency")),
])
def test_each_refused_combination_names_both_options(keywords: dict, names: tuple[str, str]) -> None:
    with pytest.raises(HetpartError) as caught:
        PlanOptions.build(**keywords)
    for name in names:
        assert name in str(caught.value), (name, str(caught.value))


@pytest.mark.parametrize(("name", "value"), [
    ("memory", ["cuda:0", "2GB"]), ("time_limit", "10"), ("gap", 1.5), ("pins", "emb*"), ("coarsen", "maybe"),
    ("streaming", "yes"), ("training", "yes"), ("align_modules", "Block"), ("micro_batches", 0), ("stages", 1.5),
    ("schedule", "zigzag"), ("devices", 3), ("fallbacks", [1.5]), ("objective", "speed"), ("link_budget", [1]),
])
def test_an_ill_typed_value_is_refused_naming_the_option(name: str, value: object) -> None:
    with pytest.raises(HetpartError, match=name.split("_")[0]):
        PlanOptions.build(**{name: value})


def test_an_unknown_keyword_is_refused_listing_the_options() -> None:
    module, inputs = models.get("mlp", "tiny")
    with pytest.raises(UnknownOption, match="memroy.*the options are devices, memory") as caught:
        partition(module, inputs, "h200-host", memroy={"cuda:0": "1KB"})
    assert isinstance(caught.value, TypeError)


def test_the_record_whole_and_keywords_give_the_same_plan_and_keywords_replace_its_fields() -> None:
    module, inputs = models.get("mlp", "tiny")
    keywords = {"memory": {"cuda:0": "20KB"}, "training": True, "optimizer": "sgd", "solver": "highs"}
    by_keywords = partition(module, inputs, "h200-host", **keywords)
    whole = partition(module, inputs, options=PlanOptions.build(devices="h200-host", **keywords))
    assert dict(whole.placement) == dict(by_keywords.placement)
    assert whole.request == by_keywords.request
    replaced = partition(module, inputs, options=PlanOptions.build(**keywords), optimizer="adam")
    assert replaced.optimizer == "adam" and replaced.request["optimizer"] == "adam"


def test_a_plan_records_its_request_and_reads_it_back(tmp_path: Path) -> None:
    module, inputs = models.get("mlp", "tiny")
    plan = partition(module, inputs, "h200-host", memory={"cuda:0": "20KB"}, pins={"layers.0*": "cpu"},
                     align_modules=("Linear",), time_limit=30)
    request = PlanOptions.from_record(plan.request)
    assert request.hardware.memory == {"cuda:0": "20KB"} and request.constraints.pins == {"layers.0*": "cpu"}
    assert request.constraints.align_modules == ("Linear",) and request.search.time_limit == 30
    assert "progress" not in plan.request  # a callback is not part of the record
    loaded = Plan.load(plan.save(tmp_path / "plan.json"))
    assert loaded == plan and loaded.request == plan.request
    data = json.loads((tmp_path / "plan.json").read_text())
    data["request"]["gap"] = 7
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(PlanFormatError, match="request.*gap"):
        Plan.load(tmp_path / "bad.json")
    data["request"] = {"memroy": {}}
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(PlanFormatError, match="request.*memroy"):
        Plan.load(tmp_path / "bad.json")


def test_fallback_plans_derive_their_request_from_the_primarys() -> None:
    module, inputs = models.get("mlp", "small")
    plan = partition(module, inputs, "h200-host", memory={"cuda:0": "200KB"}, fallbacks=[0.5], solver="highs",
                     time_limit=20)
    (fallback,) = plan.fallbacks
    asked = fallback.plan.request
    assert asked["fallbacks"] is None and asked["solver"] == "highs" and asked["time_limit"] == 20
    assert asked["memory"]["cuda:0"] == fallback.plan.devices.device("cuda:0").memory < 200_000


def test_a_plan_is_re_solved_from_itself_with_another_cap(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    assert cli_main(["plan", "mlp:small", "--memory", "cuda:0=10MB", "--training", "--optimizer", "sgd",
                     "--pin", "layers.0*=cpu", "-o", str(first)]) == 0
    assert cli_main(["plan", "--like", str(first), "--memory", "cuda:0=100KB", "-o", str(second)]) == 0
    a, b = Plan.load(first), Plan.load(second)
    assert b.model_name == a.model_name == "mlp:small"
    assert b.request["memory"] == {"cuda:0": "100KB"} and b.devices.device("cuda:0").memory == 100_000
    assert b.training and b.optimizer == "sgd" and b.request["pins"] == {"layers.0*": "cpu"}
    assert b.memory["cuda:0"]["used"] <= 100_000
    capsys.readouterr()
    assert cli_main(["explain", str(second), "layers.0"]) == 0
    assert "the plan was asked: memory cuda:0=100KB, pins layers.0*=cpu, training True, optimizer sgd" \
        in capsys.readouterr().out
