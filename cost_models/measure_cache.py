"""The local cache of measured op times, so that profiling a model a second time is fast.

In: measurements, each keyed by an :class:`~cost_models.signature.Environment` (device, torch
version, thread count), a kind (``forward``, ``train_forward``, ``backward``, ``optimizer``,
``copy``) and a signature (:func:`~cost_models.signature.node_signature`). Out: the samples
measured for a key, or nothing. A JSON file (default ``$HETPART_CACHE``, else
``$XDG_CACHE_HOME/hetpart/measurements.json``, else ``~/.cache/hetpart/measurements.json``)
written atomically with :func:`partitioner.files.write_atomic`, so an interrupted profile leaves
the old file or the new one whole.

An entry measured under another torch version or thread count has another key: it is never
used, and :attr:`MeasurementCache.stale` counts the lookups it would have answered. An op that
failed on a device is cached too (its reason, no samples), so it is not retried every run.

Each entry records how busy the machine was when its samples were taken (``load``: CPUs' worth of
other processes' work, see :mod:`cost_models.machine_load`; ``busy``: whether that was over
:data:`~cost_models.machine_load.BUSY_SHARE` of the CPUs). Quiet samples win: samples measured
while quiet replace an entry's busy ones, and busy samples are not added to a quiet entry that
has some. The measuring code re-measures a busy entry once the machine is quiet, and flags what it
reuses while still busy (:mod:`cost_models.measure`).

Nothing in the file is trusted: it must be a regular file (a FIFO, a device or a huge file is
refused before it is read); an entry whose samples are not finite, negative, zero where a time
cannot be (every kind but ``backward`` on a CPU: the timer brackets a call), or over
:data:`MAX_SAMPLE_S`, is dropped with a log line (and measured again). A cache that is a
symbolic link is written through to its target, atomically (the link stays a link).

File shape::

    {"format": "hetpart-measurements", "version": 3,
     "entries": {"cpu|torch=2.13.0+cpu|threads=2|forward|aten.relu.default(f32[2,3]/3.1)":
                 {"samples": [1.2e-06, 1.1e-06], "unsupported": null, "load": 0.04, "busy": false}}}
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import statistics
from pathlib import Path
from typing import Any

from cost_models.signature import Environment
from partitioner.errors import HetpartError
from partitioner.files import read_text, write_atomic

__all__ = ["CacheEntry", "MeasurementCache", "default_cache_path", "KINDS"]

log = logging.getLogger(__name__)

FORMAT = "hetpart-measurements"
# 2: measured with freed memory kept (cost_models.allocator); 1's CPU times may hold page faults.
# 3: each entry records the load it was measured under; 2's entries may hold a busy machine's times.
VERSION = 3
MAX_SAMPLES = 31  # samples kept per entry (the newest)
KINDS = ("forward", "train_forward", "backward", "optimizer", "copy")
#: No sample of one op, copy or optimizer step is longer: a timed pass runs at least three times,
#: so an op of ten minutes would take half an hour to profile; a longer sample is a wrong entry.
MAX_SAMPLE_S = 600.0
MAX_CACHE_BYTES = 1 << 28  # 256 MiB: about a million entries; a larger file is not a cache hetpart wrote


@dataclasses.dataclass(frozen=True)
class CacheEntry:
    """The samples (seconds) measured for one key, or why the op failed there, and the load then."""

    samples: tuple[float, ...] = ()
    unsupported: str | None = None
    busy: bool = False           # measured while other processes took a share of the CPUs (machine_load)
    load: float | None = None    # CPUs' worth of other processes' work while measured (None: unknown)

    @property
    def seconds(self) -> float | None:
        """The median sample (None for an unsupported op or an entry without samples)."""
        return statistics.median(self.samples) if self.samples else None


def default_cache_path() -> Path:
    """``$HETPART_CACHE``, else ``$XDG_CACHE_HOME/hetpart/measurements.json``, else ``~/.cache/...``.

    Example:
        >>> default_cache_path().name                     # doctest: +SKIP
        'measurements.json'
    """
    explicit = os.environ.get("HETPART_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hetpart" / "measurements.json"


class MeasurementCache:
    """Measured samples keyed by environment, kind and signature; ``path=None`` keeps them in memory.

    Example:
        >>> cache = MeasurementCache.load(Path("measurements.json"))   # doctest: +SKIP
        >>> cache.get(environment("cpu"), "forward", sig)             # doctest: +SKIP
        CacheEntry(samples=(1.2e-06,), unsupported=None)
    """

    def __init__(self, path: Path | None = None, entries: dict[str, CacheEntry] | None = None) -> None:
        self.path = path
        self._entries: dict[str, CacheEntry] = dict(entries or {})
        self._other_env: dict[str, set[str]] = {}   # device|kind|signature -> env keys seen
        for key in self._entries:
            self._index(key)
        self._stale: set[str] = set()   # keys looked up that only another torch version / thread count has
        self._dropped: set[str] = set()  # keys the file held that could not be trusted (not merged back on save)
        self.dirty = False

    # -- file -----------------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> MeasurementCache:
        """The cache in ``path`` (default :func:`default_cache_path`); a missing file is empty.

        Raises:
            HetpartError: the file exists but is not a measurement cache (the message says to
                delete it or pick another with ``$HETPART_CACHE``).
        """
        path = Path(path) if path is not None else default_cache_path()
        fix = f"delete {path} (it only holds measurements) or set HETPART_CACHE to another file"
        try:
            text = read_text(path, what="measurement cache", max_bytes=MAX_CACHE_BYTES)
        except FileNotFoundError:
            return cls(path)
        except HetpartError as err:
            raise HetpartError(f"{err}; {fix}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise HetpartError(f"{path}: cannot read the measurement cache ({err}); {fix}") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
            raise HetpartError(f"{path}: not a hetpart measurement cache (no \"format\": \"{FORMAT}\"); {fix}")
        if data.get("version") != VERSION:
            log.warning("%s: measurement cache version %r, this hetpart writes %d: starting afresh",
                        path, data.get("version"), VERSION)
            cache = cls(path)
            cache.dirty = True   # the next save writes this version, not the old entries again
            return cache
        entries, dropped = {}, []
        for key, raw in data["entries"].items():
            entry, why = _entry(key, raw)
            if entry is None:
                dropped.append(f"{key!r} ({why})")
            else:
                entries[key] = entry
        cache = cls(path, entries)
        cache._dropped = {key for key in data["entries"] if key not in entries}
        if dropped:
            log.warning("%s: %d untrusted measurement cache %s dropped, to be measured again: %s%s", path,
                        len(dropped), "entry" if len(dropped) == 1 else "entries", "; ".join(dropped[:3]),
                        "; ..." if len(dropped) > 3 else "")
            cache.dirty = True   # the next save leaves them out
        return cache

    def save(self) -> Path | None:
        """Write the cache atomically (nothing when it is in memory only or unchanged).

        Entries another process saved to the file since it was loaded are kept (merged in; this
        cache's entries win for the same key), so two profiles run at once lose nothing.
        """
        if self.path is None or not self.dirty:
            return None
        # A link (a cache kept elsewhere, shared) is written through: its target is replaced
        # atomically and the link stays. A target that is not a regular file is refused by write_atomic.
        target = Path(os.path.realpath(self.path)) if self.path.is_symlink() else self.path
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise HetpartError(f"cannot write the measurement cache {self.path}: {err.strerror or err}; set "
                               f"HETPART_CACHE to a file in a writable folder") from None
        for key, entry in _trusted_entries(target).items():
            if key not in self._entries and key not in self._dropped:
                self._entries[key] = entry
                self._index(key)
        data: dict[str, Any] = {"format": FORMAT, "version": VERSION, "entries": {
            key: {"samples": list(e.samples), "unsupported": e.unsupported, "load": e.load, "busy": e.busy}
            for key, e in sorted(self._entries.items())
        }}
        write_atomic(target, (json.dumps(data, indent=0) + "\n").encode("utf-8"))
        self.dirty = False
        return self.path

    # -- entries --------------------------------------------------------------------------------

    @staticmethod
    def key(env: Environment, kind: str, signature: str) -> str:
        if kind not in KINDS:
            raise ValueError(f"measurement kind {kind!r} is not one of {', '.join(KINDS)}")
        return f"{env.key()}|{kind}|{signature}"

    def _index(self, key: str) -> None:
        device, torch_part, threads, rest = key.split("|", 3)
        self._other_env.setdefault(f"{device}|{rest}", set()).add(f"{torch_part}|{threads}")

    def get(self, env: Environment, kind: str, signature: str) -> CacheEntry | None:
        """The entry for this key, or None (counted in :attr:`stale` when only other environments have it)."""
        key = self.key(env, kind, signature)
        entry = self._entries.get(key)
        if entry is None and self._other_env.get(f"{env.device}|{kind}|{signature}"):
            self._stale.add(key)
        return entry

    @property
    def stale(self) -> int:
        """Distinct keys looked up and missing whose op was measured under another torch version
        or thread count (those entries are not used)."""
        return len(self._stale)

    def put(self, env: Environment, kind: str, signature: str, samples: list[float] | tuple[float, ...] = (),
            unsupported: str | None = None, *, busy: bool = False, load: float | None = None) -> CacheEntry:
        """Add ``samples`` to the key's entry (keeping the newest :data:`MAX_SAMPLES`), or mark it unsupported.

        ``busy`` and ``load`` say how busy the machine was while ``samples`` were taken: quiet
        samples replace busy ones, busy samples are not added to an entry with quiet ones.
        """
        key = self.key(env, kind, signature)
        old = self._entries.get(key, CacheEntry())
        if samples and old.samples and old.busy != busy:
            if busy:      # keep the quiet samples alone
                samples, busy, load = (), old.busy, old.load
            else:         # the busy ones are what is replaced
                old = CacheEntry(unsupported=old.unsupported)
        if not samples:
            busy, load = old.busy, old.load
        elif old.samples and old.load is not None and load is not None:   # the load over every sample kept
            kept = min(len(old.samples), MAX_SAMPLES - min(len(samples), MAX_SAMPLES))
            load = (old.load * kept + load * len(samples)) / max(kept + len(samples), 1)
        entry = CacheEntry((*old.samples, *samples)[-MAX_SAMPLES:], unsupported, busy, load)
        self._entries[key] = entry
        self._index(key)
        self.dirty = True
        return entry

    def __len__(self) -> int:
        return len(self._entries)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _trusted_entries(path: Path) -> dict[str, CacheEntry]:
    """The entries of the cache file at ``path`` that can be trusted; none when it is absent or is not
    a cache of this version (what :meth:`MeasurementCache.save` merges in before it writes)."""
    try:
        data = json.loads(read_text(path, what="measurement cache", max_bytes=MAX_CACHE_BYTES))
    except (FileNotFoundError, HetpartError, json.JSONDecodeError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION \
            or not isinstance(data.get("entries"), dict):
        return {}
    out = {}
    for key, raw in data["entries"].items():
        entry, _ = _entry(key, raw)
        if entry is not None:
            out[key] = entry
    return out


def _entry(key: str, raw: Any) -> tuple[CacheEntry | None, str]:
    """The entry a file holds for ``key``, or None and why it cannot be trusted."""
    parts = key.split("|")
    if len(parts) < 5 or parts[3] not in KINDS:
        return None, "not a key this hetpart writes"
    if not isinstance(raw, dict):
        return None, "not an object"
    samples, unsupported = raw.get("samples", []), raw.get("unsupported")
    busy, load = raw.get("busy", False), raw.get("load")
    if not isinstance(samples, list) or not all(_number(s) for s in samples):
        return None, "samples are not a list of numbers"
    if unsupported is not None and not isinstance(unsupported, str):
        return None, "unsupported is not a reason"
    if not isinstance(busy, bool) or not (load is None or (_number(load) and math.isfinite(load) and load >= 0)):
        return None, "its load is not a number of CPUs"
    # a CPU time brackets a call, never 0; a backward share may be 0 (an op without autograd nodes),
    # and so may a GPU op that launches no kernel (its events are back to back)
    zero_ok = parts[3] == "backward" or not parts[0].startswith("cpu")
    for s in samples:
        if not math.isfinite(s) or s < 0 or (s == 0 and not zero_ok) or s > MAX_SAMPLE_S:
            return None, f"sample {s!r} s is not a time a {parts[3]} measurement can take"
    return CacheEntry(tuple(float(s) for s in samples[-MAX_SAMPLES:]), unsupported, busy,
                      None if load is None else float(load)), ""
