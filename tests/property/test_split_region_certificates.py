"""The certificate with split regions, checked against brute force (``tests/property/oracle.py``).

Small captured graphs holding a region (:mod:`partitioner.solvers.split_regions`): an MLP
(``norm -> fc1 -> gelu -> fc2``), a SwiGLU (``silu(gate) * up -> down``), two linears back to
back and an MLP scaled by a gate computed outside the region (copied home to the other device), at a
few widths and token counts, on random two-device profiles (tight caps or not), latency
and throughput, with column and row splits offered at the same fractions. The brute-force optimum
runs every split choice through ``evaluate``, which derives the regions a placement forms; the ILP
at gap 0 must match it, report ``evaluate``'s objective and state a bound no higher (HiGHS cold and
warm; CBC on some draws), and the physical and memory-aware bounds must hold.
"""

from __future__ import annotations

import collections
import functools

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from models.synthetic import random_profile
from partitioner import from_module
from partitioner.solvers.ilp import solve_ilp
from partitioner.solvers.problem import Objective, Options, Placement, Problem, evaluate
from partitioner.solvers.split_regions import regions_of
from partitioner.solvers.splits import SplitOptions
from tests.property.oracle import count_candidates, optimum
from tests.property.test_certificates import check

SETTINGS = settings(max_examples=24, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
COUNTS: collections.Counter = collections.Counter()


class SwiGLU(torch.nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.gate, self.up = torch.nn.Linear(width, hidden), torch.nn.Linear(width, hidden)
        self.down = torch.nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


class Gated(torch.nn.Module):
    """An MLP whose activation is scaled by a gate computed outside the region (one per token, read
    whole by every shard: a copy from the home to the other device when the region forms)."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(width, hidden), torch.nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)) * torch.sigmoid(x.mean(-1, keepdim=True)))


@functools.lru_cache(maxsize=None)
def _graph(kind: str, width: int, tokens: int):  # noqa: ANN202 - an OpGraph
    torch.manual_seed(0)
    hidden = 4 * width
    module = {
        "mlp": lambda: torch.nn.Sequential(torch.nn.LayerNorm(width), torch.nn.Linear(width, hidden),
                                           torch.nn.GELU(), torch.nn.Linear(hidden, width)),
        "swiglu": lambda: SwiGLU(width, hidden),
        "pair": lambda: torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.Linear(hidden, width)),
        "gated": lambda: Gated(width, hidden),
    }[kind]().eval()
    return from_module(module, (torch.randn(tokens, width),))


@st.composite
def region_instances(draw: st.DrawFn) -> tuple[Problem, dict]:
    seed = draw(st.integers(0, 10**6))
    objective = draw(st.sampled_from([Objective.LATENCY, Objective.THROUGHPUT]))
    kind = draw(st.sampled_from(["mlp", "swiglu", "pair", "gated"]))
    graph = _graph(kind, draw(st.sampled_from([64, 256])), draw(st.sampled_from([8, 512])))
    profile = random_profile(seed, 2, tight=draw(st.booleans()))
    if draw(st.booleans()):  # the accelerator holds about half the weights: whole, the block does not fit
        weights = sum(op.param_bytes for op in graph.ops.values())
        working = max(sum(graph.tensors[t].nbytes for t in op.inputs + op.outputs) for op in graph.ops.values())
        profile = profile.with_memory({d.name: min(weights // 2 + 2 * working, d.memory)
                                       for d in profile.devices if d.name != "cpu"})
    fractions = draw(st.sampled_from(((0.5,), (0.25, 0.75))))
    splits = SplitOptions(fractions=fractions, proportional=False, balanced=draw(st.booleans()), axes=("cols", "rows"))
    streaming = draw(st.booleans())
    problem = Problem(graph, profile, Options(objective=objective, streaming=streaming, splits=splits))
    assume(problem.region_offer.price)
    assume(count_candidates(problem) <= 4000)
    COUNTS["outside tensors"] += bool(any(r.outside for r in problem.region_offer.regions))
    info = {"objective": objective.value, "pipeline": False, "streaming": streaming, "training": False,
            "tied": False, "coarsened": False, "pinned": False, "pinned producer, several consumers": False,
            "nodes": len(problem.nodes), "candidates": count_candidates(problem), "kind": kind}
    return problem, info


@SETTINGS
@given(case=region_instances(), warm=st.booleans(), cbc=st.booleans())
def test_region_certificate_holds(case: tuple[Problem, dict], warm: bool, cbc: bool) -> None:
    problem, info = case
    solver = "cbc" if cbc and COUNTS["cbc"] < 6 else "highs"
    COUNTS["cbc"] += solver == "cbc"
    failures = check(problem, info, solver, warm)
    assert not failures, (info, solver, failures)
    _, best = optimum(problem)
    COUNTS["instances"] += 1
    COUNTS[f"objective {info['objective']}"] += 1
    COUNTS["region in the optimum"] += bool(best is not None and regions_of(problem, best))


def test_region_instances_formed_regions() -> None:
    if COUNTS["instances"] == 0:
        pytest.skip("run with the property test above")
    assert COUNTS["region in the optimum"] > 0, f"no optimum formed a region: widen the strategy ({COUNTS})"
    assert COUNTS["objective latency"] and COUNTS["objective throughput"] and COUNTS["cbc"]
    assert COUNTS["outside tensors"], COUNTS


def test_the_mlp_forms_a_region_and_the_ilp_chooses_it_where_the_copies_dominate() -> None:
    """A wide MLP on a two-device profile capped at half its weights: both linears must split, the
    brute-force optimum forms the region, and the ILP (HiGHS and CBC) finds that optimum with the
    region's saving in its objective."""
    graph = _graph("mlp", 256, 512)
    profile = random_profile(7, 2)
    weights = sum(op.param_bytes for op in graph.ops.values())
    accel = next(d.name for d in profile.devices if d.name != "cpu")
    profile = profile.with_memory({accel: weights * 3 // 4})
    problem = Problem(graph, profile, Options(streaming=False, splits=SplitOptions(fractions=(0.5, 0.75),
                                                                                      proportional=False,
                                                                                      balanced=False)))
    best, arg = optimum(problem)
    assert arg is not None and regions_of(problem, arg), "brute force found no region better than separate splits"
    for solver in ("highs", "cbc"):
        sol = solve_ilp(problem, solver=solver, gap=0.0, time_limit=60)
        ev = evaluate(problem, sol.placement)
        assert ev.total_s == pytest.approx(best, rel=1e-6), solver
        assert sol.objective == pytest.approx(ev.total_s, rel=1e-6), solver
        assert regions_of(problem, sol.placement), solver


def test_an_attention_region_by_heads_is_priced_alike_by_the_ilp_and_evaluate() -> None:
    """gpt-style attention (q, k, v cut by heads into o_proj; too many nodes for brute force): at gap 0
    each solver's placement is evaluated at its reported objective, no worse than the placement
    forming the region by hand, and its bound is no higher."""
    import dataclasses

    from tests.unit.test_split_regions import Attention

    torch.manual_seed(0)
    graph = from_module(Attention().eval(), (torch.randn(2, 512, 32),))
    profile = random_profile(11, 2)
    problem = Problem(graph, profile, Options(streaming=False, splits=SplitOptions(fractions=(0.5,), proportional=False,
                                                                                   balanced=False)))
    offer = problem.region_offer
    (region,) = offer.regions
    accel = next(d.name for d in profile.devices if d.name != "cpu")
    cols = next(sp for i, sp in offer.price if sp.home == accel)
    device = {n: accel for n in problem.nodes}
    split = {offer.node_of[c]: cols for c in region.cols} | {offer.node_of[region.row]: dataclasses.replace(
        cols, axis="rows")}
    by_hand = Placement(device, split=split)
    assert regions_of(problem, by_hand) and evaluate(problem, by_hand).feasible
    for solver in ("highs", "cbc"):
        sol = solve_ilp(problem, solver=solver, gap=0.0, time_limit=60, warm_start=by_hand)
        ev = evaluate(problem, sol.placement)
        assert sol.objective == pytest.approx(ev.total_s, rel=1e-6), solver
        assert ev.total_s <= evaluate(problem, by_hand).total_s * (1 + 1e-9), solver
        assert sol.bound <= ev.total_s * (1 + 1e-6), solver
