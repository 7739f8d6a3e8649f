"""Training plans carry where each parameter's state lives: the planner's choices, the section's
checks, the offload baselines beside them, and what bad requests are told."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest

import models
from partitioner import Plan, partition, partition_outcome
from partitioner.errors import InfeasiblePlacement
from partitioner.plan import PlanFormatError
from partitioner.solvers import TRAINING_BASELINES

CAP = {"cuda:0": "6MB"}


@pytest.fixture(scope="module")
def seed():
    return models.get("emb-transformer", "small")


@pytest.fixture(scope="module")
def plans(seed):
    module, inputs = seed
    return {opt: partition_outcome(module, inputs, "h200-host", memory=CAP, training=True, optimizer=opt,
                                   time_limit=20)
            for opt in ("sgd", "sparse-adam", "adam")}


def test_the_table_updates_row_sparse_exactly_with_sgd_lazily_with_sparse_adam_densely_with_adam(plans) -> None:
    table = {opt: out.plan.training_state["params"]["emb.weight"] for opt, out in plans.items()}
    assert table["sgd"]["update"] == "sparse" and table["sgd"]["exact"]
    assert table["sparse-adam"]["update"] == "sparse" and not table["sparse-adam"]["exact"]
    assert table["adam"]["update"] == "dense" and table["adam"]["exact"]
    # a row-sparse gradient is the rows a batch reads: far fewer bytes than the table
    sgd = plans["sgd"].problem
    node = next(n for n in sgd.nodes if "embedding" in sgd.members[n])
    assert sgd.grad_bytes[node] < sgd.trainable[node] / 4


def test_every_training_plan_lists_the_offload_baselines_and_is_not_slower_than_those_that_fit(plans) -> None:
    for out in plans.values():
        assert set(TRAINING_BASELINES) <= set(out.plan.baselines)
        for name, b in out.plan.baselines.items():
            if b.feasible:
                assert out.evaluation.total_s <= b.total_s * (1 + 1e-9), name


def test_the_cap_moves_optimizer_state_to_the_host(plans) -> None:
    plan = plans["adam"].plan
    host = plan.devices.host_device().name
    states = plan.training_state["params"].values()
    assert any(ps["state"] == host and ps["compute"] != host for ps in states)
    assert plan.memory["cuda:0"]["used"] <= plan.memory["cuda:0"]["capacity"]
    assert "training   adam:" in plan.summary() and "step       optimizer" in plan.summary()


def test_the_section_round_trips_and_edits_to_it_are_refused(plans, tmp_path) -> None:
    plan = plans["adam"].plan
    path = plan.save(tmp_path / "plan.json")
    assert Plan.load(path) == plan
    data = json.loads(path.read_text())
    name = next(n for n, ps in data["training_state"]["params"].items() if ps["compute"] == "cuda:0")
    data["training_state"]["params"][name]["state"] = "npu:9"
    with pytest.raises(PlanFormatError, match="npu:9"):
        Plan.from_dict(data)
    data["training_state"]["params"][name]["state"] = data["training_state"]["params"][name]["weights"]
    data["training_state"]["params"][name]["op"] = "no_such_op"
    with pytest.raises(PlanFormatError, match="no_such_op"):
        Plan.from_dict(data)
    with pytest.raises(PlanFormatError, match="re-plan"):  # an inference plan with a training state
        dataclasses.replace(plan, training=False)


def test_a_plan_written_before_streamed_states_reads_as_stepping_where_its_state_lives(plans) -> None:
    """Plans without the ``step`` key (every state stepped where it lives) read as they were."""
    from partitioner.plan.training_state import param_states

    plan = plans["adam"].plan
    data = plan.to_dict()
    for ps in data["training_state"]["params"].values():
        assert ps["step"] == ps["state"] or (ps["state"] == "cpu" and ps["step"] == ps["weights"])
        if ps["step"] == ps["state"]:
            del ps["step"]
    again = Plan.from_dict(data)
    assert again.training_state == plan.training_state
    assert {n: (s.state, s.step) for n, s in param_states(again).items()} == \
        {n: (s.state, s.step) for n, s in param_states(plan).items()}


def test_sparse_adam_without_a_table_says_every_parameter_steps_densely(caplog) -> None:
    module, inputs = models.get("mlp", "tiny")
    with caplog.at_level(logging.WARNING):
        plan = partition(module, inputs, "h200-host", training=True, optimizer="sparse-adam", time_limit=10)
    assert "no embedding table" in caplog.text
    assert "dense Adam" in plan.summary()
    assert all(ps["update"] == "dense" for ps in plan.training_state["params"].values())


def test_an_optimizer_hetpart_does_not_model_is_named_with_those_it_does() -> None:
    module, inputs = models.get("mlp", "tiny")
    with pytest.raises(ValueError, match="one of sgd, sgd-momentum, adam, adamw, adagrad, sparse-adam; got 'lion'"):
        partition(module, inputs, "h200-host", training=True, optimizer="lion")


def test_state_that_fits_nowhere_names_the_device_the_bytes_and_the_cap() -> None:
    module, inputs = models.get("mlp", "tiny")
    with pytest.raises(InfeasiblePlacement) as err:
        partition(module, inputs, "h200-host", memory={"cuda:0": "1KB", "cpu": "1KB"}, training=True, time_limit=10)
    text = str(err.value)
    assert "bytes" in text and ("cuda:0" in text or "cpu" in text) and "1,000" in text


def test_recompute_and_host_state_nothing_asks_for_are_undone(seed) -> None:
    """With room to spare, a plan keeps no recompute that costs time for nothing (tidy after the solve)."""
    from partitioner.solvers.problem import evaluate
    from partitioner.solvers.train_state import tidy

    module, inputs = seed
    out = partition_outcome(module, inputs, "h200-host", training=True, optimizer="adam", time_limit=20)
    p, placement = out.problem, out.solution.placement
    assert not placement.recompute  # no cap: nothing is worth recomputing
    forced = dataclasses.replace(placement, recompute=frozenset(p.recomputable[:3]))
    assert evaluate(p, forced).total_s > evaluate(p, placement).total_s
    import time
    tidied = tidy(p, forced, evaluate, time.perf_counter() + 30)
    assert not tidied.recompute and evaluate(p, tidied).total_s <= evaluate(p, forced).total_s
