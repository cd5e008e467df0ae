"""Producers' call records (``_store/layout/calls.py``, format 14): written with the
events of a call, answered from, forgotten by their producer, swept when stale, and each
read checked."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from dopool import DamagedRecordError, EnqueueResult
from dopool._store.environment import Store
from dopool._store.layout import (
    CALL_RETAIN,
    CALL_SWEEP,
    PER_KEY,
    CallRecord,
    call_key,
    call_prefix,
    describe_key,
    forget_calls,
    pack,
    parse_call_key,
    read_call,
    record_call,
    seal,
    stored_call,
    sweep_calls,
)
from dopool._store.txn import Txn

ADA = bytes(range(16))  # two producers' ids: ADA's sorts before BOB's
BOB = bytes(range(1, 17))


@pytest.fixture
def store(store_path: Path) -> Iterator[Store]:
    store = Store(store_path, durability="async")
    yield store
    store.close()


def held(txn: Txn) -> list[tuple[bytes, int]]:
    """Every call record's ``(producer, call)``, in key order."""
    with txn.cursor() as cursor:
        found = []
        if cursor.set_range(call_prefix()):
            for key in cursor.iternext(values=False):
                if not key.startswith(call_prefix()):
                    break
                parsed = parse_call_key(bytes(key))
                assert parsed is not None, key
                found.append(parsed)
    return found


def answer() -> list[EnqueueResult]:
    """A call's answer: one event stored."""
    return [EnqueueResult(3, 1, "p:1", 0)]


# -- recorded, then answered ------------------------------------------------------------


def test_a_recorded_call_is_answered_exactly_as_its_transaction_answered_it(
    store: Store,
) -> None:
    """Each event's answer, in the call's order: a duplicate's, and an instance of a
    per-key pool (an index up to 2**64 - 1), among them."""
    written = [
        EnqueueResult(7, 1, "orders:1", 2),
        EnqueueResult(8, 0, "orders:0", 0),
        EnqueueResult(7, 1, "orders:1", 2, duplicate=True),
        EnqueueResult(2**63 - 1, PER_KEY - 1, f"orders:{PER_KEY - 1}", 2**63 - 1),
    ]
    with store.write() as txn:
        assert stored_call(txn, ADA, 5) is None
        record_call(txn, ADA, 5, 1234.5, written)
    with store.read() as txn:
        record = stored_call(txn, ADA, 5)
        assert record == CallRecord(
            1234.5,
            [
                (1, 7, 2, False),
                (0, 8, 0, False),
                (1, 7, 2, True),
                (PER_KEY - 1, 2**63 - 1, 2**63 - 1, False),
            ],
        )
        assert record is not None
        assert record.answer("orders") == written
        assert [result.event_id for result in record.answer("orders")][:2] == [
            "orders:1:7",
            "orders:0:8",
        ]
        # Another call of the producer, or the same number of another, was not stored.
        assert stored_call(txn, ADA, 4) is None
        assert stored_call(txn, ADA, 6) is None
        assert stored_call(txn, BOB, 5) is None
        assert held(txn) == [(ADA, 5)]


def test_a_call_that_stored_nothing_is_recorded_with_no_answer(store: Store) -> None:
    with store.write() as txn:
        record_call(txn, ADA, 0, 1.0, [])
    with store.read() as txn:
        record = stored_call(txn, ADA, 0)
        assert record == CallRecord(1.0, [])
        assert record is not None
        assert record.answer("p") == []


# -- forgotten by their producer ------------------------------------------------------


def test_forget_calls_deletes_exactly_the_producers_records_below_the_number(
    store: Store,
) -> None:
    with store.write() as txn:
        for call in (0, 1, 2, 3, 5, 255, 256, 2**40):
            record_call(txn, ADA, call, 1.0, answer())
        for call in (0, 1, 2, 3):
            record_call(txn, BOB, call, 1.0, answer())
    with store.write() as txn:
        assert forget_calls(txn, ADA, 3) == 3  # 0, 1 and 2
        assert forget_calls(txn, ADA, 3) == 0  # done already
        assert forget_calls(txn, ADA, 0) == 0
    with store.read() as txn:
        kept = [(ADA, call) for call in (3, 5, 255, 256, 2**40)]
        assert held(txn) == [*kept, *((BOB, call) for call in (0, 1, 2, 3))]
    with store.write() as txn:
        assert forget_calls(txn, ADA, 256) == 3  # 3, 5 and 255: numbers, not bytes
        assert forget_calls(txn, BOB, 2**63 - 1) == 4
    with store.read() as txn:
        assert held(txn) == [(ADA, 256), (ADA, 2**40)]


def test_forget_calls_leaves_keys_of_another_shape_under_the_producer(store: Store) -> None:
    """A stray key (for ``dopool check`` to report) is no record of the producer's."""
    short, long = call_key(ADA, 1)[:-1], call_key(ADA, 1) + b"\x00"
    with store.write() as txn:
        txn.put(short, b"x")
        txn.put(long, b"x")
        record_call(txn, ADA, 1, 1.0, answer())
    with store.write() as txn:
        assert forget_calls(txn, ADA, 2) == 1
    with store.read() as txn:
        assert txn.get(short) == txn.get(long) == b"x"
        assert txn.get(call_key(ADA, 1)) is None


# -- swept when stale -------------------------------------------------------------------


def test_sweep_calls_deletes_the_records_written_before_the_time_of_any_producer(
    store: Store,
) -> None:
    with store.write() as txn:
        record_call(txn, ADA, 1, 10.0, answer())
        record_call(txn, ADA, 2, 30.0, answer())
        record_call(txn, BOB, 1, 20.0, answer())
        record_call(txn, BOB, 2, 25.0, answer())
    with store.write() as txn:
        assert sweep_calls(txn, 25.0) == 2  # written at 10.0 and 20.0; 25.0 is not before
    with store.read() as txn:
        assert held(txn) == [(ADA, 2), (BOB, 2)]
    with store.write() as txn:
        assert sweep_calls(txn, 25.0) == 0
        assert sweep_calls(txn, math.inf) == 2
    with store.read() as txn:
        assert held(txn) == []


def test_sweep_calls_deletes_at_most_sweep_records_a_call(store: Store) -> None:
    """In key order: what a sweep deletes is bounded, and the next one takes the rest."""
    with store.write() as txn:
        for call in range(CALL_SWEEP + 5):
            record_call(txn, ADA, call, 1.0, answer())
        record_call(txn, BOB, 0, 9.0, answer())  # not stale
    with store.write() as txn:
        assert sweep_calls(txn, 5.0) == CALL_SWEEP
    with store.read() as txn:
        assert held(txn) == [*((ADA, call) for call in range(CALL_SWEEP, CALL_SWEEP + 5)), (BOB, 0)]
    with store.write() as txn:
        assert sweep_calls(txn, 5.0) == 5
        assert sweep_calls(txn, 5.0) == 0
    with store.read() as txn:
        assert held(txn) == [(BOB, 0)]


def test_sweep_calls_keeps_a_damaged_record_and_sweeps_past_it(store: Store) -> None:
    """Its age is not known: it stays for ``dopool check`` to report, and takes no part
    of a sweep's bound."""
    damaged = call_key(ADA, 0)
    with store.write() as txn:
        txn.put(damaged, b"\x00\x00\x00\x00junk")
        for call in range(1, CALL_SWEEP + 2):
            record_call(txn, ADA, call, 1.0, answer())
    with store.write() as txn:
        assert sweep_calls(txn, 5.0) == CALL_SWEEP
        assert sweep_calls(txn, 5.0) == 1
        assert sweep_calls(txn, math.inf) == 0
    with store.read() as txn:
        assert held(txn) == [(ADA, 0)]
        assert txn.get(damaged) == b"\x00\x00\x00\x00junk"


def test_a_producers_records_outlive_it_by_an_hour() -> None:
    assert CALL_RETAIN == 3600.0


# -- each read checked ------------------------------------------------------------------

KEY = call_key(ADA, 7)
SOUND = [1000.0, [[1, 3, 0, False]]]


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        pytest.param(b"\x00\x00", "shorter than its checksum", id="short"),
        pytest.param(b"\x00\x00\x00\x00" + pack(SOUND), "checksum mismatch", id="checksum"),
        pytest.param(seal(call_key(ADA, 8), pack(SOUND)), "checksum mismatch", id="other-key"),
        pytest.param(seal(KEY, b"\xc1"), "does not decode", id="no-msgpack"),
        pytest.param(seal(KEY, pack(SOUND[:1])), "not an array of 2 fields", id="one-field"),
        pytest.param(seal(KEY, pack([*SOUND, None])), "not an array of 2 fields", id="three"),
        pytest.param(seal(KEY, pack({"at": 1000.0})), "not an array of 2 fields", id="map"),
        pytest.param(seal(KEY, pack([1000, SOUND[1]])), "field 'at' is 1000", id="int-at"),
        pytest.param(seal(KEY, pack([math.inf, SOUND[1]])), "field 'at' is inf", id="inf-at"),
        pytest.param(seal(KEY, pack([None, SOUND[1]])), "field 'at' is None", id="nil-at"),
        pytest.param(seal(KEY, pack([1000.0, None])), "field 'results' is None", id="nil"),
        pytest.param(seal(KEY, pack([1000.0, [1, 3, 0, False]])), "field 'results'", id="flat"),
        pytest.param(seal(KEY, pack([1000.0, [[1, 3, 0]]])), "field 'results'", id="three-of"),
        pytest.param(
            seal(KEY, pack([1000.0, [[1, 3, 0, False, 1]]])), "field 'results'", id="five-of"
        ),
        pytest.param(seal(KEY, pack([1000.0, [[-1, 3, 0, False]]])), "field 'results'", id="-i"),
        pytest.param(seal(KEY, pack([1000.0, [[1, -3, 0, False]]])), "field 'results'", id="-s"),
        pytest.param(seal(KEY, pack([1000.0, [[1, 2**63, 0, False]]])), "field 'results'", id="s"),
        pytest.param(seal(KEY, pack([1000.0, [[1, 3, -1, False]]])), "field 'results'", id="-p"),
        pytest.param(seal(KEY, pack([1000.0, [[1, 3, 0, 0]]])), "field 'results'", id="dup-0"),
        pytest.param(seal(KEY, pack([1000.0, [[True, 3, 0, False]]])), "'results'", id="bool-i"),
        pytest.param(seal(KEY, pack([1000.0, [[1.0, 3, 0, False]]])), "'results'", id="float-i"),
    ],
)
def test_a_damaged_call_record_is_named_and_never_answered(
    store: Store, value: bytes, reason: str
) -> None:
    assert read_call(KEY, seal(KEY, pack(SOUND))) == CallRecord(1000.0, [(1, 3, 0, False)])
    with pytest.raises(DamagedRecordError, match=reason) as caught:
        read_call(KEY, value)
    assert (caught.value.key, caught.value.value) == (KEY, value)
    assert caught.value.what == describe_key(KEY) == f"call 7 of producer {ADA.hex()}"
    assert f"damaged call 7 of producer {ADA.hex()}: " in str(caught.value)
    with store.write() as txn:
        txn.put(KEY, value)
    with store.read() as txn, pytest.raises(DamagedRecordError, match=reason):
        stored_call(txn, ADA, 7)  # whether the call was stored is not known
