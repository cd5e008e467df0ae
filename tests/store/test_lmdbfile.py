"""A data file that ends in free pages is sound; one cut into pages in use is not
(``_lmdbfile``, the store's opening check: docs/guarantees.md, "What is detected")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dopool import Runtime, StoreDamagedError
from dopool._store.lmdbfile import _FREE_ROOT, _TXNID, _U64, _Walk, missing_pages_are_free

PAGE = 4096


def free_tail(data: Path) -> tuple[int, int]:
    """The data file's last page, and how many pages up to it are free, read with the
    module's own walk."""
    fd = os.open(data, os.O_RDONLY)
    try:
        walk = _Walk(fd, data.stat().st_size, PAGE)
        meta = max([walk._page(0), walk._page(1)], key=lambda m: _U64.unpack_from(m, _TXNID)[0])
        free: set[int] = set()
        walk._collect(_U64.unpack_from(meta, _FREE_ROOT)[0], free, 0)
    finally:
        os.close(fd)
    last = data.stat().st_size // PAGE - 1
    run = 0
    while last - run in free:
        run += 1
    return last, run


@pytest.fixture
def store(store_path: Path) -> Path:
    """A store whose last pages are free: filled, drained, then written a little."""
    with Runtime.simulated(store_path) as runtime:
        pool = runtime.define("p", execute=lambda ctx: None)
        pool.pause()
        pool.enqueue_many([{"pad": "x" * 300} for _ in range(2000)])
        pool.drain()
        for n in range(3):
            pool.enqueue(n)
    return store_path


def test_a_file_that_ends_in_free_pages_opens(store: Path) -> None:
    data = store / "data" / "data.mdb"
    last, run = free_tail(data)
    assert run > 0, "the fixture's last pages are free"
    with data.open("r+b") as file:
        file.truncate(
            (last + 1 - run) * PAGE
        )  # as LMDB leaves a file whose loose pages it never wrote
    assert missing_pages_are_free(str(data), data.stat().st_size, PAGE)
    with Runtime.simulated(store) as runtime:
        pool = runtime.define("p", execute=lambda ctx: None)
        assert pool.status().pending == 3
        pool.enqueue_many([{"pad": "y" * 300} for _ in range(500)])  # writes past the end
        pool.resume()
        assert pool.join(timeout=10)


def test_a_file_cut_into_a_page_in_use_is_refused(store: Path) -> None:
    data = store / "data" / "data.mdb"
    last, run = free_tail(data)
    with data.open("r+b") as file:
        file.truncate((last - run) * PAGE)  # one page more: a page in use
    assert not missing_pages_are_free(str(data), data.stat().st_size, PAGE)
    with pytest.raises(StoreDamagedError, match="shorter than"):
        Runtime(store)


def test_a_file_without_its_meta_pages_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data.mdb"
    data.write_bytes(b"\0" * PAGE)
    assert not missing_pages_are_free(str(data), PAGE, PAGE)
    data.write_bytes(b"\0" * 2 * PAGE)  # two pages, neither a meta page
    assert not missing_pages_are_free(str(data), 2 * PAGE, PAGE)
