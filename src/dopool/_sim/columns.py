"""Per-event figures of a run, stored as columns indexed by sequence.

A run keeps a few numbers for each event until its report is made: when it
arrived, was stored, succeeded, which attempt succeeded. Kept in dicts keyed by
``(instance, sequence)`` tuples they cost ~100 bytes a figure, so a run of an
hour of traffic (millions of events) needed gigabytes. An instance's sequences
are consecutive from 0 (docs/guarantees.md, "Counters"), so each figure is a
typed array per instance instead, indexed by sequence: 8 bytes a figure (one
for a mark). A gap (a sequence with no figure, e.g. an event still pending)
holds a marker that reads as absent: NaN for a time, -1 for a number, 0 for a
mark.

The classes are read-only mappings keyed by ``(instance, sequence)`` for the
report's code; the collector, which writes a figure per pool event, reaches
the arrays themselves (``columns``) and writes them with :func:`put`.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Mapping, Sequence
from itertools import repeat
from math import isnan, nan
from typing import Any

Key = tuple[int, int]  # (instance index, sequence)


def put(column: array[Any], sequence: int, value: float, absent: float) -> None:
    """Set ``column[sequence]``, first filling any gap before it with ``absent``."""
    size = len(column)
    if sequence == size:  # the usual case: sequences come in order
        column.append(value)
    elif sequence < size:
        column[sequence] = value
    else:
        column.extend(repeat(absent, sequence - size))
        column.append(value)


class Times(Mapping[Key, float]):
    """A time per event (a time is never NaN: NaN marks none)."""

    __slots__ = ("columns",)

    def __init__(self, instances: int) -> None:
        self.columns = [array("d") for _ in range(instances)]

    def put(self, key: Key, time: float) -> None:
        """Set the event's time (replacing one it had)."""
        put(self.columns[key[0]], key[1], time, nan)

    def overlaid(self, other: Times) -> Times:
        """A copy of these times, each replaced by ``other``'s where it has one."""
        merged = Times(len(self.columns))
        merged.columns = [array("d", column) for column in self.columns]
        for key, time in other.items():
            merged.put(key, time)
        return merged

    def __getitem__(self, key: Key) -> float:
        index, sequence = key
        if index < 0 or sequence < 0:
            raise KeyError(key)
        try:
            time = self.columns[index][sequence]
        except IndexError:
            raise KeyError(key) from None
        if isnan(time):
            raise KeyError(key)
        return time

    def __contains__(self, key: object) -> bool:
        try:
            self[key]  # type: ignore[index]
        except (KeyError, TypeError, ValueError):
            return False
        return True

    def __iter__(self) -> Iterator[Key]:
        for key, _ in self.items():
            yield key

    def __len__(self) -> int:
        """How many events have a time: a count over the columns, not a stored size."""
        return sum(1 for _ in self.items())

    def items(self) -> Iterator[tuple[Key, float]]:  # type: ignore[override]
        """``(key, time)`` by instance, then sequence: one pass, no lookups."""
        for index, column in enumerate(self.columns):
            for sequence, time in enumerate(column):
                if not isnan(time):
                    yield (index, sequence), time


class Numbers(Mapping[Key, int]):
    """A number ≥ 0 per event (an attempt, a request id); -1 marks none."""

    __slots__ = ("columns",)

    def __init__(self, instances: int) -> None:
        self.columns = [array("q") for _ in range(instances)]

    def put(self, key: Key, number: int) -> None:
        """Set the event's number (replacing one it had)."""
        if number < 0:
            raise ValueError(f"a column holds numbers >= 0, not {number}")
        put(self.columns[key[0]], key[1], number, -1)

    def __getitem__(self, key: Key) -> int:
        index, sequence = key
        if index < 0 or sequence < 0:
            raise KeyError(key)
        try:
            number = self.columns[index][sequence]
        except IndexError:
            raise KeyError(key) from None
        if number < 0:
            raise KeyError(key)
        return number

    def __contains__(self, key: object) -> bool:
        try:
            self[key]  # type: ignore[index]
        except (KeyError, TypeError, ValueError):
            return False
        return True

    def __iter__(self) -> Iterator[Key]:
        for key, _ in self.items():
            yield key

    def __len__(self) -> int:
        """How many events have a number: a count over the columns."""
        return sum(1 for _ in self.items())

    def items(self) -> Iterator[tuple[Key, int]]:  # type: ignore[override]
        """``(key, number)`` by instance, then sequence."""
        for index, column in enumerate(self.columns):
            for sequence, number in enumerate(column):
                if number >= 0:
                    yield (index, sequence), number


class Marks:
    """A set of events, one byte per sequence."""

    __slots__ = ("columns",)

    def __init__(self, instances: int) -> None:
        self.columns = [array("b") for _ in range(instances)]

    def add(self, key: Key) -> None:
        put(self.columns[key[0]], key[1], 1, 0)

    def __contains__(self, key: object) -> bool:
        if not (isinstance(key, tuple) and len(key) == 2):
            return False
        index, sequence = key
        if not (isinstance(index, int) and isinstance(sequence, int)):
            return False
        if index < 0 or sequence < 0 or index >= len(self.columns):
            return False
        column = self.columns[index]
        return sequence < len(column) and column[sequence] == 1

    def __iter__(self) -> Iterator[Key]:
        for index, column in enumerate(self.columns):
            for sequence, marked in enumerate(column):
                if marked:
                    yield (index, sequence)

    def __len__(self) -> int:
        return sum(column.count(1) for column in self.columns)


class Steps(Sequence[tuple[float, int]]):
    """A step series of ``(time, value)`` points, read from two parallel arrays."""

    __slots__ = ("_times", "_values")

    def __init__(self, times: array[float], values: array[int]) -> None:
        self._times = times
        self._values = values

    def __len__(self) -> int:
        return len(self._times)

    def __getitem__(self, position: int) -> tuple[float, int]:  # type: ignore[override]
        return self._times[position], self._values[position]

    def __iter__(self) -> Iterator[tuple[float, int]]:
        return zip(self._times, self._values, strict=True)
