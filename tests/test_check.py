"""``dopool check``: every record and counter of a store verified offline."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import lmdb
import pytest
from click.testing import CliRunner, Result

from dopool import Runtime
from dopool._check import check_store
from dopool._cli import cli
from dopool._layout import Namespace, seal_pool
from dopool._storage import Txn

FIXTURE = Path(__file__).parent / "fixtures" / "store-v1"
QUEUED = Namespace("orders", 1).queue_key(-2, 3)  # a pending event of the fixture


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    path = tmp_path / "store"
    shutil.copytree(FIXTURE, path)
    return path


@contextmanager
def edit(path: Path) -> Iterator[Txn]:
    with lmdb.open(str(path / "data"), subdir=True) as env, env.begin(write=True) as txn:
        yield txn


def problems(path: Path) -> list[str]:
    result = invoke("check", str(path), "--json")
    document = json.loads(result.stdout)
    assert result.exit_code == (0 if document["ok"] else 1), result.output
    return [f"{p['instance']}: {p['what']}" for p in document["problems"]]


def test_a_sound_store_checks_out(store: Path) -> None:
    result = invoke("check", str(store))
    assert result.exit_code == 0, result.output
    assert "format 1, 9 records, 2 instances; pools: orders (2)" in result.stdout
    assert "ok: every record and every counter checks out" in result.stdout


def test_a_live_store_checks_out_beside_its_runtime(store_path: Path) -> None:
    with Runtime.simulated(store_path) as runtime:
        pool = runtime.define("p", execute=lambda ctx: None, concurrency=3)
        pool.enqueue_many(range(20))
        pool.pause(1)
        assert not pool.join(timeout=10)
        # Another process: LMDB refuses a second handle on one store in a process.
        command = [sys.executable, "-m", "dopool", "check", str(store_path)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert "ok: every record and every counter checks out" in done.stdout


def test_a_flipped_bit_in_a_record_is_reported_alone(store: Path) -> None:
    with edit(store) as txn:
        value = bytearray(txn.get(QUEUED))
        value[-1] ^= 0x10
        txn.put(QUEUED, bytes(value))
    result = invoke("check", str(store))
    assert result.exit_code == 1
    assert "1 problems:" in result.stdout
    assert "orders:1: damaged: checksum mismatch" in result.stdout
    assert result.stderr == ""


def test_counters_that_do_not_add_up_are_reported(store: Path) -> None:
    with edit(store) as txn:
        txn.delete(QUEUED)
    assert problems(store) == [
        "orders:1: meta counts 2 pending events, the store holds 1",
        "orders:1: meta counts {0: 1, -2: 1} per priority, the keys {0: 1}",
    ]


def test_pending_work_with_no_alarm_is_reported_unless_the_instance_is_stalled(
    store: Path,
) -> None:
    ns = Namespace("orders", 1)  # paused, with 2 events pending and no alarm
    with edit(store) as txn:
        meta = ns.load_meta(txn)
        meta.paused = False  # nothing would ever start them
        ns.save_meta(txn, meta)
    assert problems(store) == ["orders:1: 2 pending events, no alarm set, and not stalled"]
    with edit(store) as txn:
        meta.alarm_failures = 7  # the alarm was given up (alarm_retries=6): stalled
        ns.save_meta(txn, meta)
    assert problems(store) == []


def test_keys_of_no_known_kind_and_misplaced_instances_are_reported(store: Path) -> None:
    with edit(store) as txn:
        txn.put(b"Zstray", b"1")
        txn.put(b"Iorders:5\x00m", txn.get(b"Iorders:1\x00m"))  # sealed under another key
        txn.put(b"Pbad name", seal_pool(b"Pbad name", 1))
    assert problems(store) == [
        "orders:5: damaged: checksum mismatch",
        "None: pool record of an invalid name 'bad name'",
        "None: a key of no known kind",
        "orders:5: instance beyond the pool's stored concurrency 2",
    ]


def test_a_missing_format_record_is_reported(store: Path) -> None:
    with edit(store) as txn:
        txn.delete(b"F")
    result = invoke("check", str(store))
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: store ")
    assert "no format version" in result.stderr


def test_check_store_reads_a_snapshot_in_one_pass(store: Path) -> None:
    with lmdb.open(str(store / "data"), readonly=True, lock=False) as env, env.begin() as txn:
        report = check_store(txn)
    assert report.ok
    assert (report.format_version, report.records, report.instances) == (1, 9, 2)
    assert report.pools == {"orders": 2}


def test_check_of_a_path_with_no_store_is_one_line(tmp_path: Path) -> None:
    result = invoke("check", str(tmp_path / "nowhere"))
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: no dopool store at")
