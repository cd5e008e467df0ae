"""What reaches a terminal: stored text escaped onto one safe line (``_clean``), the consoles,
and the screen a table must fit (``_screen``)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from rich.console import Console

REPORT_WIDTH = 120  # when stdout is not a terminal (a file, a pipe, a test)


# C0 controls, DEL and C1 controls: a terminal acts on them (ESC starts a sequence that can
# clear the screen or retitle the window), so stored text prints them as escapes instead.
# So do the bidirectional overrides and isolates, which reorder the text around them.
_ESCAPES = {
    code: {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}.get(code, f"\\x{code:02x}")
    for code in (*range(0x20), *range(0x7F, 0xA0))
} | {code: f"\\u{code:04x}" for code in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}


def _clean(text: object) -> str:
    """Text from a store (or any outside source) made safe for a terminal, on one line.

    Control characters become escapes like ``\\x1b``. Rich markup is not touched here:
    hand the result to rich inside a :class:`~rich.text.Text`, which is never parsed.
    """
    return str(text).translate(_ESCAPES)


def _console(*, stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else REPORT_WIDTH
    return Console(file=stream, width=width, highlight=False, soft_wrap=False)


@dataclass(frozen=True)
class Screen:
    """Where a command that fits its tables to the screen prints (``dopool status``).

    ``console`` writes to stdout. ``plain``: stdout is not a terminal (a pipe, a file), so
    the command prints plain aligned text, with no colour and no box drawing. ``width``:
    the columns its lines must fit in, or ``None`` in a pipe without ``COLUMNS``, where each
    line is as wide as it needs.
    """

    console: Console
    plain: bool
    width: int | None


def _screen() -> Screen:
    """stdout, and the width to fit: ``COLUMNS`` if it is set to a number, else the
    terminal's width; in a pipe without ``COLUMNS``, none.

    A terminal is what rich takes for one, as for the progress bars of ``dopool
    simulate``: stdout is a TTY, or ``TTY_COMPATIBLE=1`` or ``FORCE_COLOR`` says to treat
    it as one (``TTY_COMPATIBLE=0`` says not to).
    """
    columns = _columns()
    console = Console(file=sys.stdout, width=columns, highlight=False, soft_wrap=False)
    if console.is_terminal:
        return Screen(console, plain=False, width=console.width)
    plain = Console(file=sys.stdout, width=columns, color_system=None, highlight=False)
    return Screen(plain, plain=True, width=columns)


def _columns() -> int | None:
    """The width the ``COLUMNS`` environment variable sets, if it sets one."""
    text = os.environ.get("COLUMNS", "").strip()
    return int(text) if text.isascii() and text.isdigit() and int(text) > 0 else None
