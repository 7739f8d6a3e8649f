"""The Gantt and memory charts as PNG images, for slides and issues.

In: a :class:`~partitioner.plan.Plan` and a folder. Out: ``gantt.png`` (the predicted schedule of
:func:`~partitioner.report.timeline.timeline`, one row per device and per link with traffic) and
``memory.png`` (used over capacity per device), drawn with matplotlib's Agg renderer and written
atomically. matplotlib is imported when :func:`write_pngs` runs, not with the package; the
figures are drawn on a ``FigureCanvasAgg`` of their own, so no pyplot state or global backend
setting of the caller is touched.

Example:
    >>> write_pngs(plan, "out", force=True)                   # doctest: +SKIP
    [PosixPath('out/gantt.png'), PosixPath('out/memory.png')]
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cost_models.units import format_bytes, format_seconds
from partitioner.errors import HetpartError
from partitioner.files import refuse_overwrite, write_atomic
from partitioner.report.svg import device_colours, time_ticks
from partitioner.report.timeline import Timeline, timeline
from partitioner.terminal import one_line

if TYPE_CHECKING:
    from partitioner.plan import Plan

__all__ = ["check_png_folder", "write_pngs", "PNG_NAMES"]

#: The files :func:`write_pngs` writes, in order.
PNG_NAMES = ("gantt.png", "memory.png")


def write_pngs(plan: Plan, folder: str | os.PathLike[str], *, force: bool = False) -> list[Path]:
    """Draw ``gantt.png`` and ``memory.png`` into ``folder`` (made if missing).

    Raises:
        HetpartError: one of the files exists and ``force`` is false, or the folder cannot be
            made or written.

    Example:
        >>> [p.name for p in write_pngs(plan, "out")]         # doctest: +SKIP
        ['gantt.png', 'memory.png']
    """
    folder = Path(folder)
    paths = [folder / name for name in PNG_NAMES]
    check_png_folder(folder, force=force)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise HetpartError(f"cannot make the folder {folder} for the PNG charts: {err.strerror or err}") from err
    images = (_gantt(plan, timeline(plan)), _memory(plan))
    return [write_atomic(path, data) for path, data in zip(paths, images)]


def check_png_folder(folder: str | os.PathLike[str], *, force: bool = False) -> Path:
    """Raise unless the charts can be written into ``folder`` (checked before any work).

    The folder may be missing (it is made, with its parents, when the charts are written); it
    must not be a file, nor lie under one, and existing charts in it need ``force``.

    Raises:
        HetpartError: the folder is a file or lies under one, or a chart exists without ``force``
            or is not a regular file.

    Example:
        >>> check_png_folder("report-png")                    # doctest: +SKIP
        PosixPath('report-png')
    """
    folder = Path(folder)
    if not str(folder).strip():
        raise HetpartError("-o is empty: give a folder for the PNG charts, e.g. -o report-png")
    existing = folder
    while not existing.exists() and not existing.is_symlink() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise HetpartError(f"cannot write the PNG charts into {folder}: {existing} is not a folder")
    if folder.is_dir():
        refuse_overwrite([folder / name for name in PNG_NAMES], force=force)
    return folder


def _text(value: str) -> str:
    """A name as matplotlib draws it literally: ``$`` would start mathtext (and a lone one fails),
    control characters would draw as boxes or break lines."""
    return one_line(value).replace("$", r"\$")


def _figure(width: float, height: float) -> Any:
    """A figure on its own Agg canvas (no pyplot, no global backend change)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def _gantt(plan: Plan, tl: Timeline) -> bytes:
    from matplotlib.patches import Patch

    colours = device_colours(plan)
    total = plan.predicted.get("total_s") or 0.0
    end = max(tl.end_s, total) or 1e-9
    _, scale, unit = time_ticks(end)
    fig = _figure(11, 1.2 + 0.45 * len(tl.rows))
    ax = fig.add_subplot()
    for i, row in enumerate(tl.rows):
        y = len(tl.rows) - 1 - i
        for kind, lower, height in (("activation", 0.5, 0.4), ("weights", 0.1, 0.4), (None, 0.1, 0.8)):
            bars = [b for b in tl.row_bars(row)
                    if (b.kind == kind if kind else b.kind not in ("activation", "weights"))]
            if bars:
                ax.broken_barh([(b.start_s / scale, b.seconds / scale) for b in bars], (y - 0.5 + lower, height),
                               facecolors=[colours.get(b.device, "#999") for b in bars],
                               edgecolor="#333", linewidth=0.3)
    if total:
        ax.axvline(total / scale, color="black", linestyle="--", linewidth=0.8)
    ax.set_yticks(range(len(tl.rows)), [_text(r) for r in reversed(tl.rows)])
    ax.set_ylim(-0.6, len(tl.rows) - 0.4)
    ax.set_xlim(0, end / scale * 1.01)
    ax.set_xlabel(f"time ({unit})")
    ax.set_title(_text(f"{plan.model_name} on {plan.devices.name}: {plan.objective}, predicted "
                       f"{format_seconds(total) if total else 'unknown'}"), fontsize=10)
    ax.legend(handles=[Patch(facecolor=c, edgecolor="#333", label=_text(d)) for d, c in colours.items()],
              loc="upper right", fontsize=8)
    ax.grid(axis="x", color="#ddd", linewidth=0.5)
    return _png(fig)


def _memory(plan: Plan) -> bytes:
    colours = device_colours(plan)
    names = plan.devices.names()
    fig = _figure(8, 1.0 + 0.5 * len(names))
    ax = fig.add_subplot()
    for i, device in enumerate(names):
        entry = plan.memory.get(device, {})
        used = int(entry.get("used", 0))
        capacity = int(entry.get("capacity", plan.devices.device(device).memory))
        share = 100 * used / capacity if capacity else 0.0
        y = len(names) - 1 - i
        ax.barh(y, 100, color="#eee", edgecolor="#999", linewidth=0.5)
        ax.barh(y, min(share, 100), color="#d62728" if share > 100 else colours[device])
        ax.text(101, y, f"{format_bytes(used)} of {format_bytes(capacity)} ({share:.1f}%)",
                va="center", fontsize=8)
    ax.set_yticks(range(len(names)), [_text(n) for n in reversed(names)])
    ax.set_xlim(0, 150)
    ax.set_xticks([0, 25, 50, 75, 100])
    ax.set_xlabel("memory used, % of capacity")
    ax.set_title(_text(f"memory of {plan.model_name} on {plan.devices.name}"), fontsize=10)
    return _png(fig)
