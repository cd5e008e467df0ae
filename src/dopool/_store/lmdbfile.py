"""LMDB's own data file, read from outside LMDB: the pages its free list holds.

A data file may end before the last page LMDB counts in use (``last_pgno``), and be
sound: LMDB does not write a page it allocated and freed again in one transaction (a
*loose* page, as a transaction that writes and then deletes makes), and returns it to
its free list at commit. No page of a tree points there, so nothing reads it. A file
cut short is damage, and reading a page past its end would kill the process with
SIGBUS. :func:`missing_pages_are_free` tells the two apart for the store's opening
check (:mod:`dopool._store.environment`): it reads the meta pages and the free list's B-tree with
``pread``, never past the file's end, and takes anything it cannot read as damage.

The layout read here is LMDB 0.9's on a 64-bit machine (``mdb.c``): a page header of
16 bytes (page number, pad, flags, lower, upper), two meta pages, B-tree nodes of 8
bytes of header before their key, and the free list's values as ID lists (a count,
then page numbers), in overflow pages when large.
"""

from __future__ import annotations

import os
import struct

_HEADER = struct.Struct("<QHHHH")  # mp_pgno, mp_pad, mp_flags, mp_lower, mp_upper
_NODE = struct.Struct("<HHHH")  # mn_lo, mn_hi, mn_flags, mn_ksize
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_MAGIC = 0xBEEFC0DE
_BRANCH, _LEAF, _OVERFLOW = 0x01, 0x02, 0x04
_BIGDATA = 0x01  # a leaf node whose value is in overflow pages
_INVALID = 2**64 - 1  # an empty tree's root
# Offsets in a meta page: the magic, the free list's root, the last page, the txn id.
_META_MAGIC, _FREE_ROOT, _LAST_PAGE, _TXNID = 16, 80, 136, 144
_MAX_DEPTH = 64


class _Unreadable(Exception):
    """A page the walk needs is past the file's end, or is not what it should be."""


def missing_pages_are_free(path: str, size: int, page_size: int) -> bool:
    """Whether every page of the data file at ``path`` that lies past its ``size`` bytes
    is on LMDB's free list (so the short file is sound). False if the file ends before
    a page that is in use, or if the free list cannot be read."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return _Walk(fd, size, page_size).missing_are_free()
    except _Unreadable:
        return False
    finally:
        os.close(fd)


class _Walk:
    def __init__(self, fd: int, size: int, page_size: int) -> None:
        self._fd = fd
        self._pages = size // page_size  # whole pages in the file
        self._size = page_size
        self._seen = 0

    def _page(self, pgno: int, count: int = 1) -> bytes:
        if pgno + count > self._pages:
            raise _Unreadable(f"page {pgno} is past the end of the file")
        self._seen += count
        if self._seen > self._pages:  # a cycle, or a crafted file: never more than it holds
            raise _Unreadable("the free list is larger than the file")
        return os.pread(self._fd, count * self._size, pgno * self._size)

    def missing_are_free(self) -> bool:
        metas = [self._page(0), self._page(1)]
        valid = [m for m in metas if _U32.unpack_from(m, _META_MAGIC)[0] == _MAGIC]
        if not valid:
            raise _Unreadable("no meta page")
        meta = max(valid, key=lambda m: _U64.unpack_from(m, _TXNID)[0])
        last = _U64.unpack_from(meta, _LAST_PAGE)[0]
        root = _U64.unpack_from(meta, _FREE_ROOT)[0]
        missing = range(self._pages, last + 1)
        if not missing:
            return True
        free: set[int] = set()
        if root != _INVALID:
            self._collect(root, free, 0)
        return all(pgno in free for pgno in missing)

    def _collect(self, pgno: int, free: set[int], depth: int) -> None:
        """Add the pages the free list's subtree at ``pgno`` holds to ``free``."""
        if depth > _MAX_DEPTH:
            raise _Unreadable("the free list is too deep")
        page = self._page(pgno)
        _, _, flags, lower, _ = _HEADER.unpack_from(page)
        count = (lower - _HEADER.size) // 2
        if not flags & (_BRANCH | _LEAF) or not 0 <= count <= self._size // 2:
            raise _Unreadable(f"page {pgno} is no B-tree page")
        for number in range(count):
            offset = _U16(page, _HEADER.size + 2 * number)
            if offset + _NODE.size > len(page):
                raise _Unreadable(f"page {pgno} has a node past its end")
            lo, hi, node_flags, key_size = _NODE.unpack_from(page, offset)
            if flags & _BRANCH:
                self._collect(lo | hi << 16 | node_flags << 32, free, depth + 1)
                continue
            start, data_size = offset + _NODE.size + key_size, lo | hi << 16
            if node_flags & _BIGDATA:
                data = self._overflow(_U64.unpack_from(page, start)[0], data_size)
            else:
                data = page[start : start + data_size]
            free.update(_ids(data))

    def _overflow(self, pgno: int, data_size: int) -> bytes:
        first = self._page(pgno)
        if not _HEADER.unpack_from(first)[2] & _OVERFLOW:
            raise _Unreadable(f"page {pgno} is no overflow page")
        count = _U32.unpack_from(first, 12)[0]  # mp_pages, where lower and upper are
        data = first if count <= 1 else first + self._page(pgno + 1, count - 1)
        return data[_HEADER.size : _HEADER.size + data_size]


def _U16(data: bytes, offset: int) -> int:
    return int.from_bytes(data[offset : offset + 2], "little")


def _ids(data: bytes) -> list[int]:
    """An ID list's page numbers: a count, then as many 8-byte IDs."""
    if len(data) < 8:
        raise _Unreadable("a free-list entry shorter than its count")
    count = _U64.unpack_from(data)[0]
    if len(data) < 8 * (count + 1):
        raise _Unreadable("a free-list entry shorter than its count says")
    return list(struct.unpack_from(f"<{count}Q", data, 8))
