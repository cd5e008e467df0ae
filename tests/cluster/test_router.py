"""Choosing an instance: the stable partition hash and round-robin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import Counter

import pytest

from dopool._cluster.routing import Router, stable_hash

PINNED = {
    "": 16476032584258269876,
    "a": 4681665781835383343,
    "user-42": 8043651368623730598,
    "héllo": 1395503932212621259,
}


def test_stable_hash_is_pinned() -> None:
    # BLAKE2b-64 of the UTF-8 bytes: changing it would move every partition.
    assert {key: stable_hash(key) for key in PINNED} == PINNED


def test_stable_hash_fits_in_64_bits() -> None:
    assert all(0 <= stable_hash(f"key-{n}") < 2**64 for n in range(1000))


@pytest.mark.parametrize("hash_seed", ["1", "12345"])
def test_stable_hash_is_the_same_in_a_fresh_interpreter(hash_seed: str) -> None:
    code = (
        "import json, sys\n"
        "from dopool._cluster.routing import stable_hash\n"
        "keys = json.loads(sys.argv[1])\n"
        "print(json.dumps({k: stable_hash(k) for k in keys}))\n"
    )
    keys = [*PINNED, "orders/17", "ünïcødé ✓"]
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(keys)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    assert json.loads(done.stdout) == {key: stable_hash(key) for key in keys}


def test_round_robin_cycles_through_every_index() -> None:
    router = Router(4)
    assert [router.choose(None) for _ in range(10)] == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]


def test_a_single_instance_always_gets_index_zero() -> None:
    router = Router(1)
    assert {router.choose(None) for _ in range(5)} | {router.choose("k")} == {0}


def test_round_robin_is_exact_across_threads() -> None:
    router = Router(3)
    counts: Counter[int] = Counter()
    lock = threading.Lock()

    def work() -> None:
        mine = Counter(router.choose(None) for _ in range(3000))
        with lock:
            counts.update(mine)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    assert counts == {0: 8000, 1: 8000, 2: 8000}


@pytest.mark.parametrize("concurrency", [1, 2, 7, 16])
def test_partition_keys_map_to_hash_modulo_concurrency(concurrency: int) -> None:
    router = Router(concurrency)
    for n in range(200):
        key = f"customer-{n}"
        assert router.choose(key) == stable_hash(key) % concurrency


def test_partition_keys_do_not_advance_round_robin() -> None:
    router = Router(3)
    assert router.choose(None) == 0
    router.choose("a")
    router.choose("b")
    assert router.choose(None) == 1


def test_the_same_key_always_goes_to_the_same_instance() -> None:
    router = Router(5)
    assert {router.choose("user-42") for _ in range(20)} == {stable_hash("user-42") % 5}


def test_partition_keys_spread_roughly_uniformly() -> None:
    router = Router(4)
    counts = Counter(router.choose(f"key-{n}") for n in range(1000))
    assert set(counts) == {0, 1, 2, 3}
    assert all(170 <= count <= 330 for count in counts.values()), counts


def test_dedup_keys_move_only_a_repeat_to_its_first_ones_instance() -> None:
    def split(concurrency: int, keys: list[str | None]) -> dict[int, list[int]]:
        groups = Router(concurrency).split(len(keys), None, keys)
        return {index: list(positions) for index, positions in groups.items()}

    assert split(2, ["a", "b", None, "d", "c"]) == {0: [0, 2, 4], 1: [1, 3]}  # round-robin
    assert split(2, ["a", "b", None, "a", "c"]) == {0: [0, 2, 3, 4], 1: [1]}
    assert split(1, ["a", "a", None]) == {0: [0, 1, 2]}
