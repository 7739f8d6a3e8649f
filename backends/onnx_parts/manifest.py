"""The manifest of a folder of ONNX parts: what runs where, in which order, reading what.

In: the parts of a plan (:mod:`backends.onnx_parts.parts`), or a ``manifest.json`` read back.
Out: a frozen :class:`Manifest`, its JSON, and the checks that make a hand-edited or cut-off
manifest a one-line :class:`~partitioner.errors.OnnxError` naming the file and field.

``manifest.json`` (``format_version`` 2)::

    format          "hetpart-onnx-parts"
    format_version  2
    model           {"name", "fingerprint": the OpGraph's, "plan_predicted_s": the plan's prediction}
    devices         {logical device: {"kind": "cpu" | "gpu" | "npu", "onnx_provider": name or null}}, every
                    device of the plan's profile (a binding may name any of them)
    inputs          [{"name", "dtype", "shape"}, ...]   the graph inputs, in the model's order
    outputs         [name, ...]                         the graph outputs, in the model's order
    parts           [{"file": "part_0.onnx", "device", "ops": count, "inputs": [...], "outputs": [...],
                      "python_io": true when a value it reads or writes is not a plain tensor,
                      "files": [{"name": "part_0.onnx", "sha256": hex}, {"name": "part_0.onnx.data", ...}]
                      the part's file, then its external data files, each with its digest}, ...]

Parts run in list order; each reads graph inputs and earlier parts' outputs. Every field is
required: a manifest missing one is refused, never read with a default. ``files`` binds the folder's
files to the manifest (:mod:`backends.onnx_parts.folder` checks them before a session opens); a
manifest built in memory (:func:`~backends.onnx_parts.emit.build_parts`) has none until written.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from partitioner.errors import OnnxError
from partitioner.plan.fields import FieldReader, ends_early

FORMAT = "hetpart-onnx-parts"
FORMAT_VERSION = 2
MANIFEST = "manifest.json"


@dataclasses.dataclass(frozen=True)
class PartEntry:
    """One part as the manifest lists it."""

    file: str
    device: str
    ops: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    python_io: bool            # it reads or writes a sequence, optional, map or string: run it with numpy values
    files: tuple[tuple[str, str], ...] = ()  # (file name, sha256 hex): the part's file, then its data files;
                                             # empty only in memory, before the part is written


@dataclasses.dataclass(frozen=True)
class Manifest:
    """Everything needed to run a folder of parts (see the module docstring)."""

    name: str
    fingerprint: str
    predicted_s: float | None
    devices: Mapping[str, tuple[str, str | None]]            # logical -> (kind, profile's onnx_provider)
    inputs: tuple[tuple[str, str, tuple[int, ...]], ...]     # (name, dtype, shape)
    outputs: tuple[str, ...]
    parts: tuple[PartEntry, ...]

    def to_json(self) -> str:
        """The manifest's text.

        Example:
            >>> Manifest.from_json(m.to_json(), "m") == m        # doctest: +SKIP
            True
        """
        data = {
            "format": FORMAT, "format_version": FORMAT_VERSION,
            "model": {"name": self.name, "fingerprint": self.fingerprint, "plan_predicted_s": self.predicted_s},
            "devices": {d: {"kind": kind, "onnx_provider": provider} for d, (kind, provider) in self.devices.items()},
            "inputs": [{"name": n, "dtype": dtype, "shape": list(shape)} for n, dtype, shape in self.inputs],
            "outputs": list(self.outputs),
            "parts": [{"file": p.file, "device": p.device, "ops": p.ops, "inputs": list(p.inputs),
                       "outputs": list(p.outputs), "python_io": p.python_io,
                       "files": [{"name": n, "sha256": h} for n, h in p.files]} for p in self.parts],
        }
        return json.dumps(data, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str) -> Manifest:
        """Parse and check a manifest (see :meth:`check`); errors name ``where`` and the field."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            cut = " (the file is cut off)" if ends_early(text, exc) else ""
            raise OnnxError(f"{where}: not valid JSON at line {exc.lineno}{cut}: write the parts again "
                            "with `hetpart emit MODEL.onnx --plan PLAN -o DIR --force`") from None
        r = _Reader(where)
        top = r.mapping(data, "")
        if top.get("format") != FORMAT:
            r.fail("format", f"expected {FORMAT!r}, got {top.get('format')!r}: this is not a hetpart parts manifest")
        if top.get("format_version") != FORMAT_VERSION:
            r.fail("format_version", f"version {top.get('format_version')!r} is not {FORMAT_VERSION}: write the "
                   "parts again with this hetpart")
        r.keys(top, "", ("format", "format_version", "model", "devices", "inputs", "outputs", "parts"))
        model = r.keys(top["model"], "model", ("name", "fingerprint", "plan_predicted_s"))
        devices = {d: r.keys(v, f"devices.{d}", ("kind", "onnx_provider"))
                   for d, v in r.mapping(top["devices"], "devices").items()}
        inputs = [r.keys(v, f"inputs[{k}]", ("name", "dtype", "shape"))
                  for k, v in enumerate(r.array(top["inputs"], "inputs"))]
        manifest = cls(
            name=r.string(model["name"], "model.name"),
            fingerprint=r.string(model["fingerprint"], "model.fingerprint"),
            predicted_s=r.number_or_null(model["plan_predicted_s"], "model.plan_predicted_s"),
            devices={d: (r.string(v["kind"], f"devices.{d}.kind"),
                         None if v["onnx_provider"] is None else r.string(v["onnx_provider"],
                                                                         f"devices.{d}.onnx_provider"))
                     for d, v in devices.items()},
            inputs=tuple((r.string(v["name"], f"inputs[{k}].name"), r.string(v["dtype"], f"inputs[{k}].dtype"),
                          tuple(r.count(x, f"inputs[{k}].shape[{j}]")
                                for j, x in enumerate(r.array(v["shape"], f"inputs[{k}].shape"))))
                         for k, v in enumerate(inputs)),
            outputs=r.string_list(top["outputs"], "outputs"),
            parts=tuple(_part(r, p, k) for k, p in enumerate(r.array(top["parts"], "parts"))),
        )
        manifest.check(where)
        return manifest

    def check(self, where: str) -> None:
        """Every part reads only graph inputs and earlier outputs; every graph output is made; the
        devices are listed.

        Raises:
            OnnxError: names the manifest, the part and the tensor.
        """
        known = {name for name, _, _ in self.inputs}
        for k, part in enumerate(self.parts):
            if part.device not in self.devices:
                raise OnnxError(f"{where}: parts[{k}] runs on {part.device!r}, which devices does not list")
            missing = [t for t in part.inputs if t not in known]
            if missing:
                raise OnnxError(f"{where}: parts[{k}] ({part.file}) reads {missing[0]!r}, which no earlier part "
                                "makes and which is not a graph input: write the parts again")
            known.update(part.outputs)
        lost = [t for t in self.outputs if t not in known]
        if lost:
            raise OnnxError(f"{where}: graph output {lost[0]!r} is made by no part: write the parts again")

    def save(self, folder: Path) -> Path:
        """Write ``manifest.json`` into ``folder`` (the caller makes the folder appear atomically)."""
        path = folder / MANIFEST
        path.write_text(self.to_json(), encoding="utf-8")
        return path


def _part(r: _Reader, raw: Any, k: int) -> PartEntry:
    at = f"parts[{k}]"
    p = r.keys(raw, at, ("file", "device", "ops", "inputs", "outputs", "python_io", "files"))
    file = r.string(p["file"], f"{at}.file")
    if not _plain_name(file) or not file.endswith(".onnx"):
        r.fail(f"{at}.file", f"{file!r} is not the name of a .onnx file in the parts folder")
    files = []
    for j, f in enumerate(r.array(p["files"], f"{at}.files")):
        f = r.keys(f, f"{at}.files[{j}]", ("name", "sha256"))
        name, digest = r.string(f["name"], f"{at}.files[{j}].name"), r.string(f["sha256"], f"{at}.files[{j}].sha256")
        if not _plain_name(name) or (j == 0) != (name == file) or name in dict(files):
            r.fail(f"{at}.files[{j}].name", f"{name!r}: files lists the part's file {file!r} first, then the "
                   "names of its data files in the parts folder, each once")
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            r.fail(f"{at}.files[{j}].sha256", f"{digest[:80]!r} is not a sha256 digest (64 hex digits)")
        files.append((name, digest))
    if not files:
        r.fail(f"{at}.files", f"empty: it lists the part's file {file!r} and its digest first")
    return PartEntry(file=file, device=r.string(p["device"], f"{at}.device"), ops=r.count(p["ops"], f"{at}.ops"),
                     inputs=r.string_list(p["inputs"], f"{at}.inputs"),
                     outputs=r.string_list(p["outputs"], f"{at}.outputs"),
                     python_io=r.boolean(p["python_io"], f"{at}.python_io"), files=tuple(files))


def _plain_name(name: str) -> bool:
    """A file's name in the parts folder itself: no folder, not hidden (``..``), no NUL."""
    return bool(name) and not any(c in name for c in "/\\\0") and not name.startswith(".")


class _Reader(FieldReader):
    """The plan reader's typed field access, failing with an OnnxError that names the manifest."""

    def fail(self, path: str, message: str) -> NoReturn:
        raise OnnxError(f"{self.source}: {path}: {message}" if path else f"{self.source}: {message}")

    def keys(self, value: Any, path: str, required: Sequence[str], optional: Sequence[str] = ()) -> Mapping[str, Any]:
        """FieldReader.keys, its top-level messages naming a parts manifest (not a plan)."""
        if not path:
            value = self.mapping(value, path)
            missing = [k for k in required if k not in value]
            if missing:
                self.fail(missing[0], f"missing; a parts manifest needs {', '.join(required)}: write the parts again")
            unknown = [k for k in value if k not in (*required, *optional)]
            if unknown:
                self.fail("", f"unknown top-level key {unknown[0]!r}; the keys of a format_version {FORMAT_VERSION} "
                              f"parts manifest are: {', '.join((*required, *optional))}")
        return super().keys(value, path, required, optional)


__all__ = ["FORMAT", "FORMAT_VERSION", "MANIFEST", "Manifest", "PartEntry"]
