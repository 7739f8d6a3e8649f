"""A parts folder on disk: which files are hetpart's, and that they are the ones its manifest names.

In: a folder written by :func:`~backends.onnx_parts.emit.emit_onnx`. Out: :data:`PARTS`, the
:class:`~partitioner.files.FolderKind` that lets ``force`` replace such a folder and nothing else;
:func:`digests` of the files a part was written as; :func:`read_manifest`, which checks every
file a part runs from against the manifest before a session opens it.

A parts folder holds ``manifest.json``, ``part_K.onnx`` and ``part_K.onnx.data`` files, nothing else.
Each part file and data file is recorded in the manifest with its sha256; a file that does not
match (a part swapped for another model, a data file copied from elsewhere) or that is not a
regular file of the folder itself (a symbolic link, even to a matching file) is refused, naming the
part and the fix, because onnxruntime would run it without a word (a part swapped for a model with
the same input and output names runs, and gives another model's outputs).

Example:
    >>> manifest = read_manifest(Path("parts"))        # doctest: +SKIP
    >>> manifest.parts[0].files[0][0]
    'part_0.onnx'
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path

from backends.onnx_parts.manifest import FORMAT, MANIFEST, Manifest
from partitioner.errors import HetpartError, OnnxError
from partitioner.files import FolderKind, read_text

#: the names hetpart writes into a parts folder besides the manifest
PART_FILE = re.compile(r"part_[0-9]+\.onnx(\.data)?")
#: the largest manifest read (a manifest lists every part's inputs and outputs: kilobytes, rarely more)
MAX_MANIFEST = 1 << 26
#: the fix every refusal names
REWRITE = "write the parts again with `hetpart emit MODEL.onnx --plan PLAN -o DIR --force`"


def _is_parts_manifest(folder: Path) -> bool:
    """Whether ``folder``'s manifest says it is a hetpart parts folder (a cut-off one still does)."""
    path = folder / MANIFEST
    try:
        text = read_text(path, what="parts manifest", max_bytes=MAX_MANIFEST)
    except (OSError, HetpartError):
        return False
    try:
        data = json.loads(text)
    except json.JSONDecodeError:  # cut off or garbled: our writer's own opening still says what it was
        return text.startswith(f'{{\n "format": "{FORMAT}"')
    return isinstance(data, dict) and data.get("format") == FORMAT


#: a folder of ONNX parts: what ``emit_onnx(..., force=True)`` may replace (see the module docstring)
PARTS = FolderKind(what="ONNX parts", owns=lambda name: name == MANIFEST or PART_FILE.fullmatch(name) is not None,
                   marker=_is_parts_manifest, unmarked=f"no hetpart {MANIFEST}", example="parts")


def file_digest(path: Path) -> str:
    """The sha256 of a file, read in blocks (part data files can be gigabytes).

    Example:
        >>> file_digest(Path("parts/part_0.onnx"))[:8]   # doctest: +SKIP
        '3f2a9c1e'
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def digests(folder: Path, file: str) -> tuple[tuple[str, str], ...]:
    """(name, sha256) of a written part's file, then of its data file if it has one (``FILE.data``).

    Example:
        >>> digests(Path(tmp), "part_0.onnx")              # doctest: +SKIP
        (('part_0.onnx', '3f2a...'), ('part_0.onnx.data', '9b1c...'))
    """
    names = [file] + ([f"{file}.data"] if (folder / f"{file}.data").is_file() else [])
    return tuple((name, file_digest(folder / name)) for name in names)


def read_manifest(folder: Path) -> Manifest:
    """The manifest of a parts folder, every part's files checked against it.

    Raises:
        OnnxError: the manifest is missing or broken, or a part's file or data file is missing, is a
            symbolic link or not a regular file, or differs from the one the manifest recorded; the
            message names the part, the file and the fix.

    Example:
        >>> [p.device for p in read_manifest(Path("parts")).parts]    # doctest: +SKIP
        ['cpu', 'cuda:0']
    """
    path, written_by = folder / MANIFEST, "give a folder written by `hetpart emit MODEL.onnx --plan PLAN -o DIR`"
    if not folder.is_dir():
        raise OnnxError(f"{folder}: not a folder: {written_by}")
    _regular(path, f"{folder}: {MANIFEST}", written_by)
    try:
        text = read_text(path, what="parts manifest", max_bytes=MAX_MANIFEST)
    except HetpartError as exc:
        raise OnnxError(str(exc)) from None
    manifest = Manifest.from_json(text, str(path))
    for k, part in enumerate(manifest.parts):
        for name, digest in part.files:
            what = f"{folder}: part {k} ({part.device})'s {'file' if name == part.file else 'data file'} {name!r}"
            _regular(folder / name, what, REWRITE)
            if file_digest(folder / name) != digest:
                raise OnnxError(f"{what} is not the file the manifest recorded (its sha256 differs: it was changed "
                                f"or replaced after it was written); {REWRITE}")
    return manifest


def _regular(path: Path, what: str, fix: str) -> None:
    """``path`` is a regular file of its folder itself (``lstat``: a link is refused, wherever it leads)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        raise OnnxError(f"{what} is missing; {fix}") from None
    except OSError as err:
        raise OnnxError(f"{what}: cannot read it ({err.strerror or err}); {fix}") from None
    if stat.S_ISLNK(mode):
        raise OnnxError(f"{what} is a symbolic link (to {os.readlink(path)!r}): a parts folder runs only its own "
                        f"files; {fix}")
    if not stat.S_ISREG(mode):
        raise OnnxError(f"{what} is not a regular file; {fix}")


__all__ = ["PARTS", "PART_FILE", "digests", "file_digest", "read_manifest"]
