"""``Reply``: the one-shot answer a caller waits for while an instance handles its call."""

from __future__ import annotations

import threading

import pytest

from dopool._engine.messages import Reply
from dopool._errors import InstanceCrashedError

TIMEOUT = 10.0


def test_the_answer_reaches_every_get() -> None:
    reply = Reply()
    reply.set([1, 2])

    assert reply.get() == [1, 2]
    assert reply.get(timeout=0) == [1, 2]  # asked again: the same answer, at once


def test_an_error_answer_is_raised_by_get() -> None:
    reply = Reply()
    error = InstanceCrashedError("p:0")

    assert reply.fail(error) is True
    with pytest.raises(InstanceCrashedError) as info:
        reply.get()
    assert info.value is error


def test_a_call_is_answered_once() -> None:
    reply = Reply()
    reply.set("first")

    with pytest.raises(RuntimeError, match="already answered"):
        reply.set("second")
    assert reply.fail(InstanceCrashedError("p:0")) is False  # a late failure changes nothing
    assert reply.get() == "first"


def test_get_without_an_answer_times_out() -> None:
    reply = Reply()

    with pytest.raises(TimeoutError):
        reply.get(timeout=0)
    with pytest.raises(TimeoutError):
        reply.get(timeout=0.01)


def test_get_waits_for_an_answer_from_another_thread() -> None:
    reply = Reply()
    waiting = threading.Event()
    got: list[object] = []

    def caller() -> None:
        waiting.set()
        got.append(reply.get(timeout=TIMEOUT))

    thread = threading.Thread(target=caller)
    thread.start()
    assert waiting.wait(TIMEOUT)
    reply.set("answer")
    thread.join(TIMEOUT)
    assert got == ["answer"]


def _race(reply: Reply, answerers: int) -> list[bool]:
    """``answerers`` threads fail ``reply`` at once; what each was told."""
    start = threading.Barrier(answerers)
    won: list[bool] = []

    def answer(n: int) -> None:
        start.wait()
        won.append(reply.fail(InstanceCrashedError(f"p:{n}")))

    threads = [threading.Thread(target=answer, args=(n,)) for n in range(answerers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    return won


def test_racing_answers_leave_exactly_one() -> None:
    for _ in range(200):
        assert sorted(_race(Reply(), 3)) == [False, False, True]
