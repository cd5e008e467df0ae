"""The chaos harness's multi-process mode (``dopool chaos --processes``).

Each seed draws a :mod:`.plan`: a store, an app (:mod:`.app`, run by real
``dopool worker`` processes), 2-4 producer processes (:mod:`.producer`) that
``dopool.connect`` and enqueue a seeded stream, and what happens to the worker
(SIGKILL, SIGTERM, restarts, a live ``dopool pause``/``resume``) at seeded points of
the run's progress. Every process records what it did in append-only files
(:mod:`.records`); :mod:`.runner` drives the processes, and :mod:`.checker` checks
the records and the store against docs/guarantees.md once a last worker has
finished everything. Half the seeds run a second worker beside the first, sharing the
store with leases, each killed and restarted on its own; half freeze a producer or a
worker while it holds the store's writer lock (:mod:`.freeze`); and one in fifteen is
of the big family, thousands of instances shared by workers that join and leave.
"""
