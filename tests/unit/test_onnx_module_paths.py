"""Module paths of models from torch's default (dynamo) exporter, read from its node metadata.

``torch.onnx.export(model, args, f)`` (``dynamo=True``, the default) names nodes ``node_linear_3``
and writes each node's module scopes as metadata (``pkg.torch.onnx.name_scopes``,
``pkg.torch.onnx.class_hierarchy``, ``namespace``); the TorchScript exporter's
``/layers.0/fc1/Gemm`` names keep working. ``tests/data/dynamo_blocks.onnx`` is a real export of
:class:`Blocks` by torch 2.13 with onnxscript 0.7.2 (stack traces removed: they hold local paths);
``python -m tests.unit.test_onnx_module_paths`` writes it again where onnxscript is installed.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import onnx
import pytest
import torch
from onnx import TensorProto, helper

from partitioner import from_module, from_onnx, partition
from partitioner.cli import main
from partitioner.frontends.onnx import CLASS_HIERARCHY, NAME_SCOPES, NAMESPACE, module_scopes, node_module

FIXTURE = Path(__file__).resolve().parent.parent / "data" / "dynamo_blocks.onnx"
PINS = {"layers.0*": "cuda:0", "head": "npu:0"}


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x))) + x


class Blocks(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([Block() for _ in range(2)])
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return torch.softmax(self.head(x), -1)


def export_blocks(path: Path) -> Path:
    """Export :class:`Blocks` with torch's default exporter (needs onnxscript), stack traces removed."""
    torch.manual_seed(0)
    torch.onnx.export(Blocks().eval(), (torch.randn(2, 8),), str(path), dynamo=True, verbose=False)
    model = onnx.load(str(path))  # the weights in too: one self-contained file
    Path(f"{path}.data").unlink(missing_ok=True)
    for node in model.graph.node:
        kept = [(p.key, p.value) for p in node.metadata_props if p.key != "pkg.torch.onnx.stack_trace"]
        del node.metadata_props[:]
        helper.set_metadata_props(node, dict(kept))
    onnx.save(model, str(path))
    return path


def _node(**metadata: str) -> onnx.NodeProto:
    node = helper.make_node("Gemm", ["x", "w"], ["y"], name="node_linear_3")
    helper.set_metadata_props(node, metadata)
    return node


def test_module_scopes_come_from_the_exporters_metadata() -> None:
    """The keys and value forms of a real export (see the fixture); the innermost scope is the op's module."""
    node = _node(**{NAME_SCOPES: "['', 'layers.1', 'layers.1.fc2', 'linear_3']",
                    CLASS_HIERARCHY: "['__main__.Blocks', '__main__.Block', 'torch.nn.modules.linear.Linear', "
                                     "'aten.linear.default']",
                    NAMESPACE: ": __main__.Blocks/layers.1: __main__.Block/layers.1.fc2: "
                               "torch.nn.modules.linear.Linear/linear_3: aten.linear.default"})
    assert module_scopes(node) == [("", "Blocks"), ("layers.1", "Block"), ("layers.1.fc2", "Linear")]
    assert node_module(node) == ("layers.1.fc2", "Linear")
    namespace_only = _node(**{NAMESPACE: ": m.Blocks/head: torch.nn.modules.linear.Linear/linear_4: "
                                         "aten.linear.default"})
    assert node_module(namespace_only) == ("head", "Linear")
    root = _node(**{NAME_SCOPES: "['', 'softmax']", CLASS_HIERARCHY: "['m.Blocks', 'aten.softmax.int']"})
    assert node_module(root) == ("", "Blocks")
    no_classes = _node(**{NAME_SCOPES: "['', 'head', 'linear_4']"})
    assert node_module(no_classes) == ("head", "")


@pytest.mark.parametrize("metadata", [
    {NAME_SCOPES: "['', 'layers.1'"},                   # cut short
    {NAME_SCOPES: "[1, 2]"},                            # not strings
    {NAME_SCOPES: "__import__('os').system('true')"},   # never evaluated
    {NAME_SCOPES: "['linear_3']"},                      # no module (nn_module_stack missing at export)
    {NAMESPACE: "linear_3: aten.linear.default"},
])
def test_malformed_or_empty_metadata_falls_back_to_the_node_name(metadata: dict[str, str]) -> None:
    assert node_module(_node(**metadata)) == ("", "")
    old = helper.make_node("Gemm", ["x", "w"], ["y"], name="/layers.0/fc1/Gemm")
    helper.set_metadata_props(old, metadata)
    assert node_module(old) == ("layers.0.fc1", "")


def _pinned_paths(plan, graph, device: str) -> set[str]:  # noqa: ANN001
    return {graph.ops[op].module_path for op, d in plan.placement.items() if d == device and op in graph.ops}


@pytest.mark.slow
def test_a_dynamo_export_is_pinned_by_module_path_as_the_torch_model_is(tmp_path: Path) -> None:
    graph = from_onnx(FIXTURE)
    paths = {op.module_path for op in graph.ops.values()}
    assert paths == {"", "layers.0", "layers.0.fc1", "layers.0.fc2", "layers.1", "layers.1.fc1", "layers.1.fc2",
                     "head"}
    assert graph.ops["node_linear"].module_type == "Linear" and graph.module_types["layers.0"] == "Block"
    torch_graph = from_module(Blocks().eval(), (torch.randn(2, 8),))
    assert paths <= {op.module_path for op in torch_graph.ops.values()}
    onnx_plan = partition(graph, devices="cpu-gpu-npu", pins=PINS, time_limit=2)
    torch_plan = partition(torch_graph, devices="cpu-gpu-npu", pins=PINS, time_limit=2)
    for device in ("cuda:0", "npu:0"):
        pinned = _pinned_paths(onnx_plan, graph, device)
        assert pinned and pinned <= _pinned_paths(torch_plan, torch_graph, device), device
    assert _pinned_paths(onnx_plan, graph, "cuda:0") == {"layers.0", "layers.0.fc1", "layers.0.fc2"}
    # the CLI, as a user types it; --align-modules reads the exporter's class names
    out = tmp_path / "plan.json"
    assert main(["plan", str(FIXTURE), "--devices", "cpu-gpu-npu", "--pin", "layers.0*=cuda:0",
                 "--align-modules", "Block", "--time-limit", "2", "-o", str(out)]) == 0
    assert out.is_file()


def test_torchscript_exporter_names_keep_their_module_paths() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="/layers.0/act/Relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert from_onnx(model).ops["/layers.0/act/Relu"].module_path == "layers.0.act"


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("onnxscript") is None,
                    reason="torch's dynamo exporter needs onnxscript (pip install onnxscript)")
def test_a_model_exported_now_has_the_torch_models_module_paths(tmp_path: Path) -> None:
    graph = from_onnx(export_blocks(tmp_path / "blocks.onnx"))
    torch_graph = from_module(Blocks().eval(), (torch.randn(2, 8),))
    paths = {op.module_path for op in graph.ops.values()}
    assert "layers.0.fc1" in paths and paths <= {op.module_path for op in torch_graph.ops.values()}
    assert all(op.module_path for op in graph.ops.values() if op.params)


if __name__ == "__main__":  # write the fixture again
    FIXTURE.parent.mkdir(exist_ok=True)
    print(export_blocks(FIXTURE), file=sys.stderr)
