"""Closing a runtime: refused from its own instances, and done for it at interpreter exit."""

from __future__ import annotations

from typing import Any

import pytest

from dopool import ConfigurationError, EventContext, PoolEvent, Runtime

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
