"""``dopool chaos`` is a click command like the others, and ``python -m chaos`` runs the same
one (:func:`dopool._chaos.harness.main`); the runs themselves are tested in ``chaos/``."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner, Result

from cli_support import assert_one_line_error
from dopool._chaos import harness
from dopool._cli import cli

FLAGS = (
    *("--seeds", "--start", "--seed", "--trace", "--jobs", "--executor"),
    *("--verbose", "--processes", "--keep"),
)
HINT = "(see 'dopool chaos --help')"


def invoke(*args: str) -> Result:
    """``dopool ARGS``, named as the console script names itself."""
    return CliRunner().invoke(cli, list(args), prog_name="dopool", catch_exceptions=False)


def test_the_help_is_clicks_as_every_command_has_it() -> None:
    result = invoke("chaos", "--help")
    assert result.exit_code == 0
    assert result.stdout.startswith("Usage: dopool chaos [OPTIONS]\n")
    options = result.stdout.split("\nOptions:\n")[1]
    for flag in (*FLAGS, "-h, --help"):
        assert f"  {flag}" in options
    assert "[default: 200]" in options  # --seeds
    assert invoke("chaos", "-h").stdout == result.stdout


def test_the_command_takes_its_flags_as_click_options() -> None:
    """Not an argument list handed on unparsed, as when the harness parsed it."""
    params = cli.commands["chaos"].params
    assert all(isinstance(param, click.Option) for param in params)
    assert {name for param in params for name in param.opts} == set(FLAGS)


def test_python_m_chaos_runs_the_same_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert harness.main(["--help"]) == 0
    help_text = capsys.readouterr().out
    assert help_text.split() == invoke("chaos", "--help").stdout.split()  # wrapped apart
    with pytest.raises(SystemExit) as exc:
        harness.main(["--jobs", "x"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err == f"Error: Invalid value for '--jobs': 'x' is not a valid integer. {HINT}\n"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--processes", "--seed", "1", "--trace", "t"), ("--trace is for the in-process", HINT)),
        (("--seed", "1", "--keep"), ("--keep needs --processes --seed", HINT)),
        (("--trace", "t"), ("--trace needs --seed", HINT)),
        (("--jobs", "0"), ("--seeds and --jobs must be at least 1", HINT)),
        (("--seeds",), ("Option '--seeds' requires an argument",)),
        (("--seed", "1", "extra"), ("Got unexpected extra argument (extra)", HINT)),
    ],
)
def test_flags_that_do_not_go_together_are_one_line(
    args: tuple[str, ...], words: tuple[str, ...]
) -> None:
    assert_one_line_error(invoke("chaos", *args), 2, *words)


def test_a_replay_ignores_the_long_modes_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--seeds 0`` is refused in the long mode only, as it was."""
    replayed: list[int] = []

    def replay(seed: int, trace: object, *, verbose: bool) -> int:
        replayed.append(seed)
        return 0

    monkeypatch.setattr(harness, "_replay", replay)
    assert invoke("chaos", "--seed", "7", "--seeds", "0", "--jobs", "0").exit_code == 0
    assert replayed == [7]
