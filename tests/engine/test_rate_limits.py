"""A pool's rate limit (docs/api.md, "Rate limits"): a token taken in each start's
transaction from one bucket in the store, shared by the pool's instances, kept across
reopens; an event over the limit waits for the next token and never fails."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from dopool import EventContext, RateLimit, RetryPolicy, Runtime
from dopool._rates import RateLimit as Limit
from dopool._store.environment import Store
from dopool._store.layout import Namespace, RateRecord, get_rate, put_rate
from dopool._store.layout.keys import rate_key
from dopool._store.layout.records import seal

TIMEOUT = 30.0


def within_limit(starts: list[float], limit: Limit) -> bool:
    """Whether no window between two starts holds more than the limit allows."""
    ordered = sorted(starts)
    return all(
        last - first + 1 <= limit.allows(ordered[last] - ordered[first]) + 1e-9
        for first in range(len(ordered))
        for last in range(first, len(ordered))
    )


def test_starts_of_all_instances_together_are_spaced_by_the_limit(sim: Runtime) -> None:
    starts: list[float] = []
    pool = sim.define("p", execute=lambda ctx: starts.append(ctx.started_at), concurrency=4)
    limited = sim.define(
        "q", execute=lambda ctx: starts.append(ctx.started_at), concurrency=4, rate_limit="10/s"
    )
    assert (pool.concurrency, limited.concurrency) == (4, 4)
    limited.enqueue_many(range(30))
    assert limited.join(timeout=TIMEOUT)
    status = limited.status()
    assert (status.succeeded, status.dead_lettered) == (30, 0)  # waited, never failed
    assert sorted(starts) == pytest.approx([n / 10 for n in range(30)])
    assert within_limit(starts, RateLimit(rate=10))


def test_instances_waiting_for_tokens_take_turns_first_come_first_served(sim: Runtime) -> None:
    """Each waiting instance books the next turn: the tokens go round the instances with a
    backlog, instead of to whichever asks first at each token (the lowest index, under a
    simulated clock), which would drain one instance while the others starve."""
    starts: list[tuple[float, int]] = []
    pool = sim.define(
        "p",
        execute=lambda ctx: starts.append((ctx.started_at, ctx.instance_index)),
        concurrency=4,
        rate_limit="10/s",
    )
    pool.enqueue_many(range(20))  # round-robin: five on each instance
    assert pool.join(timeout=TIMEOUT)
    starts.sort()
    assert starts[-1][0] == pytest.approx(1.9)  # every token used, one every 0.1 s
    # Instance 0 starts at once, and asks first for the next token (its outcome commits
    # first); then each instance in the order it asked, round after round.
    assert [index for _, index in starts] == [0, *[0, 1, 2, 3] * 4, 1, 2, 3]
    assert within_limit([time for time, _ in starts], RateLimit(rate=10))


def test_a_burst_starts_at_once_then_the_rest_wait_for_tokens(sim: Runtime) -> None:
    starts: list[float] = []
    limit = RateLimit(rate=10, burst=5)
    pool = sim.define(
        "p", execute=lambda ctx: starts.append(ctx.started_at), concurrency=8, rate_limit=limit
    )
    pool.enqueue_many(range(15))
    assert pool.join(timeout=TIMEOUT)
    assert sorted(starts)[:5] == [0.0] * 5
    assert sorted(starts)[5:] == pytest.approx([n / 10 for n in range(1, 11)])
    assert within_limit(starts, limit)


def test_an_instance_waiting_for_a_token_says_so(sim: Runtime) -> None:
    pool = sim.define("p", execute=lambda ctx: None, rate_limit="1/m")
    pool.enqueue_many([1, 2])
    sim.clock.run_until(1.0)  # type: ignore[attr-defined]
    (instance,) = pool.status().instances
    assert (instance.state, instance.pending, instance.next_alarm_at) == ("throttled", 1, 60.0)
    sim.clock.run_until(60.0)  # type: ignore[attr-defined]
    assert pool.status().succeeded == 2


def test_retries_take_tokens_too(sim: Runtime) -> None:
    starts: list[tuple[int, float]] = []

    def flaky(ctx: EventContext) -> None:
        starts.append((ctx.attempt, ctx.started_at))
        if ctx.attempt == 1:
            raise ValueError("again")

    retry = RetryPolicy(max_attempts=2, initial_delay=0.01, jitter=0.0)
    pool = sim.define("p", execute=flaky, rate_limit="2/s", retry=retry)
    pool.enqueue_many([1, 2])
    assert pool.join(timeout=TIMEOUT)
    assert [time for _, time in sorted(starts, key=lambda s: s[1])] == [0.0, 0.5, 1.0, 1.5]
    assert sorted(attempt for attempt, _ in starts) == [1, 1, 2, 2]


def test_the_bucket_is_stored_and_kept_across_a_reopen(store_path: Path) -> None:
    starts: list[float] = []
    with Runtime.simulated(store_path, seed=0) as runtime:
        pool = runtime.define(
            "p", execute=lambda ctx: starts.append(ctx.started_at), rate_limit="1/m"
        )
        pool.enqueue(1)
        assert pool.join(timeout=TIMEOUT)
    store = Store(store_path)
    try:
        with store.read() as txn:
            assert get_rate(txn, "p") == RateRecord(60.0, None)  # stored with the start
    finally:
        store.close()
    with Runtime.simulated(store_path, seed=0) as runtime:  # its clock starts at 0 again
        pool = runtime.define(
            "p", execute=lambda ctx: starts.append(ctx.started_at), rate_limit="1/m"
        )
        pool.enqueue(2)
        assert pool.join(timeout=TIMEOUT)
    assert starts == [0.0, 60.0]  # the second waited for the token the first left


def test_a_pool_defined_again_without_its_limit_starts_at_once(store_path: Path) -> None:
    with Runtime.simulated(store_path, seed=0) as runtime:
        pool = runtime.define("p", execute=lambda ctx: None, rate_limit="1/h")
        pool.enqueue_many([1, 2])
        runtime.clock.run_until(1.0)  # type: ignore[attr-defined]
        assert pool.status().instances[0].state == "throttled"
    starts: list[float] = []
    with Runtime.simulated(store_path, seed=0) as runtime:
        pool = runtime.define("p", execute=lambda ctx: starts.append(ctx.started_at))
        assert pool.join(timeout=TIMEOUT)
    assert starts == [0.0]


def test_a_damaged_bucket_is_taken_as_full_and_written_sound(
    store_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Runtime.simulated(store_path, seed=0) as runtime:
        runtime.define("p", execute=lambda ctx: None, rate_limit="1/m")
    store = Store(store_path)
    try:
        with store.write() as txn:
            txn.put(rate_key("p"), seal(rate_key("p"), b"\xc1"))  # msgpack's never-used byte
    finally:
        store.close()
    starts: list[float] = []
    with (
        caplog.at_level(logging.ERROR, logger="dopool"),
        Runtime.simulated(store_path, seed=0) as runtime,
    ):
        pool = runtime.define(
            "p", execute=lambda ctx: starts.append(ctx.started_at), rate_limit="1/m"
        )
        pool.enqueue_many([1, 2])
        assert pool.join(timeout=TIMEOUT)
    assert starts == [0.0, 60.0]
    assert "rate limit bucket of pool p" in caplog.text
    assert "taken as full" in caplog.text
    store = Store(store_path)
    try:
        with store.read() as txn:
            assert get_rate(txn, "p") == RateRecord(120.0, 120.0)  # the turn it booked, taken
    finally:
        store.close()


def test_under_the_real_clock_no_two_starts_come_closer_than_a_token(store_path: Path) -> None:
    starts: list[float] = []
    limit = RateLimit(rate=200)  # a token every 5 ms
    with Runtime(store_path, durability="async") as runtime:
        pool = runtime.define(
            "p", execute=lambda ctx: starts.append(ctx.started_at), concurrency=4, rate_limit=limit
        )
        pool.enqueue_many(range(40))
        assert pool.join(timeout=TIMEOUT)
        assert pool.status().succeeded == 40
    # Each start's time is the clock reading its own transaction checked the bucket with.
    assert within_limit(starts, limit)


def test_a_bucket_written_ahead_by_another_process_holds_this_one_back(store_path: Path) -> None:
    """The bucket is the store's: a token another process took (written here by hand, as
    its transaction would) is one this runtime cannot take."""
    with Runtime.simulated(store_path, seed=0) as runtime:
        runtime.define("p", execute=lambda ctx: None, rate_limit="1/s")
    store = Store(store_path)
    try:
        with store.write() as txn:
            put_rate(txn, "p", RateRecord(5.0, None))  # tokens taken up to t=5
    finally:
        store.close()
    starts: list[float] = []
    with Runtime.simulated(store_path, seed=0) as runtime:
        pool = runtime.define(
            "p", execute=lambda ctx: starts.append(ctx.started_at), rate_limit="1/s"
        )
        pool.enqueue(1)
        assert pool.join(timeout=TIMEOUT)
    assert starts == [5.0]


# -- per partition key ------------------------------------------------------------------


def test_each_partition_key_has_its_own_bucket(sim: Runtime) -> None:
    starts: dict[str | None, list[float]] = {}

    def note(ctx: EventContext) -> None:
        starts.setdefault(ctx.partition_key, []).append(ctx.started_at)

    pool = sim.define("p", execute=note, concurrency="per-key", rate_limit_per_key="2/s")
    for n in range(4):
        for key in ("ada", "bob"):
            pool.enqueue(n, partition_key=key)
    assert pool.join(timeout=TIMEOUT)
    assert starts == {"ada": [0.0, 0.5, 1.0, 1.5], "bob": [0.0, 0.5, 1.0, 1.5]}


def test_a_start_takes_a_token_of_both_limits_or_neither(sim: Runtime) -> None:
    starts: list[tuple[str | None, float]] = []
    pool = sim.define(
        "p",
        execute=lambda ctx: starts.append((ctx.partition_key, ctx.started_at)),
        concurrency=4,
        rate_limit="4/s",
        rate_limit_per_key="1/s",
    )
    for n in range(3):
        for key in ("a", "b", "c", "d", "e", "f"):
            pool.enqueue(n, partition_key=key)
    assert pool.join(timeout=TIMEOUT)
    assert len(starts) == 18
    assert within_limit([time for _, time in starts], RateLimit(rate=4))
    for key in "abcdef":
        assert within_limit([time for k, time in starts if k == key], RateLimit(rate=1))


def test_events_without_a_partition_key_take_no_key_token(sim: Runtime) -> None:
    starts: list[float] = []
    pool = sim.define(
        "p", execute=lambda ctx: starts.append(ctx.started_at), rate_limit_per_key="1/h"
    )
    pool.enqueue_many(range(5))
    assert pool.join(timeout=TIMEOUT)
    assert starts == [0.0] * 5


def test_the_buckets_of_keys_no_longer_used_are_swept(store_path: Path) -> None:
    with Runtime.simulated(store_path, seed=0) as runtime:
        pool = runtime.define("p", execute=lambda ctx: None, rate_limit_per_key="1/s")
        pool.enqueue_many(range(10), partition_key=None)
        for n in range(10):
            pool.enqueue(n, partition_key=f"once-{n}")
        assert pool.join(timeout=TIMEOUT)
        held = _buckets(runtime)
        assert len(held) == 10  # each full again at t=1, kept until a start sweeps it
        runtime.clock.run_until(100.0)  # type: ignore[attr-defined]
        for n in range(5):  # each start sweeps at most two, soonest full first
            pool.enqueue(n, partition_key="busy")
            assert pool.join(timeout=TIMEOUT)
        assert _buckets(runtime) == [b"busy"]


def _buckets(runtime: Runtime) -> list[bytes]:
    """The names of instance p:0's partition-key buckets."""
    prefix = Namespace("p", 0).prefix + b"b"
    with runtime._store.read() as txn, txn.cursor() as cursor:
        names = []
        if cursor.set_range(prefix):
            for key in cursor.iternext(values=False):
                if not key.startswith(prefix):
                    break
                names.append(bytes(key[len(prefix) :]))
    return names


def test_an_instance_woken_before_its_turn_keeps_it(sim: Runtime) -> None:
    """A schedule's fire wakes the waiting instance (every 0.7 s, its tokens come every
    1 s): it keeps the turn it booked instead of booking a later one each time, which
    would put its turn off for ever."""
    starts: list[float] = []
    pool = sim.define("p", execute=lambda ctx: starts.append(ctx.started_at), rate_limit="1/s")
    pool.enqueue_many(range(200))
    pool.schedule("tick", "tick", every=0.7)
    sim.clock.run_until(60.0)  # type: ignore[attr-defined]
    assert len(starts) == 61  # every token, the fires' occurrences queued behind the backlog
    assert within_limit(starts, RateLimit(rate=1))
