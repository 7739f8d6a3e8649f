"""The torch front end: both capture modes on every zoo model, hand-computed FLOPs, tied weights, errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

import models
from partitioner import from_graph_module, from_module
from partitioner.errors import CaptureError
from partitioner.ir import NOT_A_TENSOR, OpClass, OpGraph

CAPTURES = ("export", "symbolic_trace")
ZOO = [(name, capture) for name in models.names() for capture in CAPTURES]


def _capture(name: str, capture: str) -> OpGraph:
    if capture == "symbolic_trace" and not models.entry(name).symbolic_trace_ok:
        pytest.skip(f"{name}: {models.entry(name).symbolic_trace_note}")
    module, inputs = models.get(name, "tiny")
    return from_module(module, inputs, capture=capture, name=name)


@pytest.mark.parametrize(("name", "capture"), ZOO)
def test_every_zoo_model_captures_with_complete_metadata(name: str, capture: str) -> None:
    graph = _capture(name, capture)
    assert len(graph) > 0 and graph.inputs and graph.outputs
    for op in graph:
        assert op.outputs, op.name
        assert op.dtype, op.name
        for t in op.outputs:
            tensor = graph.tensors[t]
            assert tensor.producer == op.name
            if tensor.dtype != NOT_A_TENSOR:
                itemsize = getattr(torch, tensor.dtype).itemsize
                assert tensor.nbytes == math.prod(tensor.shape) * itemsize, (op.name, t)
        if op.op_class is OpClass.VIEW:
            assert op.flops == 0 and op.bytes_read == 0 and op.bytes_written == 0, op.name
        else:
            assert op.bytes_written > 0, op.name
    # every parameter the forward reads is counted exactly once, by its owner
    assert sum(op.param_bytes for op in graph) == graph.total_param_bytes()
    assert all(p.owner is not None and p.owner in graph.ops for p in graph.params.values())


@pytest.mark.parametrize(("name", "capture"), ZOO)
def test_capture_is_deterministic(name: str, capture: str) -> None:
    first, second = _capture(name, capture), _capture(name, capture)
    assert first.fingerprint() == second.fingerprint()
    assert [op.name for op in first] == [op.name for op in second]


def test_both_captures_agree_on_flops_and_parameters() -> None:
    for name in models.names():
        module, inputs = models.get(name, "tiny")
        exported = from_module(module, inputs, capture="export")
        traced = from_module(module, inputs, capture="symbolic_trace")
        assert exported.total_flops() == traced.total_flops(), name
        # symbolic_trace counts every buffer of a leaf module (BatchNorm's num_batches_tracked too)
        assert abs(exported.total_param_bytes() - traced.total_param_bytes()) <= 8 * 16, name


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


@pytest.mark.parametrize("capture", CAPTURES)
def test_mlp_flops_equal_hand_computed(capture: str) -> None:
    graph = from_module(_MLP(), torch.randn(4, 16), capture=capture)
    # fc1: 2·4·16·32 = 4096; relu: one per output element, 4·32 = 128; fc2: 2·4·32·8 = 2048
    assert graph.total_flops() == 4096 + 128 + 2048
    fc1 = next(op for op in graph if op.module_path == "fc1")
    assert fc1.op_class is OpClass.MATMUL and fc1.module_type == "Linear"
    # reads x (4·16) + weight (32·16) + bias (32) floats, writes 4·32 floats
    assert fc1.bytes_read == (64 + 512 + 32) * 4 and fc1.bytes_written == 128 * 4
    assert fc1.param_bytes == (512 + 32) * 4


class _SmallConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.relu(self.bn(self.conv(x))))
        return self.fc(torch.flatten(x, 1))


@pytest.mark.parametrize("capture", CAPTURES)
def test_convnet_flops_equal_hand_computed(capture: str) -> None:
    graph = from_module(_SmallConvNet().eval(), torch.randn(1, 3, 8, 8), capture=capture)
    conv = 2 * (8 * 8 * 8) * (3 * 3 * 3)  # 2 · output elements · (Cin·k·k) = 27,648
    bn = 2 * 512                           # inference batch norm: scale and shift per element
    relu = 512                             # one per element
    pool = 512                             # one per input element
    fc = 2 * 128 * 10                      # 2,560
    assert graph.total_flops() == conv + bn + relu + pool + fc
    classes = {op.op_class for op in graph}
    assert {OpClass.CONV, OpClass.NORM, OpClass.ELEMENTWISE, OpClass.POOL, OpClass.MATMUL} <= classes


@pytest.mark.parametrize("capture", CAPTURES)
def test_tied_weights_are_counted_once(capture: str) -> None:
    module, inputs = models.get("gpt", "tiny")
    graph = from_module(module, inputs, capture=capture)
    unique = {id(p): p for p in module.parameters()}
    buffers = {id(b): b for b in module.buffers()}
    expected = sum(p.numel() * p.element_size() for p in unique.values()) + sum(
        b.numel() * b.element_size() for b in buffers.values()
    )
    assert graph.total_param_bytes() == expected
    tied = [p for p in graph.params.values() if p.aliases]
    assert len(tied) == 1
    emb = tied[0]
    assert emb.name == "tok_emb.weight" and emb.aliases == ("lm_head.weight",)
    assert len(emb.users) == 2  # the embedding lookup and the lm head both read it
    head = graph.op(emb.users[1])
    assert head.op_class is OpClass.MATMUL and head.param_bytes == 0 and emb.name in head.params


def test_gather_reads_rows_not_the_table() -> None:
    module, inputs = models.get("emb-transformer", "tiny")
    graph = from_module(module, inputs)
    emb = next(op for op in graph if op.op_class is OpClass.GATHER)
    table = graph.params["emb.weight"].nbytes
    out = graph.tensors[emb.outputs[0]].nbytes
    assert emb.bytes_written == out
    assert emb.bytes_read == out + inputs[0].numel() * 8  # gathered rows + int64 indices
    assert emb.bytes_read < table and emb.param_bytes == table


def test_module_paths_and_types_come_from_the_module_tree() -> None:
    module, inputs = models.get("gpt", "tiny")
    for capture in CAPTURES:
        graph = from_module(module, inputs, capture=capture)
        q = [op for op in graph if op.module_path == "blocks.0.attn.q_proj"]
        assert len(q) == 1 and q[0].module_type == "Linear" and q[0].op_class is OpClass.MATMUL
        assert any(op.op_class is OpClass.ATTENTION and op.module_path == "blocks.0.attn" for op in graph)


def test_base_model_captures_on_the_meta_device_without_memory() -> None:
    module, inputs = models.get("emb-transformer", "base", device="meta")
    graph = from_module(module, inputs)
    assert graph.params["emb.weight"].nbytes == 4 * 2**30
    assert graph.total_flops() > 4e11  # 8 layers of 2,048 tokens at d=1024, FF 4096


def test_the_caller_model_is_not_modified() -> None:
    module, inputs = models.get("convnet", "tiny")
    module.train()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    for capture in CAPTURES:
        from_module(module, inputs, capture=capture)
    assert module.training
    after = module.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_from_graph_module_receives_a_real_torch_compile_graph() -> None:
    module, inputs = models.get("mlp", "tiny")
    seen: list[OpGraph] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        seen.append(from_graph_module(gm, example_inputs, name="mlp"))
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(module, backend=backend)
    torch.testing.assert_close(compiled(*inputs), module(*inputs))
    assert len(seen) == 1
    graph = seen[0]
    reference = from_module(module, inputs)
    assert graph.total_flops() == reference.total_flops()
    assert graph.total_param_bytes() == reference.total_param_bytes()
    assert sorted(graph.params) == sorted(reference.params)
    assert {op.module_path for op in graph if op.op_class is OpClass.MATMUL} == {
        op.module_path for op in reference if op.op_class is OpClass.MATMUL
    }


class _DataDependent(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # Python control flow on a tensor value
            return x * 2
        return x - 1


def test_symbolic_trace_failure_names_the_capture_and_suggests_export() -> None:
    with pytest.raises(CaptureError, match="symbolic_trace could not trace _DataDependent") as info:
        from_module(_DataDependent(), torch.randn(3), capture="symbolic_trace")
    assert "capture='export'" in str(info.value)


def test_export_failure_names_the_capture_and_suggests_symbolic_trace() -> None:
    with pytest.raises(CaptureError, match="torch.export could not capture _DataDependent") as info:
        from_module(_DataDependent(), torch.randn(3), capture="export")
    assert "capture='symbolic_trace'" in str(info.value)


def test_a_node_that_cannot_run_on_fake_tensors_is_named() -> None:
    class Bad(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tensor(x.tolist()) + x  # export specialises the values; fake tensors have none

    with pytest.raises(CaptureError, match="export captured Bad, but node 'item'") as info:
        from_module(Bad(), torch.randn(3), capture="export")
    assert "capture='symbolic_trace'" in str(info.value) and len(str(info.value).splitlines()) == 2


def test_unknown_capture_mode_and_wrong_input_count() -> None:
    with pytest.raises(CaptureError, match="unknown capture mode 'jit'"):
        from_module(_MLP(), torch.randn(4, 16), capture="jit")
    with pytest.raises(CaptureError, match="takes 1 inputs but 2"):
        from_module(_MLP(), (torch.randn(4, 16), torch.randn(1)), capture="symbolic_trace")
