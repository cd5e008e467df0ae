"""A thumbnail service, written as it would be for production, simulated with --app.

    dopool simulate --scenario examples/thumbnails/scenario.toml

``build`` defines the pool on whatever runtime it is given: the real one in the
service, the simulated one under ``dopool simulate``. Under virtual time a
handler takes only the time it ``ctx.sleep``s; its own CPU work takes none.
"""

from __future__ import annotations

import random
from typing import Any

from dopool import EventContext, PermanentError, RetryPolicy, Runtime

SECONDS_PER_MEGAPIXEL = 0.02  # measured on the production machines


class CorruptImageError(PermanentError):
    """The upload is not an image: retrying cannot help."""


def resize(ctx: EventContext) -> None:
    image = ctx.event
    if image["megapixels"] <= 0:
        raise CorruptImageError(f"{image['name']} has no pixels")
    # In production this is the resize itself; in the simulation, the time it takes.
    ctx.sleep(0.05 + image["megapixels"] * SECONDS_PER_MEGAPIXEL)
    # The object store times out now and then (a seeded draw, so runs repeat).
    if random.Random(f"{image['name']}/{ctx.attempt}").random() < 0.05:
        raise TimeoutError("object store timed out")
    if image["megapixels"] > 20 and not image.get("tile"):
        # Large images also get a tiled preview, as a follow-up in the same pool.
        ctx.enqueue({"name": image["name"] + "-tiles", "megapixels": 4, "tile": True})


def build(runtime: Runtime) -> None:
    runtime.define(
        "thumbnails",
        execute=resize,
        concurrency=4,
        retry=RetryPolicy(max_attempts=4, initial_delay=0.5, max_delay=10.0),
        max_queue_depth=500,
    )


def upload(number: int, rng: random.Random) -> dict[str, Any]:
    """One arriving upload: most are phone photos, a few are huge or broken."""
    megapixels = rng.choices([0, 2, 12, 48], weights=[1, 40, 55, 4])[0]
    return {"name": f"upload-{number}.jpg", "megapixels": megapixels}
