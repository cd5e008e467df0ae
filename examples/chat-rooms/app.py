"""A chat service, one Durable Object per room, simulated with --app.

    dopool simulate --scenario examples/chat-rooms/scenario.toml

Each room is its own instance (``concurrency="per-key"``, the room's name its key) and
keeps its history in its own storage (``ctx.storage``), committed with each message's
success. A room's first message starts its timer, a delayed follow-up to itself every
``timer`` seconds, which counts the room's messages since the last tick (a digest, say)
and stops once the room has gone quiet. ``timer`` is the scenario's app parameter.
"""

from __future__ import annotations

import random
from typing import Any

from dopool import EventContext, Runtime

HANDLING = 0.002  # virtual seconds a message takes to handle


def build(runtime: Runtime, timer: float = 30.0) -> None:
    def room(ctx: EventContext) -> None:
        storage = ctx.storage
        said = storage.get("said", 0)
        if ctx.event["kind"] == "tick":
            quiet = said == storage.get("said_at_tick", 0)
            storage.put("ticks", storage.get("ticks", 0) + 1)
            storage.put("said_at_tick", said)
            if not quiet:  # the room is still talking: tick again
                ctx.enqueue({"kind": "tick"}, partition_key=ctx.partition_key, delay=timer)
            return
        ctx.sleep(HANDLING)
        storage.put(f"message:{said:06}", ctx.event["text"])  # the history, in order
        storage.put("said", said + 1)
        if said == 0:  # the room's first message starts its timer
            ctx.enqueue({"kind": "tick"}, partition_key=ctx.partition_key, delay=timer)

    runtime.define("rooms", execute=room, concurrency="per-key", idle_timeout=60.0)


def message(number: int, rng: random.Random) -> dict[str, Any]:
    """An arriving chat message (its room is the arrival's partition key)."""
    return {"kind": "message", "text": f"message {number}: {rng.choice(['hi', 'ok', 'lol'])}"}
