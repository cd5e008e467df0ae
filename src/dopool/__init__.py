"""dopool: Durable Object worker pools for Python.

N single-threaded actors, each owning a durable LMDB namespace with a FIFO
queue and one alarm slot, fed by a router, under a real or simulated clock.
"""

from dopool._clock.clocks import RealClock, SimulatedClock
from dopool._engine.context import EventContext
from dopool._engine.middleware import Middleware
from dopool._engine.storage import Storage
from dopool._errors import (
    ConfigurationError,
    DamagedRecordError,
    DeadlockError,
    DopoolError,
    EventIdError,
    EventTooLargeError,
    EventValidationError,
    FilterError,
    InstanceCrashedError,
    InstanceStartError,
    NotLeasedError,
    PermanentError,
    PoolClosedError,
    PoolNotFoundError,
    QueueFullError,
    RetryAfter,
    ScheduleDefinitionError,
    ScheduleError,
    SimulationStalledError,
    StorageError,
    StorageItemError,
    StoreBusyError,
    StoreDamagedError,
    StoreFormatError,
    StoreLockedError,
    StoreNotFoundError,
)
from dopool._handles.connection import Connection, ProducerPool, connect
from dopool._handles.pool import WorkerPool
from dopool._handles.runtime import Runtime
from dopool._pools import Pool, StorageView
from dopool._rates import RateLimit
from dopool._retry import RetryPolicy
from dopool._types import (
    DeadLetter,
    EmptyInfo,
    EnqueueResult,
    EventInfo,
    InstanceStatus,
    Outcome,
    PoolEvent,
    PoolStatus,
    ScheduleInfo,
)

__all__ = [
    "ConfigurationError",
    "Connection",
    "DamagedRecordError",
    "DeadLetter",
    "DeadlockError",
    "DopoolError",
    "EmptyInfo",
    "EnqueueResult",
    "EventContext",
    "EventIdError",
    "EventInfo",
    "EventTooLargeError",
    "EventValidationError",
    "FilterError",
    "InstanceCrashedError",
    "InstanceStartError",
    "InstanceStatus",
    "Middleware",
    "NotLeasedError",
    "Outcome",
    "PermanentError",
    "Pool",
    "PoolClosedError",
    "PoolEvent",
    "PoolNotFoundError",
    "PoolStatus",
    "ProducerPool",
    "QueueFullError",
    "RateLimit",
    "RealClock",
    "RetryAfter",
    "RetryPolicy",
    "Runtime",
    "ScheduleDefinitionError",
    "ScheduleError",
    "ScheduleInfo",
    "SimulatedClock",
    "SimulationStalledError",
    "Storage",
    "StorageError",
    "StorageItemError",
    "StorageView",
    "StoreBusyError",
    "StoreDamagedError",
    "StoreFormatError",
    "StoreLockedError",
    "StoreNotFoundError",
    "WorkerPool",
    "connect",
]
