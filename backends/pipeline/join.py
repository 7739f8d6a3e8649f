"""Joining a pipeline run: the rendezvous store, and every rank in it before the process group forms.

In: this rank, the world size, the timeout, one label per rank (``rank 1 (stage 1 on host1/cpu)``)
and torchrun's environment: ``MASTER_ADDR`` / ``MASTER_PORT``, and ``TORCHELASTIC_USE_AGENT_STORE``
when torchrun's agent holds the store (else rank 0 holds it, as ``init_process_group``'s ``env://``
does). Out: the store the process group is made on (:func:`join`), once every rank has written its
key in it.

Why not ``init_process_group("env://")`` alone: when a rank never comes (its host's torchrun was not
started, it failed before joining, the master address is unreachable from its host), each rank that
did come fails inside torch with a traceback (``Timed out after 300 seconds waiting for clients``,
``The client socket has timed out``) that names neither the missing rank nor the cause. Here each
rank writes ``hetpart/join/<attempt>/<rank>`` and waits for all of them; on the timeout the error
is one :class:`~partitioner.errors.PipelineRunError` naming the ranks that never joined, or, for a
rank that cannot reach the store, the address and port it tried, with the likely causes.
"""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Sequence

import torch.distributed as dist

from partitioner.errors import PipelineRunError

__all__ = ["join"]

_CAUSES = ("its host's torchrun command was not run, the rank failed before joining (its host's output says "
           "why), or that host cannot reach {addr}:{port} (check --master-addr: host0's address as every host "
           "reaches it, the port, a firewall)")


def join(rank: int, world: int, timeout_s: float, labels: Sequence[str]) -> dist.Store:
    """The run's store once every rank is in it (see the module docstring).

    Raises:
        PipelineRunError: no ``MASTER_ADDR`` / ``MASTER_PORT``; rank 0 cannot listen on the port;
            this rank cannot reach the store within ``timeout_s``; or a rank did not join within
            ``timeout_s`` (named, with ``labels[rank]``).

    Example (in each process started by torchrun)::

        store = join(rank, world, 300.0, [f"rank {r}" for r in range(world)])
        dist.init_process_group("gloo", store=dist.PrefixStore("default_pg", store), rank=rank, world_size=world)
    """
    where = labels[rank]
    addr, port = _master(where)
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    holder = rank == 0 and not agent
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        store = dist.TCPStore(addr, port, world, is_master=holder, timeout=timeout, wait_for_workers=False,
                              multi_tenant=True)
    except (RuntimeError, OSError) as exc:  # DistNetworkError, DistStoreError are RuntimeErrors
        if holder:
            raise PipelineRunError(f"{where}: cannot hold the run's store at {addr}:{port} ({_first_line(exc)}): "
                                   f"the port is taken or {addr} is not this host's address; give another "
                                   f"--master-port or this host's own address") from None
        held_by = "torchrun on host0" if agent else "rank 0"
        raise PipelineRunError(f"{where}: cannot reach the run's store at {addr}:{port} within {timeout_s:g} s "
                               f"({_first_line(exc)}): {held_by} has not started, or {addr}:{port} is unreachable "
                               f"from this host (check --master-addr: host0's address as this host reaches it, "
                               f"the port, a firewall); raise --timeout if host0 starts late") from None
    prefix = f"hetpart/join/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    keys = [f"{prefix}{r}" for r in range(world)]
    try:
        store.set(keys[rank], socket.gethostname())
        store.wait(keys, timeout)
    except (RuntimeError, OSError) as exc:
        try:
            missing = [r for r in range(world) if not store.check([keys[r]])]
        except (RuntimeError, OSError):  # the store itself went away: rank 0 (or torchrun) stopped
            raise PipelineRunError(f"{where}: lost the run's store at {addr}:{port} while waiting for the other "
                                   f"ranks ({_first_line(exc)}): rank 0 or torchrun stopped") from None
        if not missing:  # all came at the last moment
            return store
        names = ", ".join(labels[r] for r in missing)
        raise PipelineRunError(f"{where}: {names} never joined within {timeout_s:g} s ({world - len(missing)} of "
                               f"{world} ranks joined): " + _CAUSES.format(addr=addr, port=port)
                               + "; raise --timeout if a host starts late") from None
    return store


def _master(where: str) -> tuple[str, int]:
    try:
        addr, port_text = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    except KeyError as missing:
        raise PipelineRunError(f"{where}: {missing.args[0]} is not set: run the ranks with torchrun (print the "
                               f"commands with `hetpart launch PLAN`)") from None
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not 0 < port < 2**16:
        raise PipelineRunError(f"{where}: MASTER_PORT={port_text!r} is not a TCP port (1 to 65535)")
    return addr, port


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
