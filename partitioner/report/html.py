"""The plan report: one self-contained HTML page for people.

In: a :class:`~partitioner.plan.Plan`.
Out: :func:`render_html` returns the page; :func:`write_report` writes it atomically. The page
holds the plan summary (model, profile, objective, predicted time, lower bound), the devices,
the solver's status / bound / gap / time, the baselines with this plan's speed-up over each,
for pipeline plans the stages and their schedule over time (:mod:`partitioner.report.pipeline`),
three inline SVG charts (:mod:`partitioner.report.svg`: Gantt chart of the predicted schedule,
memory per device, placed graph), the groups of a coarsened graph drawing as expandable
``<details>`` lists, and the 50 slowest transfers. Styles are one ``<style>`` block; the only
script is the graph's inline zoom/pan (:data:`~partitioner.report.svg.ZOOM_SCRIPT`). The page
refers to no URL (the SVG namespace aside), so it opens offline. Every name is escaped.

Example:
    >>> write_report(plan, "report.html", force=True)        # doctest: +SKIP
    PosixPath('report.html')
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING

from cost_models.units import format_bytes, format_seconds
from partitioner.report.layout import GraphLayout, graph_layout
from partitioner.report.pipeline import pipeline_html
from partitioner.files import refuse_overwrite, write_atomic
from partitioner.plan.summary import asked_text, costs_text, proof_text
from partitioner.plan.values import SolverInfo
from partitioner.report.svg import ZOOM_SCRIPT, device_colours, gantt_svg, graph_svg, memory_svg
from partitioner.report.timeline import timeline

if TYPE_CHECKING:
    from partitioner.plan import Plan

__all__ = ["render_html", "write_report", "TOP_TRANSFERS"]

#: How many transfers the table lists (the slowest first).
TOP_TRANSFERS = 50

_CSS = """
body { font-family: system-ui, sans-serif; margin: 24px auto; max-width: 1160px; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 4px; }
h2 { font-size: 1.15em; margin-top: 28px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
table { border-collapse: collapse; margin: 8px 0; font-size: 0.92em; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.kv th { width: 170px; }
.bad { color: #b00; }
.good { color: #060; }
.muted { color: #666; font-size: 0.9em; }
.swatch { display: inline-block; width: 12px; height: 12px; border: 1px solid #333;
          vertical-align: middle; margin: 0 4px 0 10px; }
.cross { display: inline-block; width: 28px; border-top: 2px dashed #d62728;
         vertical-align: middle; margin: 0 4px 0 10px; }
svg { display: block; margin: 8px 0; }
svg.graph { border: 1px solid #ddd; cursor: grab; }
details { margin: 4px 0; }
details details { margin-left: 16px; }
summary { cursor: pointer; }
ul.ops { columns: 3; font-size: 0.88em; margin: 4px 0 8px; }
code { font-size: 0.95em; }
"""


def render_html(plan: Plan) -> str:
    """The report page for ``plan``, as one string.

    Example:
        >>> render_html(plan).startswith("<!DOCTYPE html>")   # doctest: +SKIP
        True
    """
    layout = graph_layout(plan)
    title = f"hetpart plan: {plan.model_name} on {plan.devices.name}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title>",
        f"<style>{_CSS}</style>",
        "</head><body>",
        f"<h1>{_e(title)}</h1>",
        f'<p class="muted">{_e(plan.objective)} objective, '
        f'{"training step" if plan.training else "inference"}; plan file {_e(plan.source)}</p>',
        _section("summary", "Summary", _summary(plan)),
        _section("devices", "Devices", _devices(plan)),
        _section("solver", "Solver", _solver(plan)),
        _section("baselines", "Baselines", _baselines(plan)),
        _section("pipeline", "Pipeline stages", pipeline_html(plan)) if plan.pipeline else "",
        _section("timeline", "Predicted schedule",
                 f'<p class="muted">{_e(_timeline_caption(plan))}</p>' + gantt_svg(plan, timeline(plan))),
        _section("memory", "Memory", memory_svg(plan)),
        _section("graph", "Placed graph", _graph(plan, layout)),
        _section("transfers", "Transfers", _transfers(plan)),
        f"<script>{ZOOM_SCRIPT}</script>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def write_report(plan: Plan, path: str | os.PathLike[str], *, force: bool = False) -> Path:
    """Write the report page to ``path`` atomically (the old file or the whole new one).

    Raises:
        HetpartError: ``path`` exists and ``force`` is false, or it cannot be written.

    Example:
        >>> write_report(plan, "report.html")                 # doctest: +SKIP
        PosixPath('report.html')
    """
    path = Path(path)
    refuse_overwrite([path], force=force)
    return write_atomic(path, render_html(plan).encode("utf-8"))


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _s(seconds: float | None) -> str:
    return "unknown" if seconds is None else format_seconds(seconds)


def _section(ident: str, heading: str, body: str) -> str:
    return f'<section id="{ident}"><h2>{_e(heading)}</h2>\n{body}\n</section>'


def _table(head: Sequence[str], rows: Iterable[Sequence[str]], numeric: Sequence[int] = ()) -> str:
    """A table; cells are HTML already (callers escape); columns in ``numeric`` align right."""
    out = ["<table>", "<tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"]
    for row in rows:
        out.append("<tr>" + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(row)) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _kv(rows: Iterable[tuple[str, str]]) -> str:
    """A two-column table of labels and (escaped) values."""
    body = "".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="kv">{body}</table>'


def _summary(plan: Plan) -> str:
    p = plan.predicted
    rows = [
        ("model", f"{_e(plan.model_name)} <span class=\"muted\">({plan.op_count} ops, fingerprint "
                  f"<code>{_e(plan.fingerprint)}</code>)</span>"),
        ("profile", f"{_e(plan.devices.name)}: {_e(', '.join(plan.devices.names()))}"),
        ("objective", _e(plan.objective)),
        ("mode", "training step, optimizer " + _e(plan.optimizer) if plan.training else "inference"),
        ("predicted time", f"<b>{_e(_s(p.get('total_s')))}</b> per step"),
        ("critical path", _e(_s(p.get("critical_path_s")))),
        ("lower bound", _e(_s(p.get("lower_bound_s"))) + ' <span class="muted">(memory-aware: '
                        'no placement can be faster)</span>'),
    ]
    if plan.weights:
        rows.append(("streamed weights", f"{len(plan.weights)} ops ({_e(plan.stream_mode)})"))
    return _kv(rows)


def _devices(plan: Plan) -> str:
    ops = {d: 0 for d in plan.devices.names()}
    for device in plan.placement.values():
        ops[device] += 1
    busy = plan.predicted["per_device_s"]
    colours = device_colours(plan)
    rows = []
    for device in plan.devices.names():
        mem = plan.memory.get(device, {})
        used, cap = mem.get("used", 0), mem.get("capacity", plan.devices.device(device).memory)
        share = f" ({used / cap:.1%})" if cap else ""
        rows.append([f'<span class="swatch" style="background:{colours[device]}"></span>{_e(device)}',
                     _e(plan.devices.device(device).kind.value), str(ops[device]),
                     _e(_s(busy.get(device))),
                     _e(f"{format_bytes(used)} of {format_bytes(cap)}{share}")])
    for label, seconds in plan.predicted.get("per_link_s", {}).items():
        if seconds:
            rows.append([f"link {_e(label)}", "link", "", _e(_s(seconds)), ""])
    return _table(["device", "kind", "ops", "busy", "memory"], rows, numeric=(2, 3, 4))


def _solver(plan: Plan) -> str:
    s = plan.solver
    rows = _solver_rows(s)
    if s.ilp is not None:
        rows.append(("ILP's own result", _e(f"{s.ilp.name}: {proof_text(s.ilp)}, placement {_s(s.ilp.objective)}; "
                                            f"the plan keeps {s.name}'s, which is faster")))
    if s.note:
        rows.append(("note", _e(s.note)))
    rows.append(("cost model", _e(costs_text(plan))))
    if plan.request:
        rows.append(("asked", _e(asked_text(plan))))
    return _kv(rows)


def _solver_rows(s: SolverInfo) -> list[tuple[str, str]]:
    status = _e(s.status)
    if s.status == "optimal":
        status = f'<span class="good">{status}</span>'
    elif s.status in ("infeasible", "time limit"):
        status = f'<span class="bad">{status}</span>'
    gap = "unknown" if s.gap is None else f"{s.gap:.2%}"
    if s.gap is not None and s.requested_gap is not None:
        gap += f" (asked {s.requested_gap:.2%})"
    bound = _e(_s(s.bound))
    if s.bound is not None and s.nodes:
        bound += f' <span class="muted">(over placements keeping the {s.nodes} coarse groups whole)</span>'
    return [("placement from", _e(s.name)), ("status", status), ("objective", _e(_s(s.objective))),
            ("bound", bound), ("gap", gap), ("solve time", _e(format_seconds(s.seconds)))]


def _baselines(plan: Plan) -> str:
    if not plan.baselines:
        return '<p class="muted">No baselines were costed for this plan.</p>'
    total = plan.predicted.get("total_s")
    rows = []
    for name, b in plan.baselines.items():
        if b.total_s is None:
            speedup = "n/a"
        elif total:
            speedup = f"{b.total_s / total:.2f}\u00d7"
        else:
            speedup = "n/a"
        fits = '<span class="good">fits</span>' if b.feasible else '<span class="bad">does not fit</span>'
        rows.append([_e(name), _e(_s(b.total_s)), fits, speedup, _e(b.note)])
    return (_table(["baseline", "predicted time", "fits", "speed-up of this plan", "note"], rows,
                   numeric=(1, 3))
            + '<p class="muted">speed-up = baseline time / this plan\'s time (above 1: this plan is faster).</p>')


def _timeline_caption(plan: Plan) -> str:
    how = {"latency": "ops run one after another in schedule order; copies delay the op that needs them",
           "makespan": "devices run concurrently; an op starts when its device is free and its inputs "
                       "have arrived",
           "throughput": "pipelined steady state: each device's and each link's work back to back"}
    return (f"{how.get(plan.objective, plan.objective)}. Hover a bar for the op, its module and "
            f"its time. Predicted total {_s(plan.predicted.get('total_s'))}.")


def _graph(plan: Plan, layout: GraphLayout) -> str:
    colours = device_colours(plan)
    legend = "".join(f'<span class="swatch" style="background:{c}"></span>{_e(d)}' for d, c in colours.items())
    legend += '<span class="cross"></span>edge between two devices'
    if layout.coarsened:
        how = (f"{plan.op_count} ops drawn as {len(layout.nodes)} groups "
               + (f"by module path (depth {layout.depth})" if layout.depth else "of consecutive ops")
               + "; striped, dashed boxes hold ops on several devices.")
    else:
        how = f"{plan.op_count} ops, left to right by topological depth."
    out = [f'<p class="muted">{_e(how)} Wheel to zoom, drag to pan, double-click to reset.</p>',
           f"<p>{legend}</p>", graph_svg(plan, layout)]
    if layout.coarsened:
        out.append(_group_list(plan, layout))
    return "\n".join(out)


def _group_list(plan: Plan, layout: GraphLayout) -> str:
    """Every group with its ops, each group expandable."""
    items = []
    for n in sorted(layout.nodes, key=lambda n: (n.layer, n.slot)):
        where = ", ".join(f"{d}: {c}" for d, c in n.devices.items())
        ops = "".join(f"<li>{_e(op)} <span class=\"muted\">{_e(plan.placement[op])}</span></li>" for op in n.ops)
        items.append(f'<details class="group" data-group="{_e(n.key)}"><summary>{_e(n.label)} '
                     f'<span class="muted">{len(n.ops)} ops ({_e(where)})</span></summary>'
                     f'<ul class="ops">{ops}</ul></details>')
    return (f'<details class="groups"><summary>The {len(layout.nodes)} groups and their ops</summary>'
            + "\n".join(items) + "</details>")


def _transfers(plan: Plan) -> str:
    if not plan.transfers:
        return '<p class="muted">No transfers: every tensor stays on the device that made it.</p>'
    top = sorted(plan.transfers, key=lambda t: -t.seconds)[:TOP_TRANSFERS]
    rows = [[_e(t.tensor), _e(t.kind), _e(t.src), _e(t.dst), _e(format_bytes(t.bytes)),
             _e(format_seconds(t.seconds))] for t in top]
    shown = f"; the {len(top)} slowest are listed" if len(plan.transfers) > len(top) else ""
    total = sum(t.seconds for t in plan.transfers)
    copies = "1 copy" if len(plan.transfers) == 1 else f"{len(plan.transfers)} copies"
    head = (f'<p class="muted">{copies} per step, '
            f'{_e(format_bytes(sum(t.bytes for t in plan.transfers)))}, {_e(format_seconds(total))} '
            f'in all{shown}.</p>')
    return head + _table(["tensor", "kind", "from", "to", "bytes", "seconds"], rows, numeric=(4, 5))
