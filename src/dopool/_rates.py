"""Rate limits: how many attempts a pool may start per unit of time.

A limit is a token bucket kept as one number, its theoretical arrival time (the generic
cell rate algorithm): ``burst`` tokens, one more every ``per / rate`` seconds, and each
attempt that starts takes one. Over any window of ``W`` seconds a limit lets at most
``burst + rate * W / per`` attempts start, whatever the order in which their transactions
read the clock (docs/guarantees.md, "Rate limits").
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from dopool._errors import MAX_DELAY, ConfigurationError, shown

#: The units a limit written as text may name, in seconds.
UNITS = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0}
UNITS |= {"h": 3600.0, "hour": 3600.0, "d": 86400.0, "day": 86400.0}
#: The shortest interval between tokens: a million a second.
MIN_INTERVAL = 1e-6
#: The most tokens a bucket holds.
MAX_BURST = 1_000_000

_TEXT = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*/\s*(\d+(?:\.\d*)?)?\s*([a-z]+)\s*")


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimit:
    """At most ``rate`` attempt starts per ``per`` seconds, ``burst`` of them at once.

    ``"100/s"`` is ``RateLimit(rate=100)``; ``"30/m"``, ``"5/10s"`` and ``"1000/h"`` name
    other periods. With ``burst=1`` (the default, as Celery's) starts are spaced evenly,
    ``per / rate`` seconds apart; a larger ``burst`` lets that many start at once after a
    quiet spell.

    Raises:
        ConfigurationError: a rate or period that is not a positive finite number, tokens
            closer than a microsecond or further apart than ``MAX_DELAY``, or a burst
            that is not an int from 1 to ``MAX_BURST``.
    """

    rate: float
    per: float = 1.0
    burst: int = 1

    def __post_init__(self) -> None:
        for name in ("rate", "per"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ConfigurationError(
                    f"a rate limit's {name} must be a finite number > 0, got {shown(value)}"
                )
            object.__setattr__(self, name, float(value))
        if not MIN_INTERVAL <= self.interval <= MAX_DELAY:
            raise ConfigurationError(
                f"a rate limit of {self.rate:g} per {self.per:g} s spaces its starts "
                f"{self.interval:g} s apart: keep that within [{MIN_INTERVAL:g}, "
                f"{MAX_DELAY:g}] seconds"
            )
        burst = self.burst
        if isinstance(burst, bool) or not isinstance(burst, int) or not 1 <= burst <= MAX_BURST:
            raise ConfigurationError(
                f"a rate limit's burst must be an int from 1 to {MAX_BURST}, got {shown(burst)}"
            )

    @classmethod
    def of(cls, value: object, label: str) -> RateLimit | None:
        """``value`` as a limit: a :class:`RateLimit`, text such as ``"100/s"``, or None.

        Raises:
            ConfigurationError: anything else, or text that is not ``N/unit``,
                naming ``label``.
        """
        if value is None or isinstance(value, RateLimit):
            return value
        if not isinstance(value, str):
            raise ConfigurationError(
                f"{label} must be a RateLimit, text such as '100/s', or None, got {shown(value)}"
            )
        match = _TEXT.fullmatch(value.lower())
        unit = None if match is None else _unit(match[3])
        if match is None or unit is None:
            raise ConfigurationError(
                f"{label} must read '<count>/<unit>' or '<count>/<n><unit>', the unit s, m, h "
                f"or d (or second, minute, hour, day), such as '100/s' or '5/10m', got {value!r}"
            )
        periods = float(match[2]) if match[2] else 1.0
        try:
            return cls(rate=float(match[1]), per=periods * unit)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{label} {value!r}: {exc}") from None

    @property
    def interval(self) -> float:
        """Seconds between two tokens."""
        return self.per / self.rate

    def take(self, tat: float | None, now: float) -> tuple[float, float | None]:
        """A start at ``now`` against a bucket whose theoretical arrival time is ``tat``
        (None: never used, full): ``(tat after it, None)`` if a token was free, else
        ``(tat, when the next one is)``."""
        tolerance = (self.burst - 1) * self.interval
        if tat is not None and now < tat - tolerance:
            return tat, tat - tolerance
        return max(now, tat if tat is not None else now) + self.interval, None

    def allows(self, window: float) -> float:
        """The most starts this limit lets into a window of ``window`` seconds (both ends
        included): what the chaos checker holds each window to."""
        return self.burst + window / self.interval

    def __str__(self) -> str:
        burst = "" if self.burst == 1 else f", burst {self.burst}"
        return f"{self.rate:g}/{self.per:g}s{burst}"


def _unit(word: str) -> float | None:
    """The seconds a unit names, its plural too ("mins"); None if none ("ms" is not one)."""
    if word in UNITS:
        return UNITS[word]
    if len(word) > 3 and word.endswith("s"):
        return UNITS.get(word[:-1])
    return None
