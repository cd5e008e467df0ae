"""``python -m benchmarks.phases``: one instance's two hot paths, in CPU time per event.

Enqueues into a paused pool of one instance (each stored from the caller's
thread: no thread hop), then processing them all with a no-op handler; async
durability, so the disk does not dominate. Pin it to one core and alternate two
checkouts to compare the engine's own cost per event::

    for i in 1 2 3 4 5 6; do
      (cd before && taskset -c 1 python -m benchmarks.phases)
      (cd after && taskset -c 1 python -m benchmarks.phases)
    done
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from dopool import EventContext, Runtime


def no_op(_ctx: EventContext) -> None:
    pass


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.phases", description=__doc__)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--dir", type=Path, default=None, help="where to make the store")
    args = parser.parse_args(argv)
    count = args.events
    directory = Path(tempfile.mkdtemp(prefix="dopool-phases-", dir=args.dir))
    try:
        with Runtime(directory / "store", durability="async") as runtime:
            pool = runtime.define("p", execute=no_op)
            pool.pause()
            event = {"id": 1, "payload": "x" * 100}
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(count):
                pool.enqueue(event)
            enqueued_cpu, enqueued_wall = time.process_time(), time.perf_counter()
            pool.resume()
            if not pool.join(timeout=600):
                raise RuntimeError("the pool did not drain")
            done_cpu, done_wall = time.process_time(), time.perf_counter()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(
        f"enqueue {(enqueued_cpu - cpu) / count * 1e6:.1f} µs CPU per event "
        f"({count / (enqueued_wall - wall):,.0f}/s) · process "
        f"{(done_cpu - enqueued_cpu) / count * 1e6:.1f} µs CPU per event "
        f"({count / (done_wall - enqueued_wall):,.0f}/s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
