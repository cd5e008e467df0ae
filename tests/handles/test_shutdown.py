"""Closing a runtime: refused from its own instances, and done for it at interpreter exit."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import dopool._handles.runtime
from dopool import (
    ConfigurationError,
    EventContext,
    PoolClosedError,
    PoolEvent,
    RealClock,
    RetryPolicy,
    Runtime,
    SimulatedClock,
    StorageError,
)
from dopool._engine.actor import running_instances
from dopool._engine.closing import wait_until
from dopool._engine.pool_context import PoolContext
from dopool._engine.wait_graph import WaitGraph
from worker_support import until

WAIT = 10.0


# -- close() from an instance's own thread -----------------------------------------


@pytest.mark.parametrize("caller", ["execute", "on_dead_letter", "on_empty", "subscriber"])
def test_close_from_an_instance_thread_is_refused_naming_the_instance(
    sim: Runtime, caller: str
) -> None:
    """It would wait for that instance to stop, and the instance for it: refused instead."""
    refused: list[ConfigurationError] = []

    def close(*_args: Any) -> None:
        try:
            sim.close()
        except ConfigurationError as exc:
            refused.append(exc)

    def handler(ctx: EventContext) -> None:
        if caller == "execute":
            close()
        raise ValueError("dead-letter it")

    def on_started(event: PoolEvent) -> None:
        if event.kind == "started":
            close()

    if caller == "subscriber":
        sim.subscribe(on_started)
    hooks: dict[str, Any] = {caller: close} if caller.startswith("on_") else {}
    pool = sim.define("p", execute=handler, concurrency=2, **hooks)
    pool.enqueue("x", partition_key="k")
    assert pool.join(timeout=WAIT)
    assert len(refused) == 1
    index = pool.dead_letters()[0].instance_index
    assert f"p:{index}" in str(refused[0])
    assert "close()" in str(refused[0])
    assert not sim.closed
    pool.enqueue("y")  # the runtime still works
    assert pool.join(timeout=WAIT)
    assert pool.status().dead_lettered == 2


# -- what a closing runtime still does ------------------------------------------------


@pytest.mark.parametrize("backend", ["greenlet", "threads"])
def test_a_closing_runtime_starts_nothing_for_an_alarm_queued_behind_a_handler(
    store_path: Path, backend: str
) -> None:
    """The running handler finishes; the alarm waiting in the inbox starts nothing.

    Found by ``dopool chaos --seed 1882``: the alarm started the next event during
    close(), whose handler then met a closed runtime.
    """
    started: list[str] = []

    def handler(ctx: EventContext) -> None:
        started.append(ctx.event)
        ctx.sleep(5)

    runtime = Runtime.simulated(store_path, seed=0, backend=backend)
    pool = runtime.define("p", execute=handler)
    pool.enqueue("a")
    pool.enqueue("b")
    clock = runtime.clock
    assert isinstance(clock, SimulatedClock)
    clock.advance(0)  # "a" starts, and sleeps until t=5
    assert started == ["a"]
    pool._instances.cells[0].mailbox.fire_alarm()  # an alarm now waits behind the sleeping handler
    runtime.close()  # drives the clock until "a" finishes
    assert started == ["a"]
    with Runtime.simulated(store_path, seed=0, backend=backend) as again:
        reopened = again.define("p", execute=handler)
        status = reopened.status()
        assert (status.succeeded, status.pending) == (1, 1)  # "b" waits, stored
        assert reopened.join(timeout=WAIT)
    assert started == ["a", "b"]


@pytest.mark.parametrize("timeout", [None, WAIT * 3])
def test_a_join_waiting_while_another_thread_closes_raises_pool_closed(
    store_path: Path, monkeypatch: pytest.MonkeyPatch, timeout: float | None
) -> None:
    """A join waiting on a paused pool, and the runtime closed by another thread.

    Without a timeout it waited for ever (nothing an actor does wakes it once the
    runtime is closed); with one, it waited all of it, then raised a StorageError
    ('read failed: Attempt to operate on closed/deleted/dropped object') from
    reading the closed store. Now it raises PoolClosedError as soon as the runtime
    closes.
    """
    runtime = Runtime(store_path)
    pool = runtime.define("p", execute=lambda ctx: None)
    pool.pause()
    pool.enqueue("held")
    waiting = threading.Event()
    progress = runtime.clock.progress

    def seam(generation: int, deadline: float | None) -> bool:
        waiting.set()  # the join reads nothing new until the activity changes
        return progress(generation, deadline)

    monkeypatch.setattr(runtime.clock, "progress", seam)
    outcome: list[BaseException | bool] = []

    def join() -> None:
        try:
            outcome.append(pool.join(timeout=timeout))
        except BaseException as exc:
            outcome.append(exc)

    joiner = threading.Thread(target=join, daemon=True)
    joiner.start()
    assert waiting.wait(WAIT)
    runtime.close()
    joiner.join(WAIT)
    assert not joiner.is_alive(), "join() still waits on a closed runtime"
    assert len(outcome) == 1
    assert isinstance(outcome[0], PoolClosedError), outcome
    assert outcome[0].pool == "p"


def test_a_second_close_waits_for_the_close_another_thread_began(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It returned at once, with the actors still stopping and the store still locked:
    a thread that closed the runtime and opened the store again got StoreLockedError."""
    started, release = threading.Event(), threading.Event()

    def handler(ctx: EventContext) -> None:
        started.set()
        release.wait(WAIT)

    runtime = Runtime(store_path)
    runtime.define("p", execute=handler).enqueue("x")
    assert started.wait(WAIT)
    first = threading.Thread(target=runtime.close, daemon=True)
    first.start()  # it waits for the handler
    until(lambda: runtime.closed, "the first close to begin")

    def seam(done: threading.Event, deadline: float | None) -> bool:
        release.set()  # the second close waits: let the handler return now
        return wait_until(done, deadline)

    monkeypatch.setattr(dopool._handles.runtime, "wait_until", seam)
    try:
        runtime.close()
        assert _released(store_path)
        with Runtime(store_path) as again:
            status = again.define("p", execute=lambda ctx: None).status()
        assert (status.enqueued, status.succeeded) == (1, 1)
    finally:
        release.set()
        first.join(WAIT)
    assert not first.is_alive()


def test_a_read_the_closing_store_fails_is_pool_closed_not_a_storage_error() -> None:
    """A pool's read (status, event, dead_letters, schedules, join) that another
    thread's close() fails under it names the close, not the store's failure."""
    closed, closing = [False], [True]

    @contextmanager
    def read() -> Iterator[Any]:
        closed[0] = closing[0]  # the close lands while the read runs
        if closed[0] or not closing[0]:
            raise StorageError("read failed: Attempt to operate on closed/deleted/dropped object.")
        yield None

    context = PoolContext(
        read=read,
        clock=RealClock(),
        in_handler=threading.local(),
        waits=WaitGraph(),
        closed=lambda: closed[0],
        handler_running=lambda: None,
    )
    try:
        with pytest.raises(PoolClosedError) as caught, context.read_open("p"):
            pass
        assert caught.value.pool == "p"
        with pytest.raises(PoolClosedError), context.read_open("p"):  # closed before it
            pass
        closed[0] = closing[0] = False
        with pytest.raises(StorageError), context.read_open("p"):  # open: the store's own
            pass
    finally:
        context.clock.close()


# -- interpreter exit ------------------------------------------------------------------
#
# Each test runs a script in a child interpreter and waits for it to exit on its own.

EXIT_TIMEOUT = 60.0  # wall seconds a child may take before the test fails


def _run(script: str, *args: object, cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run ``script`` with ``args``; it must exit by itself, with status 0. Returns stderr."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=EXIT_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stderr


def _released(store: Path) -> bool:
    """Whether the runtime that held ``store`` was closed (closing empties the lock file)."""
    return (store / "lock").read_text() == ""


def test_a_hook_run_by_a_recovery_during_define_may_use_the_runtime(tmp_path: Path) -> None:
    """``define`` holds the runtime's lock while the pool's instances recover; a hook or
    subscriber that a recovery runs (the dead letter of an attempt a close abandoned,
    here) and that read ``runtime.pools`` or called ``runtime.kill`` waited for that
    lock on the instance's thread, and ``define`` for the recovery: for ever. Run in a
    child, which the test's timeout ends if it hangs."""
    _run(
        """
        import sys
        import threading

        from dopool import Runtime

        started, release = threading.Event(), threading.Event()

        def stuck(ctx):
            started.set()
            release.wait()

        runtime = Runtime(sys.argv[1])
        runtime.define("p", execute=stuck).enqueue("x")
        assert started.wait(30)
        runtime.close(timeout=0)  # the attempt is abandoned: the next define settles it
        release.set()

        runtime = Runtime(sys.argv[1])
        other = runtime.define("q", execute=lambda ctx: None)
        seen = []

        def on_dead_letter(letter):
            seen.append(list(runtime.pools))
            runtime.kill("q", 0)

        runtime.subscribe(lambda event: seen.append((event.kind, len(runtime.pools))))
        pool = runtime.define("p", execute=stuck, on_dead_letter=on_dead_letter)
        assert ["q"] in seen and ("dead_lettered", 1) in seen, seen
        assert pool.status().dead_lettered == 1
        assert other.join(timeout=30)
        assert other.status().instance(0).restarts == 1
        runtime.close()
        """,
        tmp_path / "store",
        cwd=tmp_path,
    )


def test_the_default_runtime_does_not_keep_the_interpreter_alive(tmp_path: Path) -> None:
    _run(
        """
        from dopool import WorkerPool

        pool = WorkerPool.define("p", execute=lambda ctx: print("ran", ctx.event))
        pool.enqueue("x")
        assert pool.join(timeout=10)
        """,
        cwd=tmp_path,
        env={"DOPOOL_PATH": "store"},
    )
    store = tmp_path / "store"
    assert _released(store)
    with Runtime(store) as runtime:
        status = runtime.define("p", execute=lambda ctx: None).status()
    assert (status.succeeded, status.pending) == (1, 0)


def test_a_close_under_way_in_a_daemon_thread_at_exit_is_let_finish(tmp_path: Path) -> None:
    """A runtime another (daemon) thread was closing as the interpreter exited was no
    longer among those the exit closes, so the exit did not wait for it: the process
    ended with its running handler abandoned, without the grace period or a warning,
    and the store's lock file still naming the dead process. The exit now lets that
    close finish, within the same grace."""
    store = tmp_path / "store"
    _run(
        """
        import atexit
        import sys
        import threading
        import time

        from dopool import Runtime

        runtime = Runtime(sys.argv[1])
        exiting = threading.Event()
        atexit.register(exiting.set)  # runs before dopool's hook: last in, first out
        started = threading.Event()

        def handler(ctx):
            started.set()
            exiting.wait(30)
            time.sleep(0.2)  # still busy as the interpreter exits

        runtime.define("p", execute=handler).enqueue("x")
        assert started.wait(30)
        threading.Thread(target=runtime.close, daemon=True).start()
        pause = threading.Event()
        while not runtime.closed:
            pause.wait(0.01)
        """,
        store,
        cwd=tmp_path,
    )
    assert _released(store)
    with Runtime(store) as runtime:
        status = runtime.define("p", execute=lambda ctx: None).status()
    assert (status.succeeded, status.pending, status.dead_lettered) == (1, 0, 0)


def test_runtimes_left_open_are_closed_at_exit(tmp_path: Path) -> None:
    store, temporary = tmp_path / "store", tmp_path / "temporary.txt"
    _run(
        """
        import sys
        from pathlib import Path

        from dopool import Runtime

        runtime = Runtime(sys.argv[1])
        pool = runtime.define("p", execute=lambda ctx: None)
        pool.pause()
        pool.enqueue("kept")
        simulated = Runtime.simulated()
        simulated.define("q", execute=lambda ctx: None).enqueue("dropped with the directory")
        Path(sys.argv[2]).write_text(str(simulated.path))
        """,
        store,
        temporary,
        cwd=tmp_path,
    )
    assert _released(store)
    assert not Path(temporary.read_text()).exists()  # removed by the simulated one's close
    with Runtime(store) as runtime:
        pool = runtime.define("p", execute=lambda ctx: None)
        assert pool.status().pending == 1
        pool.resume()
        assert pool.join(timeout=WAIT)
        assert pool.status().succeeded == 1


def test_a_running_handler_gets_the_grace_period_to_finish(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _run(
        """
        import sys
        import threading

        from dopool import Runtime

        started = threading.Event()

        def handler(ctx):
            started.set()
            ctx.sleep(0.5)  # work that outlasts the script, well within the grace period

        pool = Runtime(sys.argv[1]).define("p", execute=handler)
        pool.enqueue("slow")
        assert started.wait(10)
        """,
        store,
        cwd=tmp_path,
    )
    assert _released(store)
    with Runtime(store) as runtime:
        instance = runtime.define("p", execute=lambda ctx: None).status().instance(0)
    assert (instance.succeeded, instance.pending, instance.attempt) == (1, 0, 0)


@pytest.mark.parametrize("max_attempts", [1, 3])
def test_a_handler_that_never_returns_is_abandoned_at_exit(
    tmp_path: Path, max_attempts: int
) -> None:
    """After the grace period the process exits; the attempt counts as interrupted."""
    store = tmp_path / "store"
    stderr = _run(
        """
        import sys
        import threading

        import dopool._handles.runtime
        from dopool import RetryPolicy, Runtime

        dopool._handles.runtime.EXIT_GRACE = 0.5  # the default is longer: this test need not wait
        started = threading.Event()

        def handler(ctx):
            started.set()
            threading.Event().wait()  # never set

        retry = RetryPolicy(max_attempts=int(sys.argv[2]), initial_delay=0.01, jitter=0)
        pool = Runtime(sys.argv[1]).define("p", execute=handler, retry=retry)
        pool.enqueue("stuck")
        assert started.wait(10)
        """,
        store,
        max_attempts,
        cwd=tmp_path,
    )
    assert "p:0" in stderr
    assert "abandoned" in stderr
    assert _released(store)

    events: list[PoolEvent] = []
    attempts: list[int] = []
    interrupted = "DopoolError: instance crashed during attempt 1"
    with Runtime(store) as runtime:
        runtime.subscribe(events.append)
        retry = RetryPolicy(max_attempts=max_attempts, initial_delay=0.01, jitter=0)
        pool = runtime.define("p", execute=lambda ctx: attempts.append(ctx.attempt), retry=retry)
        assert pool.join(timeout=WAIT)
        status = pool.status()
        dead = pool.dead_letters()
    assert status.instance(0).restarts == 0  # reopening is not a restart
    if max_attempts == 1:
        assert [(d.event, d.attempts, d.error) for d in dead] == [("stuck", 1, interrupted)]
        assert (status.dead_lettered, status.succeeded, attempts) == (1, 0, [])
    else:
        retried = [(e.kind, e.attempt, e.error) for e in events if e.kind == "retry_scheduled"]
        assert retried == [("retry_scheduled", 1, interrupted)]
        assert (status.dead_lettered, status.succeeded, attempts) == (0, 1, [2])


def test_a_simulated_handler_that_never_returns_is_abandoned_at_exit(tmp_path: Path) -> None:
    """Under the threads backend, with the clock driven from another thread that waits
    for the handler: the exit's close waited for the right to drive, for ever."""
    store = tmp_path / "store"
    stderr = _run(
        """
        import sys
        import threading

        import dopool._handles.runtime
        from dopool import Runtime

        dopool._handles.runtime.EXIT_GRACE = 0.5  # the default is longer: this test need not wait
        started = threading.Event()

        def handler(ctx):
            started.set()
            threading.Event().wait()  # never set

        runtime = Runtime.simulated(sys.argv[1], backend="threads")
        runtime.define("p", execute=handler).enqueue("stuck")
        threading.Thread(target=runtime.clock.run_until_idle, daemon=True).start()
        assert started.wait(10)
        """,
        store,
        cwd=tmp_path,
    )
    assert "p:0" in stderr
    assert "abandoned" in stderr
    assert _released(store)


def test_close_with_a_timeout_abandons_a_handler_that_does_not_return(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """close() waited for ever for such a handler, with no way to bound it."""
    store = tmp_path / "store"
    started, release = threading.Event(), threading.Event()

    def handler(ctx: EventContext) -> None:
        started.set()
        release.wait()

    runtime = Runtime(store)
    try:
        runtime.define("p", execute=handler).enqueue("stuck")
        assert started.wait(WAIT)
        for bad in (-1, math.nan, math.inf, "1", True):
            with pytest.raises(ConfigurationError, match="timeout must be"):
                runtime.close(timeout=bad)  # type: ignore[arg-type]
        assert list(runtime.pools) == ["p"]  # still open
        runtime.close(timeout=0.2)
        assert runtime.closed
        assert _released(store)
        assert "p:0 still running after the grace period" in caplog.text
    finally:
        release.set()  # its outcome finds the store closed, and the actor stops
        until(lambda: not running_instances(), "the abandoned actor to stop")


def test_an_abandoned_handler_returning_after_the_store_closed_commits_nothing(
    tmp_path: Path,
) -> None:
    """Its outcome is refused by the closed store: the instance crashes, the process exits,
    and no traceback is printed for it."""
    store = tmp_path / "store"
    stderr = _run(
        """
        import atexit
        import sys
        import threading

        release, crashed = threading.Event(), threading.Event()

        def after_dopool_closed():  # registered first, so it runs after dopool's hook
            release.set()
            assert crashed.wait(10)
            print("outcome refused", file=sys.stderr)

        atexit.register(after_dopool_closed)

        import dopool._handles.runtime
        from dopool import Runtime

        dopool._handles.runtime.EXIT_GRACE = 0.5
        started = threading.Event()

        def handler(ctx):
            started.set()
            release.wait()

        def watch(event):
            if event.kind == "crashed":
                print("crashed:", event.error, file=sys.stderr)
                crashed.set()

        runtime = Runtime(sys.argv[1])
        runtime.subscribe(watch)
        pool = runtime.define("p", execute=handler)
        pool.enqueue("late")
        assert started.wait(10)
        """,
        store,
        cwd=tmp_path,
    )
    assert "crashed: StoreClosedError: the store is closed" in stderr
    assert "outcome refused" in stderr
    assert "Traceback" not in stderr  # the abandonment was logged: no engine failure
    with Runtime(store) as runtime:
        pool = runtime.define("p", execute=lambda ctx: None)
        [letter] = pool.dead_letters()
    assert letter.event == "late"
    assert letter.error == "DopoolError: instance crashed during attempt 1"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_runtime_made_before_a_fork_refuses_the_child(tmp_path: Path) -> None:
    # The child's enqueue went through the parent's LMDB environment, behind the parent's
    # back (its next event never ran), and the child's close() waited for ever for
    # actors that only the parent has.
    store = tmp_path / "store"
    _run(
        """
        import os
        import sys

        import dopool
        from dopool import Runtime

        runtime = Runtime(sys.argv[1])
        pool = runtime.define("p", execute=lambda ctx: None)
        child = os.fork()
        if child == 0:
            code = 0
            again = lambda: dopool.connect(sys.argv[1])
            for call in (lambda: pool.enqueue("child"), pool.status, again):
                try:
                    call()
                    code = 3
                except dopool.ConfigurationError as exc:
                    if "before a fork" not in str(exc) or "connect" not in str(exc):
                        code = 4
            runtime.close()  # returns at once: the store and actors are the parent's
            os._exit(code)
        assert os.waitpid(child, 0)[1] == 0
        pool.enqueue("after the fork")
        assert pool.join(timeout=10)
        assert pool.status().succeeded == 1
        runtime.close()
        """,
        store,
        cwd=tmp_path,
        env={"PYTHONPATH": os.pathsep.join(sys.path)},
    )


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_exiting_leaves_the_parents_runtime_alone(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _run(
        """
        import os
        import sys
        from pathlib import Path

        from dopool import Runtime

        pool = Runtime(sys.argv[1]).define("p", execute=lambda ctx: None)
        child = os.fork()
        if child == 0:
            sys.exit(0)  # runs the atexit hooks inherited from the parent
        assert os.waitpid(child, 0)[1] == 0
        assert Path(sys.argv[1], "lock").read_text().startswith(f"pid {os.getpid()} ")
        pool.enqueue("after the fork")
        assert pool.join(timeout=10)
        """,
        store,
        cwd=tmp_path,
    )
    with Runtime(store) as runtime:
        assert runtime.define("p", execute=lambda ctx: None).status().succeeded == 1


def test_an_event_emitted_as_a_close_ends_the_trace_is_not_written(tmp_path: Path) -> None:
    """An actor abandoned by a close may commit (and emit) while the close ends the trace:
    the emit saw a trace, then found None where it wrote (AttributeError)."""
    trace = tmp_path / "trace.jsonl"
    runtime = Runtime.simulated(tmp_path / "store", trace=trace)

    class CloseWinsTheRace:  # the emit lock, taken just after the close's own
        def __enter__(self) -> None:
            assert runtime._trace is not None
            runtime._trace.close()
            runtime._trace = None

        def __exit__(self, *exc: object) -> None:
            pass

    runtime._emit_lock = CloseWinsTheRace()  # type: ignore[assignment]
    runtime._emit(PoolEvent("enqueued", "p", 0, 0))
    runtime._emit_lock = threading.Lock()
    runtime.close()
    assert trace.read_text() == ""
