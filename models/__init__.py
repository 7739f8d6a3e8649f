"""hetpart's model zoo: reference models built in code with random weights.

Nothing is downloaded. Each model lives in its own module and comes in three sizes:
``tiny`` (tests; builds and runs in milliseconds), ``small`` (benchmarks; about a second
per forward on a CPU) and ``base`` (realistic sizes; build it on ``device="meta"`` to
plan without allocating memory).

    >>> import models
    >>> module, inputs = models.get("gpt", "tiny")
    >>> logits = module(*inputs)

Every model traces with both ``torch.export.export`` and ``torch.fx.symbolic_trace``;
:attr:`ZooEntry.symbolic_trace_ok` records an exception should one ever be added.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from models import bart, bert, convnet, convnext, dlrm, emb_transformer, gpt, mlp, moe, t5, two_branch
from models._zoo import SIZES, Built, ZooEntry
from partitioner.errors import UnknownModel

__all__ = ["SIZES", "ZooEntry", "entry", "get", "names"]

_REGISTRY: dict[str, ZooEntry] = {
    m.ENTRY.name: m.ENTRY
    for m in (bart, bert, convnet, convnext, dlrm, emb_transformer, gpt, mlp, moe, t5, two_branch)
}


def names() -> list[str]:
    """The registered model names, sorted."""
    return sorted(_REGISTRY)


def entry(name: str) -> ZooEntry:
    """The :class:`ZooEntry` for ``name``; raises :class:`UnknownModel` if there is none."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise UnknownModel(_unknown_name_message(name)) from None


def get(
    name: str,
    size: str = "tiny",
    *,
    device: str | torch.device | None = None,
    seed: int = 0,
) -> Built:
    """Build model ``name`` at ``size``: ``(module, example_inputs)``, module in eval mode.

    Weights and inputs depend only on ``seed``; torch's global RNG state is left as it
    was. With ``device`` (e.g. ``"meta"``) the module and inputs are created on it.
    """
    zoo_entry = entry(name)
    if size not in SIZES:
        raise UnknownModel(
            f"unknown size {size!r} for model {name!r}: sizes are {', '.join(SIZES)}"
        )
    with _seeded(seed, device), _on_device(device):
        module, inputs = zoo_entry.build(size)
    return module.eval(), inputs


def _unknown_name_message(name: object) -> str:
    known = names()
    hint = ""
    if isinstance(name, str):
        close = difflib.get_close_matches(name, known, n=1)
        if close:
            hint = f" (did you mean {close[0]!r}?)"
    return (
        f"unknown model {name!r}{hint}: known models are {', '.join(known)}; "
        "use 'hetpart inspect NAME' or 'path/to/file.py:factory'"
    )


@contextmanager
def _seeded(seed: int, device: str | torch.device | None) -> Iterator[None]:
    """Seed torch inside a forked RNG so the caller's RNG state is restored afterwards."""
    devices: list[int] = []
    device_type = "cuda"
    if device is not None:
        dev = torch.device(device)
        backend = getattr(torch, dev.type, None)
        if dev.type not in ("cpu", "meta") and hasattr(backend, "device_count"):
            devices, device_type = list(range(backend.device_count())), dev.type
    with torch.random.fork_rng(devices=devices, device_type=device_type):
        torch.manual_seed(seed)
        yield


@contextmanager
def _on_device(device: str | torch.device | None) -> Iterator[None]:
    if device is None:
        yield
    else:
        with torch.device(device):
            yield
