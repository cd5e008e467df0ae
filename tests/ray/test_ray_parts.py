"""The parts of ``dopool.ray`` that need no Ray: the placement's split, the producer's
tries (a fake cluster of hosts), the host's batches, refusals as they travel."""

from __future__ import annotations

import itertools
import re
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from dopool._cluster.call_numbers import CallNumbers
from dopool._cluster.owner_wire import (
    HEADER,
    Call,
    Request,
    Results,
    decode_request,
    encode_answer,
)
from dopool._errors import ConfigurationError, HostUnavailableError, QueueFullError
from dopool._machine.validation import prepare
from dopool._ray.actors import Refusal, refusal, refused
from dopool._ray.deploy import _chosen
from dopool._ray.gather import Gather
from dopool._ray.placement import HostPlace, Placement, place, split
from dopool._ray.producer import FIRST_PAUSE, HostDown, HostLinks, exchange

HOSTS = (HostPlace(0, "node-a", "h0"), HostPlace(1, "node-b", "h1"), HostPlace(2, "node-c", "h2"))


@pytest.mark.parametrize(
    ("concurrency", "hosts", "first", "expected"),
    [
        (4, 2, 0, ((0, 2, 0), (2, 4, 1))),
        (5, 2, 0, ((0, 3, 0), (3, 5, 1))),
        (7, 3, 1, ((0, 3, 1), (3, 5, 2), (5, 7, 0))),
        (2, 3, 0, ((0, 1, 0), (1, 2, 1))),
        (1, 1, 0, ((0, 1, 0),)),
    ],
)
def test_a_pool_is_split_in_contiguous_near_equal_ranges(
    concurrency: int, hosts: int, first: int, expected: tuple[tuple[int, int, int], ...]
) -> None:
    assert split(concurrency, hosts, first) == expected


def test_a_per_key_pool_splits_its_whole_range() -> None:
    ranges = split(2**64, 3)
    assert ranges[0][0] == 0
    assert ranges[-1][1] == 2**64
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))


def test_each_instance_has_one_host_and_pools_start_on_different_hosts() -> None:
    placement = place("d", 1, HOSTS, {"a": 10, "b": 1, "c": 1})
    assert [placement.host_of("a", i).index for i in range(10)] == [0] * 4 + [1] * 3 + [2] * 3
    assert placement.host_of("b", 0).index == 1
    assert placement.host_of("c", 0).index == 2
    assert placement.served_by(1) == {"a": ((4, 7),), "b": ((0, 1),), "c": ()}


def test_a_refusal_travels_as_data_and_is_the_same_error_again() -> None:
    error = QueueFullError(pool="p", instance_index=2, depth=5, max_depth=5)
    again = refused(refusal(error))
    assert type(again) is QueueFullError
    assert (again.pool, again.instance_index, again.depth, again.max_depth) == ("p", 2, 5, 5)
    assert str(again) == str(error)


# -- the producer's tries -----------------------------------------------------------------


def _placement(version: int = 1, pools: dict[str, int] | None = None) -> Placement:
    return place("d", version, HOSTS[:2], pools or {"jobs": 4})


@dataclass
class FakeHosts:
    """Hosts that store each call once by (producer, number), as a host's call records
    make them; ``down`` tries fail first, ``unserved`` tries are answered nil."""

    placement_now: Placement = field(default_factory=_placement)
    down: int = 0
    unserved: int = 0
    refuse: set[int] = field(default_factory=set)
    stored: dict[tuple[bytes, int], list[tuple[int, int, int, bool]]] = field(default_factory=dict)
    tries: list[tuple[str, int]] = field(default_factory=list)  # (host actor, call number)
    reads: int = 0

    def placement(self, *, fresh: bool) -> Placement:
        self.reads += fresh
        return self.placement_now

    def ask(
        self, host: HostPlace, frame: bytes, timeout: float
    ) -> tuple[bytes, dict[int, Refusal]]:
        request = decode_request(frame[HEADER:])
        self.tries.extend((host.actor, call.number) for call in request.calls)
        if self.down:
            self.down -= 1
            raise HostDown("restarting")
        if self.unserved:
            self.unserved -= 1
            return encode_answer([(call.number, None) for call in request.calls]), {}
        answers: list[tuple[int, Results]] = []
        refusals: dict[int, Refusal] = {}
        for call in request.calls:
            if call.number in self.refuse:
                error = QueueFullError(
                    pool=call.pool, instance_index=call.instance, depth=1, max_depth=1
                )
                refusals[call.number] = refusal(error)
                answers.append((call.number, None))
                continue
            key = (request.producer, call.number)
            results = [(call.instance, len(self.stored), 0, False) for _ in call.items]
            answers.append((call.number, self.stored.setdefault(key, results)))
        return encode_answer(answers), refusals


def _call(numbers: CallNumbers, instance: int) -> Call:
    item = prepare({"n": instance}, partition_key=None, priority=0, schema=None)
    return Call(numbers.begin(), "jobs", instance, (item,))


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.pauses: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def test_a_call_whose_host_restarts_is_tried_again_with_its_number_and_stored_once() -> None:
    hosts, numbers, time = FakeHosts(down=3), CallNumbers(), FakeTime()
    call = _call(numbers, 3)
    done = exchange(
        hosts, numbers, [call], sync=True, timeout=30, sleep=time.sleep, clock=time.clock
    )
    assert done.unavailable is None
    assert done.results[call.number] == [(3, 0, 0, False)]
    assert hosts.tries == [("h1", call.number)] * 4  # the same number every time
    assert len(hosts.stored) == 1
    assert time.pauses == [FIRST_PAUSE, FIRST_PAUSE * 2, FIRST_PAUSE * 4]


def test_a_call_answered_nil_reads_the_placement_again_and_goes_where_it_says() -> None:
    hosts, numbers, time = FakeHosts(unserved=1), CallNumbers(), FakeTime()
    call = _call(numbers, 0)
    moved = place("d", 2, (HOSTS[1], HOSTS[0]), {"jobs": 4})  # host order swapped
    original = hosts.placement

    def placement(*, fresh: bool) -> Placement:
        found = original(fresh=fresh)
        return moved if fresh else found

    hosts.placement = placement  # type: ignore[method-assign]
    done = exchange(
        hosts, numbers, [call], sync=True, timeout=30, sleep=time.sleep, clock=time.clock
    )
    assert done.results[call.number][0][0] == 0
    assert [actor for actor, _ in hosts.tries] == ["h0", "h1"]


def test_a_host_down_past_the_timeout_is_a_named_error_never_a_silent_loss() -> None:
    hosts, numbers, time = FakeHosts(down=10**6), CallNumbers(), FakeTime()
    call = _call(numbers, 2)
    done = exchange(
        hosts, numbers, [call], sync=True, timeout=5, sleep=time.sleep, clock=time.clock
    )
    assert done.results == {}
    error = done.unavailable
    assert isinstance(error, HostUnavailableError)
    assert (error.pool, error.instance, error.node_id) == ("jobs", 2, "node-b")
    assert 4 <= error.waited <= 5
    assert {number for _, number in hosts.tries} == {call.number}


def test_a_refused_call_comes_back_as_its_error_and_is_not_tried_again() -> None:
    numbers, time = CallNumbers(), FakeTime()
    first, second = _call(numbers, 0), _call(numbers, 3)
    hosts = FakeHosts(refuse={second.number})
    done = exchange(
        hosts, numbers, [first, second], sync=True, timeout=5, sleep=time.sleep, clock=time.clock
    )
    assert set(done.results) == {first.number}
    assert isinstance(done.refused[second.number], QueueFullError)
    assert len(hosts.tries) == 2


def test_one_request_a_host_and_the_lowest_number_out_is_sent() -> None:
    numbers = CallNumbers()
    calls = [_call(numbers, i) for i in range(4)]
    numbers.end(calls[0].number)
    sent: list[Request] = []
    hosts = FakeHosts()
    ask = hosts.ask

    def recording(
        host: HostPlace, frame: bytes, timeout: float
    ) -> tuple[bytes, dict[int, Refusal]]:
        sent.append(decode_request(frame[HEADER:]))
        return ask(host, frame, timeout)

    hosts.ask = recording  # type: ignore[method-assign]
    exchange(hosts, numbers, calls[1:], sync=False, timeout=5)
    assert [[c.instance for c in r.calls] for r in sent] == [[1], [2, 3]]
    assert {r.done_below for r in sent} == {1}
    assert {r.sync for r in sent} == {False}


# -- the host's batches -----------------------------------------------------------------------


def test_calls_that_come_while_a_batch_is_done_share_the_next_one() -> None:
    batches: list[list[int]] = []
    entered, release = threading.Event(), threading.Event()

    def work(jobs: list[int]) -> list[int]:
        batches.append(jobs)
        if len(batches) == 1:
            entered.set()
            assert release.wait(10)
        return [job * 10 for job in jobs]

    gather: Gather[int, int] = Gather(work)
    results: dict[int, int] = {}
    threads = [
        threading.Thread(target=lambda j=j: results.update({j: gather.submit(j)})) for j in range(5)
    ]
    threads[0].start()
    assert entered.wait(10)
    for thread in threads[1:]:
        thread.start()
    while sum(len(batch) for batch in batches) < 1 or len(gather._queue) < 4:
        threading.Event().wait(0.01)
    release.set()
    for thread in threads:
        thread.join(10)
    assert results == {j: j * 10 for j in range(5)}
    assert batches == [[0], [1, 2, 3, 4]]


@dataclass
class HeldHosts(FakeHosts):
    """Hosts whose first answer waits for ``release``; each request's call numbers kept."""

    entered: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    frames: list[list[int]] = field(default_factory=list)

    def ask(
        self, host: HostPlace, frame: bytes, timeout: float
    ) -> tuple[bytes, dict[int, Refusal]]:
        self.frames.append([call.number for call in decode_request(frame[HEADER:]).calls])
        if len(self.frames) == 1:
            self.entered.set()
            assert self.release.wait(10)
        return super().ask(host, frame, timeout)


def test_a_connections_threads_calls_to_one_host_go_in_one_ray_call_while_one_is_out() -> None:
    """While one thread's call to a host is out, the calls other threads make for that
    host wait and go together in the next Ray call; each thread gets its own answers."""
    hosts, numbers = HeldHosts(), CallNumbers()
    links = HostLinks(hosts)
    done: dict[int, Any] = {}

    def call(instance: int) -> None:
        sent = _call(numbers, instance)
        done[sent.number] = exchange(hosts, numbers, [sent], sync=True, timeout=10, links=links)

    first = threading.Thread(target=call, args=(0,))
    first.start()
    assert hosts.entered.wait(10)
    others = [threading.Thread(target=call, args=(instance,)) for instance in (1, 0, 1)]
    for thread in others:
        thread.start()
    while sum(len(queued._queue) for queued in links._links.values()) < 3:
        threading.Event().wait(0.01)  # the three queued behind the first
    hosts.release.set()
    for thread in [first, *others]:
        thread.join(10)
    assert hosts.frames == [[0], [1, 2, 3]]  # instances 0 and 1 are host 0's (4 over 2)
    assert all(d.unavailable is None and list(d.results) == [n] for n, d in done.items())
    assert sorted(done) == [0, 1, 2, 3]


def test_what_a_batch_raises_each_of_its_callers_raises() -> None:
    def work(jobs: list[int]) -> list[int]:
        raise OSError("disk")

    gather: Gather[int, int] = Gather(work)
    with pytest.raises(OSError, match="disk"):
        gather.submit(1)
    with pytest.raises(OSError, match="disk"):  # and the next batch is tried anew
        gather.submit(2)


class FakeCluster:
    """What deploy reads of a cluster before it starts anything."""

    def nodes(self) -> list[dict[str, Any]]:
        return [{"NodeID": "a", "Alive": True}, {"NodeID": "b", "Alive": False}]

    def cluster_resources(self) -> dict[str, float]:
        return {"CPU": 2.0, "node:10.0.0.5": 1.0, "disk-a": 1.0}


@pytest.mark.parametrize(
    ("nodes", "resources", "store", "named"),
    [
        (["a"], ["disk-a"], "/s/{host}", "nodes or resources, not both"),
        (None, ["disk-z"], "/s/{host}", "'disk-z'"),
        (None, ["disk-a", "disk-a"], "/s/{host}", "distinct"),
        (None, [], "/s/{host}", "no host can run"),
        (None, ["disk-a"], "/s/{node_id}", "{node_id}"),
        (["b"], None, "/s/{node_id}", "alive"),
    ],
)
def test_where_the_hosts_run_is_checked_before_anything_starts(
    nodes: list[str] | None, resources: list[str] | None, store: str, named: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(named)):
        _chosen(FakeCluster(), nodes, resources, store)


def test_hosts_run_on_their_nodes_or_by_their_resources() -> None:
    cluster = FakeCluster()
    assert [str(w) for w in _chosen(cluster, None, None, "/s/{node_id}")] == ["node a"]
    chosen = _chosen(cluster, None, ["node:10.0.0.5", "disk-a"], "/s/{host}")
    assert [str(w) for w in chosen] == ["resource 'node:10.0.0.5'", "resource 'disk-a'"]
