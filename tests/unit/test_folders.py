"""Folders made whole (partitioner.files.write_folder): ``force`` replaces only a folder of the writer's
kind, the swap loses nothing when it fails, and nothing is followed through a link."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from partitioner.errors import HetpartError
from partitioner.files import FolderKind, check_folder, write_folder

#: a folder of ``*.part`` files with a ``stamp`` file saying it is one
KIND = FolderKind(what="test parts", owns=lambda name: name == "stamp" or name.endswith(".part"),
                  marker=lambda folder: (folder / "stamp").read_text() == "mine", example="parts")


def fill_with(*names: str):  # noqa: ANN201 - a fill function
    def fill(tmp: Path) -> None:
        (tmp / "stamp").write_text("mine")
        for name in names:
            (tmp / name).write_text(name)
    return fill


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry below ``folder`` (links as ``-> target``), hidden ones included."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(root, name)
            rel = str(path.relative_to(folder))
            out[rel] = f"-> {os.readlink(path)}" if path.is_symlink() else "" if path.is_dir() else path.read_text()
    return out


def test_force_replaces_a_folder_of_its_kind_and_deletes_only_its_files(tmp_path: Path) -> None:
    target = tmp_path / "parts"
    write_folder(target, fill_with("a.part", "b.part"), kind=KIND)
    with pytest.raises(HetpartError, match="exists: pass --force"):
        write_folder(target, fill_with("c.part"), kind=KIND)
    write_folder(target, fill_with("c.part"), force=True, kind=KIND)
    assert snapshot(tmp_path) == {"parts": "", "parts/stamp": "mine", "parts/c.part": "c.part"}


@pytest.mark.parametrize("intruder", ["model.onnx", "link", "sub", "unmarked"])
def test_force_refuses_a_folder_holding_anything_else_and_changes_nothing(tmp_path: Path, intruder: str) -> None:
    target = tmp_path / "parts"
    write_folder(target, fill_with("a.part"), kind=KIND)
    (tmp_path / "model.onnx").write_text("the user's model")
    if intruder == "model.onnx":
        (target / "model.onnx").write_text("the user's model")
    elif intruder == "link":  # a part that is a link out of the folder: neither followed nor deleted
        (target / "a.part").unlink()
        (target / "a.part").symlink_to(tmp_path / "model.onnx")
    elif intruder == "sub":
        (target / "sub").mkdir()
        (target / "sub" / "x.part").write_text("kept")
    else:
        (target / "stamp").write_text("someone else's")
    before = snapshot(tmp_path)
    with pytest.raises(HetpartError) as err:
        write_folder(target, fill_with("b.part"), force=True, kind=KIND)
    message = str(err.value)
    assert "\n" not in message and str(target) in message and "give a new folder" in message
    shown = {"model.onnx": "'model.onnx'", "link": "'a.part' (a symbolic link)", "sub": "'sub' (a folder)",
             "unmarked": "'a.part', 'stamp' and nothing saying hetpart wrote it"}
    assert f"holds {shown[intruder]}:" in message
    assert snapshot(tmp_path) == before  # nothing deleted, nothing left beside


def test_a_failing_fill_or_an_intruder_during_it_leaves_the_old_folder_as_it_was(tmp_path: Path) -> None:
    target = tmp_path / "parts"
    write_folder(target, fill_with("a.part"), kind=KIND)
    before = snapshot(tmp_path)

    def failing(tmp: Path) -> None:
        (tmp / "half.part").write_text("half")
        raise HetpartError("the work failed")

    with pytest.raises(HetpartError, match="the work failed"):
        write_folder(target, failing, force=True, kind=KIND)
    assert snapshot(tmp_path) == before

    def racing(tmp: Path) -> None:  # the user saves a file into the old folder while the new one is written
        fill_with("b.part")(tmp)
        (target / "notes.txt").write_text("mine")

    with pytest.raises(HetpartError, match="holds 'notes.txt'"):
        write_folder(target, racing, force=True, kind=KIND)
    assert snapshot(tmp_path) == {**before, "parts/notes.txt": "mine"}


def test_the_current_folder_the_root_and_a_linked_folder_are_refused(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "parts"
    write_folder(target, fill_with("a.part"), kind=KIND)
    monkeypatch.chdir(target)
    with pytest.raises(HetpartError, match=r"^\. is the folder hetpart runs in"):
        write_folder(Path("."), fill_with("b.part"), force=True, kind=KIND)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(HetpartError, match="is the root folder"):
        check_folder("/", force=True, kind=KIND)
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(HetpartError, match="is a symbolic link, not a folder of test parts"):
        write_folder(tmp_path / "link", fill_with("b.part"), force=True, kind=KIND)
    with pytest.raises(HetpartError, match="output folder is empty"):
        check_folder("", force=True, kind=KIND)
    assert snapshot(target) == {"stamp": "mine", "a.part": "a.part"}
