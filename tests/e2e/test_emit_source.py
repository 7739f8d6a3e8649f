"""End to end: ``Plan.emit_source`` writes a readable, safe Python file that equals the model.

Every zoo model (tiny, train mode, placed on cpu + cuda:0 + npu:0 bound to the CPU) is written,
imported from the file, loaded with the original's state_dict and compared with the original and
with ``plan.emit``: outputs and the gradient of every parameter. A model whose module, parameter
and buffer names (and model name) hold quotes, newlines and Python code gives a file in which
those names are string literals only, that runs no injected code and still computes the model.

Generated modules run under strict devices (:mod:`backends.torch.strict`): the file is written
with every logical device bound to its own CPU tag, built under the mode, and its forward fails on
the first op reading a tensor from another logical device; each step's copies and the resident
bytes must equal the plan's transfers and parameter bytes.
"""

from __future__ import annotations

import ast
import importlib.util
import io
import itertools
import sys
import tokenize
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import nn

import models
from backends.torch.source import op_lines
from backends.torch.strict import StrictRun
from partitioner import Plan, partition
from partitioner.errors import HetpartError
from tests.e2e.placements import DLRM_PLACEMENT, factory_plan, plan_with_placement

BIND = {"cuda:0": "cpu", "npu:0": "cpu"}
_counter = itertools.count()


def _load(path: Path) -> ModuleType:
    """Import the generated file under a fresh name (never registered in sys.modules)."""
    spec = importlib.util.spec_from_file_location(f"hetpart_generated_{next(_counter)}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _outputs(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for t in value if isinstance(t, torch.Tensor)]  # type: ignore[union-attr]


def _loss(outputs: list[torch.Tensor]) -> torch.Tensor:
    return sum(o.float().sum() for o in outputs if o.is_floating_point())  # type: ignore[return-value]


def _spread_pins(model: nn.Module) -> dict[str, str]:
    """Pin a middle and the last module that owns parameters away from the CPU: three devices."""
    owners = [name for name, m in model.named_modules() if name and any(True for _ in m.parameters(recurse=False))]
    return {owners[len(owners) // 2]: "cuda:0", owners[-1]: "npu:0"}


def _built(model: nn.Module, path: Path) -> nn.Module:
    """The generated module, weights loaded from ``model``."""
    return _load(path).build(model)


class Strict:
    """A plan's generated file (and its ``plan.emit``) under strict devices."""

    def __init__(self, plan: Plan, model: nn.Module) -> None:
        self.plan, self.model, self.run = plan, model, StrictRun(plan)
        self.bind = self.run.device_map

    def built(self, path: Path) -> nn.Module:
        """The file's module built under the mode (parameters tagged where it puts them), watched line by line."""
        with self.run:
            generated = _built(self.model, path)
        return self.run.watch(generated, op_lines(self.plan, self.model, self.bind))

    def emitted(self) -> nn.Module:
        with self.run:
            return self.run.watch(self.plan.emit(self.model, self.bind))

    def forward(self, module: nn.Module, inputs: tuple) -> list[torch.Tensor]:
        with self.run:
            got = _outputs(self.run.step(module, *inputs))
        report = self.run.report()
        assert report.passed, report.to_text()
        return got


def assert_same_outputs(reference: nn.Module, generated: nn.Module, inputs: tuple, strict: Strict) -> None:
    with torch.no_grad():
        expected, got = _outputs(reference(*inputs)), strict.forward(generated, inputs)
    assert len(expected) == len(got)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e)


def assert_same_gradients(model: nn.Module, generated: nn.Module, inputs: tuple, strict: Strict) -> None:
    model.zero_grad()
    generated.zero_grad()
    _loss(_outputs(model(*inputs))).backward()
    _loss(strict.forward(generated, inputs)).backward()  # backward outside the mode
    ours = dict(generated.named_parameters(remove_duplicate=False))
    theirs = dict(model.named_parameters(remove_duplicate=False))
    assert list(ours) == list(theirs)
    for name, p in theirs.items():
        if p.grad is None:
            assert ours[name].grad is None, f"gradient for {name!r} only in the generated module"
            continue
        assert ours[name].grad is not None, f"no gradient for {name!r}"
        grad = ours[name].grad
        grad = grad.to_dense() if grad.is_sparse else grad  # a row-sparse table's gradient (training_state)
        torch.testing.assert_close(grad, p.grad, msg=f"gradient of {name!r}")


def identifiers(tree: ast.AST) -> set[str]:
    """Every name the code binds or reads: variables, attributes, functions, arguments, keywords."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            out.add(node.arg)
        elif isinstance(node, ast.alias):
            out.update(filter(None, (node.name, node.asname)))
    return out


def imported_modules(tree: ast.AST) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            out.add(node.module or "")
    return out


# --------------------------------------------------------------------------------------------
# Zoo models
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", models.names())
def test_zoo_file_equals_model_and_emit(name: str, tmp_path: Path) -> None:
    model, inputs = models.get(name, "tiny")
    model.train()  # export captures the mode: train mode for both, before planning
    plan = partition(model, inputs, "cpu-gpu-npu", pins=_spread_pins(model), model_name=name)
    assert len(set(plan.placement.values())) >= 2, plan.placement

    strict = Strict(plan, model)
    path = plan.emit_source(tmp_path / "placed.py", model, strict.bind)
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    assert ".to(DEVICE_" in text
    assert "# --- part 1 on " in text and "(bound to cpu:" in text
    assert "torch.ops.aten." in text
    assert imported_modules(tree) <= {"torch"}, "a plan without streamed weights needs only torch"

    generated = strict.built(path)
    assert isinstance(generated, nn.Module) and type(generated).__name__ == "PartitionedModel"
    assert list(generated.state_dict()) == list(model.state_dict())
    generated.train()
    assert_same_outputs(model, generated, inputs, strict)
    emitted = Strict(plan, model)
    assert_same_outputs(emitted.emitted(), generated, inputs, strict)
    assert_same_gradients(model, generated, inputs, strict)


def test_a_file_copies_a_tensor_once_to_each_device_that_reads_it(tmp_path: Path) -> None:
    """dlrm placed by hand (see tests/e2e/test_emit.py DLRM_PLACEMENT): ``stack`` read on two other
    devices, an item of ``embedding_bag`` taken on another device, a literal buffer on cuda:0."""
    model, inputs = models.get("dlrm", "tiny")
    plan = plan_with_placement(model, inputs, DLRM_PLACEMENT)
    assert {("stack", "cuda:0"), ("stack", "npu:0"), ("embedding_bag.0", "cuda:0")} <= {
        (t.tensor, t.dst) for t in plan.transfers}
    strict = Strict(plan, model)
    generated = strict.built(plan.emit_source(tmp_path / "dlrm.py", model, strict.bind))
    assert strict.run.mode.device_of(generated.get_buffer("interaction.rows")) == "cuda:0"
    assert_same_outputs(model, generated, inputs, strict)


def test_a_factory_in_a_file_creates_its_tensor_on_its_own_device(tmp_path: Path) -> None:
    plan, model, inputs = factory_plan()
    strict = Strict(plan, model)
    generated = strict.built(plan.emit_source(tmp_path / "positions.py", model, strict.bind))
    assert_same_outputs(model, generated, inputs, strict)


def test_tied_weights_stay_one_parameter(tmp_path: Path) -> None:
    model, inputs = models.get("gpt", "tiny")
    plan = partition(model, inputs, "cpu-gpu-npu", pins={"lm_head": "cuda:0"}, model_name="gpt")
    strict = Strict(plan, model)
    generated = strict.built(plan.emit_source(tmp_path / "gpt.py", model, strict.bind))
    assert generated.get_parameter("lm_head.weight") is generated.get_parameter("tok_emb.weight")
    assert len(list(generated.parameters())) == len(list(model.parameters()))
    assert_same_outputs(model, generated, inputs, strict)


def test_streamed_weights_go_through_the_streamer(tmp_path: Path) -> None:
    model, inputs = models.get("gpt", "tiny")
    plan = partition(model, inputs, "cpu-gpu-npu", memory={"cuda:0": "80KB"}, pins={"*": "cuda:0"})
    assert plan.weights, "the cap should force streaming"
    strict = Strict(plan, model)
    path = plan.emit_source(tmp_path / "streamed.py", model, strict.bind)
    text = path.read_text(encoding="utf-8")
    assert "WeightStreamer(self, [" in text and "._hetpart_streamer.get(" in text
    assert imported_modules(ast.parse(text)) <= {"torch", "backends.torch"}
    generated = strict.built(path)
    for op in plan.weights:  # streamed weights live on the host
        assert {strict.run.mode.device_of(generated.get_parameter(n)) for n in plan.param_names[op]} == {"cpu"}
    assert_same_outputs(model, generated, inputs, strict)
    assert_same_outputs(Strict(plan, model).emitted(), generated, inputs, strict)


def test_a_file_emitted_before_the_backends_move_still_runs(tmp_path: Path) -> None:
    """Files written before code generation moved to backends.torch import the streamer from
    partitioner.codegen.prefetch: they run as before, with a warning that says to re-emit."""
    model, inputs = models.get("gpt", "tiny")
    plan = partition(model, inputs, "cpu-gpu-npu", memory={"cuda:0": "80KB"}, pins={"*": "cuda:0"})
    strict = Strict(plan, model)
    path = plan.emit_source(tmp_path / "streamed.py", model, strict.bind)
    new_import = "from backends.torch import WeightStreamer"
    text = path.read_text(encoding="utf-8")
    assert new_import in text
    path.write_text(text.replace(new_import, "from partitioner.codegen.prefetch import WeightStreamer"))
    sys.modules.pop("partitioner.codegen", None)
    sys.modules.pop("partitioner.codegen.prefetch", None)
    with pytest.warns(FutureWarning, match="re-emit"):
        generated = strict.built(path)
    assert_same_outputs(model, generated, inputs, strict)


# --------------------------------------------------------------------------------------------
# Hostile names
# --------------------------------------------------------------------------------------------

SENTINEL = "PWNED"
EVIL_NAMES = [
    f"x'); import os; getattr(os, 'system')('touch {SENTINEL}') #",
    "a\nimport sys",
    "__import__('os')",
    # breaks out of the quotes torch.fx's own codegen puts around attribute names
    f'x" if getattr(__import__("os"),"system")("touch {SENTINEL}") else "y") or ("',
    "q\"\"\"\r\u2028z\t\\",
    "0",
]
EVIL_MODEL_NAME = f"evil\n'\"\nimport os; getattr(os, 'system')('touch {SENTINEL}') #"


class Hostile(nn.Module):
    """Linear layers under hostile names, a hostile parameter, buffers and a tied weight."""

    def __init__(self, names: list[str]) -> None:
        super().__init__()
        self.names = names
        for i, name in enumerate(names):
            holder = nn.Module()
            holder.add_module(names[(i + 1) % len(names)], nn.Linear(4, 4))
            self.add_module(name, holder)
        self.register_parameter(names[1] + "p", nn.Parameter(torch.randn(4)))
        self.register_buffer(names[3] + "b", torch.randn(4))
        self.register_buffer(names[2] + "n", torch.tensor([0.5, -1.0, 2.0, 3.0]), persistent=False)
        tied = nn.Linear(4, 4, bias=False)
        tied.weight = self.get_submodule(names[0]).get_submodule(names[1]).weight
        self.add_module(names[4] + "tied", tied)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, name in enumerate(self.names):
            x = getattr(getattr(self, name), self.names[(i + 1) % len(self.names)])(x).relu()
        x = getattr(self, self.names[4] + "tied")(x)
        scale, shift, offset = (getattr(self, self.names[i] + s) for i, s in ((1, "p"), (3, "b"), (2, "n")))
        return x * scale + shift - offset


def _accepted_names() -> list[str]:
    """The hostile names torch itself accepts as module names (it forbids '.' and '')."""
    accepted = []
    for name in EVIL_NAMES:
        try:
            nn.Module().add_module(name, nn.Identity())
        except KeyError:
            continue
        accepted.append(name)
    return accepted


def test_hostile_names_give_a_safe_working_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # injected code would create ./PWNED
    names = _accepted_names()
    assert len(names) == len(EVIL_NAMES), "torch should accept every hostile name here"
    torch.manual_seed(0)
    model = Hostile(names).train()
    x = torch.randn(2, 4)
    plan = partition(model, (x,), "cpu-gpu-npu", pins={"linear_1": "cuda:0", "linear_3": "npu:0"},
                     model_name=EVIL_MODEL_NAME)
    assert len(set(plan.placement.values())) >= 2
    strict = Strict(plan, model)
    path = plan.emit_source(tmp_path / "hostile.py", model, strict.bind)
    text = path.read_text(encoding="utf-8")

    tree = ast.parse(text)
    hostile = [h for h in (*names, names[4] + "tied", EVIL_MODEL_NAME) if not h.isalnum()]  # "0" is plain
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    literal_text = " ".join(strings)
    for name in names:  # each qualified name is present, as string data
        assert name in literal_text
    for ident in identifiers(tree):
        assert not any(h in ident for h in hostile), f"identifier {ident!r} built from a model name"
        assert ident not in {"os", "sys", "system", "__import__", "exec", "eval"}
    assert imported_modules(tree) <= {"torch"}
    for token in tokenize.generate_tokens(io.StringIO(text).readline):  # hostile text only in strings / comments
        if any(h in token.string for h in hostile):
            assert token.type in (tokenize.STRING, tokenize.COMMENT), token
    assert "\n# model        'evil\\n" in text  # the model name is escaped in the header comment

    generated = strict.built(path)
    assert not (tmp_path / SENTINEL).exists()
    assert list(generated.state_dict()) == list(model.state_dict())
    assert_same_outputs(model, generated, (x,), strict)
    assert_same_gradients(model, generated, (x,), strict)
    assert not (tmp_path / SENTINEL).exists()


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def test_refuses_to_overwrite_unless_forced(tmp_path: Path) -> None:
    model, inputs = models.get("mlp", "tiny")
    plan = partition(model, inputs, "cpu-gpu-npu", pins=_spread_pins(model))
    path = tmp_path / "mlp.py"
    path.write_text("keep me\n", encoding="utf-8")
    with pytest.raises(HetpartError, match="exists: pass --force"):
        plan.emit_source(path, model, BIND)
    assert path.read_text(encoding="utf-8") == "keep me\n"
    assert plan.emit_source(path, model, BIND, force=True) == path
    assert "class PartitionedModel(torch.nn.Module)" in path.read_text(encoding="utf-8")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.py"], "no temporary file left behind"
    again = plan.emit_source(tmp_path / "again.py", model, BIND)
    assert again.read_text(encoding="utf-8") == path.read_text(encoding="utf-8"), "the same plan gives the same file"
    strict = Strict(plan, model)
    assert_same_outputs(model, strict.built(plan.emit_source(tmp_path / "strict.py", model, strict.bind)), inputs,
                        strict)


def test_unbound_device_is_an_error_before_writing(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("cuda:0 is present here")
    model, inputs = models.get("mlp", "tiny")
    plan = partition(model, inputs, "cpu-gpu-npu", pins=_spread_pins(model))
    with pytest.raises(HetpartError, match="not present"):
        plan.emit_source(tmp_path / "x.py", model)
    assert not list(tmp_path.iterdir())
