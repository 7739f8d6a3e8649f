"""Shared vocabulary of the model zoo: the sizes, the entry record and size lookup.

Kept apart from ``models/__init__.py`` so that each model module can declare its own
:class:`ZooEntry` without importing the package it is part of.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import torch

from partitioner.errors import UnknownModel

SIZES: tuple[str, ...] = ("tiny", "small", "base")

Built = tuple[torch.nn.Module, tuple[torch.Tensor, ...]]
"""What a builder returns: the module and the example inputs to call it with."""

C = TypeVar("C")


@dataclass(frozen=True)
class ZooEntry:
    """One model of the zoo.

    ``build(size)`` constructs the module and its example inputs on the current default
    device with the current RNG state; :func:`models.get` adds seeding, device placement
    and ``eval()``. ``no_split_classes`` names module classes a device-map fill must keep
    whole (like HuggingFace's ``_no_split_modules``).
    """

    name: str
    description: str
    build: Callable[[str], Built]
    no_split_classes: tuple[str, ...] = ()
    symbolic_trace_ok: bool = True
    symbolic_trace_note: str = ""


def pick_size(configs: Mapping[str, C], size: str, model: str) -> C:
    """Return ``configs[size]``, or raise :class:`UnknownModel` naming the valid sizes."""
    try:
        return configs[size]
    except (KeyError, TypeError):
        valid = ", ".join(s for s in SIZES if s in configs)
        raise UnknownModel(
            f"unknown size {size!r} for model {model!r}: sizes are {valid}"
        ) from None
