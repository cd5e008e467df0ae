"""Targeted dead letters: ``dead_letters``, ``redrive`` and ``purge_dead_letters`` by error
text, age, partition key, instance or a predicate (docs/api.md, "dead_letters").

Each filter is checked against a model: the full list of dead letters filtered in the
test. What a call lists, redrives or purges must be exactly what the model keeps, and a
refused call (a bad filter, a predicate that raises) must change nothing.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from dopool import (
    ConfigurationError,
    DeadLetter,
    EventContext,
    FilterError,
    PoolClosedError,
    PoolEvent,
    PoolStatus,
    Runtime,
    SimulatedClock,
    WorkerPool,
)
from status_support import counters

Filters = dict[str, Any]
API = Path(__file__).parents[2] / "docs" / "api.md"


class Flaky:
    """A handler that fails (TimeoutError or ValueError, by the event's kind) while broken."""

    def __init__(self) -> None:
        self.broken = True
        self.ran: list[tuple[int, int, int, int]] = []  # (n, instance, sequence, attempt)

    def __call__(self, ctx: EventContext) -> None:
        self.ran.append((ctx.event["n"], ctx.instance_index, ctx.sequence, ctx.attempt))
        if self.broken:
            kind = TimeoutError if ctx.event["kind"] == "timeout" else ValueError
            raise kind(f"{ctx.event['kind']} {ctx.event['n']}")


def clock_of(runtime: Runtime) -> SimulatedClock:
    clock = runtime.clock
    assert isinstance(clock, SimulatedClock)
    return clock


# (n, kind, partition key, when it is enqueued and fails)
PLAN = [
    (0, "timeout", "a", 0.0),
    (1, "bad", "b", 0.0),
    (2, "timeout", "a", 100.0),
    (3, "bad", None, 100.0),
    (4, "timeout", "b", 200.0),
    (5, "bad", "a", 200.0),
]


@pytest.fixture
def broken(sim: Runtime) -> tuple[WorkerPool, Flaky]:
    """Pool ``p`` (2 instances) holding PLAN's six dead letters; the clock stands at 200."""
    handler = Flaky()
    pool = sim.define("p", execute=handler, concurrency=2)
    for n, kind, key, at in PLAN:
        clock_of(sim).run_until(at)
        pool.enqueue({"n": n, "kind": kind}, partition_key=key)
        assert pool.join(timeout=10)
    letters = pool.dead_letters()
    assert sorted(letter.event["n"] for letter in letters) == [0, 1, 2, 3, 4, 5]
    assert {letter.instance_index for letter in letters} == {0, 1}
    handler.ran.clear()
    return pool, handler


def model(letters: list[DeadLetter], now: float, **filters: Any) -> list[DeadLetter]:
    """What the filters keep, by the documented rules, computed in the test."""
    kept = []
    for letter in letters:
        error = filters.get("error")
        if isinstance(error, str) and error not in letter.error:
            continue
        if isinstance(error, re.Pattern) and not error.search(letter.error):
            continue
        age = filters.get("older_than")
        if isinstance(age, timedelta):
            age = age.total_seconds()
        if age is not None and not letter.failed_at < now - age:
            continue
        key = filters.get("partition_key")
        if key is not None and letter.partition_key != key:
            continue
        index = filters.get("index")
        if index is not None and letter.instance_index != index:
            continue
        where = filters.get("where")
        if where is not None and not where(letter):
            continue
        kept.append(letter)
    return kept


def numbers(letters: list[DeadLetter]) -> list[int]:
    return sorted(letter.event["n"] for letter in letters)


ALONE: list[Filters] = [
    {"error": "TimeoutError"},
    {"error": re.compile(r"^ValueError: bad [35]$")},
    {"older_than": 150},
    {"older_than": timedelta(seconds=50)},
    {"older_than": 100},  # failed at 100 is not older than 100 at t=200
    {"partition_key": "a"},
    {"where": lambda letter: letter.event["n"] % 2 == 0},
    {"index": 1},
]
COMBINED: list[Filters] = [
    {"error": "TimeoutError", "partition_key": "a"},
    {"error": "Error", "older_than": 50, "partition_key": "a"},
    {"older_than": 50, "where": lambda letter: letter.event["kind"] == "bad"},
    {"error": "bad", "index": 0, "where": lambda letter: letter.event["n"] > 1},
]
CASES = ALONE + COMBINED
IDS = [f"{'+'.join(case)}-{number}" for number, case in enumerate(CASES)]


def test_every_case_keeps_some_and_drops_some(broken: tuple[WorkerPool, Flaky]) -> None:
    """The cases below would prove little if one kept everything or nothing."""
    pool, _ = broken
    letters = pool.dead_letters()
    for case in CASES:
        kept = model(letters, 200.0, **case)
        assert 0 < len(kept) < len(letters), case
    assert numbers(model(letters, 200.0, older_than=100)) == [0, 1]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_dead_letters_lists_what_matches(broken: tuple[WorkerPool, Flaky], case: Filters) -> None:
    pool, _ = broken
    everything = pool.dead_letters()
    options = dict(case)
    index = options.pop("index", None)
    assert pool.dead_letters(index, **options) == model(everything, 200.0, **case)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_redrive_moves_exactly_what_matches(
    sim: Runtime, broken: tuple[WorkerPool, Flaky], case: Filters
) -> None:
    pool, handler = broken
    everything = pool.dead_letters()
    wanted = model(everything, 200.0, **case)
    before = pool.status()
    seen: list[PoolEvent] = []
    sim.subscribe(seen.append)

    assert pool.redrive(**case) == len(wanted)

    assert pool.dead_letters() == [letter for letter in everything if letter not in wanted]
    after = pool.status()
    assert after.enqueued == before.enqueued + len(wanted)  # a redrive is a new enqueue
    assert after.pending == len(wanted)
    assert after.dead_lettered == before.dead_lettered
    tails = {i.index: i.enqueued for i in before.instances}  # the next sequence of each
    enqueued = [(e.instance_index, e.sequence) for e in seen if e.kind == "enqueued"]
    assert len(enqueued) == len(wanted)
    assert all(sequence is not None and sequence >= tails[i] for i, sequence in enqueued)

    handler.broken = False
    assert pool.join(timeout=10)
    assert sorted(n for n, _, _, _ in handler.ran) == numbers(wanted)
    for n, index, sequence, attempt in handler.ran:
        [old] = [letter for letter in wanted if letter.event["n"] == n]
        assert (index, attempt) == (old.instance_index, 1)  # its own instance, attempts reset
        assert sequence >= tails[index]  # a new sequence
    assert pool.status().succeeded == len(wanted)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_purge_deletes_exactly_what_matches_and_changes_no_counter(
    broken: tuple[WorkerPool, Flaky], case: Filters
) -> None:
    pool, _ = broken
    everything = pool.dead_letters()
    wanted = model(everything, 200.0, **case)
    before = pool.status()

    assert pool.purge_dead_letters(**case) == len(wanted)

    assert pool.dead_letters() == [letter for letter in everything if letter not in wanted]
    after = pool.status()
    assert counters(after) == counters(before)
    assert after.dead_letters_held == before.dead_letters_held - len(wanted)


def test_given_dead_letters_and_filters_both_hold(broken: tuple[WorkerPool, Flaky]) -> None:
    pool, _ = broken
    everything = pool.dead_letters()
    given = [letter for letter in everything if letter.event["n"] in (0, 1, 2)]
    assert pool.purge_dead_letters(given, error="TimeoutError") == 2  # 0 and 2
    assert numbers(pool.dead_letters()) == [1, 3, 4, 5]
    [one] = [letter for letter in everything if letter.event["n"] == 1]
    other = 1 - one.instance_index
    assert pool.redrive(given, index=other) == 0  # 1 is on the other instance
    assert pool.redrive(given, index=one.instance_index) == 1
    assert numbers(pool.dead_letters()) == [3, 4, 5]
    assert pool.redrive([]) == 0
    assert pool.purge_dead_letters([], error="x") == 0


def test_the_clock_of_the_runtime_measures_the_age(sim: Runtime) -> None:
    pool = sim.define("p", execute=Flaky())
    pool.enqueue({"n": 0, "kind": "bad"})
    assert pool.join(timeout=10)  # fails at t=0
    assert pool.dead_letters(older_than=0) == []  # failed at now: not older than 0
    clock_of(sim).advance(30)
    assert pool.dead_letters(older_than=timedelta(seconds=30)) == []
    assert numbers(pool.dead_letters(older_than=29.5)) == [0]
    assert pool.purge_dead_letters(older_than=60) == 0
    clock_of(sim).advance(31)
    assert pool.purge_dead_letters(older_than=60) == 1


# -- refused: nothing changes ----------------------------------------------------------------


def unchanged(pool: WorkerPool) -> Callable[[], None]:
    """A check that the pool's dead letters and counters are as they are now."""
    letters, status = pool.dead_letters(), pool.status()

    def check() -> None:
        assert pool.dead_letters() == letters
        assert pool.status() == status

    return check


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("older_than", -1),
        ("older_than", float("nan")),
        ("older_than", float("inf")),
        ("older_than", timedelta(seconds=-5)),
        ("older_than", 10**400),
        ("older_than", "5m"),
        ("older_than", True),
        ("error", b"Timeout"),
        ("error", 3),
        ("error", re.compile(b"Timeout")),
        ("partition_key", 7),
        ("partition_key", b"a"),
        ("where", "n > 1"),
        ("where", 3),
        ("erorr", "Timeout"),  # a misspelt filter is named, not ignored
    ],
)
def test_a_bad_filter_is_refused_and_changes_nothing(
    broken: tuple[WorkerPool, Flaky], argument: str, value: Any
) -> None:
    pool, _ = broken
    check = unchanged(pool)
    calls: list[Callable[..., Any]] = [pool.dead_letters, pool.redrive, pool.purge_dead_letters]
    for call in calls:
        with pytest.raises(FilterError) as info:
            call(**{argument: value})
        assert (info.value.argument, info.value.dead_letter) == (argument, None)
        assert info.value.value is value
        assert isinstance(info.value, ConfigurationError)
        assert argument in str(info.value)
        assert "nothing was selected" in str(info.value)
    check()


def test_a_misspelt_filter_gets_a_guess(broken: tuple[WorkerPool, Flaky]) -> None:
    pool, _ = broken
    with pytest.raises(FilterError, match="did you mean 'older_than'"):
        pool.redrive(older_then=5)  # type: ignore[call-arg]


@pytest.mark.parametrize("index", [2, -1, "0"])
def test_a_bad_index_is_refused(broken: tuple[WorkerPool, Flaky], index: Any) -> None:
    pool, _ = broken
    check = unchanged(pool)
    with pytest.raises(ConfigurationError, match="instance"):
        pool.purge_dead_letters(index=index, error="Timeout")
    check()


def test_a_given_record_of_no_instance_is_refused(broken: tuple[WorkerPool, Flaky]) -> None:
    pool, _ = broken
    check = unchanged(pool)
    forged = dataclasses.replace(pool.dead_letters()[0], instance_index=5)
    with pytest.raises(ConfigurationError, match="no instance 5"):
        pool.redrive([forged], error="Timeout")
    with pytest.raises(ConfigurationError, match="purge_dead_letters takes DeadLetter records"):
        pool.purge_dead_letters(["not a record"], error="Timeout")  # type: ignore[list-item]
    check()


def test_a_predicate_that_raises_changes_nothing_on_any_instance(
    broken: tuple[WorkerPool, Flaky],
) -> None:
    pool, _ = broken
    check = unchanged(pool)
    last = pool.dead_letters()[-1]  # the last one the predicate sees, every other kept

    def where(letter: DeadLetter) -> bool:
        if letter == last:
            raise ValueError("no such field")
        return True

    for call in (pool.dead_letters, pool.redrive, pool.purge_dead_letters):
        with pytest.raises(FilterError) as info:
            call(where=where)
        error = info.value
        assert (error.argument, error.value, error.dead_letter) == ("where", where, last)
        assert isinstance(error.__cause__, ValueError)
        assert "ValueError: no such field" in str(error)
        assert f"instance {last.instance_index}, sequence {last.sequence}" in str(error)
    check()


class Hostile:
    """A truth value that raises."""

    def __bool__(self) -> bool:
        raise RuntimeError("no truth")


def test_a_predicate_whose_answer_has_no_truth_changes_nothing(
    broken: tuple[WorkerPool, Flaky],
) -> None:
    pool, _ = broken
    check = unchanged(pool)
    with pytest.raises(FilterError, match="RuntimeError: no truth"):
        pool.redrive(where=lambda letter: Hostile())

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    def raise_unprintable(letter: DeadLetter) -> bool:
        raise Unprintable

    with pytest.raises(FilterError, match="Unprintable"):
        pool.purge_dead_letters(where=raise_unprintable)
    check()


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(3)], ids=["interrupt", "exit"])
def test_a_base_exception_from_a_predicate_reaches_the_caller_as_it_is(
    broken: tuple[WorkerPool, Flaky], exc: BaseException
) -> None:
    pool, _ = broken
    check = unchanged(pool)
    last = pool.dead_letters()[-1]

    def where(letter: DeadLetter) -> bool:
        if letter == last:
            raise exc
        return True

    with pytest.raises(type(exc)) as info:
        pool.redrive(where=where)
    assert info.value is exc
    check()


# -- a predicate is the caller's code: it may call back into the pool -----------------------------


def test_a_predicate_may_call_back_into_the_pool(
    sim: Runtime, broken: tuple[WorkerPool, Flaky]
) -> None:
    pool, handler = broken
    other = sim.define("other", execute=lambda ctx: None)
    everything = pool.dead_letters()
    first = everything[0]
    calls = []

    def where(letter: DeadLetter) -> bool:
        calls.append(pool.status().pending)
        other.enqueue(letter.event)
        if letter == first:  # redriven by the predicate itself: the outer call skips it
            assert pool.redrive([letter]) == 1
        return letter.event["kind"] == "timeout" or letter == first

    timeouts = [letter for letter in everything if letter.event["kind"] == "timeout"]
    outer = [letter for letter in timeouts if letter != first]
    assert pool.redrive(where=where) == len(outer)
    assert len(calls) == len(everything)
    left = [letter for letter in everything if letter not in outer and letter != first]
    assert pool.dead_letters() == left
    assert pool.status().pending == len(outer) + 1
    assert other.status().enqueued == len(everything)
    handler.broken = False
    assert pool.join(timeout=10)
    assert other.join(timeout=10)


@pytest.mark.parametrize("verb", ["redrive", "purge_dead_letters"])
def test_a_dead_letter_that_arrives_after_the_choice_is_left(sim: Runtime, verb: str) -> None:
    """The sequences chosen are exact: one dead-lettered meanwhile, though it would match,
    is neither redriven nor purged."""
    pool = sim.define("p", execute=Flaky())
    pool.enqueue({"n": 0, "kind": "timeout"})
    assert pool.join(timeout=10)
    late: list[int] = []

    def where(letter: DeadLetter) -> bool:
        if not late:  # a new dead letter of the same error, on the same instance
            late.append(pool.enqueue({"n": 1, "kind": "timeout"}).sequence)
            assert pool.join(timeout=10)
        return True

    assert getattr(pool, verb)(error="TimeoutError", where=where) == 1
    assert [letter.sequence for letter in pool.dead_letters()] == late


def test_a_predicate_that_closes_the_runtime_changes_nothing_more(sim: Runtime) -> None:
    pool = sim.define("p", execute=Flaky(), concurrency=3)
    pool.enqueue_many([{"n": n, "kind": "bad"} for n in range(3)])
    assert pool.join(timeout=10)

    def where(letter: DeadLetter) -> bool:
        sim.close()
        return True

    with pytest.raises(PoolClosedError):
        pool.redrive(where=where)
    with Runtime.simulated(sim.path) as reopened:
        assert len(reopened.define("p", execute=Flaky(), concurrency=3).dead_letters()) == 3


# -- from a handler ------------------------------------------------------------------------------


def test_a_handler_may_redrive_another_pools_dead_letters(
    sim: Runtime, broken: tuple[WorkerPool, Flaky]
) -> None:
    pool, handler = broken
    counts: list[int] = []

    def fix(ctx: EventContext) -> None:
        handler.broken = False
        counts.append(pool.redrive(error=ctx.event, where=lambda letter: letter.attempts == 1))

    fixer = sim.define("fixer", execute=fix)
    fixer.enqueue("TimeoutError")
    assert fixer.join(timeout=10)
    assert counts == [3]
    assert pool.join(timeout=10)
    assert numbers(pool.dead_letters()) == [1, 3, 5]


def test_a_handler_may_not_act_on_its_own_instance(sim: Runtime) -> None:
    asked: list[DeadLetter] = []
    refused: list[str] = []

    def handler(ctx: EventContext) -> None:
        if ctx.event == "fail":
            raise ValueError("x")
        for call in (pools[0].redrive, pools[0].purge_dead_letters):
            try:
                call(where=asked.append)
            except ConfigurationError as exc:
                refused.append(str(exc))

    pools = [sim.define("p", execute=handler)]
    pools[0].enqueue("fail")
    pools[0].enqueue("act")
    assert pools[0].join(timeout=10)
    assert len(refused) == 2
    assert all("wait on itself" in text for text in refused)
    assert asked == []  # refused before the predicate ran
    assert len(pools[0].dead_letters()) == 1


# -- a real clock ------------------------------------------------------------------------------


@pytest.fixture
def real(store_path: Path) -> Iterator[Runtime]:
    runtime = Runtime(store_path)
    yield runtime
    runtime.close()


@pytest.mark.threaded
def test_filters_under_a_real_clock(real: Runtime) -> None:
    handler = Flaky()
    pool = real.define("p", execute=handler, concurrency=2)
    other = real.define("other", execute=lambda ctx: None)
    for n, kind, key, _ in PLAN:
        pool.enqueue({"n": n, "kind": kind}, partition_key=key)
    assert pool.join(timeout=10)
    everything = pool.dead_letters()
    assert numbers(everything) == [0, 1, 2, 3, 4, 5]
    assert pool.dead_letters(older_than=timedelta(hours=1)) == []  # they failed just now
    assert pool.redrive(older_than=3600) == 0

    def where(letter: DeadLetter) -> bool:
        other.enqueue(letter.event)  # a call back into the runtime, from the caller's thread
        return bool(letter.event["n"] < 5)

    before = pool.status()
    assert pool.purge_dead_letters(partition_key="a", error="TimeoutError", where=where) == 2
    assert counters(pool.status()) == counters(before)
    assert numbers(pool.dead_letters()) == [1, 3, 4, 5]
    handler.broken = False
    assert pool.redrive(error=re.compile("bad [13]")) == 2
    assert pool.join(timeout=10)
    assert other.join(timeout=10)
    assert sorted(n for n, _, _, _ in handler.ran[-2:]) == [1, 3]
    assert numbers(pool.dead_letters()) == [4, 5]
    status: PoolStatus = pool.status()
    assert (status.enqueued, status.succeeded, status.dead_lettered) == (8, 2, 6)


def test_the_api_reference_example_runs() -> None:
    text = API.read_text(encoding="utf-8")
    marker = "A pool whose handler failed for an hour on a service that was down"
    block = re.search(re.escape(marker) + r".*?```python\n(.*?)```", text, re.DOTALL)
    assert block is not None
    exec(compile(block.group(1), str(API), "exec"), {})  # its asserts are the test
