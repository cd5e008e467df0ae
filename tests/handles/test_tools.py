"""What the tools may do to a runtime beyond the public API (dopool._handles.tools)."""

from __future__ import annotations

import gc
import weakref

import pytest

from dopool import ConfigurationError, EnqueueResult, EventContext, Runtime
from dopool._handles.tools import ToolRuntime
from dopool._machine.invariants import read_instance
from dopool._machine.types import Pause, Resume


def ignore(ctx: EventContext) -> None:
    pass


def test_submit_and_send_return_without_waiting_and_committed_reads_the_outcome() -> None:
    with ToolRuntime.simulated() as runtime:
        pool = runtime.define("p", execute=ignore, concurrency=2)
        paused = runtime.send(pool, 1, Pause())
        index, reply = runtime.submitter(pool)("x", "k", None, None)
        runtime.clock.settle()
        (stored,) = reply.get(timeout=0)
        assert isinstance(stored, EnqueueResult)
        assert stored.instance_index == index
        assert paused.get(timeout=0) is None  # a pause answers nothing
        status = pool.status()
        assert [status.instance(i).state for i in range(2)] == ["idle", "paused"]
        with runtime.committed() as txn:
            state = read_instance(txn, "p", stored.instance_index)
        assert (state.meta.enqueued, state.meta.pending) == (1, 1)
        runtime.send(pool, 1, Resume())
        assert pool.join(timeout=10)


def test_a_submitted_event_keeps_its_dedup_key_and_due_time() -> None:
    with ToolRuntime.simulated() as runtime:
        pool = runtime.define("p", execute=ignore)
        submit = runtime.submitter(pool)
        _, first = submit("x", None, "key", 5.0)
        _, again = submit("y", None, "key", None)
        runtime.clock.settle()
        ((stored,), (duplicate,)) = first.get(timeout=0), again.get(timeout=0)
        assert (stored.duplicate, duplicate.duplicate) == (False, True)
        info = pool.event(stored.event_id)
        assert info is not None
        assert (info.due, info.dedup_key) == (5.0, "key")


def test_send_checks_the_index() -> None:
    with ToolRuntime.simulated() as runtime:
        pool = runtime.define("p", execute=ignore, concurrency=2)
        with pytest.raises(ConfigurationError, match="has no instance 2"):
            runtime.send(pool, 2, Pause())


def test_a_pool_of_another_runtime_is_refused() -> None:
    with ToolRuntime.simulated() as runtime, Runtime.simulated() as other:
        theirs = other.define("p", execute=ignore)
        runtime.define("p", execute=ignore)
        with pytest.raises(ConfigurationError, match="is not a pool of this runtime"):
            runtime.send(theirs, 0, Pause())
        with pytest.raises(ConfigurationError, match="is not a pool of this runtime"):
            runtime.submitter(theirs)


def test_a_closed_runtime_and_its_pools_are_not_kept_alive() -> None:
    """Nothing registers them anywhere: dropped, they are collected."""
    runtime = ToolRuntime.simulated()
    pool = runtime.define("p", execute=ignore)
    gone: list[weakref.ref[object]] = [weakref.ref(runtime), weakref.ref(pool)]
    runtime.close()
    del runtime, pool
    gc.collect()
    assert [ref() for ref in gone] == [None, None]
