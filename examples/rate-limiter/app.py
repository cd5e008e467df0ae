"""A rate limiter, one Durable Object per API key, simulated with --app.

    dopool simulate --scenario examples/rate-limiter/scenario.toml
    dopool simulate --scenario examples/rate-limiter/scenario.toml --sweep app.rate=2,5,20

Each API key is its own instance of the ``limiter`` pool (``concurrency="per-key"``, the
key its partition key) and keeps a token bucket in its own storage (``ctx.storage``), as
one value ``bucket``: the tokens left, the virtual time they were last refilled, and that
of the key's first request (``since``). The bucket starts full, holds at most ``burst``
tokens and gains ``rate`` a second. A request that finds a token takes it and is
forwarded to the ``upstream`` pool, four workers that take a few milliseconds a request;
one that finds none is denied. The bucket counts both, ``allowed`` and ``denied``.
``rate`` and ``burst`` are the scenario's app parameters.

Everything the handler changes is in its storage or its follow-up, and both are committed
with the request's success: a retried request starts again from the last committed
bucket, so it never takes two tokens, and it is forwarded once.
"""

from __future__ import annotations

import random
from typing import Any

from dopool import EventContext, RetryPolicy, Runtime

# Virtual seconds the upstream service takes per request, by endpoint.
UPSTREAM_COST = {"/search": 0.02, "/items": 0.005, "/orders": 0.01}
UPSTREAM_WORKERS = 4
# An attempt that fails (an exception, or its instance crashed) is tried again soon, up to
# five times in all; the bucket it sees is the last one committed.
RETRY = RetryPolicy(max_attempts=5, initial_delay=0.01, multiplier=2.0, max_delay=1.0)


def build(runtime: Runtime, rate: float = 5.0, burst: float = 10.0) -> None:
    """Define ``upstream`` and ``limiter``: ``rate`` tokens a virtual second per API key,
    at most ``burst`` of them saved up."""
    if not rate > 0:
        raise ValueError(f"rate must be above 0 tokens a second, got {rate!r}")
    if not burst >= 1:
        raise ValueError(f"burst must be at least 1 token, got {burst!r}")

    def serve(ctx: EventContext) -> None:
        ctx.sleep(UPSTREAM_COST[ctx.event["path"]])

    def limit(ctx: EventContext) -> None:
        now = ctx.started_at  # virtual seconds: the decision is made as the attempt starts
        # The whole bucket is one value: a request reads one row and writes one, where a
        # key per field wrote three (rows written are what the bill is made of:
        # docs/simulate.md, "A rate limiter").
        bucket = ctx.storage.get("bucket") or {  # the key's first request: a full bucket
            "tokens": burst,
            "refilled_at": now,
            "since": now,
            "allowed": 0,
            "denied": 0,
        }
        tokens = min(burst, bucket["tokens"] + (now - bucket["refilled_at"]) * rate)
        if tokens >= 1:
            tokens -= 1
            bucket["allowed"] += 1
            ctx.enqueue({"key": ctx.partition_key, **ctx.event}, pool="upstream")
        else:
            bucket["denied"] += 1
        bucket["tokens"], bucket["refilled_at"] = tokens, now
        ctx.storage.put("bucket", bucket)

    runtime.define("upstream", execute=serve, concurrency=UPSTREAM_WORKERS, retry=RETRY)
    runtime.define("limiter", execute=limit, concurrency="per-key", retry=RETRY, idle_timeout=60.0)


def request(number: int, rng: random.Random) -> dict[str, Any]:
    """An arriving API request (its API key is the arrival's partition key)."""
    return {"request": number, "path": rng.choice(sorted(UPSTREAM_COST))}
