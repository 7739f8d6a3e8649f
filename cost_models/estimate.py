"""Estimate: the small frozen cost value that every cost model returns and that adds up."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Time, work and traffic of some piece of computation or communication.

    ``seconds`` is the predicted wall time; ``flops`` and ``bytes`` the work and memory (or link)
    traffic behind it. Estimates add, so the cost of a sequence is ``sum(parts, Estimate())``.

    Example:
        >>> Estimate(1e-3, flops=2e9) + Estimate(5e-4, bytes=1e6)
        Estimate(seconds=0.0015, flops=2000000000.0, bytes=1000000.0)
    """

    seconds: float = 0.0
    flops: float = 0.0
    bytes: float = 0.0

    def __add__(self, other: Estimate) -> Estimate:
        if not isinstance(other, Estimate):
            return NotImplemented
        return Estimate(self.seconds + other.seconds, self.flops + other.flops, self.bytes + other.bytes)

    def __radd__(self, other: object) -> Estimate:
        if other == 0:  # sum() starts from 0
            return self
        return NotImplemented  # type: ignore[return-value]

    def scaled(self, factor: float) -> Estimate:
        """This estimate repeated ``factor`` times (e.g. backward ≈ 2× forward)."""
        return Estimate(self.seconds * factor, self.flops * factor, self.bytes * factor)
