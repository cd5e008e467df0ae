"""The simulator behind ``dopool simulate``, and the store inspection behind the CLI.

Private: ``scenario`` (what to run), ``loading`` (a scenario from a file, a
built-in name or flags), ``workload`` (its arrivals and its handler),
``driver`` (running it on the real engine in virtual time), ``metrics`` (the
collector that follows a run's events, and the records of its result),
``measure`` (the result read at the end of a run), ``trace`` (``--trace``'s
JSON lines), ``plot`` (optional matplotlib figures) and ``storeview`` (reading a
real store read-only). None of it imports click or rich; only :mod:`dopool._cli`
does.
"""
