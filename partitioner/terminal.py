"""Text for a terminal: names from a model, a plan or a profile never drive the terminal.

In: any text. Out: the same text with every control character (C0 but newline and tab, DEL, C1)
and every bidirectional-override character written as a visible escape (``\\x1b``, ``\\u202e``),
so an escape sequence in a model or device name prints as text instead of moving the cursor,
changing colours or retitling the window. :func:`one_line` also escapes newlines and tabs (for a
name inside a line); :func:`printable` keeps them (for whole messages). :class:`PrintableStream`
wraps ``sys.stdout``/``sys.stderr`` for the command line.

Example:
    >>> one_line("gpt\\x1b[2Jtiny")
    'gpt\\\\x1b[2Jtiny'
"""

from __future__ import annotations

import re
from typing import TextIO

__all__ = ["PrintableStream", "one_line", "printable"]

_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_CONTROL = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}]")
_CONTROL_OR_BREAK = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with control and bidi-override characters escaped; newlines and tabs kept.

    Example:
        >>> printable("ok\\n\\x07bell")
        'ok\\n\\\\x07bell'
    """
    return _CONTROL.sub(_escape, text)


def one_line(text: object) -> str:
    """``str(text)`` with every control character escaped, newlines and tabs too: a name on one line.

    Example:
        >>> one_line("a\\nb")
        'a\\\\x0ab'
    """
    return _CONTROL_OR_BREAK.sub(_escape, str(text))


class PrintableStream:
    """A text stream that writes :func:`printable` text to the stream it wraps.

    Example:
        >>> import io
        >>> out = io.StringIO()
        >>> PrintableStream(out).write("\\x1b]0;title\\x07") and out.getvalue()
        '\\\\x1b]0;title\\\\x07'
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        return self.stream.write(printable(text))

    def __getattr__(self, name: str) -> object:  # flush, fileno, isatty, encoding, ...
        return getattr(self.stream, name)
