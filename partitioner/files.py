"""Writing output files (plans, sources, reports, exports): refuse to overwrite without ``force``,
and replace files atomically.

In: a target path and its bytes. Out: the file, either as it was or whole (a temporary file
beside it, fsynced, then ``os.replace``); errors are :class:`~partitioner.errors.HetpartError`
naming the path and what to do.

Example:
    >>> refuse_overwrite([Path("report.html")], force=False)   # doctest: +SKIP
    Traceback (most recent call last):
    HetpartError: report.html exists: pass --force to overwrite it
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from partitioner.errors import HetpartError

__all__ = ["refuse_overwrite", "write_atomic", "write_folder"]


def refuse_overwrite(paths: Iterable[Path], *, force: bool) -> None:
    """Raise for the first of ``paths`` that exists, unless ``force``.

    Raises:
        HetpartError: ``{path} exists: pass --force to overwrite it``.
    """
    if force:
        return
    for path in paths:
        if path.exists():
            raise HetpartError(f"{path} exists: pass --force to overwrite it")


def write_atomic(path: Path, data: bytes) -> Path:
    """Write ``data`` to a temporary file beside ``path``, fsync it, rename it over ``path``.

    Raises:
        HetpartError: the folder is missing or not writable; ``path`` is left as it was.

    Example:
        >>> write_atomic(Path("out/gantt.png"), png_bytes)    # doctest: +SKIP
        PosixPath('out/gantt.png')
    """
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise HetpartError(f"cannot write {path}: {err.strerror or err}; "
                               f"check that the folder exists and is writable") from err
        raise
    _fsync_folder(path.parent)
    return path


def write_folder(folder: Path, fill: Callable[[Path], None], *, force: bool = False) -> Path:
    """Make ``folder`` whole or not at all: ``fill`` writes into a temporary folder beside it, which is
    then renamed to ``folder`` (an existing folder, with ``force``, is moved aside first, then removed).

    Raises:
        HetpartError: ``folder`` exists and ``force`` is false, it is not a folder, or it cannot be
            written; nothing is left behind.

    Example:
        >>> write_folder(Path("parts"), lambda tmp: (tmp / "a.txt").write_text("a"))   # doctest: +SKIP
        PosixPath('parts')
    """
    refuse_overwrite([folder], force=force)
    if folder.exists() and not folder.is_dir():
        raise HetpartError(f"{folder} exists and is not a folder: give a folder path")
    tmp = folder.with_name(f".{folder.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        tmp.mkdir()
        fill(tmp)
        old = None
        if folder.exists():
            old = folder.with_name(f".{folder.name}.{uuid.uuid4().hex[:12]}.old")
            os.replace(folder, old)
        os.replace(tmp, folder)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as err:
        raise HetpartError(f"cannot write {folder}: {err.strerror or err}; check that the parent folder "
                           "exists and is writable") from err
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    _fsync_folder(folder.parent)
    return folder


def _fsync_folder(folder: Path) -> None:
    """Make the rename durable where the platform allows fsync on a folder."""
    if not hasattr(os, "O_DIRECTORY"):
        return
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on folders; the rename itself is still atomic
    finally:
        os.close(fd)
