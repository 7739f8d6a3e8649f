"""Model factories the pipeline ranks rebuild (``path/to/pipeline_models.py:factory``): each returns
``(module, example_inputs)`` with the same weights in every process (a fixed seed).

* :func:`skip_tied`: three layers, the first's output also read by the last op (a value a middle
  stage must relay) and the first layer's weight reused by the last (held by the first and last
  stages only, when the plan cuts it in three);
* :func:`chain`: three layers in a row, classes as its last dimension (cross-entropy applies).

The batch (12) splits into 2, 3, 4 or 6 micro-batches.
"""

from __future__ import annotations

import torch
from torch import nn

BATCH = 12
WIDTH = 8


class SkipTied(nn.Module):
    """``out(tanh(mid(2 h)) + h)`` with ``h = relu(inp(x))`` and ``out.weight`` tied to ``inp.weight``:
    cut in three (``inp``, ``relu``, ``mul`` | ``mid``, ``tanh`` | ``add``, ``out``), ``h`` is read on
    the first and last stages only."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(WIDTH, WIDTH)
        self.mid = nn.Linear(WIDTH, WIDTH)
        self.out = nn.Linear(WIDTH, WIDTH)
        self.out.weight = self.inp.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        g = torch.tanh(self.mid(h * 2.0))
        return self.out(g + h)


class Chain(nn.Module):
    """Three linear layers with GELUs between them."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(WIDTH, 16)
        self.b = nn.Linear(16, 16)
        self.c = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.nn.functional.gelu(self.b(torch.nn.functional.gelu(self.a(x)))))


def skip_tied() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """:class:`SkipTied` and a batch of 12."""
    torch.manual_seed(0)
    return SkipTied(), (torch.randn(BATCH, WIDTH),)


def chain() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """:class:`Chain` and a batch of 12."""
    torch.manual_seed(1)
    return Chain(), (torch.randn(BATCH, WIDTH),)


def weighted_l1(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A loss of the user's own (``--loss pipeline_models.py:weighted_l1``): not the default mse."""
    return ((output.float() - target).abs() * torch.linspace(0.5, 2.0, output.shape[-1])).mean()
