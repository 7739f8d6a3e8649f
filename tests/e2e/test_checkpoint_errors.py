"""Bad model folders: each is one sentence naming the file and the key, and nothing half-loaded is handed out.

One small Llama folder is written in 20 KB shards; each test copies it and breaks the copy: no
config.json, an architecture transformers does not know (by model_type and by class), custom code
without --trust-remote-code, an index naming a missing shard, a truncated shard, a corrupted
safetensors header, a tensor of the wrong shape or dtype, an unexpected key, a missing key, and a
shard that shrinks between the header check and the read.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from backends.torch.checkpoint_files import weight_files
from backends.torch.checkpoint_keys import plan_keys
from backends.torch.checkpoint_load import fill, load_folder_into, wanted_of
from partitioner import partition
from partitioner.errors import CheckpointError
from partitioner.frontends.hf_folder import open_folder

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

CONFIG = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=128, max_position_embeddings=32, use_cache=False)
SHAPES = {"input_ids": (1, 4)}


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("llama")
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).save_pretrained(folder, max_shard_size="10KB")
    return folder


@pytest.fixture
def folder(original: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "model"
    shutil.copytree(original, copy)
    return copy


@pytest.fixture(scope="module")
def plan(original: Path):  # noqa: ANN201 - a Plan of the intact folder
    return partition(str(original), None, "h200-host", input_shapes=SHAPES, pins={"model.layers.1*": "cuda:0"},
                     time_limit=5)


def shard_of(folder: Path, key: str) -> Path:
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    return folder / index[key]


def emit(plan, folder: Path):  # noqa: ANN001, ANN201
    return plan.emit(str(folder), {"cuda:0": "cpu"})


def test_a_folder_without_config_json(folder: Path) -> None:
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"model has no config\.json: a Hugging Face model folder"):
        partition(str(folder), None, "h200-host", input_shapes=SHAPES)


def test_an_architecture_transformers_does_not_know(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "no-such-model"}))
    with pytest.raises(CheckpointError, match=r"config\.json: model_type 'no-such-model' is not an architecture"):
        open_folder(folder)
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaForTelepathy"]}))
    with pytest.raises(CheckpointError, match=r"config\.json: 'architectures' names 'LlamaForTelepathy'"):
        open_folder(folder)


def test_custom_code_is_refused_without_trust_remote_code(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModelForCausalLM": "m.Model"}}))
    with pytest.raises(CheckpointError, match=r"'auto_map' names the folder's own modeling code .*--trust-remote-code"):
        partition(str(folder), None, "h200-host", input_shapes=SHAPES)


def test_an_index_naming_a_missing_shard(folder: Path, plan) -> None:  # noqa: ANN001
    shard = shard_of(folder, "model.layers.1.mlp.up_proj.weight")
    shard.unlink()
    with pytest.raises(CheckpointError, match=rf"index\.json names shard '{shard.name}' for key 'model\.layers\.1\.mlp\.up_proj\.weight', "
                                              rf"and .* has no such file"):
        emit(plan, folder)


def test_a_truncated_shard(folder: Path, plan) -> None:  # noqa: ANN001
    shard = shard_of(folder, "model.layers.0.self_attn.q_proj.weight")
    data = shard.read_bytes()
    shard.write_bytes(data[:-100])
    with pytest.raises(CheckpointError, match=rf"{shard.name}: key '.*' needs bytes up to {len(data):,}, and the file "
                                              rf"has {len(data) - 100:,}: the file is truncated"):
        emit(plan, folder)


def test_a_corrupted_safetensors_header(folder: Path, plan) -> None:  # noqa: ANN001
    shard = shard_of(folder, "model.norm.weight")
    data = bytearray(shard.read_bytes())
    data[8:12] = b"\xff\xfe{["
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"{shard.name}: the safetensors header is not JSON"):
        emit(plan, folder)
    shard.write_bytes((10**12).to_bytes(8, "little") + bytes(data[8:]))
    with pytest.raises(CheckpointError, match=r"the safetensors header says it is 1,000,000,000,000 bytes"):
        emit(plan, folder)


def _rewrite(folder: Path, key: str, value: torch.Tensor | None, extra: dict[str, torch.Tensor] | None = None) -> Path:
    """The shard holding ``key`` written again with ``key`` replaced (None: dropped) and ``extra`` added."""
    from safetensors.torch import load_file, save_file

    shard = shard_of(folder, key)
    tensors = load_file(shard)
    if value is None:
        del tensors[key]
    else:
        tensors[key] = value
    tensors.update(extra or {})
    save_file(tensors, shard, metadata={"format": "pt"})
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    if value is None:
        del index["weight_map"][key]
    for name in extra or {}:
        index["weight_map"][name] = shard.name
    index_path.write_text(json.dumps(index))
    return shard


def test_a_tensor_of_the_wrong_shape_or_dtype(folder: Path, plan) -> None:  # noqa: ANN001
    key = "model.layers.1.self_attn.k_proj.weight"
    shard = _rewrite(folder, key, torch.zeros(8, 16))
    with pytest.raises(CheckpointError, match=rf"key '{key}' in {shard.name} has shape \(8, 16\), and '{key}' of the "
                                              rf"model is \(16, 32\)"):
        emit(plan, folder)
    _rewrite(folder, key, torch.zeros(16, 32, dtype=torch.float16))
    with pytest.raises(CheckpointError, match=rf"key '{key}' in {shard.name} is float16, and the model is built in "
                                              rf"float32: ask for the dtype"):
        emit(plan, folder)


def test_an_unexpected_and_a_missing_key(folder: Path, plan) -> None:  # noqa: ANN001
    shard = _rewrite(folder, "model.norm.weight", torch.ones(32), {"model.extra_head.weight": torch.zeros(2, 2)})
    with pytest.raises(CheckpointError, match=rf"fill no tensor of LlamaForCausalLM: key 'model.extra_head.weight' "
                                              rf"in {shard.name}"):
        emit(plan, folder)
    _rewrite(folder, "model.layers.0.input_layernorm.weight", None)
    _rewrite(folder, "model.extra_head.weight", None)
    with pytest.raises(CheckpointError, match=r"holds no tensor for 1 of LlamaForCausalLM's: "
                                              r"'model.layers.0.input_layernorm.weight'"):
        emit(plan, folder)


def test_a_shard_that_shrinks_while_loading_fails_before_the_module_is_used(folder: Path) -> None:
    model = open_folder(folder).module
    wanted = wanted_of(model)
    files = weight_files(folder)
    keys = plan_keys(model, wanted, files)
    destinations = {w.names[0]: torch.full(w.shape, 7.0) for w in wanted}
    last = max(files.tensors.values(), key=lambda s: (str(s.file), s.offset))
    last.file.write_bytes(last.file.read_bytes()[: last.offset + 4])  # after the headers were checked
    with pytest.raises(CheckpointError, match=rf"{last.file.name} ended while reading key '{last.key}'"):
        fill(destinations, keys, files)


def test_loading_into_a_module_checks_every_key_before_writing_one(folder: Path) -> None:
    module = open_folder(folder).module
    target = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG))
    before = {k: v.clone() for k, v in target.state_dict().items()}
    _rewrite(folder, "model.layers.1.mlp.down_proj.weight", torch.zeros(3, 3))
    with pytest.raises(CheckpointError, match=r"model.layers.1.mlp.down_proj.weight' in .* has shape \(3, 3\)"):
        load_folder_into(target, folder)
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())  # nothing half-loaded
    assert module is not None


def test_a_folder_without_transformers_installed_says_what_to_install(tmp_path, monkeypatch) -> None:
    import builtins
    import json

    from partitioner.errors import CheckpointError
    from partitioner.frontends.hf_folder import open_folder

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    real = builtins.__import__

    def no_transformers(name, *args, **kwargs):  # noqa: ANN001, ANN202
        if name == "transformers" or name.startswith("transformers."):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_transformers)
    with pytest.raises(CheckpointError, match="pip install transformers"):
        open_folder(tmp_path)
