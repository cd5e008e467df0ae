"""Which dead letters a call means: the filters of ``dead_letters``, ``redrive`` and
``purge_dead_letters``, checked once, and the stored dead letters matched against them.

Matching reads committed state, outside every instance. The filters on stored fields
(``error``, ``older_than``, ``partition_key``) run in the read transaction; a ``where``
predicate is the caller's code, so it runs after that transaction has closed, in the
caller's thread, where it may call back into the pool and cannot hold up an instance.
A redrive or purge then sends each instance the sequences that matched. A dead letter
never changes once stored, and a sequence names one record for good, so the instance
removes exactly those of its set still there: what matched, and nothing else.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any

from dopool._errors import ConfigurationError, FilterError, shown
from dopool._machine.status import dead_letter_from_record
from dopool._store.layout import DeadRecord, Namespace
from dopool._store.txn import Txn
from dopool._types import DeadLetter
from dopool._usercode import deferring, ran

Read = Callable[[], AbstractContextManager["Txn"]]


@dataclass(frozen=True, kw_only=True, slots=True)
class Filters:
    """What a dead letter must match, every filter given (None: any).

    Attributes:
        error: text its error contains, or a compiled pattern ``search`` finds in it.
        older_than: seconds (a timedelta is accepted, and kept as seconds): it
            failed before the clock's now minus this.
        partition_key: its partition key, exactly.
        where: a predicate ``DeadLetter -> bool`` (its result's truth).
    """

    error: str | re.Pattern[str] | None = None
    older_than: float | timedelta | None = None
    partition_key: str | None = None
    where: Callable[[DeadLetter], object] | None = None

    def __post_init__(self) -> None:
        error = self.error
        pattern = isinstance(error, re.Pattern) and isinstance(error.pattern, str)
        if error is not None and not isinstance(error, str) and not pattern:
            raise FilterError("error", error, "it takes text or a compiled str pattern")
        if self.older_than is not None:
            object.__setattr__(self, "older_than", _age(self.older_than))
        key = self.partition_key
        if key is not None and not isinstance(key, str):
            raise FilterError("partition_key", key, "a partition key is a str")
        if self.where is not None and not callable(self.where):
            raise FilterError("where", self.where, "it takes a callable DeadLetter -> bool")
        kind = deferring(self.where)
        if kind is not None:  # its coroutine, a true value, would choose every dead letter
            raise FilterError("where", self.where, f"{kind}: it takes a plain DeadLetter -> bool")

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> Filters:
        """Filters from a call's keywords; an unknown keyword is named, with a guess."""
        known = [spec.name for spec in fields(cls)]
        for name, value in options.items():
            if name not in known:
                close = difflib.get_close_matches(name, [*known, "index"], n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise FilterError(name, value, f"no such filter ({', '.join(known)}){hint}")
        return cls(**options)

    @property
    def given(self) -> bool:
        """Whether any filter is given (else every dead letter matches)."""
        return not (
            self.error is None
            and self.older_than is None
            and self.partition_key is None
            and self.where is None
        )

    def cutoff(self, now: float) -> float | None:
        """The time a dead letter must have failed before, for a clock standing at ``now``."""
        if self.older_than is None:
            return None
        return now - self.older_than  # type: ignore[operator]  # seconds, from __post_init__

    def keeps_record(self, record: DeadRecord, cutoff: float | None) -> bool:
        """Whether a stored dead letter matches the filters on its fields (not ``where``)."""
        if self.partition_key is not None and record.partition_key != self.partition_key:
            return False
        if cutoff is not None and not record.failed_at < cutoff:
            return False
        error = self.error
        if error is None:
            return True
        if isinstance(error, str):
            return error in record.error
        return error.search(record.error) is not None

    def keeps(self, letter: DeadLetter) -> bool:
        """Whether ``where`` holds for ``letter`` (True without one).

        Raises:
            FilterError: the predicate, or its result's truth, raised an Exception.
        """
        where = self.where
        if where is None:
            return True
        try:
            return bool(ran(where(letter), "the where predicate"))
        except Exception as exc:
            raise FilterError("where", where, _described(exc), dead_letter=letter) from exc


def _age(value: object) -> float:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:  # an int past a float's range
            raise FilterError("older_than", value, "too large a number of seconds") from None
    else:
        raise FilterError("older_than", value, "it takes seconds or a timedelta")
    if not math.isfinite(seconds) or seconds < 0:
        raise FilterError("older_than", value, "it takes a finite age >= 0")
    return seconds


def _described(exc: Exception) -> str:
    """``"Type: text"`` of an exception raised by the caller's code (its text may raise too)."""
    try:
        text = str(exc)
    except Exception:
        text = "(its text cannot be shown)"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def listed(
    read: Read,
    pool: str,
    indices: Iterable[int],
    filters: Filters,
    now: float,
) -> list[DeadLetter]:
    """The dead letters of ``indices`` that match, by instance then sequence.

    One snapshot for every instance; the ``where`` predicate runs after it closed.
    """
    cutoff = filters.cutoff(now)
    with read() as txn:
        found = [
            dead_letter_from_record(index, sequence, record)
            for index in indices
            for sequence, record in Namespace(pool, index).iter_dead_letters(txn)
            if filters.keeps_record(record, cutoff)
        ]
    if filters.where is None:
        return found
    return [letter for letter in found if filters.keeps(letter)]


def chosen(
    read: Read,
    pool: str,
    indices: Iterable[int],
    filters: Filters,
    now: float,
    among: Mapping[int, Collection[int]] | None = None,
) -> dict[int, frozenset[int]]:
    """The sequences that match, by instance (none empty), ``among`` those given if any.

    Each instance is read in its own snapshot, and what the predicate sees of one is
    built only after its snapshot closed: the memory held is one instance's matches.
    """
    if among is not None and not filters.given:  # nothing to read
        return {index: frozenset(among[index]) for index in indices if among.get(index)}
    cutoff = filters.cutoff(now)
    picked: dict[int, frozenset[int]] = {}
    for index in indices:
        wanted = None if among is None else among.get(index)
        if among is not None and not wanted:
            continue
        with read() as txn:
            found = [
                (sequence, record)
                for sequence, record in Namespace(pool, index).iter_dead_letters(txn)
                if (wanted is None or sequence in wanted) and filters.keeps_record(record, cutoff)
            ]
        if filters.where is not None:
            found = [
                (sequence, record)
                for sequence, record in found
                if filters.keeps(dead_letter_from_record(index, sequence, record))
            ]
        if found:
            picked[index] = frozenset(sequence for sequence, _ in found)
    return picked


def by_instance(
    dead_letters: Iterable[object], check: Callable[[int], int], verb: str
) -> dict[int, set[int]]:
    """The sequences of ``dead_letters``, by instance (each checked by ``check``).

    Raises:
        ConfigurationError: an item is not a :class:`DeadLetter`.
    """
    among: dict[int, set[int]] = {}
    for dead in dead_letters:
        if not isinstance(dead, DeadLetter):
            raise ConfigurationError(f"{verb} takes DeadLetter records, got {shown(dead)}")
        among.setdefault(check(dead.instance_index), set()).add(dead.sequence)
    return among
