"""The LMDB store.

Its environment and transactions (:mod:`.environment`), the committers, the store
and writer file locks, the lease clock kept in the writer lock's file, and the
layout of its records (:mod:`.layout`). Imports only the clock layer and the leaves.
"""
