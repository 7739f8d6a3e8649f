"""Tests of the model zoo (``models/``): registry, determinism, tracing, sizes."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.fx

import models
from models._zoo import Built
from partitioner.errors import HetpartError, UnknownModel

EXPECTED_NAMES = ["bart", "bert", "convnet", "convnext", "dlrm", "emb-transformer", "gpt", "mlp", "moe", "t5", "two-branch"]
ALL = pytest.mark.parametrize("name", EXPECTED_NAMES)


@functools.cache
def tiny(name: str) -> Built:
    """Built once per test session; tests must not mutate the module."""
    return models.get(name, "tiny")


def outputs(module: torch.nn.Module, inputs: tuple) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        out = module(*inputs)
    return out if isinstance(out, tuple) else (out,)


def n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def param_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


# --- registry -------------------------------------------------------------------------


def test_names_are_the_registry() -> None:
    assert models.names() == EXPECTED_NAMES
    assert models.SIZES == ("tiny", "small", "base")


@ALL
def test_entry_is_complete(name: str) -> None:
    e = models.entry(name)
    assert e.name == name
    assert e.description and "\n" not in e.description
    assert callable(e.build)
    assert isinstance(e.no_split_classes, tuple)
    if not e.symbolic_trace_ok:
        assert e.symbolic_trace_note, f"{name}: symbolic_trace_ok is False without a note"


def test_unknown_name_lists_known_models() -> None:
    with pytest.raises(UnknownModel) as info:
        models.get("gtp")
    msg = str(info.value)
    assert "'gtp'" in msg
    assert "did you mean 'gpt'" in msg
    for name in EXPECTED_NAMES:
        assert name in msg
    assert isinstance(info.value, HetpartError)
    assert isinstance(info.value, KeyError)


def test_unknown_entry_raises() -> None:
    with pytest.raises(UnknownModel, match="known models are bart, bert, convnet"):
        models.entry("resnet-9000")


def test_unknown_size_lists_sizes() -> None:
    with pytest.raises(UnknownModel) as info:
        models.get("gpt", "huge")
    msg = str(info.value)
    assert "'huge'" in msg and "'gpt'" in msg
    for size in models.SIZES:
        assert size in msg


@ALL
def test_builder_rejects_unknown_size(name: str) -> None:
    with pytest.raises(UnknownModel, match="tiny, small, base"):
        models.entry(name).build("xl")


# --- tiny: forward, determinism ---------------------------------------------------------


@ALL
def test_tiny_forward_is_finite_and_in_eval_mode(name: str) -> None:
    module, inputs = tiny(name)
    assert isinstance(inputs, tuple) and all(isinstance(t, torch.Tensor) for t in inputs)
    assert not any(m.training for m in module.modules())
    for out in outputs(module, inputs):
        assert out.numel() > 0
        assert torch.isfinite(out).all()


@ALL
def test_same_seed_same_outputs_other_seed_other_weights(name: str) -> None:
    module, inputs = tiny(name)
    again, inputs_again = models.get(name, "tiny", seed=0)
    for a, b in zip(inputs, inputs_again, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(outputs(module, inputs), outputs(again, inputs_again), strict=True):
        assert torch.equal(a, b)

    other, _ = models.get(name, "tiny", seed=1)
    pairs = zip(module.parameters(), other.parameters(), strict=True)
    assert any(not torch.equal(p, q) for p, q in pairs)


def test_get_leaves_global_rng_alone() -> None:
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    models.get("mlp", "tiny", seed=7)
    assert torch.equal(torch.get_rng_state(), before)
    expected = torch.rand(3)
    torch.set_rng_state(before)
    assert torch.equal(torch.rand(3), expected)


def test_get_ignores_global_rng_state() -> None:
    torch.manual_seed(1)
    a, _ = models.get("mlp", "tiny", seed=3)
    torch.manual_seed(2)
    b, _ = models.get("mlp", "tiny", seed=3)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)


# --- tracing ------------------------------------------------------------------------------


@ALL
def test_torch_export_matches_eager(name: str) -> None:
    module, inputs = tiny(name)
    program = torch.export.export(module, inputs, strict=False)
    got = outputs(program.module(), inputs)
    for out, ref in zip(got, outputs(module, inputs), strict=True):
        torch.testing.assert_close(out, ref)


@ALL
def test_symbolic_trace_matches_eager_or_is_flagged(name: str) -> None:
    module, inputs = tiny(name)
    if not models.entry(name).symbolic_trace_ok:
        # The flag must not go stale: a model marked untraceable must really fail.
        with pytest.raises(Exception):
            torch.fx.symbolic_trace(module)
        pytest.skip(models.entry(name).symbolic_trace_note)
    traced = torch.fx.symbolic_trace(module)
    for out, ref in zip(outputs(traced, inputs), outputs(module, inputs), strict=True):
        assert torch.equal(out, ref)


def test_every_model_is_symbolic_traceable() -> None:
    assert [n for n in models.names() if not models.entry(n).symbolic_trace_ok] == []


@ALL
def test_no_split_classes_name_real_submodules(name: str) -> None:
    module, _ = tiny(name)
    present = {type(m).__name__ for m in module.modules()}
    for cls in models.entry(name).no_split_classes:
        assert cls in present, f"{name}: no_split class {cls!r} is not in the model"


# --- sizes, on the meta device --------------------------------------------------------------


@ALL
def test_sizes_grow_and_build_on_meta(name: str) -> None:
    counts = []
    for size in ("small", "base"):
        module, inputs = models.get(name, size, device="meta")
        assert all(p.is_meta for p in module.parameters())
        assert all(t.is_meta for t in inputs)
        counts.append(n_params(module))
    assert n_params(tiny(name)[0]) < counts[0] < counts[1]


# --- model specifics -------------------------------------------------------------------------


def test_gpt_lm_head_is_tied_to_token_embedding() -> None:
    module, _ = tiny("gpt")
    assert module.lm_head.weight is module.tok_emb.weight
    all_params = list(module.named_parameters(remove_duplicate=False))
    assert len(list(module.parameters())) == len(all_params) - 1
    traced = torch.fx.symbolic_trace(module)
    assert traced.lm_head.weight is traced.tok_emb.weight


def test_gpt_is_causal() -> None:
    module, (ids,) = tiny("gpt")
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % module.tok_emb.num_embeddings
    before, after = outputs(module, (ids,))[0], outputs(module, (changed,))[0]
    torch.testing.assert_close(before[:, :-1], after[:, :-1])
    assert not torch.allclose(before[:, -1], after[:, -1])


def test_bert_returns_sequence_and_pooled_output() -> None:
    module, (ids, types) = tiny("bert")
    seq, pooled = outputs(module, (ids, types))
    assert seq.shape == (*ids.shape, module.pooler.dense.in_features)
    assert pooled.shape == (ids.shape[0], module.pooler.dense.out_features)
    assert set(types.unique().tolist()) <= {0, 1}


def test_emb_transformer_base_matches_calibration_scenario() -> None:
    module, (ids,) = models.get("emb-transformer", "base", device="meta")
    assert [n for n, _ in module.named_children()] == ["emb", "layers", "head"]
    assert isinstance(module.emb, torch.nn.Embedding)
    assert param_bytes(module.emb) == 4_294_967_296
    assert [n for n, _ in module.layers.named_children()] == [str(i) for i in range(8)]
    for block in module.layers:
        assert param_bytes(block) == 50_384_896
        assert block.attn.n_heads == 16
        assert block.mlp.ff1.out_features == 4096
    assert isinstance(module.head, torch.nn.Linear)
    assert (module.head.in_features, module.head.out_features) == (1024, 16)
    assert param_bytes(module.head) == 65_600
    assert ids.shape == (4, 512) and ids.dtype == torch.int64
    assert outputs(module, (ids,))[0].shape == (4, 512, 16)


def test_dlrm_interaction_is_strict_lower_triangle_of_dot_products() -> None:
    module, inputs = tiny("dlrm")
    k = len(module.embeddings)
    assert all(isinstance(b, torch.nn.EmbeddingBag) and b.mode == "sum" for b in module.embeddings)
    buffers = dict(module.interaction.named_buffers())
    assert set(buffers) == {"rows", "cols"}
    features = torch.randn(3, k + 1, 5)
    pairs = [(i, j) for i in range(k + 1) for j in range(i)]  # row-major strict lower
    expected = torch.stack([(features[:, i] * features[:, j]).sum(-1) for i, j in pairs], 1)
    torch.testing.assert_close(module.interaction(features), expected)
    assert outputs(module, inputs)[0].shape == (inputs[0].shape[0], 1)


def test_two_branch_branches_share_only_the_input() -> None:
    module, _ = tiny("two-branch")
    graph = torch.fx.symbolic_trace(module).graph

    def branch(node: torch.fx.Node) -> str | None:
        target = str(node.target)
        return target.split(".")[0] if node.op == "call_module" else None

    ancestors: dict[torch.fx.Node, set[torch.fx.Node]] = {}
    for node in graph.nodes:  # topological order
        ancestors[node] = set()
        for a in node.all_input_nodes:
            ancestors[node] |= {a} | ancestors[a]
    for node in graph.nodes:
        mine = branch(node)
        if mine in ("branch_a", "branch_b"):
            other = "branch_b" if mine == "branch_a" else "branch_a"
            assert not any(branch(a) == other for a in ancestors[node])
    merge = next(n for n in graph.nodes if n.target == "merge")
    assert {branch(a) for a in ancestors[merge]} >= {"branch_a", "branch_b"}


def test_convnet_shortcuts_are_conv_only_where_shape_changes() -> None:
    module, _ = tiny("convnet")
    blocks = [m for m in module.modules() if type(m).__name__ == "BasicBlock"]
    assert blocks
    for block in blocks:
        changes = block.conv1.stride != (1, 1) or block.conv1.in_channels != block.conv1.out_channels
        assert (block.shortcut is not None) == changes
    assert module.stem.conv.bias is None
