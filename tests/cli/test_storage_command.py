"""``dopool storage``: one instance's own stored values, read from outside its runtime."""

from __future__ import annotations

import json
import shutil
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest

import dopool
from cli_support import assert_one_line_error, held_by_child, invoke
from dopool import EventContext, Runtime
from dopool._store.environment import Store
from dopool._store.layout import FORMAT_VERSION, Namespace, StoredValues, pack, seal

FIXTURE_V9 = Path(__file__).parents[1] / "support" / "fixtures" / "store-v9"


def keep(ctx: EventContext) -> None:
    """A chat room's history: each message under its number, and how many were said."""
    storage = ctx.storage
    said = storage.get("said", 0)
    storage.put(f"message:{said:06}", ctx.event)
    storage.put("said", said + 1)
    storage.put("raw", b"\x00\xff")


MESSAGES = {"room-7": ["hello", "hi", "how are you?"], "room-8": ["yo"]}


def stored(said: list[str]) -> dict[str, Any]:
    """What ``keep`` stores for these messages, as the JSON output shows it."""
    values: dict[str, Any] = {f"message:{n:06}": {"text": text} for n, text in enumerate(said)}
    return values | {"raw": {"$base64": "AP8="}, "said": len(said)}


POOLS: dict[str, int | Literal["per-key"]] = {"rooms": 4, "people": "per-key"}
#: Where each partition key's events ran, by pool and key (the enqueues' answers).
Routed = dict[tuple[str, str], int]


@pytest.fixture
def routed(tmp_path: Path) -> tuple[Path, Routed]:
    """A store with ``rooms`` (4 instances) and ``people`` (an instance per key), each with
    MESSAGES stored, and the instance each key's events ran on."""
    path = tmp_path / "store"
    indices: Routed = {}
    with Runtime.simulated(path) as runtime:
        for name, concurrency in POOLS.items():
            pool = runtime.define(name, execute=keep, concurrency=concurrency)
            for key, said in MESSAGES.items():
                for text in said:
                    result = pool.enqueue({"text": text}, partition_key=key)
                    indices[name, key] = result.instance_index
            assert pool.join(timeout=30)
    assert (indices["rooms", "room-7"], indices["rooms", "room-8"]) == (2, 3)
    return path, indices


@pytest.fixture
def store(routed: tuple[Path, Routed]) -> Path:
    return routed[0]


def rows(text: str) -> list[list[str]]:
    """A table's rows, as [key, value]: the lines after its title, a blank and its head."""
    return [
        [cell.strip() for cell in line.split(None, 1)]
        for line in text.splitlines()[4:]
        if line.strip()
    ]


def storage_json(*args: str) -> dict[str, Any]:
    result = invoke("storage", *args, "--json")
    assert result.exit_code == 0, result.output
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def test_lists_an_instances_values_in_key_order(store: Path) -> None:
    result = invoke("storage", str(store), "rooms", "--instance", "2")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].strip() == "rooms:2 · 5 values"
    listed = rows(result.stdout)
    assert [key for key, _ in listed] == [
        "message:000000",
        "message:000001",
        "message:000002",
        "raw",
        "said",
    ]
    assert [value for _, value in listed] == [
        "{'text': 'hello'}",
        "{'text': 'hi'}",
        "{'text': 'how are you?'}",
        "b'\\x00\\xff'",
        "3",
    ]
    document = storage_json(str(store), "rooms", "--instance", "2")
    assert document == {
        "store": str(store),
        "pool": "rooms",
        "instance": 2,
        "partition_key": None,
        "values": stored(MESSAGES["room-7"]),
        "missing": [],
    }
    assert list(document["values"]) == sorted(document["values"])


M = "message:"


@pytest.mark.parametrize(
    ("bounds", "chosen", "keys"),
    [
        (("--prefix", M), {"prefix": M}, [f"{M}000000", f"{M}000001", f"{M}000002"]),
        (
            ("--start", f"{M}000001", "--end", "said"),
            {"start": f"{M}000001", "end": "said"},
            [f"{M}000001", f"{M}000002", "raw"],
        ),
        (
            ("--prefix", M, "--start", f"{M}000002"),
            {"prefix": M, "start": f"{M}000002"},
            [f"{M}000002"],
        ),
        (("--limit", "2"), {"limit": 2}, [f"{M}000000", f"{M}000001"]),
        (("--start", "r", "--limit", "1"), {"start": "r", "limit": 1}, ["raw"]),
        (("--limit", "0"), {"limit": 0}, []),
        (("--prefix", "nothing"), {"prefix": "nothing"}, []),
    ],
)
def test_bounds_choose_what_is_listed_as_list_does(
    store: Path, bounds: tuple[str, ...], chosen: dict[str, Any], keys: list[str]
) -> None:
    document = storage_json(str(store), "rooms", "--instance", "2", *bounds)
    assert list(document["values"]) == keys
    with dopool.connect(store) as connection:
        assert list(connection.pool("rooms").storage(instance=2).list(**chosen)) == keys
    text = invoke("storage", str(store), "rooms", "--instance", "2", *bounds)
    assert text.exit_code == 0, text.output
    if not keys:
        assert text.stdout == "rooms:2: no values in that range\n"


def test_keys_asked_by_name(store: Path) -> None:
    found = invoke("storage", str(store), "rooms", "--instance", "2", "said", "raw")
    assert found.exit_code == 0, found.output
    assert "rooms:2 · 2 of 2 keys have a value" in found.stdout
    assert rows(found.stdout) == [["said", "3"], ["raw", "b'\\x00\\xff'"]]  # in the order asked
    document = storage_json(str(store), "rooms", "--instance", "2", "said", "raw", "said")
    assert document["values"] == {"said": 3, "raw": {"$base64": "AP8="}}
    assert document["missing"] == []


def test_a_key_with_no_value_exits_1(store: Path) -> None:
    result = invoke("storage", str(store), "rooms", "--instance", "2", "nope", "said")
    assert result.exit_code == 1
    assert result.stderr == ""
    assert "rooms:2 · 1 of 2 keys have a value" in result.stdout
    assert rows(result.stdout) == [["nope", "no value"], ["said", "3"]]
    as_json = invoke("storage", str(store), "rooms", "--instance", "2", "nope", "said", "--json")
    assert as_json.exit_code == 1
    document = json.loads(as_json.stdout)
    assert (document["values"], document["missing"]) == ({"said": 3}, ["nope"])
    # Another instance's key is not this one's.
    elsewhere = invoke("storage", str(store), "rooms", "--instance", "1", "said", "--json")
    assert elsewhere.exit_code == 1
    assert json.loads(elsewhere.stdout)["missing"] == ["said"]


@pytest.mark.parametrize("pool", ["rooms", "people"])
def test_key_reads_the_instance_it_routes_to(routed: tuple[Path, Routed], pool: str) -> None:
    store, indices = routed
    if pool == "people":  # an instance per key: the key's hash
        assert indices[pool, "room-7"] == 13168844330250300090
    with dopool.connect(store) as connection:
        listed = {key: connection.pool(pool).storage(partition_key=key).list() for key in MESSAGES}
    for key, said in MESSAGES.items():
        index = indices[pool, key]
        by_key = storage_json(str(store), pool, "--key", key)
        assert (by_key["instance"], by_key["partition_key"]) == (index, key)
        assert by_key["values"] == stored(said)
        by_index = storage_json(str(store), pool, "--instance", str(index))
        assert by_index == by_key | {"partition_key": None}
        assert listed[key]["said"] == len(said)  # the API reads that instance too
        text = invoke("storage", str(store), pool, "--key", key)
        assert text.stdout.startswith(f"{pool}:{index} · key {key} · {len(said) + 2} values")


def test_a_per_key_pools_instance_never_used_has_no_values(store: Path) -> None:
    result = invoke("storage", str(store), "people", "--key", "nobody")
    assert result.exit_code == 0, result.output
    assert result.stdout.endswith(": no values\n")
    last = str(2**64 - 1)
    assert storage_json(str(store), "people", "--instance", last)["values"] == {}


def test_bytes_and_what_json_cannot_hold(tmp_path: Path) -> None:
    def odd(ctx: EventContext) -> None:
        ctx.storage.put_many(
            {"bytes": b"\x00\xff", "nan": float("nan"), "map": {1: b"k"}, "tuple": (1, "a")}
        )

    path = tmp_path / "store"
    with Runtime.simulated(path) as runtime:
        pool = runtime.define("odd", execute=odd)
        pool.enqueue("e")
        assert pool.join(timeout=30)
    values = storage_json(str(path), "odd", "--instance", "0")["values"]
    assert values == {
        "bytes": {"$base64": "AP8="},
        "map": {"$map": [[1, {"$base64": "aw=="}]]},
        "nan": {"$float": "NaN"},
        "tuple": [1, "a"],  # stored as msgpack: a list
    }
    text = invoke("storage", str(path), "odd", "--instance", "0").stdout
    assert "b'\\x00\\xff'" in text
    assert "{1: b'k'}" in text
    assert "nan" in text


def test_a_long_value_is_cut_to_the_width(tmp_path: Path) -> None:
    def long(ctx: EventContext) -> None:
        ctx.storage.put("long", {"text": "y" * 100_000})

    path = tmp_path / "store"
    with Runtime.simulated(path) as runtime:
        pool = runtime.define("long", execute=long)
        pool.enqueue("e")
        assert pool.join(timeout=30)
    result = invoke("storage", str(path), "long", "--instance", "0")
    assert result.exit_code == 0, result.output
    (row,) = [line for line in result.stdout.splitlines() if "yyy" in line]
    assert len(row) <= 120  # a terminal's width, or 120 columns into a pipe
    assert row.rstrip().endswith("…")
    assert row.split()[:2] == ["long", "{'text':"]
    assert storage_json(str(path), "long", "--instance", "0")["values"]["long"]["text"] == (
        "y" * 100_000
    )


HOSTILE = "\x1b[2J\x1b]0;pwned\x07 [bold red]loud[/] \x9b31m \u202e\r\nnext"


def test_stored_text_reaches_the_terminal_inert(tmp_path: Path) -> None:
    def hostile(ctx: EventContext) -> None:
        ctx.storage.put(HOSTILE, HOSTILE)

    path = tmp_path / "store"
    with Runtime.simulated(path) as runtime:
        pool = runtime.define("hostile", execute=hostile)
        pool.enqueue("e")
        assert pool.join(timeout=30)
    for args in ((), (HOSTILE,)):
        result = invoke("storage", str(path), "hostile", "--instance", "0", *args)
        assert result.exit_code == 0, result.output
        controls = {c for c in result.stdout if unicodedata.category(c) in ("Cc", "Cf")} - {"\n"}
        assert not controls, controls
        assert "\\x1b[2J\\x1b]0;pwned\\x07 [bold red]loud[/]" in result.stdout
    assert storage_json(str(path), "hostile", "--instance", "0")["values"] == {HOSTILE: HOSTILE}


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        ((), 2, ("--key PARTITION_KEY", "--instance INDEX")),
        (("--key", "room-7", "--instance", "2"), 2, ("--key and --instance exclude each other",)),
        (("--instance", "-1"), 2, ("--instance",)),
        (("--instance", "4"), 1, ("pool 'rooms' has no instance 4 (concurrency 4)",)),
        (("--instance", "2", "said", "--prefix", "m"), 2, ("--prefix", "give no KEYs")),
        (("--instance", "2", "said", "--limit", "1"), 2, ("--limit", "give no KEYs")),
        (("--instance", "2", "--limit", "-1"), 2, ("--limit",)),
        (("--instance", "2", "\udcff"), 2, ("KEY", "'\\udcff' is not text UTF-8 can hold")),
        (("--key", "\udcff"), 2, ("--key", "not text UTF-8 can hold")),
        (("--instance", "2", "--start", "\udcff"), 2, ("--start", "not text UTF-8 can hold")),
    ],
)
def test_bad_flags_are_one_line(
    store: Path, args: tuple[str, ...], code: int, words: tuple[str, ...]
) -> None:
    for as_json in ((), ("--json",)):
        assert_one_line_error(invoke("storage", str(store), "rooms", *args, *as_json), code, *words)


def test_a_missing_pool_or_store_is_one_line(store: Path, tmp_path: Path) -> None:
    assert_one_line_error(
        invoke("storage", str(store), "nope", "--instance", "0"),
        1,
        "no pool named 'nope'",
        "(pools: people, rooms)",
    )
    assert_one_line_error(
        invoke("storage", str(tmp_path / "nowhere"), "rooms", "--key", "k"), 1, "no dopool store"
    )


def test_a_store_of_another_format_is_refused_as_status_refuses_it(tmp_path: Path) -> None:
    path = tmp_path / "store"
    shutil.copytree(FIXTURE_V9, path)
    before = (path / "data" / "data.mdb").read_bytes()
    refused = invoke("storage", str(path), "jobs", "--instance", "0")
    assert_one_line_error(refused, 1, "has format version 9", f"reads format {FORMAT_VERSION} only")
    assert refused.stderr == invoke("status", str(path)).stderr
    assert (path / "data" / "data.mdb").read_bytes() == before  # read-only: not migrated


def damage(path: Path, body: Any, key: str = "said", pool: str = "rooms", index: int = 2) -> None:
    """The record of ``key`` replaced: sealed around ``body`` (None: not sealed)."""
    opened = Store(path)
    try:
        with opened.write() as txn:
            record = StoredValues(Namespace(pool, index)).key(key)
            txn.put(record, b"\xc1" if body is None else seal(record, pack(body)))
    finally:
        opened.close()


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (None, ("damaged stored value of instance rooms:2", "shorter than its checksum", "said")),
        (["said", 3], ("damaged stored value of instance rooms:2", "field 'value' is 3", "said")),
        (["raw", b"\x03"], ("damaged stored value of instance rooms:2", "holds the key 'raw'")),
        (
            ["said", b"\xc1"],
            ("damaged stored value of instance rooms:2", "its value does not decode", "said"),
        ),
    ],
    ids=["unsealed", "not-bytes", "another-key", "undecodable"],
)
def test_a_damaged_value_is_one_line_naming_its_key(
    store: Path, body: Any, words: tuple[str, ...]
) -> None:
    damage(store, body)
    for args in ((), ("said",), ("message:000000", "said"), ("--start", "s")):
        for as_json in ((), ("--json",)):
            result = invoke("storage", str(store), "rooms", "--instance", "2", *args, *as_json)
            assert_one_line_error(result, 1, *words)
    others = invoke("storage", str(store), "rooms", "--instance", "2", "raw", "--json")
    assert others.exit_code == 0, others.output  # the instance's other values read on
    assert invoke("check", str(store)).exit_code == 1


HOLDER = """
import sys
from dopool import Runtime

def keep(ctx):
    storage = ctx.storage
    said = storage.get("said", 0)
    storage.put(f"message:{said:06}", ctx.event)
    storage.put("said", said + 1)
    storage.put("raw", b"\\x00\\xff")

runtime = Runtime(sys.argv[1])
pool = runtime.define("rooms", execute=keep, concurrency=4)
pool.enqueue({"text": "live"}, partition_key="room-7")
assert pool.join(timeout=30)
print("holding", flush=True)
sys.stdin.readline()
runtime.close()
"""


@pytest.fixture
def held(store: Path) -> Iterator[Path]:
    """The store, held open by a real-clock runtime in another process that stored a value."""
    with held_by_child(HOLDER, store):
        yield store


@pytest.mark.threaded
def test_reads_beside_a_live_runtime(held: Path) -> None:
    document = storage_json(str(held), "rooms", "--key", "room-7")
    assert document["values"] == stored([*MESSAGES["room-7"], "live"])
    result = invoke("storage", str(held), "rooms", "--key", "room-7", "said")
    assert result.exit_code == 0, result.output
    assert "said" in result.stdout


def test_help() -> None:
    result = invoke("storage", "--help")
    assert result.exit_code == 0
    assert "storage [OPTIONS] PATH POOL [KEY]..." in result.stdout
