"""A pool's options: one typed record, validated once, however the pool is defined.

``Runtime.define`` and ``WorkerPool.define`` take the options as keywords typed
by :class:`PoolOptionsDict` (so mypy flags a misspelt one) and build a
:class:`PoolOptions` from them, which checks every value; the engine reads the
options from it and nowhere else.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Required, TypedDict

from dopool._engine.context import EventContext
from dopool._engine.middleware import Middleware, check_middleware
from dopool._errors import ConfigurationError, shown
from dopool._machine.alarm import MAX_ALARM_RETRIES
from dopool._machine.types import QueueRules
from dopool._rates import RateLimit
from dopool._retry import RetryPolicy
from dopool._store.layout import MAX_CONCURRENCY, PER_KEY
from dopool._types import DeadLetter, EmptyInfo
from dopool._usercode import check_handler, check_synchronous

Schema = Callable[[Any], Any]

#: Seconds an instance with nothing to do keeps running before it is evicted, by default.
DEFAULT_IDLE_TIMEOUT = 60.0


class PoolOptionsDict(TypedDict, total=False):
    """The keywords of ``define``: see :class:`PoolOptions`."""

    execute: Required[Callable[[EventContext], Any]]  # or an async def
    concurrency: int | Literal["per-key"]
    retry: RetryPolicy | None
    schema: Schema | None
    on_dead_letter: Callable[[DeadLetter], Any] | None
    on_empty: Callable[[EmptyInfo], Any] | None
    max_queue_depth: int | None
    alarm_retries: int | None
    dedup_window: float
    keep_finished: float
    idle_timeout: float | None
    middleware: Sequence[Middleware]
    rate_limit: RateLimit | str | None
    rate_limit_per_key: RateLimit | str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolOptions:
    """What a pool is defined with (docs/api.md, "WorkerPool.define").

    Raises:
        ConfigurationError: a value of the wrong type or out of range.
    """

    execute: Callable[[EventContext], Any]
    # An int, or "per-key": an instance per partition key, kept here as PER_KEY (2**64).
    concurrency: int = 1
    retry: RetryPolicy | None = None
    schema: Schema | None = None
    on_dead_letter: Callable[[DeadLetter], Any] | None = None
    on_empty: Callable[[EmptyInfo], Any] | None = None
    max_queue_depth: int | None = None
    alarm_retries: int | None = None
    dedup_window: float = 0.0
    keep_finished: float = 0.0  # seconds a finished event stays known to ``event()``
    # Seconds of the runtime's clock an instance with nothing to do stays running; None: for
    # ever (docs/guarantees.md, "Instances started when first used").
    idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT
    # Wraps each attempt, inside the runtime's (docs/api.md, "Middleware").
    middleware: Sequence[Middleware] = ()
    # The attempts the pool may start per unit of time, all instances and processes
    # together (docs/api.md, "Rate limits"); text such as "100/s" is read into one.
    rate_limit: RateLimit | str | None = None
    # The same for the events of each partition key, each key its own bucket.
    rate_limit_per_key: RateLimit | str | None = None
    # Whether ``execute`` is an ``async def``, awaited on the clock's loop (docs/api.md,
    # "Async handlers"); set from it.
    is_async: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        if not callable(self.execute):
            raise ConfigurationError(f"execute must be callable, got {shown(self.execute)}")
        object.__setattr__(self, "is_async", check_handler(self.execute, "execute"))
        given: object = self.concurrency  # (define's keywords may say "per-key")
        if given == "per-key":
            object.__setattr__(self, "concurrency", PER_KEY)
        elif not _is_int(self.concurrency) or not 1 <= self.concurrency <= MAX_CONCURRENCY:
            raise ConfigurationError(
                f"concurrency must be an int >= 1 and <= {MAX_CONCURRENCY}, or 'per-key', "
                f"got {shown(self.concurrency)}"
            )
        if self.retry is not None and not isinstance(self.retry, RetryPolicy):
            raise ConfigurationError(
                f"retry must be a RetryPolicy or None, got {shown(self.retry)}"
            )
        for label in ("schema", "on_dead_letter", "on_empty"):
            hook = getattr(self, label)
            if hook is not None and not callable(hook):
                raise ConfigurationError(f"{label} must be callable or None, got {shown(hook)}")
            if hook is not None:
                check_synchronous(hook, label)
        depth = self.max_queue_depth
        if depth is not None and (not _is_int(depth) or depth < 1):
            raise ConfigurationError(
                f"max_queue_depth must be an int >= 1 or None, got {shown(depth)}"
            )
        retries = self.alarm_retries
        if retries is not None and (not _is_int(retries) or not 0 <= retries <= MAX_ALARM_RETRIES):
            raise ConfigurationError(
                f"alarm_retries must be an int from 0 to {MAX_ALARM_RETRIES} or None, "
                f"got {shown(retries)}"
            )
        for label in ("dedup_window", "keep_finished"):
            window = getattr(self, label)
            if (
                isinstance(window, bool)
                or not isinstance(window, int | float)
                or not math.isfinite(window)
                or window < 0
            ):
                raise ConfigurationError(
                    f"{label} must be a finite number of seconds >= 0, got {shown(window)}"
                )
            object.__setattr__(self, label, float(window))
        idle = self.idle_timeout
        if idle is not None:
            if (
                isinstance(idle, bool)
                or not isinstance(idle, int | float)
                or not math.isfinite(idle)
                or idle <= 0
            ):
                raise ConfigurationError(
                    "idle_timeout must be a finite number of seconds > 0 or None, "
                    f"got {shown(idle)}"
                )
            object.__setattr__(self, "idle_timeout", float(idle))
        object.__setattr__(self, "middleware", check_middleware(self.middleware, "middleware"))
        for label in ("rate_limit", "rate_limit_per_key"):
            object.__setattr__(self, label, RateLimit.of(getattr(self, label), label))

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> PoolOptions:
        """Options from ``define``'s keywords; an unknown keyword is named, with a guess."""
        known = [spec.name for spec in fields(cls) if spec.init]
        for name in options:
            if name not in known:
                close = difflib.get_close_matches(name, known, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigurationError(f"define() got an unknown option {name!r}{hint}")
        if "execute" not in options:
            raise ConfigurationError("define() needs execute=, the pool's handler")
        return cls(**options)

    @property
    def max_attempts(self) -> int:
        """Executions an event gets at most: one without a retry policy."""
        return self.rules.max_attempts

    @property
    def rules(self) -> QueueRules:
        """What the queue machine reads of these options."""
        return QueueRules(
            retry=self.retry,
            max_queue_depth=self.max_queue_depth,
            alarm_retries=self.alarm_retries,
            dedup_window=self.dedup_window,
            keep_finished=self.keep_finished,
            per_key=self.concurrency == PER_KEY,
            rate_limit=_read(self.rate_limit),
            rate_limit_per_key=_read(self.rate_limit_per_key),
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _read(limit: RateLimit | str | None) -> RateLimit | None:
    """A rate limit option, read (``__post_init__`` made text a :class:`RateLimit`)."""
    assert not isinstance(limit, str)
    return limit
