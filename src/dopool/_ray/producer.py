"""``dopool.ray.connect``: a producer of a deployment's pools, from any node of its cluster.

A :class:`RayConnection` reads the placement record once (and again when a host
answers nil, or stops answering), and its pools (:class:`RayPool`) check, encode and
route each enqueue exactly as ``dopool.connect``'s do (the same validation, the same
stable hash or round robin over the pool's concurrency), then send each instance's
share as one call to the shard host serving it, in a request frame
(:mod:`dopool._cluster.owner_wire`); the host answers once its commit is durable.

**Calls are numbered.** Every call carries the connection's producer id (16 random
bytes) and a call number, so a call tried again is answered from the host's store,
never stored twice. A call is tried again, with the same number, while its host does
not answer (its actor dead or restarting: Ray's ``RayActorError`` and
``ActorUnavailableError``; its node gone: ``ActorUnschedulableError``; or no answer
within the time left), after a pause that grows from :data:`FIRST_PAUSE` to
:data:`LAST_PAUSE`, until the connection's ``timeout``; then
:class:`~dopool.ray.HostUnavailableError` names the pool, the instance, the node and the
wait. A thread's call returns only once it is acknowledged, so its next call starts
after it: one thread's events of a partition are stored in its order, across host
restarts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from functools import partial
from typing import Any, NamedTuple, Protocol

from dopool import tracing
from dopool._clock.clocks import RealClock
from dopool._cluster.call_numbers import CallNumbers
from dopool._cluster.owner_wire import (
    HEADER,
    MAX_CALLS,
    Call,
    Full,
    Request,
    Results,
    decode_answer,
    encode_request,
)
from dopool._cluster.routing import Positions, Router, RoutingTable, pick, place
from dopool._errors import (
    ConfigurationError,
    DeploymentError,
    DopoolError,
    HostUnavailableError,
    PoolClosedError,
    PoolNotFoundError,
    QueueFullError,
)
from dopool._machine.types import Item
from dopool._machine.validation import (
    Schema,
    check_keyed,
    check_pool_name,
    due_time,
    prepare,
    prepare_many,
    with_ttl,
)
from dopool._ray.actors import NAMESPACE, Refusal, import_ray, record_name, refusal, refused
from dopool._ray.gather import Gather
from dopool._ray.placement import HostPlace, Placement
from dopool._types import EnqueueResult

#: Seconds a call is tried for, by default, before HostUnavailableError.
DEFAULT_TIMEOUT = 30.0
#: The pause after a try that got no answer, doubling up to the last.
FIRST_PAUSE = 0.05
LAST_PAUSE = 1.0


class HostDown(Exception):
    """A try that got no answer from its host (dead, restarting, or too slow)."""


class Hosts(Protocol):
    """What a producer asks of the cluster: the placement, and a host's answer to a frame
    (Ray's, :class:`RayHosts`; a test's own)."""

    def placement(self, *, fresh: bool) -> Placement:
        """The placement: as last read, or read again (``fresh``)."""

    def ask(
        self, host: HostPlace, frame: bytes, timeout: float
    ) -> tuple[bytes, dict[int, Refusal]]:
        """Host ``host``'s answer to ``frame`` within ``timeout`` seconds.

        Raises:
            HostDown: no answer.
        """


# A request's answers by call number (None: not stored there), and its refusals.
Answered = tuple[dict[int, Results], dict[int, Refusal]]


class HostLinks:
    """A connection's calls to each host, batched: while one Ray call to a host is out,
    the requests its other threads make for that host wait, and the first of them sends
    them all in the next (:class:`~dopool._ray.gather.Gather`), as a ``dopool.connect``
    connection's link to an owner does. A lone request goes at once. What the Ray call
    raises (:class:`HostDown`), each of its requests raises, to be tried again on its
    own. Thread-safe."""

    def __init__(self, hosts: Hosts) -> None:
        self._hosts = hosts
        self._lock = threading.Lock()
        self._links: dict[HostPlace, Gather[tuple[Request, float], Answered]] = {}

    def ask(self, host: HostPlace, request: Request, timeout: float) -> Answered:
        """``request``'s answers from ``host`` within ``timeout`` seconds.

        Raises:
            HostDown: no answer.
        """
        with self._lock:
            link = self._links.get(host)
            if link is None:
                link = self._links[host] = Gather(partial(self._send, host))
        return link.submit((request, time.monotonic() + timeout))

    def _send(self, host: HostPlace, asked: list[tuple[Request, float]]) -> list[Answered]:
        """The requests (all of one connection) sent as one, :data:`MAX_CALLS` calls a
        frame, within the soonest of their deadlines; each one's answers."""
        requests = [request for request, _ in asked]
        calls = [call for request in requests for call in request.calls]
        below = min(request.done_below for request in requests)
        sync = any(request.sync for request in requests)
        deadline = min(deadline for _, deadline in asked)
        answers: dict[int, Results] = {}
        refusals: dict[int, Refusal] = {}
        for start in range(0, len(calls), MAX_CALLS):
            merged = Request(requests[0].producer, below, sync, calls[start : start + MAX_CALLS])
            timeout = max(deadline - time.monotonic(), 0.001)
            data, refused = self._hosts.ask(host, encode_request(merged), timeout)
            refusals.update(refused)
            decoded = decode_answer(data[HEADER:])
            for call in merged.calls:
                answer = decoded.get(call.number)
                if isinstance(answer, Full):  # (a host hands refusals back beside the frame)
                    error = QueueFullError(
                        pool=call.pool,
                        instance_index=call.instance,
                        depth=answer.depth,
                        max_depth=answer.max_depth,
                        incoming=answer.incoming,
                    )
                    refusals[call.number] = refusal(error)
                    answer = None
                answers[call.number] = answer
        return [
            (
                {call.number: answers.get(call.number) for call in request.calls},
                {
                    call.number: refusals[call.number]
                    for call in request.calls
                    if call.number in refusals
                },
            )
            for request in requests
        ]


class Exchanged(NamedTuple):
    """What became of a request's calls: results by call number, the refused ones' errors,
    and the call no host answered in time (None: every call was answered)."""

    results: dict[int, list[tuple[int, int, int, bool]]]
    refused: dict[int, DopoolError]
    unavailable: HostUnavailableError | None


def exchange(
    hosts: Hosts,
    numbers: CallNumbers,
    calls: list[Call],
    *,
    sync: bool,
    timeout: float,
    links: HostLinks | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Exchanged:
    """Send ``calls`` to the hosts serving their instances, each host's in one request,
    until each is answered or refused, or ``timeout`` seconds have passed (see the
    module docstring); a call answered nil is sent again, by the placement read anew.
    ``links``: the connection's, which send other threads' calls to the same host in the
    same Ray call (a fresh one batches nothing)."""
    links = links or HostLinks(hosts)
    begun = clock()
    deadline = begun + timeout
    pending = {call.number: call for call in calls}
    results: dict[int, list[tuple[int, int, int, bool]]] = {}
    errors: dict[int, DopoolError] = {}
    pause = FIRST_PAUSE
    fresh = False
    while True:
        placement = hosts.placement(fresh=fresh)
        by_host: dict[HostPlace, list[Call]] = {}
        for call in pending.values():
            by_host.setdefault(placement.host_of(call.pool, call.instance), []).append(call)
        stalled: Call | None = None
        for host, sent in by_host.items():
            request = Request(numbers.producer, numbers.done_below(), sync, sent)
            try:
                answers, refusals = links.ask(host, request, max(deadline - clock(), 0.001))
            except HostDown:
                stalled = stalled or sent[0]
                continue
            for call in sent:
                answer: Results = answers.get(call.number)
                if answer is not None:
                    results[call.number] = answer
                    del pending[call.number]
                elif call.number in refusals:
                    errors[call.number] = refused(refusals[call.number])
                    del pending[call.number]
                # else: not served there (a newer placement), or its commit failed: again
        if not pending:
            return Exchanged(results, errors, None)
        waited = clock() - begun
        if clock() + pause > deadline:
            call = stalled or next(iter(pending.values()))
            node = hosts.placement(fresh=False).host_of(call.pool, call.instance).node_id
            unavailable = HostUnavailableError(
                pool=call.pool, instance=call.instance, node_id=node, waited=waited
            )
            return Exchanged(results, errors, unavailable)
        sleep(pause)
        pause = min(pause * 2, LAST_PAUSE)
        fresh = True


class RayHosts:
    """The hosts as Ray reaches them: their actors by name, the placement from the record."""

    def __init__(self, deployment: str) -> None:
        self._ray = import_ray()
        self._deployment = deployment
        self._lock = threading.Lock()
        self._actors: dict[str, Any] = {}
        self._placement = self._read()

    def _read(self) -> Placement:
        ray = self._ray
        try:
            record = ray.get_actor(record_name(self._deployment), namespace=NAMESPACE)
        except ValueError:
            raise DeploymentError(self._deployment, "none of that name runs") from None
        placement: Placement = ray.get(record.read.remote())
        return placement

    def placement(self, *, fresh: bool) -> Placement:
        if fresh:
            try:
                placement = self._read()
            except Exception:  # the record restarting: the last one read stands
                return self._placement
            with self._lock:
                if placement.version != self._placement.version:
                    self._actors.clear()
                self._placement = placement
        return self._placement

    def ask(
        self, host: HostPlace, frame: bytes, timeout: float
    ) -> tuple[bytes, dict[int, Refusal]]:
        ray = self._ray
        try:
            actor = self._actor(host.actor)
            answer: tuple[bytes, dict[int, Refusal]] = ray.get(
                actor.call.remote(frame), timeout=timeout
            )
        except ray.exceptions.RayTaskError:
            raise  # the host's own code raised: not a host down, and trying again won't do
        except (ray.exceptions.RayError, ValueError) as exc:
            # RayActorError (ActorDiedError, ActorUnavailableError), GetTimeoutError,
            # ActorUnschedulableError (its node gone), ...; ValueError: no actor by that name
            with self._lock:
                self._actors.pop(host.actor, None)
            raise HostDown(str(exc)) from exc
        return answer

    def _actor(self, name: str) -> Any:
        with self._lock:
            actor = self._actors.get(name)
        if actor is None:
            actor = self._ray.get_actor(name, namespace=NAMESPACE)
            with self._lock:
                self._actors[name] = actor
        return actor


def connect(
    name: str = "default", *, durability: str = "sync", timeout: float = DEFAULT_TIMEOUT
) -> RayConnection:
    """A producer's connection to the deployment ``name`` (see :mod:`dopool._ray.producer`).

    ``durability``: ``"sync"`` has each call fsynced before it is answered, whatever the
    host's own durability. ``timeout``: seconds a call is tried for before
    :class:`~dopool.ray.HostUnavailableError`.

    Raises:
        RayUnavailableError: Ray is not installed.
        DeploymentError: no deployment of that name runs.
        ConfigurationError: a bad durability or timeout.
    """
    if durability not in ("sync", "async"):
        raise ConfigurationError(f"durability must be 'sync' or 'async', got {durability!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < 1e6:
        raise ConfigurationError(f"timeout must be seconds > 0, got {timeout!r}")
    return RayConnection(RayHosts(name), sync=durability == "sync", timeout=float(timeout))


class RayConnection:
    """A producer of a Ray deployment's pools: :meth:`pool` gives each one's handle."""

    def __init__(self, hosts: Hosts, *, sync: bool, timeout: float) -> None:
        self.hosts = hosts
        self.links = HostLinks(hosts)  # its threads' calls to one host batched
        self.numbers = CallNumbers()
        self.sync = sync
        self.timeout = timeout
        self.closed = False
        self._clock = RealClock()  # for due times (wall time); it sets no alarm

    def __repr__(self) -> str:
        placement = self.hosts.placement(fresh=False)
        return f"<RayConnection to deployment {placement.name!r}>"

    def __enter__(self) -> RayConnection:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def now(self) -> float:
        return self._clock.now()

    def pool(self, name: str, *, schema: Schema | None = None) -> RayPool:
        """A producer's handle on the deployment's pool ``name``. ``schema``: the pool's
        ``define`` option of that name, which the placement does not carry (pass the
        app's to refuse here what its pool would).

        Raises:
            PoolNotFoundError: the deployment's app defines no such pool.
        """
        check_pool_name(name)
        placement = self.hosts.placement(fresh=False)
        if name not in placement.pools:
            raise PoolNotFoundError(
                path=f"ray:{placement.name}", pool=name, known=sorted(placement.pools)
            )
        return RayPool(self, name, schema)

    def close(self) -> None:
        """Later calls raise ``PoolClosedError``; a call in progress finishes."""
        self.closed = True


class RayPool:
    """A pool of a Ray deployment as a producer sees it: ``enqueue`` and ``enqueue_many``,
    with ``dopool.connect``'s pools' arguments, checks and results."""

    def __init__(self, connection: RayConnection, name: str, schema: Schema | None) -> None:
        self._connection = connection
        self._name = name
        self._schema = schema
        self._router = Router(0, table=RoutingTable.elsewhere(0))

    @property
    def name(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"<RayPool {self._name!r}>"

    def enqueue(
        self,
        event: Any,
        *,
        partition_key: str | None = None,
        priority: int = 0,
        delay: float | timedelta | None = None,
        not_before: float | datetime | None = None,
        dedup_key: str | None = None,
        ttl: float | timedelta | None = None,
    ) -> EnqueueResult:
        """As :meth:`dopool.Pool.enqueue`, stored by the shard host serving its instance.

        Raises:
            HostUnavailableError: the host did not answer within the connection's timeout.
        """
        self._check_open()
        due = self._due(delay, not_before)
        item = prepare(
            event,
            partition_key=partition_key,
            priority=priority,
            schema=self._schema,
            due=due,
            dedup_key=dedup_key,
        )
        now = self._connection.now
        with tracing.sending(self._name, with_ttl((item,), ttl, due, now()), now) as items:
            return self._send(items, partition_key)[0]

    def enqueue_many(
        self,
        events: Iterable[Any],
        *,
        partition_key: str | None = None,
        priority: int = 0,
        delay: float | timedelta | None = None,
        not_before: float | datetime | None = None,
        dedup_keys: Iterable[str | None] | None = None,
        ttl: float | timedelta | None = None,
    ) -> list[EnqueueResult]:
        """As :meth:`dopool.Pool.enqueue_many`: each instance's share one call, each
        host's calls one request. An error (a refusal, a host unavailable) is raised once
        every share is settled, with ``.stored``: the results of those stored."""
        self._check_open()
        due = self._due(delay, not_before)
        items = prepare_many(
            events, partition_key, priority, self._schema, due=due, dedup_keys=dedup_keys
        )
        if not items:
            return []
        now = self._connection.now
        with tracing.sending(self._name, with_ttl(items, ttl, due, now()), now) as items:
            return self._send(items, partition_key)

    def _check_open(self) -> None:
        if self._connection.closed:
            raise PoolClosedError(self._name, closed="connection")

    def _due(
        self, delay: float | timedelta | None, not_before: float | datetime | None
    ) -> float | None:
        if delay is None and not_before is None:
            return None
        return due_time(delay, not_before, now=self._connection.now, wall=True)

    def _groups(self, items: tuple[Item, ...], partition_key: str | None) -> dict[int, Positions]:
        """Which instance each item goes to, by the placement's concurrency."""
        concurrency = self._connection.hosts.placement(fresh=False).pools[self._name].concurrency
        if self._router.concurrency != concurrency:
            self._router = Router(concurrency, table=RoutingTable.elsewhere(concurrency))
        table = self._router.table
        check_keyed(self._name, concurrency, partition_key)
        if len(items) == 1:
            return {self._router.choose(partition_key, table): range(1)}
        keys = [item.dedup_key for item in items]
        return self._router.split(len(items), partition_key, keys if any(keys) else None, table)

    def _send(self, items: tuple[Item, ...], partition_key: str | None) -> list[EnqueueResult]:
        connection = self._connection
        groups = self._groups(items, partition_key)
        numbers = connection.numbers
        calls = {numbers.begin(): (index, positions) for index, positions in groups.items()}
        try:
            done = exchange(
                connection.hosts,
                numbers,
                [
                    Call(number, self._name, index, pick(items, positions))
                    for number, (index, positions) in calls.items()
                ],
                sync=connection.sync,
                timeout=connection.timeout,
                links=connection.links,
            )
        finally:
            for number in calls:
                numbers.end(number)
        results: list[Any] = [None] * len(items)
        for number, found in done.results.items():
            place(
                results,
                calls[number][1],
                [
                    EnqueueResult(sequence, instance, f"{self._name}:{instance}", position, dup)
                    for instance, sequence, position, dup in found
                ],
            )
        failure: DopoolError | None = done.unavailable or next(iter(done.refused.values()), None)
        if failure is not None:
            if len(items) > 1:
                failure.stored = [result for result in results if result is not None]
            raise failure
        return results
