"""dopool: Durable Object worker pools for Python.

N single-threaded actors, each owning a durable LMDB namespace with a FIFO
queue and one alarm slot, fed by a router, under a real or simulated clock.
"""

from dopool._clock import RealClock, SimulatedClock
from dopool._context import EventContext
from dopool._errors import (
    ConfigurationError,
    DamagedRecordError,
    DeadlockError,
    DopoolError,
    EventTooLargeError,
    EventValidationError,
    FilterError,
    InstanceCrashedError,
    PermanentError,
    PoolClosedError,
    QueueFullError,
    RetryAfter,
    ScheduleError,
    SimulationStalledError,
    StorageError,
    StoreDamagedError,
    StoreFormatError,
    StoreLockedError,
)
from dopool._pool import WorkerPool
from dopool._retry import RetryPolicy
from dopool._runtime import Runtime
from dopool._types import (
    DeadLetter,
    EmptyInfo,
    EnqueueResult,
    InstanceStatus,
    PoolEvent,
    PoolStatus,
)

__all__ = [
    "ConfigurationError",
    "DamagedRecordError",
    "DeadLetter",
    "DeadlockError",
    "DopoolError",
    "EmptyInfo",
    "EnqueueResult",
    "EventContext",
    "EventTooLargeError",
    "EventValidationError",
    "FilterError",
    "InstanceCrashedError",
    "InstanceStatus",
    "PermanentError",
    "PoolClosedError",
    "PoolEvent",
    "PoolStatus",
    "QueueFullError",
    "RealClock",
    "RetryAfter",
    "RetryPolicy",
    "Runtime",
    "ScheduleError",
    "SimulatedClock",
    "SimulationStalledError",
    "StorageError",
    "StoreDamagedError",
    "StoreFormatError",
    "StoreLockedError",
    "WorkerPool",
]
