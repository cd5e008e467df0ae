"""Retry policy, and the seeded draws that make its jitter reproducible."""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from dopool._errors import MAX_DELAY, ConfigurationError, PermanentError, RetryAfter, as_seconds

DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_INITIAL_DELAY = 1.0
DEFAULT_MULTIPLIER = 2.0
DEFAULT_MAX_DELAY = 300.0
DEFAULT_JITTER = 0.1


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How often and how late a failed event is retried.

    ``max_attempts`` counts executions, the first one included. The delay after
    failed attempt ``k`` is ``min(initial_delay * multiplier**(k-1), max_delay)``
    scaled by a factor drawn uniformly from ``[1 - jitter, 1 + jitter]``, and
    never more than :data:`MAX_DELAY`. Durations are seconds, at most
    :data:`MAX_DELAY`; a :class:`~datetime.timedelta` is accepted.
    """

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    initial_delay: float | timedelta = DEFAULT_INITIAL_DELAY
    multiplier: float = DEFAULT_MULTIPLIER
    max_delay: float | timedelta = DEFAULT_MAX_DELAY
    jitter: float = DEFAULT_JITTER

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise ConfigurationError(f"max_attempts must be an int, got {self.max_attempts!r}")
        if self.max_attempts < 1:
            raise ConfigurationError(f"max_attempts must be >= 1, got {self.max_attempts}")
        # Normalise timedeltas to seconds so the fields always read as floats.
        object.__setattr__(self, "initial_delay", as_seconds(self.initial_delay, "initial_delay"))
        object.__setattr__(self, "max_delay", as_seconds(self.max_delay, "max_delay"))
        object.__setattr__(self, "multiplier", _number("multiplier", self.multiplier))
        object.__setattr__(self, "jitter", _number("jitter", self.jitter))
        initial, maximum = self.initial_seconds, self.max_seconds
        if not 0 <= initial <= MAX_DELAY:  # NaN too
            raise ConfigurationError(
                f"initial_delay must be within [0, {MAX_DELAY:g}] seconds (365 days), "
                f"got {initial!r}"
            )
        if not initial <= maximum <= MAX_DELAY:
            raise ConfigurationError(
                f"max_delay must be within [initial_delay ({initial:g}), {MAX_DELAY:g}] "
                f"seconds (365 days), got {maximum!r}"
            )
        if not math.isfinite(self.multiplier) or self.multiplier < 1:
            raise ConfigurationError(f"multiplier must be >= 1, got {self.multiplier!r}")
        if not 0 <= self.jitter <= 1:
            raise ConfigurationError(f"jitter must be within [0, 1], got {self.jitter!r}")

    @property
    def initial_seconds(self) -> float:
        """``initial_delay`` in seconds."""
        return float(self.initial_delay)  # type: ignore[arg-type]  # normalised in __post_init__

    @property
    def max_seconds(self) -> float:
        """``max_delay`` in seconds."""
        return float(self.max_delay)  # type: ignore[arg-type]  # normalised in __post_init__

    def delay(self, attempt: int, draw: float) -> float:
        """The delay after failed attempt ``attempt`` (1-based), for a uniform ``draw``."""
        try:
            base = min(self.initial_seconds * self.multiplier ** (attempt - 1), self.max_seconds)
        except OverflowError:
            base = self.max_seconds
        factor = 1.0 - self.jitter + 2.0 * self.jitter * draw
        return min(max(0.0, base * factor), MAX_DELAY)


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"{name} must be a number, got {value!r}")
    try:
        return float(value)
    except OverflowError:  # an int past a float's range
        raise ConfigurationError(f"{name} is too large to be a float") from None


def next_delay(
    failure: BaseException,
    attempt: int,
    max_attempts: int,
    policy: RetryPolicy | None,
    draw: Callable[[], float],
) -> float | None:
    """Seconds from failed attempt ``attempt`` to the next one; None if there is none (a
    :class:`PermanentError`, or the last attempt failed). A :class:`RetryAfter` names its
    own delay (when it has one: see ``_read``); else the policy's, its jitter drawn by
    ``draw``."""
    if isinstance(failure, PermanentError) or attempt >= max_attempts:
        return None
    asked = _read(failure, "seconds") if isinstance(failure, RetryAfter) else None
    if asked is not None:
        return asked
    assert policy is not None  # max_attempts > 1 implies a policy
    u = draw()
    chosen = _read(policy, "delay", attempt, u)  # a subclass's own delay() is user code
    return RetryPolicy.delay(policy, attempt, u) if chosen is None else chosen


def _read(source: object, name: str, *args: object) -> float | None:
    """``source.name`` (called with ``args``, if any) as seconds within ``[0, MAX_DELAY]``;
    None if it raises or names no number of seconds: a ``RetryAfter`` subclass that skipped
    ``__init__``, handler code that set its ``seconds`` to NaN, a ``RetryPolicy`` subclass
    whose ``delay`` returns something else. Such a retry waits the policy's own delay. An
    infinite one written into the store would make the instance's meta record unreadable,
    and the pool with it; one that raised crashed every recovery of the instance."""
    try:
        seconds = getattr(source, name)
        if args:
            seconds = seconds(*args)
    except BaseException:  # SystemExit too: user code, in the instance's transaction
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return None
    if isinstance(seconds, float) and math.isnan(seconds):
        return None
    return float(min(max(seconds, 0), MAX_DELAY))


def uniform_draw(seed: int | str | None, *parts: object) -> float:
    """A uniform float in [0, 1) derived only from ``seed`` and stable identifiers.

    BLAKE2b over the identifiers' text, so the value is the same in every
    process, on every platform and Python version, whatever the thread timing.
    """
    text = "\x1f".join(str(part) for part in (seed, *parts))
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    (value,) = struct.unpack(">Q", digest)
    return float(value >> 11) / float(1 << 53)
