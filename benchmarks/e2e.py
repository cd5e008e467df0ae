"""``python -m benchmarks.e2e MODE``: dopool's end-to-end case alone, with CPU per event.

The e2e workload of ``python -m benchmarks`` (producers and instances as in
:class:`~benchmarks.harness.Sizes`) without the peers, so that two checkouts can
be compared quickly by alternating runs of each::

    for i in 1 2 3 4; do
      (cd before && python -m benchmarks.e2e async)
      (cd after && python -m benchmarks.e2e async)
    done

It prints events per second and the whole process's CPU per event.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks.engine import end_to_end
from benchmarks.harness import Sizes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.e2e", description=__doc__)
    parser.add_argument("mode", choices=("sync", "async"))
    parser.add_argument("--events", type=int, default=Sizes().events)
    parser.add_argument("--dir", type=Path, default=None, help="where to make the store")
    args = parser.parse_args(argv)
    case = end_to_end(args.mode, Sizes(events=args.events))
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
