"""The turn: an instance's first-come, first-served lock, shared by its actor and callers.

A waiter is known to be queued when the turn's waiter queue grows: the queue is
swapped for one that signals each arrival, so no test depends on thread timing.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import pytest

from dopool._clock.turn import Turn

pytestmark = pytest.mark.threaded

TIMEOUT = 10.0


class _SignallingQueue(list[Any]):
    """A waiter queue that wakes whoever waits for it to reach a length."""

    def __init__(self) -> None:
        super().__init__()
        self.grew = threading.Condition()

    def append(self, item: Any) -> None:
        with self.grew:
            super().append(item)
            self.grew.notify_all()

    def wait_for_length(self, length: int) -> None:
        with self.grew:
            assert self.grew.wait_for(lambda: len(self) >= length, TIMEOUT), (
                f"{len(self)} of {length} waiters queued"
            )


@pytest.fixture
def turn() -> Turn:
    turn = Turn()
    turn._waiters = _SignallingQueue()
    return turn


def queued(turn: Turn) -> _SignallingQueue:
    waiters = turn._waiters
    assert isinstance(waiters, _SignallingQueue)
    return waiters


def start(target: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def finish(*threads: threading.Thread) -> None:
    for thread in threads:
        thread.join(TIMEOUT)
        assert not thread.is_alive()


def test_a_free_turn_is_taken_at_once_by_either_method(turn: Turn) -> None:
    turn.acquire()
    turn.release()
    assert turn.try_acquire()
    turn.release()
    assert turn.try_acquire()  # released means free again
    turn.release()


def test_try_acquire_fails_while_the_turn_is_held(turn: Turn) -> None:
    turn.acquire()
    assert not turn.try_acquire()
    assert not turn.try_acquire()  # a failed try takes nothing and queues nothing
    assert not turn.contended()
    turn.release()
    assert turn.try_acquire()
    turn.release()


def test_the_context_manager_holds_the_turn_for_its_block(turn: Turn) -> None:
    with turn:
        assert not turn.try_acquire()
    assert turn.try_acquire()
    turn.release()


def test_the_context_manager_releases_on_an_exception(turn: Turn) -> None:
    with pytest.raises(RuntimeError), turn:
        raise RuntimeError("inside the turn")
    assert turn.try_acquire()
    turn.release()


def test_try_acquire_from_another_thread_fails_while_held(turn: Turn) -> None:
    turn.acquire()
    got: list[bool] = []
    finish(start(lambda: got.append(turn.try_acquire())))
    assert got == [False]
    turn.release()
    finish(start(lambda: got.append(turn.try_acquire())))
    assert got == [False, True]


def test_waiters_get_the_turn_in_the_order_they_asked(turn: Turn) -> None:
    order: list[int] = []

    def waiter(number: int) -> Callable[[], None]:
        def run() -> None:
            with turn:
                order.append(number)

        return run

    turn.acquire()
    threads = []
    for number in range(6):
        threads.append(start(waiter(number)))
        queued(turn).wait_for_length(number + 1)  # this one waits before the next asks
    turn.release()
    finish(*threads)

    assert order == list(range(6))
    assert turn.try_acquire()
    turn.release()


def test_release_hands_the_turn_to_the_waiter_not_to_a_barging_try(turn: Turn) -> None:
    has_it, let_go = threading.Event(), threading.Event()

    def waiter() -> None:
        with turn:
            has_it.set()
            assert let_go.wait(TIMEOUT)

    turn.acquire()
    thread = start(waiter)
    queued(turn).wait_for_length(1)
    turn.release()

    assert not turn.try_acquire()  # still held: by the waiter, even before it wakes
    assert has_it.wait(TIMEOUT)
    assert not turn.try_acquire()
    let_go.set()
    finish(thread)
    assert turn.try_acquire()
    turn.release()


def test_a_releaser_that_asks_again_queues_behind_the_waiter(turn: Turn) -> None:
    order: list[str] = []

    def waiter() -> None:
        with turn:
            order.append("waiter")

    turn.acquire()
    thread = start(waiter)
    queued(turn).wait_for_length(1)
    turn.release()
    with turn:
        order.append("releaser")
    finish(thread)

    assert order == ["waiter", "releaser"]


def test_contended_says_whether_anyone_waits(turn: Turn) -> None:
    assert not turn.contended()
    turn.acquire()
    assert not turn.contended()  # held, but nobody waits

    release_first, release_second = threading.Event(), threading.Event()

    def waiter(release: threading.Event) -> Callable[[], None]:
        def run() -> None:
            with turn:
                assert release.wait(TIMEOUT)

        return run

    first = start(waiter(release_first))
    queued(turn).wait_for_length(1)
    assert turn.contended()
    second = start(waiter(release_second))
    queued(turn).wait_for_length(2)
    assert turn.contended()

    turn.release()  # to the first; the second still waits
    assert turn.contended()
    release_first.set()
    finish(first)  # to the second; nobody waits now
    assert not turn.contended()
    assert not turn.try_acquire()
    release_second.set()
    finish(second)
    assert not turn.contended()
    assert turn.try_acquire()
    turn.release()


def test_the_turn_excludes_concurrent_holders(turn: Turn) -> None:
    threads, rounds = 8, 300
    holders: list[int] = []
    overlaps: list[int] = []
    total = [0]

    def worker() -> None:
        for n in range(rounds):
            if n % 2:
                turn.acquire()
            elif not turn.try_acquire():
                continue
            try:
                holders.append(1)
                if len(holders) > 1:
                    overlaps.append(len(holders))
                value = total[0]
                if n % 50 == 0:
                    os.sched_yield()  # let another thread run while this one holds the turn
                total[0] = value + 1
                holders.pop()
            finally:
                turn.release()

    finish(*[start(worker) for _ in range(threads)])

    assert overlaps == []
    acquired = threads * (rounds // 2)
    assert acquired <= total[0] <= threads * rounds
    assert turn.try_acquire()
    turn.release()
