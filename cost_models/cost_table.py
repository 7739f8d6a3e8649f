"""The costs file ``hetpart profile`` writes: one model's ops measured on the devices of this machine.

In: what the profiler measured (:class:`CostTable` fields), or a costs file on disk. Out: the
frozen :class:`CostTable`; its JSON (:meth:`CostTable.save`, written atomically, never over an
existing file without ``force``) and back (:meth:`CostTable.load`, every field checked; an error
names the file and the field).

The file::

    {"format": "hetpart-costs", "version": 1,
     "model": "gpt:small", "fingerprint": "3f2a...",        # the OpGraph it was measured on
     "torch": "2.13.0+cpu", "threads": 2,                    # the environment of every number
     "bind": {"cpu": "cpu", "npu:0": "cpu"},                 # logical device -> physical device measured
     "ops": {"linear": {"signature": "aten.linear.default(...)",
                        "times": {"cpu": {"forward_s": 2.1e-3, "train_forward_s": 2.3e-3,
                                          "backward_s": 4.4e-3}}}},
     "unsupported": {"my_op": {"cpu": "NotImplementedError: ..."}},
     "optimizer": {"cpu": {"adam": 8.7e-09}},                # step seconds per trainable byte
     "copies": [{"from": "cpu", "to": "cuda:0", "pinned": true, "bytes": 4096, "seconds": 1.7e-05}],
     "busy": {"cpu": ["linear", "relu"]}}                    # optional: ops measured while the machine was busy

Times are keyed by physical device; ``bind`` says which logical devices of a profile they stand
for. A ``null`` time was not measured (an inference-only profile has no backward). ``busy`` lists,
per physical device, the ops whose times were measured while other processes shared the CPUs
(:mod:`cost_models.machine_load`); the plans priced from them say so. The file is read only when it
is a regular file of at most :data:`MAX_COSTS_BYTES` (:func:`partitioner.files.read_text`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, NoReturn

from cost_models.copies import CopyTime
from cost_models.measure_cache import MAX_SAMPLE_S
from partitioner.errors import HetpartError
from partitioner.files import read_text, refuse_overwrite, write_atomic

__all__ = ["CostTable", "CostsFileError", "FORMAT", "VERSION", "MAX_COSTS_BYTES"]

FORMAT = "hetpart-costs"
VERSION = 1
TIME_FIELDS = ("forward_s", "train_forward_s", "backward_s")
_KEYS = ("format", "version", "model", "fingerprint", "torch", "threads", "bind", "ops", "unsupported",
         "optimizer", "copies")
_OPTIONAL = ("busy",)
MAX_COSTS_BYTES = 1 << 29  # 512 MiB: a model of a million ops; a larger file is not a costs file


class CostsFileError(HetpartError, ValueError):
    """A costs file that is not what ``hetpart profile`` writes: names the file and the field."""


@dataclasses.dataclass(frozen=True)
class CostTable:
    """Measured op times of one captured model on the devices of one machine.

    Example:
        >>> table = CostTable.load("costs.json")                        # doctest: +SKIP
        >>> table.seconds("linear", "cpu", "forward_s")                 # doctest: +SKIP
        0.0021
    """

    model: str
    fingerprint: str                                        # OpGraph.fingerprint() of the graph measured
    torch: str
    threads: int
    bind: Mapping[str, str]                                 # logical device -> physical device
    signatures: Mapping[str, str]                           # op -> its call signature
    times: Mapping[str, Mapping[str, Mapping[str, float | None]]]  # op -> physical -> field -> seconds
    unsupported: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)  # op -> physical -> why
    optimizer: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)  # physical -> opt -> s/byte
    copies: tuple[CopyTime, ...] = ()
    busy: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # physical -> ops measured busy
    source: str = dataclasses.field(default="<costs>", compare=False)

    def __post_init__(self) -> None:
        for name in ("bind", "signatures", "unsupported", "optimizer", "times"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))
        busy = {d: tuple(sorted(ops)) for d, ops in self.busy.items() if ops}
        object.__setattr__(self, "busy", MappingProxyType(busy))
        object.__setattr__(self, "copies", tuple(self.copies))

    def seconds(self, op: str, physical: str, field: str) -> float | None:
        """A measured time (``forward_s``, ``train_forward_s``, ``backward_s``), or None."""
        return self.times.get(op, {}).get(physical, {}).get(field)

    # -- JSON -----------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The file's content as plain JSON values."""
        return {
            "format": FORMAT, "version": VERSION, "model": self.model, "fingerprint": self.fingerprint,
            "torch": self.torch, "threads": self.threads, "bind": dict(self.bind),
            "ops": {op: {"signature": self.signatures.get(op, ""),
                         "times": {d: dict(t) for d, t in self.times.get(op, {}).items()}}
                    for op in dict.fromkeys([*self.signatures, *self.times])},
            "unsupported": {op: dict(v) for op, v in self.unsupported.items()},
            "optimizer": {d: dict(v) for d, v in self.optimizer.items()},
            "copies": [{"from": c.src, "to": c.dst, "pinned": c.pinned, "bytes": c.nbytes, "seconds": c.seconds}
                       for c in self.copies],
            **({"busy": {d: list(ops) for d, ops in self.busy.items()}} if self.busy else {}),
        }

    def save(self, path: str | os.PathLike[str], *, force: bool = False) -> Path:
        """Write the file atomically; refuse an existing ``path`` unless ``force``."""
        path = Path(path)
        refuse_overwrite([path], force=force)
        return write_atomic(path, (json.dumps(self.to_dict(), indent=1) + "\n").encode("utf-8"))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CostTable:
        """Read and check a costs file.

        Raises:
            CostsFileError: the file is not a costs file; the message names the field.
            HetpartError: it cannot be read.
        """
        path = Path(path)
        try:
            text = read_text(path, what="costs file", max_bytes=MAX_COSTS_BYTES)
        except FileNotFoundError:
            raise HetpartError(f"{path}: no such costs file; make one with `hetpart profile MODEL -o {path}`") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise CostsFileError(f"{path}: line {err.lineno}: not JSON ({err.msg}); re-run `hetpart profile`") from None
        return cls.from_dict(data, str(path))

    @classmethod
    def from_dict(cls, d: Any, source: str = "<dict>") -> CostTable:
        """A table from the decoded file, every field checked."""
        r = _Reader(source)
        top = r.mapping(d, "")
        if top.get("format") != FORMAT:
            r.fail("format", f"expected {FORMAT!r}: this is not a file `hetpart profile` wrote")
        if top.get("version") != VERSION:
            r.fail("version", f"{top.get('version')!r}: this hetpart reads version {VERSION}; re-run `hetpart profile`")
        unknown = [k for k in top if k not in _KEYS and k not in _OPTIONAL]
        if unknown:
            r.fail(unknown[0], f"unknown field; the fields are {', '.join(_KEYS + _OPTIONAL)}")
        for key in _KEYS:
            if key not in top:
                r.fail(key, "missing")
        ops = r.mapping(top["ops"], "ops")
        signatures, times = {}, {}
        for op, entry in ops.items():
            e = r.mapping(entry, f"ops.{op}")
            signatures[op] = r.string(e.get("signature"), f"ops.{op}.signature")
            times[op] = {dev: {f: r.time(v, f"ops.{op}.times.{dev}.{f}") for f, v in r.mapping(t, f"ops.{op}.times.{dev}").items()
                               if r.field(f, f"ops.{op}.times.{dev}")}
                         for dev, t in r.mapping(e.get("times"), f"ops.{op}.times").items()}
        copies = []
        for i, c in enumerate(top["copies"] if isinstance(top["copies"], list) else r.fail("copies", "expected a list")):
            c = r.mapping(c, f"copies[{i}]")
            copies.append(CopyTime(r.string(c.get("from"), f"copies[{i}].from"), r.string(c.get("to"), f"copies[{i}].to"),
                                   bool(c.get("pinned")), int(r.seconds(c.get("bytes"), f"copies[{i}].bytes") or 0),
                                   r.time(c.get("seconds"), f"copies[{i}].seconds") or 0.0))
        threads = top["threads"]
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            r.fail("threads", f"expected a thread count, got {threads!r}")
        return cls(
            model=r.string(top["model"], "model"), fingerprint=r.string(top["fingerprint"], "fingerprint"),
            torch=r.string(top["torch"], "torch"), threads=threads,
            bind={k: r.string(v, f"bind.{k}") for k, v in r.mapping(top["bind"], "bind").items()},
            signatures=signatures, times=times,
            unsupported={op: {d: r.string(w, f"unsupported.{op}.{d}") for d, w in r.mapping(v, f"unsupported.{op}").items()}
                         for op, v in r.mapping(top["unsupported"], "unsupported").items()},
            optimizer={d: {o: r.seconds(s, f"optimizer.{d}.{o}") or 0.0 for o, s in r.mapping(v, f"optimizer.{d}").items()}
                       for d, v in r.mapping(top["optimizer"], "optimizer").items()},
            copies=tuple(copies),
            busy={d: tuple(r.string(op, f"busy.{d}[{i}]") for i, op in enumerate(r.array(v, f"busy.{d}")))
                  for d, v in r.mapping(top.get("busy", {}), "busy").items()},
            source=source,
        )


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, message: str) -> NoReturn:
        raise CostsFileError(f"{self.source}: {path}: {message}" if path else f"{self.source}: {message}")

    def mapping(self, value: Any, path: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            self.fail(path or "the file", f"expected an object, got {type(value).__name__}")
        return value

    def array(self, value: Any, path: str) -> list[Any]:
        if not isinstance(value, list):
            self.fail(path, f"expected a list, got {type(value).__name__}")
        return value

    def string(self, value: Any, path: str) -> str:
        if not isinstance(value, str):
            self.fail(path, f"expected a string, got {value!r}")
        return value

    def seconds(self, value: Any, path: str) -> float | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
            self.fail(path, f"expected a non-negative number or null, got {value!r}")
        return float(value)

    def time(self, value: Any, path: str) -> float | None:
        """A measured time: a non-negative number of at most MAX_SAMPLE_S (what a profile can measure), or null."""
        seconds = self.seconds(value, path)
        if seconds is not None and seconds > MAX_SAMPLE_S:
            self.fail(path, f"{seconds!r} s is longer than any op or copy `hetpart profile` measures "
                            f"({MAX_SAMPLE_S:g} s at most): re-run `hetpart profile`")
        return seconds

    def field(self, name: str, path: str) -> bool:
        if name not in TIME_FIELDS:
            self.fail(f"{path}.{name}", f"unknown time; the times are {', '.join(TIME_FIELDS)}")
        return True
