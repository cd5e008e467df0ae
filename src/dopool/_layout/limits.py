"""The format's version and the limits a store of that format holds to.

Part of the store's layout (:mod:`dopool._layout`, ``docs/store-format.md``).
"""

#: The version of the store's layout (keys and records). A store records the version
#: it was created with; a runtime refuses to open a store of any other version.
FORMAT_VERSION = 1

#: The most instances a pool may have: each is a thread, started when the pool is
#: defined. A stored pool record above it is damaged.
MAX_CONCURRENCY = 4096

# The largest event and partition key stored, encoded; the range of priorities.
MAX_EVENT_BYTES = 128 * 1024
MAX_PARTITION_KEY_BYTES = 2 * 1024
PRIORITY_MIN = -(2**31)
PRIORITY_MAX = 2**31 - 1
