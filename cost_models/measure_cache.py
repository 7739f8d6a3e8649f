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

File shape::

    {"format": "hetpart-measurements", "version": 2,
     "entries": {"cpu|torch=2.13.0+cpu|threads=2|forward|aten.relu.default(f32[2,3]/3.1)":
                 {"samples": [1.2e-06, 1.1e-06], "unsupported": null}}}
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import statistics
from pathlib import Path
from typing import Any

from cost_models.signature import Environment
from partitioner.errors import HetpartError
from partitioner.files import write_atomic

__all__ = ["CacheEntry", "MeasurementCache", "default_cache_path", "KINDS"]

log = logging.getLogger(__name__)

FORMAT = "hetpart-measurements"
VERSION = 2  # 2: measured with freed memory kept (cost_models.allocator); 1's CPU times may hold page faults
MAX_SAMPLES = 31  # samples kept per entry (the newest)
KINDS = ("forward", "train_forward", "backward", "optimizer", "copy")


@dataclasses.dataclass(frozen=True)
class CacheEntry:
    """The samples (seconds) measured for one key, or why the op failed there."""

    samples: tuple[float, ...] = ()
    unsupported: str | None = None

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
        if not path.exists():
            return cls(path)
        fix = f"delete {path} (it only holds measurements) or set HETPART_CACHE to another file"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise HetpartError(f"{path}: cannot read the measurement cache ({err}); {fix}") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
            raise HetpartError(f"{path}: not a hetpart measurement cache (no \"format\": \"{FORMAT}\"); {fix}")
        if data.get("version") != VERSION:
            log.warning("%s: measurement cache version %r, this hetpart writes %d: starting afresh",
                        path, data.get("version"), VERSION)
            return cls(path)
        entries = {}
        for key, raw in data["entries"].items():
            samples = raw.get("samples", []) if isinstance(raw, dict) else None
            if not isinstance(samples, list) or not all(isinstance(s, (int, float)) and s >= 0 for s in samples):
                raise HetpartError(f"{path}: entry {key!r} has no valid samples; {fix}")
            entries[key] = CacheEntry(tuple(float(s) for s in samples), raw.get("unsupported"))
        return cls(path, entries)

    def save(self) -> Path | None:
        """Write the cache atomically (nothing when it is in memory only or unchanged)."""
        if self.path is None or not self.dirty:
            return None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data: dict[str, Any] = {"format": FORMAT, "version": VERSION, "entries": {
            key: {"samples": list(e.samples), "unsupported": e.unsupported} for key, e in sorted(self._entries.items())
        }}
        write_atomic(self.path, (json.dumps(data, indent=0) + "\n").encode("utf-8"))
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
            unsupported: str | None = None) -> CacheEntry:
        """Add ``samples`` to the key's entry (keeping the newest :data:`MAX_SAMPLES`), or mark it unsupported."""
        key = self.key(env, kind, signature)
        old = self._entries.get(key, CacheEntry())
        entry = CacheEntry((*old.samples, *samples)[-MAX_SAMPLES:], unsupported)
        self._entries[key] = entry
        self._index(key)
        self.dirty = True
        return entry

    def __len__(self) -> int:
        return len(self._entries)
