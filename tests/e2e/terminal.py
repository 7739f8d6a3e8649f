"""Child processes that take Ctrl-C as they would from a terminal.

A test suite started in the background by a non-interactive shell (``./run test &``, ``nohup``)
inherits SIGINT ignored, and POSIX keeps an ignored signal ignored across ``exec``: a hetpart
process started from it would rightly not stop on SIGINT, and a test of its Ctrl-C handling would
fail for a reason of the test's own. :func:`sigint_as_from_a_terminal` as ``preexec_fn`` gives the
child SIGINT's default action back, as a shell with job control does for a foreground command.
"""

from __future__ import annotations

import signal

__all__ = ["sigint_as_from_a_terminal"]


def sigint_as_from_a_terminal() -> None:
    """``preexec_fn`` for ``subprocess.Popen``: SIGINT with its default action in the child."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
