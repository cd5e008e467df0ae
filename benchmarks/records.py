"""``python -m benchmarks.records``: what the store format's checksums and checks cost.

Times, in one run, each record the hot path writes and reads in two encodings:

- **plain**: the encoding before format 1: a msgpack array of the fields,
  decoded without any check;
- **sealed**: format 1: a CRC-32 of key and body before the body, and on reading
  the checksum, the field count and every field's type checked.

It then adds up what one event costs end to end (one event record written and
read, two meta records written; the meta is read back only after a failed
transaction or a restart) and prints it beside the time an event takes in
``python -m benchmarks --only e2e``. Example::

    python -m benchmarks.records
    python -m benchmarks.records --rounds 5 --number 20000
"""

from __future__ import annotations

import argparse
import platform
import sys
import timeit
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

from dopool._store.layout import (
    EventRecord,
    Meta,
    Namespace,
    pack,
    read_event,
    read_meta,
    seal_event,
    seal_meta,
    unpack,
)

_NS = Namespace("bench", 3)
_EVENT_KEY = _NS.queue_key(0, 123_456, 1_700_000_000.5)
_META_KEY = _NS.meta_key
_EVENT = EventRecord(pack({"id": 123_456, "payload": "x" * 100}), 1_700_000_000.5, "user-42", 0)
_META = Meta(
    tail=123_457,
    pending=17,
    enqueued=123_457,
    succeeded=123_440,
    current=_EVENT_KEY,
    attempt=1,
    running=True,
    started_at=1_700_000_001.0,
    outbox_next=9,
    priorities={0: 17},
)
_meta_fields = attrgetter(*Meta.__dataclass_fields__)  # how the plain encoding saved it


def _plain_cases() -> dict[str, Callable[[], Any]]:
    event_raw = pack(tuple(_EVENT))
    meta_raw = pack(_meta_fields(_META))
    return {
        "event write": lambda: pack(tuple(_EVENT)),
        "event read": lambda: EventRecord(*unpack(event_raw)),
        "meta write": lambda: pack(_meta_fields(_META)),
        "meta read": lambda: Meta(*unpack(meta_raw)),
    }


def _sealed_cases() -> dict[str, Callable[[], Any]]:
    event_raw = seal_event(_EVENT_KEY, _EVENT)
    meta_raw = seal_meta(_META_KEY, _META)
    return {
        "event write": lambda: seal_event(_EVENT_KEY, _EVENT),
        "event read": lambda: read_event(_EVENT_KEY, event_raw),
        "meta write": lambda: seal_meta(_META_KEY, _META),
        "meta read": lambda: read_meta(_META_KEY, meta_raw),
    }


# What one event costs the hot path, in records: see the module docstring.
PER_EVENT = {"event write": 1, "event read": 1, "meta write": 2}


def measure(rounds: int, number: int) -> dict[str, dict[str, float]]:
    """Nanoseconds per operation, the best of ``rounds``, for each encoding and case."""
    results: dict[str, dict[str, float]] = {}
    for name, cases in (("plain", _plain_cases()), ("sealed", _sealed_cases())):
        results[name] = {
            case: min(timeit.repeat(call, number=number, repeat=rounds)) / number * 1e9
            for case, call in cases.items()
        }
    return results


def per_event(results: dict[str, dict[str, float]], encoding: str) -> float:
    """Nanoseconds of record encoding per event end to end, in one encoding."""
    return sum(results[encoding][case] * count for case, count in PER_EVENT.items())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.records", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5, help="best of this many (default 5)")
    parser.add_argument("--number", type=int, default=50_000, help="calls per round")
    parser.add_argument(
        "--e2e-us",
        type=float,
        default=None,
        help="µs per event measured by `python -m benchmarks --only e2e`, to compare with",
    )
    args = parser.parse_args(argv)
    results = measure(args.rounds, args.number)
    print(
        f"record encodings, best of {args.rounds} x {args.number:,}; Python "
        f"{platform.python_version()}"
    )
    print(f"{'case':<12} {'plain ns':>10} {'sealed ns':>10} {'added ns':>10}")
    for case in results["plain"]:
        plain, sealed = results["plain"][case], results["sealed"][case]
        print(f"{case:<12} {plain:>10.0f} {sealed:>10.0f} {sealed - plain:>10.0f}")
    added = per_event(results, "sealed") - per_event(results, "plain")
    print(
        f"per event end to end ({', '.join(f'{n} {c}' for c, n in PER_EVENT.items())}): "
        f"{per_event(results, 'plain'):.0f} -> {per_event(results, 'sealed'):.0f} ns, "
        f"+{added / 1000:.2f} µs"
    )
    if args.e2e_us:
        print(f"that is {added / 1000 / args.e2e_us:.1%} of {args.e2e_us:g} µs per event")
    return 0


if __name__ == "__main__":
    sys.exit(main())
