"""A follow-up that goes missing on its way to another instance is asked for again.

A target takes links from a source in order; one that arrives early (an earlier link was
dropped on the way, as by an address closing under the send) is neither stored nor
acknowledged. The target then asks the source, once, to deliver its outbox's follow-ups
for it again (``Redeliver``), and takes them in order. Simulated: the drop is planted.
"""

from __future__ import annotations

from typing import Any

import pytest

from dopool import EventContext, Runtime
from dopool._cluster.routing import stable_hash
from dopool._engine.mailbox import Mailbox
from dopool._engine.messages import Deliver, Redeliver


def _key_for(index: int, concurrency: int) -> str:
    return next(f"k{n}" for n in range(1000) if stable_hash(f"k{n}") % concurrency == index)


def test_a_dropped_link_is_delivered_again_and_the_later_ones_wait_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[tuple[int, Any]] = []
    there = _key_for(1, 2)

    def handle(ctx: EventContext) -> None:
        ran.append((ctx.instance_index, ctx.event))
        if isinstance(ctx.event, list):  # a parent: links 1, 2, 3 (then 4, 5, 6) from 0 to 1
            for child in ctx.event:
                ctx.enqueue(child, partition_key=there)

    sent: list[Any] = []
    dropped: list[int] = []  # the links lost once
    send = Mailbox.send

    def dropping(mailbox: Mailbox, message: Any) -> bool:
        sent.append(message)
        if isinstance(message, Deliver) and message.record.link in (1, 4):
            if message.record.link in dropped:
                return send(mailbox, message)  # delivered again
            dropped.append(message.record.link)
            return True  # lost on the way, as if taken
        return send(mailbox, message)

    monkeypatch.setattr(Mailbox, "send", dropping)
    with Runtime.simulated() as runtime:
        pool = runtime.define("p", execute=handle, concurrency=2)
        here = _key_for(0, 2)
        for parent in (["a1", "a2", "a3"], ["b1", "b2", "b3"]):
            pool.enqueue(parent, partition_key=here)
            assert pool.join(timeout=30)
        status = pool.status()
    assert dropped == [1, 4]
    children = [event for index, event in ran if index == 1]
    assert children == ["a1", "a2", "a3", "b1", "b2", "b3"]
    assert (status.succeeded, status.pending) == (8, 0)
    asked = [message for message in sent if isinstance(message, Redeliver)]
    # Once for each link missing, though the two after each came early.
    assert asked == [Redeliver("p", 1), Redeliver("p", 1)]
