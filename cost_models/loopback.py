"""The link between two local ranks: a gloo ping-pong between two processes on this machine.

In: nothing but the message sizes and repeats (two processes are started with
``torch.multiprocessing``'s ``spawn``; they rendezvous through a ``FileStore`` in a temporary
folder, so no port is taken). Out: :class:`LoopbackLink` — seconds per message and bytes/s of a
``torch.distributed`` send/recv over gloo on loopback, what the ranks of a local pipeline run
(``backends/pipeline/launch.py`` ``run_local``) pay to hand activations and gradients to each other.

How: rank 0 sends a tensor, rank 1 receives it and sends it back (``isend`` / ``irecv`` and their
``wait``, as ``torch.distributed.pipelining`` moves a stage's tensors); half the round trip is one
message. The latency is the median over ``repeats`` round trips of a 1-element fp32 tensor; the
bandwidth is ``large`` bytes over the median one-way time of the large tensor less that latency.
Medians, not minima: the pipeline runs under the same load as the benchmark, so the typical
message is the one to predict. The whole measurement takes about two seconds, most of it the two
processes importing torch. :func:`measure_loopback` remembers its result for the life of the
process (a bench run measures once).

Errors are :class:`~partitioner.errors.HetpartError`: a peer that fails or does not finish in
``timeout_s``.
"""

from __future__ import annotations

import dataclasses
import functools
import multiprocessing
import os
import queue
import statistics
import tempfile
import time
from typing import Any

from partitioner.errors import HetpartError

__all__ = ["LoopbackLink", "LOOPBACK_DEFAULTS", "measure_loopback"]

#: Used when the link is not measured: round figures of gloo's TCP transport on Linux loopback
#: between two processes of one machine (~30 us per small message, ~2 GB/s for MiB-sized tensors;
#: the 2-core machine this was written on measured 20-60 us and 1-3 GB/s under load).
LOOPBACK_DEFAULTS: dict[str, float] = {"latency": 30e-6, "bandwidth": 2e9}


@dataclasses.dataclass(frozen=True)
class LoopbackLink:
    """Gloo on loopback: seconds per message, bytes/s, and how they were found."""

    latency: float
    bandwidth: float
    how: str


@functools.lru_cache(maxsize=8)
def measure_loopback(*, large: int = 4 * 2**20, repeats: int = 20, timeout_s: float = 60.0) -> LoopbackLink:
    """Ping-pong between two spawned gloo processes (see the module docstring).

    Raises:
        HetpartError: ``large`` or ``repeats`` is not positive, or a peer failed or timed out.

    Example:
        >>> link = measure_loopback(large=2**20, repeats=5)        # doctest: +SKIP
        >>> link.latency > 0 and link.bandwidth > 0                # doctest: +SKIP
        True
    """
    if large < 2**20 or repeats < 1:
        raise HetpartError(f"measure_loopback: large={large} bytes and repeats={repeats} must be at least "
                           f"1 MiB (smaller messages are all latency: no bandwidth to see) and 1; "
                           f"e.g. large=4 * 2**20, repeats=20")
    ctx = multiprocessing.get_context("spawn")
    results: Any = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="hetpart-loopback-") as folder:
        store = os.path.join(folder, "store")
        procs = [ctx.Process(target=_peer, args=(rank, store, large, repeats, results), daemon=True)
                 for rank in (0, 1)]
        for p in procs:
            p.start()
        try:
            rank, out = results.get(timeout=timeout_s)
        except queue.Empty:
            raise HetpartError(f"the gloo loopback benchmark did not finish in {timeout_s:g} s; the machine may "
                               f"be overloaded: raise timeout_s, or give the link (network=...) instead") from None
        finally:
            for p in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.terminate()
                    p.join()
    if isinstance(out, str):
        raise HetpartError(f"the gloo loopback benchmark failed on rank {rank}: {out}")
    small_s, large_s = out
    latency = statistics.median(small_s) / 2
    one_way = statistics.median(large_s) / 2
    bandwidth = large / max(one_way - latency, one_way * 1e-3)
    return LoopbackLink(_round3(latency), _round3(bandwidth),
                        f"measured: gloo send/recv ping-pong between 2 local processes, median of {repeats} "
                        f"round trips of 4 B and of {large} B")


def _peer(rank: int, store_path: str, large: int, repeats: int, results: Any) -> None:
    """One side of the ping-pong; rank 0 puts ``(0, (small round trips, large round trips))`` on
    ``results``, or either rank ``(rank, message)`` when it fails."""
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
        try:
            rounds = []
            for numel in (1, large // 4):
                x = torch.zeros(numel)
                times = []
                for i in range(repeats + 1):                 # the first round trip warms up
                    t0 = time.perf_counter()
                    if rank == 0:                    # isend / irecv and wait: as the pipeline's stages do
                        dist.isend(x, 1).wait()
                        dist.irecv(x, 1).wait()
                    else:
                        dist.irecv(x, 0).wait()
                        dist.isend(x, 0).wait()
                    if i:
                        times.append(time.perf_counter() - t0)
                rounds.append(times)
        finally:
            dist.destroy_process_group()
        if rank == 0:
            results.put((0, tuple(rounds)))
    except Exception as exc:  # noqa: BLE001 - any failure is reported to the parent, which raises
        results.put((rank, f"{type(exc).__name__}: {exc}"))


def _round3(x: float) -> float:
    """Three significant digits: a measurement is not more precise than that."""
    return float(f"{x:.3g}")
