"""Training plans that hold saved activations on the host: the planner's choice under a cap, the
plan section (ops and bytes) read back and checked, the summary line, and edits refused by name."""

from __future__ import annotations

import json

import pytest

import models
from partitioner import Plan, partition_outcome
from partitioner.plan import PlanFormatError
from partitioner.solvers.problem import evaluate

#: gpt:small's parameters with Adam, half its saved activations and its largest working set
CAP = {"cuda:0": 84_632_576 + 14_090_240 + 8_650_752}
#: only the activations may give: no recompute, no optimizer state away, no weight streaming
ONLY = dict(recompute=False, offload=False, streaming=False, save_on_host=True)


@pytest.fixture(scope="module")
def outcome():
    module, inputs = models.get("gpt", "small")
    return partition_outcome(module, inputs, "h200-host", memory=CAP, training=True, time_limit=20, **ONLY)


def test_the_cap_moves_saved_activations_to_the_host(outcome) -> None:
    plan, p = outcome.plan, outcome.problem
    held = plan.training_state["saved_on_host"]
    assert held and outcome.solution.placement.saved_on_host
    assert all(plan.placement[op] == "cuda:0" for op in held)
    # the bytes are each op's saved activations as the problem counts them
    node_of = {op: n for n in p.nodes for op in p.members[n]}
    for op, nbytes in held.items():
        n = node_of[op]
        assert nbytes == dict(zip(p.saved_ops[n], p.saved_parts_at[n]["float32"]))[op]
    copies = [t for t in outcome.evaluation.transfers if t.kind == "saved"]
    assert sum(t.bytes for t in copies) == 2 * sum(held.values())  # out in forward, back in backward
    assert plan.memory["cuda:0"]["used"] <= plan.memory["cuda:0"]["capacity"]
    line = next(x for x in plan.summary().splitlines() if "host-saved" in x)
    assert f"{len(held)} ops hold" in line and "MiB of saved activations on the host" in line


def test_without_the_choice_the_plan_is_slower(outcome) -> None:
    module, inputs = models.get("gpt", "small")
    off = partition_outcome(module, inputs, "h200-host", memory=CAP, training=True, time_limit=20,
                            **{**ONLY, "save_on_host": False})
    assert "saved_on_host" not in off.plan.training_state
    assert off.evaluation.total_s > outcome.evaluation.total_s
    assert evaluate(outcome.problem, outcome.solution.placement).total_s == pytest.approx(outcome.evaluation.total_s)


def test_the_section_round_trips_and_edits_to_it_are_refused(outcome, tmp_path) -> None:
    plan = outcome.plan
    path = plan.save(tmp_path / "plan.json")
    assert Plan.load(path) == plan
    data = json.loads(path.read_text())
    held = data["training_state"]["saved_on_host"]
    op = next(iter(held))
    edits = {
        "no_such_op": lambda d: d["training_state"]["saved_on_host"].__setitem__("no_such_op", 4),
        "also in training_state.recompute": lambda d: d["training_state"]["recompute"].append(op),
        "positive whole number of bytes": lambda d: d["training_state"]["saved_on_host"].__setitem__(op, 2.5),
    }
    for message, edit in edits.items():
        bad = json.loads(path.read_text())
        edit(bad)
        with pytest.raises(PlanFormatError, match=message):
            Plan.from_dict(bad)
    on_host = next(o for o, d in data["placement"].items() if d == "cpu")
    bad = json.loads(path.read_text())
    bad["training_state"]["saved_on_host"][on_host] = 4
    with pytest.raises(PlanFormatError, match=f"{on_host!r} computes on the host"):
        Plan.from_dict(bad)


def test_the_plan_checked_against_its_graph_refuses_edited_bytes(outcome) -> None:
    from partitioner.errors import PlanMismatch

    plan = outcome.plan
    graph = outcome.problem.original
    plan.check_graph(graph)  # as planned: the bytes are the graph's
    data = plan.to_dict()
    op, nbytes = next(iter(data["training_state"]["saved_on_host"].items()))
    data["training_state"]["saved_on_host"][op] = nbytes + 4
    with pytest.raises(PlanMismatch, match=rf"saved_on_host\['{op}'\] says {nbytes + 4:,} bytes, but {op} saves {nbytes:,}"):
        Plan.from_dict(data).check_graph(graph)
