"""Split regions (:mod:`partitioner.solvers.split_regions`): which graphs hold one, which placements
form one, what it saves, and that the emitter's fx view finds the same regions as the planner's."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from backends.torch.module import unlifted_module
from backends.torch.split_regions import fx_steps
from partitioner import from_module, load_profile
from partitioner.solvers.problem import Objective, Options, Placement, Problem, evaluate
from partitioner.solvers.split_regions import RegionOffer, graph_steps, graph_widths, region_candidates, regions_of
from partitioner.solvers.splits import Split, SplitOptions

X = torch.randn(64, 32)


class SwiGLU(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate, self.up, self.down = torch.nn.Linear(32, 128), torch.nn.Linear(32, 128), torch.nn.Linear(128, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


class Leaky(torch.nn.Module):
    """fc1's output is also a graph output: it must be rejoined, so no region."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(32, 128), torch.nn.Linear(128, 32)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.fc1(x)
        return self.fc2(torch.relu(h)), h


class Scaled(torch.nn.Module):
    """A learned scale between the linears: an interior op reading a parameter, so no region."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(32, 128), torch.nn.Linear(128, 32)
        self.scale = torch.nn.Parameter(torch.ones(128))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x) * self.scale)


class Attention(torch.nn.Module):
    """gpt:small's attention at 4 heads of 8: q, k, v cut by heads, o_proj the row."""

    def __init__(self, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (torch.nn.Linear(32, 32) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (p(x).unflatten(-1, (self.heads, -1)).transpose(1, 2) for p in (self.q, self.k, self.v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).flatten(2))


class Rotary(torch.nn.Module):
    """Llama-style attention at 4 heads: rotary tables and an additive mask computed outside the
    region (read whole by every shard), views with ``-1`` heads; ``kv`` key/value heads (fewer:
    grouped, repeated to the query heads as HF's ``repeat_kv`` does, or by ``repeat_interleave``)."""

    def __init__(self, kv: int = 4, interleave: bool = False) -> None:
        super().__init__()
        self.kv, self.interleave = kv, interleave
        self.q, self.o = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)
        self.k, self.v = torch.nn.Linear(32, 8 * kv), torch.nn.Linear(32, 8 * kv)
        self.register_buffer("inv", 1.0 / 10000 ** (torch.arange(0, 8, 2) / 8), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        freqs = torch.arange(t, dtype=torch.float32)[:, None] * self.inv
        angles = torch.cat([freqs, freqs], -1)
        cos, sin = angles.cos()[None, None], angles.sin()[None, None]
        mask = torch.full((t, t), -1e4).triu(1)[None, None]

        def rotate(u: torch.Tensor) -> torch.Tensor:
            return u * cos + torch.cat([-u[..., 4:], u[..., :4]], -1) * sin

        q, k, v = (p(x).view(b, t, -1, 8).transpose(1, 2) for p in (self.q, self.k, self.v))
        q, k = rotate(q), rotate(k)
        if self.kv < 4 and self.interleave:
            k, v = (u.repeat_interleave(4 // self.kv, 1) for u in (k, v))
        elif self.kv < 4:  # HF's repeat_kv
            k, v = (u[:, :, None].expand(b, self.kv, 4 // self.kv, t, 8).reshape(b, 4, t, 8) for u in (k, v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class Residual(torch.nn.Module):
    """A full-width tensor from outside added between the linears: each shard would need its own
    slice of it, not the whole, so no region."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(32, 128), torch.nn.Linear(128, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)) + x.repeat(1, 4))


def _mlp(act: torch.nn.Module) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 128), act, torch.nn.Linear(128, 32)).eval()


CASES = {
    "mlp": (lambda: _mlp(torch.nn.GELU()), [(("linear",), ("gelu",), "linear_1")]),
    "tanh-gelu": (lambda: _mlp(torch.nn.GELU(approximate="tanh")), [(("linear",), ("gelu",), "linear_1")]),
    "swiglu": (SwiGLU, [(("linear", "linear_1"), ("silu", "mul"), "linear_2")]),
    "back to back": (lambda: _mlp(torch.nn.Identity()), [(("linear",), (), "linear_1")]),
    "softmax between": (lambda: _mlp(torch.nn.Softmax(-1)), []),
    "also an output": (Leaky, []),
    "a parameter between": (Scaled, []),
    "attention by heads": (Attention, [(("linear", "linear_1", "linear_2"), ("unflatten", "transpose", "unflatten_1",
                                       "transpose_1", "unflatten_2", "transpose_2", "scaled_dot_product_attention",
                                       "transpose_3", "flatten"), "linear_3")]),
    "heads as many as tokens": (lambda: Attention(16), []),  # which dim a transpose moves is unclear: no region
    "rotary attention": (Rotary, [(("linear", "linear_1", "linear_2"), None, "linear_3")]),
    "grouped heads": (lambda: Rotary(kv=2), [(("linear", "linear_1", "linear_2"), None, "linear_3")]),
    "grouped heads by repeat_interleave": (lambda: Rotary(kv=2, interleave=True), []),  # an index_select: no region
    "a full-width tensor between": (Residual, []),
}
INPUTS = {  # (batch, tokens, features); the others take X
    "attention by heads": X.reshape(2, 32, 32),
    "heads as many as tokens": X.reshape(4, 16, 32),
    "rotary attention": X.reshape(2, 32, 32),
    "grouped heads": X.reshape(2, 32, 32),
    "grouped heads by repeat_interleave": X.reshape(2, 32, 32),
}


@pytest.mark.parametrize("case", list(CASES))
def test_candidates_are_found_alike_on_the_op_graph_and_on_the_emitters_fx_graph(case: str) -> None:
    build, expected = CASES[case]
    module = build().eval()
    graph = from_module(module, (INPUTS.get(case, X),))
    found = region_candidates(graph_steps(graph), graph_widths(graph))
    assert [(r.cols, r.interior if e[1] is not None else None, r.row) for r, e in zip(found, expected)] == expected
    assert len(found) == len(expected)
    granule = 8 * (4 // module.kv) if isinstance(module, Rotary) else 8 if isinstance(module, Attention) else 1
    assert all(r.granule == granule for r in found)  # a head's features (grouped: a key/value head's group's)
    assert all(bool(r.outside) == isinstance(module, Rotary) for r in found)  # the rotary tables and the mask
    fx = region_candidates(fx_steps(unlifted_module(graph)), graph_widths(graph))
    assert fx == found


def _problem(objective: Objective = Objective.LATENCY) -> Problem:
    graph = from_module(SwiGLU().eval(), (X,))
    return Problem(graph, load_profile("h200-host"), Options(objective=objective, streaming=False, splits=SplitOptions(
        fractions=(0.25, 0.5), proportional=False, balanced=False)))


def _placement(problem: Problem, cols: Split, row: Split, interior: str | None = None) -> Placement:
    region = problem.region_offer.regions[0]
    node = problem.region_offer.node_of
    device = {n: cols.home for n in problem.nodes}
    device.update({node[e]: interior or cols.home for e in region.interior})
    split = {node[c]: cols for c in region.cols}
    split[node[region.row]] = row
    device[node[region.row]] = row.home
    return Placement(device, split=split)


def test_a_region_forms_only_where_its_members_agree_and_its_interior_runs_at_home() -> None:
    p = _problem()
    cols = Split("cols", ("cuda:0", "cpu"), (0.5, 0.5))
    row = dataclasses.replace(cols, axis="rows")
    assert regions_of(p, _placement(p, cols, row)) == ((0, cols),)
    assert regions_of(p, _placement(p, cols, dataclasses.replace(row, fractions=(0.25, 0.75)))) == ()
    assert regions_of(p, _placement(p, cols, Split("rows", ("cpu", "cuda:0"), (0.5, 0.5)))) == ()
    assert regions_of(p, _placement(p, cols, dataclasses.replace(cols, axis="cols"))) == ()
    assert regions_of(p, _placement(p, cols, row, interior="cpu")) == ()


@pytest.mark.parametrize("objective", [Objective.LATENCY, Objective.THROUGHPUT])
def test_a_formed_region_saves_its_dropped_copies_and_evaluate_prices_them(objective: Objective) -> None:
    """Against the same splits one by one (the interior ops then rejoined on the home), a region
    drops each col's copy back and the row's copy out: per link, exactly their hops; the latency sum
    and busy times change by the region's price; the copies left are the cols' inputs out and the
    row's partial back."""
    p = _problem(objective)
    cols = Split("cols", ("cuda:0", "cpu"), (0.5, 0.5))
    row = dataclasses.replace(cols, axis="rows")
    formed = evaluate(p, _placement(p, cols, row))
    price = p.region_offer.price[(0, cols)]
    assert len(price.dropped) == 3 and price.latency_s < 0  # gate's and up's shards back, down's input out
    copies = sorted((t.tensor, t.src, t.dst) for t in formed.transfers if t.kind == "split")
    assert copies == [("linear", "cuda:0", "cpu"), ("linear_1", "cuda:0", "cpu"), ("linear_2", "cpu", "cuda:0")]
    label = p.link_labels[0]
    dropped = sum(p.hop_s(b, s, d, label) for _, s, d, b, _ in price.dropped)
    made = sum(t.seconds for t in formed.transfers)  # the graph's input in and output back, the split copies kept
    assert formed.per_link_s[label] == pytest.approx(made, rel=1e-9)
    assert dropped > 0 and price.work_bytes[1] > 0 and formed.memory["cpu"] > 0
    separate_problem = copy.copy(p)  # the same problem offering no region: the splits priced one by one
    separate_problem.region_offer = RegionOffer()
    separate = evaluate(separate_problem, _placement(p, cols, row))
    if objective is Objective.LATENCY:
        assert formed.critical_path_s == pytest.approx(separate.critical_path_s + price.latency_s, rel=1e-9)
    for d, change in zip(cols.devices, price.busy_s):
        assert formed.per_device_s[d] == pytest.approx(separate.per_device_s[d] + change, rel=1e-9, abs=1e-15)
    assert separate.per_link_s[label] - formed.per_link_s[label] == pytest.approx(dropped, rel=1e-9)


def test_a_region_reading_outside_tensors_copies_each_home_to_every_other_device() -> None:
    """Rotary attention: its interior reads the rotary tables and the mask whole. Formed, each is
    copied from the home to the other device (a ``split`` transfer named after the op making it),
    those copies sit on the link in ``evaluate``, in the price's latency and in the other device's
    working set, beside the dropped copies."""
    graph = from_module(Rotary().eval(), (X.reshape(2, 32, 32),))
    p = Problem(graph, load_profile("h200-host"), Options(streaming=False, splits=SplitOptions(
        fractions=(0.5,), proportional=False, balanced=False)))
    (region,) = p.region_offer.regions
    assert len(region.outside) == 3  # cos, sin, the mask
    cols = Split("cols", ("cuda:0", "cpu"), (0.5, 0.5))
    placement = _placement(p, cols, dataclasses.replace(cols, axis="rows"))
    assert regions_of(p, placement) == ((0, cols),)
    price = p.region_offer.price[(0, cols)]
    sizes = {o: graph.tensors[graph.ops[o].outputs[0]].nbytes for o in region.outside}
    assert [(o, s, d, b) for o, s, d, b, _ in price.added] == [(o, "cuda:0", "cpu", sizes[o]) for o in region.outside]
    ev = evaluate(p, placement)
    made = {(t.tensor, t.src, t.dst): t.bytes for t in ev.transfers if t.kind == "split"}
    assert all(made[(o, "cuda:0", "cpu")] == sizes[o] for o in region.outside)
    label = p.link_labels[0]
    assert ev.per_link_s[label] == pytest.approx(sum(t.seconds for t in ev.transfers), rel=1e-9)
    assert price.work_bytes[1] >= sum(sizes.values())


def test_a_grouped_heads_region_forms_only_where_each_shard_holds_whole_groups() -> None:
    """Rotary attention with 2 key/value heads for 4 query heads (q 32 features, k and v 16): the
    granule is a group (2 query heads, 16 features); at 0.5 each shard holds one group (q 16, k and v
    8: proportional), at 0.25 a shard would hold one query head of a group: no region."""
    graph = from_module(Rotary(kv=2).eval(), (X.reshape(2, 32, 32),))
    p = Problem(graph, load_profile("h200-host"), Options(streaming=False, splits=SplitOptions(
        fractions=(0.25, 0.5), proportional=False, balanced=False)))
    (region,) = p.region_offer.regions
    assert region.granule == 16 and [graph_widths(graph)[c][0] for c in region.cols] == [32, 16, 16]
    for f, forms in ((0.5, True), (0.25, False)):
        cols = Split("cols", ("cuda:0", "cpu"), (f, 1 - f))
        placement = _placement(p, cols, dataclasses.replace(cols, axis="rows"))
        assert bool(regions_of(p, placement)) == forms, f
        assert evaluate(p, placement).feasible
