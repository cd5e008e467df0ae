"""``dopool worker``: a process that runs a store's handlers, fed by producers in others,
stopped by SIGTERM or SIGINT within its grace, or at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dopool
from cli_support import assert_one_line_error, invoke
from worker_support import TESTS, WAIT, Evidence, Worker, acknowledged, produce, starts


def _checked(store: Path) -> None:
    result = invoke("check", str(store))
    assert result.exit_code == 0, result.output


def _status(store: Path) -> dopool.PoolStatus:
    with dopool.connect(store) as connection:
        return connection.pool("jobs").status()


def test_a_worker_runs_what_producers_enqueue_and_stops_gracefully_on_sigterm(
    store_path: Path, evidence: Evidence, worker: Callable[..., Worker]
) -> None:
    """Producers in two processes; a handler running when SIGTERM comes finishes, the
    process exits 0, what was pending stays stored, and the next worker runs it."""
    first = worker(store_path, evidence, "--poll-interval", "0.2").ready()
    producers = [produce(store_path, p, 40) for p in range(2)]
    answered = [line for proc in producers for line in acknowledged(proc)]
    with dopool.connect(store_path) as connection:
        jobs = connection.pool("jobs")
        jobs.enqueue({"p": "gate", "k": 0, "gate": True}, partition_key="gate")
        behind = [jobs.enqueue({"p": "gate", "k": k}, partition_key="gate") for k in range(1, 11)]
    evidence.wait_for("the gated handler to start", e="start", p="gate", k=0)
    first.signal(signal.SIGTERM)
    assert "starting nothing more" in first.line("SIGTERM")
    evidence.mark("signalled")
    evidence.release()  # the running handler finishes within the grace
    assert first.wait() == 0
    assert "stopped (SIGTERM)" in first.out[-1]
    lines = evidence.snapshot()
    after = lines[[line.get("what") for line in lines].index("signalled") :]
    assert {"e": "end", "p": "gate", "k": 0} in [
        {k: line.get(k) for k in ("e", "p", "k")} for line in after
    ]
    gate_starts = [line for line in starts(after) if line["p"] == "gate"]
    assert gate_starts == []  # nothing behind the gate started after the signal
    status = _status(store_path)
    assert status.pending >= len(behind)  # still stored
    _checked(store_path)

    second = worker(store_path, evidence, "--poll-interval", "0.2").ready()
    expected = {(line["p"], line["k"]) for line in answered} | {("gate", k) for k in range(11)}
    evidence.wait(
        lambda lines: expected <= {(x["p"], x["k"]) for x in lines if x["e"] == "end"},
        "every acknowledged event to run",
    )
    assert second.stop() == 0
    ran = starts(evidence.snapshot())
    counts: dict[tuple[Any, Any], int] = defaultdict(int)
    for line in ran:
        counts[(line["p"], line["k"])] += 1
    assert set(counts) == expected
    assert set(counts.values()) == {1}  # exactly once: nothing was interrupted
    keys = {(line["p"], line["k"]): line["key"] for line in answered}  # as the producer sent
    by_partition: dict[tuple[Any, Any], list[int]] = defaultdict(list)
    for line in ran:
        key = "gate" if line["p"] == "gate" else keys[(line["p"], line["k"])]
        if key is not None:
            by_partition[(line["p"], key)].append(line["k"])
    assert by_partition
    for ks in by_partition.values():
        assert ks == sorted(ks)
    status = _status(store_path)
    assert (status.pending, status.succeeded) == (0, len(expected))
    _checked(store_path)


@pytest.mark.slow  # 11 s each, in real time: on CI's first Python only
@pytest.mark.parametrize("how", ["grace", "second signal"])
def test_a_handler_that_never_returns_cannot_hold_the_worker(
    store_path: Path, evidence: Evidence, worker: Callable[..., Worker], how: str
) -> None:
    """The grace running out, or a second signal, stops the worker at once (status 3);
    the interrupted attempt counts, and the next worker's recovery settles it."""
    grace = "0.5" if how == "grace" else "600"
    first = worker(store_path, evidence, "--grace", grace).ready()
    with dopool.connect(store_path) as connection:
        connection.pool("jobs").enqueue({"p": "hang", "k": 0, "hang": True})
    evidence.wait_for("the handler to start", e="start", p="hang")
    first.signal(signal.SIGTERM)
    first.line("SIGTERM")
    if how == "second signal":
        first.signal(signal.SIGINT)
    assert first.wait() == 3  # the bounded wait is the test: no hang past the grace
    assert "at once" in first.out[-1]
    assert "jobs:" in first.out[-1]
    status = _status(store_path)
    assert status.pending == 1
    _checked(store_path)

    second = worker(store_path, evidence).ready()
    evidence.wait_for("the retry to succeed", e="end", p="hang", attempt=2)
    assert second.stop() == 0
    attempts = [line["attempt"] for line in starts(evidence.snapshot()) if line["p"] == "hang"]
    assert attempts == [1, 2]  # the interrupted attempt counted
    status = _status(store_path)
    assert (status.pending, status.succeeded) == (0, 1)
    _checked(store_path)


def test_a_second_worker_on_the_store_is_refused_naming_the_holder(
    store_path: Path, evidence: Evidence, worker: Callable[..., Worker]
) -> None:
    first = worker(store_path, evidence, "--exclusive").ready()
    second = worker(store_path, evidence)  # shared, beside an exclusive one: refused
    assert second.wait() == 1
    error = second.stderr.strip().splitlines()
    assert len(error) == 1, error
    assert error[0].startswith("Error: ")
    assert str(first.proc.pid) in error[0]
    assert "another worker or runtime owns it exclusively" in error[0]
    assert first.stop() == 0
    shared = worker(store_path, evidence).ready()
    exclusive = worker(store_path, evidence, "--exclusive")  # beside a shared one: refused
    assert exclusive.wait() == 1
    said = exclusive.stderr
    assert f"pid {shared.proc.pid} on" in said
    assert "(shared)" in said
    assert shared.stop() == 0


@pytest.mark.parametrize(
    ("app", "words"),
    [
        ("no_such_module_here:app", ["names no importable module"]),
        ("_worker_app:not_a_function", ["has no function"]),
        ("_worker_app:missing", ["has no function"]),
        ("no-colon", ["module:function"]),
        ("_worker_app:raises", ["RuntimeError", "the app is broken"]),
        ("_worker_app:defines_nothing", ["defined no pool"]),
    ],
)
def test_a_broken_app_is_one_line_and_stores_nothing(
    store_path: Path, monkeypatch: pytest.MonkeyPatch, app: str, words: list[str]
) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    result = invoke("worker", app, "--store", str(store_path))
    assert_one_line_error(result, 1, f"app {app!r}", *words)
    assert not store_path.exists()


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--grace", "-1"), ("--poll-interval", "0"), ("--lease-ttl", "0"), ("--lease-ttl", "nan")],
)
def test_a_bad_option_is_one_line_naming_its_flag(store_path: Path, flag: str, value: str) -> None:
    result = invoke("worker", "_worker_app:app", "--store", str(store_path), flag, value)
    assert_one_line_error(result, 2, f"{flag}: ")
    assert not store_path.exists()


def test_bad_options_are_one_line(store_path: Path) -> None:
    result = invoke("worker", "_worker_app:app")
    assert_one_line_error(result, 2, "--store")
    assert not store_path.exists()


def test_an_idle_worker_stops_at_once_with_status_0_even_with_no_grace(
    store_path: Path, evidence: Evidence, worker: Callable[..., Worker]
) -> None:
    first = worker(store_path, evidence, "--grace", "0").ready()
    assert first.stop() == 0
    assert (
        first.out[-1]
        == "dopool worker: stopped (SIGTERM); jobs: 0 succeeded, 0 dead-lettered, 0 pending left"
    )


def test_a_worker_whose_stdout_is_gone_still_stops_gracefully(
    store_path: Path, evidence: Evidence
) -> None:
    """Its lines are dropped once nobody reads them (journald restarted): the line a
    SIGTERM prints raised BrokenPipeError, and the worker left with status 1, its
    running handler given the interpreter's exit grace instead of --grace."""
    read, write = os.pipe()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path]),
        "WORKER_LOG_FD": str(evidence.fd),
        "WORKER_GATE_FD": str(evidence.gate_read),
    }
    command = [sys.executable, "-m", "dopool", "worker", "_worker_app:app"]
    with subprocess.Popen(
        [*command, "--store", str(store_path), "--log-level", "warning"],
        stdin=subprocess.DEVNULL,
        stdout=write,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        pass_fds=(evidence.fd, evidence.gate_read),
    ) as proc:
        os.close(write)
        with os.fdopen(read) as stdout:
            assert stdout.readline().startswith("dopool worker: store")
        # Its reader gone: every line from now on meets a broken pipe.
        try:
            with dopool.connect(store_path) as connection:
                connection.pool("jobs").enqueue({"p": "gate", "k": 0, "gate": True})
            evidence.wait_for("the gated handler to start", e="start", p="gate")
            proc.send_signal(signal.SIGTERM)
            evidence.release()
            assert proc.wait(WAIT) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.stderr is not None
        assert "Error" not in proc.stderr.read()
    evidence.wait_for("the handler to finish", e="end", p="gate")
    assert _status(store_path).succeeded == 1


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_app_is_imported_stops_the_worker_before_it_serves(
    tmp_path: Path, store_path: Path, evidence: Evidence, worker: Callable[..., Worker], signum: int
) -> None:
    """The signal was kept for when the app had loaded: an import that hung could not be
    stopped but by SIGKILL (a second signal too was kept), and a slow one went on to open
    the store and take leases before it stopped."""
    app = tmp_path / "hangs.py"
    app.write_text(
        "import os, threading\n"
        "os.write(int(os.environ['WORKER_LOG_FD']), b'{\"e\": \"importing\"}\\n')\n"
        "threading.Event().wait()\n"
        "def app(runtime):\n"
        "    runtime.define('jobs', execute=print)\n"
    )
    hung = worker(store_path, evidence, spec=f"{app}:app")
    evidence.wait_for("the app's import to start", e="importing")
    hung.signal(signum)
    assert hung.wait() == 0
    name = signal.Signals(signum).name
    assert hung.out == [f"dopool worker: stopped ({name}) while loading the app; nothing served"]
    assert not store_path.exists()  # nothing opened, nothing created


def test_sighup_stops_a_worker_gracefully(
    store_path: Path, evidence: Evidence, worker: Callable[..., Worker]
) -> None:
    """A worker's terminal closing (SIGHUP) stops it as SIGTERM does: it killed the
    process at once, a running handler abandoned and its leases left to expire."""
    first = worker(store_path, evidence).ready()
    with dopool.connect(store_path) as connection:
        connection.pool("jobs").enqueue({"p": "gate", "k": 0, "gate": True})
    evidence.wait_for("the gated handler to start", e="start", p="gate")
    first.signal(signal.SIGHUP)
    assert "starting nothing more" in first.line("SIGHUP")
    evidence.release()
    assert first.wait() == 0
    assert "stopped (SIGHUP)" in first.out[-1]
    assert _status(store_path).succeeded == 1
