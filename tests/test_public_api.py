import dopool

SPEC_NAMES = {
    "Runtime",
    "WorkerPool",
    "RetryPolicy",
    "EventContext",
    "EnqueueResult",
    "PoolStatus",
    "InstanceStatus",
    "DeadLetter",
    "SimulatedClock",
    "RealClock",
    "DopoolError",
    "ConfigurationError",
    "DeadlockError",
    "QueueFullError",
    "EventTooLargeError",
    "EventValidationError",
    "StoreLockedError",
    "PoolClosedError",
    "PermanentError",
    "RetryAfter",
}


def test_all_is_sorted_and_complete() -> None:
    assert dopool.__all__ == sorted(dopool.__all__)
    assert set(dopool.__all__) >= SPEC_NAMES
    for name in dopool.__all__:
        assert hasattr(dopool, name), name


def test_every_error_derives_from_the_root() -> None:
    for name in dopool.__all__:
        value = getattr(dopool, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, dopool.DopoolError), name
