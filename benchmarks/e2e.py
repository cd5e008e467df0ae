"""``python -m benchmarks.e2e MODE``: dopool's end-to-end case alone, with CPU per event.

The e2e workload of ``python -m benchmarks`` (producers and instances as in
:class:`~benchmarks.harness.Sizes`) without the peers, so that two checkouts can
be compared quickly by alternating runs of each::

    for i in 1 2 3 4; do
      (cd before && python -m benchmarks.e2e async)
      (cd after && python -m benchmarks.e2e async)
    done

It prints events per second and the whole process's CPU per event.

With ``--peers`` it then runs the Redis-backed peers (RQ, arq, dramatiq, Celery:
:mod:`benchmarks.redis_peers`) in the closest shape they have, and prints each one's
events per second and its ratio to dopool of the same mode. dopool's case runs the
producers and the instances in this one process; a Redis peer needs a server and a
worker process, so its producers are threads of this process (as many as dopool's,
sharing the same events, released together, each drawing a connection from the peer's
client) and its tasks run in one consumer process (``--concurrency`` at a time), against
a fresh ``redis-server`` on loopback: ``appendfsync always`` beside ``sync``; no
persistence, then ``appendfsync everysec``, beside ``async``. Timed from the release
until the consumer has run the last event. A peer that is not installed, or
``redis-server`` missing, is skipped with a line saying what installs it::

    python -m benchmarks.e2e sync --peers
"""

from __future__ import annotations

import argparse
import resource
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from benchmarks import redis_peers
from benchmarks.engine import end_to_end
from benchmarks.harness import Sizes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.e2e", description=__doc__)
    parser.add_argument("mode", choices=("sync", "async"))
    parser.add_argument("--events", type=int, default=Sizes().events)
    parser.add_argument("--dir", type=Path, default=None, help="where to make the store")
    parser.add_argument(
        "--peers", action="store_true", help="then RQ, arq, dramatiq and Celery on Redis"
    )
    parser.add_argument(
        "--concurrency", type=int, default=Sizes().concurrency, help="instances; peers: workers"
    )
    args = parser.parse_args(argv)
    sizes = Sizes(events=args.events, concurrency=args.concurrency)
    case = end_to_end(args.mode, sizes)
    directory = Path(tempfile.mkdtemp(prefix="dopool-e2e-", dir=args.dir))
    try:
        before = resource.getrusage(resource.RUSAGE_SELF)
        readings = case.run(directory / "store")
        after = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rate = next(reading.value for reading in readings if reading.metric == "end-to-end")
    print(f"{args.mode}: {rate:,.0f} events/s, {cpu / args.events * 1e6:.1f} µs CPU per event")
    if args.peers:
        for line in peers(args.mode, sizes, rate, args.dir):
            print(line, flush=True)
    return 0


def peers(mode: str, sizes: Sizes, dopool: float, parent: Path | None) -> Iterator[str]:
    """The Redis peers beside dopool's ``dopool`` events/s: a line each (or why skipped)."""
    for system in redis_peers.PEERS:
        why = redis_peers.missing(system)
        if why is not None:
            yield why
            continue
        for persistence in redis_peers.PERSISTENCE[mode]:
            with tempfile.TemporaryDirectory(prefix="dopool-e2e-redis-", dir=parent) as work:
                value = redis_peers.end_to_end(system, persistence, sizes, Path(work))
            yield (
                f"{mode}: {system:8}  {value:9,.0f} events/s  {value / dopool:.2f}x dopool  "
                f"[{redis_peers.DURABILITY[persistence]}]"
            )


if __name__ == "__main__":
    sys.exit(main())
