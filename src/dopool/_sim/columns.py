"""Per-event figures of a run, stored as columns indexed by sequence.

A run keeps a few numbers for each event until its report is made: when it
arrived, was stored, succeeded, which attempt succeeded. Kept in dicts keyed by
``(instance, sequence)`` tuples they cost ~100 bytes a figure, so a run of an
hour of traffic (millions of events) needed gigabytes. An instance's sequences
are consecutive from 0 (docs/guarantees.md, "Counters"), so each figure is a
typed array per instance instead, indexed by sequence: 8 bytes a figure (one
for a mark). A gap (a sequence with no figure, e.g. an event still pending)
holds a marker that reads as absent: NaN for a time, -1 for a number, 0 for a
mark. An instance's array is made with its first figure (:class:`Arrays`), so a run
keeps nothing for the instances it never used: a pool of a million, or a per-key
one, costs what its used instances do.

The classes are read-only mappings keyed by ``(instance, sequence)`` for the
report's code; the collector, which writes a figure per pool event, reaches
the arrays themselves (``columns``) and writes them with :func:`put`.
"""

from __future__ import annotations

from abc import abstractmethod
from array import array
from collections.abc import Iterator, Mapping, Sequence
from itertools import repeat
from math import isnan, nan
from typing import Any, TypeVar

Key = tuple[int, int]  # (instance index, sequence)
V = TypeVar("V", float, int)


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


class Arrays(dict[int, "array[Any]"]):
    """Each instance's array of a column, by index: looking an instance up makes its
    (empty) array if it has none, as the collector writes a figure; readers use ``get``,
    which makes nothing. Iterated in the order the instances were first written to."""

    __slots__ = ("code",)

    def __init__(self, code: str) -> None:
        super().__init__()
        self.code = code

    def __missing__(self, index: int) -> array[Any]:
        made = self[index] = array(self.code)
        return made

    def by_index(self) -> list[tuple[int, array[Any]]]:
        """``(index, array)`` by instance index."""
        return sorted(self.items(), key=_first)


def _first(item: tuple[int, Any]) -> int:
    return item[0]


class _Column(Mapping[Key, V]):
    """A figure per event, read as a mapping; :meth:`_absent` says which values mark
    none. Subclasses give the array's type code and the marker."""

    __slots__ = ("columns",)
    _code: str
    _marker: float

    def __init__(self) -> None:
        self.columns = Arrays(self._code)

    @staticmethod
    @abstractmethod
    def _absent(value: Any) -> bool:
        """Whether ``value`` is the marker of no figure."""

    def _put(self, key: Key, value: float) -> None:
        put(self.columns[key[0]], key[1], value, self._marker)

    def __getitem__(self, key: Key) -> V:
        index, sequence = key
        if index < 0 or sequence < 0:
            raise KeyError(key)
        column = self.columns.get(index)
        try:
            value: V = column[sequence]  # type: ignore[index]
        except (IndexError, TypeError):  # (TypeError: no column)
            raise KeyError(key) from None
        if self._absent(value):
            raise KeyError(key)
        return value

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
        """How many events have a value: a count over the columns, not a stored size."""
        return sum(1 for _ in self.items())

    def items(self) -> Iterator[tuple[Key, V]]:  # type: ignore[override]
        """``(key, value)`` by instance, then sequence: one pass, no lookups."""
        absent = self._absent
        for index, column in self.columns.by_index():
            for sequence, value in enumerate(column):
                if not absent(value):
                    yield (index, sequence), value


class Times(_Column[float]):
    """A time per event (a time is never NaN: NaN marks none)."""

    __slots__ = ()
    _code, _marker = "d", nan

    @staticmethod
    def _absent(value: Any) -> bool:
        return isnan(value)

    def __len__(self) -> int:
        """How many events have a time: each column's length less its NaNs, counted
        without a Python call per event."""
        return sum(len(column) - sum(map(isnan, column)) for column in self.columns.values())

    def put(self, key: Key, time: float) -> None:
        """Set the event's time (replacing one it had)."""
        self._put(key, time)

    def overlaid(self, other: Times) -> Times:
        """A copy of these times, each replaced by ``other``'s where it has one."""
        merged = Times()
        for index, column in self.columns.items():
            merged.columns[index] = array("d", column)
        for key, time in other.items():
            merged.put(key, time)
        return merged


def differences(ends: Times, starts: Times) -> list[float]:
    """``ends - starts`` for each event with both, by instance then sequence: column by
    column (a run measures one per event)."""
    samples = []
    began_at = starts.columns
    for index, done in ends.columns.by_index():
        began = began_at.get(index)
        if began is None:
            continue
        for end, start in zip(done, began, strict=False):
            if not (isnan(end) or isnan(start)):
                samples.append(end - start)
    return samples


class Numbers(_Column[int]):
    """A number >= 0 per event (an attempt, a request id); -1 marks none."""

    __slots__ = ()
    _code, _marker = "q", -1

    @staticmethod
    def _absent(value: Any) -> bool:
        return bool(value < 0)

    def put(self, key: Key, number: int) -> None:
        """Set the event's number (replacing one it had)."""
        if number < 0:
            raise ValueError(f"a column holds numbers >= 0, not {number}")
        self._put(key, number)


class Marks:
    """A set of events, one byte per sequence."""

    __slots__ = ("columns",)

    def __init__(self) -> None:
        self.columns = Arrays("b")

    def add(self, key: Key) -> None:
        put(self.columns[key[0]], key[1], 1, 0)

    def __contains__(self, key: object) -> bool:
        if not (isinstance(key, tuple) and len(key) == 2):
            return False
        index, sequence = key
        if not (isinstance(index, int) and isinstance(sequence, int)):
            return False
        column = self.columns.get(index)
        if column is None or sequence < 0:
            return False
        return sequence < len(column) and column[sequence] == 1

    def __iter__(self) -> Iterator[Key]:
        for index, column in self.columns.by_index():
            for sequence, marked in enumerate(column):
                if marked:
                    yield (index, sequence)

    def __len__(self) -> int:
        return sum(column.count(1) for column in self.columns.values())


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
