import re
from pathlib import Path

import dopool

API_REFERENCE = Path(__file__).parents[2] / "docs" / "api.md"

# The names docs/api.md documents and users rely on: none may disappear from the package.
DOCUMENTED_NAMES = {
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
    assert set(dopool.__all__) >= DOCUMENTED_NAMES
    for name in dopool.__all__:
        assert hasattr(dopool, name), name


def test_every_public_name_is_in_the_api_reference() -> None:
    words = set(re.findall(r"\w+", API_REFERENCE.read_text(encoding="utf-8")))
    missing = (DOCUMENTED_NAMES | set(dopool.__all__)) - words
    assert not missing, f"not in docs/api.md: {sorted(missing)}"


def test_the_api_references_import_block_imports() -> None:
    text = API_REFERENCE.read_text(encoding="utf-8")
    block = re.search(r"from dopool import \((.*?)\)", text, re.DOTALL)
    assert block is not None
    names = set(re.findall(r"\w+", block.group(1)))
    assert names >= DOCUMENTED_NAMES
    assert names == set(dopool.__all__), sorted(names ^ set(dopool.__all__))


def test_every_error_derives_from_the_root() -> None:
    for name in dopool.__all__:
        value = getattr(dopool, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, dopool.DopoolError), name


def test_dopool_testing_holds_the_same_objects_as_their_first_homes() -> None:
    import dopool.chaos
    import dopool.testing

    assert dopool.testing.SimulatedClock is dopool.SimulatedClock
    assert dopool.testing.FaultPlan is dopool.chaos.FaultPlan
    assert dopool.testing.SimulationStalledError is dopool.SimulationStalledError
    assert dopool.testing.__all__ == sorted(dopool.testing.__all__)
    assert dopool.testing.__all__ == [
        "FaultPlan",
        "FollowUp",
        "HandlerRun",
        "SimulatedClock",
        "SimulationStalledError",
        "assert_dead_letters",
        "assert_paused",
        "assert_pending",
        "assert_succeeded",
        "run_handler",
    ]
