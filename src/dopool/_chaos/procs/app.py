"""The app ``dopool worker dopool._chaos.procs.app:define`` runs in a multi-process chaos run.

It defines the plan's pool (:mod:`.plan`, drawn from ``DOPOOL_CHAOS_SEED``), whose
handler does what the plan says of each event (fail, fail for good, take a while)
and records each attempt's start and end in ``DOPOOL_CHAOS_RECORD``
(:mod:`.records`), each start stamped with the system's monotonic clock, which orders
the attempts of several workers. It writes one byte to the pipe ``DOPOOL_CHAOS_FD``
once the pool is defined (``R`` from the first worker, ``Q``, ``U``, ``V`` from the
second, third, fourth: :data:`READY`) and one per attempt started (``S``, or ``L``
for a slow one): the runner counts the latter as progress, and waits for the former
before it starts the producers.

About half the seeds (the plan's ``async_handler``, drawn from a generator of its own,
so the plan's other draws are what they were) define the pool with an ``async def``
handler instead, which the worker awaits on its runtime's event loop: the same steps
(:func:`define`'s ``start`` and ``end``), a slow attempt awaiting ``asyncio.sleep``
instead of blocking its thread. The checker holds both to the same records.

About three seeds in ten (the plan's ``rate_limit``, drawn from a generator of its own
too) define the pool with a rate limit, the same in every worker process. Each start line
then carries the attempt's ``ctx.started_at`` as well, the clock reading its start
transaction took its token at: the checker holds the starts of all the workers together
to the limit, which only a bucket the processes share keeps.
"""

from __future__ import annotations

import asyncio
import ctypes
import faulthandler
import os
import signal
import sys
import threading
import time

from dopool._chaos.procs.plan import POOL, RETRY, Behaviour, draw
from dopool._chaos.procs.records import Record
from dopool._engine import logs
from dopool._engine.context import EventContext
from dopool._errors import PermanentError
from dopool._handles.runtime import Runtime
from dopool._machine.invariants import SUCCESS_COUNTER

READY = (b"R", b"Q", b"U", b"V")  # by chain: the first worker's, the second's...
STARTED = b"S"
SLOW = b"L"  # a slow attempt started: a kill now interrupts it
PR_SET_PDEATHSIG = 1  # prctl(2)
DUMP = signal.SIGUSR1  # every thread's stack to stderr: what the runner sends a stuck run


#: An attempt, as the records name it: event id, instance, sequence, attempt.
Where = tuple[str, int, int, int]


class PlannedFailure(RuntimeError):
    """A failure the plan asked for."""


def define(runtime: Runtime) -> None:
    die_with(int(os.environ["DOPOOL_CHAOS_PARENT"]))
    faulthandler.register(DUMP, all_threads=True)  # a stuck run's stacks, in worker-<g>.err
    # The plan's failures are not logged (any other line at WARNING is a violation).
    logs.leave_out((PlannedFailure, PermanentError), crashes=False)
    seed = int(os.environ["DOPOOL_CHAOS_SEED"])
    plan = draw(seed)
    record = Record(os.environ["DOPOOL_CHAOS_RECORD"])
    pipe = int(os.environ["DOPOOL_CHAOS_FD"])
    behaviours = plan.behaviours
    idle = threading.Event()  # never set: a slow handler waits on it, in real time

    def start(ctx: EventContext) -> tuple[Where, Behaviour]:
        """An attempt's start: count it in storage, record it, tell the runner."""
        ident = ctx.event["id"]
        where = (ident, ctx.instance_index, ctx.sequence, ctx.attempt)
        behaviour = behaviours.get(ident, Behaviour())
        storage = ctx.storage  # committed with a success only (guarantee 6)
        storage.put(SUCCESS_COUNTER, storage.get(SUCCESS_COUNTER, 0) + 1)
        record.line("S", *where, time.monotonic_ns(), repr(ctx.started_at))
        os.write(pipe, SLOW if behaviour.slow else STARTED)
        return where, behaviour

    def end(ctx: EventContext, where: Where, behaviour: Behaviour) -> None:
        """An attempt's end, after its slow part: record it, and fail as planned."""
        if behaviour.mode == "perm":
            record.line("E", *where, "perm")
            raise PermanentError("planned: fails for good")
        if behaviour.mode == "always" or ctx.attempt <= behaviour.fails:
            record.line("E", *where, "fail")
            raise PlannedFailure(f"planned failure of attempt {ctx.attempt}")
        record.line("E", *where, "ok")

    def handle(ctx: EventContext) -> None:
        where, behaviour = start(ctx)
        if behaviour.slow:
            idle.wait(behaviour.slow)
        end(ctx, where, behaviour)

    async def handle_async(ctx: EventContext) -> None:
        where, behaviour = start(ctx)
        if behaviour.slow:
            await asyncio.sleep(behaviour.slow)
        end(ctx, where, behaviour)

    runtime.define(
        POOL,
        execute=handle_async if plan.async_handler else handle,
        concurrency=plan.size,
        retry=RETRY,
        dedup_window=plan.dedup_window,
        idle_timeout=plan.idle_timeout,
        rate_limit=plan.rate_limit,
    )
    os.write(pipe, READY[int(os.environ["DOPOOL_CHAOS_CHAIN"])])


def die_with(parent: int) -> None:
    """SIGKILL this process if the runner dies (Linux): a worker never exits on its own,
    a process the runner froze never runs again by itself, and the runner kills both
    on every other way out."""
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the call
        os.kill(os.getpid(), signal.SIGKILL)
