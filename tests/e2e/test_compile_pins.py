"""Pins under torch.compile: by the model's own module paths, applied to the graphs they match.

dynamo names a module by where it found it (``L['self'].h[0]``, ``L['args'][0].model`` when a
decorator's wrapper took the model as ``*args``, ``L['net']`` for a function's argument); the
backend's graphs carry the model's qualified names instead, so the pins ``partition()`` takes for a
model are the pins ``torch.compile`` takes for it.
"""

from __future__ import annotations

import copy
import fnmatch
import functools

import pytest
import torch

import models
from backends.compile import HetpartBackend
from partitioner import Plan, partition
from partitioner.errors import HetpartError
from partitioner.frontends.fx import from_graph_module

PROFILE = "h200-host"
BIND = {"cuda:0": "cpu"}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _transformers():
    tf = pytest.importorskip("transformers")
    tf.logging.set_verbosity_error()
    return tf


def _gpt_neo() -> tuple[torch.nn.Module, tuple]:
    """A decorated transformers model (its forward is wrapped: dynamo sees the model as ``args[0]``)."""
    tf = _transformers()
    torch.manual_seed(0)
    config = tf.GPTNeoConfig(hidden_size=64, num_layers=2, num_heads=2, vocab_size=128, max_position_embeddings=64,
                             attention_types=[[["global", "local"], 1]], use_cache=False)
    return tf.GPTNeoForCausalLM(config).eval(), (torch.randint(0, 128, (2, 8)),)


def _llama() -> tuple[torch.nn.Module, tuple]:
    """Decorated, and its rotary embedding is a global function module (``G['__import_...']``)."""
    tf = _transformers()
    torch.manual_seed(0)
    config = tf.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                            num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    return tf.LlamaForCausalLM(config).eval(), (torch.randint(0, 128, (2, 8)),)


def _decorated(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with its forward wrapped as transformers' decorators wrap it (``*args``)."""
    forward = type(model).forward

    @functools.wraps(forward)
    def wrapper(*args, **kwargs):
        return forward(*args, **kwargs)

    cls = type(f"Decorated{type(model).__name__}", (type(model),), {"forward": wrapper})
    model.__class__ = cls
    return model


def _graph_paths(compile_model) -> set[str]:
    """The module paths of the ops of every graph dynamo hands a backend for ``compile_model``."""
    seen: set[str] = set()

    def capture(gm, example_inputs):
        seen.update(op.module_path for op in from_graph_module(gm, example_inputs).ops.values())
        return gm.forward

    compile_model(capture)
    return seen


def _zoo_through_a_function(backend) -> None:
    model, inputs = models.get("gpt", "tiny")
    with torch.no_grad():
        torch.compile(lambda net, *xs: net(*xs), backend=backend)(model, *inputs)


def _zoo_decorated(backend) -> None:
    model, inputs = models.get("gpt", "tiny")
    model = _decorated(model)
    with torch.no_grad():
        torch.compile(model, backend=backend)(*inputs)


def _transformers_model(make):
    def run(backend) -> None:
        model, inputs = make()
        with torch.no_grad():
            torch.compile(model, backend=backend)(*inputs)
    return run


@pytest.mark.parametrize("case, expected", [
    ("zoo gpt through a function", lambda: models.get("gpt", "tiny")[0]),
    ("zoo gpt decorated", lambda: models.get("gpt", "tiny")[0]),
    pytest.param("llama", lambda: _llama()[0], marks=pytest.mark.slow),
])
def test_module_paths_of_dynamo_graphs_are_the_models_qualified_names(case: str, expected) -> None:
    run = {"zoo gpt through a function": _zoo_through_a_function, "zoo gpt decorated": _zoo_decorated,
           "llama": _transformers_model(_llama)}[case]
    paths = _graph_paths(run)
    names = {name for name, _ in expected().named_modules()}
    assert paths - names == set(), f"{case}: module paths that are not the model's: {sorted(paths - names)[:5]}"
    assert len(paths & names) > 5  # the graph's ops are spread over the model's modules


def _pinned_right(plan: Plan, pins: dict[str, str]) -> list[str]:
    """Ops a pin matches (by module path) that the plan does not place on the pin's device."""
    return [op for op, module in plan.modules.items() for pattern, device in pins.items()
            if fnmatch.fnmatchcase(module, pattern) and plan.placement[op] != device]


@pytest.mark.slow
def test_a_decorated_transformers_model_takes_the_pins_partition_takes() -> None:
    model, inputs = _gpt_neo()
    pins = {"transformer.h.0.*": "cuda:0", "lm_head": "cpu", "transformer.wte": "cpu"}
    assert _pinned_right(partition(model, inputs, PROFILE, pins=pins), pins) == []
    backend = HetpartBackend()
    compiled = torch.compile(model, backend=backend, options={"devices": PROFILE, "device_map": BIND, "pins": pins})
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs).logits, model(*inputs).logits)
    (record,) = backend.records
    assert _pinned_right(record.plan, pins) == []
    assert set(record.plan.modules.values()) <= {name for name, _ in model.named_modules()}
    assert {record.plan.placement[op] for op, m in record.plan.modules.items() if m.startswith("transformer.h.0.")} \
        == {"cuda:0"}


# -- A4: a pin applies to the graphs it matches --------------------------------------------------


class _WithBreak(torch.nn.Module):
    """Two graphs: ``a`` + relu | ``b`` + tanh; ``skip`` (an identity) has no op."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.skip = torch.nn.Identity()
        self.b = torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.skip(self.a(x).relu())
        torch._dynamo.graph_break()
        return self.b(y).tanh()


@pytest.mark.parametrize("training", [False, True])
def test_after_a_graph_break_each_pin_applies_to_the_graph_it_matches(training: bool) -> None:
    torch.manual_seed(0)
    model, x = _WithBreak().train(training), torch.randn(4, 16)
    pins = {"a": "cuda:0", "b": "cpu"}
    backend = HetpartBackend()
    compiled = torch.compile(model, backend=backend, options={"devices": PROFILE, "device_map": BIND, "pins": pins,
                                                              "training": training})
    if training:
        eager = copy.deepcopy(model)
        compiled(x).sum().backward()
        eager(x).sum().backward()
        for got, want in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(got.grad, want.grad)
    else:
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x))
    first, second = backend.records
    assert first.pins == {"a": "cuda:0"} and second.pins == {"b": "cpu"}
    assert _pinned_right(first.plan, pins) == [] and _pinned_right(second.plan, pins) == []
    assert {first.plan.placement[op] for op, m in first.plan.modules.items() if m == "a"} == {"cuda:0"}
    assert {second.plan.placement[op] for op, m in second.plan.modules.items() if m == "b"} == {"cpu"}


def test_a_pin_naming_a_module_without_ops_is_logged_not_refused(caplog: pytest.LogCaptureFixture) -> None:
    model, x = _WithBreak().eval(), torch.randn(4, 16)
    backend = HetpartBackend()
    compiled = torch.compile(model, backend=backend, options={"devices": PROFILE, "device_map": BIND,
                                                              "pins": {"skip": "cuda:0", "a": "cpu"}})
    with caplog.at_level("INFO", logger="hetpart"), torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    said = [r.getMessage() for r in caplog.records if "'skip'" in r.getMessage()]
    assert len(said) == 2 and all("name modules of the model that this graph does not run" in m for m in said)


def test_a_pin_that_matches_nothing_in_the_model_is_refused_on_the_first_graph() -> None:
    model, x = _WithBreak().eval(), torch.randn(4, 16)
    backend = HetpartBackend()
    compiled = torch.compile(model, backend=backend, options={"devices": PROFILE, "device_map": BIND,
                                                              "pins": {"b": "cpu", "bb*": "cuda:0"}})
    with pytest.raises(HetpartError, match=r"^pin 'bb\*' matches no module of the model and no op name or module "
                                           r"path of graph '_WithBreak \[0/0\]'; module paths look like a"), \
            torch.no_grad():
        compiled(x)
    assert backend.records == []  # refused before anything was planned


# -- F: graphs are named by the model and the modules they run -----------------------------------


def test_graphs_are_named_by_the_model_class_and_their_first_and_last_module(
        caplog: pytest.LogCaptureFixture) -> None:
    model, inputs = _gpt_neo()
    backend = HetpartBackend()
    with caplog.at_level("INFO", logger="hetpart"), torch.no_grad():
        torch.compile(model, backend=backend, options={"devices": "cpu"})(*inputs)
    (record,) = backend.records
    assert record.name == "GPTNeoForCausalLM [0/0] (transformer.wte … lm_head)"
    assert any(m.startswith(f"hetpart: graph {record.name}: ") for m in (r.getMessage() for r in caplog.records))
    assert record.plan.model_name == "GPTNeoForCausalLM [0/0]"

    torch._dynamo.reset()
    model, x = _WithBreak().eval(), torch.randn(4, 16)
    backend = HetpartBackend()
    with torch.no_grad():
        torch.compile(model, backend=backend, options={"devices": "cpu"})(x)
    assert [r.name for r in backend.records] == ["_WithBreak [0/0] (a)", "_WithBreak [1/0] (b)"]


class _Inner(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)
        self.out = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x).relu()
        torch._dynamo.graph_break()  # dynamo compiles this forward as a frame of its own
        return self.out(y)


class _Outer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Linear(8, 16)
        self.body = _Inner()
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.stem(x)))


@pytest.mark.parametrize("how", ["torch.compile", "Module.compile"])
def test_a_graph_break_inside_a_submodule_keeps_the_models_module_paths(how: str) -> None:
    torch.manual_seed(0)
    model, x = _Outer().eval(), torch.randn(4, 8)
    pins = {"body.fc": "cuda:0", "body.out": "cpu", "stem": "cpu"}
    backend = HetpartBackend()
    options = {"devices": PROFILE, "device_map": BIND, "pins": pins}
    if how == "torch.compile":
        compiled = torch.compile(model, backend=backend, options=options)
    else:
        compiled = copy.deepcopy(model)
        compiled.compile(backend=backend, options=options)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    names = {name for name, _ in model.named_modules()}
    assert all(set(r.plan.modules.values()) <= names for r in backend.records), [r.name for r in backend.records]
    assert all(r.name.startswith("_Outer [") for r in backend.records)
    assert {p for r in backend.records for p in r.pins} == set(pins)
    assert all(_pinned_right(r.plan, pins) == [] for r in backend.records)


@pytest.mark.slow
def test_wav2vec2_in_training_takes_pins_by_module_path_across_its_graph_breaks() -> None:
    """The issue's case: Wav2Vec2 breaks its graph inside submodules; every pin lands on its graph."""
    tf = _transformers()
    torch.manual_seed(0)
    config = tf.Wav2Vec2Config(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, conv_dim=(16, 16),
        conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
        vocab_size=32, apply_spec_augment=False, hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        feat_proj_dropout=0.0, layerdrop=0.0, final_dropout=0.0)
    model, x = tf.Wav2Vec2ForCTC(config).train(), torch.randn(2, 800)
    eager = copy.deepcopy(model)
    pins = {"wav2vec2.feature_extractor*": "cpu", "wav2vec2.encoder.layers.1*": "cuda:0", "lm_head": "cpu"}
    backend = HetpartBackend()
    compiled = torch.compile(model, backend=backend, options={"devices": PROFILE, "device_map": BIND, "pins": pins,
                                                              "optimizer": "sgd"})
    compiled(x).logits.sum().backward()
    eager(x).logits.sum().backward()
    for (name, got), want in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-5, msg=name)
    assert len(backend.records) > 1 and all(r.plan.training for r in backend.records if r.plan.param_ops)
    assert {p for r in backend.records for p in r.pins} == set(pins)
    assert all(_pinned_right(r.plan, pins) == [] for r in backend.records)
    names = {name for name, _ in model.named_modules()}
    assert all(set(r.plan.modules.values()) <= names for r in backend.records)
