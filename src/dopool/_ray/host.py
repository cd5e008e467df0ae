"""The shard host: a Ray actor that serves the store on its node's disk.

A deployment (:mod:`dopool._ray.deploy`) starts one :class:`ShardHost` per node, pinned
there (node affinity, not soft), restarted in place by Ray when its process dies
(``max_restarts=-1``) and never retried by Ray (``max_task_retries=0``: Ray's retries
reorder calls; the producer retries with its own call numbers instead).

The host opens a real-clock runtime on its store, exclusively, and has the app (a
``module:function``, loaded as ``dopool worker APP`` loads one) define its pools on
it; a restarted host opens the store again, and the runtime's recovery settles what
the dead one left, as a worker's does. Producers send it owner_wire request frames
(:meth:`ShardHost.call`): the calls on instances it serves are stored by the runtime's
:class:`~dopool._engine.call_store.CallStore`, each with its call record (a call stored
before is answered from its record), and the answer frame goes back once the commit is
durable under the request's durability. A call on an instance outside its ranges is
answered nil, as is one whose transaction failed; a refused one (a full queue) is
answered nil with its error beside the frame.

**Batches.** The actor is threaded (``max_concurrency`` > 1): the Ray calls that come
while a transaction commits wait in a :class:`Gather`, and the first of them stores
them all in the next one, so concurrent producers share one commit (and one fsync).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from dopool._cluster.owner_wire import (
    HEADER,
    Request,
    Results,
    decode_request,
    encode_answer,
    frame_length,
)
from dopool._engine.call_store import Refusals
from dopool._errors import ScenarioError, StoreLockedError
from dopool._handles.tools import ToolRuntime
from dopool._ops.app import AppError, load_app
from dopool._ray.actors import NAMESPACE, Refusal, import_ray, record_name, refusal
from dopool._ray.gather import Gather

#: Seconds a restarted host waits for the store's lock (a dead process of its own may
#: hold it a moment longer) before it gives up.
OPEN_WAIT = 30.0
#: The Ray calls a host takes at once (its threads).
MAX_CONCURRENCY = 64
#: Seconds a restarted host waits for the placement record's answer in a call.
RECORD_WAIT = 5.0

#: The ranges a host serves, by pool: ``(start, stop)`` each.
Ranges = dict[str, tuple[tuple[int, int], ...]]


# A request's answers, and its refused calls' errors by number.
Stored = tuple[list[tuple[int, Results]], dict[int, Refusal]]


class ShardHost:
    """One node's shard host (see the module docstring); a Ray actor's class."""

    def __init__(self, deployment: str, index: int, app: str, store: str, durability: str) -> None:
        self._deployment = deployment
        self._index = index
        self._runtime = _open(app, Path(store), durability)
        # Told by deploy (serve), or, once restarted, read from the record when first
        # needed: never in this constructor, whose failure Ray would not restart.
        self._ranges: Ranges | None = None
        self._gather: Gather[Request, Stored] = Gather(self._store_batch)

    def _recorded(self) -> Ranges | None:
        """What the placement record says this host serves; None if it cannot be read
        now (no record yet, or it is restarting: the calls are answered nil meanwhile)."""
        ray = import_ray()
        try:
            book = ray.get_actor(record_name(self._deployment), namespace=NAMESPACE)
            ranges: Ranges = ray.get(book.served_by.remote(self._index), timeout=RECORD_WAIT)
        except Exception:  # (ValueError: none by that name; Ray's errors)
            return None
        return ranges

    def pools(self) -> dict[str, int]:
        """The pools the app defined, by name, with their concurrency, in its order."""
        return {name: pool.concurrency for name, pool in self._runtime.pools.items()}

    def serve(self, ranges: Ranges) -> None:
        """Serve the instances ``ranges`` names (a deploy's placement)."""
        self._ranges = dict(ranges)

    def node_id(self) -> str:
        """The Ray node this host runs on."""
        node: str = import_ray().get_runtime_context().get_node_id()
        return node

    def pid(self) -> int:
        return os.getpid()

    def call(self, data: bytes) -> tuple[bytes, dict[int, Refusal]]:
        """A producer's request frame stored (the calls this host serves); the answer
        frame, and the refused calls' errors by number."""
        if len(data) < HEADER or frame_length(data[:HEADER]) != len(data) - HEADER:
            raise ValueError("not one request frame")
        request = decode_request(data[HEADER:])
        if self._ranges is None:
            self._ranges = self._recorded()
        mine = [call for call in request.calls if self._serves(call.pool, call.instance)]
        answers: dict[int, Results] = dict.fromkeys(call.number for call in request.calls)
        refusals: dict[int, Refusal] = {}
        if mine:
            served = Request(request.producer, request.done_below, request.sync, mine)
            stored, refusals = self._gather.submit(served)
            answers.update(stored)
        return encode_answer(list(answers.items())), refusals

    def _serves(self, pool: str, index: int) -> bool:
        ranges = {} if self._ranges is None else self._ranges
        return any(start <= index < stop for start, stop in ranges.get(pool, ()))

    def _store_batch(self, requests: list[Request]) -> list[Stored]:
        refused: Refusals = {}
        answers = self._runtime.store_calls(requests, refused)
        found: list[dict[int, Refusal]] = [{} for _ in requests]
        for (position, number), error in refused.items():
            found[position][number] = refusal(error)
        return list(zip(answers, found, strict=True))

    def close(self, grace: float) -> None:
        """Close the runtime: running handlers get ``grace`` seconds."""
        self._runtime.close(timeout=grace)


def _open(app: str, store: Path, durability: str) -> ToolRuntime:
    """A real-clock runtime on ``store`` with the app's pools defined, as ``dopool
    worker`` opens one (a store this call created is removed if the app fails); the
    store's lock waited for up to :data:`OPEN_WAIT` seconds.

    Raises:
        AppError: the app cannot be loaded, raises, or defines no pool.
    """
    try:
        loaded = load_app(app)
    except ScenarioError as exc:  # the loader's field error: here, the app's
        raise AppError(app, exc.problem) from None
    created = not store.exists()
    deadline = time.monotonic() + OPEN_WAIT
    while True:
        try:
            runtime = ToolRuntime(store, durability=durability)
            break
        except StoreLockedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)  # the dead process's lock goes with its exit
    loaded.serve_on(runtime, store if created else None)
    return runtime
