"""What the command-line tests share: running `dopool` in-process, and its one-line errors."""

from __future__ import annotations

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
