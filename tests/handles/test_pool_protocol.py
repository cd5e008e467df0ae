"""``dopool.Pool``: what a ``WorkerPool`` and a ``ProducerPool`` share, each signature
written the same in both.

mypy (``--strict`` over the tests) checks the assignments to ``Pool`` below; a
signature that is only compatible (a new keyword with a default, another default) is
found by comparing the signatures themselves.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

import dopool
from dopool import EnqueueResult, EventContext, Pool, ProducerPool, Runtime, WorkerPool

MEMBERS = sorted(name for name in vars(Pool) if not name.startswith("_"))
# The awaitable calls, written once in the protocol from the blocking ones.
AWAITABLE = ["cancel_async", "enqueue_async", "enqueue_many_async", "event_async", "status_async"]


def signature(member: Any) -> inspect.Signature:
    """A method's signature, or a property's getter's, its annotations evaluated."""
    function = member.fget if isinstance(member, property) else member
    assert function is not None
    return inspect.signature(function, eval_str=True)


def drifted(handle: type) -> list[str]:
    """The members of :class:`Pool` that ``handle`` leaves to it, or writes otherwise."""
    found = []
    for name in MEMBERS:
        owner = next(cls for cls in handle.__mro__ if name in vars(cls))
        if owner is Pool and name in AWAITABLE:
            continue
        if owner is Pool or signature(vars(owner)[name]) != signature(vars(Pool)[name]):
            found.append(name)
    return found


def public(handle: type) -> set[str]:
    return {name for name in vars(handle) if not name.startswith("_")}


def test_the_protocol_lists_what_both_handles_define() -> None:
    assert (
        sorted(
            [
                *("cancel", "dead_letters", "drain", "enqueue", "enqueue_many", "event", "name"),
                *("pause", "purge_dead_letters", "redrive", "resume", "schedule", "schedules"),
                *("status", "storage", "unschedule"),
                *AWAITABLE,
            ]
        )
        == MEMBERS
    )
    assert public(WorkerPool) & public(ProducerPool) == set(MEMBERS) - set(AWAITABLE)
    for name in AWAITABLE:  # each the blocking call's signature, awaited
        blocking = signature(vars(Pool)[name.removesuffix("_async")])
        assert inspect.iscoroutinefunction(vars(Pool)[name])
        assert signature(vars(Pool)[name]).parameters == blocking.parameters


@pytest.mark.parametrize("handle", [WorkerPool, ProducerPool], ids=lambda cls: cls.__name__)
def test_each_handle_writes_every_shared_signature_as_the_protocol_does(handle: type) -> None:
    assert Pool in handle.__mro__  # (a Protocol refuses issubclass)
    assert drifted(handle) == []


def test_a_drifted_signature_is_found() -> None:
    """A keyword added with a default is still compatible for mypy, but not the same."""

    class Drifted(WorkerPool):
        def drain(self, index: int | None = None, *, force: bool = False) -> int:
            raise NotImplementedError

        def pause(self, index: int | None = 0) -> None:
            raise NotImplementedError

    assert drifted(Drifted) == ["drain", "pause"]


def test_ctx_enqueue_takes_enqueues_keywords_but_dedup_key_and_ttl() -> None:
    """The third enqueue signature: a follow-up has no dedup key or ttl, and names a pool."""
    enqueue = signature(Pool.enqueue).parameters
    follow_up = signature(EventContext.enqueue).parameters
    shared = [parameter for name, parameter in enqueue.items() if name not in ("dedup_key", "ttl")]
    assert [*follow_up.values()] == [*shared, follow_up["pool"]]


def feed(pool: Pool) -> list[EnqueueResult]:
    """Code written once for either handle."""
    return [pool.enqueue("one", partition_key="k"), *pool.enqueue_many(["two", "three"])]


def test_either_handle_is_a_pool(tmp_path: Path) -> None:
    seen: list[Any] = []

    def record(ctx: EventContext) -> None:
        seen.append(ctx.event)

    with Runtime.simulated(tmp_path / "sim") as runtime:
        pool = runtime.define("p", execute=record, concurrency=2)
        worker: Pool = pool
        assert len(feed(worker)) == 3
        assert pool.join(timeout=10)
        assert sorted(seen) == ["one", "three", "two"]
        assert worker.status().succeeded == 3
    with Runtime(tmp_path / "real") as owner:
        owner.define("p", execute=record, concurrency=2)
    with dopool.connect(tmp_path / "real") as connection:
        producer: Pool = connection.pool("p")
        assert len(feed(producer)) == 3
        assert producer.status().pending == 3
