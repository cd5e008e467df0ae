"""What the commands that read a store share (``status``, ``dead-letters``, ``schedules``,
``storage``): choosing a store's pools, a stored time as text."""

from __future__ import annotations

import datetime as _dt

from dopool._cli._errors import CliError
from dopool._cli._terminal import _clean
from dopool._ops.storeview import StoreView

REAL_TIME_FROM = 1e9  # an alarm time above this is a real clock's epoch seconds
MAX_PLAIN_TIME = 1e15  # a time this large or more prints in exponent form


def _chosen_pools(view: StoreView, pool: str | None) -> dict[str, int]:
    known = view.pools()
    if pool is None:
        return known
    if pool not in known:
        listed = ", ".join(_clean(name) for name in sorted(known)) or "none"
        raise CliError(
            f"no pool named {_clean(repr(pool))} in store {_clean(repr(str(view.path)))} "
            f"(pools: {listed})"
        )
    return {pool: known[pool]}


def _when(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= REAL_TIME_FROM:
        try:
            moment = _dt.datetime.fromtimestamp(value, _dt.UTC)
        except (OverflowError, OSError, ValueError):
            pass  # past the calendar (a crafted store): print the number
        else:
            return moment.isoformat(timespec="seconds").replace("+00:00", "Z")
    if abs(value) < MAX_PLAIN_TIME:
        return f"t={value:,.3f}"
    return f"t={value:.6g}"  # inf, nan, and numbers too long to print in full
