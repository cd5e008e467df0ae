"""``dopool status`` fitted to the screen, compared with golden files.

One store (simulated, so its times are virtual and the same each run; its leases
written with a fixed pid, host and expiry, and the lease clock read as a fixed time) is
printed in a terminal 80 and 200 columns wide and in a pipe, and each output compared
with its file in ``tests/cli/golden/``. After a change to the output that reads well,
write the files again and review their diff:

    DOPOOL_REGENERATE_GOLDEN=1 python -m pytest tests/cli/test_status_screen.py
"""

from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import Result

from cli_support import invoke
from dopool import EventContext, RetryPolicy, Runtime, SimulatedClock
from dopool._cli import status as status_command
from dopool._store.environment import Store
from dopool._store.layout import LeaseRecord, put_lease

GOLDEN = Path(__file__).parent / "golden"
REGENERATE = os.environ.get("DOPOOL_REGENERATE_GOLDEN") == "1"
NOW = 1_000_000.0  # the lease clock, as the status command reads it
SGR = re.compile(r"\x1b\[[0-9;]*m")  # a terminal's colours and bold
BOX = set("─━│┃┌┐└┘├┤┬┴┼╭╮╯╰═║")


def _fails_in_one_of_four(ctx: EventContext) -> None:
    if ctx.event["n"] % 4 == 0:
        raise ValueError(f"bad event {ctx.event['n']}")


def _fails_once(ctx: EventContext) -> None:
    if ctx.attempt == 1:
        raise TimeoutError("the bank did not answer")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Pools with dead letters, one paused with pending events, scheduled events, an event
    waiting for its retry, an instance per key, and a pool two workers lease."""
    path = tmp_path_factory.mktemp("status") / "store"
    clock = SimulatedClock()
    with Runtime(path, clock=clock, seed=0) as runtime:
        emails = runtime.define(
            "emails",
            execute=_fails_in_one_of_four,
            concurrency=3,
            retry=RetryPolicy(max_attempts=2),
        )
        for n in range(9):
            emails.enqueue({"n": n}, partition_key=f"user-{n}")
        assert emails.join()
        reports = runtime.define("reports", execute=lambda ctx: None, concurrency=2)
        reports.enqueue("first", partition_key="a")
        assert reports.join()
        reports.pause()
        reports.enqueue_many(["q1", "q2", "q3"])
        digests = runtime.define("digests", execute=lambda ctx: None, concurrency=2)
        digests.enqueue_many(["a", "b", "c"], delay=60)
        digests.enqueue("now", partition_key="k")
        billing = runtime.define(
            "billing", execute=_fails_once, retry=RetryPolicy(initial_delay=300, jitter=0)
        )
        billing.enqueue("invoice-7")
        clock.advance(1)  # its first attempt fails: a retry in 300 s
        rooms = runtime.define("rooms", execute=lambda ctx: None, concurrency="per-key")
        for room in ("lobby", "kitchen"):
            rooms.enqueue("hello", partition_key=room)
        assert rooms.join()
        sync = runtime.define("sync", execute=lambda ctx: None, concurrency=2)
        sync.enqueue_many(range(4))
        assert sync.join()
    opened = Store(path)
    try:
        with opened.write() as txn:
            put_lease(txn, "sync", 0, LeaseRecord("w1", 4242, "worker-1.example", 1, NOW + 30))
            put_lease(txn, "sync", 1, LeaseRecord("w2", 4343, "worker-2.example", 1, NOW - 12))
    finally:
        opened.close()
    return path


@pytest.fixture
def screen(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No width, terminal or colour from the environment the tests run in; the lease clock
    at NOW."""
    for name in ("COLUMNS", "TTY_COMPATIBLE", "FORCE_COLOR", "NO_COLOR", "TERM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(status_command, "estimate_lease_time", lambda path: NOW)
    return monkeypatch


def status(monkeypatch: pytest.MonkeyPatch, store: Path, *, columns: int | None, tty: bool) -> str:
    if columns is not None:
        monkeypatch.setenv("COLUMNS", str(columns))
    if tty:  # rich's own switch: the output is taken for a terminal
        monkeypatch.setenv("TTY_COMPATIBLE", "1")
    result: Result = invoke("status", str(store))
    assert result.exit_code == 0, result.output
    return result.stdout


def as_seen(output: str) -> str:
    """A terminal's output as it reads: its colours dropped, and each line's trailing spaces."""
    return "".join(line.rstrip() + "\n" for line in SGR.sub("", output).splitlines())


def assert_golden(name: str, output: str) -> None:
    path = GOLDEN / name
    if REGENERATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(output, encoding="utf-8")
    expected = path.read_text(encoding="utf-8") if path.exists() else ""
    if output != expected:
        diff = difflib.unified_diff(
            expected.splitlines(keepends=True),
            output.splitlines(keepends=True),
            f"golden/{name}",
            "dopool status printed",
        )
        pytest.fail(
            f"dopool status's output differs from golden/{name} (if the change reads "
            "well: DOPOOL_REGENERATE_GOLDEN=1 python -m pytest "
            f"tests/cli/test_status_screen.py):\n{''.join(diff)}",
            pytrace=False,
        )


@pytest.mark.parametrize("columns", [80, 200])
def test_status_in_a_terminal(screen: pytest.MonkeyPatch, store: Path, columns: int) -> None:
    output = status(screen, store, columns=columns, tty=True)
    assert SGR.search(output)  # a terminal gets colour
    seen = as_seen(output)
    assert "…" not in seen  # no header, no cell cut
    assert max(len(line) for line in seen.splitlines()) <= columns
    assert_golden(f"status-terminal-{columns}.txt", seen)


@pytest.mark.parametrize("columns", [None, 80])
def test_status_in_a_pipe(screen: pytest.MonkeyPatch, store: Path, columns: int | None) -> None:
    output = status(screen, store, columns=columns, tty=False)
    assert "\x1b" not in output
    assert not BOX & set(output)
    assert "…" not in output
    assert output == "".join(line.rstrip() + "\n" for line in output.splitlines())
    if columns is not None:
        assert max(len(line) for line in output.splitlines()) <= columns
    else:
        assert "not shown" not in output  # every column, however wide
    assert_golden("status-pipe.txt" if columns is None else f"status-pipe-{columns}.txt", output)


@pytest.mark.parametrize("tty", [True, False], ids=["terminal", "pipe"])
@pytest.mark.parametrize("columns", range(60, 221, 8))
def test_status_fits_any_width_and_never_cuts_a_header(
    screen: pytest.MonkeyPatch, store: Path, columns: int, tty: bool
) -> None:
    seen = as_seen(status(screen, store, columns=columns, tty=tty))
    assert "…" not in seen
    assert max(len(line) for line in seen.splitlines()) <= columns
    headers = [line.split() for line in seen.splitlines() if line.lstrip().startswith("instance")]
    shown = {word for words in headers for word in words}
    for name in status_command.COLUMNS:  # each header whole, or named as not shown
        assert set(name.split()) <= shown or name in {"key", "lease"} or "not shown" in seen


def test_the_columns_left_out_are_the_last_in_priority(
    screen: pytest.MonkeyPatch, store: Path
) -> None:
    seen = as_seen(status(screen, store, columns=80, tty=True))
    block = seen.split("pool emails ")[1].split("\npool ")[0]
    assert "not shown in 80 columns: enqueued, succeeded, drained" in block
    header = next(line for line in block.splitlines() if line.startswith("instance")).split()
    shown = ["instance", "state", "pending", "scheduled", "dead", "restarts", "current", "next"]
    assert header == [*shown, "alarm"]  # the order they print in, not their priority's


def test_the_help_names_the_priority() -> None:
    text = " ".join(invoke("status", "--help").stdout.split())
    assert ", ".join(status_command.PRIORITY) + "." in text


def test_a_real_pipe_prints_what_the_tests_call_one(
    screen: pytest.MonkeyPatch, store: Path
) -> None:
    """The console script's stdout a pipe, as in ``dopool status STORE | cat``."""
    done = subprocess.run(
        [sys.executable, "-m", "dopool", "status", str(store), "--pool", "emails"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert done.stdout == invoke("status", str(store), "--pool", "emails").stdout
    assert done.stdout.splitlines()[1].split()[:3] == ["instance", "state", "pending"]


def test_the_sample_in_the_docs_is_what_a_pipe_prints() -> None:
    page = (Path(__file__).parents[2] / "docs" / "simulate.md").read_text(encoding="utf-8")
    section = page.split("\n## Inspecting real stores\n")[1].split("\n## ")[0]
    sample = section.split("```text\n")[1].split("```")[0]
    assert sample.startswith("pool reports ·")
    assert sample in (GOLDEN / "status-pipe.txt").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("width", "lines"),
    [
        (None, ["pool x · 1 instances · 2 enqueued"]),
        (33, ["pool x · 1 instances · 2 enqueued"]),
        (32, ["pool x · 1 instances ·", "  2 enqueued"]),
        (8, ["pool x ·", "  1 instances ·", "  2 enqueued"]),
    ],
)
def test_a_title_breaks_between_its_parts(width: int | None, lines: list[str]) -> None:
    assert status_command._wrapped(["pool x", "1 instances", "2 enqueued"], " · ", width) == lines
