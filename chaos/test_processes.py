"""The multi-process mode (``dopool chaos --processes``): a few seeds with real processes,
the plans, a loss planted in the records, and the checker on fabricated records.

The seeds run as ``.ci/run`` runs many: producer processes, a ``dopool worker``
SIGKILLed and restarted; every process is killed by the run on its way out, and
a failure keeps its directory (its path in the report).
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from dopool._chaos import harness as cli
from dopool._chaos.procs import records
from dopool._chaos.procs.checker import Ending, check
from dopool._chaos.procs.plan import Behaviour, Plan, Send, draw
from dopool._chaos.procs.records import Answer, Attempt, Records
from dopool._chaos.procs.seed import run_seed
from dopool._types import InstanceStatus, PoolStatus

# 24: dedup keys held all run, a pause, kills mid-attempt; 35: keys freed as their events
# end, a kill and a restart while paused, two instances; 8: a SIGTERM, four producers.
# All three run two workers, and kill each (takeovers once the leases expire).
SEEDS = (24, 35, 8)


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Runs' directories (a failing one is kept) under the test's own."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


@pytest.mark.threaded
@pytest.mark.parametrize("seed", SEEDS)
def test_a_seed_with_real_processes_keeps_every_invariant(seed: int, runs: Path) -> None:
    result = run_seed(seed)
    if not result.ok:
        pytest.fail(result.report(), pytrace=False)
    assert result.crashes >= 1  # SIGKILLs
    assert result.acknowledged > 0
    assert result.executions >= result.acknowledged
    assert list(runs.iterdir()) == []  # a passing seed leaves nothing behind


def test_a_plan_is_a_function_of_the_seed_and_the_seeds_cover_the_mode() -> None:
    assert draw(7) == draw(7)
    assert draw(7) != draw(8)
    plans = [draw(seed) for seed in range(60)]
    verbs = Counter(a.verb + ("-mid" if a.mid else "") for p in plans for a in p.actions)
    assert {"kill", "kill-mid", "term", "start", "pause", "resume"} <= set(verbs)
    assert {p.producers for p in plans} == {2, 3, 4}
    assert {p.concurrency for p in plans} == {1, 2, 3}
    assert {p.dedup_window for p in plans} == {0.0, 3600.0}
    assert {p.workers for p in plans} == {1, 2}
    assert all(draw(seed).workers == 2 for seed in SEEDS)
    seconds = [a for p in plans for a in p.actions if a.chain == 1]
    assert {a.verb for a in seconds} == {"kill", "start"}
    assert all(p.workers == 2 for p in plans if any(a.chain for a in p.actions))
    sends = [send for p in plans for stream in p.streams for send in stream]
    assert any(send.batch for send in sends)
    assert any(send.delay is not None for send in sends)
    assert any(send.partition_key is None for send in sends)
    modes = {b.mode for p in plans for b in p.behaviours.values()}
    assert modes == {"ok", "perm", "always"}


@pytest.mark.threaded
def test_a_lost_event_is_reported_with_the_replay_line_and_the_run_kept(
    runs: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The records lose every attempt of one event that succeeded: the checker calls it
    lost, the harness exits 1 with the command that replays the seed, and the run's
    directory (its store, its records) stays."""
    real = records.read
    lost: list[str] = []

    def without_one_success(root: Path, producers: int, generations: int) -> Records:
        found = real(root, producers, generations)
        ident = next(a.ident for a in found.attempts if a.outcome == "ok")
        lost.append(ident)
        found.attempts = [a for a in found.attempts if a.ident != ident]
        return found

    monkeypatch.setattr(records, "read", without_one_success)
    seed = SEEDS[0]
    assert cli.main(["--processes", "--seeds", "1", "--start", str(seed)]) == 1
    out = capsys.readouterr().out
    assert f"{lost[0]} at " in out
    assert "never succeeded (lost)" in out
    assert f"dopool chaos --processes --seed {seed}" in out
    (kept,) = runs.iterdir()
    assert f"(kept: {kept})" in out
    assert (kept / "store").is_dir()
    assert (kept / "worker-0.log").is_file()
    shutil.rmtree(kept)


def test_flags_that_do_not_go_together_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--processes", "--seed", "1", "--trace", "t"], ["--seed", "1", "--keep"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(argv)
        assert exc.value.code == 2
    assert "--keep needs --processes --seed" in capsys.readouterr().err


# -- the checker on fabricated records ---------------------------------------------------

PLAN = Plan(
    seed=0,
    concurrency=1,
    durability="async",
    dedup_window=3600.0,
    streams=(
        (
            Send(("0.0",), "p", 0, None, (None,)),
            Send(("0.1", "0.2"), "p", 0, None, ("k", "k")),
        ),
    ),
    behaviours={"0.1": Behaviour(fails=1)},
    actions=(),
)


def _status(enqueued: int = 2, succeeded: int = 2, pending: int = 0) -> PoolStatus:
    instance = InstanceStatus(
        index=0,
        instance_id="mp:0",
        state="idle",
        enqueued=enqueued,
        pending=pending,
        scheduled=0,
        processed=succeeded,
        succeeded=succeeded,
        dead_lettered=0,
        drained=0,
        current_sequence=None,
        attempt=0,
        next_alarm_at=None,
        restarts=0,
        duplicates=1,
    )
    return PoolStatus(
        name="mp",
        concurrency=1,
        enqueued=enqueued,
        pending=pending,
        scheduled=0,
        processed=succeeded,
        succeeded=succeeded,
        dead_lettered=0,
        drained=0,
        instances=[instance],
        duplicates=1,
    )


def _records(*attempts: Attempt, timeline: list[tuple[str, list[str]]] | None = None) -> Records:
    found = Records(tried={"0.0", "0.1", "0.2"})
    found.answers = {
        "0.0": Answer(0, 0, 0, False),
        "0.1": Answer(0, 0, 1, False),
        "0.2": Answer(0, 0, 1, True),  # its key is held by 0.1
    }
    found.attempts = list(attempts)
    found.timelines = {0: timeline or [], 1: []}
    return found


# After the pause returned, 0.0's attempt (started before) ends; 0.1 must not start.
PAUSED_THEN_A_START = [
    ("M", ["pause"]),
    ("S", ["0.0", "0", "0", "1"]),
    ("E", ["0.0", "0", "0", "1", "ok"]),
    ("S", ["0.1", "0", "1", "1"]),
]

CLEAN = (
    Attempt(0, "0.0", 0, 0, 1, "ok"),
    Attempt(0, "0.1", 0, 1, 1, "fail"),
    Attempt(0, "0.1", 0, 1, 2, "ok"),
)


def _ending(killed: set[int] | None = None, **status: int) -> Ending:
    return Ending(_status(**status), [], [], killed or set(), {}, {0: 0})


def test_the_checker_accepts_clean_records() -> None:
    assert check(PLAN, _records(*CLEAN), _ending()) == []


def test_a_success_repeated_is_interrupted_only_in_a_killed_worker() -> None:
    again = (*CLEAN[:1], Attempt(1, "0.0", 0, 0, 2, "ok"), *CLEAN[1:])
    assert check(PLAN, _records(*again), _ending(killed={0})) == []
    violations = check(PLAN, _records(*again), _ending())
    assert any("0.0 ran again (attempt 2) after its ok" in v for v in violations), violations


def test_with_two_workers_a_rerun_is_judged_by_when_the_kill_came() -> None:
    """Two workers' generations do not follow each other: worker 1 reruns 0.0 after
    worker 0, its own generation lower, was killed (the starts and the kill stamped)."""
    again = (
        Attempt(1, "0.0", 0, 0, 1, None, at=10),
        Attempt(0, "0.0", 0, 0, 3, "ok", at=30),  # attempt 2 died unrecorded in worker 1
        Attempt(0, "0.1", 0, 1, 1, "fail", at=40),
        Attempt(0, "0.1", 0, 1, 2, "ok", at=50),
    )
    killed = _ending(killed={1})
    killed.kill_times = {1: 20}
    assert check(PLAN, _records(*again), killed) == []
    late = _ending(killed={1})
    late.kill_times = {1: 35}  # the kill came after the rerun: attempt 2 is unexplained
    violations = check(PLAN, _records(*again), late)
    assert any("0.0: attempt 3 after 1, none killed" in v for v in violations), violations


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        pytest.param(
            lambda r: r.answers.update({"0.2": Answer(0, 0, 0, True)}),
            "0.2 (key k) was answered as a duplicate of 0.0",
            id="duplicate-of-another-key",
        ),
        pytest.param(
            lambda r: r.answers.update({"0.2": Answer(0, 0, 2, False)}),
            "key k stored ['0.1', '0.2']",
            id="a-key-stored-twice",
        ),
        pytest.param(
            lambda r: setattr(r, "attempts", [CLEAN[1], CLEAN[0], CLEAN[2]]),
            "instance 0 started 0.1 again after another event",
            id="two-at-a-time",
        ),
        pytest.param(
            lambda r: setattr(r, "attempts", [CLEAN[1], CLEAN[2], CLEAN[0]]),
            "instance 0 started sequence 0 after 1",
            id="out-of-order",
        ),
        pytest.param(
            lambda r: setattr(r, "attempts", [Attempt(0, "0.3", 0, 2, 1, "ok"), *CLEAN]),
            "0.3 ran at (0, 2), where None was stored",
            id="invented",
        ),
        pytest.param(
            lambda r: r.timelines.update({0: PAUSED_THEN_A_START}),
            "worker 0: 0.1 started while paused",
            id="started-while-paused",
        ),
    ],
)
def test_the_checker_catches_a_planted_violation(
    change: Callable[[Records], object], complaint: str
) -> None:
    found = _records(*CLEAN)
    change(found)
    violations = check(PLAN, found, _ending())
    assert any(complaint in v for v in violations), violations


def test_the_checker_holds_the_counters_to_the_answers() -> None:
    violations = check(PLAN, _records(*CLEAN), _ending(enqueued=3, succeeded=2, pending=1))
    assert "enqueued is 3, expected 2" in violations
    assert "pending is 1, expected 0" in violations
    plan = replace(PLAN, behaviours={"0.1": Behaviour(mode="perm")})
    violations = check(plan, _records(*CLEAN), _ending())
    assert any("should be dead-lettered (perm)" in v for v in violations), violations
