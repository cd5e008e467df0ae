"""The app ``tests/ops/test_worker.py`` runs with ``dopool worker _worker_app:app``.

It defines pool ``jobs`` (``WORKER_CONCURRENCY`` instances, 2 by default, or
``per-key``; three attempts; ``WORKER_IDLE_TIMEOUT`` seconds of ``idle_timeout``). Its
handler and a subscriber write what happened as JSON lines to the pipe whose write end
is ``WORKER_LOG_FD``: ``{"e": "start"|"end", "p", "k", "key", "index", "sequence",
"attempt"}`` from the handler, ``{"e": "pool", "kind", "index",
"sequence"}`` for each pool event. So the test waits on evidence, not on time.

An event is a dict: ``gate: true`` makes the handler read one byte from the pipe
``WORKER_GATE_FD`` before it returns (the test lets it go); ``hang: true`` makes its
first attempt never return; ``gate_first: true`` gates the first attempt alone, and
``rerun_seconds: S`` makes every later attempt take S seconds. Every line names the
worker's ``pid``; with ``WORKER_HANDLER_SECONDS`` set, each attempt takes that long.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any, Literal

from dopool import EventContext, PoolEvent, RetryPolicy, Runtime

not_a_function = 42


def _log(line: dict[str, Any]) -> None:
    line = {**line, "pid": os.getpid()}
    os.write(int(os.environ["WORKER_LOG_FD"]), (json.dumps(line) + "\n").encode())


def handle(ctx: EventContext) -> None:
    event = ctx.event
    what = {
        "p": event.get("p"),
        "k": event.get("k"),
        "key": ctx.partition_key,
        "index": ctx.instance_index,
        "sequence": ctx.sequence,
        "attempt": ctx.attempt,
    }
    _log({"e": "start", **what})
    if event.get("gate") or (event.get("gate_first") and ctx.attempt == 1):
        os.read(int(os.environ["WORKER_GATE_FD"]), 1)
    if event.get("rerun_seconds") and ctx.attempt > 1:
        threading.Event().wait(event["rerun_seconds"])  # a rerun's work takes this long
    if event.get("hang") and ctx.attempt == 1:
        threading.Event().wait()  # never returns
    work = float(os.environ.get("WORKER_HANDLER_SECONDS", "0"))
    if work:
        threading.Event().wait(work)
    _log({"e": "end", **what})


def _on_event(event: PoolEvent) -> None:
    index, sequence = event.instance_index, event.sequence
    _log({"e": "pool", "kind": event.kind, "index": index, "sequence": sequence})


def app(runtime: Runtime) -> None:
    size = os.environ.get("WORKER_CONCURRENCY", "2")
    concurrency: int | Literal["per-key"] = "per-key" if size == "per-key" else int(size)
    idle = os.environ.get("WORKER_IDLE_TIMEOUT")
    runtime.subscribe(_on_event)
    runtime.define(
        "jobs",
        execute=handle,
        concurrency=concurrency,
        retry=RetryPolicy(max_attempts=3, initial_delay=0.01, max_delay=0.01),
        idle_timeout=60.0 if idle is None else float(idle),
    )


def scheduled(runtime: Runtime) -> None:
    """``app``, and a recurring schedule defined at start-up, as an app run by every
    worker defines its schedules."""
    app(runtime)
    runtime.pools["jobs"].schedule("tick", {"p": "tick", "k": 0}, every=3600)


def raises(_runtime: Runtime) -> None:
    raise RuntimeError("the app is broken")


def defines_nothing(_runtime: Runtime) -> None:
    """Forgets to define its pools."""
