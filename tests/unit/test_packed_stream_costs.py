"""What streaming packed weights costs (``Problem.stream_forms`` and the stream prices, evaluate):
a linear computing in a packed choice on the GPU with its weights in host memory moves its packed
bytes over the link, the host holds them packed, the GPU a reused buffer of that size; in training
a streamed weight is float32; the ILP's (device, dtype, streamed) answer is evaluate's; the plan
file records the streamed packed bytes (``precision.streamed``) and counts a streamed weight's
copies in the form streamed; the streamer swaps a float weight for its packed tensors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cost_models.precision import packed_weight_bytes, resolve_precision
from cost_models.profiles import load_profile
from partitioner import from_module
from partitioner.solvers.ilp import solve_ilp
from partitioner.solvers.problem import Options, Placement, Problem, StreamMode, evaluate

OUT, IN = 256, 512


def _problem(setting, *, memory: str | None = None, training: bool = False, model: nn.Module | None = None,  # noqa: ANN001
             rows: int = 4) -> Problem:
    model = model or nn.Sequential(nn.Linear(IN, OUT), nn.ReLU(), nn.Linear(OUT, OUT))
    graph = from_module(model, (torch.randn(rows, IN),))
    profile = load_profile("h200-host")
    if memory is not None:
        profile = profile.with_memory({"cuda:0": memory})
    return Problem(graph, profile, Options(training=training, precision=resolve_precision(setting, profile)))


def _linears(p: Problem) -> list[str]:
    return [n for n in p.nodes if p.original.ops[n].kind == "aten.linear.default"]


def test_a_packed_linear_streams_its_packed_bytes_and_holds_them_packed_on_the_host() -> None:
    p = _problem({"weights": "int8"})
    first = _linears(p)[0]
    (choice,) = p.choices[first]["cuda:0"]
    assert choice == "float32+int8" and p.stream_forms(first, "cuda:0") == (choice,)
    packed = packed_weight_bytes(OUT, IN, "int8") + 4 * OUT  # values, a bfloat16 scale per row, the float32 bias
    assert p.stream_bytes(first, "cuda:0", choice) == packed
    assert p.stream_mem(first, "cuda:0", choice) == packed
    assert p.stream_buffer_bytes(first, StreamMode.PREFETCH, "cuda:0", choice) == 2 * packed
    assert p.node_stream_s(first, "cpu", "cuda:0", StreamMode.PREFETCH, choice) == pytest.approx(
        p.stream_s(packed, "cpu", "cuda:0", StreamMode.PREFETCH))

    device = {n: "cuda:0" for n in p.nodes}
    ev = evaluate(p, Placement(device, {first: "cpu"}, precision={n: p.default_dtype(n, "cuda:0") for n in p.nodes}))
    assert ev.feasible, ev.violations
    (copy,) = [t for t in ev.transfers if t.kind == "weights"]
    assert (copy.tensor, copy.src, copy.dst, copy.bytes) == (first, "cpu", "cuda:0", packed)
    resident = evaluate(p, Placement(device, precision={n: p.default_dtype(n, "cuda:0") for n in p.nodes}))
    assert ev.memory["cpu"] == resident.memory["cpu"] + packed  # the host holds the packed form
    # the GPU trades the packed weight for a double buffer of its size: one packed weight more
    assert ev.memory["cuda:0"] == resident.memory["cuda:0"] - packed + 2 * packed


def test_with_several_forms_the_weights_stream_in_the_form_the_node_computes_in() -> None:
    p = _problem({"activations": "auto", "weights": "auto"})
    first = _linears(p)[0]
    forms = p.stream_forms(first, "cuda:0")
    assert {"float32", "bfloat16", "bfloat16+int8", "bfloat16+int4"} <= set(forms)
    sizes = {a: p.stream_bytes(first, "cuda:0", a) for a in ("float32", "bfloat16", "bfloat16+int8", "bfloat16+int4")}
    assert sizes["float32"] > sizes["bfloat16"] > sizes["bfloat16+int8"] > sizes["bfloat16+int4"]
    assert sizes["bfloat16+int4"] == packed_weight_bytes(OUT, IN, "int4") + 2 * OUT
    device = {n: "cuda:0" for n in p.nodes}
    for a, nbytes in sizes.items():
        ev = evaluate(p, Placement(device, {first: "cpu"}, precision={first: a}))
        assert ev.feasible, ev.violations
        assert [t.bytes for t in ev.transfers if t.kind == "weights"] == [nbytes]


def test_training_streams_float32_master_weights_only() -> None:
    p = _problem("auto", training=True)
    first = _linears(p)[0]
    assert p.stream_forms(first, "cuda:0") == ("float32",)
    device = {n: "cuda:0" for n in p.nodes}
    ev = evaluate(p, Placement(device, {first: "cpu"}, precision={first: "bfloat16"}))
    assert any(f"op {first} streams its weights held as float32" in v for v in ev.violations), ev.violations


def test_the_ilp_streams_packed_weights_when_the_cap_holds_only_their_buffer() -> None:
    """Six 512x512 linears packed in int8, 1024 rows (the GPU is far faster), and a GPU cap below the
    largest working set plus every packed weight but above it plus a double buffer: the ILP keeps
    them on the GPU by streaming some packed, and its objective is evaluate's."""
    model = nn.Sequential(*[nn.Linear(IN, IN) for _ in range(6)])
    each = packed_weight_bytes(IN, IN, "int8") + 4 * IN
    working = 2 * 1024 * IN * 4  # one linear's input and output
    p = _problem({"weights": "int8"}, memory=str(working + 2 * each + 100_000), model=model, rows=1024)
    linears = _linears(p)
    assert all(p.stream_bytes(n, "cuda:0", "float32+int8") == each for n in linears)
    sol = solve_ilp(p, time_limit=30, gap=0.0)
    ev = evaluate(p, sol.placement)
    assert ev.feasible and sol.objective == pytest.approx(ev.total_s, rel=1e-6)
    assert set(sol.placement.device.values()) == {"cuda:0"}
    streamed = [n for n, home in sol.placement.streamed.items() if home != sol.placement.device[n]]
    assert len(streamed) >= 3 and all(p.dtype_of(sol.placement, n) == "float32+int8" for n in streamed)
    assert sum(t.bytes for t in ev.transfers if t.kind == "weights") == each * len(streamed)


def test_the_plan_records_streamed_packed_weights_and_refuses_edits() -> None:
    import json

    from partitioner import Plan, partition
    from partitioner.errors import HetpartError

    model = nn.Sequential(*[nn.Linear(IN, IN) for _ in range(6)])
    each = packed_weight_bytes(IN, IN, "int8") + 4 * IN
    plan = partition(model, (torch.randn(1024, IN),), "h200-host", precision={"weights": "int8"},
                     memory={"cuda:0": str(2 * 1024 * IN * 4 + 2 * each + 100_000)}, time_limit=30)
    streamed = plan.precision["streamed"]
    assert len(streamed) >= 3 and set(streamed.values()) == {each} and set(streamed) <= set(plan.weights)
    assert f"streamed packed: {len(streamed)} linears cpu -> cuda:0" in plan.summary()
    assert Plan.from_json(plan.to_json()).precision["streamed"] == streamed
    data = json.loads(plan.to_json())
    op = next(iter(streamed))
    data["precision"]["streamed"][op] = 4 * IN * IN  # float32 bytes where the plan streams packed ones
    with pytest.raises(HetpartError, match=r"precision.streamed\['.*'\]: .* bytes per step, but .* holds"):
        Plan.from_json(json.dumps(data))
    data = json.loads(plan.to_json())
    data["precision"]["streamed"]["no_such_op"] = each
    with pytest.raises(HetpartError, match="precision.streamed"):
        Plan.from_json(json.dumps(data))


def test_a_plan_streaming_16_bit_weights_counts_their_16_bit_bytes() -> None:
    """The plan file's implied weight copies use the form streamed: a bf16 plan that streams weights
    is built and read back (the check once counted their float32 bytes and refused the plan)."""
    from partitioner import Plan, partition

    model = nn.Sequential(*[nn.Linear(IN, IN) for _ in range(6)])
    half = 2 * IN * IN + 2 * IN  # a bf16 weight and bias
    plan = partition(model, (torch.randn(1024, IN),), "h200-host", precision={"cpu": "bf16", "cuda:0": "bf16"},
                     memory={"cuda:0": str(2 * 1024 * IN * 2 + 2 * half + 100_000)}, time_limit=30)
    copies = [t for t in plan.transfers if t.kind == "weights"]
    assert copies and all(t.bytes == half for t in copies), plan.summary()
    assert all(plan.precision["ops"].get(op) == "bfloat16" for op in plan.weights)
    assert Plan.from_json(plan.to_json()).weights == plan.weights


def test_the_streamer_refuses_to_replace_a_weight_it_does_not_fetch() -> None:
    from backends.torch.streaming import WeightStreamer
    from partitioner.errors import HetpartError

    module = nn.Linear(4, 4)
    streamer = WeightStreamer(module, [("weight", "cpu")])
    module.register_buffer("weight_int8_qweight", torch.zeros(4, 4, dtype=torch.int8))
    module.register_buffer("weight_int8_scales", torch.ones(4))
    streamer.replace("weight", ["weight_int8_qweight", "weight_int8_scales"])
    assert streamer.order == ["weight_int8_qweight", "weight_int8_scales"]
    assert streamer.get("weight_int8_scales", "cpu").tolist() == [1.0] * 4
    with pytest.raises(HetpartError, match="fetches no 'bias'.*emit it again"):
        streamer.replace("bias", ["bias_int8_qweight"])
