"""A process killed inside a read leaves an LMDB reader slot; the owner's poll frees it.

The slot's snapshot would keep LMDB from reusing the pages written since, so the store
file would grow for as long as the runtime keeps it open (a web app's processes are
killed and replaced all the time).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dopool import Runtime

TIMEOUT = 60.0

# Opens a read of the store through a producer's connection, says so, and waits to be killed.
_READER = textwrap.dedent(
    """
    import sys, time
    import dopool
    connection = dopool.connect(sys.argv[1])
    snapshot = connection.reading("orders")
    snapshot.__enter__()
    print("reading", flush=True)
    time.sleep(600)
    """
)


def _readers(runtime: Runtime) -> str:
    """LMDB's reader table, as text (one line per slot in use, with its pid)."""
    table: str = runtime._store._env.readers()
    return table


def _slot_of(pid: int, table: str) -> bool:
    return any(line.split()[:1] == [str(pid)] for line in table.splitlines()[1:])


@pytest.mark.threaded
def test_the_poll_frees_the_reader_slot_of_a_process_killed_while_reading(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Runtime(path, durability="async", poll_interval=3600) as runtime:
        runtime.define("orders", execute=lambda ctx: None)
        reader = subprocess.Popen(
            [sys.executable, "-c", _READER, str(path)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        try:
            assert reader.stdout is not None
            assert reader.stdout.readline().strip() == "reading"
            assert _slot_of(reader.pid, _readers(runtime)), _readers(runtime)
            reader.send_signal(signal.SIGKILL)
            reader.wait(TIMEOUT)
        finally:
            if reader.poll() is None:
                reader.kill()
                reader.wait(TIMEOUT)
            assert reader.stdout is not None
            reader.stdout.close()
        assert _slot_of(reader.pid, _readers(runtime))  # dead, and still holding it
        watcher = runtime._watcher
        assert watcher is not None
        watcher._poll()  # what its thread does every poll_interval
        assert not _slot_of(reader.pid, table := _readers(runtime)), table


def test_clearing_with_no_stale_reader_frees_nothing(tmp_path: Path) -> None:
    with Runtime(tmp_path / "store", durability="async") as runtime:
        assert runtime._store.clear_stale_readers() == 0
