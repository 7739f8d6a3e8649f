"""Pins under torch.compile: by the model's own module paths, applied to the graphs they match.

dynamo names a module by where it found it (``L['self'].h[0]``, ``L['args'][0].model`` when a
decorator's wrapper took the model as ``*args``, ``L['net']`` for a function's argument); the
backend's graphs carry the model's qualified names instead, so the pins ``partition()`` takes for a
model are the pins ``torch.compile`` takes for it.
"""

from __future__ import annotations

import fnmatch
import functools

import pytest
import torch

import models
from backends.compile import HetpartBackend
from partitioner import Plan, partition
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
    ("llama", lambda: _llama()[0]),
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
