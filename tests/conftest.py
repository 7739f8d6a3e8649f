"""Session set-up shared by every test.

``./run test`` runs the suite on two pytest-xdist workers (``--dist loadfile``: a file's tests stay
in one worker, in order, so a file's closing checks see its own counts). Each worker keeps torch to
one thread, and so do the processes it starts (``OMP_NUM_THREADS``), so two workers on two cores do
not oversubscribe them: torch's threads stall badly when they share cores with another busy process.
"""

from __future__ import annotations

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
