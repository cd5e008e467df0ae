"""User code that raises a BaseException (SystemExit, KeyboardInterrupt...) stops nothing.

pykka answers a non-``Exception`` escaping an actor by stopping every actor in the
process. Hooks and subscribers are isolated from every ``BaseException`` (logged and
ignored), and one that still reaches an instance crashes and restarts that instance
only, as any engine failure does.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from dopool import (
    ConfigurationError,
    EventContext,
    PoolEvent,
    RetryAfter,
    RetryPolicy,
    Runtime,
    WorkerPool,
)
from dopool._errors import MAX_DELAY, MAX_ERROR_TEXT

WAIT = 10.0


def _pools(runtime: Runtime, **hooks: Any) -> tuple[WorkerPool, WorkerPool, list[tuple[str, Any]]]:
    """Pool ``a`` (with ``hooks``, failing the event ``"bad"``) and a plain pool ``b``."""
    ran: list[tuple[str, Any]] = []

    def handler(ctx: EventContext) -> None:
        ran.append((ctx.pool_name, ctx.event))
        if ctx.event == "bad":
            raise ValueError("bad event")

    a = runtime.define("a", execute=handler, **hooks)
    b = runtime.define("b", execute=handler)
    return a, b, ran


def _both_keep_working(a: WorkerPool, b: WorkerPool, ran: list[tuple[str, Any]]) -> None:
    """``b`` processes now, and ``a`` processes a later event."""
    b.enqueue("b1")
    assert b.join(timeout=WAIT)
    a.enqueue("a2")
    assert a.join(timeout=WAIT)
    b.enqueue("b2")
    assert b.join(timeout=WAIT)
    assert ("b", "b1") in ran
    assert ("a", "a2") in ran
    assert ("b", "b2") in ran
    assert b.status().succeeded == 2


def test_a_subscriber_raising_system_exit_stops_nothing(
    sim: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[PoolEvent] = []

    def leave(event: PoolEvent) -> None:
        seen.append(event)
        raise SystemExit(3)

    sim.subscribe(leave)
    a, b, ran = _pools(sim)
    a.enqueue("a1")
    assert a.join(timeout=WAIT)
    _both_keep_working(a, b, ran)
    assert a.status().succeeded == 2
    # Raised on every event, from the caller's thread and from the instances' threads.
    kinds = {event.kind for event in seen}
    assert {"enqueued", "started", "succeeded", "empty"} <= kinds
    assert "subscriber" in caplog.text
    assert "SystemExit" in caplog.text


def test_an_on_dead_letter_raising_keyboard_interrupt_stops_nothing(
    sim: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    dead: list[Any] = []

    def interrupt(letter: Any) -> None:
        dead.append(letter.event)
        raise KeyboardInterrupt

    a, b, ran = _pools(sim, on_dead_letter=interrupt)
    a.enqueue("bad")
    assert a.join(timeout=WAIT)
    assert dead == ["bad"]
    _both_keep_working(a, b, ran)
    status = a.status()
    assert (status.dead_lettered, status.succeeded) == (1, 1)
    assert status.instance(0).restarts == 0  # the hook's error is not the instance's
    assert "on_dead_letter hook raised" in caplog.text


def test_an_on_empty_raising_generator_exit_stops_nothing(
    sim: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    emptied: list[int] = []

    def close_generator(info: Any) -> None:
        emptied.append(info.processed)
        raise GeneratorExit

    a, b, ran = _pools(sim, on_empty=close_generator)
    a.enqueue("a1")
    assert a.join(timeout=WAIT)
    _both_keep_working(a, b, ran)
    assert emptied == [1, 2]
    assert a.status().succeeded == 2
    assert "on_empty hook raised" in caplog.text


class _Unprintable(Exception):
    """A handler failure whose text cannot be built: ``str()`` raises SystemExit."""

    def __str__(self) -> str:
        raise SystemExit("from __str__")


def test_a_base_exception_reaching_an_instance_crashes_only_that_instance(
    sim: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """Recording the failure raises SystemExit inside the outcome's transaction.

    It reaches the instance itself: an engine failure. The instance crashes and
    restarts, and its recovery counts the attempt as interrupted, as after any crash.
    """
    events: list[PoolEvent] = []
    sim.subscribe(events.append)

    def handler(ctx: EventContext) -> None:
        if ctx.event == "unprintable":
            raise _Unprintable

    a = sim.define("a", execute=handler)
    b = sim.define("b", execute=handler)
    a.enqueue("unprintable")
    assert a.join(timeout=WAIT)
    status = a.status()
    assert (status.dead_lettered, status.instance(0).restarts) == (1, 1)
    [letter] = a.dead_letters()
    assert letter.error == "DopoolError: instance crashed during attempt 1"
    crashed = [event for event in events if event.kind == "crashed"]
    assert [event.error for event in crashed] == ["SystemExit: from __str__"]
    b.enqueue("b1")
    assert b.join(timeout=WAIT)
    a.enqueue("a2")
    assert a.join(timeout=WAIT)
    assert (a.status().succeeded, b.status().succeeded) == (1, 1)
    assert "instance a:0 failed handling" in caplog.text


def test_a_schema_raising_system_exit_in_ctx_enqueue_fails_only_the_attempt(
    sim: Runtime,
) -> None:
    def schema(event: Any) -> Any:
        if event == "refused":
            raise SystemExit("no")
        return event

    def handler(ctx: EventContext) -> None:
        if ctx.event == "parent":
            ctx.enqueue("refused")

    a = sim.define("a", execute=handler, schema=schema)
    b = sim.define("b", execute=handler)
    a.enqueue("parent")
    assert a.join(timeout=WAIT)
    [letter] = a.dead_letters()
    assert letter.error == "SystemExit: no"
    b.enqueue("b1")
    assert b.join(timeout=WAIT)
    a.enqueue("a2")
    assert a.join(timeout=WAIT)
    assert (a.status().succeeded, b.status().succeeded) == (1, 1)
    assert a.status().instance(0).restarts == 0


def test_user_code_driving_the_simulated_clock_is_refused_not_wedged(sim: Runtime) -> None:
    """Under the threads backend, a handler, hook or subscriber that drove the clock
    waited for the driver, which waited for it: for ever. Both backends refuse it."""
    refused: list[str] = []

    def drive(who: str) -> None:
        try:
            sim.clock.advance(1)  # type: ignore[attr-defined]
        except RuntimeError as exc:
            refused.append(who if "cannot be driven from a handler" in str(exc) else str(exc))

    def handler(ctx: EventContext) -> None:
        drive("handler")
        if ctx.event == "bad":
            raise ValueError("bad event")

    def subscriber(event: PoolEvent) -> None:
        if event.kind == "enqueued":
            drive(f"subscriber of {event.pool}")

    sim.subscribe(subscriber)
    a = sim.define(
        "a",
        execute=handler,
        on_dead_letter=lambda _: drive("on_dead_letter"),
        on_empty=lambda _: drive("on_empty"),
    )
    a.enqueue("bad")  # its subscriber runs in this thread, for instance a:0
    assert a.join(timeout=WAIT)
    assert refused == ["subscriber of a", "handler", "on_dead_letter", "on_empty"]
    a.enqueue("good")
    assert a.join(timeout=WAIT)
    assert a.status().succeeded == 1
    assert sim.clock.now() == 0.0


def test_a_retry_after_set_to_infinity_by_the_handler_leaves_the_pool_readable(
    sim: Runtime,
) -> None:
    """Its delay was written into the meta record as an infinite alarm, which failed the
    record's checks: status() and every enqueue raised DamagedRecordError for good."""
    attempts: list[float] = []

    def handler(ctx: EventContext) -> None:
        attempts.append(ctx.started_at)
        if ctx.attempt == 1:
            failure = RetryAfter(1)
            failure.seconds = math.inf
            raise failure

    pool = sim.define("p", execute=handler, retry=RetryPolicy(max_attempts=2))
    pool.enqueue("x")
    sim.clock.advance(0)  # type: ignore[attr-defined]
    instance = pool.status().instance(0)
    assert (instance.state, instance.next_alarm_at) == ("backoff", MAX_DELAY)
    assert pool.join(timeout=WAIT)
    assert attempts == [0.0, MAX_DELAY]
    assert pool.status().succeeded == 1


def test_a_context_kept_past_its_attempt_refuses_instead_of_losing_a_follow_up(
    sim: Runtime,
) -> None:
    """ctx.enqueue after the handler returned was accepted and went nowhere (its list
    was committed already), and ctx.sleep there waited under the threads backend for a
    virtual time nobody drove."""
    kept: list[EventContext] = []
    pool = sim.define("p", execute=kept.append)
    pool.enqueue("x")
    assert pool.join(timeout=WAIT)
    [ctx] = kept
    with pytest.raises(ConfigurationError, match=r"ctx\.enqueue called after the attempt"):
        ctx.enqueue("late")
    with pytest.raises(ConfigurationError, match=r"ctx\.sleep called after the attempt"):
        ctx.sleep(1)
    assert pool.join(timeout=WAIT)
    assert pool.status().enqueued == 1


def test_a_huge_failure_text_is_cut_where_it_is_recorded(sim: Runtime) -> None:
    """An exception carrying a 1 MB body was stored whole: in the meta record at the
    retry, in the dead letter, and in each event."""
    seen: list[PoolEvent] = []
    sim.subscribe(seen.append)

    def handler(ctx: EventContext) -> None:
        raise ValueError("x" * 1_000_000)

    pool = sim.define("p", execute=handler, retry=RetryPolicy(max_attempts=2))
    pool.enqueue("big")
    assert pool.join(timeout=WAIT)
    [dead] = pool.dead_letters()
    text = "ValueError: " + "x" * 1_000_000
    cut = f"{text[:MAX_ERROR_TEXT]}... ({len(text) - MAX_ERROR_TEXT} more characters)"
    assert dead.error == cut
    errors = [event.error for event in seen if event.kind in ("retry_scheduled", "dead_lettered")]
    assert errors == [cut, cut]


def test_a_failure_whose_text_is_no_utf8_is_recorded_not_a_crash(sim: Runtime) -> None:
    """A lone surrogate in an exception's text (a file name decoded with surrogateescape,
    say) made the store's encoding raise: the instance crashed at every attempt, and the
    dead letter said only "instance crashed"."""

    def handler(ctx: EventContext) -> None:
        raise ValueError(b"name \xff".decode("utf-8", "surrogateescape"))

    pool = sim.define("p", execute=handler, retry=RetryPolicy(max_attempts=2))
    pool.enqueue("x")
    assert pool.join(timeout=WAIT)
    [dead] = pool.dead_letters()
    assert dead.error == "ValueError: name \\udcff"
    assert pool.status().instance(0).restarts == 0


def test_a_retry_policy_whose_delay_raises_leaves_the_event_its_retries(sim: Runtime) -> None:
    """The policy's delay() raised inside the failure's transaction: the instance crashed,
    its recovery settled the attempt through the same delay() and crashed again, for ever."""

    class Raising(RetryPolicy):
        def delay(self, attempt: int, u: float) -> float:
            raise SystemExit("from delay")

    def handler(ctx: EventContext) -> None:
        if ctx.attempt == 1:
            raise ValueError("first")

    pool = sim.define("p", execute=handler, retry=Raising(initial_delay=2.0, jitter=0.0))
    pool.enqueue("x")
    assert pool.join(timeout=WAIT)
    status = pool.status()
    assert (status.succeeded, status.instance(0).restarts) == (1, 0)
    assert sim.clock.now() == 2.0  # RetryPolicy's own delay
