"""The simulator behind ``dopool simulate``.

Private: ``scenario`` (what to run), ``loading`` (a scenario from a file, a
built-in name or flags), ``workload`` (its arrivals and its handler),
``arrivals`` (the arrival processes' times, and the replay reader),
``driver`` (running it on the real engine in virtual time), ``metrics`` (the
collector that follows a run's events, and the records of its result),
``measure`` (the result read at the end of a run), ``figures`` (a result's
figures by name), ``gates`` (pass/fail checks on them), ``sweep`` (a grid of
runs over several seeds, and their statistics), ``ignored`` (the fields a run does
not read, which a sweep refuses), ``trace`` (``--trace``'s JSON
lines), ``plot`` and ``sweep_plot`` (optional matplotlib figures). None of it imports
click or rich; only :mod:`dopool._cli` does.
"""
