"""dopool.testing for users' tests: ``run_handler`` beside the engine it stands in for, the
``assert_*`` checks and their messages, the pytest fixtures as a project gets them (through
the entry point, or ``-p dopool.testing``), the worked example of docs/api.md run under
pytest, and a fresh project that installed only dopool and pytest."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import dopool
from dopool import (
    ConfigurationError,
    EventContext,
    EventTooLargeError,
    EventValidationError,
    PermanentError,
    Runtime,
    StorageItemError,
)
from dopool._cluster.routing import stable_hash
from dopool._errors import MAX_DELAY
from dopool.testing import (
    FollowUp,
    HandlerRun,
    assert_dead_letters,
    assert_paused,
    assert_pending,
    assert_succeeded,
    run_handler,
)

pytest_plugins = ["pytester"]

ROOT = Path(__file__).parents[2]


def noop(ctx: EventContext) -> None:
    pass


# -- run_handler: the context ------------------------------------------------------------


def seen(ctx: EventContext) -> dict[str, Any]:
    """What a handler can read of its context, but the times."""
    return {
        "event": ctx.event,
        "sequence": ctx.sequence,
        "attempt": ctx.attempt,
        "is_retry": ctx.is_retry,
        "instance_index": ctx.instance_index,
        "instance_id": ctx.instance_id,
        "pool_name": ctx.pool_name,
        "partition_key": ctx.partition_key,
        "priority": ctx.priority,
    }


def test_the_context_holds_what_was_given() -> None:
    contexts: list[EventContext] = []
    run = run_handler(
        contexts.append,
        {"n": 1},
        pool="orders",
        partition_key="ada",
        priority=-3,
        attempt=2,
        instance_index=5,
    )
    assert run == HandlerRun(returned=None, error=None)
    (ctx,) = contexts
    assert seen(ctx) == {
        "event": {"n": 1},
        "sequence": 0,
        "attempt": 2,
        "is_retry": True,
        "instance_index": 5,
        "instance_id": "orders:5",
        "pool_name": "orders",
        "partition_key": "ada",
        "priority": -3,
    }
    assert (ctx.enqueued_at, ctx.started_at) == (0.0, 0.0)
    assert run_handler(lambda ctx: ctx.instance_id, None).returned == "test:0"  # the defaults


def test_a_tuple_event_is_seen_as_a_list_as_the_store_gives_it_back() -> None:
    run = run_handler(lambda ctx: ctx.event, (1, ("a", b"b"), {"k": (2,)}))
    assert run.returned == [1, ["a", b"b"], {"k": [2]}]


def test_the_schema_transforms_the_event_first() -> None:
    run = run_handler(lambda ctx: ctx.event, "7", schema=int)
    assert run.returned == 7
    with pytest.raises(EventValidationError, match="schema rejected it"):
        run_handler(noop, "seven", schema=int)


@pytest.mark.parametrize(
    ("event", "options", "error"),
    [
        (object(), {}, EventValidationError),  # not msgpack-encodable
        ({(1, 2): "x"}, {}, EventValidationError),  # encodes, but would not decode
        (b"x" * (128 * 1024 + 1), {}, EventTooLargeError),
        ("e", {"partition_key": 7}, EventValidationError),
        ("e", {"priority": 2**31}, EventValidationError),
    ],
    ids=["unencodable", "tuple-key", "too-large", "bad-key", "bad-priority"],
)
def test_an_event_enqueue_refuses_is_refused_before_the_handler_runs(
    event: Any, options: dict[str, Any], error: type[Exception]
) -> None:
    called: list[object] = []
    with pytest.raises(error):
        run_handler(called.append, event, **options)
    assert called == []
    with Runtime.simulated() as rt, pytest.raises(error):  # as enqueue refuses it
        rt.define("p", execute=noop).enqueue(event, **options)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"pool": "no spaces"}, "pool name"),
        ({"attempt": 0}, "attempt must be an int >= 1"),
        ({"attempt": True}, "attempt must be an int >= 1"),
        ({"instance_index": -1}, "instance_index must be an int >= 0"),
        ({"storage": [("k", 1)]}, "storage must be a mapping"),
    ],
)
def test_bad_arguments_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        run_handler(noop, 1, **options)


def test_a_handler_that_would_not_run_its_body_is_refused_or_fails_as_in_a_pool() -> None:
    def generator(ctx: EventContext) -> Any:
        yield ctx

    with pytest.raises(ConfigurationError, match="plain function"):
        run_handler(generator, 1)

    async def coroutine(ctx: EventContext) -> None:
        pass

    def hides(ctx: EventContext) -> Any:  # a plain def returning one: the result tells
        return coroutine(ctx)

    run = run_handler(hides, 1)
    assert isinstance(run.error, PermanentError)
    assert "instead of running its body" in str(run.error)


def test_an_async_handler_runs_to_its_end_in_virtual_time() -> None:
    async def fetch(ctx: EventContext) -> str:
        await asyncio.sleep(2.0)
        await ctx.sleep_async(timedelta(seconds=1))
        child = asyncio.create_task(asyncio.sleep(0.5, result="child"))
        ctx.storage.put("fetched", ctx.event)
        ctx.enqueue(await child)
        return "done"

    class Fetcher:
        async def __call__(self, ctx: EventContext) -> None:
            raise Declined(f"no {ctx.event}")

    started = time.monotonic()
    run = run_handler(fetch, "sku-1")
    assert time.monotonic() - started < 1
    run.raise_error()
    assert (run.returned, run.slept) == ("done", 3.5)
    assert run.storage == {"fetched": "sku-1"}
    assert run.follow_ups == [FollowUp(event="child", pool="test")]
    failed = run_handler(Fetcher(), "sku-2")
    assert isinstance(failed.error, Declined)
    assert failed.error.__traceback__ is not None
    assert failed.error.__traceback__.tb_frame.f_code.co_name == "__call__"  # its own frame


def test_an_async_handler_can_be_run_from_a_running_loop_and_ctx_sleep_is_refused() -> None:
    async def blocks(ctx: EventContext) -> None:
        ctx.sleep(1)

    async def main() -> HandlerRun:
        return run_handler(blocks, 1)  # an async test calls it from inside its loop

    run = asyncio.run(main())
    assert isinstance(run.error, ConfigurationError)
    assert "await ctx.sleep_async" in str(run.error)


# -- run_handler: outcomes ------------------------------------------------------------------


class Declined(Exception):
    pass


def failing(ctx: EventContext) -> None:
    ctx.storage.put("written", True)
    ctx.enqueue("follow-up")
    ctx.sleep(3)
    raise Declined(f"card of {ctx.event} declined")


def test_a_raising_handler_is_a_failed_run_that_commits_nothing() -> None:
    run = run_handler(failing, "ada", storage={"kept": 1})
    assert not run.succeeded
    assert isinstance(run.error, Declined)
    assert run.returned is None
    assert run.storage == {"kept": 1}  # its write is discarded, as a failed attempt's
    assert run.follow_ups == []  # and so is its follow-up
    assert run.slept == 3.0
    with pytest.raises(Declined, match="card of ada declined") as raised:
        run.raise_error()
    assert raised.value is run.error
    # The traceback starts at the handler's frame, not run_handler's.
    assert raised.traceback[-1].name == "failing"
    assert all(entry.name != "run_handler" for entry in raised.traceback)


def test_a_handler_that_returns_succeeds_and_raise_error_does_nothing() -> None:
    run = run_handler(lambda ctx: {"answer": 42}, 1)
    assert run.succeeded
    assert run.returned == {"answer": 42}
    run.raise_error()


def test_system_exit_fails_the_run_as_in_a_pool_but_keyboard_interrupt_stops_the_test() -> None:
    def exits(ctx: EventContext) -> None:
        sys.exit(3)

    run = run_handler(exits, 1)
    assert isinstance(run.error, SystemExit)

    def interrupted(ctx: EventContext) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_handler(interrupted, 1)


def test_a_context_kept_after_the_run_refuses_what_would_go_nowhere() -> None:
    kept: list[EventContext] = []

    def keeps(ctx: EventContext) -> None:
        ctx.storage.get("k")
        kept.append(ctx)

    run_handler(keeps, 1)
    with pytest.raises(ConfigurationError, match="after the attempt it belongs to ended"):
        kept[0].enqueue(2)
    with pytest.raises(ConfigurationError, match="after the attempt it belongs to ended"):
        kept[0].sleep(1)
    with pytest.raises(ConfigurationError, match="written after its attempt ended"):
        kept[0].storage.put("k", 1)


# -- run_handler: follow-ups and sleep --------------------------------------------------------


def test_follow_ups_are_recorded_as_they_would_commit() -> None:
    def sends(ctx: EventContext) -> None:
        ctx.enqueue(("again", 1))
        ctx.enqueue({"to": "other"}, pool="receipts", partition_key="ada", priority=2, delay=30)
        ctx.enqueue("later", pool="jobs", not_before=500.0)  # "jobs": its own pool, by name
        ctx.enqueue("soon", delay=timedelta(minutes=1))

    run = run_handler(sends, 1, pool="jobs")
    assert run.follow_ups == [
        FollowUp(event=["again", 1], pool="jobs"),
        FollowUp(event={"to": "other"}, pool="receipts", partition_key="ada", priority=2, delay=30),
        FollowUp(event="later", pool="jobs", not_before=500.0),
        FollowUp(event="soon", pool="jobs", delay=60.0),
    ]


def test_a_worker_pool_names_its_pool_and_anything_else_is_refused_as_the_engine_does() -> None:
    with Runtime.simulated() as rt:
        receipts = rt.define("receipts", execute=noop)
        run = run_handler(lambda ctx: ctx.enqueue(1, pool=receipts), 1)
        assert run.follow_ups == [FollowUp(event=1, pool="receipts")]
    run = run_handler(lambda ctx: ctx.enqueue(1, pool=3), 1)  # type: ignore[arg-type]
    assert isinstance(run.error, ConfigurationError)
    assert "pool must be None, a pool name or a WorkerPool" in str(run.error)
    run = run_handler(lambda ctx: ctx.enqueue(1, pool="bad name"), 1)
    assert isinstance(run.error, ConfigurationError)


@pytest.mark.parametrize(
    ("sending", "error"),
    [
        ({"event": object()}, EventValidationError),
        ({"event": 1, "partition_key": b"k"}, EventValidationError),
        ({"event": 1, "delay": -1}, dopool.ScheduleError),
        ({"event": 1, "delay": 1, "not_before": 2.0}, dopool.ScheduleError),
        ({"event": 1, "not_before": 400 * 86400.0}, dopool.ScheduleError),  # past MAX_DELAY
    ],
    ids=["unencodable", "bad-key", "negative-delay", "both", "too-far"],
)
def test_a_follow_up_is_validated_when_sent_and_fails_the_run(
    sending: dict[str, Any], error: type[Exception]
) -> None:
    run = run_handler(lambda ctx: ctx.enqueue(**sending), 1)
    assert isinstance(run.error, error)
    assert run.follow_ups == []


def test_a_follow_up_into_this_pool_goes_through_its_schema() -> None:
    run = run_handler(lambda ctx: ctx.enqueue("12"), "1", schema=int)
    assert run.follow_ups == [FollowUp(event=12, pool="test")]


def test_sleep_moves_the_virtual_clock_at_once() -> None:
    times: list[float] = []

    def naps(ctx: EventContext) -> None:
        ctx.sleep(1.5)
        ctx.sleep(timedelta(seconds=2))
        ctx.sleep(0)
        ctx.sleep(-4)  # returns at once, as in a pool
        # A not_before is at most MAX_DELAY after the clock's now, which is 3.5 here.
        ctx.enqueue("x", not_before=3.5 + MAX_DELAY)
        times.append(ctx.started_at)

    started = time.monotonic()
    run = run_handler(naps, 1)
    assert time.monotonic() - started < 1
    run.raise_error()
    assert run.slept == 3.5
    assert run.follow_ups == [FollowUp(event="x", pool="test", not_before=3.5 + MAX_DELAY)]
    assert times == [0.0]  # started_at is the attempt's start
    unslept = run_handler(lambda ctx: ctx.enqueue("x", not_before=3.5 + MAX_DELAY), 1)
    assert isinstance(unslept.error, dopool.ScheduleError)


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), -float("inf"), "1"])
def test_a_sleep_no_clock_could_take_fails_the_run(seconds: Any) -> None:
    run = run_handler(lambda ctx: ctx.sleep(seconds), 1)
    assert isinstance(run.error, ConfigurationError)
    assert run.slept == 0.0


def test_a_sleep_past_the_largest_float_fails_the_run() -> None:
    def naps(ctx: EventContext) -> None:
        ctx.sleep(1.7e308)
        ctx.sleep(1.7e308)

    run = run_handler(naps, 1)
    assert isinstance(run.error, ConfigurationError)
    assert "would wake past any clock time" in str(run.error)
    assert run.slept == 1.7e308


# -- run_handler: storage ------------------------------------------------------------------


def test_the_handlers_writes_are_kept_when_it_returns() -> None:
    given = {"a": 1, "b": (2, 3), "c": "gone"}
    listed: list[dict[str, Any]] = []

    def writes(ctx: EventContext) -> None:
        storage = ctx.storage
        storage.put("a", storage.get("a") + 10)
        storage.put_many({"d": [4], "aa": "between"})
        assert storage.delete("c") is True
        assert storage.delete("never") is False
        assert storage.get_many(["b", "c", "d"]) == {"b": [2, 3], "d": [4]}
        listed.append(storage.list())
        listed.append(storage.list(prefix="a", limit=1))
        listed.append(storage.list(start="aa", end="d"))

    run = run_handler(writes, 1, storage=given)
    run.raise_error()
    assert run.storage == {"a": 11, "aa": "between", "b": [2, 3], "d": [4]}
    assert list(run.storage) == ["a", "aa", "b", "d"]  # in key order
    assert listed == [run.storage, {"a": 11}, {"aa": "between", "b": [2, 3]}]
    assert given == {"a": 1, "b": (2, 3), "c": "gone"}  # the mapping given is not changed


def test_the_handlers_writes_are_discarded_when_it_raises() -> None:
    def writes_then_raises(ctx: EventContext) -> None:
        ctx.storage.put("a", 2)
        ctx.storage.delete("b")
        raise Declined

    run = run_handler(writes_then_raises, 1, storage={"a": 1, "b": 1})
    assert isinstance(run.error, Declined)
    assert run.storage == {"a": 1, "b": 1}


def test_a_storage_value_or_key_put_would_refuse_is_refused() -> None:
    with pytest.raises(StorageItemError, match="value"):
        run_handler(noop, 1, storage={"k": object()})
    with pytest.raises(StorageItemError, match="key"):
        run_handler(noop, 1, storage={"k" * 3000: 1})
    run = run_handler(lambda ctx: ctx.storage.put("k", b"x" * (200 * 1024)), 1)
    assert isinstance(run.error, StorageItemError)


def test_a_handler_that_never_touches_storage_returns_what_was_given() -> None:
    assert run_handler(noop, 1).storage == {}
    assert run_handler(noop, 1, storage={"t": (1,)}).storage == {"t": [1]}


def test_run_handler_sees_what_a_pool_of_the_engine_sees(dopool_sim: Runtime) -> None:
    """The same handler and event, once in a simulated runtime and once alone: the same
    context, storage afterwards and follow-up."""
    seen_by: dict[str, list[dict[str, Any]]] = {"pool": [], "alone": []}
    received: list[Any] = []

    def handler(ctx: EventContext, where: str) -> None:
        seen_by[where].append(seen(ctx))
        count = ctx.storage.get("count", 0)
        ctx.storage.put("count", count + 1)
        ctx.storage.put(f"event:{count}", ctx.event)
        ctx.enqueue({"from": ctx.event}, pool="receipts", partition_key="r", priority=4)

    dopool_sim.define("receipts", execute=lambda ctx: received.append(seen(ctx)))
    orders = dopool_sim.define("orders", execute=lambda ctx: handler(ctx, "pool"))
    event = {"id": (1, 2), "total": 9.5}
    orders.enqueue(event, partition_key="k", priority=3)
    assert orders.join(timeout=5)
    assert dopool_sim.pools["receipts"].join(timeout=5)
    run = run_handler(
        lambda ctx: handler(ctx, "alone"), event, pool="orders", partition_key="k", priority=3
    )
    run.raise_error()
    assert seen_by["alone"] == seen_by["pool"]
    assert run.storage == orders.storage(instance=0).list()
    (follow_up,) = run.follow_ups
    assert (follow_up.pool, follow_up.partition_key, follow_up.priority) == ("receipts", "r", 4)
    assert [follow_up.event] == [one["event"] for one in received]


# -- the assert helpers --------------------------------------------------------------------


def raises_with(check: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(AssertionError) as failed:
        check(*args, **kwargs)
    return str(failed.value)


def fails_on_negatives(ctx: EventContext) -> None:
    if ctx.event < 0:
        raise ValueError(f"{ctx.event} is negative")


def test_the_assert_helpers_pass_on_what_the_pool_holds(dopool_sim: Runtime) -> None:
    pool = dopool_sim.define("numbers", execute=fails_on_negatives, concurrency=2)
    apart = next(key for key in "bcdefgh" if stable_hash(key) % 2 != stable_hash("a") % 2)
    pool.enqueue(1, partition_key="a")
    pool.enqueue(-2, partition_key="a")
    pool.enqueue(-3, partition_key=apart)
    assert pool.join(timeout=5)
    index = pool.enqueue(0, partition_key="a").instance_index
    other = 1 - index
    assert_pending(pool, 1)
    assert_pending(pool, 1, index=index)
    assert_pending(pool, 0, index=other)
    assert pool.join(timeout=5)
    assert_pending(pool, 0)
    assert_succeeded(pool, 2)
    assert_succeeded(pool, 2, index=index)
    assert_dead_letters(pool, 2)
    assert_dead_letters(pool, 2, error="negative")
    assert_dead_letters(pool, 1, error="-3 is")
    assert_dead_letters(pool, 1, error=re.compile(r"^ValueError: -2"))
    assert_dead_letters(pool, 1, index=other)
    pool.pause(other)
    assert_paused(pool, other)
    pool.pause()
    assert_paused(pool)
    assert_paused(pool, index)


def test_a_failed_assertion_shows_what_it_found(dopool_sim: Runtime) -> None:
    pool = dopool_sim.define("numbers", execute=fails_on_negatives)
    pool.enqueue(1)
    pool.enqueue(-2)
    assert pool.join(timeout=5)
    pool.pause()
    pool.enqueue(5)
    found = "instances: 0 paused (pending 1, succeeded 1, dead-lettered 1)"
    assert raises_with(assert_pending, pool, 3) == (
        f"pool 'numbers': expected 3 pending, found 1; {found}"
    )
    assert raises_with(assert_pending, pool, 0, index=0) == (
        f"instance numbers:0: expected 0 pending, found 1; {found}"
    )
    assert raises_with(assert_succeeded, pool, 2) == (
        f"pool 'numbers': expected 2 succeeded, found 1; {found}"
    )
    held = "held: instance 0 sequence 1: 'ValueError: -2 is negative'"
    assert raises_with(assert_dead_letters, pool, 0) == (
        f"pool 'numbers': expected 0 dead letter(s), found 1; {held}"
    )
    assert raises_with(assert_dead_letters, pool, 1, error="positive") == (
        f"pool 'numbers': expected 1 dead letter(s) whose error matches 'positive', found 0; {held}"
    )
    message = raises_with(assert_dead_letters, pool, 1, error=re.compile("x+"))
    assert "whose error matches re.compile('x+'), found 0" in message
    pool.resume()
    assert pool.join(timeout=5)
    assert raises_with(assert_paused, pool) == (
        "pool 'numbers' is not paused as a whole; "
        "instances: 0 idle (pending 0, succeeded 2, dead-lettered 1)"
    )
    assert raises_with(assert_paused, pool, 0) == "instance numbers:0 is not paused: it is 'idle'"


def test_a_failed_assertion_lists_ten_instances_or_dead_letters_at_most(
    dopool_sim: Runtime,
) -> None:
    pool = dopool_sim.define("many", execute=fails_on_negatives, concurrency=12)
    pool.enqueue_many([-n for n in range(1, 13)])  # round-robin: one on each instance
    assert pool.join(timeout=5)
    message = raises_with(assert_succeeded, pool, 1)
    assert "; 9 idle" in message
    assert message.endswith("; and 2 more")
    message = raises_with(assert_dead_letters, pool, 0)
    assert message.count("ValueError") == 10
    assert message.endswith("; and 2 more")
    none_used = dopool_sim.define("unused", execute=noop)
    assert raises_with(assert_pending, none_used, 1).endswith("instances: none used")


def test_the_assert_helpers_take_a_producer_pool(tmp_path: Path) -> None:
    with Runtime.simulated(tmp_path / "store") as rt:
        pool = rt.define("jobs", execute=fails_on_negatives)
        pool.enqueue(-1)
        assert pool.join(timeout=5)
        pool.pause()
        pool.enqueue(1)
    with dopool.connect(tmp_path / "store") as connection:
        producer = connection.pool("jobs")
        assert_pending(producer, 1)
        assert_dead_letters(producer, 1, error="negative")
        assert_paused(producer)
        assert "expected 1 succeeded, found 0" in raises_with(assert_succeeded, producer, 1)


# -- the fixtures, as a project gets them ----------------------------------------------------

FIXTURE_TESTS = """
import pytest

from dopool import Runtime, SimulatedClock, RealClock
from dopool.testing import assert_succeeded, run_handler

opened = []


def double(ctx):
    ctx.storage.put("last", ctx.event * 2)


def test_store(dopool_store, tmp_path):
    assert dopool_store.parent == tmp_path
    assert not dopool_store.exists()


def test_sim(dopool_sim, dopool_store):
    assert isinstance(dopool_sim.clock, SimulatedClock)
    assert dopool_sim.path == dopool_store
    assert dopool_sim.seed == 0
    pool = dopool_sim.define("p", execute=lambda ctx: ctx.sleep(60))
    pool.enqueue(1)
    assert pool.join(timeout=5)
    assert dopool_sim.clock.now() == 60.0
    opened.append(dopool_sim)


def test_runtime(dopool_runtime):
    assert isinstance(dopool_runtime.clock, RealClock)
    assert dopool_runtime.durability == "async"
    pool = dopool_runtime.define("p", execute=double)
    pool.enqueue(21)
    assert pool.join(timeout=10)
    assert_succeeded(pool, 1)
    assert pool.storage(instance=0).get("last") == 42
    opened.append(dopool_runtime)


def test_both_runtimes_were_closed_after_their_tests():
    assert [runtime.closed for runtime in opened] == [True, True]


def test_run_handler():
    assert run_handler(double, 4).storage == {"last": 8}
"""

SEED_OVERRIDE = """
import pytest


@pytest.fixture
def dopool_seed():
    return 12345


def test_seed(dopool_sim):
    assert dopool_sim.seed == 12345
"""


@pytest.mark.parametrize("options", [("-p", "dopool.testing"), ()], ids=["-p", "entry-point"])
def test_the_fixtures_work_with_and_without_naming_the_plugin(
    pytester: pytest.Pytester, options: tuple[str, ...]
) -> None:
    """``-p dopool.testing`` finds the plugin already registered by its entry point (no
    "already registered" error), and without it the entry point alone brings the fixtures."""
    pytester.makepyfile(test_fixtures=FIXTURE_TESTS, test_seed=SEED_OVERRIDE)
    result = pytester.runpytest_subprocess(*options, "-W", "error")
    result.assert_outcomes(passed=6)


def test_the_entry_point_is_what_loads_the_plugin(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_fixtures=FIXTURE_TESTS)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    result = pytester.runpytest_subprocess()
    result.stdout.fnmatch_lines(["*fixture 'dopool_store' not found*"])
    result = pytester.runpytest_subprocess("-p", "dopool.testing")
    result.assert_outcomes(passed=5)


def test_the_plugin_names_its_fixtures_apart_from_the_repositorys_own(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest_subprocess("--fixtures")
    listed = set(re.findall(r"^(dopool_\w+)", result.stdout.str(), re.MULTILINE))
    assert listed == {"dopool_store", "dopool_seed", "dopool_sim", "dopool_runtime"}


def docs_example(first_line: str) -> str:
    """The ```python block of docs/api.md's "Worked example" whose first line this is."""
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    section = text.split("\n### Worked example: testing your own handler\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    blocks: list[str] = re.findall(r"^```python\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    (block,) = [block for block in blocks if block.startswith(first_line)]
    return block


def test_the_worked_example_of_the_docs_passes_under_pytest(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        payments=docs_example("from dopool import EventContext"),
        test_payments=docs_example("# test_payments.py: "),
    )
    result = pytester.runpytest_subprocess("-W", "error")
    result.assert_outcomes(passed=4)


def test_dopool_testing_imports_without_pytest() -> None:
    """A user's script may import dopool.testing where pytest is not installed: only the
    fixtures need it."""
    script = (
        "import sys\n"
        "sys.modules['pytest'] = None  # import pytest raises ImportError\n"
        "import dopool.testing as testing\n"
        "assert not hasattr(testing, 'dopool_sim')\n"
        "assert testing.run_handler(lambda ctx: ctx.event, (1,)).returned == [1]\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "ok\n", "")


# -- a fresh project -----------------------------------------------------------------------

FRESH_TEST = """
from dopool import EventContext
from dopool.testing import assert_succeeded, run_handler


def greet(ctx: EventContext) -> None:
    ctx.storage.put("greeted", ctx.event["name"])
    ctx.enqueue({"to": ctx.event["name"]}, pool="mail")


def test_alone() -> None:
    run = run_handler(greet, {"name": "ada"})
    assert run.storage == {"greeted": "ada"}
    assert [follow_up.pool for follow_up in run.follow_ups] == ["mail"]


def test_in_a_pool(dopool_sim) -> None:
    dopool_sim.define("mail", execute=lambda ctx: None)
    pool = dopool_sim.define("greetings", execute=greet)
    pool.enqueue({"name": "ada"})
    assert pool.join(timeout=5)
    assert_succeeded(pool, 1)
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_fresh_project_that_installed_dopool_gets_the_plugin(tmp_path: Path) -> None:
    """``pip install dopool pytest`` (this tree, no extras) into a new venv, and a project
    with one test file and no conftest.py: ``pytest -p dopool.testing`` passes, and so
    does plain ``pytest`` (the entry point). pip reaches the package index: if it cannot,
    the test fails rather than skipping, as the promise is about installing."""
    venv = tmp_path / "venv"
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("PYTEST_", "PYTHON", "VIRTUAL_ENV", "DOPOOL_"))
    }
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)
    python = str(venv / "bin" / "python")
    install = [python, "-m", "pip", "install", "-q", str(ROOT), "pytest"]
    done = subprocess.run(install, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    where = [python, "-c", "import dopool; print(dopool.__file__)"]
    installed = subprocess.run(where, capture_output=True, text=True, env=env, check=True)
    assert installed.stdout.startswith(str(venv))  # a copy in the venv, not this tree
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_greetings.py").write_text(FRESH_TEST, encoding="utf-8")
    for options in (["-p", "dopool.testing"], []):
        run = [python, "-m", "pytest", *options, "-q", "-W", "error", "-p", "no:cacheprovider"]
        done = subprocess.run(
            run, cwd=project, capture_output=True, text=True, env=env, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "2 passed" in done.stdout
    done = subprocess.run(
        [python, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "--fixtures"],
        cwd=project,
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert "fixtures defined from dopool.testing" in done.stdout
