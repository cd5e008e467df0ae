"""The format's version and the limits a store of that format holds to.

Part of the store's layout (:mod:`dopool._store.layout`, ``docs/store-format.md``).
"""

import re

#: The version of the store's layout (keys and records). A store records the version
#: it was created with; a runtime migrates a store of an older version it knows
#: (:data:`MIGRATES_FROM`) when it opens it, and refuses any other version.
FORMAT_VERSION = 14

#: The older versions a runtime migrates in place (``_store/layout/migrate.py``).
MIGRATES_FROM = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13)

#: A pool's name: it is part of the keys of its instances, of the delivery marks of
#: the instances its follow-ups reach, and of the outbox entries sent to it.
POOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")

#: The most instances a numbered pool may have. Nothing is stored, and nothing runs, per
#: instance until it is first used. A stored pool record above it is damaged.
MAX_CONCURRENCY = 2**32

#: The concurrency of a pool with an instance per partition key (``concurrency="per-key"``):
#: an instance's index is its key's 64-bit hash, so every index below it is an instance.
PER_KEY = 2**64

# The largest event, partition key and dedup key stored, encoded; the range of priorities.
MAX_EVENT_BYTES = 128 * 1024
MAX_PARTITION_KEY_BYTES = 2 * 1024
MAX_DEDUP_KEY_BYTES = 2 * 1024
PRIORITY_MIN = -(2**31)
# The largest key (UTF-8) and value (msgpack) of an instance's own storage, as Durable
# Objects' storage has them.
MAX_STORAGE_KEY_BYTES = 2 * 1024
MAX_STORAGE_VALUE_BYTES = 128 * 1024
PRIORITY_MAX = 2**31 - 1
#: The most fields, and characters in all, of a trace context an event carries (what
#: the OpenTelemetry propagator injects: ``traceparent``, ``tracestate``, ``baggage``...);
#: a larger one is not stored, and the event's attempts start traces of their own.
MAX_TRACE_FIELDS = 8
MAX_TRACE_TEXT = 8192

#: The shortest ``every`` of a recurring schedule: a schedule firing more often would be
#: a flood of events, not a schedule (and one below the clock's resolution would fire at
#: every representable time). A stored schedule below it is damaged.
MIN_EVERY = 0.001
