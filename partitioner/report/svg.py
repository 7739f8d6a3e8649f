"""Hand-written SVG charts of a plan: Gantt chart, memory bars, placed graph.

In: a :class:`~partitioner.plan.Plan` (and optionally its :class:`~.timeline.Timeline` or
:class:`~.layout.GraphLayout`, when the caller already has them).
Out: self-contained ``<svg>`` strings, no scripts, fonts or links (the zoom script for the graph
is :data:`ZOOM_SCRIPT`, which the HTML page inlines once). Every name from the model file is
escaped with :func:`html.escape`. Elements carry stable classes and data attributes:

* ``<svg class="gantt">``: ``<g class="row" data-row="cuda:0" data-kind="device|link">`` per row,
  holding ``<rect class="bar" data-kind="op|activation|weights|param|optimizer" data-name=...>``;
* ``<svg class="memory">``: ``<rect class="mem-bar" data-device="cpu">`` per device (used
  bytes) over a ``<rect class="mem-cap">`` (capacity);
* ``<svg class="graph zoomable" data-coarsened="true|false">``: ``<g class="node">`` per op or
  group (``data-op`` or ``data-group``, ``data-devices``; groups on several devices also have
  class ``split`` and a striped fill) and ``<path class="edge">`` per edge (``cross`` when it
  joins two devices: red, dashed).

Devices take colours in profile order from :data:`PALETTE` (:func:`device_colours`).

Example:
    >>> gantt_svg(plan).startswith('<svg class="gantt"')     # doctest: +SKIP
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from html import escape
from typing import TYPE_CHECKING

from cost_models.units import format_bytes, format_seconds
from partitioner.report.layout import GraphLayout, graph_layout
from partitioner.report.timeline import Bar, Timeline, timeline

if TYPE_CHECKING:
    from partitioner.plan import Plan, TransferInfo

__all__ = ["PALETTE", "ZOOM_SCRIPT", "device_colours", "gantt_svg", "memory_svg", "graph_svg"]

#: Device colours, in profile order (ColorBrewer Set2: light enough for black labels).
PALETTE = ("#8da0cb", "#66c2a5", "#fc8d62", "#e78ac3", "#a6d854", "#ffd92f", "#e5c494", "#b3b3b3")
_XMLNS = 'xmlns="http://www.w3.org/2000/svg"'
_FONT = 'font-family="system-ui, sans-serif" font-size="11"'
_CROSS = "#d62728"

#: Wheel to zoom, drag to pan, double-click to reset, on every ``svg.zoomable`` (inline it once).
ZOOM_SCRIPT = """
(function () {
  document.querySelectorAll("svg.zoomable").forEach(function (svg) {
    var vb = svg.viewBox.baseVal, home = [vb.x, vb.y, vb.width, vb.height], drag = null;
    function at(e) {
      var p = svg.createSVGPoint(); p.x = e.clientX; p.y = e.clientY;
      return p.matrixTransform(svg.getScreenCTM().inverse());
    }
    svg.addEventListener("wheel", function (e) {
      e.preventDefault();
      var p = at(e), f = e.deltaY < 0 ? 0.8 : 1.25;
      vb.x = p.x - (p.x - vb.x) * f; vb.y = p.y - (p.y - vb.y) * f;
      vb.width *= f; vb.height *= f;
    }, {passive: false});
    svg.addEventListener("mousedown", function (e) {
      drag = {x: e.clientX, y: e.clientY, vx: vb.x, vy: vb.y, k: 1 / svg.getScreenCTM().a};
    });
    window.addEventListener("mousemove", function (e) {
      if (!drag) return;
      vb.x = drag.vx - (e.clientX - drag.x) * drag.k; vb.y = drag.vy - (e.clientY - drag.y) * drag.k;
    });
    window.addEventListener("mouseup", function () { drag = null; });
    svg.addEventListener("dblclick", function () {
      vb.x = home[0]; vb.y = home[1]; vb.width = home[2]; vb.height = home[3];
    });
  });
})();
"""


def device_colours(plan: Plan) -> dict[str, str]:
    """Device -> fill colour, in profile order.

    Example:
        >>> device_colours(plan)                              # doctest: +SKIP
        {'cpu': '#8da0cb', 'cuda:0': '#66c2a5'}
    """
    return {d: PALETTE[i % len(PALETTE)] for i, d in enumerate(plan.devices.names())}


def _a(value: object) -> str:
    """An attribute value or text, escaped (quotes too)."""
    return escape(str(value), quote=True)


def _n(x: float) -> str:
    """A coordinate with two decimals and no trailing zeros."""
    return f"{x:.2f}".rstrip("0").rstrip(".")


# --------------------------------------------------------------------------------------------
# Gantt chart
# --------------------------------------------------------------------------------------------


def time_ticks(end_s: float, count: int = 8) -> tuple[list[float], float, str]:
    """Round tick positions from 0 to ``end_s``, with the unit to label them in.

    Example:
        >>> time_ticks(4.7e-5)[1:]
        (1e-06, 'µs')
    """
    if end_s <= 0:
        return [0.0], 1.0, "s"
    raw = end_s / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    scale, unit = next((s, u) for s, u in ((1.0, "s"), (1e-3, "ms"), (1e-6, "\u00b5s"), (1e-9, "ns"))
                       if end_s >= s or s == 1e-9)
    ticks = [i * step for i in range(int(end_s / step + 1e-9) + 1)]
    return ticks, scale, unit


def _tick_label(t: float, scale: float, unit: str) -> str:
    return "0" if t == 0 else f"{t / scale:.6g} {unit}"


def gantt_svg(plan: Plan, tl: Timeline | None = None, *, width: int = 1100) -> str:
    """The predicted schedule: one row per device and per link with traffic, bars coloured by
    device (copies in their destination's colour: activations in the upper half of a link's row,
    streamed weights in the lower half), a dashed line at the predicted total.

    Example:
        >>> '<g class="row" data-row="cuda:0"' in gantt_svg(plan)   # doctest: +SKIP
        True
    """
    tl = tl if tl is not None else timeline(plan)
    colours = device_colours(plan)
    total = plan.predicted.get("total_s") or 0.0
    end = max(tl.end_s, total) or 1e-9
    left, right, top, row_h = 150, 24, 26, 26
    plot_w = width - left - right
    height = top + row_h * len(tl.rows) + 40

    def x(t: float) -> float:
        return left + plot_w * t / end

    copies = {(t.tensor, t.dst, t.kind): t for t in plan.transfers}
    out = [f'<svg class="gantt" {_XMLNS} width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" {_FONT} role="img">',
           f'<title>Predicted schedule of {_a(plan.model_name)} ({_a(plan.objective)})</title>']
    ticks, scale, unit = time_ticks(end)
    out.append('<g class="axis">')
    for t in ticks:
        out.append(f'<line x1="{_n(x(t))}" x2="{_n(x(t))}" y1="{top - 4}" y2="{height - 40}" '
                   f'stroke="#ddd"/><text x="{_n(x(t))}" y="{top - 8}" text-anchor="middle" '
                   f'fill="#444">{_a(_tick_label(t, scale, unit))}</text>')
    out.append("</g>")
    devices = set(plan.devices.names())
    for i, row in enumerate(tl.rows):
        y = top + i * row_h
        kind = "device" if row in devices else "link"
        out.append(f'<g class="row" data-row="{_a(row)}" data-kind="{kind}">'
                   f'<rect class="row-bg" x="{left}" y="{y}" width="{plot_w}" height="{row_h}" '
                   f'fill="{"#f7f7f7" if i % 2 == 0 else "#fff"}"/>'
                   f'<text x="{left - 8}" y="{y + row_h / 2 + 4}" text-anchor="end" '
                   f'fill="#222">{_a(row)}</text>')
        for bar in tl.row_bars(row):
            out.append(_bar(plan, bar, x, y, row_h, colours, copies))
        out.append("</g>")
    if total:
        out.append(f'<g class="total"><line x1="{_n(x(total))}" x2="{_n(x(total))}" y1="{top}" '
                   f'y2="{height - 40}" stroke="#000" stroke-dasharray="4 3"/>'
                   f'<title>predicted total {_a(format_seconds(total))}</title></g>')
    out.append(_legend(plan, colours, 12, height - 22))
    out.append("</svg>")
    return "\n".join(out)


def _bar(plan: Plan, bar: Bar, x: Callable[[float], float], y: float, row_h: float,
         colours: Mapping[str, str], copies: Mapping[tuple[str, str, str], TransferInfo]) -> str:
    x0, x1 = x(bar.start_s), x(bar.end_s)
    w = max(x1 - x0, 0.6)
    top, h = y + 3, row_h - 6
    style = f'fill="{colours.get(bar.device, "#999")}" stroke="#333" stroke-width="0.4"'
    if bar.kind == "activation":
        h = h / 2
    elif bar.kind == "weights":
        top, h = top + h / 2, h / 2
        style += ' fill-opacity="0.7"'
    elif bar.kind in ("param", "optimizer"):
        style += ' fill-opacity="0.5" stroke-dasharray="2 1"'
    when = f"{format_seconds(bar.seconds)}, from {format_seconds(bar.start_s)} to {format_seconds(bar.end_s)}"
    if bar.kind == "op":
        module = plan.modules.get(bar.name, "") or "(top level)"
        tip = f"{bar.name} \u00b7 module {module} \u00b7 {bar.device} \u00b7 {when}"
    elif bar.kind == "optimizer":
        tip = f"optimizer step on {bar.device} \u00b7 {when}"
    else:
        t = copies.get((bar.name, bar.device, bar.kind))
        size = f", {format_bytes(t.bytes)}" if t is not None else ""
        src = f"{t.src} \u2192 " if t is not None else ""
        tip = f"{bar.name} \u00b7 {bar.kind} copy {src}{bar.device}{size} \u00b7 {when}"
    return (f'<rect class="bar" data-kind="{bar.kind}" data-name="{_a(bar.name)}" '
            f'data-start="{bar.start_s:.6g}" data-end="{bar.end_s:.6g}" x="{_n(x0)}" y="{_n(top)}" '
            f'width="{_n(w)}" height="{_n(h)}" {style}><title>{_a(tip)}</title></rect>')


def _legend(plan: Plan, colours: Mapping[str, str], x: float, y: float) -> str:
    out = ['<g class="legend">']
    for device, colour in colours.items():
        out.append(f'<rect x="{_n(x)}" y="{_n(y)}" width="12" height="12" fill="{colour}" stroke="#333" '
                   f'stroke-width="0.4"/><text x="{_n(x + 16)}" y="{_n(y + 10)}">{_a(device)}</text>')
        x += 28 + 7 * len(device)
    out.append(f'<text x="{_n(x + 10)}" y="{_n(y + 10)}" fill="#444">link rows: activation copies above, '
               f'streamed weights below, in the destination\'s colour; dashed line: predicted total</text>')
    out.append("</g>")
    return "".join(out)


# --------------------------------------------------------------------------------------------
# Memory chart
# --------------------------------------------------------------------------------------------


def memory_svg(plan: Plan, *, width: int = 1100) -> str:
    """One horizontal bar per device of the profile: bytes used over capacity, with the percent.

    Example:
        >>> memory_svg(plan).count('class="mem-bar"') == len(plan.devices.names())   # doctest: +SKIP
        True
    """
    colours = device_colours(plan)
    left, right, row_h = 150, 260, 30
    plot_w = width - left - right
    names = plan.devices.names()
    height = 10 + row_h * len(names)
    out = [f'<svg class="memory" {_XMLNS} width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" {_FONT} role="img">',
           "<title>Memory per device: used of capacity</title>"]
    for i, device in enumerate(names):
        entry = plan.memory.get(device, {})
        used = int(entry.get("used", 0))
        capacity = int(entry.get("capacity", plan.devices.device(device).memory))
        share = used / capacity if capacity else 0.0
        y = 5 + i * row_h
        w = plot_w * min(share, 1.0)
        if used and w < 1:
            w = 1.0
        fill = _CROSS if share > 1 else colours[device]
        label = f"{format_bytes(used)} of {format_bytes(capacity)} ({share:.1%})"
        out.append(f'<g class="mem-row" data-device="{_a(device)}">'
                   f'<text x="{left - 8}" y="{y + row_h / 2 + 3}" text-anchor="end">{_a(device)}</text>'
                   f'<rect class="mem-cap" x="{left}" y="{y + 4}" width="{plot_w}" height="{row_h - 8}" '
                   f'fill="#eee" stroke="#999" stroke-width="0.5"/>'
                   f'<rect class="mem-bar" data-device="{_a(device)}" data-used="{used}" '
                   f'data-capacity="{capacity}" x="{left}" y="{y + 4}" width="{_n(w)}" '
                   f'height="{row_h - 8}" fill="{fill}"><title>{_a(device)}: {_a(label)}</title></rect>'
                   f'<text x="{left + plot_w + 8}" y="{y + row_h / 2 + 3}">{_a(label)}</text></g>')
    out.append("</svg>")
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# Placed graph
# --------------------------------------------------------------------------------------------


def graph_svg(plan: Plan, layout: GraphLayout | None = None, *, width: int = 1100) -> str:
    """The graph, layered left to right by topological depth, boxes coloured by device,
    cross-device edges red and dashed; big graphs drawn as module groups (see
    :mod:`partitioner.report.layout`), groups on several devices striped in their colours.
    Zoomable with :data:`ZOOM_SCRIPT` (wheel, drag, double-click to reset).

    Example:
        >>> 'data-coarsened="false"' in graph_svg(plan)       # doctest: +SKIP
        True
    """
    layout = layout if layout is not None else graph_layout(plan)
    colours = device_colours(plan)
    box_w, box_h = (150, 32) if layout.coarsened else (118, 24)
    dx, dy, pad = box_w + 56, box_h + 14, 16
    view_w = pad * 2 + max(layout.layers, 1) * dx - 56
    view_h = pad * 2 + max(layout.slots, 1) * dy - 14
    # fit the drawing to the width, but never shrink boxes below 75%: a long graph opens on its
    # left part, at a readable size, and is panned from there
    scale = min(1.0, max(width / view_w, 0.75))
    shown_h = max(60.0, min(700.0, view_h * scale))
    pos = {n.key: (pad + n.layer * dx, pad + n.slot * dy) for n in layout.nodes}
    fills, defs = _fills(layout, colours)
    coarse = "true" if layout.coarsened else "false"
    out = [f'<svg class="graph zoomable" {_XMLNS} data-coarsened="{coarse}" width="{width}" '
           f'height="{_n(shown_h)}" viewBox="0 0 {_n(width / scale)} {_n(shown_h / scale)}" '
           f'preserveAspectRatio="xMinYMin meet" data-extent="{view_w} {view_h}" '
           f'{_FONT} role="img">',
           f"<title>Placed graph of {_a(plan.model_name)}: wheel to zoom, drag to pan, "
           f"double-click to reset</title>",
           f"<defs>{defs}</defs>",
           '<g class="edges" fill="none">']
    for e in layout.edges:
        (x0, y0), (x1, y1) = pos[e.src], pos[e.dst]
        sx, sy, tx, ty = x0 + box_w, y0 + box_h / 2, x1, y1 + box_h / 2
        bend = max(28.0, abs(tx - sx) / 2)
        stroke = (f'stroke="{_CROSS}" stroke-width="1.6" stroke-dasharray="5 3"' if e.cross
                  else 'stroke="#777" stroke-width="0.8"')
        what = f"{e.count} edges" if e.count > 1 else "edge"
        tip = f"{e.src or '(top level)'} \u2192 {e.dst or '(top level)'} ({what}{', crosses devices' if e.cross else ''})"
        out.append(f'<path class="edge{" cross" if e.cross else ""}" data-src="{_a(e.src)}" '
                   f'data-dst="{_a(e.dst)}" d="M{_n(sx)},{_n(sy)} C{_n(sx + bend)},{_n(sy)} '
                   f'{_n(tx - bend)},{_n(ty)} {_n(tx)},{_n(ty)}" {stroke}><title>{_a(tip)}</title></path>')
    out.append('</g><g class="nodes">')
    for n in layout.nodes:
        x, y = pos[n.key]
        devices = " ".join(n.devices)
        where = ", ".join(f"{d} {c}" for d, c in n.devices.items())
        if layout.coarsened:
            ident = f'data-group="{_a(n.key)}"'
            cls = "node group split" if n.split else "node group"
            tip = f"{n.label} \u00b7 {len(n.ops)} ops \u00b7 {where}"
        else:
            ident = f'data-op="{_a(n.key)}"'
            cls = "node"
            tip = f"{n.key} \u00b7 module {plan.modules.get(n.key, '') or '(top level)'} \u00b7 {devices}"
        stroke = 'stroke="#000" stroke-width="1.4" stroke-dasharray="3 2"' if n.split else \
            'stroke="#333" stroke-width="0.6"'
        text = n.label if len(n.label) <= 22 else n.label[:10] + "\u2026" + n.label[-10:]
        sub = f'<text x="{_n(x + box_w / 2)}" y="{_n(y + box_h - 4)}" text-anchor="middle" ' \
              f'font-size="9" fill="#333">{len(n.ops)} ops</text>' if layout.coarsened else ""
        ty = y + (box_h / 2 - 1 if layout.coarsened else box_h / 2 + 4)
        out.append(f'<g class="{cls}" {ident} data-devices="{_a(devices)}"><title>{_a(tip)}</title>'
                   f'<rect x="{_n(x)}" y="{_n(y)}" width="{box_w}" height="{box_h}" rx="4" '
                   f'fill="{fills[devices]}" {stroke}/>'
                   f'<text x="{_n(x + box_w / 2)}" y="{_n(ty)}" text-anchor="middle">{_a(text)}</text>{sub}</g>')
    out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


def _fills(layout: GraphLayout, colours: Mapping[str, str]) -> tuple[dict[str, str], str]:
    """Fill per device combination: a colour, or a striped pattern for split groups."""
    fills: dict[str, str] = {}
    defs = []
    for n in layout.nodes:
        key = " ".join(n.devices)
        if key in fills:
            continue
        if not n.split:
            fills[key] = colours.get(key, "#ccc")
            continue
        pid = f"hetpart-stripes-{len(defs)}"
        stripe = 6
        rects = "".join(f'<rect x="{i * stripe}" y="0" width="{stripe}" height="{stripe * len(n.devices)}" '
                        f'fill="{colours[d]}"/>' for i, d in enumerate(n.devices))
        size = stripe * len(n.devices)
        defs.append(f'<pattern id="{pid}" patternUnits="userSpaceOnUse" width="{size}" height="{size}" '
                    f'patternTransform="rotate(45)">{rects}</pattern>')
        fills[key] = f"url(#{pid})"
    return fills, "".join(defs)

