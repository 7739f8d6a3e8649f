"""The ILP's region columns: a column split into a row split, nothing rejoined between.

In: a :class:`~partitioner.solvers.formulation.Formulation` whose split columns ``k`` exist. Out:
one column per priced (region, split) of ``problem.region_offer``
(:mod:`partitioner.solvers.split_regions`) and the terms it adds to the time, link and memory rows.

* ``g[row][split]`` in [0, 1] is the region formed with that split: the AND of the cols' and the
  row's ``k`` columns and the interior nodes' ``x[e, home]``: ``region_of[...]``: ``g <= each``,
  ``region[...]``: ``g >= sum - (count - 1)``. Exact at integer points, so ``g`` is 1 exactly where
  :func:`~partitioner.solvers.split_regions.regions_of` finds the region, as ``evaluate`` prices it;
* its terms: the latency change (``latency``), each shard device's busy change (``throughput``),
  minus the dropped copies on each link (seconds, or bytes in a budget), and each other device's
  interior working set as one more item of its ``work`` staircase.

A (region, split) whose members' ``k`` columns are not all in the model (not offered, too dear,
not fitting), or an interior node that cannot run on the home, gets no column: that region cannot form.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from partitioner.solvers.milp import Column, Term


class RegionColumns:
    """The region columns of one formulation (see the module docstring)."""

    def __init__(self, f: Any) -> None:
        self.f = f
        p, offer = f.p, f.p.region_offer
        self.gv: dict[tuple[int, Any], Column] = {}
        for (i, sp), _ in offer.price.items():
            region = offer.regions[i]
            row = dataclasses.replace(sp, axis="rows")
            ks = [f.kv.get(offer.node_of[c], {}).get(sp) for c in region.cols]
            ks.append(f.kv.get(offer.node_of[region.row], {}).get(row))
            xs = [f.x(n, sp.home) for n in offer.interior_nodes(i)]
            if any(k is None for k in ks) or any(not isinstance(v, Column) and v == 0.0 for v in xs):
                continue
            ands = ks + [v for v in xs if isinstance(v, Column)]
            name = f"[{region.row}][{sp.label}]"
            g = self.gv[(i, sp)] = f.milp.column("g" + name, upper=1.0)
            for j, v in enumerate(ands):
                f.milp.at_most(f"region_of{name}[{j}]", [(1.0, g), (-1.0, v)], 0.0)
            f.ge("region" + name, g, [(1.0, v) for v in ands] + [(-(len(ands) - 1.0), 1.0)])

    def time_terms(self, device: str | None = None) -> list[Term]:
        """Latency (``device`` None): each region's latency change; per device: its busy change."""
        tu, price = self.f.units.time, self.f.p.region_offer.price
        terms: list[Term] = []
        for (i, sp), g in self.gv.items():
            if device is None:
                terms.append((tu * price[(i, sp)].latency_s, g))
            elif device in sp.devices:
                terms.append((tu * price[(i, sp)].busy_s[sp.devices.index(device)], g))
        return terms

    def link_terms(self, label: str, budget: bool) -> list[Term]:
        """Each region's dropped copies taken off link ``label``, its outside tensors' copies put on
        (seconds, or bytes for a budget)."""
        p, tu, mu = self.f.p, self.f.units.time, self.f.units.memory
        terms: list[Term] = []
        for key, g in self.gv.items():
            for _, src, dst, nbytes, _ in p.region_offer.price[key].dropped:
                if label in p.hops(src, dst):
                    terms.append((-mu * nbytes if budget else -tu * p.hop_s(nbytes, src, dst, label), g))
            for _, src, dst, nbytes, _ in p.region_offer.price[key].added:  # outside tensors home -> each device
                if label in p.hops(src, dst):
                    terms.append((mu * nbytes if budget else tu * p.hop_s(nbytes, src, dst, label), g))
        return terms

    def work_items(self, device: str) -> list[tuple[str, float, Column]]:
        """Each region's interior working set on ``device`` (a ``work`` staircase item)."""
        offer, mu = self.f.p.region_offer, self.f.units.memory
        out = []
        for (i, sp), g in self.gv.items():
            if device in sp.devices:
                w = offer.price[(i, sp)].work_bytes[sp.devices.index(device)]
                if w > 0:
                    out.append((f"{offer.regions[i].row}.region", mu * w, g))
        return out
