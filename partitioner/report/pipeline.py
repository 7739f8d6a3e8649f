"""The report's pipeline section: stages, ranks, hosts, devices, and the schedule over time.

In: a plan with a ``pipeline`` section. Out: :func:`pipeline_html`, an HTML fragment: a table of
the stages (rank, host and node rank, device, ops, time per micro-batch, what it sends, micro-batches
in flight, memory) and :func:`schedule_svg`, the predicted schedule: one row per stage, one bar per
micro-batch's forward (``F``), backward (``B``) and the optimizer step (``O``) from
:func:`~partitioner.solvers.pipeline.timeline`, with the plan's predicted step time as a dashed line.
Every name is escaped. Bars carry ``data-stage``, ``data-micro-batch`` and ``data-kind``.

Example:
    >>> '<svg class="pipeline"' in pipeline_html(plan)       # doctest: +SKIP
    True
"""

from __future__ import annotations

from html import escape
from typing import Any

from cost_models.units import format_bytes, format_seconds
from partitioner.plan.pipeline import cost_from_record
from partitioner.report.svg import device_colours, time_ticks
from partitioner.solvers.pipeline import timeline

__all__ = ["pipeline_html", "schedule_svg"]

_KIND_OPACITY = {"F": "0.55", "B": "1", "O": "0.3"}
_KIND_NAME = {"F": "forward", "B": "backward", "O": "optimizer step"}


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def pipeline_html(plan: Any) -> str:
    """The stage table and the schedule chart (empty for a plan without stages)."""
    section = plan.pipeline
    if not section:
        return ""
    head = ["stage", "rank", "host (node rank)", "local rank", "device", "ops", "per micro-batch",
            "sends", "in flight", "memory"]
    rows = []
    for st in section["stages"]:
        last = st["index"] + 1 == section["world_size"]
        sends = "the outputs" if last else f"{len(st['sends'])} tensors, {format_bytes(st['send_bytes'])}, " \
                                           f"{format_seconds(st['send_s'])}"
        cells = [st["index"], st["rank"], f"{st['host']} ({st['node_rank']})", st["local_rank"], st["device"],
                 st["ops"], format_seconds(st["compute_s"]), sends, st["in_flight"], format_bytes(st["memory"])]
        rows.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    table = ("<table><thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr></thead><tbody>"
             + "".join(rows) + "</tbody></table>")
    caption = (f"{section['world_size']} stages, {section['schedule']}, {section['micro_batches']} micro-batches "
               f"per step: predicted {format_seconds(section['step_s'])} = {section['micro_batches']} x "
               f"bottleneck {format_seconds(section['bottleneck_s'])} + bubble {format_seconds(section['bubble_s'])}"
               f" + optimizer {format_seconds(section['optimizer_s'])}. The chart simulates the schedule's "
               f"action order (bars: micro-batch numbers; light: forward, dark: backward, grey: optimizer).")
    return f'<p class="muted">{_e(caption)}</p>\n{table}\n{schedule_svg(plan)}'


def schedule_svg(plan: Any, *, width: int = 1100) -> str:
    """The predicted schedule of the plan's stages (see the module docstring)."""
    section = plan.pipeline
    actions = timeline(cost_from_record(plan), plan.training)
    colours = device_colours(plan)
    step = section["step_s"]
    end = max([a.end for a in actions] + [step]) or 1e-9
    left, right, top, row_h = 190, 24, 26, 28
    plot_w = width - left - right
    height = top + row_h * section["world_size"] + 20

    def x(t: float) -> float:
        return left + plot_w * t / end

    out = [f'<svg class="pipeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="system-ui, sans-serif" font-size="11" role="img">',
           f"<title>Predicted pipeline schedule of {_e(plan.model_name)}</title>"]
    ticks, scale, unit = time_ticks(end)
    for t in ticks:
        label = "0" if t == 0 else f"{t / scale:.6g} {unit}"
        out.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top - 4}" y2="{height - 20}" stroke="#ddd"/>'
                   f'<text x="{x(t):.1f}" y="{top - 8}" text-anchor="middle" fill="#444">{_e(label)}</text>')
    for st in section["stages"]:
        y = top + st["index"] * row_h
        out.append(f'<g class="stage" data-stage="{st["index"]}" data-device="{_e(st["device"])}">'
                   f'<rect x="{left}" y="{y}" width="{plot_w}" height="{row_h}" '
                   f'fill="{"#f7f7f7" if st["index"] % 2 == 0 else "#fff"}"/>'
                   f'<text x="{left - 8}" y="{y + row_h / 2 + 4}" text-anchor="end" fill="#222">'
                   f'stage {st["index"]} · rank {st["rank"]} · {_e(st["device"])}</text>')
        fill = colours.get(st["device"], "#999")
        for a in (a for a in actions if a.stage == st["index"]):
            x0, w = x(a.start), max(x(a.end) - x(a.start), 0.6)
            label = "" if a.kind == "O" or w < 14 else str(a.micro_batch)
            what = f"{_KIND_NAME[a.kind]}" + ("" if a.kind == "O" else f" of micro-batch {a.micro_batch}")
            out.append(f'<rect class="bar" data-stage="{a.stage}" data-micro-batch="{a.micro_batch}" '
                       f'data-kind="{a.kind}" x="{x0:.1f}" y="{y + 3}" width="{w:.1f}" height="{row_h - 6}" '
                       f'fill="{fill}" fill-opacity="{_KIND_OPACITY[a.kind]}" stroke="#333" stroke-width="0.4">'
                       f'<title>stage {a.stage}: {_e(what)}, {_e(format_seconds(a.start))} to '
                       f'{_e(format_seconds(a.end))}</title></rect>')
            if label:
                out.append(f'<text x="{x0 + w / 2:.1f}" y="{y + row_h / 2 + 4}" text-anchor="middle" '
                           f'fill="#111">{label}</text>')
        out.append("</g>")
    out.append(f'<line class="step" x1="{x(step):.1f}" x2="{x(step):.1f}" y1="{top}" y2="{height - 20}" '
               f'stroke="#000" stroke-dasharray="4 3"><title>predicted step '
               f'{_e(format_seconds(step))}</title></line>')
    out.append("</svg>")
    return "\n".join(out)
