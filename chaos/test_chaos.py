"""Quick mode of the chaos harness (``pytest chaos``), and tests of the harness itself.

Every seed in :data:`QUICK_SEEDS` is one test: a failure names the seed, lists the
violated invariants and prints ``dopool chaos --seed S``, which replays it exactly.

Two engine bugs the harness found have regression tests here: under a
SimulatedClock the part of an ``enqueue_many`` batch after a crashed one must wait
for the crashed instance's recovery (else the trace varies, against guarantee 5 in
docs/guarantees.md), and ``Runtime.close()`` must not deadlock with a handler that
calls ``runtime.kill`` after a sleep.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dopool import (
    EventContext,
    InstanceCrashedError,
    PoolEvent,
    RateLimit,
    RetryPolicy,
    Runtime,
)
from dopool._chaos import harness as cli
from dopool._chaos.checker import check_history, rate_violation
from dopool._chaos.history import Ack, Call, Dup, Ev, Exec, Fired, History, Resumed
from dopool._chaos.result import Result, replay_command
from dopool._chaos.runner import Runner, run_seed
from dopool._chaos.scenario import (
    LARGE_POOLS,
    POOL,
    RATE_MARGIN,
    SCALE_KEYS,
    SECOND_POOL,
    Scenario,
    Step,
    generate,
    make_event,
)
from dopool._clock.clocks import BACKEND_VARIABLE
from dopool._cluster.routing import stable_hash
from dopool._store.layout import PER_KEY
from dopool.chaos import FaultPlan

QUICK_SEEDS = range(300)
# Seeds whose runs crash, kill, sleep, spawn follow-ups and reopen the runtime, and whose
# traces are not subject to the enqueue_many race described above.
DETERMINISM_SEEDS = (38, 81, 25)  # 25: dedup keys (57 duplicates), crashes during enqueues


@pytest.mark.parametrize("seed", QUICK_SEEDS)
def test_scenario_keeps_every_invariant(seed: int) -> None:
    result = run_seed(seed)
    if not result.ok:
        pytest.fail(result.report(), pytrace=False)


# Seeds run again with an OS thread per actor (DOPOOL_SIM_BACKEND=threads), where the
# actors move between the runner's calls: 7 of 0-59 once ended "the pools never became
# idle" (an evicted instance seen quiet before it had handed its slot on), and the last
# four here hung once that was fixed (an enqueue waiting on a handler asleep in virtual
# time, which the runner had settled too early: ClockDriver).
THREADS_SEEDS = (*range(60), 106, 180, 200, 215)


@pytest.mark.parametrize("seed", THREADS_SEEDS)
def test_scenario_keeps_every_invariant_under_threads(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(BACKEND_VARIABLE, "threads")
    result = run_seed(seed)
    if not result.ok:
        pytest.fail(result.report(), pytrace=False)


# -- determinism and replay --------------------------------------------------------------


@pytest.mark.parametrize("seed", DETERMINISM_SEEDS)
def test_same_seed_gives_identical_traces(seed: int) -> None:
    first = run_seed(seed, keep_log=True)
    second = run_seed(seed, keep_log=True)
    assert first.crashes > 0
    assert first.reopens > 0
    assert first.trace  # the runtimes' own JSON-lines traces
    assert first.trace == second.trace
    assert first.log == second.log  # the harness's history, handler calls included
    assert first.violations == second.violations


def test_replay_command_writes_the_same_trace_twice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seed = DETERMINISM_SEEDS[0]
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    assert cli.main(["--seed", str(seed), "--trace", str(first)]) == 0
    assert cli.main(["--seed", str(seed), "--trace", str(second)]) == 0
    assert first.read_bytes() == second.read_bytes()
    assert first.stat().st_size > 0
    assert f"seed {seed}:" in capsys.readouterr().out


def test_generation_is_a_function_of_the_seed() -> None:
    assert generate(7) == generate(7)
    assert generate(7) != generate(8)
    sizes = {generate(seed).concurrency for seed in range(80)}
    assert sizes == {1, 2, 3, 4, *LARGE_POOLS}  # the large ones: the scale seeds'


def test_enqueue_many_crash_keeps_the_trace_deterministic() -> None:
    seen: list[tuple[str, int]] = []

    def slow_subscriber(event: PoolEvent) -> None:
        # A slow subscriber (20 ms) widens the race: subscribers run before the
        # instance finishes its message, so the next part must still come after.
        if event.kind == "recovered":
            time.sleep(0.02)  # real-time: a slow subscriber widens the race
        seen.append((event.kind, event.instance_index))

    # Fault seed 4 crashes instance 0's part of the batch and spares instance 1's.
    plan = FaultPlan(seed=4, crash_during_enqueue=0.5)
    with Runtime.simulated(seed=0, faults=plan) as runtime:
        runtime.subscribe(slow_subscriber)
        pool = runtime.define("race", execute=lambda ctx: None, concurrency=2)
        with pytest.raises(InstanceCrashedError):
            pool.enqueue_many(range(6))
        runtime.clock.activity.wait_quiet()
    assert seen == [
        ("activated", 0),
        ("crashed", 0),
        ("recovered", 0),
        ("activated", 1),
        *[("enqueued", 1)] * 3,
    ]


CLOSE_WHILE_A_HANDLER_KILLS = """
import faulthandler
from dopool import Runtime

faulthandler.dump_traceback_later(5, exit=True)  # a deadlock exits 1 after 5 s
runtime = Runtime.simulated(seed=0)

def handle(ctx):
    ctx.sleep(1.0)
    runtime.kill(ctx.pool_name, ctx.instance_index)  # close() holds the runtime's lock

pool = runtime.define("p", execute=handle)
pool.enqueue("x")
runtime.clock.advance(0.5)  # the handler is asleep until t=1
runtime.close()  # steps the clock so the handler finishes, under the lock kill() takes
"""


def test_close_while_a_sleeping_handler_will_kill_its_instance() -> None:
    # In a subprocess: a deadlocked actor would hang this process's teardown.
    done = subprocess.run(
        [sys.executable, "-c", CLOSE_WHILE_A_HANDLER_KILLS],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]


# -- the poison event ------------------------------------------------------------------------


def test_poison_event_that_kills_its_instance_is_dead_lettered_after_max_attempts() -> None:
    events: list[PoolEvent] = []
    done: list[int] = []
    with Runtime.simulated(seed=3) as runtime:
        runtime.subscribe(events.append)

        def handle(ctx: EventContext) -> None:
            if ctx.event == "poison":
                runtime.kill(ctx.pool_name, ctx.instance_index)  # crashes after we return
                return
            done.append(ctx.event)

        pool = runtime.define(
            "poisoned",
            execute=handle,
            concurrency=2,
            retry=RetryPolicy(max_attempts=3, initial_delay=0.5, jitter=0.0),
        )
        first = pool.enqueue("poison", partition_key="p")
        for n in range(5):
            pool.enqueue(n, partition_key="p")  # the same instance, behind the poison
        assert pool.join(timeout=30)
        (dead,) = pool.dead_letters()
        status = pool.status().instance(first.instance_index)

    assert dead.event == "poison"
    assert dead.sequence == first.sequence
    assert dead.attempts == 3
    assert done == [0, 1, 2, 3, 4]
    assert status.dead_lettered == 1
    assert status.succeeded == 5
    assert status.restarts == 3
    crashes = [e for e in events if e.kind == "crashed"]
    assert len(crashes) == 3


def test_poison_event_in_a_checked_scenario() -> None:
    behind = [make_event(f"after{n}", pk="p") for n in range(6)]
    steps = (
        Step("enqueue", {"events": [make_event("poison", pk="p", poison=True), *behind]}),
        Step("advance", {"seconds": 0.2}),
        Step("kill", {"index": 0}),
        Step("join", {}),
    )
    retry = RetryPolicy(max_attempts=3, initial_delay=0.5)
    scenario = Scenario(11, 2, retry, None, None, steps)
    runner = Runner(scenario)
    result = runner.run()
    assert result.ok, result.report()
    names = runner.history.names
    settled = [
        (names[(r.inst, r.seq or 0)], r.kind, r.attempt)
        for r in runner.history.records
        if isinstance(r, Ev) and r.kind in ("succeeded", "dead_lettered")
    ]
    assert settled[0] == ("poison", "dead_lettered", 3)
    assert [name for name, kind, _ in settled[1:]] == [event["id"] for event in behind]
    assert {kind for _, kind, _ in settled[1:]} == {"succeeded"}


def test_delayed_events_through_kills_and_a_reopen_in_a_checked_scenario() -> None:
    """Scheduled events survive a crash and a reopen, run at their due times, and never
    before; the checker follows them (docs/guarantees.md, "Order and priority")."""
    events = [make_event(f"d{n}", pk="p") for n in range(5)]
    steps = (
        Step(
            "enqueue",
            {
                "events": events[:4],
                "when": [("delay", 3.0), ("not_before", 1.5), None, ("delay", 0.0)],
            },
        ),
        Step("enqueue_many", {"events": events[4:], "pk": "p", "prio": 0, "when": ("delay", 6.0)}),
        Step("kill", {"index": 0}),
        Step("advance", {"seconds": 2.0}),
        Step("reopen", {}),
        Step("kill", {"index": 0}),
        Step("join", {}),
    )
    scenario = Scenario(13, 1, RetryPolicy(), FaultPlan(seed=3, alarm_error=0.2), None, steps)
    runner = Runner(scenario)
    result = runner.run()
    assert result.ok, result.report()
    names = runner.history.names
    started = {
        names[(r.inst, r.seq or 0)]: r.time
        for r in runner.history.records
        if isinstance(r, Ev) and r.kind == "started"
    }
    assert started["d2"] <= started["d3"] <= started["d1"]  # due at once, then in due order
    assert started["d1"] >= 1.5
    assert started["d0"] >= 3.0
    assert started["d4"] >= 6.0
    assert result.succeeded == len(events)


def test_a_stalled_instance_is_woken_in_a_checked_scenario() -> None:
    """``alarm_retries=0``: every failed alarm stalls the instance until a write or a resume."""
    events = [make_event(f"e{n}", pk="p") for n in range(12)]
    steps = (
        Step("enqueue", {"events": events[:6]}),
        Step("advance", {"seconds": 5.0}),
        Step("resume", {"index": None}),
        Step("advance", {"seconds": 5.0}),
        Step("enqueue", {"events": events[6:]}),
        Step("join", {}),
    )
    faults = FaultPlan(seed=5, alarm_error=0.5)
    scenario = Scenario(12, 1, RetryPolicy(), faults, None, steps, alarm_retries=0)
    runner = Runner(scenario)
    result = runner.run()
    assert result.ok, result.report()
    kinds = [r.kind for r in runner.history.records if isinstance(r, Ev)]
    assert kinds.count("alarm_given_up") >= 2
    assert result.succeeded == len(events)


def test_dedup_keys_through_crashes_during_enqueue_in_a_checked_scenario() -> None:
    """Keys repeated while their events are pending, running, dead and finished, with
    crashes between the index check and the commit, kills and a reopen: the checker finds
    at most one unfinished event per key after every step, and nothing lost
    (docs/guarantees.md, "Dedup keys")."""
    keys = ["a", "a", "b", "c", "a", "b", "c", "c"]
    events = [make_event(f"e{n}", fail=n % 3, mode="perm") for n in range(24)]
    for n, event in enumerate(events):
        event["dedup"] = keys[n % len(keys)]
    steps = (
        Step("enqueue", {"events": events[:6]}),
        Step("enqueue_many", {"events": events[6:12], "pk": None, "prio": 0}),
        Step("kill", {"index": 0}),
        Step("advance", {"seconds": 1.0}),
        Step("enqueue", {"events": events[12:16]}),
        Step("redrive", {"which": "all"}),
        Step("reopen", {}),
        Step("enqueue_many", {"events": events[16:], "pk": "p", "prio": 0}),
        Step("advance", {"seconds": 3.0}),
        Step("redrive", {"which": "all"}),
        Step("join", {}),
    )
    faults = FaultPlan(seed=4, crash_during_enqueue=0.3)
    scenario = Scenario(14, 2, None, faults, None, steps, dedup_window=2.0)
    result = Runner(scenario).run()
    assert result.ok, result.report()
    assert result.crashes > 0
    assert result.duplicates > 0


def test_a_store_whose_file_ends_in_free_pages_reopens() -> None:
    """Seed 1686's drain of keyed events frees pages it allocated in the same transaction,
    which LMDB never writes: the data file ends before them, and the reopen that follows
    found it "shorter than in use" before the opening check read LMDB's free list."""
    result = run_seed(1686)
    assert result.ok, result.report()
    assert result.reopens >= 2


def test_about_half_the_seeds_key_their_events() -> None:
    scenarios = [generate(seed) for seed in range(60)]
    keyed = [
        s
        for s in scenarios
        if any("dedup" in e for step in s.steps for e in step.args.get("events", ()))
    ]
    assert 15 < len(keyed) < 45
    assert {s.dedup_window for s in keyed} == {0.0, 1.0, 5.0}
    assert all(s.dedup_window == 0.0 for s in scenarios if s not in keyed)


# -- the checker can fail -------------------------------------------------------------------


def _history(*records: object, names: dict[tuple[int, int], str] | None = None) -> History:
    history = History(RetryPolicy(max_attempts=2, initial_delay=1.0, jitter=0.0))
    for ident in ("a", "b"):
        history.contents[ident] = make_event(ident)
    history.names.update(names or {(0, 0): "a", (0, 1): "b"})
    for record in records:
        history.add(record)  # type: ignore[arg-type]
    return history


def _enqueued(seq: int) -> Ev:
    return Ev("enqueued", 0, seq, None, 0.0, None)


def _ev(kind: str, seq: int, attempt: int, time: float = 0.0) -> Ev:
    return Ev(kind, 0, seq, attempt, time, None)


def _run(ident: str, seq: int, attempt: int, outcome: str = "ok", time: float = 0.0) -> Exec:
    return Exec(ident, 0, seq, attempt, time, outcome, ())


CLEAN = (
    Call(0, "enqueue"),
    _enqueued(0),
    Ack("a", 0, 0),
    _enqueued(1),
    Ack("b", 0, 1),
    Call(1, "advance"),
    _ev("started", 0, 1),
    _run("a", 0, 1, "error"),
    Ev("retry_scheduled", 0, 0, 1, 0.0, "RuntimeError"),
    _ev("started", 0, 2, time=1.0),
    _run("a", 0, 2, time=1.0),
    _ev("succeeded", 0, 2, time=1.0),
    _ev("started", 1, 1, time=1.0),
    _run("b", 1, 1, time=1.0),
    _ev("succeeded", 1, 1, time=1.0),
)


GIVEN_UP = Ev("alarm_given_up", 0, None, None, 0.0, "alarm delivery failed ...")


def test_checker_accepts_a_clean_fabricated_history() -> None:
    assert check_history(_history(*CLEAN)) == []


@pytest.mark.parametrize("wake", [Resumed(0, 1), Ev("resumed", 0, None, None, 0.0, None)])
def test_checker_accepts_a_stall_that_a_resume_ended(wake: Ev | Resumed) -> None:
    assert check_history(_history(*CLEAN[:5], GIVEN_UP, wake, *CLEAN[5:])) == []


@pytest.mark.parametrize(
    ("records", "complaint"),
    [
        pytest.param(CLEAN[:-3], "'b' was enqueued 1 times but ended 0 times", id="lost"),
        pytest.param(
            (*CLEAN, _ev("started", 1, 2, time=2.0), _run("b", 1, 2, time=2.0)),
            "started entry (0, 1) (attempt 2) after it was succeeded",
            id="run-after-success",
        ),
        pytest.param(
            (*CLEAN[:6], _ev("started", 1, 1), _run("b", 1, 1), _ev("succeeded", 1, 1)),
            "started sequence 1 (priority 0, due 0.0) while sequence 0",
            id="out-of-order",
        ),
        pytest.param(
            (*CLEAN[:2], Ack("a", 0, 0, 3.0), *CLEAN[3:6], _ev("started", 0, 1, time=2.5)),
            "entry (0, 0) started at 2.5, before it was due at 3.0",
            id="early-scheduled",
        ),
        pytest.param(
            (
                Call(0, "enqueue"),
                _enqueued(0),
                Ack("a", 0, 0, 3.0),  # scheduled for t=3
                Ev("enqueued", 0, 1, None, 4.0, None),
                Ack("b", 0, 1),  # enqueued at t=4: due after a
                Call(1, "advance"),
                _ev("started", 1, 1, time=5.0),
            ),
            "started sequence 1 (priority 0, due 4.0) while sequence 0 (priority 0, due 3.0)",
            id="due-order",
        ),
        pytest.param(
            (
                *CLEAN[:7],
                _run("a", 0, 1),  # returned normally, no crash...
                Ev("retry_scheduled", 0, 0, 1, 0.0, "?"),  # ...and yet retried
            ),
            "nothing failed (spurious retry)",
            id="spurious-retry",
        ),
        pytest.param(
            (*CLEAN[:9], _ev("started", 0, 2, time=0.5)),
            "before its backoff ended",
            id="early-retry",
        ),
        pytest.param(
            (*CLEAN[:7], _run("a", 0, 1, "error"), Ev("dead_lettered", 0, 0, 1, 0.0, "?")),
            "dead-lettered (0, 0) attempt 1 (error) with 1 of 2 attempts",
            id="dead-too-soon",
        ),
        pytest.param(
            (*CLEAN, Ev("enqueued", 0, 5, None, 2.0, None)),
            "enqueued sequence 5, expected 2",
            id="sequence-gap",
        ),
        pytest.param(
            (*CLEAN[:5], GIVEN_UP, *CLEAN[5:]),
            "instance 0 started (0, 0) while stalled (no write woke it)",
            id="start-while-stalled",
        ),
        pytest.param(
            (GIVEN_UP, *CLEAN),
            "gave its alarm up with 0 pending",
            id="stalled-with-nothing-pending",
        ),
    ],
)
def test_checker_catches_a_planted_violation(records: tuple[object, ...], complaint: str) -> None:
    violations = check_history(_history(*records))
    assert any(complaint in violation for violation in violations), violations


@pytest.mark.parametrize(("held", "clean"), [("k", True), ("other", False), (None, False)])
def test_checker_catches_a_duplicate_answered_with_another_keys_event(
    held: str | None, clean: bool
) -> None:
    history = _history(*CLEAN[:3], Dup("c", 0, 0), *CLEAN[3:])
    history.contents["c"] = {**make_event("c"), "dedup": "k"}
    if held is not None:
        history.contents["a"]["dedup"] = held
    violations = check_history(history)
    assert (violations == []) == clean, violations
    if not clean:
        assert any("was answered as a duplicate of 'a'" in v for v in violations), violations


@pytest.mark.parametrize(
    ("limit", "complaint"),
    [
        # CLEAN starts attempts at t=0, t=1 and t=1 again.
        pytest.param(RateLimit(rate=1, burst=2), None, id="kept"),
        pytest.param(RateLimit(rate=2, per=2.0, burst=2), None, id="kept-per-2s"),
        pytest.param(
            RateLimit(rate=1),
            "pool 'chaos', rate limit 1/1s: 2 of its 3 starts fall in the 0 s from t=1.0 to "
            "t=1.0, where the limit allows 1; 1 start(s) end a window over the limit",
            id="two-at-once",
        ),
        pytest.param(
            RateLimit(rate=1, per=2.0, burst=2),
            "pool 'chaos', rate limit 1/2s, burst 2: 3 of its 3 starts fall in the 1 s from "
            "t=0.0 to t=1.0, where the limit allows 2.5",
            id="three-in-a-second",
        ),
    ],
)
def test_checker_holds_a_rate_limited_pools_starts_to_its_limit(
    limit: RateLimit, complaint: str | None
) -> None:
    history = _history(*CLEAN)
    history.limits = ((POOL, 0, 1, limit),)
    violations = check_history(history)
    if complaint is None:
        assert violations == []
    else:
        assert len(violations) == 1, violations
        assert violations[0].startswith("step 1: " + complaint), violations
    history.limits = ((POOL, 1, 2, limit),)  # another pool's instances: none of these starts
    assert check_history(history) == []


def test_the_rate_rule_finds_the_window_each_pair_of_starts_would() -> None:
    """One pass over the sorted starts finds a window over the limit exactly when one of
    the pairs ``i < j`` holds more than ``limit.allows(t[j] - t[i])`` (checked pair by
    pair here), and the most crowded one."""
    rng = random.Random(7)
    for _ in range(300):
        limit = RateLimit(
            rate=rng.choice((1, 2, 5)), per=rng.choice((1.0, 2.0)), burst=rng.randint(1, 4)
        )
        times = [
            round(rng.uniform(0, 10), rng.choice((0, 1, 2))) for _ in range(rng.randint(0, 30))
        ]
        ordered = sorted(times)
        excess = max(
            (
                (j - i + 1) - limit.allows(ordered[j] - ordered[i])
                for j in range(len(ordered))
                for i in range(j + 1)
            ),
            default=0.0,
        )
        found = rate_violation(reversed(times), limit)
        assert (found is not None) == (excess > 1e-9), (limit, times, found)
        if found is not None:  # the window it names is one of the most crowded
            shown = re.match(r"(\d+) of its \d+ starts .* the limit allows ([^;]+);", found)
            assert shown is not None, found
            assert abs(int(shown[1]) - float(shown[2]) - excess) < 1e-4, (found, excess)


def test_a_rate_limit_kept_in_the_wall_clocks_float_rounding_is_kept() -> None:
    """Wall clock times near 1.8e9 s are multiples of 2.4e-7 s: a bucket kept to 1,000
    starts a second, each start one interval after the last, rounds each sum, here to
    0.03 of a start more than the exact bound over 400 starts. The rule allows for it,
    not for one start more."""
    limit = RateLimit(rate=1000)
    times, now = [], 1_796_016_606.1491628
    for _ in range(400):
        times.append(now)
        now += limit.interval  # rounded, as the engine's bucket arithmetic is
    assert max(j + 1 - limit.allows(t - times[0]) for j, t in enumerate(times)) > 0.01
    assert rate_violation(times, limit) is None
    assert rate_violation([*times, times[200]], limit) is not None


def test_about_three_seeds_in_ten_rate_limit_their_pools_and_the_limits_bind() -> None:
    """A limit per seed, drawn on its own: the rest of the scenario is what it was. The
    first pool's is at least twice its schedules' rate (a backlog that never drains would
    never let a join end); and a limited seed's run keeps it, where a run that started
    its attempts any faster would not (the limit binds)."""
    scenarios = [generate(seed) for seed in range(300)]
    limited = [s for s in scenarios if s.rate_limits]
    assert 60 < len(limited) < 120
    assert any(s.rate_limit(SECOND_POOL) is not None for s in limited)
    assert {limit.burst for s in limited for _, limit in s.rate_limits} >= {1, 2, 5}
    for scenario in limited:
        assert scenario.rate_limit(POOL) is not None
        fires = {s.args["name"]: s.args["every"] for s in scenario.steps if s.kind == "schedule"}
        limit = scenario.rate_limit(POOL)
        assert limit is not None
        assert limit.rate / limit.per >= RATE_MARGIN * sum(1 / every for every in fires.values())
    assert "  rate limits: chaos 1/1s" in generate(10).describe()
    runner = Runner(generate(10))  # 1/s: some 90 attempts, bursts of a dozen at once
    result = runner.run()
    assert result.ok, result.report()
    starts = [r.time for r in runner.history.records if isinstance(r, Ev) and r.kind == "started"]
    assert len(starts) > 50
    assert rate_violation(starts, RateLimit(rate=1)) is None
    assert rate_violation(starts, RateLimit(rate=0.9)) is not None


def _two_instances(kids_first: tuple[str, str], arrived: tuple[str, str]) -> History:
    """Instance 0 runs "p" (its follow-ups ``kids_first``); they reach instance 1 as
    ``arrived`` (sequence 0 and 1), and run."""
    history = History(None)
    for ident in ("p", *kids_first):
        history.contents[ident] = make_event(ident)
    history.names.update({(0, 0): "p", (1, 0): arrived[0], (1, 1): arrived[1]})
    records: list[object] = [
        Call(0, "enqueue"),
        Ev("enqueued", 0, 0, None, 0.0, None),
        Ack("p", 0, 0),
        Ev("started", 0, 0, 1, 0.0, None),
        Exec("p", 0, 0, 1, 0.0, "ok", kids_first),
        Ev("succeeded", 0, 0, 1, 0.0, None),
    ]
    records += [Ev("enqueued", 1, seq, None, 0.0, None) for seq in range(len(arrived))]
    for seq, ident in enumerate(arrived):
        records.append(Ev("started", 1, seq, 1, 0.0, None))
        records.append(Exec(ident, 1, seq, 1, 0.0, "ok", ()))
        records.append(Ev("succeeded", 1, seq, 1, 0.0, None))
    for record in records:
        history.add(record)  # type: ignore[arg-type]
    return history


def test_checker_follows_follow_ups_between_instances_in_order() -> None:
    """The follow-ups of one source reach one target in the order they were made."""
    assert check_history(_two_instances(("p.1.0", "p.1.1"), ("p.1.0", "p.1.1"))) == []
    violations = check_history(_two_instances(("p.1.0", "p.1.1"), ("p.1.1", "p.1.0")))
    assert any("reached instance 1 out of order" in v for v in violations), violations


def test_some_seeds_have_a_second_pool_and_send_follow_ups_across() -> None:
    scenarios = [generate(seed) for seed in range(60)]
    crossing = [s for s in scenarios if s.second]
    assert 10 < len(crossing) < 40
    assert {s.second for s in crossing} == {1, 2, 3}
    for scenario in scenarios:  # a seed without the second pool is as it always was
        if not scenario.second:
            assert all("pool" not in step.args for step in scenario.steps)
    result = run_seed(38, keep_log=True)
    assert result.ok, result.report()
    # Follow-ups of the first pool's events ran on the second pool's instances (3..5).
    assert any(line.startswith("Exec(id='e") and ", inst=5," in line for line in result.log)
    assert "Phase(name='defining')" in "".join(result.log)  # a reopen left it out a while


def test_about_three_seeds_in_ten_make_the_first_pool_large_or_per_key() -> None:
    scenarios = [generate(seed) for seed in range(200)]
    scaled = [s for s in scenarios if s.concurrency in LARGE_POOLS]
    assert 35 < len(scaled) < 85
    assert {s.concurrency for s in scaled} == set(LARGE_POOLS)
    for scenario in scaled:
        reached = {stable_hash(key) % scenario.concurrency for key in SCALE_KEYS}
        for step in scenario.steps:
            if step.args.get("pool", POOL) == POOL and step.args.get("index") is not None:
                assert step.args["index"] in reached, step  # an instance a key reaches
            if scenario.concurrency != PER_KEY:
                continue
            if step.kind in ("enqueue_many", "schedule"):  # a per-key pool needs a key
                assert step.args["pk"] in SCALE_KEYS, step
            contents = list(step.args.get("events", []))
            while contents:
                content = contents.pop()
                assert content["pk"] in SCALE_KEYS, step
                contents.extend(content["kids"])


@pytest.mark.parametrize("seed", [237, 176])
def test_per_key_pools_through_evictions_slots_and_a_whole_pool_pause(seed: int) -> None:
    """237: schedules, faults, idle timeout 2 s, 3 slots; 176: a second pool taking
    follow-ups both ways, 2 slots, a reopen. Both pause the per-key pool as a whole."""
    scenario = generate(seed)
    assert scenario.concurrency == PER_KEY
    assert scenario.max_active is not None
    assert any(step.kind == "pause" and step.args["index"] is None for step in scenario.steps)
    result = run_seed(seed, keep_log=True)
    assert result.ok, result.report()
    log = "\n".join(result.log)
    instances = {int(n) for n in re.findall(r"Ev\(kind='evicted', inst=(\d+)", log)}
    assert len([n for n in instances if 2**32 <= n < PER_KEY]) >= 3  # keys' instances
    assert re.search(r"Ev\(kind='activated', inst=\d{11,}", log)
    if scenario.second:  # the second pool's instances come after every key's
        assert any(int(n) >= PER_KEY for n in re.findall(r"Exec\(id='[^']+', inst=(\d+)", log))


def test_failure_report_names_the_seed_and_the_replay_command() -> None:
    report = Result(seed=4242, violations=["step 3: event 'e1' lost"]).report()
    assert "chaos seed 4242" in report
    assert "dopool chaos --seed 4242" in report
    assert replay_command(4242) == "dopool chaos --seed 4242"
    assert "step 3: event 'e1' lost" in report


# -- long mode ---------------------------------------------------------------------------------


def test_long_mode_summarises_and_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--seeds", "3", "--start", "10"]) == 0
    out = capsys.readouterr().out
    assert "chaos summary: 3 scenarios" in out
    for word in ("events", "crashes", "restarts", "0 violations"):
        assert word in out


def test_long_mode_exits_1_and_prints_replay_commands(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(seed: int, *, keep_log: bool = False) -> Result:
        violations = ["step 0: planted"] if seed == 21 else []
        return Result(seed=seed, violations=violations)

    monkeypatch.setattr(cli, "run_seed", broken)
    assert cli.main(["--seeds", "2", "--start", "20"]) == 1
    out = capsys.readouterr().out
    assert "1 violations in 1 scenarios" in out
    assert "dopool chaos --seed 21" in out
    assert "dopool chaos --seed 20" not in out
    assert cli.main(["--seed", "21"]) == 1


def test_about_a_quarter_of_the_seeds_define_schedules() -> None:
    scenarios = [generate(seed) for seed in range(200)]
    scheduling = [s for s in scenarios if any(step.kind == "schedule" for step in s.steps)]
    assert 25 < len(scheduling) < 75
    assert any(s.faults is not None and s.faults.crash_during_fire for s in scheduling)


def test_schedules_through_fire_crashes_kills_a_pause_and_a_reopen_in_a_checked_scenario() -> None:
    """Two schedules (one fired into instance 0's own queue, one through its outbox), one
    defined twice; fires crash before their commit, instance 0 is killed, paused (its
    fires coalesce) and reopened: every occurrence ends once, and every fire time is fired
    or coalesced once (docs/guarantees.md, "Recurring schedules")."""
    own = {"name": "own", "every": 1.5, "pk": None, "prio": 0}
    away = {"name": "away", "every": 2.5, "pk": "k3", "prio": 1}
    steps = (
        Step("schedule", own),
        Step("schedule", away),
        Step("advance", {"seconds": 6.0}),
        Step("kill", {"index": 0}),
        Step("schedule", own),  # the same again: nothing changes
        Step("advance", {"seconds": 4.0}),
        Step("pause", {"index": 0}),
        Step("advance", {"seconds": 9.0}),
        Step("resume", {"index": 0}),
        Step("advance", {"seconds": 3.0}),
        Step("reopen", {}),
        Step("advance", {"seconds": 5.0}),
        Step("join", {}),
    )
    faults = FaultPlan(seed=4, crash_during_fire=0.3)
    scenario = Scenario(14, 3, RetryPolicy(), faults, None, steps)
    runner = Runner(scenario)
    result = runner.run()
    assert result.ok, result.report()
    fired = {r.id: r.occurrences for r in runner.history.records if isinstance(r, Fired)}
    assert set(fired) == {"sched-own", "sched-away"}
    assert all(count > 3 for count in fired.values())
    crashes = [r for r in runner.history.records if isinstance(r, Ev) and r.kind == "crashed"]
    assert any(r.error == "crash_during_fire" for r in crashes)


def test_checker_counts_each_schedules_occurrences() -> None:
    """An occurrence ended more often than its schedule fired, or fewer, is reported."""
    content = make_event("sched-s0")
    history = History(None)
    history.contents["sched-s0"] = content
    records: list[object] = [Call(0, "advance")]
    for seq in range(2):
        history.names[(0, seq)] = "sched-s0"
        records += [
            Ev("enqueued", 0, seq, None, float(seq), None),
            Ev("started", 0, seq, 1, float(seq), None),
            Exec("sched-s0", 0, seq, 1, float(seq), "ok", ()),
            Ev("succeeded", 0, seq, 1, float(seq), None),
        ]
    for occurrences, complaint in ((2, None), (1, "ended 2 times"), (3, "ended 2 times")):
        history.records = [*records, Fired("sched-s0", occurrences)]  # type: ignore[list-item]
        found = check_history(history)
        if complaint is None:
            assert found == []
        else:
            assert any(complaint in text for text in found), found
