"""What the command-line tests share: running `dopool` in-process, its one-line errors,
and a store held open by a runtime in another process."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from click.testing import CliRunner, Result

from dopool._cli import cli


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def assert_one_line_error(result: Result, code: int, *words: str) -> None:
    assert result.exit_code == code, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ")
    for word in words:
        assert word in lines[0], lines[0]


@contextmanager
def held_by_child(script: str, store: Path) -> Iterator[subprocess.Popen[str]]:
    """Run ``script`` (a ``python -c`` program given the store's path) in a child process
    until it prints ``holding``; the child, which lets go when told (a line on stdin)."""
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(store)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "holding"
        yield child
    finally:
        assert child.stdin is not None
        child.stdin.write("\n")
        child.stdin.close()
        child.wait(timeout=30)
        assert child.stdout is not None
        child.stdout.close()
