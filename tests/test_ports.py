"""What the tools may do beyond the public API (dopool._ports), and nothing more."""

from __future__ import annotations

import gc
import weakref

import pytest

from dopool import ConfigurationError, EnqueueResult, EventContext, Runtime, _ports
from dopool._invariants import read_instance
from dopool._messages import Pause, Resume


def ignore(ctx: EventContext) -> None:
    pass


def test_submit_and_send_return_without_waiting_and_committed_reads_the_outcome() -> None:
    with Runtime.simulated() as runtime:
        pool = runtime.define("p", execute=ignore, concurrency=2)
        paused = _ports.send(pool, 1, Pause)
        index, reply = _ports.submit(pool, "x", "k")
        runtime.clock.settle()
        (stored,) = reply.get(timeout=0)
        assert isinstance(stored, EnqueueResult)
        assert stored.instance_index == index
        assert paused.get(timeout=0) is None  # a pause answers nothing
        assert [i.state for i in pool.status().instances] == ["idle", "paused"]
        with _ports.committed(runtime) as txn:
            state = read_instance(txn, "p", stored.instance_index)
        assert (state.meta.enqueued, state.meta.pending) == (1, 1)
        _ports.send(pool, 1, Resume)
        assert pool.join(timeout=10)


def test_send_checks_the_index() -> None:
    with Runtime.simulated() as runtime:
        pool = runtime.define("p", execute=ignore, concurrency=2)
        with pytest.raises(ConfigurationError, match="has no instance 2"):
            _ports.send(pool, 2, Pause)


def test_a_registration_ends_with_its_runtime_and_pool() -> None:
    runtime = Runtime.simulated()
    pool = runtime.define("p", execute=ignore)
    gone: list[weakref.ref[object]] = [weakref.ref(runtime), weakref.ref(pool)]
    runtime.close()
    del runtime, pool
    gc.collect()
    assert [ref() for ref in gone] == [None, None]
