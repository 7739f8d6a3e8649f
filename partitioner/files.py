"""Writing output files (plans, sources, reports, exports, profiles): check the target before the
work, refuse to overwrite without ``force``, never replace what is not a regular file, and replace
files atomically.

Inputs are read with :func:`read_text`: a regular file of bounded size (a FIFO would block,
a device or a huge file exhaust memory).

In: a target path and its bytes. Out: the file, either as it was or whole: a temporary file made
with :func:`tempfile.mkstemp` beside the target (a unique name, so no file of the user's is
touched), written, fsynced, renamed over the target with :func:`os.replace`, and the folder
fsynced. Every error is a :class:`~partitioner.errors.HetpartError` naming the path and what to do.

:func:`check_output` is what a command runs *before* a long solve: an empty path, a folder that
does not exist, a path under a regular file (``existing.json/plan.json``), a folder that is not
writable, a target that is a folder, FIFO, device or symbolic link, or an existing file without
``force`` all fail at once. A target that exists and is not a regular file is replaced only with
``replace_special=True`` (the command line never passes it: remove such a target yourself).

Example:
    >>> check_output(Path("report.html"), force=False)   # doctest: +SKIP
    Traceback (most recent call last):
    HetpartError: report.html exists: pass --force to overwrite it
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from partitioner.errors import HetpartError

__all__ = ["check_output", "read_text", "refuse_overwrite", "write_atomic", "write_folder"]


def check_output(path: str | os.PathLike[str], *, force: bool, replace_special: bool = False,
                 flag: str = "the output path", forcing: str = "--force") -> Path:
    """Raise unless ``path`` can be written now: its folder exists and is writable, and the target
    is absent, or (with ``force``) a regular file (any kind of file with ``replace_special``).

    ``flag`` names the path in the message about an empty one (``-o``, ``--write``); ``forcing`` is
    what the caller passes to overwrite (``--force`` on the command line, ``force=True`` in Python).

    Raises:
        HetpartError: ``{path} exists: pass --force to overwrite it``, ``{path} is a FIFO, not a
            regular file: ...``, ``cannot write {path}: {folder} is a file, not a folder``, ...

    Example:
        >>> check_output("out/plan.json", force=False)     # doctest: +SKIP
        PosixPath('out/plan.json')
    """
    if not str(os.fspath(path)).strip():
        raise HetpartError(f"{flag} is empty: give a file name, e.g. plan.json")
    path = Path(path)
    folder = path.parent
    _check_folder(path, folder)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return path
    except OSError as err:
        raise HetpartError(f"cannot write {path}: {err.strerror or err}") from None
    if not stat.S_ISREG(st.st_mode) and not replace_special:
        kind = _kind(st.st_mode)
        hint = (f"write to {os.path.realpath(path)} itself, or remove the link first"
                if stat.S_ISLNK(st.st_mode) else "remove it first or choose another name")
        raise HetpartError(f"{path} is {kind}, not a regular file: hetpart replaces only regular files; {hint}")
    if not force:
        raise HetpartError(f"{path} exists: pass {forcing} to overwrite it")
    return path


def refuse_overwrite(paths: Iterable[Path], *, force: bool, forcing: str = "--force") -> None:
    """:func:`check_output` for each of ``paths`` (all are checked before anything is written);
    ``forcing`` names how the caller overwrites (``force=True`` for a Python API).

    Raises:
        HetpartError: the first path that cannot be written (see :func:`check_output`).

    Example:
        >>> refuse_overwrite([Path("gantt.png"), Path("memory.png")], force=True)   # doctest: +SKIP
    """
    for path in paths:
        check_output(path, force=force, forcing=forcing)


def write_atomic(path: str | os.PathLike[str], data: bytes, *, replace_special: bool = False) -> Path:
    """Write ``data`` to a unique temporary file beside ``path``, fsync it, rename it over ``path``,
    fsync the folder.

    An existing target keeps its permission bits; a new one gets the usual ``0o666`` less the
    umask. A target that is not a regular file (folder, FIFO, device, symbolic link) is refused
    unless ``replace_special``.

    Raises:
        HetpartError: the folder is missing or not writable, or the target is not a regular file;
            ``path`` is left as it was.

    Example:
        >>> write_atomic(Path("out/gantt.png"), png_bytes)    # doctest: +SKIP
        PosixPath('out/gantt.png')
    """
    path = check_output(path, force=True, replace_special=replace_special)
    folder = path.parent
    mode = _mode_for(path)
    try:
        fd, tmp_name = tempfile.mkstemp(dir=folder, prefix=f".{path.name[:64]}.", suffix=".tmp")
    except OSError as err:
        raise HetpartError(f"cannot write {path}: {err.strerror or err}; check that the folder "
                           f"{folder} exists and is writable") from None
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        check_output(path, force=True, replace_special=replace_special)  # nothing swapped in meanwhile
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise HetpartError(f"cannot write {path}: {err.strerror or err}; check that the folder "
                               f"exists and is writable") from err
        raise
    _fsync_folder(folder)
    return path


def read_text(path: str | os.PathLike[str], *, what: str, max_bytes: int) -> str:
    """The UTF-8 text of an input file (a plan, a profile) that is a regular file of at most
    ``max_bytes``: a FIFO would block the reader, a device or a huge file would exhaust memory.

    Raises:
        FileNotFoundError: the file does not exist (the caller says what to do then).
        HetpartError: it is not a regular file, it is larger than ``max_bytes``, or not UTF-8.

    Example:
        >>> read_text("plan.json", what="plan file", max_bytes=2**29)[:1]   # doctest: +SKIP
        '{'
    """
    path = Path(path)
    st = os.stat(path)  # follows links: a link to a plan file is a plan file
    if not stat.S_ISREG(st.st_mode):
        raise HetpartError(f"{path} is {_kind(st.st_mode)}, not a regular file: give the {what} itself")
    if st.st_size > max_bytes:
        raise HetpartError(f"{path} is {st.st_size:,} bytes, over the {max_bytes:,} a {what} may be: it is not "
                           f"a {what}, or give a smaller one")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(max_bytes + 1)
    except UnicodeDecodeError as err:
        raise HetpartError(f"{path}: cannot read the {what}: it is not UTF-8 text ({err.reason} at byte "
                           f"{err.start})") from None
    except OSError as err:
        raise HetpartError(f"{path}: cannot read the {what}: {err.strerror or err}") from None


# --------------------------------------------------------------------------------------------


def _check_folder(path: Path, folder: Path) -> None:
    """The folder holding ``path`` exists, is a folder, and can be written."""
    if folder.is_dir():
        if not os.access(folder, os.W_OK | os.X_OK):
            raise HetpartError(f"cannot write {path}: the folder {folder} is not writable")
        return
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise HetpartError(f"cannot write {path}: {existing} is a file, not a folder; choose a path "
                           f"in a folder")
    raise HetpartError(f"cannot write {path}: the folder {folder} does not exist; create it first")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _mode_for(path: Path) -> int:
    """The permission bits the new file gets: the old file's, or 0o666 less the umask."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return 0o666 & ~_umask()


def _umask() -> int:
    """The process umask, read without changing it where ``/proc`` tells it (Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: read it by setting it, and put it back at once
    os.umask(mask)
    return mask


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
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise HetpartError(f"{folder} exists and is not a folder: give a folder path")
    check_output(folder, force=force, replace_special=True)  # a folder is what it replaces
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
