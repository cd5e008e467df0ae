"""``durability="sync"`` reaches the disk: every acknowledged commit is synced.

A clean close and reopen cannot tell the two modes apart (the page cache
survives it), so these tests look at what the store asks of the kernel: the
sync system calls of a process that enqueues, counted by ``strace``, the order of
its writes, syncs and acknowledgements, and the flags its LMDB environment is
opened with (docs/guarantees.md, "Durability").
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dopool._store.environment import Store

EVENTS = 60
# One process enqueueing one event at a time: each enqueue is a commit of its own.
ENQUEUER = textwrap.dedent(
    """
    import sys
    from dopool import Runtime

    with Runtime(sys.argv[1], durability=sys.argv[2]) as runtime:
        pool = runtime.define("p", execute=lambda ctx: None)
        pool.pause(0)  # its one instance, started: nothing runs, the commits are the enqueues'
        before = runtime._store.commit_counts[0]
        for number in range(int(sys.argv[3])):
            pool.enqueue(number)
        print("commits", runtime._store.commit_counts[0] - before)
    """
)
SYNCS = ("fsync", "fdatasync", "msync", "sync_file_range")
# The same, but each enqueue acknowledged on stderr as it returns: from a runtime's pool
# (its caller's path into the paused instance), or a producer's connection that stores it.
ACKNOWLEDGING = textwrap.dedent(
    """
    import os, sys
    import dopool
    from dopool import Runtime

    with Runtime(sys.argv[1], durability="sync") as runtime:
        pool = runtime.define("p", execute=lambda ctx: None)
        pool.pause(0)
        if sys.argv[2] == "runtime":
            for number in range(int(sys.argv[3])):
                pool.enqueue(number)
                os.write(2, b"ACK\\n")
    if sys.argv[2] == "connection":
        with dopool.connect(sys.argv[1], durability="sync", via_owner=False) as connection:
            for number in range(int(sys.argv[3])):
                connection.pool("p").enqueue(number)
                os.write(2, b"ACK\\n")
    """
)
# LMDB's two meta pages are its file's first two; a commit rewrites a part of one.
META_END = 2 * 4096


def syncs_and_commits(tmp_path: Path, durability: str) -> tuple[int, int]:
    """Run the enqueuer under strace: its sync system calls, and its enqueues' commits."""
    strace = shutil.which("strace")
    if strace is None:  # .ci/run installs it, so CI never skips this
        pytest.skip("strace is not installed")
    counts = tmp_path / f"{durability}.strace"
    done = subprocess.run(
        [
            strace,
            "-f",
            "-c",
            "-o",
            str(counts),
            "-e",
            f"trace={','.join(SYNCS)}",
            sys.executable,
            "-c",
            ENQUEUER,
            str(tmp_path / durability),
            durability,
            str(EVENTS),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr  # strace refused (no ptrace?) or the run failed
    commits = int(re.search(r"commits (\d+)", done.stdout).group(1))  # type: ignore[union-attr]
    calls = 0
    for line in counts.read_text().splitlines():  # "% time seconds usecs/call calls [errors] name"
        fields = line.split()
        if fields and fields[-1] in SYNCS:
            calls += int(fields[3])
    return calls, commits


def test_sync_mode_syncs_every_acknowledged_commit(tmp_path: Path) -> None:
    calls, commits = syncs_and_commits(tmp_path, "sync")
    assert commits == EVENTS  # one at a time: nothing to group
    assert calls >= commits, f"{calls} sync calls for {commits} acknowledged commits"


def test_async_mode_leaves_commits_to_the_page_cache(tmp_path: Path) -> None:
    calls, commits = syncs_and_commits(tmp_path, "async")
    assert commits == EVENTS
    assert calls <= 2, f"{calls} sync calls (close syncs once)"


@pytest.mark.parametrize(("durability", "synced"), [("sync", True), ("async", False)])
def test_each_mode_opens_its_environment_with_its_flags(
    tmp_path: Path, durability: str, synced: bool
) -> None:
    store = Store(tmp_path / "s", durability=durability)
    try:
        flags = store._env.flags()
        # The meta page is flushed by the store itself, after each commit (sync_meta).
        assert (flags["sync"], flags["metasync"]) == (synced, False)
        assert not flags["writemap"]  # nested transactions (group commit) need it off
    finally:
        store.close()


@pytest.mark.parametrize("producer", ["runtime", "connection"])
def test_no_commit_is_acknowledged_before_its_meta_page_is_flushed(
    tmp_path: Path, producer: str
) -> None:
    """The store opens LMDB without its meta flush, and flushes the meta page itself once
    the writer lock is released (``sync_meta``): every meta page written before an
    acknowledgement was flushed by a sync that began after it, before it."""
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed")
    log = tmp_path / "trace"
    done = subprocess.run(
        [
            strace,
            "-f",
            "-o",
            str(log),
            "-e",
            "trace=pwrite64,fdatasync,fsync,write",
            sys.executable,
            "-c",
            ACKNOWLEDGING,
            str(tmp_path / "s"),
            producer,
            "20",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    metas: list[int] = []  # the lines where a meta page's write returned
    syncs: list[tuple[int, int]] = []  # (began, returned) of each sync
    acks: list[int] = []
    began: dict[str, int] = {}  # an unfinished call's line, by thread
    for number, line in enumerate(log.read_text().splitlines()):
        thread, _, call = line.partition(" ")
        call = call.strip()
        if call.startswith('write(2, "ACK'):
            acks.append(number)
        elif call.startswith(("fdatasync(", "fsync(")):
            if call.endswith("<unfinished ...>"):
                began[thread] = number
            else:
                syncs.append((number, number))
        elif re.match(r"<\.\.\. f(data)?sync resumed>", call):
            syncs.append((began.pop(thread), number))
        else:
            meta = re.match(r"pwrite64\(\d+, .*, (\d+), (\d+)\) = ", call)
            if meta is not None and int(meta.group(2)) < META_END:
                metas.append(number)
    assert len(acks) == 20, "the trace shows no acknowledgement"
    assert metas, "the trace shows no meta page written"
    for ack in acks:
        for written in (meta for meta in metas if meta < ack):
            assert any(written < start and end < ack for start, end in syncs), (
                f"line {ack}: acknowledged with the meta page written at line {written} unflushed"
            )
