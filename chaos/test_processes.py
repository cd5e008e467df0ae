"""The multi-process mode (``dopool chaos --processes``): a few seeds with real processes,
the plans, a loss planted in the records, the frozen-writer fault on a process of its
own, and the checker on fabricated records.

The seeds run as ``.ci/run`` runs many: producer processes, a ``dopool worker``
SIGKILLed and restarted, writers frozen; every process is continued and killed by the
run on its way out, and a failure keeps its directory (its path in the report).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from dopool._chaos import harness as cli
from dopool._chaos.procs import records
from dopool._chaos.procs.checker import Ending, check
from dopool._chaos.procs.freeze import LOCKS, LockFile, catch, cont
from dopool._chaos.procs.plan import (
    BIG_AT,
    BIG_CONCURRENCY,
    BIG_EVERY,
    BIG_MAX_ACTIVE,
    BIG_RATE,
    FREEZE_TTLS,
    PER_KEY_ACTIVE,
    PER_KEY_IDLE,
    RATES,
    Behaviour,
    Plan,
    Send,
    draw,
    draw_big,
    rate_limit,
)
from dopool._chaos.procs.records import Answer, Attempt, Freeze, Records, Refusal
from dopool._chaos.procs.seed import run_seed
from dopool._rates import RateLimit
from dopool._store.layout.limits import PER_KEY
from dopool._store.writerlock import WRITER_LOCK
from dopool._types import InstanceStatus, PoolStatus

# 24: dedup keys held all run, a pause, kills mid-attempt; 35: keys freed as their events
# end, a kill and a restart while paused, two instances; 8: a SIGTERM, four producers.
# All three run two workers, and kill each (takeovers once the leases expire).
SEEDS = (24, 35, 8)
# Its second worker frozen for 1.69 s (2.8 lease ttls) while it holds the writer lock,
# early, with both workers up; then a producer, once the producers may be done.
FROZEN = 99
# Of the big family: 2,118 instances, two workers, a third joining, the second killed,
# a producer frozen for 3.68 s (1.8 lease ttls of 2 s).
BIG = 92


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Runs' directories (a failing one is kept) under the test's own."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


@pytest.mark.slow  # real processes: on CI's first Python, beside --processes
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


@pytest.mark.slow  # real processes: on CI's first Python, beside --processes
@pytest.mark.threaded
def test_a_frozen_writer_lands_and_the_seed_keeps_every_invariant(runs: Path) -> None:
    result = run_seed(FROZEN)
    if not result.ok:
        pytest.fail(result.report(), pytrace=False)
    assert result.frozen_workers == 1  # a worker holds the lock at every renewal
    assert any(step.startswith("freeze-1.69s(worker") for step in result.log), result.log
    assert list(runs.iterdir()) == []


@pytest.mark.slow
@pytest.mark.threaded
def test_a_seed_of_the_big_family_keeps_every_invariant(runs: Path) -> None:
    plan = draw(BIG)
    result = run_seed(BIG)
    if not result.ok:
        pytest.fail(result.report(), pytrace=False)
    assert result.big
    assert result.acknowledged == plan.events >= plan.concurrency
    assert result.crashes == 1  # the second worker, for good; the third joined
    assert result.restarts == 2
    assert list(runs.iterdir()) == []


def test_a_plan_is_a_function_of_the_seed_and_the_seeds_cover_the_mode() -> None:
    assert draw(7) == draw(7)
    assert draw(7) != draw(8)
    plans = [p for p in (draw(seed) for seed in range(60)) if not p.big]
    verbs = Counter(a.verb + ("-mid" if a.mid else "") for p in plans for a in p.actions)
    assert {"kill", "kill-mid", "term", "start", "pause", "resume", "freeze"} <= set(verbs)
    assert {p.producers for p in plans} == {2, 3, 4}
    assert {p.concurrency for p in plans} == {1, 2, 3}
    assert {p.dedup_window for p in plans} == {0.0, 3600.0}
    assert {p.workers for p in plans} == {1, 2}
    assert all(draw(seed).workers == 2 for seed in SEEDS)
    seconds = [a for p in plans for a in p.actions if a.chain == 1]
    assert {a.verb for a in seconds} == {"kill", "start", "freeze"}
    assert all(p.workers == 2 for p in plans if any(a.chain for a in p.actions))
    sends = [send for p in plans for stream in p.streams for send in stream]
    assert any(send.batch for send in sends)
    assert any(send.delay is not None for send in sends)
    assert any(send.partition_key is None for send in sends)
    modes = {b.mode for p in plans for b in p.behaviours.values()}
    assert modes == {"ok", "perm", "always"}


def test_half_the_seeds_freeze_a_producer_or_a_worker_some_past_the_lease_ttl() -> None:
    plans = [draw(seed) for seed in range(200)]
    freezes = [(p, a) for p in plans for a in p.actions if a.verb == "freeze"]
    assert 80 <= len({p.seed for p, _ in freezes}) <= 120
    assert any(a.producer is None for _, a in freezes)
    assert any(a.producer is not None for _, a in freezes)
    for plan, action in freezes:
        assert 0.3 * plan.lease_ttl - 0.01 <= action.seconds <= FREEZE_TTLS * plan.lease_ttl
        if action.producer is None:
            assert action.chain < plan.workers
        else:
            assert action.producer < plan.producers
    longer = sum(1 for p, a in freezes if a.seconds > p.lease_ttl)
    assert len(freezes) / 2 < longer < len(freezes)
    # Some seeds' producers give up waiting for the lock while a freeze holds it.
    timeouts = [p for p in plans if p.lock_timeout is not None]
    assert 10 <= len(timeouts) <= 50
    for plan in timeouts:
        longest = max(a.seconds for a in plan.actions if a.verb == "freeze")
        assert 0.5 * longest - 0.01 <= plan.lock_timeout <= 0.9 * longest + 0.01
    assert draw(FROZEN).workers == 2
    assert any(a.verb == "freeze" and a.producer is None for a in draw(FROZEN).actions)


def test_a_fixed_share_of_the_seeds_is_of_the_big_family() -> None:
    plans = [draw(seed) for seed in range(100)]
    assert [p.seed for p in plans if p.big] == list(range(BIG_AT, 100, BIG_EVERY))
    for plan in (p for p in plans if p.big):
        if plan.per_key:
            _is_the_per_key_run_of_its_big_plan(plan)
            continue
        assert BIG_CONCURRENCY[0] <= plan.concurrency <= BIG_CONCURRENCY[1]
        assert plan.max_active == BIG_MAX_ACTIVE
        assert plan.workers in (2, 3)
        assert plan.chains == plan.workers + 1
        (joins,) = [a for a in plan.actions if a.verb == "start"]
        assert joins.chain == plan.workers  # a worker of its own joins
        (leaves,) = [a for a in plan.actions if a.verb in ("term", "kill")]
        assert leaves.chain < plan.workers
        # The first producer sweeps the pool round-robin: every instance gets an event.
        sweep = plan.streams[0]
        assert sum(len(send.ids) for send in sweep) == plan.concurrency
        assert all(send.partition_key is None for send in sweep)
        keyed = [send.partition_key for stream in plan.streams[1:] for send in stream]
        assert None not in keyed
        assert len(set(keyed)) > len(keyed) / 2  # many partitions
    assert draw(BIG).big
    assert draw(BIG).workers == 2
    keyed_seeds = [p.seed for p in plans if p.per_key]
    assert 0 < len(keyed_seeds) < len([p for p in plans if p.big])  # some of them


def _is_the_per_key_run_of_its_big_plan(plan: Plan) -> None:
    """A per-key big plan: its big plan's streams, each event of the first producer's
    sweep sent alone with a key of its own; evictions and few slots."""
    big = draw_big(plan.seed)
    assert plan.concurrency == PER_KEY
    assert plan.size == "per-key"
    assert plan.idle_timeout in PER_KEY_IDLE
    assert plan.max_active in PER_KEY_ACTIVE
    assert plan.streams[1:] == big.streams[1:]
    sweep = plan.streams[0]
    assert [send.ids for send in sweep] == [(i,) for send in big.streams[0] for i in send.ids]
    assert len({send.partition_key for send in sweep}) == len(sweep)  # a key each
    assert (plan.workers, plan.events) == (big.workers, big.events)


# -- the frozen-writer fault on a process of the test's own ------------------------------

HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
if sys.argv[2] == "hold":
    fcntl.flock(fd, fcntl.LOCK_EX)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    """A child that opens ``writer.lock`` in ``tmp_path`` and takes it (``"hold"``) or not."""
    children: list[subprocess.Popen[bytes]] = []

    def start(how: str) -> subprocess.Popen[bytes]:
        lock = str(tmp_path / WRITER_LOCK)
        child = subprocess.Popen([sys.executable, "-c", HOLDER, lock, how], stdout=subprocess.PIPE)
        children.append(child)
        assert child.stdout is not None
        assert child.stdout.readline() == b"ready\n"
        return child

    yield start
    for child in children:
        cont(child.pid)
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def _state(pid: int) -> str:
    """The process's state letter, from ``/proc/<pid>/stat`` (``T``: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


linux = pytest.mark.skipif(not LOCKS.exists(), reason="/proc/locks is Linux's")


@linux
def test_a_freeze_stops_the_holder_of_the_writer_lock_until_it_is_continued(
    tmp_path: Path, holder: Callable[[str], subprocess.Popen[bytes]]
) -> None:
    child = holder("hold")
    lock = LockFile.of(tmp_path)
    assert lock.held_by(child.pid)
    caught = catch(
        child.pid,
        lock,
        until=time.monotonic() + 10,
        alive=lambda: child.poll() is None,
        between=lambda: time.sleep(0.001),
    )
    assert caught.at is not None
    assert caught.misses == 0
    assert _state(child.pid) == "T"
    assert lock.held_by(child.pid)
    cont(child.pid)
    deadline = time.monotonic() + 10
    while _state(child.pid) == "T" and time.monotonic() < deadline:
        time.sleep(0.001)
    assert _state(child.pid) != "T"


@linux
def test_a_freeze_gives_up_on_a_process_that_never_holds_the_lock(
    tmp_path: Path, holder: Callable[[str], subprocess.Popen[bytes]]
) -> None:
    child = holder("open")
    caught = catch(
        child.pid,
        LockFile.of(tmp_path),
        until=time.monotonic() + 0.2,
        alive=lambda: child.poll() is None,
        between=lambda: time.sleep(0.001),
    )
    assert caught.at is None
    assert _state(child.pid) != "T"


def test_the_holders_of_the_lock_are_read_from_proc_locks() -> None:
    table = (
        "1: FLOCK  ADVISORY  WRITE 101 fe:00:2146309 0 EOF\n"
        "1: -> FLOCK  ADVISORY  WRITE 102 fe:00:2146309 0 EOF\n"  # waits for it
        "2: FLOCK  ADVISORY  WRITE 103 fe:00:999 0 EOF\n"  # another file
        "3: FLOCK  ADVISORY  WRITE 104 fd:01:2146309 0 EOF\n"  # another device
        "4: POSIX  ADVISORY  WRITE 105 fe:00:2146309 0 EOF\n"  # not a flock
        "5: OFDLCK ADVISORY  READ  -1 fe:00:2146309 0 EOF\n"
    )
    assert LockFile(0xFE, 0, 2146309).holders(table) == {101}


@pytest.mark.slow  # real processes: on CI's first Python, beside --processes
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
    assert "  processes: 0 frozen writers (0 producers, 0 workers, 0 missed); seeds none" in out
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


def _status(
    enqueued: int = 2, succeeded: int = 2, pending: int = 0, duplicates: int = 1, restarts: int = 0
) -> PoolStatus:
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
        restarts=restarts,
        duplicates=duplicates,
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
        duplicates=duplicates,
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


def test_a_handlers_storage_counter_must_be_its_instances_successes() -> None:
    """Guarantee 6: the counter each handler keeps in its storage commits with its
    successes only, so it equals the instance's ``succeeded``."""
    ending = _ending()
    assert check(PLAN, _records(*CLEAN), replace(ending, counted={0: 2})) == []
    violations = check(PLAN, _records(*CLEAN), replace(ending, counted={0: 3}))
    assert violations == ["instance 0: its handler's storage counts 3 successes, the meta 2"]


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


# 0.2 (a duplicate of 0.1 in the clean records) was refused: its producer gave up waiting
# for the writer lock from 100 to 200 (ns).
BUSY = "StoreBusyError: store 's' is busy: process 7 has held its writer lock for 0.5 s"
REFUSED = Refusal(100, 200, BUSY)


def _refused(*freezes: Freeze, refusal: Refusal = REFUSED) -> Records:
    found = _records(*CLEAN)
    del found.answers["0.2"]
    found.refused["0.2"] = refusal
    found.freezes = list(freezes)
    return found


def test_a_refused_enqueue_is_excused_only_while_a_frozen_writer_holds_the_lock() -> None:
    landed = Freeze("producer", 1, landed=True, stopped=150, continued=400)
    assert check(PLAN, _refused(landed), _ending(duplicates=0)) == []
    complaint = f"0.2: its enqueue raised {BUSY}, with no frozen writer holding the lock"
    for freezes in (
        (),
        (Freeze("producer", 1, landed=True, stopped=250, continued=400),),  # after it
        (Freeze("worker", 0, landed=False, misses=3, why="never seen holding it"),),
    ):
        violations = check(PLAN, _refused(*freezes), _ending(duplicates=0))
        assert complaint in violations, violations
    full = Refusal(100, 200, "QueueFullError: instance 0 of pool 'mp' is full (1/1)")
    violations = check(PLAN, _refused(landed, refusal=full), _ending(duplicates=0))
    assert f"0.2: its enqueue raised {full.error}, which no freeze explains" in violations


def test_a_refused_enqueue_that_ran_was_stored_after_all() -> None:
    found = _refused(Freeze("producer", 1, landed=True, stopped=150, continued=400))
    found.attempts.append(Attempt(0, "0.2", 0, 2, 1, "ok"))
    violations = check(PLAN, found, _ending(duplicates=0))
    assert "0.2 ran at (0, 2), though its enqueue raised " + REFUSED.error in violations


def test_a_lease_taken_from_a_live_worker_is_a_violation() -> None:
    """A worker that logged a warning (it lost a lease while alive), or an instance that
    restarted more often than the SIGKILLs explain (its lease taken over)."""
    ending = _ending()
    warning = "2026-11-29 02:05:47,256 WARNING dopool: the lease of mp:0 was taken over"
    ending.warnings = {"worker-1.err": [warning]}
    violations = check(PLAN, _records(*CLEAN), ending)
    assert f"worker-1.err: 1 line(s) logged at WARNING or above, the first: {warning}" in (
        violations
    )
    assert check(PLAN, _records(*CLEAN), _ending(killed={0}, restarts=1)) == []
    violations = check(PLAN, _records(*CLEAN), _ending(killed={0}, restarts=2))
    assert any("restarted more often than the 1 SIGKILL(s)" in v for v in violations), violations


def test_about_three_seeds_in_ten_rate_limit_the_pool_the_big_family_faster() -> None:
    limits = {seed: rate_limit(seed) for seed in range(300)}
    limited = {seed: limit for seed, limit in limits.items() if limit is not None}
    assert 60 < len(limited) < 120
    assert {limited[s] for s in limited if s % BIG_EVERY == BIG_AT} == {BIG_RATE}
    assert {limited[s] for s in limited if s % BIG_EVERY != BIG_AT} == set(RATES)
    assert all(rate_limit(seed) == limit for seed, limit in limits.items())


def test_each_start_line_carries_its_started_at(tmp_path: Path) -> None:
    records.worker_log(tmp_path, 0).write_text(
        "S 0.0 0 0 1 1000 1796015667.8079123\nE 0.0 0 0 1 ok\nS 0.1 0 1 1 2000\n"
    )
    found = records.read(tmp_path, 0, 1)
    assert found.attempts == [
        Attempt(0, "0.0", 0, 0, 1, "ok", 1000, 1796015667.8079123),
        Attempt(0, "0.1", 0, 1, 1, None, 2000, None),  # (a line of before: no time)
    ]


def test_the_checker_holds_every_workers_starts_together_to_the_rate_limit() -> None:
    """Seed 0's pool takes 100 starts a second (a token every 10 ms, no burst): three
    starts 10 ms apart keep it, whichever workers made them; two 5 ms apart do not. A
    start with no time (a line of before) is left out."""
    assert rate_limit(PLAN.seed) == RateLimit(rate=100)
    kept = [replace(a, generation=n, started_at=50.0 + n / 100) for n, a in enumerate(CLEAN)]
    assert check(PLAN, _records(*kept), _ending()) == []
    broken = [*kept[:1], replace(kept[1], started_at=50.005), *kept[2:]]
    assert check(PLAN, _records(*broken), _ending()) == [
        "pool 'mp', rate limit 100/1s, started by 3 worker(s): 2 of its 3 starts fall in the "
        "0.005 s from t=50.0 to t=50.005, where the limit allows 1.5; 1 start(s) end a window "
        "over the limit"
    ]
    assert check(replace(PLAN, seed=1), _records(*broken), _ending()) == []  # no limit
    unknown = [*broken[:1], replace(broken[1], started_at=None), *broken[2:]]
    assert check(PLAN, _records(*unknown), _ending()) == []
