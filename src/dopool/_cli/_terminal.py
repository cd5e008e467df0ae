"""What reaches a terminal: stored text escaped onto one safe line (``_clean``), the consoles."""

from __future__ import annotations

import sys

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
