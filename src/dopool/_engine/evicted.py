"""One timer per runtime for the alarms of its evicted instances.

A running instance tells the clock of its own alarm slot. An evicted one has no actor to
do so: its alarm stays in the store, in the store-wide alarm index (due time, pool,
instance; :mod:`dopool._store.layout`), written in the same transaction that set it. The
runtime keeps one clock alarm, :class:`EvictedAlarms`, at the earliest alarm an instance
had when it was evicted; when it fires, it reads the index from its start, starts every
instance of a defined pool that is not running and whose alarm is due (its recovery
re-arms that alarm, which fires at once), and sets itself for the next one due.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from dopool._clock.clocks import Clock
from dopool._engine.cells import Cells
from dopool._store.layout import alarm_index, parse_alarm_entry


class EvictedAlarms:
    """The runtime's timer for its evicted instances' alarms (see the module docstring).

    Args:
        clock: the runtime's clock, which fires it.
        read: a read-only snapshot of the store.
        pools: a defined pool's instances by name (None for a pool not defined here).
    """

    order = ("", 0)  # fired before any instance's alarm due at the same time

    def __init__(
        self,
        clock: Clock,
        read: Callable[[], AbstractContextManager[Any]],
        pools: Callable[[str], Cells | None],
    ) -> None:
        self._clock = clock
        self._read = read
        self._pools = pools
        self._lock = threading.Lock()
        self._at: float | None = None  # when the clock fires it; None: not set

    def note(self, due: float) -> None:
        """An instance evicted with its alarm due at ``due``: fire by then."""
        with self._lock:
            if self._at is not None and self._at <= due:
                return
            self._at = due
        self._clock.set_alarm(self, due)

    def fire_alarm(self) -> None:
        """Start the evicted instances whose alarm is due; set the timer for the next."""
        with self._lock:
            self._at = None
        now = self._clock.now()
        due: list[tuple[Cells, int]] = []
        later: float | None = None
        with self._read() as txn:
            for key in alarm_index(txn):
                entry = parse_alarm_entry(key)
                if entry is None:
                    continue  # not an entry of the layout: dopool check reports it
                at, pool, index = entry
                cells = self._pools(pool)
                if cells is None or not 0 <= index < len(cells) or cells.get(index) is not None:
                    continue  # not defined here, a stray entry, or running: its own alarm
                if at > now:
                    later = at
                    break
                due.append((cells, index))
        for cells, index in due:
            cells.open(index)  # started: its recovery re-arms its alarm, due now
        if later is not None:
            self.note(later)

    def close(self) -> None:
        """The runtime is closing: fire no more."""
        with self._lock:
            self._at = None
        self._clock.set_alarm(self, None)
