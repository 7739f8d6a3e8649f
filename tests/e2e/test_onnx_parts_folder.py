"""A folder of ONNX parts on disk: ``--force`` replaces only a parts folder, the manifest binds the part
files (sha256, no links), and every manifest field survives a write and a reload.

The model is the zoo ``mlp`` (tiny) exported to ONNX, its first Gemm pinned to the cpu and the rest
to ``cuda:0`` (bound to the CPU provider): two parts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from backends.onnx_parts import Manifest, build_parts, example_feeds, load_parts, whole_session
from backends.onnx_parts.manifest import PartEntry
from models.onnx_models import export_zoo
from partitioner import partition
from partitioner.cli import main
from partitioner.errors import OnnxError

BIND = {"cuda:0": "cpu"}
PINS = {"/layers/layers.0/*": "cpu", "/layers/layers.[1-9]/*": "cuda:0"}


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The mlp with its weights in an external file, a plan of it, and its plan file."""
    root = tmp_path_factory.mktemp("mlp")
    source = export_zoo("mlp", "tiny", root / "src.onnx")
    model = root / "model" / "mlp.onnx"
    model.parent.mkdir()
    onnx.save_model(onnx.load(source), str(model), save_as_external_data=True, location="mlp.weights",
                    size_threshold=0)
    plan = partition(model, devices="cpu-gpu-npu", pins=PINS, time_limit=5)
    plan_file = root / "plan.json"
    plan.save(plan_file)
    return {"root": root, "model": model, "plan": plan, "plan_file": plan_file}


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every entry below ``folder`` (hidden ones included) and its bytes (a link: its target)."""
    out: dict[str, bytes | str] = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(root, name)
            rel = str(path.relative_to(folder))
            out[rel] = f"-> {os.readlink(path)}" if path.is_symlink() else "dir" if path.is_dir() else path.read_bytes()
    return out


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------------------------
# C1: --force replaces a parts folder and nothing else
# --------------------------------------------------------------------------------------------


def test_emit_force_refuses_the_models_own_folder_and_the_current_one_losing_nothing(
        made: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    shutil.copytree(made["model"].parent, work)
    shutil.copy(made["plan_file"], work / "plan.json")
    before = snapshot(tmp_path)
    monkeypatch.chdir(work)
    for target in (".", str(work)):
        code, _, err = cli(capsys, "emit", "mlp.onnx", "--plan", "plan.json", "-o", target, "--force")
        assert code == 2 and err.count("\n") == 1, err
        assert "holds 'mlp.onnx', 'mlp.weights', 'plan.json'" in err and "give a new folder" in err, err
        code, _, err = cli(capsys, "emit", "mlp.onnx", "--plan", "plan.json", "-o", target)  # no --force: same
        assert code == 2 and "holds 'mlp.onnx'" in err and "pass --force" not in err, err
    with pytest.raises(Exception, match="holds 'mlp.onnx'"):
        made["plan"].emit_onnx(work, made["model"], force=True)
    assert snapshot(tmp_path) == before  # the model, its data and the plan are all there, nothing beside


def test_emit_force_replaces_a_parts_folder_but_not_from_inside_it(
        made: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    model, plan_file, parts = str(made["model"]), str(made["plan_file"]), tmp_path / "parts"
    assert cli(capsys, "emit", model, "--plan", plan_file, "-o", str(parts))[0] == 0
    (parts / "part_5.onnx").write_bytes(b"from an emit with more parts")
    code, text, err = cli(capsys, "emit", model, "--plan", plan_file, "-o", str(parts), "--force")
    assert code == 0 and "2 parts and manifest.json" in text, err
    assert sorted(os.listdir(tmp_path)) == ["parts"]  # nothing left beside
    assert sorted(os.listdir(parts)) == ["manifest.json", "part_0.onnx", "part_0.onnx.data", "part_1.onnx",
                                         "part_1.onnx.data"]
    manifest = parts / "manifest.json"
    manifest.write_text(manifest.read_text()[:100])  # cut off: it still says what wrote it, and the fix works
    code, _, err = cli(capsys, "run", str(parts), "--random", "--bind", "cuda:0=cpu")
    assert code == 2 and "cut off" in err and "--force" in err, err
    assert cli(capsys, "emit", model, "--plan", plan_file, "-o", str(parts), "--force")[0] == 0
    manifest.rename(tmp_path / "elsewhere.json")  # part files alone: nothing says hetpart wrote them
    code, _, err = cli(capsys, "emit", model, "--plan", plan_file, "-o", str(parts), "--force")
    assert code == 2 and "and no hetpart manifest.json" in err, err
    (tmp_path / "elsewhere.json").rename(manifest)
    monkeypatch.chdir(parts)
    before = snapshot(tmp_path)
    code, _, err = cli(capsys, "emit", model, "--plan", plan_file, "-o", ".", "--force")
    assert code == 2 and "is the folder hetpart runs in" in err and err.count("\n") == 1, err
    assert snapshot(tmp_path) == before
    load_parts(parts, BIND)


def test_run_force_replaces_only_a_folder_of_outputs(made: dict[str, Any], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    parts, out = tmp_path / "parts", tmp_path / "out"
    made["plan"].emit_onnx(parts, made["model"])
    argv = ("run", str(parts), "--random", "--bind", "cuda:0=cpu", "-o", str(out))
    assert cli(capsys, *argv)[0] == 0
    code, _, err = cli(capsys, *argv)
    assert code == 2 and "exists: pass --force" in err
    assert cli(capsys, *argv, "--force")[0] == 0 and len(os.listdir(out)) == 1
    (out / "input.npy").write_bytes(b"the user's input")
    code, _, err = cli(capsys, *argv, "--force")
    assert code == 2 and "holds 'input.npy'" in err and (out / "input.npy").read_bytes() == b"the user's input", err


# --------------------------------------------------------------------------------------------
# C2: the manifest binds its part files
# --------------------------------------------------------------------------------------------


def test_a_part_swapped_for_another_models_or_linked_out_is_refused(made: dict[str, Any], tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    plan, model = made["plan"], made["model"]
    parts = plan.emit_onnx(tmp_path / "parts", model)
    zeros = tmp_path / "zeros" / "mlp.onnx"  # the same graph with every weight zero: its parts run in their place
    zeros.parent.mkdir()
    proto = onnx.load(model)
    for t in proto.graph.initializer:
        t.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(t)), t.name))
    onnx.save_model(proto, str(zeros))
    other = plan.emit_onnx(tmp_path / "other", zeros)
    feeds = example_feeds(load_parts(parts, BIND).manifest.inputs)
    want = whole_session(model).run(None, feeds)[0]
    np.testing.assert_allclose(next(iter(load_parts(parts, BIND).run(feeds).values())), want, rtol=1e-5, atol=1e-6)

    original = (parts / "part_1.onnx").read_bytes()
    shutil.copy(other / "part_1.onnx", parts / "part_1.onnx")
    with pytest.raises(OnnxError) as err:
        load_parts(parts, BIND)
    assert "part 1 (cuda:0)'s file 'part_1.onnx' is not the file the manifest recorded" in str(err.value)
    assert "hetpart emit MODEL.onnx --plan PLAN -o DIR --force" in str(err.value)
    code, _, stderr = cli(capsys, "run", str(parts), "--random", "--bind", "cuda:0=cpu")
    assert code == 2 and "sha256 differs" in stderr and stderr.count("\n") == 1, stderr

    (parts / "part_1.onnx").unlink()
    (parts / "part_1.onnx").symlink_to(other / "part_1.onnx")  # a link out of the folder
    with pytest.raises(OnnxError, match=r"'part_1.onnx' is a symbolic link \(to '.*other/part_1.onnx'\)"):
        load_parts(parts, BIND)
    (tmp_path / "same.onnx").write_bytes(original)
    (parts / "part_1.onnx").unlink()
    (parts / "part_1.onnx").symlink_to(tmp_path / "same.onnx")  # even to the very bytes it recorded
    with pytest.raises(OnnxError, match="is a symbolic link"):
        load_parts(parts, BIND)
    (parts / "part_1.onnx").unlink()
    (parts / "part_1.onnx").write_bytes(original)
    load_parts(parts, BIND)

    data = parts / "part_0.onnx.data"
    weights = bytearray(data.read_bytes())
    weights[-1] ^= 0x40  # one bit of one weight
    data.write_bytes(bytes(weights))
    with pytest.raises(OnnxError, match=r"part 0 \(cpu\)'s data file 'part_0.onnx.data' is not the file"):
        load_parts(parts, BIND)
    data.unlink()
    with pytest.raises(OnnxError, match="'part_0.onnx.data' is missing"):
        load_parts(parts, BIND)


def test_every_manifest_field_is_written_and_read_back(made: dict[str, Any], tmp_path: Path) -> None:
    """The manifest read from a written folder equals the one built in memory, field by field, and
    every file it binds is in the folder with the sha256 it records."""
    parts = made["plan"].emit_onnx(tmp_path / "parts", made["model"])
    loaded = load_parts(parts, BIND).manifest
    built = build_parts(made["plan"], made["model"], BIND).manifest  # never goes through JSON
    for field in dataclasses.fields(Manifest):
        if field.name != "parts":
            assert getattr(loaded, field.name) == getattr(built, field.name), field.name
    assert len(loaded.parts) == len(built.parts) == 2
    for got, want in zip(loaded.parts, built.parts):
        for field in dataclasses.fields(PartEntry):
            if field.name != "files":
                assert getattr(got, field.name) == getattr(want, field.name), field.name
        assert got.files == tuple((name, hashlib.sha256((parts / name).read_bytes()).hexdigest())
                                  for name in (got.file, f"{got.file}.data"))
    listed = {name for p in loaded.parts for name, _ in p.files}
    assert listed | {"manifest.json"} == set(os.listdir(parts))


def changed(m: Manifest) -> dict[str, Manifest]:
    """``m`` with each field (of the manifest, and of its first part) changed alone to another valid value."""
    part = m.parts[0]

    def with_part(**kw: Any) -> Manifest:
        return dataclasses.replace(m, parts=(dataclasses.replace(part, **kw), *m.parts[1:]))

    first_input = m.inputs[0]
    return {
        "name": dataclasses.replace(m, name=m.name + "-other"),
        "fingerprint": dataclasses.replace(m, fingerprint="0" * 16),
        "predicted_s": dataclasses.replace(m, predicted_s=None if m.predicted_s is not None else 0.125),
        "devices": dataclasses.replace(m, devices={**m.devices, "npu:0": ("npu", "OpenVINOExecutionProvider")}),
        "inputs": dataclasses.replace(m, inputs=((first_input[0], "float16", (3, 5)), *m.inputs[1:])),
        "outputs": dataclasses.replace(m, outputs=()),
        "parts.file": with_part(file="part_9.onnx", files=(("part_9.onnx", part.files[0][1]), *part.files[1:])),
        "parts.device": with_part(device="npu:0"),
        "parts.ops": with_part(ops=part.ops + 5),
        "parts.inputs": with_part(inputs=()),
        "parts.outputs": with_part(outputs=(*part.outputs, "another")),
        "parts.python_io": with_part(python_io=not part.python_io),
        "parts.files": with_part(files=((part.file, "a" * 64), (f"{part.file}.weights", "b" * 64))),
    }


def test_each_manifest_field_changed_alone_survives_a_write_and_a_reload(made: dict[str, Any],
                                                                         tmp_path: Path) -> None:
    base = load_parts(made["plan"].emit_onnx(tmp_path / "parts", made["model"]), BIND).manifest
    variants = changed(base)
    # a field added to Manifest or PartEntry must be added here too
    assert set(variants) == ({f.name for f in dataclasses.fields(Manifest)} - {"parts"}
                             | {f"parts.{f.name}" for f in dataclasses.fields(PartEntry)})
    for field, variant in variants.items():
        assert variant != base, field
        folder = tmp_path / field
        folder.mkdir()
        variant.save(folder)
        assert Manifest.from_json((folder / "manifest.json").read_text(), field) == variant, field


def key_paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key of the manifest's fixed-schema objects (a device's entry, not the device names)."""
    out = []
    if isinstance(value, dict):
        for key, item in value.items():
            if path != ("devices",):
                out.append((*path, key))
            out.extend(key_paths(item, (*path, key)))
    elif isinstance(value, list):
        for k, item in enumerate(value):
            out.extend(key_paths(item, (*path, k)))
    return out


def test_a_manifest_missing_any_field_is_refused_naming_it(made: dict[str, Any], tmp_path: Path) -> None:
    parts = made["plan"].emit_onnx(tmp_path / "parts", made["model"])
    manifest = parts / "manifest.json"
    text = manifest.read_text()
    paths = key_paths(json.loads(text))
    assert ("parts", 1, "files", 1, "sha256") in paths and ("parts", 0, "python_io") in paths
    for path in paths:
        data = json.loads(text)
        holder = data
        for key in path[:-1]:
            holder = holder[key]
        del holder[path[-1]]
        manifest.write_text(json.dumps(data))
        with pytest.raises(OnnxError) as err:
            load_parts(parts, BIND)
        assert "manifest.json" in str(err.value) and repr(path[-1]).strip("'") in str(err.value), path
    data = json.loads(text)
    data["format_version"] = 1
    manifest.write_text(json.dumps(data))
    with pytest.raises(OnnxError, match="version 1 is not 2: write the parts again"):
        load_parts(parts, BIND)
    manifest.write_text(text)
    load_parts(parts, BIND)
