"""The store's layout: every key and every record, their encoding and their checks.

``docs/store-format.md`` documents it. One concept per module:

- :mod:`.limits`: the format version and the limits of a store of that format;
- :mod:`.keys`: every key, which record it holds, and taking a key apart;
- :mod:`.records`: the records, their encoding, checksums and field checks;
- :mod:`.namespace`: an instance's keys and the pool records, read and written in a
  transaction;
- :mod:`.migrate`: a store of an older format rewritten as this one.

Everything outside this package sees records, namespaces and parsed keys, never a
key's layout or msgpack, and imports them from here.
"""

from dopool._layout.keys import (
    FORMAT_KEY,
    InstanceKey,
    RecordKind,
    dead_letter_sequence,
    describe_key,
    format_1_mark,
    is_format_key,
    mark_source,
    outbox_sequence,
    parse_instance_key,
    pool_key,
    pool_name_of,
    queue_key_priority,
    queue_key_sequence,
    started_event,
)
from dopool._layout.limits import (
    FORMAT_VERSION,
    MAX_CONCURRENCY,
    MAX_EVENT_BYTES,
    MAX_PARTITION_KEY_BYTES,
    MIGRATES_FROM,
    POOL_NAME,
    PRIORITY_MAX,
    PRIORITY_MIN,
)
from dopool._layout.migrate import migrate_from_1
from dopool._layout.namespace import (
    Namespace,
    follow_ups_to,
    get_pool,
    pool_records,
    put_pool,
)
from dopool._layout.records import (
    DeadRecord,
    EventRecord,
    Meta,
    OutboxRecord,
    damaged,
    encode_event,
    open_sealed,
    pack,
    read_dead,
    read_event,
    read_format,
    read_link,
    read_meta,
    read_outbox,
    read_pool,
    seal,
    seal_dead,
    seal_event,
    seal_format,
    seal_link,
    seal_meta,
    seal_outbox,
    seal_pool,
    unpack,
)

__all__ = [
    "FORMAT_KEY",
    "FORMAT_VERSION",
    "MAX_CONCURRENCY",
    "MAX_EVENT_BYTES",
    "MAX_PARTITION_KEY_BYTES",
    "MIGRATES_FROM",
    "POOL_NAME",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "DeadRecord",
    "EventRecord",
    "InstanceKey",
    "Meta",
    "Namespace",
    "OutboxRecord",
    "RecordKind",
    "damaged",
    "dead_letter_sequence",
    "describe_key",
    "encode_event",
    "follow_ups_to",
    "format_1_mark",
    "get_pool",
    "is_format_key",
    "mark_source",
    "migrate_from_1",
    "open_sealed",
    "outbox_sequence",
    "pack",
    "parse_instance_key",
    "pool_key",
    "pool_name_of",
    "pool_records",
    "put_pool",
    "queue_key_priority",
    "queue_key_sequence",
    "read_dead",
    "read_event",
    "read_format",
    "read_link",
    "read_meta",
    "read_outbox",
    "read_pool",
    "seal",
    "seal_dead",
    "seal_event",
    "seal_format",
    "seal_link",
    "seal_meta",
    "seal_outbox",
    "seal_pool",
    "started_event",
    "unpack",
]
