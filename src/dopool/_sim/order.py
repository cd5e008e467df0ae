"""The order of a pool's starts with delayed arrivals, checked at the end of a run.

Without delays an instance starts its events in sequence, which the collector checks
as they start (:class:`~dopool._sim.metrics.Collector`). A delayed arrival is not due
until its delay ends, and events due before it start first; the check then needs the
due times, which the run knows only once each enqueue is answered.
"""

from __future__ import annotations

from array import array
from math import nan

from dopool._sim.columns import Times
from dopool._sim.metrics import Collector, note


def check_delayed_order(collector: Collector, due_at: Times) -> None:
    """With delayed arrivals: that each instance started no event before it was due,
    and its events in the order of their due times, then sequences
    (docs/guarantees.md, "Order"). An event is due when it was stored, or at the end
    of its delay (``due_at``) if that is later. Each start was the first due event
    then, and an event stored later is due later: so the first starts must come in
    increasing (due, sequence) order."""
    empty: array[float] = array("d")
    for index, track in collector.tracks.by_index():
        stored = collector.enqueued_at.columns.get(index, empty)
        delayed = due_at.columns.get(index, empty)
        previous: tuple[float, int] | None = None
        for sequence, started in zip(track.first_starts, track.first_started_at, strict=True):
            due = stored[sequence] if sequence < len(stored) else nan
            if sequence < len(delayed) and delayed[sequence] > due:  # NaN: no delay
                due = delayed[sequence]
            if started < due:
                note(
                    collector.order_violations,
                    f"{collector.pool}:{index} started #{sequence} at {started:g}, "
                    f"before it was due at {due:g}",
                )
            this = (due, sequence)
            if previous is not None and not previous < this:
                note(
                    collector.order_violations,
                    f"{collector.pool}:{index} started #{sequence} (due {due:g}) after "
                    f"#{previous[1]} (due {previous[0]:g})",
                )
            previous = this
