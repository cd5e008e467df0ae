"""The simulator's per-event figures: columns indexed by sequence, and what a run keeps."""

from __future__ import annotations

import math
import tracemalloc

import pytest

from dopool._sim.columns import Marks, Numbers, Steps, Times, put
from dopool._sim.driver import run
from dopool._sim.scenario import Arrivals, Scenario, Service


def test_times_read_like_a_dict_and_gaps_read_as_absent() -> None:
    times = Times()
    times.put((0, 0), 1.5)
    times.put((0, 3), 2.5)  # a gap: sequences 1 and 2 have no time
    times.put((1, 0), 0.0)
    assert (0, 0) in times
    assert (0, 3) in times
    assert (1, 0) in times
    assert (0, 1) not in times
    assert (0, 9) not in times
    assert (2, 0) not in times
    assert (0, -1) not in times
    assert times[(0, 3)] == 2.5
    assert times.get((0, 2)) is None
    with pytest.raises(KeyError):
        times[(0, 1)]
    assert list(times.items()) == [((0, 0), 1.5), ((0, 3), 2.5), ((1, 0), 0.0)]
    assert list(times) == [(0, 0), (0, 3), (1, 0)]
    assert len(times) == 3
    times.put((0, 1), 9.0)  # fills the gap
    times.put((0, 0), 4.0)  # replaces
    assert dict(times.items()) == {(0, 0): 4.0, (0, 1): 9.0, (0, 3): 2.5, (1, 0): 0.0}


def test_numbers_and_marks() -> None:
    numbers = Numbers()
    numbers.put((0, 2), 7)
    assert list(numbers.items()) == [((0, 2), 7)]
    assert (0, 0) not in numbers
    assert numbers[(0, 2)] == 7
    assert len(numbers) == 1
    numbers.put((0, 0), 0)  # 0 is a number, not a gap
    assert numbers[(0, 0)] == 0
    assert len(numbers) == 2
    with pytest.raises(ValueError, match=">= 0"):
        numbers.put((0, 1), -1)

    marks = Marks()
    marks.add((1, 4))
    marks.add((1, 4))
    assert (1, 4) in marks
    assert (1, 3) not in marks
    assert (0, 4) not in marks
    assert (5, 0) not in marks
    assert (1, "x") not in marks
    assert list(marks) == [(1, 4)]
    assert len(marks) == 1


def test_put_appends_fills_and_replaces() -> None:
    from array import array

    column = array("d")
    put(column, 0, 1.0, math.nan)
    put(column, 2, 3.0, math.nan)
    put(column, 1, 2.0, math.nan)
    assert list(column) == [1.0, 2.0, 3.0]


def test_a_step_series_reads_as_points() -> None:
    from array import array

    steps = Steps(array("d", (0.0, 1.0, 2.5)), array("q", (0, 3, 1)))
    assert len(steps) == 3
    assert steps[1] == (1.0, 3)
    assert list(steps) == [(0, 0), (1, 3), (2.5, 1)]


def _scenario(events: int) -> Scenario:
    return Scenario(
        name="memory",
        seed=4,
        instances=8,
        arrivals=(Arrivals(process="poisson", rate=100.0, total=events),),
        service=Service(distribution="exponential", mean=0.05),
    )


def _peak(events: int) -> int:
    tracemalloc.start()
    try:
        result = run(_scenario(events))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.result.latency.count == events
    return peak


def test_a_run_keeps_a_few_hundred_bytes_per_event_at_most() -> None:
    """What a run holds grows with its events by the figures it keeps of each: arrays
    (dopool._sim.columns), not dicts of tuples, which took ~1.5 KiB an event."""
    small, large = _peak(2_000), _peak(6_000)
    per_event = (large - small) / 4_000
    assert per_event < 600, f"{per_event:.0f} bytes per event"
