"""Launching a pipeline plan: the ``torchrun`` command for each host, or one local run.

In: a pipeline plan (and its file path), the model spec and the rank options. Out:
:func:`torchrun_commands`, one command line per host of the plan's stages (``--nnodes``,
``--nproc-per-node``, ``--node-rank``, and the rendezvous at ``host0``: ``--master-addr`` /
``--master-port``, torchrun's static rendezvous, so a host's processes take the ranks of its
stages); and :func:`run_local`, every rank on this machine under one ``torchrun --standalone``
(a free port, so runs side by side do not collide), returning its exit status and output.

Printed commands are pasted into a shell: :func:`shell_line` quotes every argument and keeps the
line one line (``$'...'`` for an argument with a control character); the master address must be a
host name or an IP address (:func:`check_master_addr`). A local run stopped by SIGINT or SIGTERM
forwards the signal to torchrun, kills what is left of torchrun and its ranks after a grace period
(:func:`stop_group`) and raises :class:`LaunchInterrupted`. A failed run is summed up in one line by
:func:`rank_errors`.

Each rank runs ``python -m backends.pipeline PLAN --model SPEC ...`` (:mod:`backends.pipeline.runtime`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from backends.pipeline.runtime import RunOptions
from partitioner.errors import HetpartError, PipelineRunError
from partitioner.terminal import one_line

__all__ = ["Node", "nodes_of", "rank_arguments", "rank_errors", "torchrun_commands", "run_local", "LocalRun",
           "LaunchInterrupted", "stop_group", "shell_line", "shell_word", "check_master_addr"]

RANK_MODULE = "backends.pipeline"


@dataclasses.dataclass(frozen=True)
class Node:
    """One host of a launch: its node rank, how many ranks it starts, which stages they run."""

    host: str
    node_rank: int
    ranks: tuple[int, ...]
    devices: tuple[str, ...]


def nodes_of(plan: Any) -> tuple[Node, ...]:
    """The hosts of a pipeline plan's stages, in node-rank order.

    Example:
        >>> [(n.host, n.ranks) for n in nodes_of(plan)]          # doctest: +SKIP
        [('host0', (0, 1)), ('host1', (2, 3))]
    """
    nodes: dict[str, list[dict[str, Any]]] = {}
    for st in plan.pipeline["stages"]:
        nodes.setdefault(st["host"], []).append(st)
    return tuple(Node(host, i, tuple(st["rank"] for st in sts), tuple(st["device"] for st in sts))
                 for i, (host, sts) in enumerate(nodes.items()))


def rank_arguments(plan_path: str | Path, model: str, options: RunOptions, *, verbose: bool = False) -> list[str]:
    """The rank program's arguments for ``options`` (what follows ``-m backends.pipeline``)."""
    args = [str(plan_path), "--model", model]
    if options.training:
        args.append("--training")
    if options.schedule:
        args += ["--schedule", options.schedule]
    if options.steps != 1:
        args += ["--steps", str(options.steps)]
    if options.loss != "mse":
        args += ["--loss", options.loss]
    for logical, physical in options.device_map.items():
        args += ["--bind", f"{logical}={physical}"]
    if options.timeout_s != RunOptions.timeout_s:
        args += ["--timeout", f"{options.timeout_s:g}"]
    if options.results:
        args += ["--results", str(options.results)]
    if options.seed:
        args += ["--seed", str(options.seed)]
    if verbose:
        args.append("--verbose")
    return args


def torchrun_commands(plan: Any, rank_args: Sequence[str], *, master_addr: str = "HOST0_ADDRESS",
                      master_port: int = 29500) -> list[tuple[Node, list[str]]]:
    """One ``torchrun`` command per host; run each on its host (``host0``'s address as master).

    Example:
        >>> for node, argv in torchrun_commands(plan, ["plan.json", "--model", "gpt:tiny"]):   # doctest: +SKIP
        ...     print(node.host, shlex.join(argv))
        host0 torchrun --nnodes 2 --nproc-per-node 1 --node-rank 0 --master-addr HOST0_ADDRESS ...
    """
    check_master_addr(master_addr)
    if isinstance(master_port, bool) or not isinstance(master_port, int) or not 1 <= master_port <= 65535:
        raise HetpartError(f"--master-port {master_port!r}: expected a TCP port, 1 to 65535, e.g. --master-port 29500")
    nodes = nodes_of(plan)
    return [(node, ["torchrun", "--nnodes", str(len(nodes)), "--nproc-per-node", str(len(node.ranks)),
                    "--node-rank", str(node.node_rank), "--master-addr", master_addr,
                    "--master-port", str(master_port), "-m", RANK_MODULE, *rank_args])
            for node in nodes]


@dataclasses.dataclass(frozen=True)
class LocalRun:
    """What a local run did: torchrun's exit status and its output (every rank's, interleaved)."""

    returncode: int
    output: str
    command: tuple[str, ...]


#: Seconds a stopped run's torchrun gets to stop its ranks after the forwarded signal, before
#: torchrun and every rank are killed (SIGKILL).
STOP_GRACE_S = 10.0


class LaunchInterrupted(KeyboardInterrupt):
    """A local run stopped by SIGINT or SIGTERM: torchrun and its ranks were stopped first.

    ``signum`` is the signal, ``status`` the exit status a command reports for it (130 for
    SIGINT, 143 for SIGTERM), ``ranks`` how many rank processes were running.
    """

    def __init__(self, signum: int, ranks: int = 0) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum, self.ranks = signum, ranks

    @property
    def status(self) -> int:
        return 128 + self.signum

    def line(self) -> str:
        """``interrupted by SIGTERM: stopped torchrun and its 2 ranks``."""
        ranks = f" and its {self.ranks} rank{'s' if self.ranks != 1 else ''}" if self.ranks else ""
        return f"interrupted by {signal.Signals(self.signum).name}: stopped torchrun{ranks}"


def run_local(plan: Any, rank_args: Sequence[str], *, timeout_s: float = 600.0, echo: bool = False,
              grace_s: float = STOP_GRACE_S, world_size: int | None = None,
              rank_module: str = RANK_MODULE) -> LocalRun:
    """Run every rank on this machine: ``torchrun --standalone --nproc-per-node WORLD``.

    ``WORLD`` is ``world_size``, by default the pipeline plan's; each rank runs
    ``python -m rank_module`` (default the pipeline's rank program) with ``rank_args``.

    torchrun runs in a session of its own and each rank in another (torchrun's doing), so a
    Ctrl-C at the terminal reaches only this process: a SIGINT or SIGTERM while the run is on is
    forwarded to torchrun (which passes it to its ranks); after ``grace_s`` seconds whatever is
    left of torchrun and its ranks is killed, and :class:`LaunchInterrupted` is raised.

    Raises:
        PipelineRunError: the run took longer than ``timeout_s`` (it is stopped first).
        LaunchInterrupted: SIGINT or SIGTERM arrived (torchrun and its ranks stopped first).

    Example:
        >>> run = run_local(plan, rank_arguments("plan.json", "mlp:tiny", RunOptions()))   # doctest: +SKIP
        >>> run.returncode                                                                  # doctest: +SKIP
        0
    """
    world = plan.pipeline["world_size"] if world_size is None else world_size
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
            "--nproc-per-node", str(world), "--monitor-interval", "0.5", "-m", rank_module, *rank_args]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default too; said here to keep its warning quiet
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    lines: list[str] = []
    quiet = threading.Event()  # set once stopping: the ranks' last words are not echoed
    with _signals_raise():
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True)
        reader = threading.Thread(target=_collect, args=(proc, lines, echo, quiet), daemon=True)
        try:
            reader.start()
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            quiet.set()
            with _signals_ignored():
                stop_group(proc, signal.SIGTERM, grace_s)
            raise PipelineRunError(f"the local run of {world} ranks took longer than {timeout_s:g} s and was "
                                   f"stopped; raise --timeout or look for a rank waiting on a dead peer") from None
        except KeyboardInterrupt as exc:
            quiet.set()
            signum = exc.signum if isinstance(exc, LaunchInterrupted) else signal.SIGINT
            with _signals_ignored():  # a second Ctrl-C does not cut the stop short
                ranks = stop_group(proc, signum, grace_s)
            raise LaunchInterrupted(signum, ranks) from None
        finally:
            if reader.is_alive():
                reader.join(timeout=10)
    return LocalRun(proc.returncode, "".join(lines), tuple(argv))


def stop_group(proc: subprocess.Popen, signum: int, grace_s: float = STOP_GRACE_S) -> int:
    """Stop a torchrun started in its own session and every rank it started (each in a session of
    its own): ``signum`` to torchrun's process group, then, after ``grace_s`` seconds, SIGKILL to
    whatever is left of it and of its ranks. Returns how many ranks were running.

    Example:
        >>> stop_group(proc, signal.SIGTERM, 5.0)          # doctest: +SKIP
        2
    """
    ranks = _children(proc.pid)
    _signal_group(proc.pid, signum)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        ranks += [r for r in _children(proc.pid) if r not in ranks]
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
    for pid, started in ranks:  # torchrun stops its ranks, unless it was killed or a rank held on
        if _start_time(pid) == started:
            _signal_group(pid, signal.SIGKILL)
    return len(ranks)


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGTERM raises :class:`LaunchInterrupted` (SIGINT raises KeyboardInterrupt) while the run is
    on; the previous handlers come back after. Only the main thread may set handlers: elsewhere
    the process's own handlers stay."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupted(signum: int, _frame: Any) -> None:
        raise LaunchInterrupted(signum)

    saved = signal.signal(signal.SIGTERM, interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, saved)


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    """SIGINT and SIGTERM are ignored in this block (main thread only: elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):  # already gone (its group has no process left)
        pass


def _children(pid: int) -> list[tuple[int, str]]:
    """The processes whose parent is ``pid`` (torchrun's ranks), each with its start time (so a pid
    reused later is not killed by mistake); empty where there is no ``/proc``."""
    out = []
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _stat(int(entry.name))
        if fields is not None and int(fields[1]) == pid:
            out.append((int(entry.name), fields[19]))
    return out


def _start_time(pid: int) -> str | None:
    """A live process's start time (``/proc/PID/stat`` field 22), None when it is gone or a zombie."""
    fields = _stat(pid)
    return fields[19] if fields is not None and fields[0] != "Z" else None


def _stat(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` after the command name: state, ppid, pgrp, ... (None when gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def _collect(proc: subprocess.Popen, lines: list[str], echo: bool, quiet: threading.Event) -> None:
    """Keep the run's output, and copy it to our stdout as it comes when ``echo`` (the CLI's view)
    until ``quiet`` is set."""
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if echo and not quiet.is_set():
            sys.stdout.write(line)
            sys.stdout.flush()


def rank_errors(output: str, program: str = "hetpart pipeline rank") -> str:
    """What went wrong in a failed run, from its output: the rank torchrun saw stop first, when it
    stopped without a hetpart error of its own (it failed to start, or was killed), then the ranks'
    one-line errors (lines holding ``program``, the prefix a rank program writes its error with);
    else the output's last lines.

    Example:
        >>> rank_errors("hetpart pipeline rank 0: error: rank 0 (stage 0 on host0/cpu -> cpu): ...")
        'hetpart pipeline rank 0: error: rank 0 (stage 0 on host0/cpu -> cpu): ...'
    """
    errors = list(dict.fromkeys(line.strip() for line in output.splitlines() if program in line))
    first = _root_cause(output)
    if first is not None and not any(e.startswith(f"{program} {first[0]}:") for e in errors):
        rank, status = first
        how = (f"was killed by {_signal_name(-status)}" if status < 0 else f"exited with status {status}")
        errors.insert(0, f"rank {rank} stopped first: it {how} before it reported an error (it failed to start, "
                         f"or was stopped from outside; its output above says why), so the other ranks stopped too")
    if errors:
        return "; ".join(errors)
    tail = [line.strip() for line in output.strip().splitlines()[-5:]]
    return " | ".join(tail) or "no output"


_ROOT = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)


def _root_cause(output: str) -> tuple[int, int] | None:
    """The rank and exit status torchrun's summary names as the first failure (None without one)."""
    found = _ROOT.search(output)
    return (int(found.group(1)), int(found.group(2))) if found else None


def _signal_name(signum: int) -> str:
    try:
        name = signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
    return name + (" (out of memory, perhaps)" if signum == signal.SIGKILL else "")


def shell_line(argv: Sequence[str]) -> str:
    """A command line as a shell would take it, on one line: each argument quoted where needed
    (:func:`shell_word`), so pasting it runs this command and nothing else.

    Example:
        >>> shell_line(["torchrun", "my plan.json", "a\\nb"])
        "torchrun 'my plan.json' $'a\\\\nb'"
    """
    return " ".join(shell_word(arg) for arg in argv)


def shell_word(arg: str) -> str:
    """One argument for a shell: :func:`shlex.quote` (``'...'``), or, when it holds a control
    character (a newline, an escape) that a terminal would act on or a paste would split, ANSI-C
    quoting (``$'...'``: bash, zsh, ksh and POSIX sh since 2024) with every such character escaped.

    Example:
        >>> shell_word("p\\nrm x"), shell_word("ok.json")
        ("$'p\\\\nrm x'", 'ok.json')
    """
    if one_line(arg) == arg:
        return shlex.quote(arg)
    return "$'" + "".join(_C_ESCAPES.get(ch, one_line(ch)) for ch in arg) + "'"  # one_line: \\xHH, \\uHHHH


#: Backslash escapes ``$'...'`` reads, for the characters that have a short one.
_C_ESCAPES = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def check_master_addr(addr: str, flag: str = "--master-addr") -> str:
    """``addr`` when it is a host name (letters, digits, ``-`` and ``_`` in dot-separated labels)
    or an IPv4 / IPv6 address; else a one-line error naming it.

    Raises:
        HetpartError: whitespace, a control character, or any other character a host name and an
            address cannot hold.

    Example:
        >>> check_master_addr("10.0.0.1"), check_master_addr("node0.cluster")
        ('10.0.0.1', 'node0.cluster')
    """
    text = addr[1:-1] if addr.startswith("[") and addr.endswith("]") else addr  # [::1]
    try:
        ipaddress.ip_address(text)
        return addr
    except ValueError:
        pass
    if len(addr) <= 253 and all(_LABEL.fullmatch(label) for label in addr.split(".")):
        return addr
    raise HetpartError(f"{flag} {one_line(repr(addr))}: not a host name or IP address (host names are letters, "
                       f"digits, '-' and '_' in dot-separated labels; no spaces or control characters); give "
                       f"host0's address as the other hosts reach it, e.g. {flag} 10.0.0.1 or {flag} node0")


_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
