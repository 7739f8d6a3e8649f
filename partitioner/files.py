"""Writing output files (plans, sources, reports, exports, profiles): check the target before the
work, refuse to overwrite without ``force``, never replace what is not a regular file, and replace
files atomically.

Inputs are read with :func:`open_input` (or :func:`read_bytes`, :func:`read_text` on top of it): a
regular file of bounded size, checked before and after it is opened without blocking (a FIFO would
block, a device or a huge file exhaust memory).

In: a target path and its bytes. Out: the file, either as it was or whole: a temporary file made
with :func:`tempfile.mkstemp` beside the target (a unique name, so no file of the user's is
touched), written, fsynced, renamed over the target with :func:`os.replace`, and the folder
fsynced. Every error is a :class:`~partitioner.errors.HetpartError` naming the path and what to do.

:func:`check_output` is what a command runs *before* a long solve: an empty path, a folder that
does not exist, a path under a regular file (``existing.json/plan.json``), a folder that is not
writable, a target that is a folder, FIFO, device or symbolic link, or an existing file without
``force`` all fail at once. A target that exists and is not a regular file is replaced only with
``replace_special=True`` (the command line never passes it: remove such a target yourself).

Folders (a folder of ONNX parts, of ``hetpart run`` outputs) are made whole by :func:`write_folder`:
filled beside the target, then swapped in. ``force`` replaces an existing folder only when it is of
the writer's :class:`FolderKind` (its manifest, and nothing but files hetpart writes there): a folder
holding anything else (a model, a plan, a link, a sub-folder) is refused by :func:`check_folder`,
naming what is there, and of a replaced folder only the files its kind owns are deleted.

Example:
    >>> check_output(Path("report.html"), force=False)   # doctest: +SKIP
    Traceback (most recent call last):
    HetpartError: report.html exists: pass --force to overwrite it
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

from partitioner.errors import HetpartError

log = logging.getLogger(__name__)

__all__ = ["FolderKind", "check_folder", "check_output", "foreign_entries", "open_input", "read_bytes", "read_text",
           "refuse_overwrite", "write_atomic", "write_folder"]


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


def open_input(path: str | os.PathLike[str], *, what: str, max_bytes: int) -> BinaryIO:
    """Open an input file (a plan, a profile, a costs file, a cache, an ``--input`` array, a
    model) for reading in binary, once it is known to be a regular file of at most ``max_bytes``.

    A link is followed (a link to a plan file is a plan file). The path is checked with
    :func:`os.stat` before it is opened, then opened with ``O_NONBLOCK`` (opening a FIFO blocks
    until a writer comes; so the open returns at once) and checked again on the open descriptor
    (nothing swapped in between): a FIFO would block the reader, a device such as ``/dev/zero`` or
    a huge file would read until memory runs out.

    Raises:
        FileNotFoundError: the file does not exist (the caller says what to do then).
        HetpartError: it is not a regular file, it is larger than ``max_bytes``, or it cannot be
            opened; the message names the path and the fix.

    Example:
        >>> with open_input("x.npy", what="--input file", max_bytes=2**34) as f:   # doctest: +SKIP
        ...     f.read(6)
        b'\\x93NUMPY'
    """
    path = Path(path)
    try:
        _check_regular(path, os.stat(path), what, max_bytes)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as err:
        raise HetpartError(f"{path}: cannot read the {what}: {err.strerror or err}") from None
    try:
        _check_regular(path, os.fstat(fd), what, max_bytes)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | os.PathLike[str], *, what: str, max_bytes: int) -> bytes:
    """The bytes of an input file that is a regular file of at most ``max_bytes`` (see :func:`open_input`).

    Raises:
        FileNotFoundError: the file does not exist.
        HetpartError: it is not a regular file, it is (or grew) larger than ``max_bytes``, or it
            cannot be read.

    Example:
        >>> read_bytes("model.onnx", what="ONNX model", max_bytes=2**31)[:2]   # doctest: +SKIP
        b'\\x08\\x07'
    """
    with open_input(path, what=what, max_bytes=max_bytes) as f:
        try:
            data = f.read(max_bytes + 1)
        except OSError as err:
            raise HetpartError(f"{path}: cannot read the {what}: {err.strerror or err}") from None
    if len(data) > max_bytes:
        raise HetpartError(f"{path} grew past the {max_bytes:,} bytes a {what} may be while it was read: "
                           f"give a file nothing else writes")
    return data


def read_text(path: str | os.PathLike[str], *, what: str, max_bytes: int) -> str:
    """The UTF-8 text of an input file (a plan, a profile) that is a regular file of at most
    ``max_bytes``: a FIFO would block the reader, a device or a huge file would exhaust memory
    (see :func:`open_input`).

    Raises:
        FileNotFoundError: the file does not exist (the caller says what to do then).
        HetpartError: it is not a regular file, it is larger than ``max_bytes``, or not UTF-8.

    Example:
        >>> read_text("plan.json", what="plan file", max_bytes=2**29)[:1]   # doctest: +SKIP
        '{'
    """
    data = read_bytes(path, what=what, max_bytes=max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise HetpartError(f"{path}: cannot read the {what}: it is not UTF-8 text ({err.reason} at byte "
                           f"{err.start})") from None


def _check_regular(path: Path, st: os.stat_result, what: str, max_bytes: int) -> None:
    """Refuse what is not a regular file of at most ``max_bytes``: one line naming the path and the fix."""
    if not stat.S_ISREG(st.st_mode):
        raise HetpartError(f"{path} is {_kind(st.st_mode)}, not a regular file: give the {what} itself "
                           f"(a FIFO or a device cannot be read as one)")
    if st.st_size > max_bytes:
        raise HetpartError(f"{path} is {st.st_size:,} bytes, over the {max_bytes:,} a {what} may be: it is not "
                           f"a {what}, or give a smaller one")


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


@dataclasses.dataclass(frozen=True)
class FolderKind:
    """What a folder hetpart writes whole holds, so that ``force`` replaces only such a folder.

    A folder is of this kind when it is empty, or when ``marker`` says so and every entry is a
    regular file (never a link, a folder or a device) whose name ``owns`` accepts.
    """

    what: str                                  # what such a folder holds, in messages: "ONNX parts"
    owns: Callable[[str], bool]                # whether a file name is one hetpart writes into such a folder
    marker: Callable[[Path], bool] = lambda folder: True  # the folder says it is one (its manifest)
    unmarked: str = "nothing saying hetpart wrote it"     # what a folder the marker refuses lacks, in messages
    example: str = "out"                       # a new folder's name, suggested in messages


def foreign_entries(folder: Path, kind: FolderKind) -> list[str]:
    """The entries of an existing ``folder`` that are not :attr:`FolderKind.owns`'s regular files,
    described for a message (``'model.onnx'``, ``'data' (a folder)``); empty when replacing it loses
    nothing but what hetpart wrote there. Nothing is followed: an entry that is a link is foreign.

    Example:
        >>> foreign_entries(Path("parts"), PARTS)       # doctest: +SKIP
        ["'model.onnx'", "'plan.json'"]
    """
    foreign = []
    with os.scandir(folder) as entries:
        names = sorted((e.name, e.stat(follow_symlinks=False).st_mode) for e in entries)
    for name, mode in names:
        if not stat.S_ISREG(mode):
            foreign.append(f"{name!r} ({_kind(mode)})")
        elif not kind.owns(name):
            foreign.append(repr(name))
    if names and not foreign and not kind.marker(folder):
        shown = ", ".join(repr(name) for name, _ in names[:3]) + (", ..." if len(names) > 3 else "")
        foreign = [f"{shown} and {kind.unmarked}"]
    return foreign


def check_folder(folder: str | os.PathLike[str], *, force: bool, kind: FolderKind) -> Path:
    """Raise unless :func:`write_folder` can make ``folder`` now: it is absent, or (with ``force``) a
    folder of ``kind`` (see :class:`FolderKind`) that is not the folder this process runs in.

    Raises:
        HetpartError: ``{folder} holds 'model.onnx': hetpart replaces only ...``, ``{folder}
            exists: pass --force to replace it``, ``{folder} is a symbolic link ...``, ...

    Example:
        >>> check_folder("parts", force=True, kind=PARTS)   # doctest: +SKIP
        PosixPath('parts')
    """
    if not str(os.fspath(folder)).strip():
        raise HetpartError("the output folder is empty: give a folder name, e.g. parts")
    folder = Path(folder)
    whole = Path(os.path.abspath(folder))
    if whole.parent == whole:
        raise HetpartError(f"{folder} is the root folder: give a new folder to write, e.g. {whole / 'parts'}")
    _check_folder(whole, whole.parent)
    try:
        st = os.lstat(whole)
    except FileNotFoundError:
        return folder
    except OSError as err:
        raise HetpartError(f"cannot write {folder}: {err.strerror or err}") from None
    if not stat.S_ISDIR(st.st_mode):
        hint = (f"write to {os.path.realpath(whole)} itself, or remove the link first"
                if stat.S_ISLNK(st.st_mode) else "remove it first or choose another name")
        raise HetpartError(f"{folder} is {_kind(st.st_mode)}, not a folder of {kind.what}: {hint}")
    try:
        foreign = foreign_entries(whole, kind)
    except OSError as err:
        raise HetpartError(f"cannot read {folder} to see what it holds: {err.strerror or err}; give a new "
                           f"folder (e.g. {kind.example})") from None
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise HetpartError(f"{folder} holds {shown}: hetpart replaces only a folder holding nothing but {kind.what}; "
                           f"give a new folder (e.g. {folder / kind.example}) or move "
                           f"{'it' if len(foreign) == 1 else 'them'} out first")
    cwd = Path(os.getcwd())
    if cwd == whole or whole in cwd.parents:
        raise HetpartError(f"{folder} is the folder hetpart runs in (or holds it): run hetpart from another "
                           f"folder, or give a new folder to write (e.g. {kind.example})")
    if not force:
        raise HetpartError(f"{folder} exists: pass --force to replace it")
    return folder


def write_folder(folder: str | os.PathLike[str], fill: Callable[[Path], None], *, force: bool = False,
                 kind: FolderKind) -> Path:
    """Make ``folder`` whole or not at all: ``fill`` writes into a temporary folder beside it, which then
    takes its place. An existing folder is replaced only with ``force`` and only when it is a folder of
    ``kind`` (:func:`check_folder`, run again after ``fill``): it is moved aside, the new one renamed into
    place, and of the old one only the files ``kind`` owns are deleted (anything else that appeared
    meanwhile stays, in the moved-aside folder, with a warning).

    Raises:
        HetpartError: ``folder`` exists and ``force`` is false, it is not a folder of ``kind``, or it
            cannot be written; nothing is left behind and the old folder is as it was.

    Example:
        >>> write_folder(Path("parts"), lambda tmp: (tmp / "a.txt").write_text("a"), kind=PARTS)   # doctest: +SKIP
        PosixPath('parts')
    """
    folder = check_folder(folder, force=force, kind=kind)
    whole = Path(os.path.abspath(folder))
    tmp = whole.with_name(f".{whole.name[:64]}.{uuid.uuid4().hex[:12]}.tmp")
    old = None
    try:
        tmp.mkdir()
        fill(tmp)
        check_folder(folder, force=force, kind=kind)  # nothing else appeared there meanwhile
        if os.path.lexists(whole):
            old = whole.with_name(f".{whole.name[:64]}.{uuid.uuid4().hex[:12]}.old")
            os.replace(whole, old)
        try:
            os.replace(tmp, whole)
        except OSError:
            if old is not None:
                os.replace(old, whole)  # put the old folder back
                old = None
            raise
    except OSError as err:
        raise HetpartError(f"cannot write {folder}: {err.strerror or err}; check that the parent folder "
                           "exists and is writable") from err
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    if old is not None:
        _remove_owned(old, kind)
    _fsync_folder(whole.parent)
    return folder


def _remove_owned(old: Path, kind: FolderKind) -> None:
    """Delete the files ``kind`` owns in the moved-aside folder, then the folder if that empties it."""
    with os.scandir(old) as entries:
        owned = [e.name for e in entries if e.is_file(follow_symlinks=False) and kind.owns(e.name)]
    for name in owned:
        (old / name).unlink(missing_ok=True)
    try:
        old.rmdir()
    except OSError:
        log.warning("kept %s: files other than %s appeared in it while it was replaced; look at them, "
                    "then remove it", old, kind.what)


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
