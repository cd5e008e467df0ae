"""Cron expressions are read in UTC whatever the machine's local time zone (docs/api.md,
"Recurring schedules"; docs/guarantees.md, "Times").

The other schedule tests run in the machine's zone, which is UTC where they run, so a
cron read in local time passes them. Here the process's zone (``TZ``, applied with
``time.tzset``) is one with daylight saving time, and the expected fire times are
counted in UTC by arithmetic, not by cronsim: in a simulated runtime across each zone's
changes of 2024, from a producer (``dopool.connect``) on the wall clock, and in a
``dopool worker`` process whose environment names the zone.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import dopool
from dopool import EventContext, Runtime, SimulatedClock
from worker_support import Evidence, Worker

DAY = 86400.0
HOUR = 3600.0


@contextmanager
def local_time(zone: str) -> Iterator[None]:
    """This process's local time zone is ``zone`` (and its children's: they inherit
    ``TZ``), then the one it had."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TZ", zone)
        time.tzset()
        try:
            yield
        finally:
            patch.undo()
            time.tzset()


def offset(at: float) -> int:
    """Local time's offset from UTC at clock time ``at``, in seconds."""
    return time.localtime(at).tm_gmtoff


# Each expression as its UTC times: (minute, hours, Sundays only). Read as local times
# instead, their fields fall in the gaps and overlaps of the zones below (01:00-03:00
# local on the day of a change, a Sunday).
EXPRESSIONS: dict[str, tuple[int, range, bool]] = {
    "0 3 * * *": (0, range(3, 4), False),
    "30 1 * * *": (30, range(1, 2), False),
    "30 2 * * *": (30, range(2, 3), False),
    "15 2 * * *": (15, range(2, 3), False),
    "45 1 * * *": (45, range(1, 2), False),
    "0 * * * 0": (0, range(24), True),  # hourly on Sundays (UTC): the changes' day
}


def utc_times(expression: str, after: float, until: float) -> list[float]:
    """The times of ``expression`` in (``after``, ``until``], read in UTC."""
    minute, hours, sundays = EXPRESSIONS[expression]
    days = range(math.floor(after / DAY), math.floor(until / DAY) + 1)
    found = [
        day * DAY + hour * HOUR + minute * 60
        for day in days
        if not sundays or (day + 4) % 7 == 0  # 1970-01-01 (day 0) was a Thursday
        for hour in hours
    ]
    return [at for at in found if after < at <= until]


def next_utc(expression: str, after: float) -> float:
    return utc_times(expression, after, after + 8 * DAY)[0]


# The zones' changes of 2024, the UTC day each falls on (as days since 1970-01-01):
# New York 03-10 07:00Z (02:00 EST -> 03:00 EDT) and 11-03 06:00Z (02:00 EDT -> 01:00
# EST); London 03-31 and 10-27 at 01:00Z; Lord Howe, half an hour each way, 04-06
# 15:00Z (02:00 -> 01:30, 7 April local) and 10-05 15:30Z (02:00 -> 02:30, 6 October).
CHANGES = [
    pytest.param("America/New_York", 19792, id="new_york-spring"),
    pytest.param("America/New_York", 20030, id="new_york-fall"),
    pytest.param("Europe/London", 19813, id="london-spring"),
    pytest.param("Europe/London", 20023, id="london-fall"),
    pytest.param("Australia/Lord_Howe", 19819, id="lord_howe-fall"),
    pytest.param("Australia/Lord_Howe", 20001, id="lord_howe-spring"),
]


@pytest.mark.parametrize(("zone", "change_day"), CHANGES)
def test_cron_fires_at_its_utc_times_across_a_local_daylight_saving_change(
    tmp_path: Path, zone: str, change_day: int
) -> None:
    """Three days either side of the change, each expression fires at its UTC times, and
    only those: the first fire time, every fire, and the next fire time after them."""
    start = (change_day - 3) * DAY + 1234.5
    end = (change_day + 4) * DAY - 0.5
    fired: dict[str, list[float]] = {expression: [] for expression in EXPRESSIONS}

    def handler(ctx: EventContext) -> None:
        fired[ctx.event].append(ctx.enqueued_at)

    with local_time(zone):
        assert offset(start) != offset(end), f"no change of {zone}'s offset in the window"
        with Runtime.simulated(tmp_path / "store", start=start) as runtime:
            pool = runtime.define("p", execute=handler, concurrency=2)
            for expression in EXPRESSIONS:
                info = pool.schedule(expression, expression, cron=expression)
                assert info.next_at == next_utc(expression, start), expression
            clock = runtime.clock
            assert isinstance(clock, SimulatedClock)
            clock.run_until(end)
            infos = {info.name: info for info in pool.schedules()}
    for expression, times in fired.items():
        expected = utc_times(expression, start, end)
        assert times == expected, expression
        info = infos[expression]
        assert (info.fired, info.coalesced) == (len(expected), 0), expression
        assert info.last_fired_at == expected[-1], expression
        assert info.next_at == next_utc(expression, end), expression


# Zones that are not UTC on any day (London is UTC in winter, where a local reading and
# a UTC one agree): for the tests on the wall clock, whatever today is.
WALL_ZONES = ["America/New_York", "Australia/Lord_Howe"]


@pytest.mark.threaded
@pytest.mark.parametrize("zone", WALL_ZONES)
def test_a_producers_cron_schedule_fires_first_at_its_next_utc_time(
    tmp_path: Path, zone: str
) -> None:
    store = tmp_path / "store"
    with Runtime(store) as runtime:
        runtime.define("jobs", execute=lambda ctx: None, concurrency=2)
    with local_time(zone), dopool.connect(store) as connection:
        jobs = connection.pool("jobs")
        before = time.time()
        infos = {e: jobs.schedule(e, e, cron=e) for e in EXPRESSIONS}
        after = time.time()
        assert offset(after) != 0
    for expression, info in infos.items():
        # The definition's time lies between the two readings: its next time is theirs
        # (they differ only if a fire time fell between them).
        expected = {next_utc(expression, before), next_utc(expression, after)}
        assert info.next_at in expected, expression


@pytest.mark.threaded
@pytest.mark.parametrize("zone", WALL_ZONES)
def test_a_worker_process_in_another_zone_fires_cron_at_its_utc_times(
    store_path: Path, evidence: Evidence, worker: Callable[..., Worker], zone: str
) -> None:
    """A schedule defined two and a half days ago (in a simulated runtime, here in UTC) is
    late when the worker starts: it fires at once, one occurrence for the times that
    passed, and moves to the next UTC time after the fire. The worker alone has another
    zone, so what is checked was computed in its process."""
    defined = time.time() - 2.5 * DAY
    expression = "0 3 * * *"
    with Runtime(store_path, clock=SimulatedClock(defined)) as runtime:
        pool = runtime.define("jobs", execute=lambda ctx: None, concurrency=2)
        first = pool.schedule("nightly", {"p": "cron", "k": 0}, cron=expression).next_at
    assert first == next_utc(expression, defined)
    with local_time(zone):
        assert offset(time.time()) != 0
        owner = worker(store_path, evidence)  # TZ=zone in its environment
    owner.ready()
    evidence.wait_for("the late fire's occurrence", e="end", p="cron")
    with dopool.connect(store_path) as connection:
        (info,) = connection.pool("jobs").schedules()
    assert owner.stop() == 0
    assert info.fired == 1
    assert info.last_fired_at is not None
    missed = utc_times(expression, defined, info.last_fired_at)
    assert info.coalesced == len(missed) - 1
    assert info.next_at == next_utc(expression, info.last_fired_at)
