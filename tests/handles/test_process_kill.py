"""Process kill: SIGKILL a real-clock pool while it enqueues and processes, restart, check.

Each run uses a fresh store. A child process (``_kill_child.py``) opens it, defines a
pool of ``CONCURRENCY`` instances with a retry policy, and enqueues from two producer
threads while the instances process, some events failing once or twice first, some
enqueuing a follow-up, some delayed by 50 ms (so that kills find them scheduled), and some
with a dedup key, submitted twice, and again by the next generation (after the kill),
some cancelled while they wait, and some with a ttl short enough to expire some.
The parent SIGKILLs it at a random moment, 1 to 3 times in a row (a restart is sometimes
killed while it recovers), then starts a last child with the same pool that waits for
``pool.join`` and reports the status.

The child logs, in lines that survive SIGKILL, each id it is about to enqueue, each
acknowledged enqueue and each successful execution. From those and the final status the
test checks the guarantees of docs/guarantees.md: every acknowledged enqueue (and every
follow-up of a success) ran to success, nothing ran that was never enqueued,
re-executions are bounded by the executions a kill could interrupt, per-instance order
held for the events enqueued without a delay, every duplicate answer named the one event
stored with its key (before or after a kill), a cancelled event never ran, an expired
one was dead-lettered as such and never ran, and the counters add up, cancelled and
expired included.

``DOPOOL_KILL_RUNS`` (default 2) sets the runs per durability mode;
``DOPOOL_KILL_SEED`` (default 0) picks the seeds. A failure names its mode and seed; the
kill moments are real time, so a seed reproduces the plan, not the exact interleaving.
"""

from __future__ import annotations

import json
import os
import random
import runpy
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

# Real processes and real time: run on CI's first Python only (.ci/run).
pytestmark = pytest.mark.slow

CHILD_SCRIPT = Path(__file__).parents[1] / "support" / "_kill_child.py"
_CHILD = runpy.run_path(str(CHILD_SCRIPT))  # its constants, without running it
CONCURRENCY: int = _CHILD["CONCURRENCY"]
FOLLOW_UP_EVERY: int = _CHILD["FOLLOW_UP_EVERY"]
delay_of: Callable[[int], float | None] = _CHILD["delay_of"]
DEDUP_EVERY: int = _CHILD["DEDUP_EVERY"]
TTL_EVERY: int = _CHILD["TTL_EVERY"]

RUNS = int(os.environ.get("DOPOOL_KILL_RUNS", "2"))
BASE_SEED = int(os.environ.get("DOPOOL_KILL_SEED", "0"))
MAX_KILLS = 3
MAX_KILL_DELAY = 0.6  # seconds after "ready" (the first acknowledged enqueue)
EARLY_KILLS = 0.3  # the share of restarts killed during recovery instead
MAX_EARLY_DELAY = 0.02  # seconds after "opened" (the store is open, the pool not yet defined)
READY_TIMEOUT = 30.0
EXIT_TIMEOUT = 30.0
DRAIN_TIMEOUT = 90.0  # the child's own join timeout is shorter


# -- the child processes -------------------------------------------------------


def _start(
    store: Path, logs: Path, durability: str, role: str, generation: int, seed: int
) -> subprocess.Popen[bytes]:
    with (logs / f"stderr-{generation:02d}.txt").open("wb") as stderr:
        return subprocess.Popen(
            [
                sys.executable,
                str(CHILD_SCRIPT),
                str(store),
                str(logs),
                durability,
                role,
                str(generation),
                str(seed),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )


def _wait_for_line(proc: subprocess.Popen[bytes], expected: bytes, timeout: float) -> bool:
    """Read the child's stdout until the line ``expected``; False on EOF or timeout."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    buffer = b""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while expected not in buffer.splitlines():
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not selector.select(remaining):
                return False
            chunk = os.read(fd, 4096)
            if not chunk:
                return False
            buffer += chunk
    return True


def _reap(proc: subprocess.Popen[bytes]) -> None:
    """Make sure a child is gone and its pipe closed, whatever the test did."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=EXIT_TIMEOUT)
    if proc.stdout is not None:
        proc.stdout.close()


def _stderr(logs: Path) -> str:
    return "\n".join(
        f"--- {path.name}:\n{path.read_text(errors='replace')}"
        for path in sorted(logs.glob("stderr-*.txt"))
        if path.stat().st_size
    )


# -- what the children logged --------------------------------------------------


@dataclass
class Logs:
    tried: set[int] = field(default_factory=set)
    acked: dict[int, tuple[int, int]] = field(default_factory=dict)  # id -> (index, seq)
    duplicates: list[tuple[int, int, int]] = field(default_factory=list)  # (id, index, seq)
    cancel_tried: set[int] = field(default_factory=set)
    cancelled: dict[int, bool] = field(default_factory=dict)  # id -> cancel's answer
    executed: dict[int, list[tuple[int, int, int, int]]] = field(
        default_factory=lambda: defaultdict(list)
    )  # id -> [(generation, index, sequence, attempt)] in log order
    order: dict[int, list[int]] = field(
        default_factory=lambda: defaultdict(list)
    )  # index -> sequences of successful executions of undelayed events, in log order


def _read_logs(logs: Path) -> Logs:
    result = Logs()
    for path in sorted(logs.glob("gen-*.log")):
        generation = int(path.stem.removeprefix("gen-"))
        text = path.read_text()
        lines = text.split("\n")[:-1]  # a line cut short by the kill has no newline
        for line in lines:
            kind, *fields = line.split()
            numbers = [int(f) for f in fields]
            if kind == "T":
                result.tried.add(numbers[0])
            elif kind == "A":
                event_id, index, sequence = numbers
                assert event_id not in result.acked, f"{event_id} acknowledged twice"
                result.acked[event_id] = (index, sequence)
            elif kind == "D":
                event_id, index, sequence = numbers
                result.duplicates.append((event_id, index, sequence))
            elif kind == "K":
                result.cancel_tried.add(numbers[0])
            elif kind == "C":
                result.cancelled[numbers[0]] = bool(numbers[1])
            elif kind == "X":
                event_id, index, sequence, attempt = numbers
                result.executed[event_id].append((generation, index, sequence, attempt))
                # A delayed one (a cancel a kill cut off included) runs by due time.
                if event_id <= 0 or delay_of(event_id) is None:
                    result.order[index].append(sequence)
            else:
                raise AssertionError(f"{path.name}: unexpected line {line!r}")
    return result


# -- one run ---------------------------------------------------------------------


def _kill_and_drain(root: Path, durability: str, seed: int) -> tuple[int, dict[str, Any], Logs]:
    """Run the kill/restart cycles and the final drain; returns (kills, report, logs)."""
    rng = random.Random(f"{durability}:{seed}")
    store, logs = root / "store", root / "logs"
    logs.mkdir(parents=True)
    kills = rng.randint(1, MAX_KILLS)
    pause = threading.Event()  # never set: wait() is a real-time pause
    for generation in range(kills):
        # Sometimes (never the first time) kill it while it recovers, before it is ready.
        early = generation > 0 and rng.random() < EARLY_KILLS
        marker = b"opened" if early else b"ready"
        delay = rng.uniform(0.0, MAX_EARLY_DELAY if early else MAX_KILL_DELAY)
        proc = _start(store, logs, durability, "run", generation, rng.randrange(2**32))
        try:
            ready = _wait_for_line(proc, marker, READY_TIMEOUT)
            assert ready, f"generation {generation} never printed {marker!r}\n{_stderr(logs)}"
            pause.wait(delay)
            proc.send_signal(signal.SIGKILL)  # a no-op if it already died: checked below
            returncode = proc.wait(timeout=EXIT_TIMEOUT)
        finally:
            _reap(proc)
        assert returncode == -signal.SIGKILL, (
            f"generation {generation} exited {returncode} before its kill\n{_stderr(logs)}"
        )
    proc = _start(store, logs, durability, "drain", kills, rng.randrange(2**32))
    try:
        out, _ = proc.communicate(timeout=DRAIN_TIMEOUT)
    finally:
        _reap(proc)
    assert proc.returncode == 0, f"drain exited {proc.returncode}: {out!r}\n{_stderr(logs)}"
    report: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    assert "Traceback" not in _stderr(logs), _stderr(logs)
    return kills, report, _read_logs(logs)


def _check(kills: int, report: dict[str, Any], logs: Logs) -> None:
    status = report["status"]
    executed = logs.executed
    tried, acked = logs.tried, logs.acked
    assert acked, "no enqueue was acknowledged before the kills: nothing was tested"

    # Expired events were dead-lettered as such, never run; cancelled ones never ran.
    expired = {dead[0] for dead in report["dead_letters"] if dead[4].startswith("expired: ")}
    assert len(expired) == len(report["dead_letters"]), report["dead_letters"]
    assert all(dead[3] == 0 for dead in report["dead_letters"]), report["dead_letters"]
    assert all(event_id % TTL_EVERY == 0 for event_id in expired), sorted(expired)
    assert not expired & set(executed), sorted(expired & set(executed))
    assert logs.cancel_tried, "no cancel was tried: nothing was tested"
    said_cancelled = {event_id for event_id, answer in logs.cancelled.items() if answer}
    assert not said_cancelled & set(executed), sorted(said_cancelled & set(executed))
    # A kill may land between a cancel's commit and its log line: those the log does not
    # answer count as cancelled if they never ran.
    cancelled = {e for e in logs.cancel_tried if e not in executed and e not in expired}
    assert said_cancelled <= cancelled
    assert status["cancelled"] == len(cancelled), (status, sorted(cancelled))
    assert status["expired"] == status["dead_lettered"] == len(expired), status
    print(f"{len(cancelled)} cancelled, {len(expired)} expired")  # shown with -s

    # No loss: every acknowledged enqueue ran to success, where it was acknowledged, or
    # expired, or was cancelled.
    lost = sorted(set(acked) - set(executed) - expired - cancelled)
    assert not lost, f"{len(lost)} acknowledged events never succeeded: {lost[:20]}"
    for event_id, (index, sequence) in acked.items():
        if event_id in expired or event_id in cancelled:
            continue
        places = {(i, s) for _, i, s, _ in executed[event_id]}
        assert places == {(index, sequence)}, (event_id, (index, sequence), places)

    # Nothing runs that was never enqueued; a success's follow-up runs too.
    originals = {event_id for event_id in executed if event_id > 0}
    follow_ups = {-event_id for event_id in executed if event_id < 0}
    assert originals <= tried, sorted(originals - tried)[:20]
    assert follow_ups <= {e for e in originals if e % FOLLOW_UP_EVERY == 0}, sorted(follow_ups)
    missing = sorted(e for e in originals if e % FOLLOW_UP_EVERY == 0 and e not in follow_ups)
    assert not missing, f"follow-ups of {missing[:20]} never ran"

    # One id is one event (one instance and sequence): a follow-up is never stored twice,
    # nor a keyed event however often it was submitted, before and after kills.
    for event_id, runs in executed.items():
        assert len({(i, s) for _, i, s, _ in runs}) == 1, (event_id, runs)

    # Dedup keys: each duplicate answer names the one event stored with its key (acked
    # before, or stored by an enqueue a kill cut short), which ran there.
    assert logs.duplicates, "no duplicate answer was logged: nothing was tested"
    for event_id, index, sequence in logs.duplicates:
        assert event_id % DEDUP_EVERY == 0, event_id
        assert acked.get(event_id, (index, sequence)) == (index, sequence), event_id
        places = {(i, s) for _, i, s, _ in executed[event_id]}
        assert places == {(index, sequence)}, (event_id, (index, sequence), places)
    assert status["duplicates"] >= len(logs.duplicates), status

    # At-least-once, not more: a success runs again only if a kill beat its commit,
    # which is at most one execution per instance per kill.
    repeats = {e: runs for e, runs in executed.items() if len(runs) > 1}
    extra = sum(len(runs) - 1 for runs in repeats.values())
    assert extra <= CONCURRENCY * kills, (kills, repeats)
    for event_id, runs in repeats.items():
        generations = [g for g, *_ in runs]
        assert len(set(generations)) == len(generations), (
            f"{event_id} succeeded twice in one process: {runs}"
        )

    # Order: on each instance, undelayed events' sequences first succeed in increasing order.
    for index, sequences in logs.order.items():
        first: list[int] = []
        seen: set[int] = set()
        for sequence in sequences:
            if sequence not in seen:
                seen.add(sequence)
                first.append(sequence)
        assert first == sorted(first), f"instance {index} ran out of order: {first}"

    # Counters: everything committed succeeded, expired or was cancelled: exactly the
    # events that ran, expired or were cancelled.
    assert report["joined"], report
    assert status["pending"] == 0, status
    assert status["drained"] == 0, status
    ended = status["succeeded"] + status["dead_lettered"] + status["drained"] + status["cancelled"]
    assert status["enqueued"] == ended, status
    stored = len(executed) + len(expired) + len(cancelled)
    assert status["enqueued"] == stored, (status["enqueued"], stored)
    for instance in status["instances"]:
        assert instance["pending"] == 0, instance
        assert instance["restarts"] == 0, instance  # no engine failure restarted an actor
        assert instance["current_sequence"] is None, instance


# -- the test ----------------------------------------------------------------------


@pytest.mark.threaded
@pytest.mark.parametrize("durability", ["sync", "async"])
def test_sigkill_loses_no_acknowledged_enqueue(durability: str, tmp_path: Path) -> None:
    for run in range(RUNS):
        seed = BASE_SEED + run
        try:
            kills, report, logs = _kill_and_drain(tmp_path / f"run-{run}", durability, seed)
            _check(kills, report, logs)
        except AssertionError as exc:
            raise AssertionError(
                f"durability={durability} DOPOOL_KILL_SEED={seed} (run {run}): {exc}"
            ) from exc
