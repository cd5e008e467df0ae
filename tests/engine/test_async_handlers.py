"""``async def`` handlers (docs/api.md, "Async handlers"): awaited on the real clock's one
loop thread, or on a loop in virtual time under a simulated clock, with the guarantees of a
plain handler: one attempt per instance at a time, retries, dead letters, follow-ups and
storage committed with the outcome, crash recovery; and nothing a handler does to its loop
stops the runtime."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from dopool import (
    ConfigurationError,
    EventContext,
    Middleware,
    Outcome,
    PermanentError,
    RetryAfter,
    RetryPolicy,
    Runtime,
    SimulationStalledError,
)

TIMEOUT = 30.0
RETRY = RetryPolicy(max_attempts=3, initial_delay=1.0, jitter=0.0)


# -- defining ---------------------------------------------------------------------------


def test_define_takes_an_async_def_a_partial_of_one_and_an_object_whose_call_is_one(
    sim: Runtime,
) -> None:
    async def handle(ctx: EventContext, extra: int = 0) -> None:
        pass

    class Handler:
        async def __call__(self, ctx: EventContext) -> None:
            pass

    for name, handler in (("a", handle), ("b", partial(handle, extra=1)), ("c", Handler())):
        pool = sim.define(name, execute=handler)
        pool.enqueue(1)
        assert pool.join(timeout=TIMEOUT)
        assert pool.status().succeeded == 1


def test_define_still_refuses_generator_functions(sim: Runtime) -> None:
    def handle(ctx: EventContext) -> Any:
        yield ctx

    async def handle_async(ctx: EventContext) -> Any:
        yield ctx

    for handler in (handle, handle_async):
        with pytest.raises(ConfigurationError, match="generator function"):
            sim.define("p", execute=handler)


# -- under the simulated clock: virtual time ----------------------------------------------


def test_a_hundred_instances_sleeping_concurrently_take_one_sleep_of_virtual_time(
    sim: Runtime,
) -> None:
    started: list[float] = []
    ended: list[float] = []

    async def handle(ctx: EventContext) -> None:
        started.append(asyncio.get_running_loop().time())
        await asyncio.sleep(5.0)
        await ctx.sleep_async(1.0)
        ended.append(asyncio.get_running_loop().time())

    pool = sim.define("p", execute=handle, concurrency=100)
    pool.enqueue_many(range(100))
    assert pool.join(timeout=TIMEOUT)
    assert pool.status().succeeded == 100
    assert set(started) == {0.0}
    assert set(ended) == {6.0}
    assert sim.clock.now() == 6.0


def _journal_of_a_run(store: Path, backend: str) -> list[tuple[float, int, str]]:
    """What each attempt of a run saw, in order: its clock time, its event, its step."""
    journal: list[tuple[float, int, str]] = []

    async def handle(ctx: EventContext) -> None:
        loop = asyncio.get_running_loop()
        journal.append((loop.time(), ctx.event, f"start {ctx.attempt}"))
        await asyncio.sleep(0.5 + (ctx.event * 7919 % 13) / 10)
        child = asyncio.create_task(asyncio.sleep(0.25, result=ctx.event))
        journal.append((loop.time(), await child, "child"))
        if ctx.event % 5 == 0 and ctx.attempt == 1:
            raise RetryAfter(2.0)
        if ctx.event % 7 == 0:
            ctx.enqueue(ctx.event + 1000)
        journal.append((loop.time(), ctx.event, "end"))

    with Runtime.simulated(store, seed=7, backend=backend) as runtime:
        pool = runtime.define("p", execute=handle, concurrency=8, retry=RETRY)
        pool.enqueue_many(range(40))
        assert pool.join(timeout=TIMEOUT)
    return journal


@pytest.mark.parametrize("backend", ["greenlet", "threads"])
def test_a_simulated_run_of_async_handlers_repeats_exactly(tmp_path: Path, backend: str) -> None:
    first = _journal_of_a_run(tmp_path / "one", backend)
    assert first == _journal_of_a_run(tmp_path / "two", backend)
    # 40 events and 6 follow-ups; 10 of them (a multiple of 5) retried after their child
    assert len(first) == 3 * 46 + 2 * 10


def test_one_attempt_per_instance_at_a_time_while_its_handler_awaits(sim: Runtime) -> None:
    running: dict[int, int] = {}
    most: dict[int, int] = {}

    async def handle(ctx: EventContext) -> None:
        index = ctx.instance_index
        running[index] = running.get(index, 0) + 1
        most[index] = max(most.get(index, 0), running[index])
        await asyncio.sleep(1.0)
        running[index] -= 1

    pool = sim.define("p", execute=handle, concurrency=3)
    pool.enqueue_many(range(30))
    assert pool.join(timeout=TIMEOUT)
    assert most == {0: 1, 1: 1, 2: 1}
    assert sim.clock.now() == 10.0  # ten events an instance, one after another


def test_a_simulated_handler_awaiting_what_never_comes_fails_its_attempt_named(
    sim: Runtime,
) -> None:
    async def handle(ctx: EventContext) -> None:
        await asyncio.get_running_loop().create_future()  # nothing will ever set it

    pool = sim.define("p", execute=handle)
    pool.enqueue(1)
    assert pool.join(timeout=TIMEOUT)
    (dead,) = pool.dead_letters()
    assert "SimulationStalledError" in dead.error
    assert "nothing in virtual time" in dead.error
    assert issubclass(SimulationStalledError, Exception)


def test_a_thread_the_handler_awaits_takes_no_virtual_time(sim: Runtime) -> None:
    times: list[float] = []

    async def handle(ctx: EventContext) -> None:
        await asyncio.sleep(2.0)
        value = await asyncio.to_thread(sum, [1, 2, 3])
        times.append(asyncio.get_running_loop().time())
        assert value == 6

    pool = sim.define("p", execute=handle)
    pool.enqueue(1)
    assert pool.join(timeout=TIMEOUT)
    assert pool.status().succeeded == 1
    assert times == [2.0]


def test_a_simulated_runtime_runs_async_handlers_when_driven_from_a_coroutine(
    store_path: Path,
) -> None:
    async def handle(ctx: EventContext) -> None:
        await asyncio.sleep(3.0)

    async def main() -> tuple[bool, int, float]:
        with Runtime.simulated(store_path, seed=0) as runtime:
            pool = runtime.define("p", execute=handle, concurrency=2)
            await pool.enqueue_many_async([1, 2, 3])
            joined = pool.join(timeout=TIMEOUT)  # drives the clock from inside this loop
            return joined, pool.status().succeeded, runtime.clock.now()

    assert asyncio.run(main()) == (True, 3, 6.0)


# -- what a handler does, under both clocks -----------------------------------------------


@pytest.fixture(params=["real", "greenlet", "threads"])
def runtime(store_path: Path, request: pytest.FixtureRequest) -> Any:
    """A runtime on the real clock, or on a simulated one with each backend."""
    if request.param == "real":
        made = Runtime(store_path, durability="async")
    else:
        made = Runtime.simulated(store_path, seed=0, backend=request.param)
    with made:
        yield made


def test_retries_dead_letters_and_the_handlers_own_traceback(runtime: Runtime) -> None:
    attempts: list[tuple[str, int]] = []

    async def handle(ctx: EventContext) -> None:
        await asyncio.sleep(0)
        attempts.append((ctx.event, ctx.attempt))
        if ctx.event == "flaky" and ctx.attempt == 1:
            raise ValueError("first time")
        if ctx.event == "later" and ctx.attempt == 1:
            raise RetryAfter(0.01)
        if ctx.event == "never":
            raise PermanentError("no")

    pool = runtime.define("p", execute=handle, retry=RETRY)
    for event in ("flaky", "later", "never"):
        pool.enqueue(event)
    assert pool.join(timeout=TIMEOUT)
    expected = [("flaky", 1), ("flaky", 2), ("later", 1), ("later", 2), ("never", 1)]
    assert sorted(attempts) == expected
    (dead,) = pool.dead_letters()
    assert dead.event == "never"
    assert dead.traceback is not None
    frames = [line for line in dead.traceback.splitlines() if line.lstrip().startswith("File")]
    assert len(frames) == 1  # the handler's own frame, none of the engine's
    assert "in handle" in frames[0]


def test_follow_ups_and_storage_commit_with_a_success_and_not_with_a_failure(
    runtime: Runtime,
) -> None:
    async def handle(ctx: EventContext) -> None:
        ctx.storage.put(f"seen-{ctx.event}-{ctx.attempt}", True)
        if ctx.event == "parent":
            ctx.enqueue("child")
            await asyncio.sleep(0.01)
            if ctx.attempt == 1:
                raise ValueError("discard this attempt's writes")

    pool = runtime.define("p", execute=handle, retry=RETRY)
    pool.enqueue("parent")
    assert pool.join(timeout=TIMEOUT)
    stored = pool.storage(instance=0).list()
    assert stored == {"seen-parent-2": True, "seen-child-1": True}
    assert pool.status().succeeded == 2


def test_base_exceptions_fail_the_attempt_and_the_runtime_goes_on(runtime: Runtime) -> None:
    async def handle(ctx: EventContext) -> None:
        if ctx.event == "exit":
            raise SystemExit(3)
        if ctx.event == "interrupt":
            raise KeyboardInterrupt
        if ctx.event == "stray":  # a task of its own raises, out of the loop's run
            asyncio.get_running_loop().call_soon(_interrupt)
            await asyncio.sleep(0.01)

    pool = runtime.define("p", execute=handle)
    pool.enqueue_many(["exit", "interrupt", "stray", "after"])
    assert pool.join(timeout=TIMEOUT)
    errors = sorted(dead.error for dead in pool.dead_letters())
    assert [error.split(":")[0] for error in errors] == ["KeyboardInterrupt", "SystemExit"]
    assert pool.status().succeeded == 2  # "stray" too: its loop went on


def _interrupt() -> None:
    raise KeyboardInterrupt


def test_a_task_left_running_is_cancelled_when_its_attempt_ends(runtime: Runtime) -> None:
    outcomes: list[str] = []
    left: list[asyncio.Task[None]] = []

    async def linger() -> None:
        try:
            await asyncio.sleep(3600)
            outcomes.append("finished")
        except asyncio.CancelledError:
            outcomes.append("cancelled")
            raise

    async def handle(ctx: EventContext) -> None:
        left.append(asyncio.create_task(linger()))
        await asyncio.sleep(0)

    pool = runtime.define("p", execute=handle)
    pool.enqueue(1)
    assert pool.join(timeout=TIMEOUT)
    pool.enqueue(2)  # the loop has run on since: the first one's cancellation is through
    assert pool.join(timeout=TIMEOUT)
    assert left[0].cancelled()
    assert outcomes[0] == "cancelled"


def test_ctx_sleep_is_refused_in_an_async_handler_and_sleep_async_checked(
    runtime: Runtime,
) -> None:
    async def handle(ctx: EventContext) -> None:
        if ctx.event == "blocking":
            ctx.sleep(0.01)
        else:
            await ctx.sleep_async(float("nan"))

    pool = runtime.define("p", execute=handle)
    pool.enqueue_many(["blocking", "nan"])
    assert pool.join(timeout=TIMEOUT)
    errors = sorted(dead.error for dead in pool.dead_letters())
    assert "await ctx.sleep_async" in errors[0]
    assert "ctx.sleep_async needs a finite time" in errors[1]


def test_a_coroutine_returned_unawaited_is_a_permanent_failure(runtime: Runtime) -> None:
    async def inner() -> None:
        pass

    async def handle(ctx: EventContext) -> Any:
        return inner()  # forgot the await

    pool = runtime.define("p", execute=handle, retry=RETRY)
    pool.enqueue(1)
    assert pool.join(timeout=TIMEOUT)
    (dead,) = pool.dead_letters()
    assert dead.attempts == 1
    assert "returned a coroutine" in dead.error


def test_an_async_handler_calling_its_own_instance_is_refused_as_a_plain_ones_is(
    runtime: Runtime,
) -> None:
    errors: list[str] = []

    async def handle(ctx: EventContext) -> None:
        if ctx.event == 0:
            try:
                pool.enqueue(1)  # its own (only) instance: it would wait on itself
            except ConfigurationError as exc:
                errors.append(str(exc))
            other.enqueue("to the other pool")
            await other.enqueue_async("awaited, to the other pool")

    pool = runtime.define("p", execute=handle)
    other = runtime.define("q", execute=handle)
    pool.enqueue(0)
    assert pool.join(timeout=TIMEOUT)
    assert other.join(timeout=TIMEOUT)
    assert len(errors) == 1
    assert "would wait on itself" in errors[0]
    assert other.status().succeeded == 2


def test_middleware_wraps_an_async_attempt(runtime: Runtime) -> None:
    journal: list[str] = []

    class Note(Middleware):
        def before(self, ctx: EventContext) -> None:
            journal.append("before")

        def after(self, ctx: EventContext, outcome: Outcome) -> None:
            journal.append(f"after {outcome.state}")

    async def handle(ctx: EventContext) -> None:
        await asyncio.sleep(0)
        journal.append("handler")

    pool = runtime.define("p", execute=handle, middleware=[Note()])
    pool.enqueue(1)
    assert pool.join(timeout=TIMEOUT)
    assert journal == ["before", "handler", "after succeeded"]


def test_a_kill_from_inside_an_async_handler_is_recovered_as_a_plain_ones_is(
    runtime: Runtime,
) -> None:
    attempts: list[int] = []

    async def handle(ctx: EventContext) -> None:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            runtime.kill("p", ctx.instance_index)
        await asyncio.sleep(0.01)

    pool = runtime.define("p", execute=handle, retry=RETRY)
    pool.enqueue(1)
    assert pool.join(timeout=TIMEOUT)
    assert attempts == [1, 2]
    assert pool.status().succeeded == 1


# -- under the real clock: one loop for the runtime ---------------------------------------


def test_real_clock_handlers_of_many_instances_await_at_once_on_one_loop(
    store_path: Path,
) -> None:
    count = 50
    arrived: list[int] = []
    loops: set[int] = set()
    threads: set[str] = set()
    everyone: asyncio.Event | None = None

    async def handle(ctx: EventContext) -> None:
        nonlocal everyone
        loops.add(id(asyncio.get_running_loop()))
        threads.add(threading.current_thread().name)
        if everyone is None:
            everyone = asyncio.Event()
        arrived.append(ctx.event)
        if len(arrived) == count:
            everyone.set()
        # Each waits for all the others to have started: only concurrent awaits pass.
        await asyncio.wait_for(everyone.wait(), timeout=TIMEOUT)

    with Runtime(store_path, durability="async") as runtime:
        pool = runtime.define("p", execute=handle, concurrency=count)
        pool.enqueue_many(range(count))
        assert pool.join(timeout=TIMEOUT)
        assert pool.status().succeeded == count
    assert len(loops) == 1
    assert threads == {"dopool-asyncio"}


def test_closing_with_an_async_handler_that_never_returns_lets_the_process_exit(
    tmp_path: Path,
) -> None:
    script = textwrap.dedent(
        f"""
        import asyncio, threading
        from dopool import Runtime

        started = threading.Event()

        async def handle(ctx):
            started.set()
            await asyncio.Event().wait()  # never set

        runtime = Runtime({str(tmp_path / "store")!r})
        pool = runtime.define("p", execute=handle)
        pool.enqueue(1)
        assert started.wait(30)
        runtime.close(timeout=0.2)
        print("closed")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "closed"
