"""Plan reports: what a plan predicts, drawn for people.

In: a :class:`~partitioner.plan.Plan` (from :func:`~partitioner.partition` or
``Plan.load``). Out: a self-contained HTML page (:func:`render_html`, :func:`write_report`), PNG
charts (:func:`write_pngs`), and the predicted schedule as data (:func:`timeline`).

Modules, one concept each: ``timeline`` (Gantt bars from the plan alone), ``layout`` (the graph
drawing's nodes: ops, or module groups for big graphs), ``svg`` (hand-written SVG charts),
``html`` (the page), ``png`` (matplotlib charts), ``output`` (atomic writes, overwrite refusal).

Example:
    >>> from partitioner.report import write_report
    >>> write_report(plan, "report.html", force=True)        # doctest: +SKIP
    PosixPath('report.html')
"""

from partitioner.report.html import render_html, write_report
from partitioner.report.png import write_pngs
from partitioner.report.timeline import Bar, Timeline, timeline

__all__ = ["render_html", "write_report", "write_pngs", "timeline", "Timeline", "Bar"]
